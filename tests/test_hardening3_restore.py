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
import solos_snapshot
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


@pytest.mark.slow
def test_a_purge_failing_on_a_held_lock_is_recorded_and_shown(tmp_path, capsys):
    db = tmp_path / "solos.db"
    stop_server(start_server(db))
    holder = held_lock(db, 0.8)
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


@pytest.mark.slow
def test_a_runs_end_is_recorded_after_a_lock_held_past_the_busy_timeout(tmp_path):
    db = tmp_path / "solos.db"
    stop_server(start_server(db))
    holders = []

    def fails_under_a_held_lock() -> int:
        holders.append(held_lock(db, 0.5))
        raise solos_store.Busy("the database stayed locked")

    with pytest.raises(solos_store.Busy):
        solos_jobs.recorded(str(db), "purge", fails_under_a_held_lock, busy_timeout_ms=100)
    holders[0].join()
    assert job_runs(db) == [("purge", "failed", "Busy: the database stayed locked", True)]


# ---- item 10: a restore into a missing target never hands out an id or event id twice ----


def restore_log(err: str) -> dict:
    """The restore command's log line."""
    return [json.loads(line) for line in err.splitlines() if '"event": "restore"' in line][-1]


def written_after_a_snapshot(server, folder: Path) -> tuple[Path, int, int]:
    """Fact 1, a snapshot, then fact 2 (a client keeps its id) and an episode: (manifest, fact 2's id, last event)."""
    assert server.post("/v1/long", {"agent": "atlas", "fact": "fact one, in the snapshot"}).status == 201
    assert solos_memory.main(["snapshot", "--db", str(server.db_path), "--dir", str(folder)]) == 0
    kept = server.post("/v1/long", {"agent": "atlas", "fact": "fact two, written after it"}).body["id"]
    assert server.post("/v1/episodic", {"agent": "atlas", "event_type": "note", "summary": "an episode"}).status == 201
    head = server.get("/v1/events", agent="atlas", since=0).body["next_since"]
    return sorted(folder.glob("solos-*.json"))[-1], kept, head


def after_the_restore(db: Path, kept: int, head: int) -> int:
    """atlas's next fact, a client's forget of its old id, and a subscriber resuming at its cursor; the new id."""
    running = start_server(db)
    try:
        new = running.post("/v1/long", {"agent": "atlas", "fact": "fact three, after the restore"}).body["id"]
        assert new > kept  # never the id a client still holds for fact two
        query = {"agent": "atlas", "tier": "long", "id": kept}
        assert running.request("DELETE", "/v1/memory", query=query).status == 404  # not the new fact
        assert [r["text"] for r in running.recall("atlas", "restore").body["results"]] == [
            "fact three, after the restore"
        ]
        resumed = running.get("/v1/events", agent="atlas", since=head).body["events"]
        assert [(e["kind"], e["row_id"]) for e in resumed] == [("write", new)]  # the resumed cursor sees it
        return new
    finally:
        stop_server(running)


def test_a_restore_beside_the_live_database_carries_its_marks_and_says_so(server, tmp_path, capsys):
    manifest, kept, head = written_after_a_snapshot(server, tmp_path / "snapshots")
    capsys.readouterr()
    beside = tmp_path / "beside.db"
    assert solos_memory.main(["restore", str(manifest), "--db", str(beside)]) == 0
    report = restore_log(capsys.readouterr().err)
    assert report["ids_from"] == str(server.db_path)
    assert any("beside" in w and str(server.db_path) in w and "a running service" in w for w in report["warnings"]), (
        report["warnings"]
    )
    assert after_the_restore(beside, kept, head) == kept + 1  # carried exactly: no jump


def test_a_restore_after_the_database_is_lost_raises_the_marks_and_says_ids_are_stale(tmp_path, capsys):
    db = tmp_path / "solos.db"
    server = start_server(db)
    try:
        manifest, kept, head = written_after_a_snapshot(server, tmp_path / "snapshots")
    finally:
        stop_server(server)
    lost = tmp_path / "lost"
    lost.mkdir()
    for file in tmp_path.glob("solos.db*"):
        file.rename(lost / file.name)  # the disk is gone
    capsys.readouterr()
    assert solos_memory.main(["restore", str(manifest), "--db", str(db)]) == 0
    report = restore_log(capsys.readouterr().err)
    assert report["ids_from"] is None
    stale = [w for w in report["warnings"] if "stale" in w]
    assert stale and "ids" in stale[0] and "cursors" in stale[0] and str(db) in stale[0], report["warnings"]
    assert after_the_restore(db, kept, head) > kept + solos_snapshot.UNKNOWN_IDS_MARGIN // 2
