"""`migrate --from solos.db --to postgresql://…`: a database the service filled is copied whole, the
service on PostgreSQL answers as it did on SQLite, a second run copies nothing and verifies, and a target that
differs fails verification."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import sqlite3
import struct
import time
import uuid
from pathlib import Path

import pytest
from conftest import start_server, stop_server, wait_until

import solos_memory
import solos_migrate

# Text that COPY has to escape, and that no normalisation may change.
AWKWARD = "tab\there, newline\nthere, a \\ backslash, 'single' and \"double\" quotes, café, 🚀, \\N"
VECTOR = struct.pack("<4f", 0.5, -0.25, 1e-7, 3.0) + b"\x00\\\n\t"  # a blob holding COPY's special bytes too


def migrate(source: Path, target: str) -> tuple[int, list[dict], str]:
    """Run the command as the CLI does: (exit status, the JSON lines it printed, what it logged on stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = solos_memory.main(["migrate", "--from", str(source), "--to", target])
    return status, [json.loads(line) for line in out.getvalue().splitlines()], err.getvalue()


def tables(lines: list[dict]) -> dict[str, dict]:
    return {line["table"]: line for line in lines if "table" in line}


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def answers(server) -> dict:
    """What the service says in reads that write nothing: the audit log, deliveries, notices, as-of recall."""
    get = lambda path, **query: server.get(path, **query).body  # noqa: E731
    return {
        "audit": get("/v1/audit", agent="atlas"),
        "deliveries": get("/v1/deliveries", agent="atlas"),
        "operator_deliveries": get("/v1/deliveries"),
        "notices": [get("/v1/notices", agent=agent, include_acked="true") for agent in ("sol", "atlas")],
        # The reader's view: an agent's own view hands rows over, and is logged as deliveries.
        "as_of": get(
            "/v1/recall/as_of", agent="sol", reader="sol", as_of="2100-01-01T00:00:00.000Z", tiers="long,short", k=50
        ),
    }


RECALLS = [
    {"agent": "sol", "q": "backup nightly", "tiers": "long,short"},
    {"agent": "sol", "q": "", "tiers": "long,short,episodic", "k": 50},
    {"agent": "sol", "q": "gateway deployed", "tiers": "episodic"},  # BM25 ties: both stores put the older first
    {"agent": "atlas", "q": "", "tiers": "episodic", "archive": "true", "k": 50},
    {"agent": "atlas", "q": "", "tiers": "durable"},
    {"agent": "nova", "q": "café backslash", "tiers": "long"},
]
EVENTS = {"agent": "sol", "since": 0, "limit": 1000, "tiers": "long,short,episodic"}


def recalled(server) -> list[list[tuple]]:
    """Each of RECALLS' results as (tier, id, agent, text, foreign): what must not change across the move."""
    found = []
    for query in RECALLS:
        reply = server.get("/v1/recall", **query)
        assert reply.status == 200, reply.body
        found.append([(r["tier"], r["id"], r["agent"], r["text"], r["foreign"]) for r in reply.body["results"]])
    return found


def events(server, **query) -> dict:
    reply = server.get("/v1/events", **{**EVENTS, **query})
    assert reply.status == 200, reply.body
    return {**reply.body, "events": [(e["id"], e["kind"], e["tier"], e["row_id"]) for e in reply.body["events"]]}


def fill(db: Path) -> dict:
    """A database the service filled as a fleet would: every tier, a forget, shared episodes read by another agent
    (audit, deliveries), a superseded short row (a version and a notice), a promotion, an archived episode, a
    persona row, vectors and a Qdrant import written directly, and a job run. What the service said, for later."""
    server = start_server(db)
    try:
        with server.db() as conn:  # written first: the newest episode is never archived
            conn.execute(
                "INSERT INTO memory_episodic (agent, event_type, summary, timestamp) "
                "VALUES ('atlas', 'deploy', 'Deployed the old gateway', '2020-01-01T00:00:00.000Z')"
            )
            conn.execute(  # expired long ago, before the service's expiry events began
                "INSERT INTO memory_short (agent, key, value, tags, created_at, expires_at) VALUES "
                "('nova', 'mood', 'curious', '[\"x\"]', '2020-01-01T00:00:00.000Z', '2020-01-02T00:00:00.000Z')"
            )
        post = lambda path, body: server.post(path, body).body  # noqa: E731
        backup = post("/v1/long", {"agent": "atlas", "topic": "ops", "fact": "The backup job runs nightly at 02:00"})
        post("/v1/long", {"agent": "atlas", "topic": "ops", "fact": "Backups go to the north bucket", "tags": ["ops"]})
        post("/v1/long", {"agent": "sol", "topic": "ops", "fact": AWKWARD, "source": "test", "confidence": 0.1})
        doomed = post("/v1/long", {"agent": "atlas", "topic": "secrets", "fact": "The backup password is hunter2"})
        key = post("/v1/short", {"agent": "sol", "key": "current-task", "value": "rotating certificates"})
        episodes = [
            post(
                "/v1/episodic",
                {
                    "agent": "atlas",
                    "event_type": "deploy",
                    "summary": f"Deployed gateway v{n}",
                    "outcome": "success",
                    "duration_s": 42.5 + n,
                    "idempotency_key": f"deploy-{n}",
                },
            )["id"]
            for n in range(3)
        ]
        post("/v1/promote", {"agent": "atlas", "ids": episodes[:2], "fact": "Gateway deploys take under a minute"})
        server.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True})
        assert server.recall("sol", "gateway", tiers="episodic").body["count"] == 4  # audited reads
        assert server.recall("sol", "password", tiers="long").body["count"] == 1  # delivered, then forgotten
        assert server.recall("atlas", "certificates", tiers="short").body["count"] == 1
        post("/v1/short", {"agent": "sol", "key": "current-task", "value": "renewing certificates"})  # superseded
        forgot = server.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": doomed["id"]})
        assert forgot.status == 200 and forgot.body["notified"] == 1
        blink = post("/v1/short", {"agent": "nova", "key": "blink", "value": "brief", "ttl_s": 0.05})
        time.sleep(0.1)  # expired, then written again: a gap in its life, kept when it is forgotten
        post("/v1/short", {"agent": "nova", "key": "blink", "value": "back again"})
        query = {"agent": "nova", "tier": "short", "id": blink["id"]}
        assert server.request("DELETE", "/v1/memory", query=query).status == 200
        with server.db() as conn:  # the fleet's direct writers
            conn.execute("INSERT INTO memory_durable (key, value) VALUES ('persona/atlas', ?)", (AWKWARD,))
            conn.execute("UPDATE memory_longterm SET embedding = ? WHERE id = ?", (VECTOR, backup["id"]))
            conn.execute(
                "INSERT INTO memory_vector (tier, row_id, model, vector) VALUES ('long', ?, 'test-model', NULL), "
                "('episodic', ?, 'test-model', ?)",
                (backup["id"], episodes[0], VECTOR),
            )
            conn.execute(
                "INSERT INTO qdrant_import (collection, point_id, content_sha256, row_id) VALUES ('c', 'p1', 'h', ?)",
                (backup["id"],),
            )
            conn.execute("INSERT INTO qdrant_outbox (action, row_id) VALUES ('upsert', ?)", (backup["id"],))
        assert solos_memory.main(["purge", "--db", str(db)]) == 0  # archives the 2020 episode, records job runs
        said = {"recalls": recalled(server), "events": events(server), "answers": answers(server)}
        said.update(doomed=doomed["id"], forgot=forgot.body, short=key["id"])
    finally:
        stop_server(server)
    return said


