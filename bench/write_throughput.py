#!/usr/bin/env python3
"""Acknowledged writes per second with 16 concurrent REST clients and a foreign writer.

    python3 bench/write_throughput.py [--clients 16] [--seconds 10] [--foreign-ms 10]

The service runs as a subprocess on a fresh database. Each client is a thread
with one kept-alive connection, writing in a loop a mix of long facts (50%),
episodes (30%, half with an idempotency key) and short keys (20%), each with
unique content, and recording every acknowledged write (2xx: tier, id and what
was sent). Meanwhile a separate process, like one of the fleet's other
writers, inserts an episode with its own connection every --foreign-ms ms in a
BEGIN IMMEDIATE transaction.

Afterwards the database is opened directly and every acknowledged write is
checked: the row with that id exists with exactly the content sent (lost = 0),
and no response was a 5xx. Also shown: the foreign writer's achieved rate and
its slowest lock wait, and two floors: the same loop against a trivial
one-write http.server (the HTTP cost alone), and the time of one single-row
commit with the service's pragmas in the same folder (SQLite syncs the WAL on
each commit, so this bounds any one-commit-per-write design: on a disk busy
with other work it, not the service, decides the figure). Target: >= 1,500
acknowledged writes/s, 0 lost, 0 5xx. Exits 1 on a miss.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sqlite3
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness import Client, machine_note, start_floor, start_service, verdict, verify_acked, write_body

TARGET_WRITES_S = 1500
AGENTS = ("atlas", "sol", "hermes", "nova", "orion", "vega", "lyra", "castor", "pollux", "rigel", "deneb")


@dataclass
class Tally:
    acked: list = field(default_factory=list)  # (tier, id, sent body)
    statuses: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)
    latencies: list = field(default_factory=list)

    def count(self, status: int) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1


def run_client(port: int, client_no: int, stop_at: float, tally: Tally, path_override: str | None = None) -> None:
    client = Client(port)
    seq = 0
    while time.perf_counter() < stop_at:
        path, body = write_body(client_no, seq, AGENTS)
        seq += 1
        started = time.perf_counter()
        try:
            status, payload = client.json("POST", path_override or path, body)
        except Exception as error:  # a reset connection is a failure to report, not to hide
            tally.errors.append(f"{type(error).__name__}: {error}")
            continue
        tally.latencies.append(time.perf_counter() - started)
        tally.count(status)
        if 200 <= status < 300 and path_override is None:
            tally.acked.append((path, payload["id"], body))
    client.close()


def foreign_writer(db: str, interval_s: float, stop: multiprocessing.Event, report: multiprocessing.Queue) -> None:
    """One of the fleet's other writers: an INSERT every interval, its own connection."""
    conn = sqlite3.connect(db, isolation_level=None, timeout=10)
    conn.execute("PRAGMA busy_timeout=10000")
    written, worst_wait, failures = [], 0.0, 0
    next_at = time.perf_counter()
    while not stop.is_set():
        started = time.perf_counter()
        try:
            conn.execute("BEGIN IMMEDIATE")
            worst_wait = max(worst_wait, time.perf_counter() - started)
            row_id = conn.execute(
                "INSERT INTO memory_episodic (agent, event_type, summary) VALUES ('deneb', 'cron', ?) RETURNING id",
                (f"foreign write {len(written)}",),
            ).fetchone()[0]
            conn.execute("COMMIT")
            written.append(row_id)
        except sqlite3.Error:
            failures += 1
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        next_at += interval_s
        time.sleep(max(0.0, next_at - time.perf_counter()))
    conn.close()
    report.put({"written": written, "worst_wait_s": worst_wait, "failures": failures})


