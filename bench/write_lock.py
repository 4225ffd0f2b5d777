#!/usr/bin/env python3
"""How long the service's own bulk and background writes hold SQLite's write lock, seen from an agent.

On a copy of the 100k-row fleet database (bench/gen_db.py's cache; an older
schema's copy is migrated first, and that migration is one of the paths), a
stand-in agent in a process of its own, with its own sqlite3 connection and
busy_timeout 5000 like the fleet's agents, makes one small write (BEGIN
IMMEDIATE, an INSERT into a scratch table, COMMIT) every 10 ms and notes how
long each took. Meanwhile this process runs, one after another, each write
path that can touch many rows: every daily job (purge, archive, snapshot),
the event log's expiry sweep and prune, the delivery log's purge, reindex,
the additive migration (the current schema, and one that adds a keyword
index over 100k rows), the keyword index merge and WAL checkpoint after a
forget, backfill with the embedder (if it loads; at most --backfill-s
seconds), a restore of a snapshot under a running service (--force), and
the largest write one request makes (a promotion of 100 episodes). Before
each path's window its rows are set up (old events and deliveries, 50k
expired short rows); the setup is not in the window.

Per path: the agent's writes in the window, their p50, p99 and worst wait
(the longest write-lock hold the agent met), the writes that failed past
the busy timeout, and the path's own wall time; first the floor (nothing
running). Loopback only, a temporary folder, stops by itself.

    .venv/bin/python bench/write_lock.py [--rows 100k] [--only purge,archive] [--backfill-s 20]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import gen_db  # noqa: E402

import solos_events  # noqa: E402
import solos_forget  # noqa: E402
import solos_jobs  # noqa: E402
import solos_lifecycle  # noqa: E402
import solos_snapshot  # noqa: E402
import solos_store  # noqa: E402

AGENT_PERIOD_S = 0.010
BUSY_TIMEOUT_MS = 5000
SCRATCH = "bench_agent_scratch"
NOTICED_MS = 100  # a wait an agent's turn notices


HOLDS: list[tuple[float, float]] = []  # (ended, held s) of each of this process's write transactions


def timed_writes() -> None:
    """Note how long each of the store's write transactions (and forget's checkpoint) ran, from this side."""
    attempt, clear = solos_store.Store.attempt, solos_store.Store.clear_forgotten

    def timed(original: Callable) -> Callable:
        def wrapper(self: solos_store.Store, *args, **kwargs):  # noqa: ANN202
            started = time.monotonic()
            try:
                return original(self, *args, **kwargs)
            finally:
                HOLDS.append((time.monotonic(), time.monotonic() - started))

        return wrapper

    def attempt_timed(self: solos_store.Store, work: Callable, write: bool, deadline: float):  # noqa: ANN202
        return (timed(attempt) if write else attempt)(self, work, write, deadline)

    solos_store.Store.attempt = attempt_timed  # type: ignore[method-assign]
    solos_store.Store.clear_forgotten = timed(clear)  # type: ignore[method-assign]


def agent(path: str, stop: multiprocessing.synchronize.Event, out: multiprocessing.queues.Queue) -> None:
    """The stand-in agent: a small write every 10 ms; (started, waited s, ok) per write, sent when stopped."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    samples = []
    next_at = time.monotonic()
    while not stop.is_set():
        started = time.monotonic()
        ok = True
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(f"INSERT INTO {SCRATCH} (note) VALUES ('agent')")
            conn.execute("COMMIT")
        except sqlite3.OperationalError:
            ok = False
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        samples.append((started, time.monotonic() - started, ok))
        next_at = max(next_at + AGENT_PERIOD_S, time.monotonic())
        time.sleep(max(0.0, next_at - time.monotonic()))
    conn.close()
    out.put(samples)


