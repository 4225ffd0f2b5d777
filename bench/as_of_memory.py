#!/usr/bin/env python3
"""Peak RSS and wall time of parallel as-of recalls: this tree against another checkout.

    python3 bench/as_of_memory.py [--base DIR] [--rows 5000] [--kb 15.6] [--calls 16] [--k 100]

DIR is another checkout of solos-memory (`git worktree add --detach /tmp/base <commit>`). One SQLite
database is made with this tree's schema: --rows short rows of atlas, each about --kb KB of text holding
"gateway", so `q=gateway` matches every row on both trees (the filter cannot help, only streaming can). Per
tree, a fresh copy of it and a fresh service (keyword only); --calls threads each ask `GET /v1/recall/as_of`
as nova, q=gateway, tiers short, k --k, and retry after a 503 as its Retry-After says, until each has an
answer. Prints per tree: the service's RSS before, its peak RSS (VmHWM) after, the calls' wall time p50/max,
the time until all were answered, how many 503s were retried, the largest answer, and the ratio this/base.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness import ROOT, Client, Process, machine_note, percentiles

AGENTS = "atlas,nova"


def start(tree: Path, db: Path) -> Process:
    argv = [sys.executable, str(tree / "solos_memory.py"), "serve", "--db", str(db), "--port", "0"]
    return Process(argv + ["--no-request-log", "--model-dir", "off", "--register", AGENTS])


def memory_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


def make_database(path: Path, rows: int, kb: float) -> None:
    """The schema from a service of this tree, then the rows written directly (fast, as a fleet script would)."""
    start(ROOT, path).stop()
    filler = "Backups of the gateway ran; disk at 41 percent. "
    text = (filler * (int(kb * 1000) // len(filler) + 1))[: int(kb * 1000)]
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO memory_short (agent, key, value, expires_at) VALUES ('atlas', ?, ?, ?)",
            [(f"log-{n}", f"{n} {text}", "2999-01-01T00:00:00.000Z") for n in range(rows)],
        )


def run(tree: Path, source: Path, calls: int, k: int) -> dict:
    db = source.with_name(f"{tree.name}-{source.name}")
    shutil.copy(source, db)
    with start(tree, db) as service:
        before = memory_kib(service.popen.pid)
        at = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(time.time() + 5))
        walls: list[float] = []
        sizes: list[int] = []
        busy = [0]
        lock = threading.Lock()

        def one() -> None:
            client = Client(service.port, timeout=600)
            started = time.perf_counter()
            query = {"agent": "nova", "as_of": at, "q": "gateway", "tiers": "short", "k": k}
            while True:
                status, headers, body = client.request("GET", "/v1/recall/as_of", query=query)
                if status != 503:
                    break
                with lock:
                    busy[0] += 1
                time.sleep(float(headers.get("Retry-After", "1")))
            with lock:
                walls.append(time.perf_counter() - started)
                sizes.append(len(body) if status == 200 else -status)
            client.close()

        threads = [threading.Thread(target=one) for _ in range(calls)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        total = time.perf_counter() - started
        after = memory_kib(service.popen.pid)
    db.unlink()
    return {
        "rss_before_mib": before["VmRSS"] / 1024,
        "peak_rss_mib": after["VmHWM"] / 1024,
        "wall_p50_s": percentiles(walls)["p50"] * 1e-3 if walls else 0.0,
        "wall_max_s": max(walls),
        "all_answered_s": total,
        "retried_503": busy[0],
        "largest_answer_kb": max(sizes) / 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, help="the other checkout (default: this tree alone)")
    parser.add_argument("--rows", type=int, default=5000, help="short rows (default: %(default)s)")
    parser.add_argument("--kb", type=float, default=15.6, help="KB of text per row (default: %(default)s)")
    parser.add_argument("--calls", type=int, default=16, help="parallel as-of calls (default: %(default)s)")
    parser.add_argument("--k", type=int, default=100, help="k of each call (default: %(default)s)")
    args = parser.parse_args()
    print(machine_note())
    print(f"{args.rows} short rows of {args.kb} KB, {args.calls} parallel as-of calls, q=gateway, k={args.k}")
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "as_of.db"
        make_database(source, args.rows, args.kb)
        trees = ([("base", args.base.resolve())] if args.base else []) + [("this", ROOT)]
        results = {name: run(tree, source, args.calls, args.k) for name, tree in trees}
    print(f"{'':<20}" + "".join(f"{name:>12}" for name in results) + ("   this/base" if args.base else ""))
    for field in next(iter(results.values())):
        values = [results[name][field] for name in results]
        ratio = f"{values[-1] / values[0]:>12.2f}" if args.base and values[0] else ""
        print(f"{field:<20}" + "".join(f"{v:>12.1f}" for v in values) + ratio)
    return 0


if __name__ == "__main__":
    sys.exit(main())
