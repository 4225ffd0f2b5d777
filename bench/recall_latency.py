#!/usr/bin/env python3
"""Recall latency over REST against its floor, at 10k, 100k and 1M rows.

    python3 bench/recall_latency.py [--sizes 10k,100k,1m] [--shapes fleet,locomo] [--queries 400] [--no-worst]

For each size (N episodic rows + N/10 long facts, see gen_db.py; generated and
cached on first use, 1M takes a minute or two) the service runs as a
subprocess on a copy of the database, keyword-only (`--model-dir off`), and
one kept-alive http.client connection sends the queries. Measured in the same
run, on the same machine and database:

  http floor   a trivial http.server answering a GET in one write, kept alive
  fts floor    the raw FTS5 query per tier (MATCH + bm25 ORDER BY + LIMIT, the
               service's own MATCH string, weights and depth) on a direct
               sqlite3 connection, no join, no JSON
  floor        http floor + fts floor of the same query (every word asked: the
               service leaves out words in half a tier's rows or more, which
               the generated fleet data has none of)
  own SQL      (main line) every statement the recall runs (its transaction, the
               joins, scope filters, topic neighbours, the reranker's reads),
               traced from the same recall in-process and replayed on a bare
               connection: what recall's features cost in SQL before any Python

Service, FTS5 and HTTP floor run back to back for each query, so whatever
else loads the machine loads all three alike.

Queries are 2-3 content words taken from random rows (what an agent's LLM
sends); a second line uses the same words in a question with function words
("what happened with the ..."), which every row matches. Lines:

  long,short          the default tiers
  long,episodic       scope shared; foreign episodes from the three sharing
                      agents are audited, so some recalls also write
  long,episodic own   the caller's rows only: the same search without the audit write

The learned reranker's cost is its own line per size (and for hybrid): the
same content queries, interleaved, on two services over one database, with
--rerank on and off (reranking costs `reranked p50 - off p50`).

LoCoMo-shaped (`--shapes`, both by default; `--data` names the file): the
size's count of LoCoMo turns as long facts, repeated with a "(copy N)" suffix
past the file's 2,760 (locomo_shape.py), and 20 real questions, each asked
--queries / 20 times, against the chat floor: the http floor plus plain
FTS5 BM25 (default weights) top 5 of the question's non-stop words. Then
serial acknowledged writes (POST /v1/long, one kept-alive connection).

    python3 bench/recall_latency.py --curve docs --sizes 1k,10k,100k

writes the cost curve instead (cost_curve.py): per size, both shapes' recall
p50/p99 beside the floor and write p50, printed, as the table in
docs/cost-curve.md and the chart docs/cost-curve.png (and .svg; the figures in .json).

Hybrid is measured when the service, started with its default model dir,
reports degraded:false; otherwise it prints "n/a (degraded)". The embedder
needs fastembed, so run it with .venv/bin/python, and --backfill to embed the
rows first (about 200 rows/s: use it with --sizes 10k).
Targets: keyword p50 <= 1.5x floor, p99 < 10 ms at 1m (100k long +
1M episodic), p50 growth 10k -> 1m <= 3x. The 30-word vocabulary worst case
is a separate line. Exits 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from threading import get_ident

import cost_curve
import gen_db
import locomo_shape
from harness import ROOT, Client, machine_note, percentiles, start_floor, start_service, verdict
from locomo_data import DEFAULT_DATA

sys.path.insert(0, str(ROOT))
import solos_memory  # noqa: E402
import solos_rank  # noqa: E402

TARGET_RATIO = 1.5
TARGET_P99_MS = 10.0
TARGET_GROWTH = 3.0
CALLER = "atlas"  # writes its share; not one of the sharing agents
K = 5
LOCOMO_TARGET_RATIO = 2.0  # at most, chat-shaped text against its own floor
HYBRID_TARGET_RATIO = 3.0  # at most, at 10k rows, against the same floor as keyword
LOCOMO_QUESTIONS = 20  # 20 real questions, each asked --queries / 20 times
LINES = (
    ("long,short", "shared", "content"),
    ("long,short", "shared", "question"),
    ("long,episodic", "shared", "content"),
    ("long,episodic", "own", "content"),
)
WORD = re.compile(r"[a-z]{3,}")


def make_queries(db: Path, count: int, seed: int, style: str) -> list[str]:
    """Content-word queries from random long facts and episode summaries; or the same words as questions."""
    rng = random.Random(seed)
    conn = sqlite3.connect(db)
    stop = set(gen_db.FUNCTION_WORDS)
    top_long = conn.execute("SELECT max(id) FROM memory_longterm").fetchone()[0]
    top_episodic = conn.execute("SELECT max(id) FROM memory_episodic").fetchone()[0]
    queries = []
    while len(queries) < count:
        if rng.random() < 0.5:
            row = conn.execute("SELECT fact FROM memory_longterm WHERE id = ?", (rng.randint(1, top_long),)).fetchone()
        else:
            row = conn.execute(
                "SELECT summary FROM memory_episodic WHERE id = ?", (rng.randint(1, top_episodic),)
            ).fetchone()
        if row is None:
            continue
        words = [w for w in dict.fromkeys(WORD.findall(row[0].lower())) if w not in stop]
        if len(words) < 2:
            continue
        picked = rng.sample(words, min(len(words), rng.choice((2, 2, 3))))
        if style == "question":
            queries.append(f"what happened with the {' '.join(picked[:-1])} after the {picked[-1]}?")
        else:
            queries.append(" ".join(picked))
    conn.close()
    return queries


def service_match(text: str) -> str | None:
    """The FTS5 MATCH string the service builds for q."""
    return solos_rank.make_fts_query(solos_rank.query_words(text))


def fts_statements(tiers: str) -> list[str]:
    """The bare FTS5 ranking the service's recall rests on, one statement per tier, at the service's depth."""
    depth = max(solos_rank.CANDIDATE_DEPTH, K * 4 + 20)
    statements = []
    for name in tiers.split(","):
        fts, weights = solos_memory.TIER_TABLE[name].fts, solos_memory.TIER_TABLE[name].bm25_weights
        statements.append(
            f"SELECT rowid, bm25({fts}, {weights}) FROM {fts} WHERE {fts} MATCH ? "
            f"ORDER BY bm25({fts}, {weights}) LIMIT {depth}"
        )
    return statements


def recall_statements(db: Path, queries: list[str], tiers: str, scope: str) -> list[list[str]]:
    """Every SQL statement one recall runs, per query, parameters inlined: the recall run in this process, traced."""
    config = solos_memory.Config(db=str(db), port=0, model_dir="off", log_requests=False)
    server = solos_memory.build_server(config)
    store, statements, caller = server.memory.store, [], get_ident()
    checkout = store.checkout

    def traced() -> sqlite3.Connection:
        conn = checkout()
        # Not FTS5's own statements, nor those of the service's background threads (its common-word checks).
        conn.set_trace_callback(lambda sql: sql.startswith("--") or get_ident() != caller or statements[-1].append(sql))
        return conn

    store.checkout = traced  # type: ignore[method-assign]
    try:
        for q in queries:
            statements.append([])
            args = {"agent": CALLER, "q": q, "k": K, "tiers": tiers.split(","), "scope": scope}
            solos_memory.invoke(server.memory, None, solos_memory.OPERATIONS["recall"], args, {})
    finally:
        server.server_close()
        store.close()
    return statements


def time_statements(db: Path, per_query: list[list[str]], warmup: int) -> list[float]:
    """Each recall's statements replayed back to back on a bare connection (rows fetched, nothing built of them)."""
    conn = sqlite3.connect(db, isolation_level=None)
    timings = []
    for i, statements in enumerate(per_query):
        started = time.perf_counter()
        for sql in statements:
            conn.execute(sql).fetchall()
        if i >= warmup:
            timings.append(time.perf_counter() - started)
    conn.close()
    return timings


