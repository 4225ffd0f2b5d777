"""Each copy's own keyword index over PostgreSQL (solos_pg_keyword): SQLite's FTS5, filled from the database at
start, fed by the event log, and never the source of an answer PostgreSQL's snapshot would not give.

The tests on a database start copies of the real service on one fresh PostgreSQL database (slow, as every
PostgreSQL test); the first two need none.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, fleet_writer, start_server, stop_server, wait_until

import solos_pg_keyword
from solos_pg_keyword import Applied

VOCABULARY = (
    "ferry harbor storm lighthouse keeper kettle barn goat quartz granite market dawn pump valve certificate backup "
    "gateway cluster replica disk alert deploy schema token cache outage review meeting coffee lunch picnic"
).split()

# ==== What the index is made of ====


def test_the_index_has_the_embedded_stores_columns_and_tokenizer():
    """Ranking runs the embedded store's bm25() with each tier's weights over these columns, in this order: a
    column added to schema.sql's FTS5 tables must reach the copies' index too."""
    schema = (ROOT / "schema.sql").read_text()
    found = {
        table: tuple(column.strip() for column in columns.split(",") if column.strip())
        for table, columns in re.findall(
            r"CREATE VIRTUAL TABLE IF NOT EXISTS (\w+)_fts USING fts5 \(\s*([^=]*?),\s*(?:content|tokenize)", schema
        )
    }
    assert found == solos_pg_keyword.FTS_COLUMNS
    assert set(re.findall(r"tokenize = '([^']+)'", schema)) == {solos_pg_keyword.TOKENIZER}


def test_a_start_removes_the_index_folders_of_copies_that_died(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{solos_pg_keyword.FOLDER_PREFIX}{dead.pid}-abc"
    running = tmp_path / f"{solos_pg_keyword.FOLDER_PREFIX}{os.getpid()}-def"
    other = tmp_path / "solos-keyword-notes"
    for folder in (stale, running, other):
        folder.mkdir()
        (folder / "keyword.db").write_bytes(b"x")
    assert solos_pg_keyword.remove_stale(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and running.exists() and other.exists()


def test_what_is_applied_is_every_transaction_either_snapshot_saw():
    earlier = Applied(xmax=10, running=frozenset({4, 7}))
    later = Applied(xmax=15, running=frozenset({7, 12}))
    joined = earlier.joined(later)
    assert joined == Applied(15, frozenset({7, 12}))  # 4 finished before `later`; 7 still runs in both
    assert [x for x in range(20) if joined.sees(x)] == [*range(7), *range(8, 12), 13, 14]
    # A snapshot older than what is applied adds nothing and takes nothing back.
    assert later.joined(earlier) == joined
    assert joined.joined(Applied(9, frozenset({4, 7}))) == joined


# ==== On PostgreSQL: copies of the service ====


def index_of(copy) -> solos_pg_keyword.KeywordIndex:
    index = copy.server.memory.store.keyword
    assert index is not None
    return index


def ready(copy):
    wait_until(lambda: copy.get("/health").body["keyword_index"] == "ready", "the copy's keyword index to fill")
    return copy


def held(copy, table: str, row_id: int) -> bool:
    """The copy's index holds the row (its FTS5 table)."""
    writer = index_of(copy).writer
    return writer.execute(f"SELECT count(*) FROM {table}_fts WHERE rowid = ?", (row_id,)).fetchone()[0] == 1


def ids_of(reply) -> list[int]:
    assert reply.status == 200, reply.body
    return [row["id"] for row in reply.body["results"]]


@pytest.mark.slow
def test_a_write_through_one_copy_is_in_the_next_keyword_recall_on_another(copies, monkeypatch):
    a, b = ready(copies(rerank=False)), ready(copies(rerank=False))
    by_index = index_of(b).answered["index"]
    # B's thread does not apply first (no wake, no poll): the recall applies what its snapshot sees itself.
    index_of(b).wake = lambda: None
    monkeypatch.setattr(solos_pg_keyword, "POLL_S", 3600.0)
    index_of(b).wakeup.set()
    time.sleep(0.2)  # the thread's next wait is the long one
    for n in range(3):
        written = a.post("/v1/long", {"agent": "atlas", "topic": "ops", "fact": f"the quokka rota week {n} is Kim"})
        assert written.status == 201, written.body
        short = a.post("/v1/short", {"agent": "atlas", "key": f"rota {n}", "value": f"wombat shift {n}"})
        assert short.status == 201, short.body
        assert ids_of(b.recall("sol", f"quokka rota week {n}", tiers="long"))[0] == written.body["id"]
        assert ids_of(b.recall("sol", f"wombat shift {n}", tiers="short"))[0] == short.body["id"]
        assert held(b, "memory_longterm", written.body["id"]) and held(b, "memory_short", short.body["id"])
    assert index_of(b).answered["index"] == by_index + 6  # each by the index, none by SQL
    updated = a.post("/v1/short", {"agent": "atlas", "key": "rota 0", "value": "numbat shift"})
    assert updated.status in (200, 201), updated.body
    assert sorted(ids_of(b.recall("sol", "wombat", tiers="short"))) == [short_id(b, "rota 1"), short_id(b, "rota 2")]
    assert ids_of(b.recall("sol", "numbat", tiers="short")) == [updated.body["id"]]