def copied_source(source: tuple[Path, dict], path: Path) -> Path:
    """A copy of the module's filled database at path, for a test that changes its source."""
    with sqlite3.connect(source[0]) as conn, sqlite3.connect(path) as copy:
        conn.backup(copy)
    return path


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, dict]:
    """One filled database for the module; migrate never changes it (checked in each test)."""
    db = tmp_path_factory.mktemp("source") / "solos.db"
    return db, fill(db)


# ==== The copy, and the service on it ====


@pytest.mark.slow
def test_the_service_on_the_copy_answers_as_it_did_on_sqlite_and_new_rows_and_events_follow_on(source, pg_url):
    db, said = source
    before = file_sha256(db)
    status, lines, err = migrate(db, pg_url)
    assert status == 0, err
    summary = lines[-1]
    assert summary["migrated"] is True and summary["differ"] == [] and summary["copied"] == summary["rows"]
    by_table = tables(lines)
    assert set(by_table) == {table.name for table in solos_migrate.TABLES} | set(solos_migrate.NOT_COPIED)
    for line in by_table.values():
        assert line["ok"], line
        if "skipped" not in line:
            assert line["rows"] == line["target_rows"] and "target_sha256" not in line
    with sqlite3.connect(db) as conn:  # every table the fleet's database has is copied, or said to be left
        for name, line in by_table.items():
            (rows,) = conn.execute(f"SELECT count(*) FROM {name}").fetchone()
            if name != "solos_memory_meta":
                assert line["rows"] == rows, name
    empty = {name for name, line in by_table.items() if not line["rows"]}
    # The test fills every table (the forget's scrub may be done; back-dated short rows wait only until a sweep).
    assert empty <= {"memory_scrub_pending", "memory_short_late_expiry"}
    assert by_table["qdrant_outbox"] == {**by_table["qdrant_outbox"], "rows": 1, "copied": 0}
    assert file_sha256(db) == before

    server = start_server(pg_url)
    try:
        assert answers(server) == said["answers"]  # read first: recall writes audit rows and deliveries
        assert recalled(server) == said["recalls"]
        assert events(server) == said["events"]  # every event kept, with its id: subscribers' cursors stay good
        again = server.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": said["doomed"]})
        assert again.status == 200  # forgotten already: the same retraction answers
        assert (again.body["retraction_id"], again.body["content_hash"]) == (
            said["forgot"]["retraction_id"],
            said["forgot"]["content_hash"],
        )
        assert server.recall("sol", "password", tiers="long").body["count"] == 0

        fact = server.post("/v1/long", {"agent": "atlas", "topic": "ops", "fact": "Restores are tested monthly"})
        assert fact.status == 201 and fact.body["id"] > said["doomed"]  # the forgotten newest id is never reused
        short = server.post("/v1/short", {"agent": "hermes", "key": "k", "value": "v"}).body
        assert short["id"] > said["short"]
        last = said["events"]["next_since"]
        followed = wait_until(lambda: events(server, since=last)["events"], "the new writes' events")
        assert [(kind, tier, row) for _, kind, tier, row in followed] == [
            ("write", "long", fact.body["id"]),
            ("write", "short", short["id"]),
        ]
        assert all(event_id > last for event_id, *_ in followed)
        mine = server.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": fact.body["id"]})
        assert mine.body["retraction_id"] > said["forgot"]["retraction_id"]  # every identity moved past the copy
    finally:
        stop_server(server)
    assert file_sha256(db) == before


