#!/usr/bin/env python3
"""SQLite against PostgreSQL, side by side in one run: recall p50/p99 and write throughput.

    .venv/bin/python bench/store_compare.py                       # 10k and 100k, hybrid at 10k: about 6 min
    .venv/bin/python bench/store_compare.py --sizes 1m --shapes fleet --no-hybrid   # 1M keyword: about 7 min
    .venv/bin/python bench/store_compare.py --pg-url postgresql://postgres@127.0.0.1:5432/postgres
    .venv/bin/python bench/store_compare.py --base main --no-writes  # and the tree before, on PostgreSQL beside
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
machine loads both alike. With --base, a third service from that tree (a git
revision or a folder) serves the same PostgreSQL database in the same rotation,
so the recall lines show this tree against the one before, side by side; the
write lines run it on a copy of the database of its own (made from the filled
one as a template), beside this tree's two, all three taking turns. The
PostgreSQL service's own keyword index fills before any line is timed: how long
that took, the first recall's latency while it filled, the index's file and the
service's memory are printed once per size (keyword services):

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
from collections.abc import Callable, Iterator
from pathlib import Path

import gen_db
import locomo_shape
import write_throughput
from harness import ROOT, Client, Process, base_tree, machine_note, percentiles, start_service, with_vectors
from locomo_data import DEFAULT_DATA, load_conversations
from recall_latency import CALLER, make_queries

sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

K = 5
LOCOMO_QUESTIONS = 20
STORES = ("SQLite", "PostgreSQL")
BEFORE = "PG before"  # --base's service, on the PostgreSQL database
FILL_WAIT_S = 3600  # the longest a service's keyword index may take to fill before a line is timed
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
        statement = self.psycopg.sql.SQL("CREATE DATABASE {}").format(self.psycopg.sql.Identifier(name))
        if template is not None:
            source = urllib.parse.urlsplit(template).path.lstrip("/")
            statement += self.psycopg.sql.SQL(" TEMPLATE {}").format(self.psycopg.sql.Identifier(source))
        self.admin.execute(statement)
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
def services(
    dbs: dict[str, str], model_dir: str, base: Path | None = None, agent: str = CALLER
) -> Iterator[dict[str, Process]]:
    """One service per store on its database (and the base tree's on PostgreSQL's), PostgreSQL's keyword index
    filled; stopped on the way out, whatever happens."""
    with contextlib.ExitStack() as stack:
        procs = {store: stack.enter_context(start_service(db, model_dir=model_dir)) for store, db in dbs.items()}
        filling = index_filling(procs["PostgreSQL"], agent, verbose=model_dir == "off")
        if base is not None:
            procs[BEFORE] = stack.enter_context(start_service(dbs["PostgreSQL"], model_dir=model_dir, tree=base))
        filling()
        yield procs


def index_filling(proc: Process, agent: str, verbose: bool) -> Callable[[], None]:
    """One recall at once, while the service's keyword index fills (timed); the call returned waits for the
    index to be full and says how long it took, its file and the service's memory."""
    started, client = time.monotonic(), Client(proc.port, timeout=120)
    query = {"agent": agent, "q": "when did she go to the harbor", "k": K}
    first = time.perf_counter()
    status, body = client.json("GET", "/v1/recall", query=query)
    first_ms = (time.perf_counter() - first) * 1000
    state = client.json("GET", "/health")[1].get("keyword_index")

    def wait() -> None:
        try:
            while client.json("GET", "/health")[1].get("keyword_index") == "filling":
                if time.monotonic() - started > FILL_WAIT_S:
                    raise RuntimeError(f"the keyword index did not fill in {FILL_WAIT_S} s")
                time.sleep(0.2)
            index = client.json("GET", "/v1/stats")[1].get("keyword_index") or {}
            if verbose:
                print(
                    f"  PostgreSQL keyword index: {index.get('filled_rows', 0):,} rows filled in "
                    f"{time.monotonic() - started:.1f} s (the first recall, at once: {status} in {first_ms:.0f} ms, "
                    f"index {state}); file {index.get('file_bytes', 0) / 2**20:.0f} MiB; "
                    f"service RSS {rss_mib(proc):.0f} MiB",
                    flush=True,
                )
        finally:
            client.close()

    return wait


def rss_mib(proc: Process) -> float:
    """The service's resident memory now (Linux /proc)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{proc.popen.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


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
    """write_throughput's clients on each store in turn, two rounds in alternating order: acknowledged writes/s."""
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
    """Who writes when in a round of concurrent writers: the two stores alternate who goes first; with the tree
    before's PostgreSQL (--base), SQLite goes first and the two PostgreSQL services swap, so each follows an SQLite
    run (whose WAL checkpoint may still be writing) once."""
    if BEFORE not in procs:
        return list(STORES) if round_no % 2 == 0 else list(reversed(STORES))
    return ["SQLite", "PostgreSQL", BEFORE] if round_no % 2 == 0 else ["SQLite", BEFORE, "PostgreSQL"]