def commit_floor(folder: Path, commits: int = 200) -> float:
    """Median seconds of one single-row write transaction with the service's pragmas (WAL, synchronous=FULL).

    SQLite syncs the WAL on every commit, so one commit per write caps the service at about 1/this.
    """
    conn = sqlite3.connect(folder / "commit-floor.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=wal")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (x)")
    # Grow the WAL once and checkpoint it, so the timed commits overwrite it as a running service's do
    # (appending to a fresh file also syncs its metadata, which would overstate the floor).
    conn.execute("INSERT INTO t VALUES (zeroblob(4000000))")
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    samples = []
    for n in range(commits):
        started = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t VALUES (?)", (n,))
        conn.execute("COMMIT")
        samples.append(time.perf_counter() - started)
    conn.close()
    return sorted(samples)[len(samples) // 2]


def drive(
    port: int, clients: int, seconds: float, path_override: str | None = None, first_client: int = 0
) -> tuple[Tally, float]:
    """Run `clients` writers for `seconds`; numbered from first_client, which makes their content (a run
    writing twice to one service numbers its second round apart, or its facts are updates, not writes)."""
    tally = Tally()
    stop_at = time.perf_counter() + seconds
    numbers = range(first_client, first_client + clients)
    threads = [threading.Thread(target=run_client, args=(port, n, stop_at, tally, path_override)) for n in numbers]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return tally, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=10, help="how long to write (default: %(default)s)")
    parser.add_argument("--foreign-ms", type=float, default=10, help="foreign writer interval (default: %(default)s)")
    args = parser.parse_args()
    print(machine_note())

    with start_floor("one") as floor:
        floor_tally, floor_elapsed = drive(floor.port, args.clients, min(args.seconds, 3), path_override="/")
    floor_rate = sum(floor_tally.statuses.values()) / floor_elapsed

    with tempfile.TemporaryDirectory(prefix="solos-bench-") as scratch:
        commit_s = commit_floor(Path(scratch))
        db = Path(scratch) / "solos.db"
        with start_service(db, register=",".join(AGENTS)) as service:
            stop, report = multiprocessing.Event(), multiprocessing.Queue()
            foreign = multiprocessing.Process(
                target=foreign_writer, args=(str(db), args.foreign_ms / 1000, stop, report)
            )
            foreign.start()
            time.sleep(0.2)
            tally, elapsed = drive(service.port, args.clients, args.seconds)
            stop.set()
            foreign_result = report.get(timeout=30)
            foreign.join()
        problems = verify_acked(db, tally.acked)
        conn = sqlite3.connect(db)
        foreign_missing = sum(
            1
            for row_id in foreign_result["written"]
            if conn.execute("SELECT 1 FROM memory_episodic WHERE id = ?", (row_id,)).fetchone() is None
        )
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
        conn.close()

    acked = len(tally.acked)
    rate = acked / elapsed
    five_xx = sum(count for status, count in tally.statuses.items() if status >= 500)
    latencies = sorted(tally.latencies)
    p = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000  # noqa: E731
    print(f"clients {args.clients}, {elapsed:.1f} s, foreign writer every {args.foreign_ms:g} ms")
    print(f"  http floor (one-write http.server, POST) {floor_rate:8.0f} requests/s")
    print(
        f"  service acknowledged writes              {rate:8.0f} writes/s  ({acked:,} acked; "
        f"{rate / floor_rate:.2f}x the floor)   target >= {TARGET_WRITES_S}: {verdict(rate >= TARGET_WRITES_S)}"
    )
    print(
        f"  commit floor (1-row txn, WAL, synchronous=FULL) {commit_s * 1000:.3f} ms: "
        f"at most {1 / commit_s:,.0f} commits/s with one commit per write; service at {rate * commit_s:.2f}x of that"
    )
    print(f"  per-write latency ms                     p50 {p(0.5):.2f}  p95 {p(0.95):.2f}  p99 {p(0.99):.2f}")
    print(f"  statuses {dict(sorted(tally.statuses.items()))}  transport errors {len(tally.errors)}")
    print(f"  5xx: {five_xx}   {verdict(five_xx == 0)}")
    print(f"  lost or changed acknowledged writes: {len(problems)}   {verdict(not problems)}")
    for problem in problems[:10]:
        print(f"    {problem}")
    for error in tally.errors[:5]:
        print(f"    transport error: {error}")
    print(
        f"  foreign writer: {len(foreign_result['written'])} inserts "
        f"({len(foreign_result['written']) / elapsed:.0f}/s), "
        f"{foreign_result['failures']} failed, {foreign_missing} missing, slowest lock wait "
        f"{foreign_result['worst_wait_s'] * 1000:.1f} ms"
    )
    print(f"  integrity_check: {integrity}")
    ok = rate >= TARGET_WRITES_S and five_xx == 0 and not problems and not tally.errors and integrity == "ok"
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
