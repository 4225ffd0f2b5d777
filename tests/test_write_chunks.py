"""The service's bulk writes (purge, the delivery log's purge, archive, event prune, a forget's index merge) run as
short transactions with SQLite's write lock left free between two, so an agent's own write gets in between.

An agent's write waits in SQLite's busy handler, which looks again after sleeps that grow to 100 ms: chunks
committed back to back re-take the lock before it looks, and starved it for 1.5 s at 100k rows
(bench/write_lock.py). Here the store's sleep between two chunks is an agent's write on its own connection
with busy_timeout 0: it succeeds only if the lock is free right then, so no timing is asserted.
"""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

import solos_events
import solos_forget
import solos_lifecycle
import solos_provenance
import solos_qdrant
import solos_store

OLD = "2020-01-01T00:00:00.000Z"


@pytest.fixture
def store(tmp_path):
    opened = solos_store.Store(str(tmp_path / "solos.db"), admin=True)
    opened.migrate()
    opened.register_agents(["atlas"])
    yield opened
    opened.close()


class PausedAgent:
    """solos_store's `time`, whose sleep (the pause between two chunks) is one agent write that must not wait
    (its own connection, busy_timeout 0): it raises 'database is locked' if the job still held the lock."""

    monotonic = staticmethod(time.monotonic)

    def __init__(self, path: str):
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=0)
        self.conn.execute("CREATE TABLE IF NOT EXISTS agent_scratch (id INTEGER PRIMARY KEY)")
        self.pauses: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute("INSERT INTO agent_scratch DEFAULT VALUES")
        self.conn.execute("COMMIT")
        self.pauses.append(seconds)


@pytest.fixture
def agent_writes(store, monkeypatch) -> list[float]:
    """The pauses a job made, an agent's write in each."""
    agent = PausedAgent(store.path)
    monkeypatch.setattr(solos_store, "time", agent)
    yield agent.pauses
    agent.conn.close()


def insert(store: solos_store.Store, sql: str, rows: list[tuple]) -> None:
    store.write(lambda conn: conn.executemany(sql, rows))


