#!/usr/bin/env python3
"""Where one keyword recall's time goes, and one write's: per step and per SQL statement, in-process.

    python3 bench/recall_profile.py [--shapes fleet,locomo] [--fleet-size 10k] [--locomo-size 5k] [--queries 300]
    .venv/bin/python bench/recall_profile.py --hybrid [--shapes none]

The service runs in this process (keyword only, no request log) on a copy of
the cached database: fleet data (gen_db.py; queries of 2-3 content words,
default tiers) and LoCoMo-shaped turns (locomo_shape.py; 20 real questions).
Each recall's steps are timed by wrapping the functions that do them, and
every statement by a timing connection (execute plus its fetch), so the
figures add up to the recall; the floor's own statement (the raw FTS5
ranking, what `recall_latency.py` puts in the floor) is timed beside it on a
bare connection. Then serial writes of one long fact each, split the same
way. Prints mean ms per recall (per write), each step's share, and asserts
nothing. Timing wrappers cost a few microseconds a call, so totals run a
little above `recall_latency.py`'s in-process figures.

`--hybrid` adds hybrid recall (the service's default model) on a copy of
the fleet database whose every row has a vector (harness.with_vectors,
cached), with the question's embedding timed on its own thread: it runs
beside the keyword leg, and the recall waits for it.

The HTTP round trip is not here: `recall_latency.py` measures the service
over HTTP against the floor.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gen_db
import locomo_shape
from harness import ROOT, machine_note, with_vectors
from locomo_data import DEFAULT_DATA
from recall_latency import CALLER, K, fts_statements, locomo_floor, make_queries, service_match

sys.path.insert(0, str(ROOT))
import solos_memory  # noqa: E402  (the service, in-process)
import solos_provenance  # noqa: E402
import solos_rank  # noqa: E402
import solos_recall  # noqa: E402
import solos_store  # noqa: E402

# The steps of one recall, outermost first; a step's time includes the steps listed under it.
RECALL_STEPS = (
    ("recall", solos_recall, "op_recall_memory", 0),
    ("plan (validation done)", solos_recall, "plan_recall", 1),
    ("read transaction", solos_recall, "rank", 1),
    ("keyword leg", solos_rank, "keyword_candidates", 2),
    ("BM25 ranking per tier (the floor's work)", solos_store.Store, "ranked_rows", 3),
    ("topic neighbours borrowing scores", solos_rank, "smooth_with_neighbours", 3),
    ("fusion", solos_rank, "fuse", 2),
    ("reranker", solos_rank, "rerank", 2),
    ("its features and logits", solos_rank, "head_logits", 3),
    ("waiting for the question's vector", solos_recall.RecallPlan, "with_vector", 2),
    ("vector index: refresh, other copies' rows", solos_rank.VectorIndex, "fill", 2),
    ("vector leg", solos_rank, "vector_candidates", 2),
    ("answer", solos_recall, "present", 1),
    ("duplicates collapsed", solos_rank, "collapse_duplicates", 2),
    ("corroboration (own read)", solos_provenance, "corroborate", 2),
)


class Fetched:
    """A statement's rows, fetched at once so the fetch is timed with it; the cursor methods recall uses."""

    def __init__(self, cursor: sqlite3.Cursor):
        self.rows = cursor.fetchall()
        self.rowcount, self.lastrowid, self.description = cursor.rowcount, cursor.lastrowid, cursor.description

    def fetchall(self) -> list:
        rows, self.rows = self.rows, []
        return rows

    def fetchone(self) -> Any:
        return self.rows.pop(0) if self.rows else None

    def __iter__(self):
        return iter(self.fetchall())


class Timings:
    """Seconds per label, collected while `on` and on this (the caller's) thread: the service's background
    threads (common words, the delivery log) run statements too, but not in the recall's time."""

    def __init__(self) -> None:
        self.on = False
        self.thread = threading.get_ident()
        self.spent: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)

    def add(self, label: str, seconds: float) -> None:
        if self.on and self.thread in (None, threading.get_ident()):
            self.spent[label] += seconds
            self.calls[label] += 1

    def timed(self, label: str, function: Callable) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.add(label, time.perf_counter() - started)

        return run


