"""LoCoMo retrieval benchmark for solos-memory's recall.

Loads a LoCoMo file into a fresh service per conversation through REST (one
long fact per dialog turn, attributed to its speaker), asks every QA question
that has evidence through /v1/recall and scores where the evidence turns land:
hit@1/5/10, all@5/10, frac@5/10 and MRR@10, per category and overall, for
keyword-only, vector-only and hybrid recall. A reference row, plain Okapi BM25
(k1=1.2, b=0.75) on the raw turn text computed here, is printed beside them
(0.48 hit@5 on the dev split). Metric definitions: ../shared/data/locomo/README.md.

The service reranks keyword and hybrid recall with weights fitted on this very
split, so its figures are in-sample. A second service on the same database
with --rerank off answers every question too (the first pass). The last block
puts them beside the reranker's leave-one-conversation-out estimate: fitted on
four conversations, ranking the fifth (bench/ltr_fit.py's simulation,
which needs numpy; with the embedder for hybrid).

    .venv/bin/python bench/locomo.py [--data LOCOMO.json] [--modes keyword,vector,hybrid] [--limit N] [--no-first-pass]
    .venv/bin/python bench/locomo.py --latency-rows 10000    # also recall p50 on 10k rows
    .venv/bin/python bench/locomo.py --db postgresql://USER@HOST:PORT/DB --modes keyword,hybrid --no-floor
    python3 bench/locomo.py --reference-only

The service runs under the same interpreter (--python to change it), so hybrid
needs fastembed there: use .venv/bin/python. Keyword-only starts it with
--model-dir off. Each conversation gets a fresh database in a temp dir; the
database path goes in through SOLOS_MEMORY_DB. Stdlib only here, but for the
cross-validated block (imported when it runs) and psycopg with --db.

--db postgresql://… runs every mode on both stores, SQLite first, then
PostgreSQL, and ends with the two side by side (the goal: hit@5 and frac@10
within 0.01). Each conversation gets a fresh database on that server, named
pgbench_locomo_<pid>_<n> and dropped after it (the URL's user needs CREATEDB or
superuser). A user without that may name an empty database of its own: the
bench then loads the conversations into it one after another and empties it
after each (DROP SCHEMA public CASCADE, made again as PostgreSQL 15 makes it),
so it is left empty. A database holding tables is never touched. The relevance
floor block stays on SQLite.
Findings and the ranking recipe: bench/RESULTS-locomo.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections import Counter
from pathlib import Path

from harness import percentiles  # noqa: E402  (bench/ is on sys.path when run as a script)
from locomo_data import (
    DEFAULT_DATA,
    Conversation,
    agent_names,
    format_table,
    load_conversations,
    run_reference,
    score,
    summarise,
)
from locomo_service import READER, PgDatabases, Service, SqliteFiles, prepare, recall_ids, write_turns

# ==== One mode on one store: every conversation on a service of its own ====


def run_service(
    conversations: list[Conversation],
    mode: str,
    python: str,
    serve_args: list[str],
    first_pass: bool = False,
    databases: SqliteFiles | PgDatabases | None = None,
) -> tuple[dict, dict, dict | None]:
    """Load and query every conversation on its own service; returns (summary, timings, first-pass summary).

    With first_pass, a second service on the same database runs with --rerank off and answers too.
    """
    databases = databases or SqliteFiles()
    rows: list[tuple[int, dict[str, float]]] = []
    unranked: list[tuple[int, dict[str, float]]] = []
    latencies: list[float] = []
    degraded: Counter[bool] = Counter()
    started = time.perf_counter()
    write_s = embed_s = 0.0
    for conv in conversations:
        agents = agent_names(conv.speakers + [t.speaker for t in conv.turns])
        with databases.fresh() as db:
            service = Service(python, db, [*agents.values(), READER], serve_args)
            plain = None
            try:
                t0 = time.perf_counter()
                write_turns(service, conv.turns, agents)
                t1 = time.perf_counter()
                prepare(service, mode)
                write_s += t1 - t0
                embed_s += time.perf_counter() - t1
                if first_pass:
                    plain = Service(python, db, [READER], [*serve_args, "--rerank", "off"])
                    prepare(plain, mode)
                for q in conv.queries:
                    t0 = time.perf_counter()
                    ids, flag = recall_ids(service, q.question, mode)
                    latencies.append(time.perf_counter() - t0)
                    degraded[flag] += 1
                    rows.append((q.category, score(ids, q.evidence)))
                    if plain is not None:
                        unranked.append((q.category, score(recall_ids(plain, q.question, mode)[0], q.evidence)))
            finally:
                service.close()
                if plain is not None:
                    plain.close()
    spread = percentiles(latencies)
    p50, p95 = spread["p50"], spread["p95"]
    timings = {
        "total_s": time.perf_counter() - started,
        "write_s": write_s,
        "embed_s": embed_s,
        "recall_p50_ms": p50,
        "recall_p95_ms": p95,
        "degraded": degraded[True],
        "queries": len(latencies),
    }
    return summarise(rows), timings, summarise(unranked) if unranked else None


def run_latency(
    conversations: list[Conversation],
    mode: str,
    python: str,
    serve_args: list[str],
    size: int,
    databases: SqliteFiles | PgDatabases | None = None,
) -> str:
    """Recall latency on one database of `size` rows (copies of all turns), every question asked once."""
    databases = databases or SqliteFiles()
    agents = agent_names([t.speaker for c in conversations for t in c.turns])
    turns = [t for c in conversations for t in c.turns]
    with databases.fresh() as db:
        service = Service(python, db, [*agents.values(), READER], serve_args)
        try:
            t0 = time.perf_counter()
            for copy in range(-(-size // len(turns))):
                write_turns(service, turns[: size - copy * len(turns)], agents, copy)
            write_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            prepare(service, mode)
            prepare_s = time.perf_counter() - t0
            latencies = []
            for q in (q for c in conversations for q in c.queries):
                t0 = time.perf_counter()
                recall_ids(service, q.question, mode)
                latencies.append(time.perf_counter() - t0)
        finally:
            service.close()
    spread = percentiles(latencies)
    p50, p95 = spread["p50"], spread["p95"]
    return (
        f"{databases.label}, {mode}, {size} rows: writes {size / write_s:.0f}/s, "
        f"then waiting for vectors {prepare_s:.1f} s; "
        f"recall p50 {p50:.1f} ms, p95 {p95:.1f} ms over {len(latencies)} questions"
    )


# ==== The reranker, cross-validated ====

GOALS = {"hit@5": 0.85, "frac@10": 0.88, "MRR": 0.65}  # the recall bar, hybrid; multi-hop and open-domain: +0.10 hit@5


def figure_line(name: str, summary: dict[str, dict[str, float]]) -> str:
    """Overall hit@1, hit@5, hit@10, frac@10, MRR, then multi-hop and open-domain hit@5."""
    o = summary["overall"]
    cells = [o["hit@1"], o["hit@5"], o["hit@10"], o["frac@10"], o["MRR"]]
    cells += [summary.get(c, {}).get("hit@5", float("nan")) for c in ("multi-hop", "open-domain")]
    return f"{name:<62}" + "".join(f"{c:>8.3f}" for c in cells)


def print_cross_validated(conversations: list[Conversation], service: dict[str, dict[str, dict]]) -> None:
    """The service's figures beside the reranker's simulated in-sample and leave-one-conversation-out ones."""
    print(f"{'the reranker (fused top 20), overall':<62}" + "".join(f"{m:>8}" for m in CROSS_COLUMNS))
    for mode in ("vector", "keyword", "hybrid"):
        for name, summary in service.get(mode, {}).items():
            print(figure_line(f"{mode}: service (REST), {name}", summary))
    try:
        import ltr_fit
    except ImportError as error:
        print(f"cross-validated figures: n/a ({error}; run with .venv/bin/python)")
        return
    vectors = None
    if "hybrid" in service:
        from locomo_simulate import recipe_vector

        import solos_embed

        vectors = recipe_vector(conversations, solos_embed.load_embedder(None))
    for mode, figures in ltr_fit.reranker_figures(conversations, vectors).items():
        for name, summary in figures.items():
            label = {
                "first pass": "first pass",
                "in-sample": "reranked, service weights (in-sample)",
                "LOCO": "reranked, fit on 4, rank the 5th (LOCO)",
            }[name]
            print(figure_line(f"{mode}: simulated, {label}", summary))
    print(
        "goals (hybrid): " + ", ".join(f"{m} >= {v}" for m, v in GOALS.items()) + "; multi-hop and open-domain "
        "hit@5 +0.10 over the first pass's 0.64 and 0.45"
    )


CROSS_COLUMNS = ("hit@1", "hit@5", "hit@10", "frac@10", "MRR", "mh@5", "od@5")


def print_floor(conversations: list[Conversation], modes: list[str], args: argparse.Namespace) -> None:
    """The relevance floor: each conversation's service asked its own and the other conversations'
    questions; rejection of the foreign ones and hit@5 of the own ones at the service's default floor, in-sample
    and held out by conversation (bench/relevance_fit.py, which needs numpy)."""
    try:
        import relevance_fit
    except ImportError as error:
        print(f"relevance floor figures: n/a ({error}; run with .venv/bin/python)")
        return
    import solos_rank

    print()
    for mode in modes:
        serve_args = shlex.split(args.keyword_args if mode == "keyword" else args.hybrid_args)
        asked = relevance_fit.collect(conversations, mode, args.python, serve_args)
        relevance_fit.report(asked, mode, solos_rank.RELEVANCE_FLOOR, len(conversations))


# ==== Both stores ====


def run_stores(
    conversations: list[Conversation], modes: list[str], stores: list, args: argparse.Namespace
) -> dict[str, dict[str, dict]]:
    """Every mode on every store; figures by mode, then by name (the store's label added when there are two)."""
    service_figures: dict[str, dict[str, dict]] = {}
    for mode in modes:
        serve_args = shlex.split(args.keyword_args if mode == "keyword" else args.hybrid_args)
        first_pass = args.first_pass and mode != "vector"  # vector alone is never reranked
        service_figures[mode] = {}
        for store in stores:
            on = f", {store.label}" if len(stores) > 1 or store.label != "SQLite" else ""
            summary, timings, unranked = run_service(conversations, mode, args.python, serve_args, first_pass, store)
            if unranked is not None:
                service_figures[mode][f"first pass (--rerank off){on}"] = unranked
                print(format_table(f"service, {mode}, first pass (--rerank off){on}", unranked))
            service_figures[mode][("reranked" if mode != "vector" else "vector leg") + on] = summary
            print(format_table(f"service, {mode} ({' '.join(serve_args) or 'default serve args'}){on}", summary))
            print(
                f"run time {timings['total_s']:.1f} s (writes {timings['write_s']:.1f} s"
                + (f", then waiting for vectors {timings['embed_s']:.1f} s" if mode != "keyword" else "")
                + f"); recall p50 {timings['recall_p50_ms']:.1f} ms, p95 {timings['recall_p95_ms']:.1f} ms; "
                f"degraded answers {timings['degraded']}/{timings['queries']}"
            )
            expected = timings["queries"] if mode == "keyword" else 0
            if timings["degraded"] != expected:
                print(f"WARNING: {mode} expected {expected} degraded answers, got {timings['degraded']}")
            print()
    return service_figures


STORE_GOAL = 0.01  # PostgreSQL within 0.01 of SQLite on hit@5 and frac@10
STORE_COLUMNS = ("hit@1", "hit@5", "hit@10", "frac@10", "MRR")


def print_store_comparison(service_figures: dict[str, dict[str, dict]], modes: list[str], stores: list) -> None:
    """Each mode's overall figures on both stores, the difference (PostgreSQL - SQLite) and the goal's verdict."""
    first, second = (store.label for store in stores)
    print(
        f"{second} against {first}, overall, same questions (goal: hit@5 and frac@10 within {STORE_GOAL})\n"
        f"{'':<50}" + "".join(f"{m:>8}" for m in STORE_COLUMNS)
    )
    for mode in modes:
        for stage in ("first pass (--rerank off)", "reranked", "vector leg"):
            pair = [service_figures[mode].get(f"{stage}, {label}") for label in (first, second)]
            if None in pair:
                continue
            a, b = (p["overall"] for p in pair)
            for name, row in ((first, a), (second, b)):
                print(f"{f'{mode}, {stage}, {name}':<50}" + "".join(f"{row[m]:>8.3f}" for m in STORE_COLUMNS))
            gaps = {m: b[m] - a[m] for m in STORE_COLUMNS}
            within = all(abs(gaps[m]) <= STORE_GOAL + 1e-9 for m in ("hit@5", "frac@10"))
            print(
                f"{f'{mode}, {stage}, difference':<50}"
                + "".join(f"{gaps[m]:>+8.3f}" for m in STORE_COLUMNS)
                + f"   {'within' if within else 'OFF BY MORE THAN'} {STORE_GOAL}"
            )


# ==== CLI ====


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="LoCoMo JSON file (default: %(default)s)")
    parser.add_argument("--modes", default="keyword,vector,hybrid", help="service modes to run (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N conversations (default: all)")
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter that runs the service (default: %(default)s)"
    )
    parser.add_argument(
        "--keyword-args", default="--model-dir off", help="extra serve args for keyword-only (default: %(default)s)"
    )
    parser.add_argument("--hybrid-args", default="", help="extra serve args for vector and hybrid (default: none)")
    parser.add_argument("--reference-only", action="store_true", help="print only the reference BM25 row")
    parser.add_argument(
        "--no-first-pass",
        dest="first_pass",
        action="store_false",
        help="skip the second service with --rerank off (default: run it for keyword and hybrid)",
    )
    parser.add_argument(
        "--latency-rows", type=int, default=0, help="also time recall on one database of this many rows (default: off)"
    )
    parser.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="skip the relevance floor block: foreign-question rejection and hit@5 at the default floor "
        "(default: run it for keyword and hybrid; it asks each service every conversation's questions)",
    )
    parser.add_argument(
        "--db",
        default="",
        help="a postgresql:// URL: run every mode on SQLite and on PostgreSQL, a fresh database per conversation "
        "on that server, and compare them (default: SQLite only)",
    )
    parser.add_argument("--pg-only", action="store_true", help="with --db: skip the SQLite runs")
    args = parser.parse_args(argv)
    if args.db and not args.db.startswith(("postgresql://", "postgres://")):
        parser.error(f"--db takes a postgresql:// URL, got {args.db!r}")
    if args.pg_only and not args.db:
        parser.error("--pg-only needs --db")

    conversations = load_conversations(Path(args.data))
    if args.limit:
        conversations = conversations[: args.limit]
    n_queries = sum(len(c.queries) for c in conversations)
    n_turns = sum(len(c.turns) for c in conversations)
    print(f"{args.data}: {len(conversations)} conversations, {n_turns} turns, {n_queries} questions with evidence\n")

    started = time.perf_counter()
    print(format_table("reference: plain Okapi BM25 (k1=1.2, b=0.75) on raw turn text", run_reference(conversations)))
    print(f"run time {time.perf_counter() - started:.1f} s\n")
    if args.reference_only:
        return 0

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    stores: list[SqliteFiles | PgDatabases] = [] if args.pg_only else [SqliteFiles()]
    if args.db:
        stores.append(PgDatabases(args.db))
    try:
        service_figures = run_stores(conversations, modes, stores, args)
        if len(stores) > 1:
            print_store_comparison(service_figures, modes, stores)
            print()
        print_cross_validated(conversations, service_figures)
        if args.floor:
            print_floor(conversations, [m for m in modes if m != "vector"], args)
        if args.latency_rows:
            for store in stores:
                for mode in modes:
                    serve_args = shlex.split(args.keyword_args if mode == "keyword" else args.hybrid_args)
                    print(run_latency(conversations, mode, args.python, serve_args, args.latency_rows, store))
    finally:
        for store in stores:
            store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
