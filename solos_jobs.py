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
A run's end waits out a held write lock (RECORD_RETRY_S), and one whose start
could not be written is recorded whole at its end; a command that fails before
its jobs begin (the store cannot be opened) records them failed (`opened`).

On PostgreSQL each host's timer starts the jobs, and the job runs once per
period across the cluster: a run takes the job's turn (an advisory lock held
for the run) and skips, saying so, while another copy runs it or when a run
succeeded within the period. A run whose copy died leaves its row 'running'
with the turn free: status shows it failed, and the next run does the job.
Standard library only; imports only the store. Its SQL is its own table's.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, overload

import solos_store
from solos_store import (
    JOBS_WATCHED_SINCE as WATCHED_SINCE,  # when this database began expecting the jobs
    stamp as stamp,  # the schema's timestamps (solos_provenance's too)
    stamp_seconds as seconds,  # and back
)

# The units' timers (systemd/*.timer) start every job daily.
JOB_PERIOD_S = {"purge": 86_400, "archive": 86_400, "snapshot": 86_400}
# A daily timer starts up to 15 min late (RandomizedDelaySec) or at boot (Persistent=); a slow night
# is not a missed run.
GRACE_S = 2 * 3600
# On PostgreSQL, a run skips when the job succeeded less than this long ago (on any host). Less than the period
# by the grace: the timers of the next day fire a little earlier or later, and must not skip a whole day.
DONE_FOR_S = {job: period - GRACE_S for job, period in JOB_PERIOD_S.items()}
KEPT_RUNS = 100  # rows kept per job; older ones go as a new run starts
# A run's outcome waits this long for a write lock a fleet writer holds: the likeliest failure is that very
# lock, and an outcome not recorded reads "no run yet, no problem" for a day. The unit is a
# oneshot without a start timeout, so the job's process may wait.
RECORD_RETRY_S = 600
RECORD_BACKOFF_S = (0.1, 5.0)  # first pause between attempts, and the longest
ERROR_CHARS = 500  # a failure's message, cut to this: the journal has the rest

Result = TypeVar("Result")


@overload
def recorded(
    db: str,
    job: str,
    work: Callable[[], Result],
    rows: Callable[[Result], int] | None = None,
    busy_timeout_ms: int = 5000,
) -> Result: ...


@overload
def recorded(
    db: Any,
    job: str,
    work: Callable[[], Result],
    rows: Callable[[Result], int] | None = None,
    busy_timeout_ms: int = 5000,
) -> Result | None: ...


def recorded(
    db: Any,
    job: str,
    work: Callable[[], Result],
    rows: Callable[[Result], int] | None = None,
    busy_timeout_ms: int = 5000,
) -> Result | None:
    """Run work as one recorded run of job and return what it returns; its exception is recorded, then raised.

    Rows touched: `rows(result)`, or the result itself (purge and archive return a row count). A store shared
    by copies (PostgreSQL) runs it in the job's turn, once per period: None, and a line, when it skips.
    """
    if not getattr(db, "shared_by_copies", False):  # one service per SQLite file: each start is a run
        return run(db, job, work, rows, busy_timeout_ms)
    with db.job_lock(job) as turn:
        done = write(db, busy_timeout_ms, job, lambda conn: recent_success(conn, job)) if turn else None
        if not turn or done:
            skipped(job, f"it succeeded at {done}, within its period" if done else "another copy is running it now")
            return None
        return run(db, job, work, rows, busy_timeout_ms)


def run(
    db: Any, job: str, work: Callable[[], Result], rows: Callable[[Result], int] | None, busy_timeout_ms: int
) -> Result:
    """One run: its row, the work, its outcome (waiting out a held lock; the whole row if its start was not
    written)."""
    started = stamp(time.time())
    run_id = write(db, busy_timeout_ms, job, lambda conn: start_run(conn, job))
    try:
        result = work()
    except BaseException as error:
        message = f"{type(error).__name__}: {error}"[:ERROR_CHARS]
        end = lambda conn: end_run(conn, run_id, "failed", None, message, job, started)  # noqa: E731
        write(db, busy_timeout_ms, job, end, retry=True)
        raise
    touched: Any = rows(result) if rows else result
    end = lambda conn: end_run(conn, run_id, "ok", int(touched), None, job, started)  # noqa: E731
    write(db, busy_timeout_ms, job, end, retry=True)
    return result


CREATES = ("import-qdrant",)  # admin commands that may fill a new database; `agents add` registers before
CREATES_HELP = "SQLite database, created from schema.sql if missing (default: %(default)s)"
EXISTING_HELP = "SQLite database; it must exist, a mistyped path is an error (default: %(default)s)"


def opened(db: str, command: str, open_store: Callable[[], Result], busy_timeout_ms: int) -> Result:
    """open_store(), for an admin command: if it fails (a writer holds the lock the migration needs), each job
    the command runs is recorded as a failed run before the error goes on, so stats do not read "no run yet".
    A SQLite file that is not there is an error (FileNotFoundError naming it), not a new empty database that
    the command then reports success on, unless the command is one that fills a new one (CREATES)."""
    if command not in CREATES and not solos_store.is_postgres(db) and not Path(db).exists():
        folder = Path(db).absolute().parent
        where = "a mistyped --db?" if folder.is_dir() else f"its folder {folder} does not exist;"
        raise FileNotFoundError(f"{db}: no such database ({where} `serve` or `agents add` creates one)")
    jobs = ("purge", "archive") if command == "purge" else ()
    try:
        return open_store()
    except Exception as error:
        message = f"{type(error).__name__}: {error}"[:ERROR_CHARS]
        started = stamp(time.time())
        for job in jobs:
            if solos_store.is_postgres(db):  # no store to record in: the line on stderr is all there is
                not_recorded(job, f"the store could not be opened: {message}")
                continue
            failed = lambda conn, job=job: end_run(conn, None, "failed", None, message, job, started)  # noqa: E731
            write(db, busy_timeout_ms, job, failed, retry=True)
        raise


