#!/usr/bin/env python3
"""SQLite against PostgreSQL, side by side in one run: recall p50/p99 and write throughput.

    .venv/bin/python bench/store_compare.py                       # 10k and 100k, hybrid at 10k: about 6 min
    .venv/bin/python bench/store_compare.py --sizes 1m --shapes fleet --no-hybrid   # 1M keyword: about 7 min
    .venv/bin/python bench/store_compare.py --pg-url postgresql://postgres@127.0.0.1:5432/postgres
    .venv/bin/python bench/store_compare.py --sizes 10k --shapes fleet --no-recall --base main   # writes, before/after

For each size the same rows go into both stores: the cached SQLite database
of the speed benches (gen_db.py: N episodic rows, N/10 long facts, N/100 short
rows; locomo_shape.py: N LoCoMo turns as long facts), copied for SQLite, and
COPY-ed from it into a fresh PostgreSQL database whose schema the service made
(PgStore.migrate), so schema_pg.sql's triggers fill the tsvectors as they do
for the fleet's writers; then VACUUM ANALYZE, as gen_db ends with ANALYZE. The
PostgreSQL server is a throwaway one of this run's own (tests/pg_server.py:
Debian's PostgreSQL, stock settings, fsync on, on a loopback port), or the
server of --pg-url, where the databases are named pgbench_compare_<pid>_* and
dropped at the end.

One service per store runs as a subprocess, and each line alternates them
query by query (which goes first alternates too), so whatever else loads the
machine loads both alike:

  keyword [long,short]       2-3 content words of a random row (recall_latency's
                             queries), the default tiers, scope shared
  keyword [long,episodic own] the same words over the large episodic tier, the
                             caller's own rows (no audit writes)
  keyword [LoCoMo]           20 real LoCoMo questions on the LoCoMo-shaped rows
  hybrid [...]               the same with the embedder (at --hybrid-sizes only:
                             every row needs a vector first, embedded once by
                             `solos_memory.py backfill` into a copy cached in
                             .cache/bench, about 3 minutes per 10k rows here, and
                             copied into PostgreSQL with the rows)
  serial writes              POST /v1/long one after another, one kept-alive
                             connection per store, alternating: writes/s = 1/mean
  16 writers                 write_throughput.py's 16 kept-alive clients (long,
                             episodic, short), --write-seconds per store per round,
                             two rounds in alternating order: acknowledged writes/s

With --base (a git revision or a checkout's folder), the write lines run the
base tree's two services beside this tree's, each on a copy of its own (the
PostgreSQL one made from the filled database as a template), all four
alternating, so "before" and "after" are one run's figures.

The summary prints each figure for both stores and PostgreSQL/SQLite (latency:
above 1 is slower; throughput: below 1 is slower). Every run is bounded: HTTP
calls time out, loops are counted, a recall line stops after --line-seconds
(n says how many queries it timed), a size not started within --budget-min is
skipped with a line saying so, and the services and the PostgreSQL server are
stopped at the end, the databases made on --pg-url's server dropped. Figures:
docs/benchmarks.md, "SQLite against PostgreSQL". Needs psycopg and Debian's PostgreSQL (`make test` sets up
both), so run it with .venv/bin/python.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import shutil
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import gen_db
import locomo_shape
import write_throughput
from harness import ROOT, Client, Process, machine_note, percentiles, start_service, with_vectors
from load import base_tree
from locomo_data import DEFAULT_DATA, load_conversations
from recall_latency import CALLER, make_queries

sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

K = 5
LOCOMO_QUESTIONS = 20
STORES = ("SQLite", "PostgreSQL")
BASE = "base "  # the base tree's services and lines (--base)
TIERS = ("memory_longterm", "memory_episodic", "memory_short")  # what "rows" counts

# ==== PostgreSQL: the server, and the databases filled from the SQLite files ====


class PgServer:
    """Databases on a PostgreSQL server: a throwaway one of this run's own, or --pg-url's."""

    PREFIX = "pgbench_compare"

    def __init__(self, url: str | None) -> None:
        try:
            import psycopg
        except ImportError:
            raise SystemExit("store_compare.py needs psycopg: run it with .venv/bin/python") from None
        self.psycopg = psycopg
        self.throwaway = None
        if url is None:
            from pg_server import ThrowawayPostgres, unavailable_reason

            reason = unavailable_reason()
            if reason:
                raise SystemExit(f"no PostgreSQL to compare with: {reason} (or give --pg-url)")
            self.throwaway = ThrowawayPostgres()
            url = self.throwaway.url
        self.url = url
        try:
            self.admin = psycopg.connect(url, autocommit=True, connect_timeout=5)
        except psycopg.Error as error:
            self.close()
            raise SystemExit(f"--pg-url: cannot connect: {str(error).strip().splitlines()[0]}") from None
        self.numbers = itertools.count(1)
        self.made: list[str] = []

    def describe(self) -> str:
        version = self.admin.execute("SHOW server_version").fetchone()[0]
        settings = ", ".join(
            f"{name} {self.admin.execute(f'SHOW {name}').fetchone()[0]}"
            for name in ("shared_buffers", "fsync", "synchronous_commit")
        )
        where = "a throwaway server of this run" if self.throwaway else "--pg-url's server"
        return f"PostgreSQL {version}, {where} ({settings})"

    def create(self, label: str, template: str | None = None) -> str:
        """A new database, empty or a copy of the database at `template` (a URL no one is connected to)."""
        name = f"{self.PREFIX}_{os.getpid()}_{next(self.numbers)}_{label}"
        identifier = self.psycopg.sql.Identifier
        if template is None:
            self.admin.execute(self.psycopg.sql.SQL("CREATE DATABASE {}").format(identifier(name)))
        else:
            source = urllib.parse.urlsplit(template).path.lstrip("/")
            statement = self.psycopg.sql.SQL("CREATE DATABASE {} TEMPLATE {}")
            self.admin.execute(statement.format(identifier(name), identifier(source)))
        self.made.append(name)
        return urllib.parse.urlunsplit(urllib.parse.urlsplit(self.url)._replace(path="/" + name))

    def drop(self, url: str) -> None:
        name = urllib.parse.urlsplit(url).path.lstrip("/")
        statement = self.psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
        self.admin.execute(statement.format(self.psycopg.sql.Identifier(name)))
        self.made.remove(name)

    def close(self) -> None:
        admin = getattr(self, "admin", None)
        if admin is not None and not admin.closed:
            for name in list(self.made):
                with contextlib.suppress(self.psycopg.Error):
                    self.drop(urllib.parse.urlunsplit(urllib.parse.urlsplit(self.url)._replace(path="/" + name)))
            admin.close()
        if self.throwaway is not None:
            self.throwaway.close()


def fill_pg(url: str, source: Path) -> tuple[int, float]:
    """The SQLite file at source copied into the database at url by `migrate` (the schema, every row with its
    id, the keyword index filled by its trigger, verified), then VACUUM ANALYZE. Returns (the tiers' rows,
    seconds)."""
    import psycopg

    import solos_migrate

    started = time.perf_counter()
    report = io.StringIO()
    if not solos_migrate.migrate(str(source), url, report):
        raise SystemExit(f"migrate into {url} did not verify:\n{report.getvalue()}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        rows = sum(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in TIERS)
    return rows, time.perf_counter() - started


# ==== The SQLite sources ====


def source_db(shape: str, size: int, data: Path, seed: int) -> Path:
    """The cached SQLite database of this shape and size (generated on first use)."""
    if shape == "fleet":
        return gen_db.ensure_db(size, seed)
    return locomo_shape.ensure_db(size, data)


# ==== Side by side ====


@contextlib.contextmanager
def services(dbs: dict[str, str], model_dir: str, tree: Path = ROOT) -> Iterator[dict[str, Process]]:
    """One service per store on its database (this checkout's, or `tree`'s); stopped on the way out, whatever
    happens."""
    with contextlib.ExitStack() as stack:
        yield {
            store: stack.enter_context(start_service(db, model_dir=model_dir, tree=tree)) for store, db in dbs.items()
        }


def recall_line(
    procs: dict[str, Process], queries: list[str], warmup: int, params: dict, mode: str, seconds: float
) -> dict[str, dict]:
    """The same queries on both services, alternating per query (and which goes first); latency per store.
    A line stops after `seconds`, the queries timed so far kept (n says how many)."""
    clients = {store: Client(proc.port, timeout=60) for store, proc in procs.items()}
    samples: dict[str, list[float]] = {store: [] for store in procs}
    other = dict.fromkeys(procs, 0)
    stop_at = time.monotonic() + seconds
    try:
        for i, q in enumerate(queries):
            if time.monotonic() > stop_at and i > warmup:
                break
            order = list(procs) if i % 2 == 0 else list(reversed(procs))
            for store in order:
                started = time.perf_counter()
                status, body = clients[store].json("GET", "/v1/recall", query={**params, "q": q, "k": K})
                elapsed = time.perf_counter() - started
                if status != 200:
                    raise RuntimeError(f"{store} recall answered {status}: {body}")
                if body.get("ranking") != mode:  # hybrid degraded to keyword (a query's embedding timed out)
                    other[store] += 1
                elif i >= warmup:
                    samples[store].append(elapsed)
    finally:
        for client in clients.values():
            client.close()
    return {store: {**percentiles(samples[store]), "other": other[store]} for store in procs}


def serial_writes(procs: dict[str, Process], count: int, agent: str) -> dict[str, dict]:
    """POST /v1/long one after another on one kept-alive connection per service, the services taking turns (who
    goes first rotates)."""
    clients = {store: Client(proc.port, timeout=60) for store, proc in procs.items()}
    samples: dict[str, list[float]] = {store: [] for store in procs}
    stamp = time.time()
    names = list(procs)
    try:
        for n in range(count):
            for store in names[n % len(names) :] + names[: n % len(names)]:
                body = {"agent": agent, "topic": "bench writes", "fact": f"Store bench write {n} at {stamp}"}
                started = time.perf_counter()
                status, answer = clients[store].json("POST", "/v1/long", body)
                samples[store].append(time.perf_counter() - started)
                if status not in (200, 201):
                    raise RuntimeError(f"{store} write answered {status}: {answer}")
    finally:
        for client in clients.values():
            client.close()
    return {store: {**percentiles(s), "per_s": len(s) / sum(s)} for store, s in samples.items()}


def concurrent_writes(procs: dict[str, Process], clients: int, seconds: float) -> dict[str, dict]:
    """write_throughput's clients on each service in turn, two rounds in reverse orders: acknowledged writes/s."""
    totals = {store: {"acked": 0, "elapsed": 0.0, "5xx": 0, "errors": 0, "latencies": []} for store in procs}
    for round_no in range(2):
        for store in round_order(procs, round_no):
            # Numbered apart per round: the same client number twice would write the same facts (updates).
            tally, elapsed = write_throughput.drive(
                procs[store].port, clients, seconds, first_client=round_no * clients
            )
            total = totals[store]
            total["acked"] += len(tally.acked)
            total["elapsed"] += elapsed
            total["5xx"] += sum(n for status, n in tally.statuses.items() if status >= 500)
            total["errors"] += len(tally.errors)
            total["latencies"] += tally.latencies
    return {
        store: {
            "per_s": t["acked"] / t["elapsed"],
            "5xx": t["5xx"],
            "errors": t["errors"],
            **percentiles(t["latencies"]),
        }
        for store, t in totals.items()
    }