def time_line(
    service_port: int,
    floor_port: int,
    db: Path,
    queries: list[str],
    tiers: str,
    scope: str,
    warmup: int,
    caller: str = CALLER,
    statements: list[str] | None = None,
) -> tuple[list[float], list[float], list[float], dict]:
    """Per query, back to back: the service's recall, the raw FTS5 queries, an empty-handler round trip.

    Interleaved, so load from anything else on the machine hits service and floor alike. `statements`:
    the FTS5 floor (default: the service's own ranking per tier, fts_statements).
    """
    client, floor = Client(service_port), Client(floor_port)
    conn = sqlite3.connect(db, isolation_level=None)
    statements = statements or fts_statements(tiers)
    service, fts, http = [], [], []
    last: dict = {}
    for i, q in enumerate(queries[:warmup] + queries):
        started = time.perf_counter()
        status, body = client.json(
            "GET", "/v1/recall", query={"agent": caller, "q": q, "k": K, "tiers": tiers, "scope": scope}
        )
        service_s = time.perf_counter() - started
        if status != 200:
            raise RuntimeError(f"recall answered {status}: {body}")
        match = service_match(q)
        started = time.perf_counter()
        for sql in statements:
            conn.execute(sql, (match,)).fetchall()
        fts_s = time.perf_counter() - started
        started = time.perf_counter()
        floor.request("GET", "/v1/recall?agent=atlas&q=x")
        http_s = time.perf_counter() - started
        if i >= warmup:
            service.append(service_s)
            fts.append(fts_s)
            http.append(http_s)
            last = body
    client.close()
    floor.close()
    conn.close()
    return service, fts, http, last


