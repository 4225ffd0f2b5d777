#!/usr/bin/env python3
"""CPU per recall's SQL when threads of one process run it at once: 1 thread against 2, one setting at a time.

    python3 bench/sqlite_threads.py [--rows 100k] [--threads 1,2] [--seconds 6] [--rounds 2]
                                    [--settings base,memstatus-off,arena1,fetch-many,cache16m]

Why: one service process spent 31 ms of CPU on a keyword recall at 100k
rows with 1 client and 50-52 ms from 4 clients on, where 2 worker
processes kept 31-32 ms at every level (docs/load.md, "What to fix first").
This isolates the recall's SQL from the transport: the statements one
keyword recall runs (captured once per question from the service itself,
through a trace callback, reads only) are replayed by N threads of one
process, each on its own connection, for a fixed time; the figure is the
process's CPU (user + system, getrusage) over the recalls replayed, and each
thread's own (time.thread_time).

Each setting runs in a fresh child process (some act only before the first
connection or at process start), and the settings take turns within each
round, so what else loads the machine loads them alike:

- base: the stdlib sqlite3 as the service opens it.
- memstatus-off: SQLite's memory statistics off before the first connection,
  as `serve` does (solos_sqlite.statistics_off: SQLite then takes no
  process-wide mutex per allocation to count them).
- arena1: MALLOC_ARENA_MAX=1 (one glibc malloc arena for every thread).
- fetch-many: rows fetched with fetchmany(2) rather than fetchall (more
  GIL hand-offs per statement).
- cache16m: PRAGMA cache_size=-16384 on every connection (16 MiB of pages
  rather than SQLite's 2 MiB default).
- pinned: every replaying thread pinned to one core (os.sched_setaffinity
  from the thread), the cure by affinity.

Asserts nothing; prints CPU per recall at each thread count and the ratio
of N threads' to 1 thread's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import gen_db
import load
import locomo_shape
from harness import ROOT, machine_note
from locomo_data import DEFAULT_DATA

SETTINGS = ("base", "memstatus-off", "arena1", "fetch-many", "cache16m", "pinned")


def capture(db: Path, questions: list[str]) -> list[list[str]]:
    """The read statements (expanded SQL) of one keyword recall per question, from the service in this process."""
    sys.path.insert(0, str(ROOT))
    import solos_memory
    import solos_store

    recorded: list[tuple[int, str]] = []
    connect = solos_store.Store.connect

    def traced(self):
        conn = connect(self)
        conn.set_trace_callback(lambda sql: recorded.append((threading.get_ident(), sql)))
        return conn

    solos_store.Store.connect = traced
    config = solos_memory.Config(db=str(db), port=0, log_requests=False, model_dir="off")
    server = solos_memory.build_server(config, [])
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    from harness import Client

    client = Client(server.port)
    recalls = []
    try:
        for path in load.recall_paths(questions):
            client.json("GET", path)  # the first asks log deliveries; the second is the steady state
            recorded.clear()
            status, _ = client.json("GET", path)
            assert status == 200, status
            # the request's thread is the one that ranked; the service's background threads read too
            handler = next(ident for ident, sql in recorded if sql.startswith("WITH m AS MATERIALIZED"))
            reads = [
                sql
                for ident, sql in recorded
                if ident == handler and sql.split(None, 1)[0].upper() in ("SELECT", "WITH", "BEGIN", "COMMIT")
            ]
            recalls.append(reads)
    finally:
        server.shutdown()
        server.server_close()
    return recalls


def memstatus_off() -> None:
    """The service's own switch (solos_sqlite.statistics_off), before this process's first connection."""
    sys.path.insert(0, str(ROOT))
    import solos_sqlite

    done, reason = solos_sqlite.statistics_off()
    if not done:
        raise RuntimeError(f"memory statistics left on: {reason}")


def replay(db: str, recalls: list[list[str]], threads: int, seconds: float, setting: str) -> dict:
    """`threads` threads replay the recalls on a connection each for `seconds`; CPU per recall."""
    if setting == "memstatus-off":
        memstatus_off()
    cores = sorted(os.sched_getaffinity(0))
    conns = []
    for _ in range(threads):
        conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout=5000")
        if setting == "cache16m":
            conn.execute("PRAGMA cache_size=-16384")
        conns.append(conn)
    done = [0] * threads
    thread_cpu = [0.0] * threads
    start = threading.Barrier(threads + 1)
    stop = threading.Event()

    failed: list[BaseException] = []

    def work(n: int) -> None:
        try:
            run(n)
        except BaseException as error:  # the barrier is broken, so the others and the main thread stop too
            failed.append(error)
            start.abort()
            stop.set()
            raise

    def run(n: int) -> None:
        if setting == "pinned":
            os.sched_setaffinity(0, {cores[0]})
        conn = conns[n]
        at = n * 37 % len(recalls)
        for statements in recalls:  # a pass unmeasured: every connection's cache as warm as it gets
            for sql in statements:
                conn.execute(sql).fetchall()
        start.wait(timeout=600)
        cpu_0 = time.thread_time()
        while not stop.is_set():
            for sql in recalls[at % len(recalls)]:
                cursor = conn.execute(sql)
                if setting == "fetch-many":
                    while cursor.fetchmany(2):
                        pass
                else:
                    cursor.fetchall()
            at += 1
            done[n] += 1
        thread_cpu[n] = time.thread_time() - cpu_0

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    start.wait(timeout=600)
    usage_0, wall_0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for worker in workers:
        worker.join()
    usage_1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - wall_0
    if failed:
        raise RuntimeError(f"a replaying thread failed: {failed[0]!r}")
    user = usage_1.ru_utime - usage_0.ru_utime
    system = usage_1.ru_stime - usage_0.ru_stime
    recalls_done = sum(done)
    return {
        "setting": setting,
        "threads": threads,
        "recalls": recalls_done,
        "per_s": recalls_done / wall,
        "cpu_ms": 1000 * (user + system) / max(recalls_done, 1),
        "sys_ms": 1000 * system / max(recalls_done, 1),
        "thread_cpu_ms": 1000 * sum(thread_cpu) / max(recalls_done, 1),
        "cores": (user + system) / wall,
        "voluntary": usage_1.ru_nvcsw - usage_0.ru_nvcsw,
        "involuntary": usage_1.ru_nivcsw - usage_0.ru_nivcsw,
    }


def child(args: argparse.Namespace) -> int:
    recalls = json.loads(Path(args.statements).read_text())
    print(json.dumps(replay(args.db, recalls, args.child_threads, args.seconds, args.child)))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="100k", help="LoCoMo turns as long facts (default: %(default)s)")
    parser.add_argument("--threads", default="1,2,4", help="thread counts (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=6.0, help="per run (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=2, help="every setting and count this often (default: 2)")
    parser.add_argument(
        "--settings", default="base,memstatus-off", help=f"of {','.join(SETTINGS)} (default: %(default)s)"
    )
    parser.add_argument("--questions", type=int, default=50, help="real questions replayed (default: %(default)s)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo file (default: %(default)s)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-threads", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--statements", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    settings = args.settings.split(",")
    unknown = set(settings) - set(SETTINGS)
    if unknown:
        parser.error(f"unknown settings: {', '.join(sorted(unknown))}")
    counts = [int(n) for n in args.threads.split(",")]
    source = locomo_shape.ensure_db(gen_db.parse_size(args.rows), args.data)
    print(machine_note())
    results: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="solos-sqlite-threads-") as folder:
        db = Path(folder) / "threads.db"
        shutil.copy(source, db)
        questions = locomo_shape.questions(args.data, load.QUESTIONS, 7)[: args.questions]
        recalls = capture(db, questions)
        statements = Path(folder) / "statements.json"
        statements.write_text(json.dumps(recalls))
        print(f"{len(recalls)} recalls captured, {sum(map(len, recalls)) / len(recalls):.1f} read statements each")
        for round_no in range(args.rounds):
            for count in counts:
                for setting in settings:
                    env = dict(os.environ)
                    if setting == "arena1":
                        env["MALLOC_ARENA_MAX"] = "1"
                    argv = [sys.executable, __file__, "--child", setting, "--child-threads", str(count)]
                    argv += ["--db", str(db), "--statements", str(statements), "--seconds", str(args.seconds)]
                    ran = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=args.seconds + 600)
                    if ran.returncode:
                        print(ran.stderr[-3000:], file=sys.stderr)
                        return 1
                    found = json.loads(ran.stdout.strip().splitlines()[-1])
                    results.setdefault((setting, count), []).append(found)
                    print(
                        f"round {round_no + 1} {setting:>14} {count} thread(s): {found['cpu_ms']:6.2f} ms CPU a recall "
                        f"({found['sys_ms']:.2f} system; threads' own {found['thread_cpu_ms']:.2f}), "
                        f"{found['per_s']:6.1f} recalls/s on {found['cores']:.2f} cores, "
                        f"context switches {found['voluntary']} voluntary, {found['involuntary']} forced "
                        f"(load {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
    print("\nCPU a recall (ms, mean of rounds), and N threads over 1:")
    for setting in settings:
        means = {c: sum(r["cpu_ms"] for r in results[(setting, c)]) / args.rounds for c in counts}
        line = ", ".join(f"{c}: {means[c]:.2f}" for c in counts)
        ratios = ", ".join(f"{c}/{counts[0]} {means[c] / means[counts[0]]:.2f}x" for c in counts[1:])
        print(f"  {setting:>14}: {line}  {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