@pytest.mark.slow
def test_the_keyword_index_is_filled_as_a_reindex_would_fill_it(source, pg_url):
    import psycopg

    db, _ = source
    assert migrate(db, pg_url)[0] == 0
    with psycopg.connect(pg_url, autocommit=True) as conn:
        copied = conn.execute("SELECT id, context, fts::text, fts_tokens FROM memory_longterm ORDER BY id").fetchall()
        conn.execute("UPDATE memory_longterm SET fts = NULL")  # what `reindex` does
        rebuilt = conn.execute("SELECT id, context, fts::text, fts_tokens FROM memory_longterm ORDER BY id").fetchall()
        assert copied == rebuilt and all(row[2] for row in copied)
        for table in ("memory_episodic", "memory_episodic_archive", "memory_short"):
            assert conn.execute(f"SELECT count(*) FROM {table} WHERE fts IS NULL OR fts_tokens = 0").fetchone()[0] == 0
    with sqlite3.connect(db) as conn:  # the same context SQLite's index holds
        sqlite_context = dict(conn.execute("SELECT rowid, context FROM memory_longterm_fts"))
    assert {row[0]: row[1] for row in copied} == sqlite_context


@pytest.mark.slow
def test_the_databases_owner_needs_no_superuser(source, pg_cluster):
    """Triggers are turned off per table inside the copy's transaction, which the tables' owner may do; the
    `SET session_replication_role = replica` would have needed a superuser."""
    import psycopg

    db, _ = source
    role, database = f"migrator_{uuid.uuid4().hex[:8]}", f"owned_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_cluster.url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN CREATEROLE")  # CREATEROLE: the service's role, made once
        conn.execute(f"CREATE DATABASE {database} OWNER {role}")
    url = pg_cluster.url_of(database).replace("postgres@", f"{role}@", 1)
    try:
        status, lines, err = migrate(db, url)
        assert status == 0, err
        assert lines[-1]["migrated"] is True and lines[-1]["copied"] > 0
    finally:
        pg_cluster.drop_database(pg_cluster.url_of(database))