def short_id(copy, key: str) -> int:
    with fleet_writer(copy.db_path) as conn:
        return conn.execute("SELECT id FROM memory_short WHERE key = ?", (key,)).fetchone()[0]


@pytest.mark.slow
def test_a_forget_through_one_copy_leaves_every_copys_index_and_its_file(copies):
    every = [ready(copies(rerank=False)) for _ in range(3)]
    a, b, c = every
    first = a.post("/v1/long", {"agent": "atlas", "topic": "pets", "fact": "the office dog is called Pretzel"})
    second = a.post("/v1/long", {"agent": "nova", "topic": "pets", "fact": "the office cat is called Biscuit"})
    row_id, quoting = first.body["id"], second.body["id"]
    for copy in every:
        assert ids_of(copy.recall("sol", "Pretzel", tiers="long")) == [row_id, quoting]  # the cat's context quotes it
    forgot = c.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": row_id})
    assert forgot.status == 200, forgot.body
    for copy in every:  # at once: each copy's thread applies the forget as it commits, else its next recall does
        assert ids_of(copy.recall("sol", "Pretzel", tiers="long")) == []  # nor in the quoting fact's context
        assert not held(copy, "memory_longterm", row_id)
        assert ids_of(copy.recall("sol", "Biscuit", tiers="long")) == [quoting]
    for copy in every:  # and merged out of the index's file and its WAL
        folder = Path(index_of(copy).folder)
        wait_until(
            lambda folder=folder: not any(b"pretzel" in path.read_bytes().lower() for path in folder.iterdir()),
            "the forgotten words to leave the index's files",
        )