STEPS, STATEMENTS, EMBEDDING = Timings(), Timings(), Timings()
EMBEDDING.thread = None  # the question is embedded on the service's query thread, beside the recall


class TimedConnection(solos_store.PooledConnection):
    """The store's connection, each statement timed from execute to its last row."""

    def execute(self, sql: str, *args: Any) -> Any:  # type: ignore[override]
        started = time.perf_counter()
        rows = Fetched(super().execute(sql, *args))
        STATEMENTS.add(" ".join(sql.split()), time.perf_counter() - started)
        return rows


def instrument() -> None:
    """Wrap the recall's steps and the store's connections (this process only)."""
    for label, owner, name, _ in RECALL_STEPS:
        setattr(owner, name, STEPS.timed(label, getattr(owner, name)))
    solos_memory.OPERATIONS["recall"].__dict__["function"] = solos_recall.op_recall_memory  # the wrapped one
    solos_store.PooledConnection = TimedConnection  # Store.connect looks the class up when it opens one


def report(title: str, count: int, floor_s: float | None = None) -> None:
    total = STEPS.spent.get("recall") or STEPS.spent.get("write") or 1e-9
    print(f"\n{title}: {count} calls, mean ms per call (share of the whole)")
    steps = RECALL_STEPS if "recall" in STEPS.spent else (("write", None, None, 0),)
    for label, _, _, depth in steps:
        spent = STEPS.spent.get(label, 0.0)
        if not spent:  # a step this mode does not take (the vector leg in keyword mode)
            continue
        print(f"  {'  ' * depth}{label:<{46 - 2 * depth}} {spent / count * 1000:7.3f}  {spent / total:6.1%}")
    for label, spent in EMBEDDING.spent.items():
        print(f"  {label:<46} {spent / count * 1000:7.3f}  {spent / total:6.1%}")
    if floor_s is not None:
        print(f"  {'the floor statement, bare connection':<46} {floor_s / count * 1000:7.3f}  {floor_s / total:6.1%}")
    print("  statements, most costly first:")
    for sql, spent in sorted(STATEMENTS.spent.items(), key=lambda item: -item[1])[:12]:
        per = STATEMENTS.calls[sql] / count
        print(f"    {spent / count * 1000:7.3f}  {spent / total:6.1%}  x{per:4.2f}  {sql[:96]}")
    sql_total = sum(STATEMENTS.spent.values())
    print(f"    {sql_total / count * 1000:7.3f}  {sql_total / total:6.1%}  all statements")


def reset() -> None:
    for timings in (STEPS, STATEMENTS, EMBEDDING):
        timings.spent.clear()
        timings.calls.clear()


@contextlib.contextmanager
def service_on(source: Path, model_dir: str | None) -> Iterator[tuple[solos_memory.MemoryServer, Path]]:
    """The service, in this process, on a scratch copy of source (so the cached database never changes)."""
    with tempfile.TemporaryDirectory() as scratch:
        db = Path(scratch) / "profile.db"
        shutil.copy(source, db)
        config = solos_memory.Config(db=str(db), port=0, model_dir=model_dir, log_requests=False)
        server = solos_memory.build_server(config)
        try:
            yield server, db
        finally:
            server.server_close()


