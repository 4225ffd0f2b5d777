#!/usr/bin/env python3
"""Hybrid recall, phase by phase, on this tree and another checkout, over HTTP, on one database.

    .venv/bin/python bench/recall_phases.py --base DIR [--size 10k] [--queries 300] [--rounds 2] [--seed 7]

Each tree runs in a child process of its own (their modules share names): the service in that process with
the embedder, on a copy of the cached fleet database whose every row has a vector (harness.with_vectors), its
recall's steps timed by wrapping the functions that do them, whichever of them the tree has (a step a tree
lacks prints blank), and the recalls asked over HTTP on a kept-alive connection from the same process, so the
request's own handling (validation, JSON, the socket) is a step too. The trees take turns, `--rounds` times,
each asking the same queries (recall_ab.py's, 20 to warm). Prints mean ms per recall beside each other and the
tree's p50 over HTTP; a step's time includes the steps indented under it. Asserts nothing.

The question's embedding runs on the embedder's own thread, beside the keyword leg: its line is that thread's
time, the recall's is the wait (`waiting for the question's vector`).
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# (label, module, attribute path, depth): the steps of one recall, outermost first. Modules are tried in turn
# (the tree before held recall in the spine).
STEPS = (
    ("HTTP round trip (client)", None, None, 0),
    ("handler: respond (JSON, socket write)", ("solos_memory",), "MemoryHandler.respond", 1),
    ("invoke (validation, binding, counting)", ("solos_memory",), "invoke", 1),
    ("recall operation", ("solos_recall", "solos_memory"), "op_recall_memory", 2),
    ("plan (words, embedding started)", ("solos_recall", "solos_memory"), "plan_recall", 3),
    ("read transaction", ("solos_recall", "solos_memory"), "rank", 3),
    ("gather", ("solos_recall", "solos_memory"), "gather", 4),
    ("keyword leg", ("solos_rank",), "keyword_candidates", 5),
    ("waiting for the question's vector", ("solos_rank", "solos_memory"), "RecallPlan.with_vector", 5),
    ("vector index refresh", ("solos_rank",), "VectorIndex.refresh", 5),
    ("vector index fill (other copies' rows)", ("solos_rank",), "VectorIndex.fill", 5),
    ("vector leg", ("solos_rank",), "vector_candidates", 5),
    ("rows by id (vector-only rows)", ("solos_store",), "Store.rows_by_id", 5),
    ("without_vector count", ("solos_rank",), "VectorIndex.lacking", 5),
    ("fusion", ("solos_rank",), "fuse", 4),
    ("vector seats", ("solos_rank",), "with_vector_seats", 5),
    ("reranker", ("solos_rank",), "rerank", 4),
    ("its features and logits", ("solos_rank",), "head_logits", 5),
    ("judge", ("solos_recall",), "judge_head", 4),
    ("features judge (its features)", ("solos_judge",), "features", 5),
    ("cross-encoder (combine)", ("solos_cross_encoder",), "CrossEncoder.combine", 5),
    ("runner (load wait, watchdog)", ("solos_cross_encoder",), "Runner.logits", 6),
    ("session: tokenize, pad, run", ("solos_cross_encoder",), "Session.logits", 7),
    ("question tokens", ("solos_cross_encoder",), "Session.question", 8),
    ("pairs tokenized", ("solos_cross_encoder",), "Session.pair", 8),
    ("padding", ("solos_cross_encoder",), "padded", 8),
    ("the model run", ("solos_cross_encoder",), "InferenceSession.run", 8),
    ("answer (present)", ("solos_recall", "solos_memory"), "present", 3),
    ("duplicates collapsed", ("solos_rank",), "collapse_duplicates", 4),
    ("audit", ("solos_store",), "Visibility.audit", 4),
    ("witnesses, delivery log", ("solos_provenance",), "witnessed", 4),
    ("delivery log record", ("solos_provenance",), "DeliveryLog.record", 5),
    ("stats", ("solos_telemetry",), "Stats.record_recall", 4),
    ("activity counters", ("solos_status",), "Activity.recalled", 3),
    ("the question's embedding (its own thread)", None, None, 0),
)
GATE_ROWS = 4  # the rows the shipped cross-encoder reads: a cascade would gate on the features judge's best of them
EMBEDDING = "the question's embedding (its own thread)"
TOTAL = "HTTP round trip (client)"


class Timings:
    def __init__(self) -> None:
        self.on = False
        self.spent: dict[str, float] = collections.defaultdict(float)

    def timed(self, label: str, function: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                if self.on:
                    self.spent[label] += time.perf_counter() - started

        run.__wrapped__ = function  # type: ignore[attr-defined]
        return run


def wrap(timings: Timings) -> None:
    import importlib

    for label, modules, path, _ in STEPS:
        if modules is None or path == "InferenceSession.run":
            continue
        for name in modules:
            try:
                owner: Any = importlib.import_module(name)
            except ImportError:
                continue
            *parents, attribute = path.split(".")
            try:
                for part in parents:
                    owner = getattr(owner, part)
                function = getattr(owner, attribute)
            except AttributeError:
                continue
            setattr(owner, attribute, timings.timed(label, function))
            break


def wrap_run(timings: Timings) -> None:
    """The onnxruntime run inside Session.logits: wrap the loaded session's `run` once it exists."""
    try:
        import solos_cross_encoder
    except ImportError:
        return
    original = solos_cross_encoder.Session.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.session.run = timings.timed("the model run", self.session.run)

    solos_cross_encoder.Session.__init__ = init


