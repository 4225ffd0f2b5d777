"""Hardening, round three (issue 31): restore's ids and cursors (10), a purge's failure recorded under a held
lock (14), /health without paths (17), REST integers and a body-less PUT (18)."""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import raw_exchange, start_server, statuses_in, stop_server

import solos_bounds
import solos_jobs
import solos_memory
import solos_store

# ---- item 18: REST integers as long as MCP's; a method the path does not take is 405 with or without a body ----


def test_rest_takes_every_integer_mcp_takes(server):
    largest = str(solos_bounds.MAX_ID)
    rest = server.get("/v1/events", agent="sol", since=largest)
    mcp = server.mcp_tool("read_events", {"agent": "sol", "since": solos_bounds.MAX_ID})
    assert rest.status == 200, rest.body
    assert mcp.status == 200 and not mcp.body["result"]["isError"], mcp.body
    assert rest.body["next_since"] == mcp.body["result"]["structuredContent"]["next_since"] == solos_bounds.MAX_ID


@pytest.mark.parametrize(
    ("since", "named"),
    [
        (str(solos_bounds.MAX_ID + 1), "at most"),  # one past: the range check names it, as MCP's does
        ("9" * 40, "at most"),
        ("١٢", "integer"),  # Arabic-Indic digits: int() reads them, the schema's integer is ASCII
        ("12x", "integer"),
    ],
)
def test_rest_integers_out_of_range_or_malformed_are_a_400_naming_the_field(server, since, named):
    reply = server.get("/v1/events", agent="sol", since=since)
    assert reply.status == 400, reply.body
    assert reply.body["error"]["field"] == "since" and named in reply.body["error"]["message"]


def bare(server, method: str, path: str) -> tuple[int, dict, dict]:
    """A request without a body or a Content-Length (curl -X PUT URL): status, headers, JSON body."""
    raw = raw_exchange(server.port, f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
    head, _, body = raw.partition(b"\r\n\r\n")
    fields = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])
    return statuses_in(raw)[0], {k.lower(): v for k, v in fields.items()}, json.loads(body)


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [("PUT", "/v1/recall", "GET"), ("POST", "/v1/recall", "GET"), ("PUT", "/v1/long", "POST")],
)
def test_a_method_the_path_does_not_take_is_405_without_a_body_too(server, method, path, allowed):
    status, headers, body = bare(server, method, path)
    with_body = server.request(method, path, body={})
    assert (status, with_body.status) == (405, 405), body
    assert allowed in headers["allow"] and body["error"]["code"] == with_body.body["error"]["code"]


@pytest.mark.parametrize(("method", "path"), [("PUT", "/v1/sharing"), ("POST", "/v1/long"), ("POST", "/mcp")])
def test_a_method_the_path_takes_still_needs_its_body(server, method, path):
    status, _, body = bare(server, method, path)
    assert status == 411 and body["error"]["field"] == "Content-Length"


# ---- item 17: /health (no token) names no machine path; the operator's view of stats keeps them ----


@pytest.fixture
def embedder_missing(make_server, monkeypatch, tmp_path):
    """A service whose embedder lacks its packages and model: the reason names the interpreter and the folder."""
    for module in ("onnxruntime", "tokenizers"):
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setattr(sys, "prefix", sys.base_prefix + "-venv")  # a venv: the install command names sys.executable
    return make_server("nothing.db", model_dir=str(tmp_path / "no-model"))


def test_health_names_no_path_the_operators_stats_do(embedder_missing, tmp_path):
    server = embedder_missing
    interpreter = str(Path(sys.executable).parent)
    operator = server.get("/v1/stats").body  # loopback trust, no agent named: the operator view
    assert operator["view"] == "operator" and interpreter in operator["degraded_reason"]
    assert str(tmp_path) in operator["degraded_reason"]
    health = server.get("/health").body
    assert health["degraded"] is True and "not installed for …/python" in health["degraded_reason"]
    agent_view = server.get("/v1/stats", agent="sol").body
    server.post("/v1/long", {"agent": "atlas", "fact": "keyword rows still come back"})
    recall = server.recall("sol", "keyword").body
    for reason in (health["degraded_reason"], agent_view["degraded_reason"], recall["degraded_reason"]):
        assert interpreter not in reason and str(tmp_path) not in reason, reason
        assert "onnxruntime, tokenizers" in reason and "pip install" in reason  # the advice stays


# ---- item 14: a purge that fails on a held lock is recorded once the lock is free ----


def held_lock(db: Path, seconds: float) -> threading.Thread:
    """A fleet writer holding the write lock for `seconds` (past any busy timeout a job waits); it has it on return."""
    taken = threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        taken.set()
        time.sleep(seconds)
        conn.execute("COMMIT")
        conn.close()

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait()
    return holder


def job_runs(db: Path) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(
            "SELECT job, result, error, ended_at IS NOT NULL FROM memory_job_run ORDER BY id"
        ).fetchall()
    finally:
        conn.close()


def test_a_purge_failing_on_a_held_lock_is_recorded_and_shown(tmp_path, capsys):
    db = tmp_path / "solos.db"
    stop_server(start_server(db))
    holder = held_lock(db, 1.5)
    try:
        assert solos_memory.main(["purge", "--db", str(db), "--busy-timeout-ms", "200"]) == 1
    finally:
        holder.join()
    runs = job_runs(db)
    assert [(job, result, ended) for job, result, _, ended in runs] == [
        ("purge", "failed", True),
        ("archive", "failed", True),
    ], capsys.readouterr().err
    assert all("database is locked" in error for _, _, error, _ in runs)
    running = start_server(db)
    try:
        jobs = running.get("/v1/stats").body["jobs"]
        assert (jobs["purge"]["state"], jobs["purge"]["problem"]) == ("failed", True)
        assert "database is locked" in jobs["purge"]["detail"]
    finally:
        stop_server(running)


def test_a_runs_end_is_recorded_after_a_lock_held_past_the_busy_timeout(tmp_path):
    db = tmp_path / "solos.db"
    stop_server(start_server(db))
    holders = []

    def fails_under_a_held_lock() -> int:
        holders.append(held_lock(db, 1.0))
        raise solos_store.Busy("the database stayed locked")

    with pytest.raises(solos_store.Busy):
        solos_jobs.recorded(str(db), "purge", fails_under_a_held_lock, busy_timeout_ms=100)
    holders[0].join()
    assert job_runs(db) == [("purge", "failed", "Busy: the database stayed locked", True)]