def row(label: str, stats: dict) -> str:
    figures = "  ".join(f"{name} {stats[name]:7.3f}" for name in ("p50", "p95", "p99", "max"))
    return f"  {label:<34} {figures} ms"


def measure_size(label: str, db_source: Path, args: argparse.Namespace, floor_port: int, hybrid: bool) -> dict:
    """All lines at one size; returns {line: (service stats, floor stats)}."""
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="solos-bench-") as scratch:
        db = Path(scratch) / "solos.db"
        shutil.copyfile(db_source, db)
        conn = sqlite3.connect(db)
        long_rows, episodic_rows = (
            conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("memory_longterm", "memory_episodic")
        )
        conn.close()
        print(f"\n== {label}: {long_rows:,} long + {episodic_rows:,} episodic rows ({db_source.name}) ==")
        with start_service(db) as service:
            for tiers, scope, style in LINES:
                queries = make_queries(db, args.queries + args.warmup, args.seed, style)
                samples, fts, http, last = time_line(service.port, floor_port, db, queries, tiers, scope, args.warmup)
                floor = [a + b for a, b in zip(http, fts)]
                name = f"{tiers} {style}" + ("" if scope == "shared" else f" {scope}")
                print(row(f"http floor (empty handler) [{name}]", percentiles(http)))
                service_stats, fts_stats, floor_stats = percentiles(samples), percentiles(fts), percentiles(floor)
                print(row(f"fts floor [{name}]", fts_stats))
                print(row(f"floor = http + fts [{name}]", floor_stats))
                print(
                    row(f"service keyword [{name}]", service_stats)
                    + f"  ratio p50 {service_stats['p50'] / floor_stats['p50']:.2f}x"
                    + f" p99 {service_stats['p99'] / floor_stats['p99']:.2f}x"
                )
                results[name] = (service_stats, floor_stats, fts_stats)
                if (tiers, scope, style) == LINES[0]:  # what the features themselves cost in SQL, beside the floor
                    sql = time_statements(db, recall_statements(db, queries, tiers, scope), args.warmup)
                    own = [a + b for a, b in zip(http, sql)]
                    print(row(f"recall's own SQL, replayed [{name}]", percentiles(sql)))
                    own_stats = percentiles(own)
                    print(
                        row(f"http floor + recall's own SQL [{name}]", own_stats)
                        + f"  ratio to floor p50 {own_stats['p50'] / floor_stats['p50']:.2f}x;"
                        + f" service / this p50 {service_stats['p50'] / own_stats['p50']:.2f}x"
                    )
        rerank_cost(db, args, "off")
        if hybrid:
            results["hybrid"] = measure_hybrid(db, args)
    return results


def locomo_floor() -> list[str]:
    """The floor for chat text: plain FTS5 BM25 (default weights) top 5 of the question's non-stop words."""
    fts = solos_memory.TIER_TABLE["long"].fts
    return [f"SELECT rowid, bm25({fts}) FROM {fts} WHERE {fts} MATCH ? ORDER BY bm25({fts}) LIMIT {K}"]