# ==== Running it again ====


@pytest.mark.slow
def test_a_second_run_copies_nothing_and_verifies_again(source, pg_url):
    db, _ = source
    before = file_sha256(db)
    assert migrate(db, pg_url)[0] == 0
    status, lines, err = migrate(db, pg_url)
    assert status == 0, err
    assert lines[-1]["copied"] == 0 and lines[-1]["migrated"] is True
    assert all(line["ok"] and line["copied"] == 0 for line in tables(lines).values())
    assert file_sha256(db) == before


@pytest.mark.slow
def test_a_run_after_the_source_grew_copies_only_the_new_rows(source, pg_url, tmp_path):
    grown = copied_source(source, tmp_path / "grown.db")
    assert migrate(grown, pg_url)[0] == 0
    server = start_server(grown)
    try:
        server.post("/v1/long", {"agent": "nova", "fact": "Written after the first run"})
    finally:
        stop_server(server)
    status, lines, err = migrate(grown, pg_url)
    assert status == 0, err
    copied = {name: line["copied"] for name, line in tables(lines).items() if line["copied"]}
    assert copied["memory_longterm"] == 1 and copied["memory_event"] == 1
    assert set(copied) <= {
        "memory_longterm",
        "memory_event",
        "memory_write_key",
        "memory_activity",
        "solos_memory_meta",
        "memory_delivery",
    }


@pytest.mark.slow
def test_a_target_row_changed_by_hand_fails_verification_with_exit_1(source, pg_url):
    import psycopg

    db, _ = source
    assert migrate(db, pg_url)[0] == 0
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")  # the row alone, nothing logged beside it
        conn.execute("UPDATE memory_episodic SET summary = 'Deployed nothing' WHERE id = 2")
    status, lines, err = migrate(db, pg_url)
    assert status == 1
    by_table = tables(lines)
    assert lines[-1]["migrated"] is False and lines[-1]["differ"] == ["memory_episodic"]
    changed = by_table["memory_episodic"]
    assert changed["ok"] is False and changed["rows"] == changed["target_rows"] and changed["copied"] == 0
    assert changed["target_sha256"] != changed["sha256"]
    assert "migrate into a new, empty database" in err


@pytest.mark.slow
def test_a_target_the_service_has_used_since_is_refused_before_anything_is_copied(source, pg_url, tmp_path):
    import psycopg

    db, _ = source
    assert migrate(db, pg_url)[0] == 0
    server = start_server(pg_url)
    try:
        server.post("/v1/long", {"agent": "nova", "fact": "Written on PostgreSQL after the move"})
    finally:
        stop_server(server)
    grown = copied_source(source, tmp_path / "grown.db")  # the old file gained a row: not for the live store
    with sqlite3.connect(grown) as conn:
        conn.execute("INSERT INTO memory_longterm (agent, fact) VALUES ('sol', 'A late write to the old file')")
    with psycopg.connect(pg_url) as conn:
        before = conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0]
    status, lines, err = migrate(grown, pg_url)
    assert status == 1 and lines == [] and len(err.splitlines()) == 1
    assert "the target has events of its own (1 past the source's last)" in json.loads(err)["reason"]
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0] == before