def show(label: str, figures: dict[str, dict]) -> None:
    """One line per store: p50 and p99, and the ratio (and with --base, the tree before's, and this/before)."""
    lite, pg = (figures[s] for s in STORES)
    before = figures.get(BEFORE)
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
    if before is not None:
        print(
            f"  {'':<34} {'':>6}  PG before p50 {before['p50']:7.2f} p99 {before['p99']:7.2f} ms | "
            f"before/SQLite p50 {before['p50'] / lite['p50']:5.2f}x | "
            f"this/before p50 {pg['p50'] / before['p50']:5.2f}x",
            flush=True,
        )


def measure(
    shape: str, label: str, source: Path, pg: PgServer, args: argparse.Namespace, hybrid: bool, base: Path | None
) -> dict:
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
        if writing and base is not None:  # before any service connects: a template must have no sessions
            base_url = pg.create(f"{shape}_{label}_before", template=url)
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
                with services(dbs, model_dir, base, lines[0][1]["agent"]) as procs:
                    if mode == "hybrid" and not ready_for_hybrid(procs):
                        continue
                    for name, params in lines:
                        key = f"{mode} [{name}]"
                        results[key] = recall_line(procs, queries, args.warmup, params, mode, args.line_seconds)
                        show(key, results[key])
            if writing:  # last: the rows written have no vectors, hybrid would wait
                with contextlib.ExitStack() as stack:
                    procs = stack.enter_context(services(dbs, "off"))  # this tree's two stores
                    if base_url is not None:  # and the tree before's PostgreSQL, on a copy of its own
                        procs[BEFORE] = stack.enter_context(start_service(base_url, model_dir="off", tree=base))
                    results.update(measure_writes(procs, args))
    finally:
        pg.drop(url)
        if base_url is not None:
            pg.drop(base_url)
    return results


def measure_writes(procs: dict[str, Process], args: argparse.Namespace) -> dict[str, dict]:
    """Serial writes, then concurrent writers, on both stores (and the tree before's PostgreSQL, on a copy of the
    database, with --base); printed as they come."""
    shown = [s for s in (*STORES, BEFORE) if s in procs]
    serial = serial_writes(procs, args.writes, CALLER)
    show("serial writes (POST /v1/long)", serial)
    print("  " + " " * 34 + " writes/s: " + "  ".join(f"{s} {serial[s]['per_s']:,.0f}" for s in shown))
    many = concurrent_writes(procs, args.clients, args.write_seconds)
    print(
        f"  {f'{args.clients} writers, acknowledged/s':<34} "
        + "  ".join(
            f"{s} {many[s]['per_s']:,.0f} (p99 {many[s]['p99']:.0f} ms, 5xx {many[s]['5xx']}, "
            f"transport errors {many[s]['errors']})"
            for s in shown
        )
        + "  PG/SQLite "
        + ", ".join(f"{s} {many[s]['per_s'] / many['SQLite']['per_s']:.2f}x" for s in shown[1:]),
        flush=True,
    )
    return {"serial writes": serial, f"{args.clients} writers": many}


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
            before = figures.get(BEFORE)
            throughput = before is not None and "per_s" in before  # the writes' lines; recall's have latency only
            then = f"   before {before['per_s']:,.0f} ({before['per_s'] / lite['per_s']:.2f}x)" if throughput else ""
            if name.endswith(" writers"):
                print(
                    f"  {size:<6}{name + ', writes/s':<36}{lite['per_s']:>11,.0f}{'':>9}"
                    f"{pg['per_s']:>10,.0f}{'':>9}{pg['per_s'] / lite['per_s']:>10.2f}x{then}"
                )
                continue
            print(
                f"  {size:<6}{name:<36}{lite['p50']:>11.2f}{lite['p99']:>9.2f}{pg['p50']:>10.2f}{pg['p99']:>9.2f}"
                f"{pg['p50'] / lite['p50']:>10.2f}x{pg['p99'] / lite['p99']:>7.2f}x"
                + (f"   before p50 {before['p50']:.2f} ({before['p50'] / lite['p50']:.2f}x)" if before else "")
            )
            if name.endswith("serial writes"):
                print(
                    f"  {size:<6}{name + ', writes/s':<36}{lite['per_s']:>11,.0f}{'':>9}"
                    f"{pg['per_s']:>10,.0f}{'':>9}{pg['per_s'] / lite['per_s']:>10.2f}x{then}"
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
    parser.add_argument("--clients", type=int, default=16, help="concurrent writers (default: %(default)s)")
    parser.add_argument(
        "--write-seconds", type=float, default=5, help="concurrent writing per store per round (default: %(default)s)"
    )
    parser.add_argument(
        "--budget-min", type=float, default=15, help="start no size after this many minutes (default: %(default)s)"
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo file (default: %(default)s)")
    parser.add_argument(
        "--base",
        default="none",
        help="git revision or checkout of the tree before, beside on PostgreSQL (default: none)",
    )
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
    pg = PgServer(args.pg_url)
    results: dict[str, dict] = {}
    folder = tempfile.TemporaryDirectory(prefix="solos-compare-base-")
    try:
        base = base_tree(args.base, Path(folder.name))
        if base is not None:
            print(f"this: {ROOT}  before: {args.base} ({base})")
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
            measured = measure(shape, label, source, pg, args, hybrid, base)
            results.setdefault(label, {}).update({f"{shape} {name}": v for name, v in measured.items()})
    finally:
        pg.close()
        folder.cleanup()
    summary(results)
    print(f"\n{machine_note()}; run time {(time.monotonic() - started) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
