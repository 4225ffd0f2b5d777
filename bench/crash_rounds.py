#!/usr/bin/env python3
"""Crash safety: kill -9 the service under concurrent writes, restart, find every acknowledged write.

    python3 bench/crash_rounds.py [--rounds 20] [--writers 8] [--seed 7]

One database for all rounds. Each round starts the service as a subprocess
(`solos_memory.py serve --db X --port 0 --register a,b --model-dir off`),
runs concurrent writer threads (one kept-alive connection each, unique
content, every acknowledged write recorded with its id and body), sends
SIGKILL at a random moment mid-load, then, before restarting:

  - PRAGMA integrity_check is "ok" and each FTS5 index passes its own
    'integrity-check' (the index matches its table after recovery);
  - every write acknowledged in this round or any earlier one is present
    with exactly the content acknowledged.

Then the next round restarts the service on the recovered file and checks it
answers /health and a recall. Prints per-round counts and the totals; exits 1
on any loss or corruption. tests/test_faults.py runs a few rounds of the same.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness import Client, machine_note, start_service, verify_acked, write_body

AGENTS = ("a", "b")
FTS_TABLES = ("memory_longterm_fts", "memory_episodic_fts", "memory_short_fts")


@dataclass
class RoundResult:
    acked: int
    in_flight_failures: int
    five_xx: int
    problems: list[str] = field(default_factory=list)
    integrity: str = ""


def check_database(db: Path) -> str:
    """'ok', or what integrity_check / FTS5 integrity-check found."""
    conn = sqlite3.connect(db, isolation_level=None, timeout=10)
    try:
        report = "; ".join(row[0] for row in conn.execute("PRAGMA integrity_check"))
        for fts in FTS_TABLES:
            try:
                conn.execute(f"INSERT INTO {fts} ({fts}) VALUES ('integrity-check')")
            except sqlite3.DatabaseError as error:
                report += f"; {fts}: {error}"
        return report
    finally:
        conn.close()


def crash_round(db: Path, round_no: int, writers: int, kill_after_s: float, acked: list) -> RoundResult:
    """One round: serve, write concurrently, SIGKILL mid-load, check the file and every ack so far."""
    service = start_service(db, register=",".join(AGENTS))
    client = Client(service.port)
    status, health = client.json("GET", "/health")
    assert status == 200, health
    status, body = client.json("GET", "/v1/recall", query={"agent": "a", "q": "gateway pool", "k": 3})
    assert status == 200, body
    client.close()
    lock = threading.Lock()
    stop = threading.Event()
    tally = {"acked": 0, "failed": 0, "5xx": 0}

    def writer(no: int) -> None:
        conn = Client(service.port, timeout=10)
        seq = 0
        while not stop.is_set():
            path, payload = write_body(round_no * 1000 + no, seq, AGENTS)
            seq += 1
            try:
                status, reply = conn.json("POST", path, payload)
            except Exception:  # the kill: the connection drops mid-request; not acknowledged
                with lock:
                    tally["failed"] += 1
                if service.popen.poll() is not None:
                    break
                continue
            with lock:
                if 200 <= status < 300:
                    acked.append((path, reply["id"], payload))
                    tally["acked"] += 1
                elif status >= 500:
                    tally["5xx"] += 1
        conn.close()

    threads = [threading.Thread(target=writer, args=(n,), daemon=True) for n in range(writers)]
    for thread in threads:
        thread.start()
    time.sleep(kill_after_s)
    service.kill()
    stop.set()
    for thread in threads:
        thread.join(timeout=15)
    result = RoundResult(tally["acked"], tally["failed"], tally["5xx"])
    result.integrity = check_database(db)
    result.problems = verify_acked(db, acked)
    return result


def run_rounds(
    db: Path, rounds: int, writers: int, seed: int, load_s: tuple[float, float] = (0.3, 1.2), log=print
) -> tuple[list[RoundResult], list]:
    rng = random.Random(seed)
    acked: list = []
    results = []
    for round_no in range(rounds):
        result = crash_round(db, round_no, writers, rng.uniform(*load_s), acked)
        results.append(result)
        log(
            f"round {round_no + 1:2d}: {result.acked:5d} acked this round, {len(acked):6d} in total, "
            f"{result.in_flight_failures} unacknowledged (cut by the kill), 5xx {result.five_xx}, "
            f"lost {len(result.problems)}, integrity {result.integrity}"
        )
        if result.problems or result.integrity != "ok":
            break
    return results, acked


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="crash rounds (default: %(default)s)")
    parser.add_argument("--writers", type=int, default=8, help="concurrent writer threads (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=7, help="seed for the kill moments (default: %(default)s)")
    args = parser.parse_args()
    print(machine_note())
    with tempfile.TemporaryDirectory(prefix="solos-crash-") as scratch:
        db = Path(scratch) / "solos.db"
        results, acked = run_rounds(db, args.rounds, args.writers, args.seed)
        problems = [p for r in results for p in r.problems]
        corrupt = [r.integrity for r in results if r.integrity != "ok"]
        five_xx = sum(r.five_xx for r in results)
        print(
            f"\n{len(results)} rounds, {len(acked):,} acknowledged writes: lost {len(problems)}, "
            f"integrity failures {len(corrupt)}, 5xx {five_xx}"
        )
        for problem in (problems + corrupt)[:10]:
            print(f"  {problem}")
        ok = len(results) == args.rounds and not problems and not corrupt and not five_xx
        print("crash safety: " + ("PASS" if ok else "FAIL"))
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