def round_order(procs: dict[str, Process], round_no: int) -> list[str]:
    """Who writes when in a round of concurrent writers. The two stores alternate who goes first; with the base
    tree's services (--base), the stores go in turn, each store's two trees in alternating order, so each tree's
    PostgreSQL follows an SQLite run (whose WAL checkpoint may still be writing) as often as the other's."""
    trees = ("", BASE) if BASE + STORES[0] in procs else ("",)
    if round_no % 2:
        trees = trees[::-1]
    stores = STORES if round_no % 2 == 0 or len(trees) > 1 else STORES[::-1]
    return [tree + store for store in stores for tree in trees]


def show(label: str, figures: dict[str, dict]) -> None:
    """One line per store: p50 and p99, and the ratio."""
    lite, pg = (figures[s] for s in STORES)
    extra = "".join(
        f" ({f['other']} of {s}'s answers not {label.split()[0]}, left out)"
        for s, f in figures.items()
        if f.get("other")
    )
    print(
        f"  {label:<34} n {lite['n']:>4}  SQLite p50 {lite['p50']:7.2f} p99 {lite['p99']:7.2f} | "
        f"PostgreSQL p50 {pg['p50']:7.2f} p99 {pg['p99']:7.2f} ms | "
        f"PG/SQLite p50 {pg['p50'] / lite['p50']:5.2f}x p99 {pg['p99'] / lite['p99']:5.2f}x{extra}",
        flush=True,
    )