def skipped(job: str, reason: str) -> None:
    """A line on stderr (the journal): the run did nothing, and why."""
    record = {"ts": stamp(time.time()), "event": "job_skipped", "job": job, "reason": reason}
    sys.stderr.write(json.dumps(record) + "\n")


def recent_success(conn: sqlite3.Connection, job: str) -> str | None:
    """When the job last succeeded, if that is within DONE_FOR_S by the database's clock."""
    sql = f"SELECT max(ended_at), {clock(conn)} FROM memory_job_run WHERE job = ? AND result = 'ok'"
    done, now = conn.execute(sql, (job,)).fetchone()
    return done if done and seconds(now) - seconds(done) < DONE_FOR_S.get(job, GRACE_S) else None


def clock(conn: Any) -> str:
    """The database's time in SQL: the one clock every copy over a PostgreSQL database reads alike (a run's end,
    and whether a job succeeded within its period or is overdue, are never one host's clock against another's)."""
    return getattr(conn, "queries", solos_store.SQLITE).NOW


def write(
    db: Any, busy_timeout_ms: int, job: str, work: Callable[[sqlite3.Connection], Any], retry: bool = False
) -> Any:
    """work in one short BEGIN IMMEDIATE on an existing database (or the open PostgreSQL store db names); None
    (and a line on stderr) if it cannot be. With `retry`, a busy database is tried again for RECORD_RETRY_S."""
    deadline, pause = time.monotonic() + RECORD_RETRY_S, RECORD_BACKOFF_S[0]
    while True:
        try:
            return write_once(db, busy_timeout_ms, work)
        except (sqlite3.Error, solos_store.ServiceError) as error:
            busy = isinstance(error, solos_store.Busy) or getattr(error, "sqlite_errorcode", None) in LOCKED
            if not (retry and busy and time.monotonic() + pause < deadline):
                not_recorded(job, str(error), db if isinstance(db, str) else None)
                return None
            time.sleep(pause)
            pause = min(pause * 2, RECORD_BACKOFF_S[1])
        except Exception as error:  # StorageUnavailable and the like from a PostgreSQL store: not waited for
            not_recorded(job, str(error))
            return None


LOCKED = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)  # what a held write lock raises, past the busy timeout


def not_recorded(job: str, reason: str, db: str | None = None) -> None:
    """A line on stderr (the journal): the run's row could not be written, and why."""
    record = {"ts": stamp(time.time()), "event": "job_not_recorded", "job": job, **({"db": db} if db else {})}
    sys.stderr.write(json.dumps({**record, "reason": reason}) + "\n")


def write_once(db: Any, busy_timeout_ms: int, work: Callable[[sqlite3.Connection], Any]) -> Any:
    """One attempt of write: raises what the database raised."""
    if not isinstance(db, str):
        return db.write(work)
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


def start_run(conn: sqlite3.Connection, job: str) -> int:
    """A new run row (result 'running'); the job's oldest rows past KEPT_RUNS are deleted."""
    conn.execute(
        "DELETE FROM memory_job_run WHERE job = ? AND id <= "
        "(SELECT id FROM memory_job_run WHERE job = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
        (job, job, KEPT_RUNS - 1),
    )
    return conn.execute("INSERT INTO memory_job_run (job) VALUES (?) RETURNING id", (job,)).fetchone()[0]


def end_run(
    conn: sqlite3.Connection,
    run_id: int | None,
    result: str,
    rows: int | None,
    error: str | None,
    job: str,
    started: str,
) -> None:
    """A run's outcome; the whole row (from `started`) when its start could not be recorded."""
    if run_id is None:
        conn.execute(
            "INSERT INTO memory_job_run (job, started_at, ended_at, result, rows, error) "
            f"VALUES (?, ?, {clock(conn)}, ?, ?, ?)",
            (job, started, result, rows, error),
        )
        return
    conn.execute(
        f"UPDATE memory_job_run SET ended_at = {clock(conn)}, result = ?, rows = ?, error = ? WHERE id = ?",
        (result, rows, error, run_id),
    )


# ==== What stats, metrics and the page show ====


def status(queries: solos_store.Queries, conn: sqlite3.Connection, now: float | None = None) -> dict[str, dict]:
    """Per job: its period, last run, last success, state (ok, running, waiting, failed, overdue) and problem;
    `queries` are the store's (store.queries), which know whether a run's process still holds its turn."""
    now = seconds(conn.execute(f"SELECT {queries.NOW}").fetchone()[0]) if now is None else now
    since = queries.meta_value(conn, WATCHED_SINCE)
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
        waited_from = success or since
        late = waited_from is not None and now > seconds(waited_from) + period + GRACE_S
        if run and run["result"] == "running" and not queries.job_running(conn, job):
            state, detail = "failed", f"the run started at {run['started_at']} never ended: its process died"
        elif run and run["result"] == "failed":
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