def measure_locomo(label: str, args: argparse.Namespace, floor_port: int) -> tuple[dict, dict, dict]:
    """Real LoCoMo questions over LoCoMo turns stored as long facts (locomo_shape.py), against the floor."""
    source = locomo_shape.ensure_db(gen_db.parse_size(label), args.data)
    asked = locomo_shape.questions(args.data, LOCOMO_QUESTIONS, args.seed)
    queries = asked * max(1, args.queries // len(asked))
    with tempfile.TemporaryDirectory(prefix="solos-bench-") as scratch:
        db = Path(scratch) / "solos.db"
        shutil.copyfile(source, db)
        print(f"\n== {label} LoCoMo-shaped: {gen_db.parse_size(label):,} long facts, {len(asked)} questions ==")
        with start_service(db) as service:
            samples, fts, http, _ = time_line(
                service.port, floor_port, db, queries, "long", "shared", len(asked), locomo_shape.READER, locomo_floor()
            )
            writes = write_latency(service.port, locomo_shape.READER, args.writes)
    service_stats, fts_stats = percentiles(samples), percentiles(fts)
    floor_stats = percentiles([a + b for a, b in zip(http, fts)])
    print(row("fts floor [LoCoMo questions]", fts_stats))
    print(row("floor = http + fts [LoCoMo questions]", floor_stats))
    print(
        row("service keyword [LoCoMo questions]", service_stats)
        + f"  ratio p50 {service_stats['p50'] / floor_stats['p50']:.2f}x"
        + f" p99 {service_stats['p99'] / floor_stats['p99']:.2f}x"
    )
    print(row("serial write (POST /v1/long) [LoCoMo]", writes))
    return service_stats, floor_stats, writes


def write_latency(port: int, agent: str, count: int) -> dict:
    """Acknowledged long-fact writes, one after another on one kept-alive connection."""
    client, samples = Client(port), []
    for n in range(count):
        body = {
            "agent": agent,
            "topic": "bench writes",
            "fact": f"Bench write {n}: the cost curve's probe {time.time()}",
        }
        started = time.perf_counter()
        status, answer = client.json("POST", "/v1/long", body)
        samples.append(time.perf_counter() - started)
        if status not in (200, 201):
            raise RuntimeError(f"write answered {status}: {answer}")
    client.close()
    return percentiles(samples)


def measure_curve_point(label: str, args: argparse.Namespace, floor_port: int) -> dict:
    """One size of the cost curve: the fleet's default-tier line and its own-scope line, LoCoMo, writes."""
    point = {}
    source = gen_db.ensure_db(gen_db.parse_size(label), args.seed)
    with tempfile.TemporaryDirectory(prefix="solos-bench-") as scratch:
        db = Path(scratch) / "solos.db"
        shutil.copyfile(source, db)
        conn = sqlite3.connect(db)
        rows = sum(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in cost_curve.FLEET_TABLES)
        conn.close()
        print(f"\n== {label} fleet: {rows:,} rows ({source.name}) ==")
        with start_service(db) as service:
            for tiers, scope, style in (LINES[0], LINES[3]):
                queries = make_queries(db, args.queries + args.warmup, args.seed, style)
                samples, fts, http, _ = time_line(service.port, floor_port, db, queries, tiers, scope, args.warmup)
                floor, stats = percentiles([a + b for a, b in zip(http, fts)]), percentiles(samples)
                name = f"fleet {tiers}" + ("" if scope == "shared" else f" {scope}")
                print(row(f"floor [{name}]", floor))
                print(row(f"service keyword [{name}]", stats) + f"  ratio p50 {stats['p50'] / floor['p50']:.2f}x")
                point[name] = {"rows": rows, "recall": stats, "floor": floor}
            writes = write_latency(service.port, CALLER, args.writes)
            print(row("serial write (POST /v1/long) [fleet]", writes))
            point["fleet writes"] = {"rows": rows, "write": writes}
    recall, floor, writes = measure_locomo(label, args, floor_port)
    rows = gen_db.parse_size(label)
    point["LoCoMo long"] = {"rows": rows, "recall": recall, "floor": floor}
    point["LoCoMo writes"] = {"rows": rows, "write": writes}
    return point


def measure_hybrid(db: Path, args: argparse.Namespace) -> dict | None:
    """Hybrid recall, if the service with its default model dir is not degraded.

    The embedder needs fastembed: run the bench with .venv/bin/python for this line. Rows
    get vectors in the background (about 200 texts/s), so the line says how many have one.
    """
    if args.backfill:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, str(ROOT / "solos_memory.py"), "backfill", "--db", str(db)],
            capture_output=True,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        print(f"  backfill: exit {done.returncode} in {time.monotonic() - started:.0f} s")
    with start_service(db, model_dir="") as service:
        client = Client(service.port)
        _, health = client.json("GET", "/health")
        if health.get("degraded", True):
            print(f"  {'service hybrid':<34} n/a (degraded: {health.get('degraded_reason')})")
            return None
        conn = sqlite3.connect(db)
        vectors = conn.execute("SELECT count(*) FROM memory_vector").fetchone()[0]
        rows = sum(
            conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("memory_longterm", "memory_episodic", "memory_short")
        )
        conn.close()
        queries = make_queries(db, args.queries + args.warmup, args.seed, "content")
        samples, fts, http, last = time_line(
            service.port, args.floor_port, db, queries, "long,short", "shared", args.warmup
        )
        stats, floor = percentiles(samples), percentiles([a + b for a, b in zip(http, fts)])
        print(
            row("service hybrid [long,short content]", stats)
            + f"  ratio p50 {stats['p50'] / floor['p50']:.2f}x (target {HYBRID_TARGET_RATIO:g}x);"
            + f" ranking {last.get('ranking')}, vectors for {vectors:,} of {rows:,} rows"
        )
        client.close()
    rerank_cost(db, args, "")
    return stats