@pytest.mark.slow
def test_a_target_holding_another_sources_migration_is_refused_before_anything_is_copied(source, pg_url, tmp_path):
    import psycopg

    db, _ = source
    assert migrate(db, pg_url)[0] == 0
    other = tmp_path / "other.db"  # another fleet's database, its own first start behind it
    stop_server(start_server(other))
    with sqlite3.connect(other) as conn:  # more events than the first source: its ids pass the target's
        conn.executemany(
            "INSERT INTO memory_longterm (agent, fact) VALUES ('sol', ?)",
            [(f"Fact {n} of another fleet",) for n in range(40)],
        )
    with psycopg.connect(pg_url) as conn:
        before = conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0]
    status, lines, err = migrate(other, pg_url)
    assert status == 1 and lines == [] and len(err.splitlines()) == 1
    assert "the target holds a migration from another source" in json.loads(err)["reason"]
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0] == before


@pytest.mark.slow
@pytest.mark.parametrize(
    "column,value,said",
    [
        ("fact", "'a' || char(0) || 'b'", "holds a NUL"),
        ("fact", "CAST(X'61ff62' AS TEXT)", "is not UTF-8"),
        ("fact", "X'6162'", "is a BLOB"),
        ("confidence", "'high'", "is not a number"),
    ],
    ids=["nul", "not utf-8", "blob", "text for a number"],
)
def test_a_row_postgresql_cannot_hold_is_named_so_the_operator_can_mend_it_and_run_again(
    source, pg_url, tmp_path, column, value, said
):
    # The API refuses NUL, bytes that are not UTF-8, a BLOB for text and text for a number; the fleet's direct
    # writers need not, SQLite keeps them and PostgreSQL refuses each. The line said only "memory_longterm:
    # PostgreSQL text fields cannot contain NUL (0x00) bytes", sqlite3's "Could not decode to UTF-8 column
    # 'fact'" or "invalid input syntax for type double precision", and a BLOB was copied as other text, which
    # verification then blamed on a hand edit: which row, and which column, was the operator's to hunt for.
    odd = copied_source(source, tmp_path / "odd.db")
    with sqlite3.connect(odd) as conn:
        row = conn.execute(
            "INSERT INTO memory_longterm (agent, topic, fact) VALUES ('nova', 'ops', 'f') RETURNING id"
        ).fetchone()[0]
        conn.execute(f"UPDATE memory_longterm SET {column} = {value} WHERE id = ?", (row,))
    status, lines, err = migrate(odd, pg_url)
    assert status == 1 and lines == [] and len(err.splitlines()) == 1, err
    reason = json.loads(err)["reason"]
    assert f"memory_longterm id {row}: its {column} {said}" in reason, reason
    with sqlite3.connect(odd) as conn:
        mended = "ab" if column == "fact" else 0.5
        conn.execute(f"UPDATE memory_longterm SET {column} = ? WHERE id = ?", (mended, row))  # mended by hand
    if column == "fact":
        status, lines, err = migrate(odd, pg_url)
        reason = json.loads(err)["reason"]  # the update kept the old text as a version: named in turn
        assert status == 1 and "memory_version id " in reason and f"its text {said}" in reason, reason
        with sqlite3.connect(odd) as conn:
            conn.execute("UPDATE memory_version SET text = 'ab' WHERE tier = 'long' AND row_id = ?", (row,))
    status, lines, err = migrate(odd, pg_url)
    assert status == 0 and lines[-1]["migrated"] is True, err


