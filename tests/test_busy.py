"""A locked database gives a 503 with a reason within a bounded time, never an empty success."""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import contextmanager

import pytest
from conftest import BUDGET_MS


@contextmanager
def write_lock_held(db_path, exclusive: bool = False):
    """Another writer (one of the fleet's) holding the lock; exclusive also blocks WAL readers."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    if exclusive:
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        conn.execute("BEGIN EXCLUSIVE")
        conn.execute("INSERT INTO memory_longterm (agent, fact) VALUES ('sol', 'written under an exclusive lock')")
    else:
        conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    finally:
        conn.execute("ROLLBACK")
        conn.close()


@pytest.mark.slow
def test_writes_get_503_with_reason_and_retry_after_then_recover(make_server):
    server = make_server(busy_timeout_ms=BUDGET_MS)
    with write_lock_held(server.db_path):
        started = time.monotonic()
        reply = server.post("/v1/long", {"agent": "atlas", "fact": "blocked fact"})
        elapsed = time.monotonic() - started
        assert reply.status == 503
        assert reply.body["error"]["code"] == "busy" and "locked" in reply.body["error"]["message"]
        assert reply.headers["retry-after"] == "1"
        assert elapsed < BUDGET_MS / 1000 + 1.0
        short = server.post("/v1/short", {"agent": "atlas", "key": "k", "value": "v"})
        assert short.status == 503
    stats = server.get("/v1/stats").body
    assert stats["rejections"]["busy"] == 2
    assert server.post("/v1/long", {"agent": "atlas", "fact": "blocked fact"}).status == 201
    with server.db() as conn:
        assert [r[0] for r in conn.execute("SELECT fact FROM memory_longterm")] == ["blocked fact"]


@pytest.mark.slow
def test_a_lock_released_within_the_budget_is_waited_for(make_server):
    server = make_server(busy_timeout_ms=2000)
    holder = sqlite3.connect(server.db_path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    releaser = threading.Timer(0.2, lambda: holder.execute("COMMIT"))
    releaser.start()
    try:
        assert server.post("/v1/long", {"agent": "atlas", "fact": "waited"}).status == 201
    finally:
        releaser.join()
        holder.close()


@pytest.mark.slow
def test_reads_under_a_plain_write_lock_still_return_the_data(make_server):
    """WAL readers do not wait for writers: recall answers with the real rows."""
    server = make_server(busy_timeout_ms=BUDGET_MS)
    server.post("/v1/long", {"agent": "atlas", "fact": "visible during a write lock"})
    with write_lock_held(server.db_path):
        reply = server.recall("sol", "visible")
        assert reply.status == 200
        assert [r["text"] for r in reply.body["results"]] == ["visible during a write lock"]


@pytest.mark.slow
def test_reads_blocked_by_an_exclusive_lock_are_503_never_empty(make_server):
    server = make_server(busy_timeout_ms=BUDGET_MS)
    server.post("/v1/long", {"agent": "atlas", "fact": "hidden by an exclusive lock"})
    server.server.memory.events.stop()  # its background sweeps would open connections too
    server.server.memory.deliveries.close()  # and the delivery log's batches
    server.server.memory.store.close()  # idle pooled connections would keep the exclusive lock out
    with write_lock_held(server.db_path, exclusive=True):
        started = time.monotonic()
        reply = server.recall("sol", "hidden")
        assert reply.status == 503 and reply.body["error"]["code"] == "busy"
        assert time.monotonic() - started < BUDGET_MS / 1000 + 1.0
        assert server.get("/v1/stats").status == 503
        assert server.get("/health").status == 200  # health does not need the database
    assert server.recall("sol", "hidden").body["count"] == 1


@pytest.mark.slow
def test_foreign_episodic_rows_are_not_returned_if_the_audit_cannot_be_written(make_server):
    server = make_server(busy_timeout_ms=BUDGET_MS)
    server.post("/v1/episodic", {"agent": "atlas", "event_type": "task", "summary": "audited event"})
    server.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True})
    with write_lock_held(server.db_path):
        reply = server.recall("sol", "audited", tiers="episodic")
        assert reply.status == 503
    reply = server.recall("sol", "audited", tiers="episodic")
    assert reply.status == 200 and reply.body["count"] == 1
    assert len(server.get("/v1/audit", agent="atlas").body["reads"]) == 1