def profile_recall(
    title: str,
    source: Path,
    caller: str,
    tiers: list[str],
    queries: list[str],
    floor: list[str],
    model_dir: str | None = "off",
) -> None:
    """Recall each query once to warm up, then again timed; `model_dir` None: the embedder (hybrid recall)."""
    with service_on(source, model_dir) as (server, db):
        memory, recall = server.memory, solos_memory.OPERATIONS["recall"]
        if memory.embedder is not None:
            memory.embedder.embed = EMBEDDING.timed("the question's embedding (its own thread)", memory.embedder.embed)
        elif model_dir != "off":
            raise SystemExit(f"no embedder: {memory.embedder_error} (run with .venv/bin/python)")
        bare = sqlite3.connect(db)

        def ask(q: str) -> None:
            args = {"agent": caller, "q": q, "k": K, "tiers": tiers, "scope": "shared"}
            solos_memory.invoke(memory, None, recall, args, {})

        for q in queries[: max(20, len(queries) // 5)]:  # warm: page cache, common words, kept clusters
            ask(q)
        reset()
        floor_s, wall = 0.0, []
        for q in queries:
            STEPS.on = STATEMENTS.on = EMBEDDING.on = True
            started = time.perf_counter()
            ask(q)
            wall.append(time.perf_counter() - started)
            STEPS.on = STATEMENTS.on = EMBEDDING.on = False
            started = time.perf_counter()
            for sql in floor:
                bare.execute(sql, (service_match(q),)).fetchall()
            floor_s += time.perf_counter() - started
        report(f"{title}; p50 {statistics.median(wall) * 1000:.2f} ms", len(queries), floor_s)
        bare.close()


def profile_writes(source: Path, count: int) -> None:
    with service_on(source, "off") as (server, _):
        memory, write = server.memory, solos_memory.OPERATIONS["write_long"]
        reset()
        for number in range(count + 50):
            STEPS.on = STATEMENTS.on = number >= 50
            fact = f"the backup job {number} runs nightly on host{number % 7} at {number % 24}:00"
            started = time.perf_counter()
            solos_memory.invoke(memory, None, write, {"agent": CALLER, "topic": f"t{number % 50}", "fact": fact}, {})
            STEPS.add("write", time.perf_counter() - started)
        STEPS.on = STATEMENTS.on = False
        report("serial long-fact writes (synchronous=FULL: COMMIT is the WAL's fsync)", count)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="fleet,locomo", help="fleet, locomo or both (default: %(default)s)")
    parser.add_argument("--fleet-size", default="10k", help="fleet rows (default: %(default)s)")
    parser.add_argument("--locomo-size", default="5k", help="LoCoMo-shaped rows (default: %(default)s)")
    parser.add_argument("--queries", type=int, default=300, help="timed recalls per shape (default: %(default)s)")
    parser.add_argument("--writes", type=int, default=500, help="timed writes (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=7, help="generator and query seed (default: %(default)s)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo file (default: %(default)s)")
    parser.add_argument(
        "--hybrid", action="store_true", help="also hybrid recall on fleet data, every row embedded (.venv/bin/python)"
    )
    args = parser.parse_args()
    print(machine_note())
    instrument()
    fleet = gen_db.ensure_db(gen_db.parse_size(args.fleet_size), args.seed)
    if "fleet" in args.shapes:
        queries = make_queries(fleet, args.queries, args.seed, "content")
        title = f"fleet {args.fleet_size}, default tiers, content queries"
        profile_recall(title, fleet, CALLER, ["long", "short"], queries, fts_statements("long,short"))
    if args.hybrid:
        embedded = with_vectors(fleet, budget_s=3600)
        if embedded is not None:
            queries = make_queries(embedded, args.queries, args.seed, "content")
            title = f"fleet {args.fleet_size} hybrid, default tiers, content queries"
            profile_recall(title, embedded, CALLER, ["long", "short"], queries, fts_statements("long,short"), None)
    if "locomo" in args.shapes:
        source = locomo_shape.ensure_db(gen_db.parse_size(args.locomo_size), args.data)
        asked = locomo_shape.questions(args.data, 20, args.seed)
        queries = asked * max(1, args.queries // len(asked))
        title = f"LoCoMo-shaped {args.locomo_size}, 20 real questions"
        profile_recall(title, source, locomo_shape.READER, ["long"], queries, locomo_floor())
    profile_writes(fleet, args.writes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