def rerank_cost(db: Path, args: argparse.Namespace, model_dir: str) -> None:
    """The same queries, interleaved, on the service with --rerank on and off over one database."""
    mode = "keyword" if model_dir == "off" else "hybrid"
    with (
        start_service(db, model_dir=model_dir) as on,
        start_service(db, model_dir=model_dir, extra=["--rerank", "off"]) as off,
    ):
        clients = Client(on.port), Client(off.port)
        queries = make_queries(db, args.queries + args.warmup, args.seed, "content")
        timings: tuple[list[float], list[float]] = ([], [])
        other = 0  # answers ranked otherwise (hybrid degraded to keyword by a timed-out query): left out
        for i, q in enumerate(queries):
            for client, samples in zip(clients, timings):
                started = time.perf_counter()
                status, body = client.json("GET", "/v1/recall", query={"agent": CALLER, "q": q, "k": K})
                if status != 200:
                    raise RuntimeError(f"recall answered {status}: {body}")
                other += body["ranking"] != mode
                if i >= args.warmup and body["ranking"] == mode:
                    samples.append(time.perf_counter() - started)
        for client in clients:
            client.close()
    reranked, first_pass = percentiles(timings[0]), percentiles(timings[1])
    print(row(f"service {mode}, --rerank off [long,short]", first_pass))
    print(
        row(f"service {mode}, reranked [long,short]", reranked)
        + f"  reranker cost p50 {reranked['p50'] - first_pass['p50']:+.3f} ms,"
        + f" p99 {reranked['p99'] - first_pass['p99']:+.3f} ms"
        + (f" ({other} answers not {mode}, left out)" if other else "")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10k,100k,1m", help="database sizes (default: %(default)s)")
    parser.add_argument("--queries", type=int, default=400, help="timed queries per line (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=50, help="untimed queries first (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=7, help="generator and query seed (default: %(default)s)")
    parser.add_argument("--worst-size", default="1m", help="size of the 30-word worst case (default: %(default)s)")
    parser.add_argument("--no-worst", action="store_true", help="skip the 30-word worst case (default: run it)")
    parser.add_argument("--no-hybrid", action="store_true", help="skip the hybrid probe (default: run it)")
    parser.add_argument(
        "--backfill",
        action="store_true",
        help="embed every row before the hybrid line (about 200 rows/s; needs fastembed) (default: no)",
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo file (default: %(default)s)")
    parser.add_argument(
        "--shapes", default="fleet,locomo", help="data shapes: fleet, locomo or both (default: %(default)s)"
    )
    parser.add_argument("--writes", type=int, default=200, help="serial writes timed per size (default: %(default)s)")
    parser.add_argument(
        "--curve",
        type=Path,
        metavar="DIR",
        help="only the cost curve: per size both shapes' recall p50/p99 and floor, write p50; writes "
        "DIR/cost-curve.md, .png, .svg and .json (default: off; e.g. --curve docs --sizes 1k,10k,100k)",
    )
    args = parser.parse_args()
    print(machine_note())
    if args.curve:
        return run_curve(args)

    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    dbs = {label: gen_db.ensure_db(gen_db.parse_size(label), args.seed) for label in sizes if "fleet" in args.shapes}
    results = {}
    with start_floor("one") as floor:
        for label in sizes:
            args.floor_port = floor.port
            if "fleet" in args.shapes:
                results[label] = measure_size(label, dbs[label], args, floor.port, hybrid=not args.no_hybrid)
            if "locomo" in args.shapes:
                recall, floor_stats, _ = measure_locomo(label, args, floor.port)
                results.setdefault(label, {})["LoCoMo questions"] = (recall, floor_stats, None)
        if not args.no_worst:
            worst_db = gen_db.ensure_db(gen_db.parse_size(args.worst_size), args.seed, vocab="30")
            print(f"\n== worst case: 30-word vocabulary, {args.worst_size} ==")
            worst_args = argparse.Namespace(**{**vars(args), "queries": max(50, args.queries // 4), "warmup": 5})
            worst = measure_worst(worst_db, worst_args, floor.port)
            results["worst"] = worst

    print("\n== summary (keyword, ms) ==")
    failures = []
    main_line = f"{LINES[0][0]} content"
    first, last = sizes[0], sizes[-1]
    for label in sizes:
        for name, (service_stats, floor_stats, _) in ((n, v) for n, v in results[label].items() if n != "hybrid"):
            ratio = service_stats["p50"] / floor_stats["p50"]
            ok_ratio = ratio <= (LOCOMO_TARGET_RATIO if name == "LoCoMo questions" else TARGET_RATIO)
            line = (
                f"  {label:>5} {name:<24} p50 {service_stats['p50']:7.3f} (floor {floor_stats['p50']:6.3f}, "
                f"{ratio:4.2f}x {verdict(ok_ratio)})  p99 {service_stats['p99']:7.3f}"
            )
            if label == "1m":
                ok_p99 = service_stats["p99"] < TARGET_P99_MS
                line += f" {verdict(ok_p99)} (< {TARGET_P99_MS:g})"
                if not ok_p99:
                    failures.append(f"p99 {label} {name}")
            if not ok_ratio:
                failures.append(f"ratio {label} {name}")
            print(line)
        hybrid = results[label].get("hybrid")
        print(
            f"  {label:>5} hybrid                   "
            + ("n/a (degraded)" if hybrid is None else f"p50 {hybrid['p50']:7.3f}  p99 {hybrid['p99']:7.3f}")
        )
    if len(sizes) > 1:
        for name in results[first]:
            if name == "hybrid" or name not in results[last]:
                continue
            growth = results[last][name][0]["p50"] / results[first][name][0]["p50"]
            ok = growth <= TARGET_GROWTH
            print(f"  growth {first} -> {last} p50 [{name}]: {growth:.2f}x {verdict(ok)} (<= {TARGET_GROWTH:g}x)")
            if not ok and name == main_line:
                failures.append(f"growth {name}")
    if "worst" in results:
        service_stats, floor_stats, fts_stats = results["worst"]
        print(
            f"  worst case (30 words, {args.worst_size}): "
            f"p50 {service_stats['p50']:.1f} p99 {service_stats['p99']:.1f} ms; "
            f"fts floor p50 {fts_stats['p50']:.1f} ms; ratio {service_stats['p50'] / floor_stats['p50']:.2f}x "
            f"(reported, no target)"
        )
    print("\nmissed: " + (", ".join(failures) if failures else "none"))
    return 1 if failures else 0


def run_curve(args: argparse.Namespace) -> int:
    """The cost curve at each size, printed, then written as a table and a chart into args.curve."""
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    load_before = os.getloadavg()[0]
    with start_floor("one") as floor:
        points = {label: measure_curve_point(label, args, floor.port) for label in sizes}
    note = machine_note()
    table = cost_curve.table(points)
    print("\n" + table)
    written = cost_curve.write(args.curve, points, f"{note}; at the start {load_before:.2f}")
    print("written: " + ", ".join(str(path) for path in written))
    return 0


def measure_worst(db_source: Path, args: argparse.Namespace, floor_port: int) -> tuple[dict, dict, dict]:
    """The 30-word vocabulary: every term matches ~40% of rows."""
    rng = random.Random(args.seed)
    queries = [" ".join(rng.sample(gen_db.VOCAB_30, rng.choice((2, 3)))) for _ in range(args.queries + args.warmup)]
    with tempfile.TemporaryDirectory(prefix="solos-bench-") as scratch:
        db = Path(scratch) / "solos.db"
        shutil.copyfile(db_source, db)
        with start_service(db) as service:
            samples, fts, http, _ = time_line(
                service.port, floor_port, db, queries, "long,short", "shared", args.warmup
            )
    service_stats, fts_stats = percentiles(samples), percentiles(fts)
    floor_stats = percentiles([a + b for a, b in zip(http, fts)])
    print(row("fts floor [long,short 30 words]", fts_stats))
    print(row("service keyword [long,short 30 words]", service_stats))
    return service_stats, floor_stats, fts_stats


if __name__ == "__main__":
    sys.exit(main())