@pytest.mark.slow
def test_a_forget_whose_index_checkpoint_meets_a_reader_is_scrubbed_once_it_leaves(copies):
    # The copy's scrub after a forget cut its index's WAL once: a recall reading the index then kept the
    # checkpoint from finishing, and the old page images holding the forgotten words stayed in the WAL until
    # the next forget, if any. The scrub is now retried until the WAL is cut, as the embedded store's is.
    copy = ready(copies(rerank=False))
    row_id = copy.post("/v1/long", {"agent": "atlas", "fact": "the locker code is Zanzibar"}).body["id"]
    assert ids_of(copy.recall("sol", "Zanzibar", tiers="long")) == [row_id]
    index = index_of(copy)
    folder = Path(index.folder)
    reader = sqlite3.connect(folder / "keyword.db", isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM memory_longterm_fts").fetchone()  # a recall's read, held
        forgot = copy.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": row_id})
        assert forgot.status == 200, forgot.body
        wait_until(lambda: not held(copy, "memory_longterm", row_id), "the forget applied")
        time.sleep(solos_pg_keyword.POLL_S + 1.5)  # its scrub ran, and its checkpoint waited for the reader
        assert any(b"zanzibar" in path.read_bytes().lower() for path in folder.iterdir())  # the WAL was held
    finally:
        reader.close()
    wait_until(
        lambda: not any(b"zanzibar" in path.read_bytes().lower() for path in folder.iterdir()),
        "the forgotten words to leave the index's WAL once the reader is gone",
    )


@pytest.mark.slow
def test_a_copy_filling_its_index_ranks_by_sql_says_so_and_then_answers_the_same(pg_url, copies, monkeypatch):
    stop_server(start_server(pg_url))  # the schema, the agents
    with fleet_writer(pg_url) as conn:
        for n in range(600):
            words = " ".join(VOCABULARY[(n * 7 + k * 3) % len(VOCABULARY)] for k in range(4 + n % 5))
            conn.execute(
                "INSERT INTO memory_longterm (agent, topic, fact) VALUES ('atlas', ?, ?)", (f"t{n % 40}", words)
            )
    monkeypatch.setattr(solos_pg_keyword, "FILL_PAGE", 100)
    gate, put = threading.Event(), solos_pg_keyword.KeywordIndex.put

    def slow_put(self, table, rows):
        put(self, table, rows)
        assert gate.wait(30), "the test never let the fill go on"

    monkeypatch.setattr(solos_pg_keyword.KeywordIndex, "put", slow_put)
    copy = copies(rerank=False)
    questions = [" ".join(VOCABULARY[n : n + 3]) for n in range(0, 30, 3)]
    assert copy.get("/health").body["keyword_index"] == "filling"
    while_filling = [copy.recall("sol", q, tiers="long", k=8) for q in questions]
    assert all(reply.status == 200 and reply.body["ranking"] == "keyword" for reply in while_filling)
    assert copy.get("/health").body["keyword_index"] == "filling"
    assert index_of(copy).answered == {"index": 0, "sql": len(questions)}
    gate.set()
    ready(copy)
    filled = [copy.recall("sol", q, tiers="long", k=8) for q in questions]
    assert index_of(copy).answered["index"] == len(questions)
    for question, before, after in zip(questions, while_filling, filled):
        assert [(r["id"], round(r["score"], 4)) for r in before.body["results"]] == [
            (r["id"], round(r["score"], 4)) for r in after.body["results"]
        ], question
    assert sum(len(reply.body["results"]) for reply in filled) > 40


@pytest.mark.slow
def test_a_recall_that_cannot_apply_at_once_ranks_by_sql_and_still_sees_every_write(copies):
    a, b = ready(copies(rerank=False)), ready(copies(rerank=False))
    index = index_of(b)
    with index.lock:  # the thread is applying (a bulk of other copies' writes): the recall does not wait for it
        written = a.post("/v1/long", {"agent": "atlas", "fact": "the heron count is twelve"})
        assert ids_of(b.recall("sol", "heron count", tiers="long")) == [written.body["id"]]
        assert index.answered["sql"] == 1
    assert ids_of(b.recall("sol", "heron count", tiers="long")) == [written.body["id"]]
    assert index.answered["index"] >= 1 and held(b, "memory_longterm", written.body["id"])


@pytest.mark.slow
def test_a_copy_that_cannot_make_its_index_file_says_off_and_ranks_by_sql(copies, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError("read-only temporary folder")

    monkeypatch.setattr(solos_pg_keyword.tempfile, "mkdtemp", refuse)
    copy = copies(rerank=False)
    assert copy.get("/health").body["keyword_index"] == "off"
    written = copy.post("/v1/long", {"agent": "atlas", "fact": "the heron count is twelve"})
    assert ids_of(copy.recall("sol", "heron count", tiers="long")) == [written.body["id"]]


@pytest.mark.slow
def test_the_index_says_failing_while_the_database_is_away_and_keeps_up_once_it_is_back(pg_private_cluster):
    url = pg_private_cluster.fresh_database()
    running = ready(start_server(url, busy_timeout_ms=1000, rerank=False))
    try:
        assert running.post("/v1/long", {"agent": "atlas", "fact": "the boiler was serviced in May"}).status == 201
        pg_private_cluster.kill()
        wait_until(lambda: running.get("/health").body["keyword_index"] == "failing", "the index to say failing")
        pg_private_cluster.start()
        ready(running)
        with fleet_writer(url) as conn:  # the fleet's own write, once it is back
            row_id = conn.execute(
                "INSERT INTO memory_longterm (agent, fact) VALUES ('nova', 'the boiler kiln fired at dawn') "
                "RETURNING id"
            ).fetchone()[0]
        by_index = index_of(running).answered["index"]
        assert ids_of(running.recall("sol", "boiler kiln", tiers="long"))[0] == row_id
        assert index_of(running).answered["index"] == by_index + 1
    finally:
        stop_server(running)


@pytest.mark.slow
def test_a_write_that_commits_after_later_ones_is_not_skipped(copies, pg_url):
    """Event ids commit out of order: a transaction running when the index caught up, that commits after
    transactions begun later, is applied all the same (the snapshot's running transactions are read again)."""
    import psycopg

    copy = ready(copies(rerank=False))
    with psycopg.connect(pg_url) as slow:  # a transaction of the fleet's, open across the others
        early = slow.execute(
            "INSERT INTO memory_longterm (agent, fact) VALUES ('nova', 'the early ferry leaves at six') RETURNING id"
        ).fetchone()[0]
        later = copy.post("/v1/long", {"agent": "atlas", "fact": "the late ferry leaves at ten"})
        assert ids_of(copy.recall("sol", "ferry leaves", tiers="long")) == [later.body["id"]]
        assert index_of(copy).applied is not None and index_of(copy).applied.running  # the open one, seen running
        slow.commit()
    assert sorted(ids_of(copy.recall("sol", "ferry leaves", tiers="long"))) == sorted([early, later.body["id"]])
    assert held(copy, "memory_longterm", early)


@pytest.mark.slow
def test_a_fact_updated_as_the_one_it_quotes_is_forgotten_is_applied_once(copies, pg_url):
    """One pass meets a forgotten fact and an update of a later fact of its topic: the later fact was read both as
    touched and as quoting the forgotten one, put twice into the index in one transaction, and the index failed
    on its own rowid (`failing`, recall by SQL) on that pass and each one after it."""
    copy = ready(copies(rerank=False))
    ids = [
        copy.post("/v1/long", {"agent": "atlas", "topic": "boats", "fact": f"the {word} ferry sails"}).body["id"]
        for word in ("red", "blue", "green")
    ]
    assert ids_of(copy.recall("sol", "ferry sails", tiers="long"))  # the index holds them
    with fleet_writer(pg_url) as conn, conn.transaction():  # one commit: one pass applies both
        conn.execute("UPDATE memory_longterm SET confidence = 0.5 WHERE id = ?", (ids[1],))
        conn.execute("DELETE FROM memory_longterm WHERE id = ?", (ids[0],))
    assert sorted(ids_of(copy.recall("sol", "ferry sails", tiers="long"))) == ids[1:]
    assert copy.get("/health").body["keyword_index"] == "ready"
    assert not held(copy, "memory_longterm", ids[0]) and held(copy, "memory_longterm", ids[1])


@pytest.mark.slow
def test_an_expired_short_value_leaves_the_copys_index_files_and_the_purge_leaves_postgresql_without_it(
    copies, monkeypatch
):
    """A copy's index dropped an expired short row at its `expire` event, but FTS5 only adds a tombstone: the
    secret's words stayed in the index's old segments (a file in the temporary folder) for as long as the copy
    ran, and in PostgreSQL the purge left its text in memory_version for 90 days. The copy now merges its
    short index after an expiry (EXPIRY_SCRUB_S later, expiries gathered); the purge erases the versions."""
    monkeypatch.setattr(solos_pg_keyword, "EXPIRY_SCRUB_S", 0.5)
    copy = ready(copies(rerank=False))
    index = index_of(copy)
    index.writer.execute("INSERT INTO memory_short_fts (memory_short_fts, rank) VALUES ('automerge', 0)")
    for n in range(3):  # segments of other rows, as in a large index
        assert copy.post("/v1/short", {"agent": "sol", "key": f"k{n}", "value": f"ferry harbor {n}"}).status == 201
    secret = "zq" + os.urandom(12).hex() + "0"
    written = copy.post("/v1/short", {"agent": "atlas", "key": "token", "value": f"token {secret}", "ttl_s": 0.5})
    assert written.status == 201, written.body
    assert ids_of(copy.recall("sol", secret, tiers="short")) == [written.body["id"]]
    folder = Path(index.folder)
    assert any(secret[-16:].encode() in path.read_bytes() for path in folder.iterdir())
    wait_until(lambda: not held(copy, "memory_short", written.body["id"]), "the expiry applied")
    wait_until(
        lambda: not any(secret[-16:].encode() in path.read_bytes() for path in folder.iterdir()),
        "the expired words to leave the index's files",
    )
    assert ids_of(copy.recall("sol", "ferry harbor", tiers="short"))  # the other rows are still there

    import solos_memory

    assert solos_memory.main(["purge", "--db", copy.db_path]) == 0
    with fleet_writer(copy.db_path) as conn:
        left = conn.execute("SELECT count(*) FROM memory_version WHERE text LIKE ?", (f"%{secret}%",)).fetchone()[0]
        assert left == 0
    wait_until(lambda: sql_count(copy.db_path, "SELECT count(*) FROM memory_scrub_pending") == 0, "the VACUUM")


def sql_count(url: str, query: str) -> int:
    with fleet_writer(url) as conn:
        return conn.execute(query).fetchone()[0]