def source_db(rows: int) -> Path:
    """The cached database of this schema, or else the newest cache of that size (migrated on the copy)."""
    current = gen_db.cache_path(rows, 7, "zipf")
    if current.exists() and current.stat().st_size:
        return current
    label = gen_db.size_label(rows)
    pattern = f"fleet-v{gen_db.GEN_VERSION}-*-{label}-seed7-vocabzipf.db"
    found = sorted((p for p in gen_db.CACHE_DIR.glob(pattern) if p.stat().st_size), key=os.path.getmtime)
    if not found:
        return gen_db.ensure_db(rows)
    return found[-1]


def copy_db(source: Path, target: Path) -> None:
    """A consistent copy of the cache (its WAL included), never writing to the cache."""
    src = sqlite3.connect(f"{source.absolute().as_uri()}?mode=ro", uri=True)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        src.close(), dst.close()


def setup_conn(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def chunked(conn: sqlite3.Connection, sql: str, params: list[tuple], size: int = 2000) -> None:
    """Setup writes, a short transaction per chunk (the agent runs during setup too, outside the windows)."""
    for start in range(0, len(params), size):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(sql, params[start : start + size])
        conn.execute("COMMIT")


def stamp(unix: float) -> str:
    return solos_jobs.stamp(unix)


# ==== The paths: (name, setup, run) ====


def make_paths(path: Path, store_box: list, folder: Path, backfill_s: float) -> list[tuple[str, Callable, Callable]]:
    db = str(path)

    def store() -> solos_store.Store:
        return store_box[0]

    def nothing() -> None:
        return None

    def floor() -> int:
        time.sleep(3.0)
        return 0

    def migrate_current() -> int:
        solos_store.Store(db, BUSY_TIMEOUT_MS, admin=True).migrate()
        return 0

    def drop_episodic_index() -> None:  # as a database from before that keyword index would be
        conn = setup_conn(path)
        conn.execute("DROP TABLE memory_episodic_fts")
        conn.close()

    def expire_setup() -> None:
        conn = setup_conn(path)
        past = time.time() - 3600
        rows = [
            (
                f"bench-agent-{i % 20}",
                f"bench-ttl-{i}",
                f"a short note number {i} about task {i % 97}",
                "[]",
                stamp(past - 86_400),
                stamp(past + i * 0.01),
            )
            for i in range(50_000)
        ]
        agents = sorted({row[0] for row in rows})
        conn.executemany("INSERT INTO agent_registry (agent) VALUES (?) ON CONFLICT DO NOTHING", [(a,) for a in agents])
        chunked(
            conn,
            "INSERT INTO memory_short (agent, key, value, tags, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )
        conn.execute(
            "INSERT INTO solos_memory_meta (key, value) VALUES ('events_expired_through', ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (stamp(past - 60),),
        )
        conn.close()

    def sweep() -> int:
        return store().write(lambda conn: store().queries.sweep_expired(conn, lambda *_: None))

    def purge() -> int:
        return solos_jobs.recorded(db, "purge", lambda: solos_forget.purge(store()))  # the job as `purge` runs it

    def old_logs_setup() -> None:
        conn = setup_conn(path)
        old = stamp(time.time() - 200 * 86_400)
        chunked(
            conn,
            "UPDATE memory_event SET ts = ? WHERE id BETWEEN ? AND ?",
            [(old, i, i + 999) for i in range(0, 120_000, 1000)],
            size=10,
        )
        deliveries = [(f"reader-{i % 50}", "long", i % 10_000 + 1, f"writer-{i % 40}", old) for i in range(100_000)]
        chunked(
            conn,
            "INSERT INTO memory_delivery (reader, tier, row_id, writer, delivered_at) VALUES (?, ?, ?, ?, ?)",
            deliveries,
            size=5000,
        )
        conn.close()

    def prune_events() -> int:
        hub = object.__new__(solos_events.EventHub)
        hub.store, hub.own, hub.own_lock = store(), store().connect(), __import__("threading").Lock()
        try:
            return hub.prune()
        finally:
            hub.own.close()

    def archive() -> int:
        conn = setup_conn(path)
        times = [row[0] for row in conn.execute("SELECT timestamp FROM memory_episodic ORDER BY timestamp")]
        conn.close()
        median = solos_jobs.seconds(times[len(times) // 2])
        days = (time.time() - median) / 86_400  # about half the episodes move
        return solos_jobs.recorded(db, "archive", lambda: solos_lifecycle.archive_episodic(store(), days))

    def merge_after_forget() -> int:
        scrubber = solos_forget.Scrubber(store())
        for fts in solos_store.FTS_TABLES:
            scrubber.merge(fts)
        return int(scrubber.checkpoint())

    def reindex() -> int:
        store().reindex()
        return 0

    def promote() -> int:  # the largest write one request makes: 100 episodes into one fact
        conn = setup_conn(path)
        agent_name, *_ = conn.execute(
            "SELECT agent FROM memory_episodic GROUP BY agent ORDER BY count(*) DESC"
        ).fetchone()
        ids = [r[0] for r in conn.execute("SELECT id FROM memory_episodic WHERE agent = ? LIMIT 100", (agent_name,))]
        conn.close()

        def work(conn: sqlite3.Connection) -> int:
            fact = "; ".join(f"episode {i}" for i in ids)
            long_id = store().insert_long(conn, agent_name, "bench", fact, "bench", 0.5, ["promoted"])
            store().queries.link_promotion(conn, long_id, ids, agent_name)
            return long_id

        return store().write(work)

    def snapshot() -> int:
        take = lambda: solos_snapshot.take_snapshot(db, folder, 3, BUSY_TIMEOUT_MS)  # noqa: E731
        taken = solos_jobs.recorded(db, "snapshot", take, lambda done: sum(done["rows"].values()))
        return sum(taken["rows"].values())

    def restore() -> int:
        named = sorted(folder.glob("*.db"))[-1]
        migrate = lambda p: solos_store.Store(str(p), BUSY_TIMEOUT_MS, admin=True).migrate()  # noqa: E731
        done = solos_snapshot.restore_snapshot(named, path, solos_store.SCHEMA_VERSION, BUSY_TIMEOUT_MS, migrate, True)
        return done["discarded_rows"]

    def backfill() -> int:
        try:
            import solos_embed

            embedder = solos_embed.load_embedder(threads=1)
        except Exception as error:  # ImportError, EmbeddingsUnavailable: the path is skipped, and says why
            print(f"  backfill skipped: {error}")
            return -1
        deadline = time.monotonic() + backfill_s

        class Bounded:  # the embedder, stopped at the deadline: embed_missing resumes where it stopped
            model_id = embedder.model_id

            def embed(self, texts: list[str]) -> list:
                if time.monotonic() > deadline:
                    raise TimeoutError
                return embedder.embed(texts)

        done = [0]
        try:
            import solos_embed_worker

            solos_embed_worker.embed_missing(
                store(), Bounded(), solos_embed_worker.EMBED_BATCH, lambda n: done.__setitem__(0, n)
            )
        except TimeoutError:
            pass
        return done[0]

    return [
        ("floor (nothing)", nothing, floor),
        ("migrate (current schema)", nothing, migrate_current),
        ("migrate (new keyword index, 100k)", drop_episodic_index, migrate_current),
        ("expiry sweep (50k short rows)", expire_setup, sweep),
        ("purge job (50k short, 100k deliveries)", old_logs_setup, purge),
        ("event prune (111k events)", nothing, prune_events),
        ("archive job (half the episodes)", nothing, archive),
        ("merge + checkpoint after forget", nothing, merge_after_forget),
        ("largest request (promote 100)", nothing, promote),
        ("reindex (all keyword indexes)", nothing, reindex),
        ("backfill (embedder)", nothing, backfill),
        ("snapshot job", nothing, snapshot),
        ("restore --force", nothing, restore),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="100k", help="fleet database size (default: %(default)s)")
    parser.add_argument("--only", default="", help="comma-separated path names' first words (default: all)")
    parser.add_argument("--backfill-s", type=float, default=20.0, help="backfill's bound (default: %(default)s)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    source = source_db(gen_db.parse_size(args.rows))
    with tempfile.TemporaryDirectory(prefix="write-lock-") as tmp:
        path = Path(tmp) / "solos.db"
        folder = Path(tmp) / "snapshots"
        print(f"copying {source.name} ...", flush=True)
        copy_db(source, path)
        conn = setup_conn(path)
        conn.execute("PRAGMA journal_mode=wal")
        conn.execute(f"CREATE TABLE IF NOT EXISTS {SCRATCH} (id INTEGER PRIMARY KEY, note TEXT)")
        conn.close()
        if source != gen_db.cache_path(gen_db.parse_size(args.rows), 7, "zipf"):
            solos_store.Store(str(path), BUSY_TIMEOUT_MS, admin=True).migrate()  # an older cache's schema
        store_box = [solos_store.Store(str(path), BUSY_TIMEOUT_MS, admin=True)]
        paths = make_paths(path, store_box, folder, args.backfill_s)
        only = [word.strip() for word in args.only.split(",") if word.strip()]
        stop, out = multiprocessing.Event(), multiprocessing.Queue()
        worker = multiprocessing.Process(target=agent, args=(str(path), stop, out), daemon=True)
        worker.start()
        timed_writes()
        time.sleep(1.0)
        windows = []
        try:
            for name, setup, run in paths:
                if only and not name.startswith("floor") and not any(name.startswith(word) for word in only):
                    continue
                setup()
                time.sleep(0.3)
                began = time.monotonic()
                result = run()
                ended = time.monotonic()
                windows.append((name, began, ended, result))
                print(f"  {name}: {ended - began:.1f} s ({result} rows)", flush=True)
                if name.startswith("restore"):  # the store's pooled connections saw the old file
                    store_box[0].close()
                    store_box[0] = solos_store.Store(str(path), BUSY_TIMEOUT_MS, admin=True)
                time.sleep(0.3)
        finally:
            stop.set()
            samples = out.get(timeout=60)
            worker.join(10)
        store_box[0].close()
    report(windows, samples, source.name, args.json)
    return 0


def report(windows: list, samples: list, source: str, json_path: str | None) -> None:
    load = os.getloadavg()
    print(
        f"\nstand-in agent: a write every {AGENT_PERIOD_S * 1000:.0f} ms, busy_timeout {BUSY_TIMEOUT_MS} ms; "
        f"database {source}; load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} cores"
    )
    header = (
        f"{'path':40} {'wall s':>7} {'writes':>6} {'p50 ms':>7} {'p99 ms':>7} {'worst ms':>9} {'>100ms':>6} "
        f"{'failed':>6} {'txs':>5} {'longest tx':>10}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for name, began, ended, _ in windows:
        # a write that began in the window, or was waiting as it opened
        waits = [(w, ok) for t, w, ok in samples if began <= t + w and t <= ended]
        ms = sorted(w * 1000 for w, _ in waits) or [0.0]
        row = {
            "path": name,
            "wall_s": round(ended - began, 2),
            "writes": len(waits),
            "p50_ms": round(statistics.median(ms), 1),
            "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 1),
            "worst_ms": round(ms[-1], 1),
            "noticed": sum(1 for m in ms if m > NOTICED_MS),
            "failed": sum(1 for _, ok in waits if not ok),
            "transactions": sum(1 for end, _ in HOLDS if began <= end <= ended),
            "longest_tx_ms": round(max([held * 1000 for end, held in HOLDS if began <= end <= ended] or [0.0]), 1),
        }
        rows.append(row)
        print(
            f"{name:40} {row['wall_s']:7.1f} {row['writes']:6d} {row['p50_ms']:7.1f} {row['p99_ms']:7.1f} "
            f"{row['worst_ms']:9.1f} {row['noticed']:6d} {row['failed']:6d} {row['transactions']:5d} "
            f"{row['longest_tx_ms']:10.1f}"
        )
    if json_path:
        Path(json_path).write_text(json.dumps({"load": load, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
