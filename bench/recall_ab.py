#!/usr/bin/env python3
"""Recall latency of this tree against another checkout, in one run, on the same database.

    python3 bench/recall_ab.py --base DIR [--sizes 100k] [--shapes fleet,locomo] [--queries 400] [--seed 7]
    .venv/bin/python bench/recall_ab.py --base DIR --hybrid --sizes 10k --shapes fleet

DIR is another checkout of solos-memory (e.g. `git worktree add /tmp/base main`,
or `git archive <commit> | tar -x -C DIR`). Both services run keyword-only on
copies of one generated database (gen_db.py, cached) and with no Qdrant option;
each query goes to the base, then to this tree, on kept-alive connections,
so whatever else loads the machine loads both alike. Prints p50/p95 per tier
line and the ratio this/base; asserts nothing. Shape `locomo` adds LoCoMo's
turns as long facts and 20 of its real questions (locomo_shape.py), each asked
--queries / 20 times.

--hybrid runs both services with the embedder (their default model dir) on a
copy of the database in which every row has a vector (the service's backfill
command, once, cached beside it: about 200 rows/s, so use it with 10k), and
asks the default tiers' content queries in hybrid mode. It needs the embedder's
packages: run it with .venv/bin/python.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import gen_db
import locomo_shape
from harness import ROOT, Client, Process, machine_note, percentiles, with_vectors
from locomo_data import DEFAULT_DATA
from recall_latency import CALLER, LINES, LOCOMO_QUESTIONS, K, make_queries


def start(tree: Path, db: Path, hybrid: bool = False) -> Process:
    argv = [sys.executable, str(tree / "solos_memory.py"), "serve", "--db", str(db), "--port", "0"]
    return Process(argv + ["--no-request-log"] + ([] if hybrid else ["--model-dir", "off"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the other checkout (no default)")
    parser.add_argument("--sizes", default="100k", help="database sizes (default: %(default)s)")
    parser.add_argument("--shapes", default="fleet,locomo", help="fleet, locomo or both (default: %(default)s)")
    parser.add_argument("--queries", type=int, default=400, help="timed queries per line (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=7, help="generator and query seed (default: %(default)s)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo file (default: %(default)s)")
    parser.add_argument("--hybrid", action="store_true", help="hybrid recall on an embedded copy (default: keyword)")
    args = parser.parse_args()
    print(machine_note())
    for size in (s.strip() for s in args.sizes.split(",") if s.strip()):
        if "fleet" in args.shapes and args.hybrid:
            embedded = with_vectors(gen_db.ensure_db(gen_db.parse_size(size), args.seed), budget_s=3600)
            if embedded is not None:
                queries = make_queries(embedded, args.queries, args.seed, "content")
                line = (f"{'long,short':<14} {'shared':<7} {'content':<8}", CALLER, "long,short", "shared", queries)
                compare(args, f"{size} fleet hybrid", embedded, [line])
        elif "fleet" in args.shapes:
            source = gen_db.ensure_db(gen_db.parse_size(size), args.seed)
            lines = [
                (
                    f"{tiers:<14} {scope:<7} {style:<8}",
                    CALLER,
                    tiers,
                    scope,
                    make_queries(source, args.queries, args.seed, style),
                )
                for tiers, scope, style in LINES
            ]
            compare(args, f"{size} fleet", source, lines)
        if "locomo" in args.shapes and not args.hybrid:
            source = locomo_shape.ensure_db(gen_db.parse_size(size), args.data)
            asked = locomo_shape.questions(args.data, LOCOMO_QUESTIONS, args.seed)
            queries = asked * max(1, args.queries // len(asked))
            compare(
                args,
                f"{size} LoCoMo",
                source,
                [(f"{'LoCoMo questions':<31}", locomo_shape.READER, "long", "shared", queries)],
            )
    return 0


def alternate_recalls(
    clients: dict[str, Client], queries: list[str], tiers: str, scope: str, caller: str = CALLER
) -> dict[str, list]:
    """Each query to every client in turn, after 20 to warm them; seconds per recall, per client. Who goes first
    turns with each query: the one second runs beside the first's work after its answer (delivery log, counters)."""
    samples: dict[str, list[float]] = {name: [] for name in clients}
    rankings: dict[str, set[str]] = {name: set() for name in clients}
    for q in queries[:20]:
        for client in clients.values():
            client.json("GET", "/v1/recall", query={"agent": caller, "q": q, "tiers": tiers, "k": K})
    names = list(clients)
    for i, q in enumerate(queries):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            query = {"agent": caller, "q": q, "tiers": tiers, "scope": scope, "k": K}
            started = time.perf_counter()
            status, answer = clients[name].json("GET", "/v1/recall", query=query)
            samples[name].append(time.perf_counter() - started)
            assert status == 200, (name, status)
            rankings[name].add(answer["ranking"])
    # Every answer ranked alike (hybrid: none degraded to keyword, a cheaper recall timed as hybrid).
    assert len(set().union(*rankings.values())) == 1, rankings
    return samples


def compare(
    args: argparse.Namespace, title: str, source: Path, lines: list[tuple[str, str, str, str, list[str]]]
) -> None:
    """Each line's queries to base and this in turn, on copies of one database."""
    with tempfile.TemporaryDirectory() as folder:
        dbs = {name: Path(folder) / f"{name}.db" for name in ("base", "this")}
        for db in dbs.values():
            shutil.copy(source, db)
        base_tree, hybrid = args.base.resolve(), args.hybrid
        with start(base_tree, dbs["base"], hybrid) as base, start(ROOT, dbs["this"], hybrid) as this:
            clients = {"base": Client(base.port), "this": Client(this.port)}
            print(f"{title}: {source.name}, base {args.base}, this {ROOT}")
            for label, caller, tiers, scope, queries in lines:
                samples = alternate_recalls(clients, queries, tiers, scope, caller)
                b, t = percentiles(samples["base"]), percentiles(samples["this"])
                print(
                    f"  {label} base p50 {b['p50']:6.3f} p95 {b['p95']:6.3f}  "
                    f"this p50 {t['p50']:6.3f} p95 {t['p95']:6.3f}  this/base p50 {t['p50'] / b['p50']:4.2f}x"
                )
            for client in clients.values():
                client.close()


if __name__ == "__main__":
    sys.exit(main())
