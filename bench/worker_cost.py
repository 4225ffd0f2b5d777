#!/usr/bin/env python3
"""What each worker of `serve --workers N` costs: start-up time and memory, one process beside N workers.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/worker_cost.py [--workers 1,2] [--rows 5k] [--modes keyword,hybrid]

For each mode and worker count, this tree serves a copy of bench/load.py's
database (LoCoMo turns as long facts; hybrid on the copy whose every row has
a vector): seconds from the command to the `listening` line (every worker
serving), then load.py's warm-up (40 recalls on a connection to each
worker: caches, the vector index, the embedder's first runs), then the
memory of the supervisor and its workers from /proc: RSS (each process's
resident pages, shared ones counted in every process) and PSS (shared pages
split between the processes sharing them: what the service adds to the
host). Asserts nothing.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import gen_db
import load
import locomo_shape
from harness import machine_note, with_vectors
from locomo_data import DEFAULT_DATA


def memory_kib(pid: int) -> list[tuple[int, int]]:
    """(RSS, PSS) in KiB of the process and each of its children, the process first."""
    rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
               if line.startswith("VmRSS:"))  # fmt: skip
    pss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
               if line.startswith("Pss:"))  # fmt: skip
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [(rss, pss)] + [pair for child in children for pair in memory_kib(int(child))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2", help="worker counts; auto is the cores (default: %(default)s)")
    parser.add_argument("--rows", default="5k", help="LoCoMo turns as long facts: 5k or 100k (default: %(default)s)")
    parser.add_argument("--modes", default="keyword,hybrid", help="keyword, hybrid or both (default: %(default)s)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo file (default: %(default)s)")
    args = parser.parse_args()
    source = locomo_shape.ensure_db(gen_db.parse_size(args.rows), args.data)
    paths = load.recall_paths(locomo_shape.questions(args.data, load.QUESTIONS, 7))
    print(f"{machine_note()}\ndata: {source.name}")
    with tempfile.TemporaryDirectory(prefix="solos-worker-cost-") as scratch:
        for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
            db = source if mode == "keyword" else with_vectors(source, budget_s=1800)
            if db is None:
                continue
            for count in args.workers.split(","):
                extra = [] if count == "1" else ["--workers", count]
                copy = Path(scratch) / f"{mode}-{count}.db"
                shutil.copy(db, copy)
                started = time.perf_counter()
                service = load.start(load.ROOT, copy, mode == "hybrid", extra)
                try:
                    up = time.perf_counter() - started
                    load.warm(service.port, paths, mode, load.worker_count(extra))
                    pairs = memory_kib(service.popen.pid)
                finally:
                    service.stop()
                workers = pairs[1:] or pairs  # one process: it is its own worker
                print(
                    f"  {mode:<7} workers {count:>4}: listening after {up:5.2f} s;"
                    f" RSS {sum(r for r, _ in pairs) / 1024:6.1f} MiB, PSS {sum(p for _, p in pairs) / 1024:6.1f} MiB"
                    f" in all; a worker RSS {max(r for r, _ in workers) / 1024:6.1f} MiB,"
                    f" PSS {max(p for _, p in workers) / 1024:6.1f} MiB (the largest)"
                    + (f"; supervisor PSS {pairs[0][1] / 1024:.1f} MiB" if len(pairs) > 1 else ""),
                    flush=True,
                )
    print(machine_note())
    return 0


if __name__ == "__main__":
    sys.exit(main())
