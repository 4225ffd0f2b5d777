"""The daily jobs: every purge, archive and snapshot run is a row, recorded even when a held lock fails it; stats,
metrics and the page say which are late.

And the units: each job's unit (and the service's) names an OnFailure= template that reports the failure
through the operator's command, or a line in the journal.
"""

from __future__ import annotations

import json
import os
import shlex
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, Dom, metric_samples, start_server, stop_server

import solos_jobs
import solos_memory
import solos_store

UNITS = ROOT / "systemd"
ALERT_UNIT = "lab-memory-alert@.service"


def runs(server) -> list[dict]:
    with server.db() as conn:
        return [dict(row) for row in conn.execute("SELECT * FROM memory_job_run ORDER BY id")]


def metric(server, name: str) -> dict[str, float]:
    """One metric family's samples by their job label."""
    return {labels.split('job="')[1].split('"')[0]: value for labels, value in metric_samples(server, name).items()}


def test_purge_archive_and_snapshot_record_each_run(server, tmp_path):
    server.post("/v1/short", {"agent": "atlas", "key": "gone", "value": "expires at once", "ttl_s": 1})
    server.post("/v1/episodic", {"agent": "atlas", "event_type": "note", "summary": "an old episode"})
    with server.db() as conn:  # past the archive age, and past its expiry, as written long ago
        conn.execute("UPDATE memory_episodic SET timestamp = '2020-01-01T00:00:00.000Z'")
        conn.execute("UPDATE memory_short SET expires_at = '2020-01-01T00:00:00.000Z'")
    before = time.time()
    assert solos_memory.main(["purge", "--db", str(server.db_path)]) == 0
    assert solos_memory.main(["snapshot", "--db", str(server.db_path), "--dir", str(tmp_path / "snaps")]) == 0

    recorded = runs(server)
    assert [(r["job"], r["result"], r["error"]) for r in recorded] == [
        ("purge", "ok", None),
        ("archive", "ok", None),
        ("snapshot", "ok", None),
    ]
    # The expired row may already be gone (the service sweeps expiry each second): 0 or 1 purged.
    assert recorded[0]["rows"] in (0, 1) and recorded[1]["rows"] == 1
    manifest = json.loads(sorted((tmp_path / "snaps").glob("*.json"))[-1].read_text())
    assert recorded[2]["rows"] == sum(manifest["row_counts"].values())
    assert all(r["started_at"] <= r["ended_at"] for r in recorded)

    jobs = server.get("/v1/stats").body["jobs"]
    assert {name: (job["state"], job["problem"]) for name, job in jobs.items()} == {
        "purge": ("ok", False),
        "archive": ("ok", False),
        "snapshot": ("ok", False),
    }
    assert jobs["archive"]["last_run"]["rows"] == 1
    assert jobs["snapshot"]["last_success_at"] == recorded[2]["ended_at"]
    success = metric(server, "solos_memory_job_last_success_timestamp_seconds")
    assert set(success) == {"purge", "archive", "snapshot"}
    assert all(before - 1 <= stamp <= time.time() + 1 for stamp in success.values())
    assert metric(server, "solos_memory_job_problem") == {"purge": 0, "archive": 0, "snapshot": 0}
    page = Dom(server.get("/status").raw.decode())
    assert page.rows("jobs")["archive"][-1] == "ok"
    assert page.rows("jobs")["archive"][1] == "1"  # rows touched


def test_a_failed_run_is_recorded_and_shown_as_a_problem(server, tmp_path, capsys):
    assert solos_memory.main(["snapshot", "--db", str(server.db_path), "--keep", "0"]) == 1
    (run,) = runs(server)
    assert (run["job"], run["result"], run["rows"]) == ("snapshot", "failed", None)
    assert run["error"] == "SnapshotError: keep check failed: --keep must be at least 1, got 0"
    job = server.get("/v1/stats").body["jobs"]["snapshot"]
    assert job["state"] == "failed" and job["problem"] and job["last_success_at"] is None
    assert metric(server, "solos_memory_job_problem")["snapshot"] == 1
    assert metric(server, "solos_memory_job_last_success_timestamp_seconds")["snapshot"] == 0
    page = Dom(server.get("/status").raw.decode())
    assert page.rows("jobs")["snapshot"][-1].startswith("failed")
    assert "snapshot failed: SnapshotError: keep check failed" in page.text_by_id["problems"]


def test_a_job_that_has_not_succeeded_within_its_period_is_a_problem(server):
    day = solos_jobs.JOB_PERIOD_S["purge"]
    with server.db() as conn:
        watched = conn.execute("SELECT value FROM solos_memory_meta WHERE key = 'jobs_watched_since'").fetchone()[0]
        conn.execute(
            "INSERT INTO memory_job_run (job, started_at, ended_at, result, rows) "
            "VALUES ('purge', '2026-01-01T00:00:00.000Z', '2026-01-01T00:00:01.000Z', 'ok', 3)"
        )
    now = solos_jobs.seconds(watched)
    with server.db() as conn:
        fresh = solos_jobs.status(solos_store.SQLITE, conn, now)  # a new database: no run yet, and none due
        late = solos_jobs.status(solos_store.SQLITE, conn, now + day + solos_jobs.GRACE_S + 1)
    assert fresh["snapshot"]["state"] == "waiting" and not fresh["snapshot"]["problem"]
    assert fresh["purge"]["state"] == "overdue"  # its last success is from January
    assert fresh["purge"]["detail"] == "no successful run since 2026-01-01T00:00:01.000Z"
    assert late["snapshot"]["state"] == "overdue" and late["snapshot"]["problem"]
    assert late["snapshot"]["detail"] == f"no successful run since {watched}"
    assert server.get("/v1/stats").body["jobs"]["purge"]["problem"] is True
    assert metric(server, "solos_memory_job_problem") == {"purge": 1, "archive": 0, "snapshot": 0}
    assert metric(server, "solos_memory_job_last_success_timestamp_seconds")["purge"] == solos_jobs.seconds(
        "2026-01-01T00:00:01.000Z"
    )
    page = Dom(server.get("/status").raw.decode())
    assert page.rows("jobs")["purge"][-1].startswith("overdue")