def worker(tree: Path, db: Path, queries: list[str], caller: str, k: int) -> dict:
    """In the child: the tree's service on db, each query asked over HTTP once to warm (20), then timed."""
    sys.path.insert(0, str(tree))
    import http.client
    from urllib.parse import urlencode

    import solos_memory

    timings = Timings()
    wrap(timings)
    wrap_run(timings)
    if hasattr(solos_memory, "op_recall_memory"):  # the tree before: the operation table holds the function
        solos_memory.OPERATIONS["recall"].__dict__["function"] = solos_memory.op_recall_memory
    else:
        import solos_recall

        solos_memory.OPERATIONS["recall"].__dict__["function"] = solos_recall.op_recall_memory
    config = solos_memory.Config(db=str(db), port=0, model_dir=None, log_requests=False)
    server = solos_memory.build_server(config)
    memory = server.memory
    if memory.embedder is None:
        raise SystemExit(f"{tree}: no embedder ({memory.embedder_error})")
    memory.embedder.embed = timings.timed(EMBEDDING, memory.embedder.embed)
    heads: list[float] = []  # the features judge's highest probability over the cross-encoder's rows, a recall
    judge_module = sys.modules.get("solos_judge")
    if judge_module is not None:
        # What the judge calls: Model.judged (probabilities and features) since the combination reads evidence,
        # Model.probabilities in a tree before it.
        method = "judged" if hasattr(judge_module.Model, "judged") else "probabilities"
        judged = getattr(judge_module.Model, method)

        def kept_heads(self: Any, question: str, rows: Any) -> Any:
            out = judged(self, question, rows)
            found = out[0] if method == "judged" else out
            if timings.on:
                heads.append(max(found[:GATE_ROWS], default=0.0))
            return out

        setattr(judge_module.Model, method, kept_heads)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)

    def ask(q: str) -> dict:
        query = {"agent": caller, "q": q, "tiers": "long,short", "scope": "shared", "k": k}
        conn.request("GET", "/v1/recall?" + urlencode(query))
        response = conn.getresponse()
        body = response.read()
        assert response.status == 200, (response.status, body[:200])
        return json.loads(body)

    for q in queries[:20]:
        ask(q)
    wall, judges = [], collections.Counter()
    for q in queries:
        timings.on = True
        started = time.perf_counter()
        answer = ask(q)
        wall.append(time.perf_counter() - started)
        timings.on = False
        judges[str((answer.get("receipt") or {}).get("judge"))] += 1
        assert answer["ranking"] == "hybrid", answer.get("degraded_reason")
    timings.spent[TOTAL] = sum(wall)
    conn.close()
    server.shutdown()
    server.server_close()
    return {
        "ms": {label: spent / len(queries) * 1000 for label, spent in timings.spent.items()},
        "p50": statistics.median(wall) * 1000,
        "judges": dict(judges),
        "heads": heads,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, help="the other checkout")
    parser.add_argument("--size", default="10k", help="fleet rows (default: %(default)s)")
    parser.add_argument("--queries", type=int, default=300, help="timed recalls per round (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=2, help="turns each tree takes (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=7, help="generator and query seed (default: %(default)s)")
    parser.add_argument("--worker", nargs=2, type=Path, help=argparse.SUPPRESS)  # TREE JOB.json, in the child
    args = parser.parse_args()
    if args.worker:
        tree, job = args.worker
        spec = json.loads(job.read_text())
        out = worker(tree, Path(spec["db"]), spec["queries"], spec["caller"], spec["k"])
        job.with_suffix(".out").write_text(json.dumps(out))
        return 0
    import gen_db
    from harness import ROOT, machine_note, with_vectors
    from recall_latency import CALLER, K, make_queries

    if args.base is None:
        parser.error("--base is required")
    print(machine_note())
    embedded = with_vectors(gen_db.ensure_db(gen_db.parse_size(args.size), args.seed), budget_s=3600)
    if embedded is None:
        return 1
    queries = make_queries(embedded, args.queries, args.seed, "content")
    trees = {"base": args.base.resolve(), "this": ROOT}
    results: dict[str, list[dict]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            for name, tree in trees.items():
                db = Path(folder) / f"{name}-{round_}.db"
                shutil.copy(embedded, db)
                job = Path(folder) / f"{name}-{round_}.json"
                job.write_text(json.dumps({"db": str(db), "queries": queries, "caller": CALLER, "k": K}))
                subprocess.run([sys.executable, __file__, "--worker", str(tree), str(job)], check=True)
                results[name].append(json.loads(job.with_suffix(".out").read_text()))
                db.unlink()
    print(
        f"hybrid recall at {args.size} fleet rows, {args.queries} queries x {args.rounds} rounds a tree, taking turns"
    )
    print(f"base {trees['base']}, this {trees['this']}; mean ms per recall (a step includes those under it)")
    print(f"  {'step':<52} {'base':>7} {'this':>7} {'added':>7}")
    for label, _, _, depth in STEPS:
        b = [r["ms"].get(label) for r in results["base"]]
        t = [r["ms"].get(label) for r in results["this"]]
        mb = statistics.mean(b) if all(x is not None for x in b) else None
        mt = statistics.mean(t) if all(x is not None for x in t) else None
        added = (mt or 0.0) - (mb or 0.0)
        cell = lambda x: f"{x:7.3f}" if x is not None else " " * 7  # noqa: E731
        print(f"  {'  ' * depth}{label:<{52 - 2 * depth}} {cell(mb)} {cell(mt)} {added:+7.3f}")
    for name in trees:
        p50s = ", ".join(f"{r['p50']:.2f}" for r in results[name])
        print(f"  {name} p50 over HTTP per round: {p50s} ms; judge: {results[name][0]['judges']}")
    heads = [h for r in results["this"] for h in r["heads"]]
    if heads:
        shares = ", ".join(
            f"<{lo} or >{hi}: {sum(h < lo or h > hi for h in heads) / len(heads):.3f}"
            for lo, hi in ((0.01, 0.9), (0.03, 0.7), (0.05, 0.7), (0.05, 0.5))
        )
        print(
            f"  this: the features judge's best of the first {GATE_ROWS} rows outside a band"
            f" (a cascade skips): {shares}"
        )
    ratios = [t["p50"] / b["p50"] for b, t in zip(results["base"], results["this"])]
    print("  this/base p50 per round: " + ", ".join(f"{x:.2f}x" for x in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
