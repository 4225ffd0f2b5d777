"""The daily jobs (purge, archive, snapshot): each run recorded in the database, and which jobs are overdue.

A systemd timer starts each job; a failed run turns its unit "failed" and the
unit's OnFailure= reports it. Neither notices a timer that never fires, so each
run is also a row of memory_job_run (start, end, result, rows touched), and
/v1/stats, /metrics and the status page say per job when it last succeeded. A
job without a success within its period (plus a grace) is a problem, and so is
one whose last run failed.

    rows = solos_jobs.recorded(db, "purge", store.purge_expired)   # one call wraps a run

Recording never changes a job's outcome: a run that cannot be recorded (the
database is gone, or older than this table) still runs, and says so on stderr.
Standard library only; imports only the store. Its SQL is its own table's.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from solos_store import JOBS_WATCHED_SINCE as WATCHED_SINCE  # when this database began expecting the jobs

# The units' timers (systemd/*.timer) start every job daily.
JOB_PERIOD_S = {"purge": 86_400, "archive": 86_400, "snapshot": 86_400}
# A daily timer starts up to 15 min late (RandomizedDelaySec) or at boot (Persistent=); a slow night
# is not a missed run.
GRACE_S = 2 * 3600
KEPT_RUNS = 100  # rows kept per job; older ones go as a new run starts
ERROR_CHARS = 500  # a failure's message, cut to this: the journal has the rest

Result = TypeVar("Result")


def recorded(
    db: Any,
    job: str,
    work: Callable[[], Result],
    rows: Callable[[Result], int] | None = None,
    busy_timeout_ms: int = 5000,
) -> Result:
    """Run work as one recorded run of job and return what it returns; its exception is recorded, then raised.

    Rows touched: `rows(result)`, or the result itself (purge and archive return a row count).
    """
    run_id = write(db, busy_timeout_ms, job, lambda conn: start_run(conn, job))
    try:
        result = work()
    except BaseException as error:
        message = f"{type(error).__name__}: {error}"[:ERROR_CHARS]
        write(db, busy_timeout_ms, job, lambda conn: end_run(conn, run_id, "failed", None, message))
        raise
    touched: Any = rows(result) if rows else result
    write(db, busy_timeout_ms, job, lambda conn: end_run(conn, run_id, "ok", int(touched), None))
    return result


def write(db: Any, busy_timeout_ms: int, job: str, work: Callable[[sqlite3.Connection], Any]) -> Any:
    """work in one short BEGIN IMMEDIATE on an existing database (or the open PostgreSQL store db names); None
    (and a line on stderr) if it cannot be."""
    if not isinstance(db, str):
        try:
            return db.write(work)
        except Exception as error:  # StorageUnavailable, Busy: the run goes unrecorded, and says so
            record = {"ts": stamp(time.time()), "event": "job_not_recorded", "job": job, "reason": str(error)}
            sys.stderr.write(json.dumps(record) + "\n")
            return None
    try:
        # mode=rw: recording never creates a database where the job found none.
        conn = sqlite3.connect(f"{Path(db).absolute().as_uri()}?mode=rw", uri=True, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            conn.execute("BEGIN IMMEDIATE")
            result = work(conn)
            conn.execute("COMMIT")
            return result
        finally:
            conn.close()
    except sqlite3.Error as error:
        record = {"ts": stamp(time.time()), "event": "job_not_recorded", "job": job, "db": db, "reason": str(error)}
        sys.stderr.write(json.dumps(record) + "\n")
        return None


def start_run(conn: sqlite3.Connection, job: str) -> int:
    """A new run row (result 'running'); the job's oldest rows past KEPT_RUNS are deleted."""
    conn.execute(
        "DELETE FROM memory_job_run WHERE job = ? AND id <= "
        "(SELECT id FROM memory_job_run WHERE job = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
        (job, job, KEPT_RUNS - 1),
    )
    return conn.execute("INSERT INTO memory_job_run (job) VALUES (?) RETURNING id", (job,)).fetchone()[0]


def end_run(conn: sqlite3.Connection, run_id: int | None, result: str, rows: int | None, error: str | None) -> None:
    if run_id is None:  # its start could not be recorded
        return
    conn.execute(
        "UPDATE memory_job_run SET ended_at = ?, result = ?, rows = ?, error = ? WHERE id = ?",
        (stamp(time.time()), result, rows, error, run_id),
    )


# ==== What stats, metrics and the page show ====


def status(conn: sqlite3.Connection, now: float | None = None) -> dict[str, dict]:
    """Per job: its period, last run, last success, state (ok, running, waiting, failed, overdue) and problem."""
    now = time.time() if now is None else now
    since = conn.execute("SELECT value FROM solos_memory_meta WHERE key = ?", (WATCHED_SINCE,)).fetchone()
    answer = {}
    for job, period in JOB_PERIOD_S.items():
        columns = "started_at, ended_at, result, rows, error"
        last = conn.execute(
            f"SELECT {columns} FROM memory_job_run WHERE job = ? ORDER BY id DESC LIMIT 1", (job,)
        ).fetchone()
        success = conn.execute(
            "SELECT max(ended_at) FROM memory_job_run WHERE job = ? AND result = 'ok'", (job,)
        ).fetchone()[0]
        run = dict(zip(columns.split(", "), last)) if last else None
        waited_from = success or (since[0] if since else None)
        late = waited_from is not None and now > seconds(waited_from) + period + GRACE_S
        if run and run["result"] == "failed":
            state, detail = "failed", run["error"] or "no message"
        elif late:
            state, detail = "overdue", f"no successful run since {waited_from}"
        elif run is None:
            state, detail = "waiting", "no run yet"
        else:
            state, detail = ("running", "a run is under way") if run["result"] == "running" else ("ok", "")
        answer[job] = {
            "period_s": period,
            "last_run": run,
            "last_success_at": success,
            "state": state,
            "problem": state in ("failed", "overdue"),
            "detail": detail,
        }
    return answer


def metrics_lines(jobs: dict[str, dict]) -> list[str]:
    """Prometheus lines: each job's last success as a Unix time (0: never) and whether it is a problem."""
    lines = [
        "# HELP solos_memory_job_last_success_timestamp_seconds When each job last succeeded (Unix time; 0: never).",
        "# TYPE solos_memory_job_last_success_timestamp_seconds gauge",
    ]
    for job, state in jobs.items():
        success = seconds(state["last_success_at"]) if state["last_success_at"] else 0
        lines.append(f'solos_memory_job_last_success_timestamp_seconds{{job="{job}"}} {success:.3f}')
    lines.extend(
        [
            "# HELP solos_memory_job_problem 1 while a job's last run failed or it did not succeed within its period.",
            "# TYPE solos_memory_job_problem gauge",
        ]
    )
    lines.extend(f'solos_memory_job_problem{{job="{job}"}} {int(state["problem"])}' for job, state in jobs.items())
    return lines


def seconds(timestamp: str) -> float:
    """A schema timestamp ('2026-11-30T06:00:00.000Z') as a Unix time."""
    return datetime.fromisoformat(timestamp).timestamp()


def stamp(unix: float) -> str:
    """A Unix time as the schema's timestamps read (UTC, milliseconds, 'Z')."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(unix)) + f".{int(unix % 1 * 1000):03d}Z"