@pytest.mark.slow
def test_a_short_expiry_an_older_release_let_the_fleet_spell_otherwise_is_copied_as_it_is(source, pg_url, tmp_path):
    # Both stores now refuse a short expiry spelt other than as the service writes it; a file an older release
    # kept may hold one. migrate copies the file as it is (the refusal is a trigger of its own, off while it copies,
    # as the events' are), so the operator is not stopped at a row the fleet wrote long ago.
    odd = copied_source(source, tmp_path / "spelt.db")
    with sqlite3.connect(odd) as conn:
        conn.execute("DROP TRIGGER memory_short_expiry_spelled_in")  # as an older release's file: no such trigger
        conn.execute(
            "INSERT INTO memory_short (agent, key, value, expires_at) VALUES ('nova', 'spelt', 'v', ?)",
            ("2026-12-07 09:17:34",),
        )
    status, lines, err = migrate(odd, pg_url)
    assert status == 0 and lines[-1]["migrated"] is True, err
    with pytest.importorskip("psycopg").connect(pg_url) as conn:
        assert conn.execute("SELECT expires_at FROM memory_short WHERE key = 'spelt'").fetchall() == [
            ("2026-12-07 09:17:34",)
        ]


def test_the_summary_counts_forgotten_private_points_whose_delete_only_the_mirror_sends(source, pg_url, tmp_path):
    # Forgetting an episode import-qdrant made of a private point queues the point's delete in qdrant_import
    # (reason forget_pending), which only the SQLite mirror sends. qdrant_import is copied, and on PostgreSQL no
    # mirror runs: the summary said the outbox held nothing, and the forgotten text stayed in Qdrant unsaid.
    odd = copied_source(source, tmp_path / "pending.db")
    with sqlite3.connect(odd) as conn:
        conn.execute(
            "INSERT INTO qdrant_import (collection, point_id, content_sha256, row_id, reason) "
            "VALUES ('long_term', '41', 'h41', 7, 'forget_pending')"
        )
    status, lines, err = migrate(odd, pg_url)
    assert status == 0, err
    outbox = tables(lines)["qdrant_outbox"]
    assert outbox["forget_pending"] == 1 and "forget_pending" in outbox["skipped"], outbox


# ==== Clear errors: one line, exit non-zero ====


def test_a_missing_source_is_one_line(tmp_path):
    status, lines, err = migrate(tmp_path / "nowhere.db", "postgresql://127.0.0.1:1/solos")
    assert status == 1 and lines == []
    assert len(err.splitlines()) == 1 and "nowhere.db: no such SQLite database" in json.loads(err)["reason"]
    assert not (tmp_path / "nowhere.db").exists()


def test_a_target_that_is_not_postgresql_is_one_line(tmp_path):
    db = tmp_path / "solos.db"
    sqlite3.connect(db).close()
    status, _, err = migrate(db, str(tmp_path / "other.db"))
    assert status == 1 and len(err.splitlines()) == 1
    assert "--to must be a postgresql:// URL" in json.loads(err)["reason"]


def test_a_source_that_is_not_sqlite_is_one_line(tmp_path):
    db = tmp_path / "solos.db"
    db.write_text("not a database\n" * 100)
    status, _, err = migrate(db, "postgresql://127.0.0.1:1/solos")
    assert status == 1 and len(err.splitlines()) == 1 and "not a database" in json.loads(err)["reason"]


def test_an_unreachable_server_is_one_line_and_the_password_is_not_shown(tmp_path):
    pytest.importorskip("psycopg")
    db = tmp_path / "solos.db"
    sqlite3.connect(db).close()
    status, _, err = migrate(db, "postgresql://solos:secret@127.0.0.1:1/solos")
    assert status == 1 and len(err.splitlines()) == 1
    reason = json.loads(err)["reason"]
    assert "cannot be reached" in reason and "secret" not in err


def test_the_command_line_names_both_ends():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        solos_memory.main(["migrate", "--help"])
    assert "--from" in out.getvalue() and "--to" in out.getvalue()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
        solos_memory.main(["migrate", "--from", "solos.db"])
    assert "--to" in err.getvalue()


def test_the_row_hash_tells_kinds_apart_and_keeps_text_whole():
    rows = [(1, "1"), ("1", 1), (1.0, None), (b"\x01", "01"), ("a\x1fb", "c"), ("a", "b\x1fc")]
    assert len({solos_migrate.row_bytes(row) for row in rows}) == len(rows)
    assert solos_migrate.cell(0.1) == "f0.1" and solos_migrate.cell(b"\x00\xff") == "x00ff"