def count(store: solos_store.Store, table: str) -> int:
    return store.read(lambda conn: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def test_purge_of_expired_short_rows_lets_an_agent_write_between_its_chunks(store, agent_writes):
    rows = [("atlas", f"k{i}", f"note {i}", "[]", OLD) for i in range(35)]
    insert(store, "INSERT INTO memory_short (agent, key, value, tags, expires_at) VALUES (?, ?, ?, ?, ?)", rows)
    assert store.purge_expired(batch=10) == 35
    assert len(agent_writes) == 3  # chunks of 10, 10, 10 and 5: the agent wrote between each two
    assert count(store, "memory_short") == 0


def test_purge_of_expired_short_values_kept_versions_goes_on_past_a_batch(store, agent_writes):
    """A database upgraded with 90 days of kept versions: the first purge takes every short value past its expiry,
    batch by batch (an agent writing between two), not the first batch of them only; a live value's stay."""
    rows = [("short", i, "atlas", f"k{i}", f"note {i}", OLD, OLD, OLD, "update") for i in range(35)]
    rows.append(("short", 99, "atlas", "k99", "live note", "2999-01-01T00:00:00.000Z", OLD, OLD, "update"))
    insert(
        store,
        "INSERT INTO memory_version (tier, row_id, agent, label, text, expires_at, valid_from, valid_to, ended_by) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    assert store.purge_expired(batch=10) == 0  # no short rows: the versions are not counted as rows
    assert len(agent_writes) == 3
    assert store.read(lambda conn: [r[0] for r in conn.execute("SELECT text FROM memory_version")]) == ["live note"]


def test_the_delivery_log_purge_lets_an_agent_write_between_its_chunks(store, agent_writes, monkeypatch):
    monkeypatch.setattr(solos_provenance, "PURGE_BATCH", 10)
    rows = [("sol", "long", i, "atlas", OLD) for i in range(25)]
    insert(
        store, "INSERT INTO memory_delivery (reader, tier, row_id, writer, delivered_at) VALUES (?, ?, ?, ?, ?)", rows
    )
    assert solos_provenance.purge(store) == 25
    assert len(agent_writes) == 3  # 10, 10, 5, then the chunk that finds nothing left
    assert count(store, "memory_delivery") == 0


def test_the_archive_lets_an_agent_write_between_its_chunks_and_moves_each_row_once(store, agent_writes, monkeypatch):
    monkeypatch.setattr(solos_lifecycle, "ARCHIVE_BATCH", 10)
    rows = [("atlas", "deploy", f"episode {i}", OLD) for i in range(25)]
    insert(store, "INSERT INTO memory_episodic (agent, event_type, summary, timestamp) VALUES (?, ?, ?, ?)", rows)
    assert solos_lifecycle.archive_episodic(store, 30) == 25
    assert len(agent_writes) == 2  # 10, 10, 5
    assert (count(store, "memory_episodic"), count(store, "memory_episodic_archive")) == (0, 25)


def test_the_event_prune_lets_an_agent_write_between_its_chunks(store, agent_writes, monkeypatch):
    monkeypatch.setattr(solos_events, "BATCH", 1)  # a prune step deletes BATCH * 10 events
    insert(
        store,
        "INSERT INTO memory_event (ts, kind, tier, row_id, agent) VALUES (?, 'write', 'long', ?, 'atlas')",
        [(OLD, i) for i in range(25)],
    )
    hub = object.__new__(solos_events.EventHub)  # its prune alone: no thread, no subscribers
    hub.store, hub.own, hub.own_lock = store, store.connect(), threading.Lock()
    try:
        assert hub.prune() == 25
    finally:
        hub.own.close()
    assert len(agent_writes) == 2  # 10, 10, 5
    assert count(store, "memory_event") == 0


def test_a_forgets_index_merge_lets_an_agent_write_between_its_steps(store, agent_writes, monkeypatch):
    monkeypatch.setattr(solos_store, "MERGE_PAGES", 1)
    for i in range(40):  # a transaction each: an index segment each
        store.write(lambda conn, i=i: store.insert_long(conn, "atlas", "", f"fact {i} about failover", None, None, []))
    solos_forget.Scrubber(store).merge("memory_longterm_fts")
    assert agent_writes, "the merge took more than one step, and the agent wrote between them"
    assert store.write(lambda conn: store.queries.merge_step(conn, "memory_longterm_fts")) < 2  # merged through


def test_the_pause_between_chunks_is_as_long_as_the_chunk_held_the_lock_within_bounds(store, agent_writes):
    for held in (0.001, 0.04, 3.0):
        store.between_chunks(held)
    assert agent_writes == [solos_store.CHUNK_PAUSE_S[0], 0.04, solos_store.CHUNK_PAUSE_S[1]]


def test_reindex_rebuilds_each_keyword_index_in_its_own_transaction_and_lets_an_agent_write_between(
    store, agent_writes
):
    rows = [("atlas", "deploy", f"episode {i} of the failover drill", OLD) for i in range(25)]
    insert(store, "INSERT INTO memory_episodic (agent, event_type, summary, timestamp) VALUES (?, ?, ?, ?)", rows)
    emptied = "INSERT INTO memory_episodic_fts (memory_episodic_fts) VALUES ('delete-all')"  # what reindex repairs
    store.write(lambda conn: conn.execute(emptied))
    store.reindex()
    assert len(agent_writes) == len(solos_store.FTS_TABLES) - 1  # one index after the other, the agent between
    matching = "SELECT count(*) FROM memory_episodic_fts WHERE memory_episodic_fts MATCH 'drill'"
    assert store.read(lambda conn: conn.execute(matching).fetchone()[0]) == 25


def test_a_migration_stopped_before_a_new_keyword_index_is_filled_fills_it_on_the_next_start(tmp_path, monkeypatch):
    path = str(tmp_path / "solos.db")
    first = solos_store.Store(path, admin=True)
    first.migrate()
    first.register_agents(["atlas"])
    rows = [("atlas", "deploy", f"episode {i} of the failover drill", OLD) for i in range(5)]
    insert(first, "INSERT INTO memory_episodic (agent, event_type, summary, timestamp) VALUES (?, ?, ?, ?)", rows)
    first.write(lambda conn: conn.execute("DROP TABLE memory_episodic_fts"))  # a database from before that index
    first.close()

    def stopped(conn: sqlite3.Connection, fts: str) -> None:
        raise KeyboardInterrupt  # the process stops while the new index fills

    monkeypatch.setattr(solos_store.Store, "rebuild_index", staticmethod(stopped))
    with pytest.raises(KeyboardInterrupt):
        solos_store.Store(path, admin=True).migrate()
    monkeypatch.undo()
    again = solos_store.Store(path, admin=True)
    again.migrate()
    matching = "SELECT count(*) FROM memory_episodic_fts WHERE memory_episodic_fts MATCH 'drill'"
    assert again.read(lambda conn: conn.execute(matching).fetchone()[0]) == 5
    again.close()


def test_a_first_qdrant_mirror_queues_the_stored_facts_in_chunks_with_an_agent_write_between(
    store, agent_writes, monkeypatch
):
    monkeypatch.setattr(solos_qdrant, "ENQUEUE_CHUNK", 10)
    for i in range(25):
        store.write(lambda conn, i=i: store.insert_long(conn, "atlas", "", f"fact {i}", None, None, []))
    assert solos_qdrant.Mirror(store, solos_qdrant.Target()).enable() == 25
    assert len(agent_writes) == 3  # 10, 10, 5, then the chunk that finds nothing left
    assert count(store, "qdrant_outbox") == 25


def test_a_first_qdrant_mirror_stopped_half_way_queues_the_rest_at_the_next_start(store, monkeypatch):
    monkeypatch.setattr(solos_qdrant, "ENQUEUE_CHUNK", 10)
    for i in range(25):
        store.write(lambda conn, i=i: store.insert_long(conn, "atlas", "", f"fact {i}", None, None, []))

    def stopped(held_s: float) -> None:  # the service stops after the first chunk has committed
        raise SystemExit("stopped")

    monkeypatch.setattr(store, "between_chunks", stopped)
    with pytest.raises(SystemExit):
        solos_qdrant.Mirror(store, solos_qdrant.Target()).enable()
    monkeypatch.undo()
    assert count(store, "qdrant_outbox") == 10

    assert solos_qdrant.Mirror(store, solos_qdrant.Target()).enable() == 15
    queued = store.read(lambda conn: [row[0] for row in conn.execute("SELECT row_id FROM qdrant_outbox")])
    assert sorted(queued) == sorted(set(queued)) and len(queued) == 25  # every fact once
    assert solos_qdrant.Mirror(store, solos_qdrant.Target()).enable() == 0  # done: nothing queued twice