def test_recording_never_changes_the_jobs_outcome(tmp_path, capsys):
    missing = str(tmp_path / "absent.db")
    assert solos_jobs.recorded(missing, "purge", lambda: 4) == 4  # ran, though nothing could be recorded
    assert not Path(missing).exists()  # and no database was created for the record
    line = json.loads(capsys.readouterr().err.splitlines()[0])
    assert (line["event"], line["job"]) == ("job_not_recorded", "purge")

    conn = sqlite3.connect(tmp_path / "solos.db")
    conn.executescript((ROOT / "schema.sql").read_text())
    conn.close()

    def breaks() -> int:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        solos_jobs.recorded(str(tmp_path / "solos.db"), "archive", breaks)
    conn = sqlite3.connect(tmp_path / "solos.db")
    assert conn.execute("SELECT job, result, error FROM memory_job_run").fetchall() == [
        ("archive", "failed", "OSError: disk full")
    ]


def test_old_runs_are_pruned_per_job(tmp_path, monkeypatch):
    monkeypatch.setattr(solos_jobs, "KEPT_RUNS", 3)
    db = tmp_path / "solos.db"
    conn = sqlite3.connect(db)
    conn.executescript((ROOT / "schema.sql").read_text())
    for count in range(5):
        solos_jobs.recorded(str(db), "purge", lambda count=count: count)
    solos_jobs.recorded(str(db), "snapshot", lambda: 0)
    assert conn.execute("SELECT job, rows FROM memory_job_run ORDER BY id").fetchall() == [
        ("purge", 2),
        ("purge", 3),
        ("purge", 4),
        ("snapshot", 0),
    ]


# ---- the units ----


def unit_settings(path: Path) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    return settings


@pytest.mark.parametrize("unit", ["lab-memory.service", "lab-memory-purge.service", "lab-memory-snapshot.service"])
def test_each_unit_reports_its_failure_through_the_alert_template(unit):
    assert unit_settings(UNITS / unit)["OnFailure"] == ["lab-memory-alert@%N.service"]
    assert (UNITS / ALERT_UNIT).exists()


def test_the_service_unit_can_use_up_its_restarts_and_so_report_failing():
    """OnFailure= fires only past the start limit. Starts come RestartSec apart, plus the run: a service that
    fails at once, or a supervisor whose worker cannot start (solos_workers.GIVE_UP_AFTER: about 8 s), must
    still use up StartLimitBurst starts within StartLimitIntervalSec (systemd's 5 in 10 s never is)."""
    settings = unit_settings(UNITS / "lab-memory.service")
    burst = int(settings.get("StartLimitBurst", ["5"])[0])
    interval = float(settings.get("StartLimitIntervalSec", ["10"])[0])
    pause = float(settings["RestartSec"][0])
    assert (burst - 1) * (pause + 10) < interval


def alert(unit: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The template's ExecStart as systemd runs it for `unit` ($$ is a literal $, %i the instance)."""
    (command,) = unit_settings(UNITS / ALERT_UNIT)["ExecStart"]
    argv = shlex.split(command.replace("$$", "$").replace("%i", unit))
    return subprocess.run(argv, env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, timeout=30)


def test_the_alert_goes_to_the_journal_by_default_and_to_the_operators_command_when_set(tmp_path):
    default = alert("lab-memory-purge", {})
    assert default.returncode == 0
    assert default.stdout == "<3>lab-memory-purge failed; its log: journalctl --user -u lab-memory-purge\n"
    sent = tmp_path / "sent"
    configured = alert("lab-memory-snapshot", {"SOLOS_MEMORY_ON_FAILURE": f"echo fleet alert: $1 failed > {sent}"})
    assert configured.returncode == 0 and configured.stdout == ""
    assert sent.read_text() == "fleet alert: lab-memory-snapshot failed\n"
    failing = alert("lab-memory-purge", {"SOLOS_MEMORY_ON_FAILURE": "exit 3"})
    assert failing.returncode == 3  # a reporter that fails shows as a failed alert unit, not as nothing


# ---- a purge that fails on a held lock is recorded once the lock is free ----


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


@pytest.mark.parametrize("command", [["purge"], ["reindex"], ["agents", "list"], ["backfill"], ["qdrant-verify"]])
def test_an_admin_command_on_a_mistyped_path_says_so_and_creates_nothing(tmp_path, capsys, command):
    """A typo in --db was a new empty database and a report of success (purge: 0 rows): exit 1 naming it."""
    missing = tmp_path / "solos.dbb"
    assert solos_memory.main([*command, "--db", str(missing)]) == 1
    assert f"{missing}: no such database" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_agents_add_still_creates_the_database(tmp_path):
    db = tmp_path / "new.db"
    assert solos_memory.main(["agents", "add", "--db", str(db), "atlas"]) == 0
    assert solos_memory.main(["agents", "list", "--db", str(db)]) == 0