def measure(shape: str, label: str, source: Path, pg: PgServer, args: argparse.Namespace, hybrid: bool) -> dict:
    """Every line of one shape and size on both stores; {line: {store: figures}}."""
    results: dict[str, dict] = {}
    url = pg.create(f"{shape}_{label}")
    base_url = None
    try:
        rows, load_s = fill_pg(url, source)
        print(
            f"\n== {label} {shape}: {source.name}; "
            f"{rows:,} rows (long, episodic, short) into PostgreSQL in {load_s:.0f} s =="
        )
        writing = shape == "fleet" and args.writes
        if writing and args.base_tree:  # before any service connects: a template must have no sessions
            base_url = pg.create(f"{shape}_{label}_base", template=url)
        with tempfile.TemporaryDirectory(prefix="solos-bench-") as scratch:
            lite = Path(scratch) / "solos.db"
            shutil.copyfile(source, lite)
            dbs = {"SQLite": str(lite), "PostgreSQL": url}
            if shape == "fleet":
                lines = [
                    ("long,short", {"agent": CALLER, "tiers": "long,short", "scope": "shared"}),
                    ("long,episodic own", {"agent": CALLER, "tiers": "long,episodic", "scope": "own"}),
                ]
                queries = make_queries(source, args.queries + args.warmup, args.seed, "content")
            else:
                lines = [("LoCoMo", {"agent": locomo_shape.READER, "tiers": "long", "scope": "shared"})]
                asked = locomo_shape.questions(args.data, LOCOMO_QUESTIONS, args.seed)
                queries = asked * max(1, (args.queries + args.warmup) // len(asked))
            for mode, model_dir in (("keyword", "off"), ("hybrid", "")):
                if (mode == "hybrid" and not hybrid) or args.no_recall:
                    continue
                with services(dbs, model_dir) as procs:
                    if mode == "hybrid" and not ready_for_hybrid(procs):
                        continue
                    for name, params in lines:
                        key = f"{mode} [{name}]"
                        results[key] = recall_line(procs, queries, args.warmup, params, mode, args.line_seconds)
                        show(key, results[key])
            if writing:  # last: the rows written have no vectors, hybrid would wait
                with contextlib.ExitStack() as stack:
                    procs = stack.enter_context(services(dbs, "off"))
                    if base_url is not None:
                        base = Path(scratch) / "base.db"
                        shutil.copyfile(source, base)
                        before = {"SQLite": str(base), "PostgreSQL": base_url}
                        procs |= {
                            BASE + s: p for s, p in stack.enter_context(services(before, "off", args.base_tree)).items()
                        }
                    results.update(measure_writes(procs, args))
    finally:
        pg.drop(url)
        if base_url is not None:
            pg.drop(base_url)
    return results


def measure_writes(procs: dict[str, Process], args: argparse.Namespace) -> dict[str, dict]:
    """Serial writes, then concurrent writers, on both stores (and the base tree's two, beside them); printed as
    they come. {line: {store: figures}}, the base tree's lines prefixed with BASE."""
    serial = serial_writes(procs, args.writes, CALLER)
    many = concurrent_writes(procs, args.clients, args.write_seconds)
    lines: dict[str, dict] = {}
    for tree in ("", BASE) if BASE + STORES[0] in procs else ("",):
        lines[tree + "serial writes"] = serial_line = {s: serial[tree + s] for s in STORES}
        show(f"{tree}serial writes (POST /v1/long)", serial_line)
        print("  " + " " * 34 + " writes/s: " + "  ".join(f"{s} {serial_line[s]['per_s']:,.0f}" for s in STORES))
    for tree in ("", BASE) if BASE + STORES[0] in procs else ("",):
        lines[f"{tree}{args.clients} writers"] = line = {s: many[tree + s] for s in STORES}
        print(
            f"  {f'{tree}{args.clients} writers, acknowledged/s':<34} "
            + "  ".join(
                f"{s} {line[s]['per_s']:,.0f} (p99 {line[s]['p99']:.0f} ms, 5xx {line[s]['5xx']}, "
                f"transport errors {line[s]['errors']})"
                for s in STORES
            )
            + f"  PG/SQLite {line['PostgreSQL']['per_s'] / line['SQLite']['per_s']:.2f}x",
            flush=True,
        )
    return lines


def ready_for_hybrid(procs: dict[str, Process]) -> bool:
    """Both services have the embedder and a vector for every row (/health not degraded, no backlog)."""
    deadline = time.monotonic() + 60
    for store, proc in procs.items():
        client = Client(proc.port)
        try:
            while True:
                health = client.json("GET", "/health")[1]
                if not health.get("degraded", True) and not health.get("embed_backlog"):
                    break
                if time.monotonic() > deadline:
                    print(f"  hybrid: n/a ({store}: {health.get('degraded_reason') or health.get('embedder_state')})")
                    return False
                time.sleep(0.5)
        finally:
            client.close()
    return True


def summary(results: dict[str, dict[str, dict]]) -> None:
    """The table: each line's figures on both stores and PostgreSQL/SQLite."""
    print("\n== summary: PostgreSQL / SQLite (latency ms: above 1x is slower; writes/s: below 1x is slower) ==")
    print(f"  {'size':<6}{'line':<36}{'SQLite p50':>11}{'p99':>9}{'PG p50':>10}{'p99':>9}{'ratio p50':>11}{'p99':>8}")
    for size, lines in results.items():
        for name, figures in lines.items():
            lite, pg = (figures[s] for s in STORES)
            if name.endswith(" writers"):
                print(
                    f"  {size:<6}{name + ', writes/s':<36}{lite['per_s']:>11,.0f}{'':>9}"
                    f"{pg['per_s']:>10,.0f}{'':>9}{pg['per_s'] / lite['per_s']:>10.2f}x"
                )
                continue
            print(
                f"  {size:<6}{name:<36}{lite['p50']:>11.2f}{lite['p99']:>9.2f}{pg['p50']:>10.2f}{pg['p99']:>9.2f}"
                f"{pg['p50'] / lite['p50']:>10.2f}x{pg['p99'] / lite['p99']:>7.2f}x"
            )
            if name.endswith("serial writes"):
                print(
                    f"  {size:<6}{name + ', writes/s':<36}{lite['per_s']:>11,.0f}{'':>9}"
                    f"{pg['per_s']:>10,.0f}{'':>9}{pg['per_s'] / lite['per_s']:>10.2f}x"
                )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10k,100k", help="database sizes (default: %(default)s)")
    parser.add_argument("--shapes", default="fleet,locomo", help="fleet, locomo or both (default: %(default)s)")
    parser.add_argument("--queries", type=int, default=200, help="timed queries per line (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed queries first (default: %(default)s)")
    parser.add_argument(
        "--line-seconds",
        type=float,
        default=90,
        help="stop a recall line after this long, keeping the queries timed so far (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=7, help="generator and query seed (default: %(default)s)")
    parser.add_argument("--hybrid-sizes", default="10k", help="sizes with a hybrid line (default: %(default)s)")
    parser.add_argument("--no-hybrid", action="store_true", help="keyword only (default: hybrid at --hybrid-sizes)")
    parser.add_argument("--writes", type=int, default=200, help="serial writes per store (default: %(default)s)")
    parser.add_argument("--no-writes", action="store_true", help="skip both write lines (default: run them)")
    parser.add_argument("--no-recall", action="store_true", help="skip the recall lines (default: run them)")
    parser.add_argument(
        "--base",
        default="none",
        help="a git revision or checkout folder whose services write beside this tree's (default: %(default)s)",
    )
    parser.add_argument("--clients", type=int, default=16, help="concurrent writers (default: %(default)s)")
    parser.add_argument(
        "--write-seconds", type=float, default=5, help="concurrent writing per store per round (default: %(default)s)"
    )
    parser.add_argument(
        "--budget-min", type=float, default=15, help="start no size after this many minutes (default: %(default)s)"
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo file (default: %(default)s)")
    parser.add_argument(
        "--pg-url", help="an existing server's postgresql:// URL (default: start a throwaway server for this run)"
    )
    args = parser.parse_args()
    if args.no_writes:
        args.writes = 0
    started = time.monotonic()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    hybrid_sizes = set() if args.no_hybrid else {s.strip() for s in args.hybrid_sizes.split(",")}
    if "locomo" in shapes:
        load_conversations(args.data)  # a missing file stops here, in one line naming it, before any server starts
    print(machine_note())
    scratch = tempfile.TemporaryDirectory(prefix="solos-bench-base-")
    args.base_tree = base_tree(args.base, Path(scratch.name))
    if args.base_tree is not None:
        print(f"base: {args.base} ({args.base_tree}), beside this tree in the write lines")
    pg = PgServer(args.pg_url)
    results: dict[str, dict] = {}
    try:
        print(pg.describe())
        for label, shape in itertools.product(sizes, shapes):
            spent = (time.monotonic() - started) / 60
            if spent > args.budget_min:
                print(f"\n== {label} {shape}: skipped, {spent:.1f} min spent of --budget-min {args.budget_min:g} ==")
                continue
            source = source_db(shape, gen_db.parse_size(label), args.data, args.seed)
            hybrid = label in hybrid_sizes
            if hybrid:
                vectors = with_vectors(source, budget_s=max(60.0, args.budget_min * 60 - (time.monotonic() - started)))
                hybrid, source = vectors is not None, vectors or source
            measured = measure(shape, label, source, pg, args, hybrid)
            results.setdefault(label, {}).update({f"{shape} {name}": v for name, v in measured.items()})
    finally:
        pg.close()
        scratch.cleanup()
    summary(results)
    print(f"\n{machine_note()}; run time {(time.monotonic() - started) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
