#!/usr/bin/env python3
"""Where a serial PostgreSQL write spends its time, beside SQLite's: in the server, in round trips, in the
synchronous standby's flush.

    .venv/bin/python bench/pg_write_profile.py [--writes 400] [--no-standby]

In-process, on a throwaway PostgreSQL server of its own (tests/pg_server.py: Debian's PostgreSQL, stock
settings, fsync on, loopback) and an SQLite file beside it (WAL, synchronous=FULL: one fdatasync per commit),
each with the service's schema and one registered agent:

  server    one long fact's INSERT in a loop inside the server (a DO block, rolled back): with its triggers,
            without the keyword index's (the tsvector), without any; and the one-statement write
            (solos_write_long) the service calls, per row in microseconds. Then the same calls each in a
            transaction of its own, as the service makes them: the server process's CPU per call
            (/proc/<pid>/schedstat), which counts what PostgreSQL does once per transaction and the loop hides
  writes    serial long-fact writes through the stores, taking turns: SQLite's Store.upsert_long; PgStore's
            one statement (one round trip, its COMMIT the statement's own); Store's steps on PostgreSQL (the
            statements one by one, BEGIN to COMMIT: 7 round trips); p50 and mean wall ms and the client's CPU
  services  the same writes through the services (POST /v1/long, one kept-alive connection each, taking turns):
            SQLite's and PostgreSQL's of this tree, and with --base the tree before's on a database of its own; per
            write the wall (p50, mean, writes/s against SQLite's), the CPU of the service's process and of its
            database's server processes (/proc), and the time PostgreSQL spent executing the write's statements
            (pg_stat_statements, preloaded in this run's server), and the server's WAL flushes (pg_stat_wal): the
            rest of the wall is the round trips and waiting for a CPU (--no-services: skip)
  standby   the writes again once a streaming standby is named in synchronous_standby_names, as the cluster's
            synchronous mode does (deploy/cluster/): every commit waits for its flush (--no-standby: skip)

bench/store_compare.py runs the acceptance line (serial writes/s against SQLite's, with the tree before). Prints
the figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from harness import ROOT, Client, base_tree, machine_note, percentiles, start_service

sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import solos_store  # noqa: E402

AGENT, TOPIC = "atlas", "bench writes"
FACT = "Store bench write {n} at {stamp}: the nightly backup of grafana.internal ran in 41 s"
LOOP_ROWS = 1000
STANDBY = "bench_standby"
TICK_S = 1 / os.sysconf("SC_CLK_TCK")  # /proc's unit of CPU time


def server_side(conn) -> dict[str, float]:
    """Microseconds per row of one long fact's INSERT in a server-side loop, triggers on and off, and of the
    service's one-statement write; in a transaction rolled back."""
    fact = FACT.format(n="' || i || '", stamp=time.time())
    insert = "INSERT INTO memory_longterm (agent, topic, fact, tags) VALUES ('{0}', '{1}', '{2}', '[]')"
    write = "PERFORM solos_write_long('{0}', i, md5(i::text), '{1}', 'w {2}', NULL, NULL, '[]', NULL, NULL)"
    bodies = {
        "INSERT, its triggers": insert.format(AGENT, TOPIC, fact),
        "solos_write_long (the service's write)": write.format(AGENT, TOPIC, fact),
    }
    figures: dict[str, float] = {}
    notices: list[str] = []
    conn.add_notice_handler(lambda notice: notices.append(notice.message_primary))

    def loop(label: str, body: str) -> None:
        conn.execute(
            f"DO $loop$ DECLARE t0 timestamptz := clock_timestamp(); BEGIN FOR i IN 1..{LOOP_ROWS} LOOP {body}; "
            f"END LOOP; RAISE NOTICE '%', extract(epoch FROM clock_timestamp() - t0) * 1e6 / {LOOP_ROWS}; END $loop$"
        )
        figures[label] = float(notices[-1])

    conn.execute("BEGIN")
    try:
        for label, body in bodies.items():
            loop(label, body)
        conn.execute("ALTER TABLE memory_longterm DISABLE TRIGGER memory_longterm_fts")
        loop("INSERT, no keyword-index trigger", bodies["INSERT, its triggers"])
        conn.execute("ALTER TABLE memory_longterm DISABLE TRIGGER memory_longterm_changed")
        loop("INSERT, no trigger", bodies["INSERT, its triggers"])
    finally:
        conn.execute("ROLLBACK")
    return figures


def one_transaction_each(url: str, count: int) -> dict[str, float]:
    """Microseconds of the server process's CPU per call, each call its own transaction as the service's writes are
    (/proc/<pid>/schedstat: nanoseconds, on this run's own server): what the loop above hides, since PostgreSQL
    keeps some work for a transaction (a non-inlined SQL function's plan, a PL/pgSQL expression's state)."""
    import psycopg

    fact = FACT.replace("{n}", "{n} each").replace("{stamp}", str(time.time()))
    calls = {
        "solos_write_long (the service's write)": (
            "SELECT * FROM solos_write_long(%s, %s, md5(%s), %s, %s, NULL, NULL, '[]', NULL, NULL)",
            lambda n: (AGENT, n, str(n), TOPIC, fact.format(n=n)),
        ),
        "INSERT, its triggers": (
            "INSERT INTO memory_longterm (agent, topic, fact, tags) VALUES (%s, %s, %s, '[]')",
            lambda n: (AGENT, TOPIC, fact.format(n=f"insert {n}")),
        ),
        "SELECT 1 (a round trip's floor)": ("SELECT 1", lambda n: ()),
    }
    figures = {}
    with psycopg.connect(url, autocommit=True) as conn:
        pid = conn.info.backend_pid
        for label, (sql, params) in calls.items():
            for n in range(20):  # the session's first calls compile and plan
                conn.execute(sql, params(-1 - n - 100 * len(figures)))
            before = backend_ns(pid)
            for n in range(count):
                conn.execute(sql, params(n + 1_000_000 * len(figures)))
            figures[label] = (backend_ns(pid) - before) / count / 1000
    return figures


def backend_ns(pid: int) -> int:
    """A process's CPU time so far in nanoseconds (/proc/<pid>/schedstat)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def serial(writers: dict[str, Callable[[str], object]], count: int) -> dict[str, dict]:
    """Each writer writes a new fact in turn (who goes first rotates): wall ms and the client's CPU ms."""
    walls: dict[str, list[float]] = {name: [] for name in writers}
    cpus: dict[str, float] = dict.fromkeys(writers, 0.0)
    names, stamp = list(writers), time.time()
    for n in range(count):
        for name in names[n % len(names) :] + names[: n % len(names)]:
            cpu, started = time.thread_time(), time.perf_counter()
            writers[name](FACT.format(n=f"{name} {n}", stamp=stamp))
            walls[name].append(time.perf_counter() - started)
            cpus[name] += time.thread_time() - cpu
    return {name: {**percentiles(walls[name]), "cpu": cpus[name] / count * 1000} for name in writers}


def show(title: str, figures: dict[str, dict]) -> None:
    lite = figures["SQLite"]
    print(f"\n{title}")
    for name, f in figures.items():
        print(
            f"  {name:<36} p50 {f['p50']:6.3f}  mean {f['mean']:6.3f} ms  client CPU {f['cpu']:5.3f} ms  "
            f"p50 / SQLite's {f['p50'] / lite['p50']:4.2f}x",
            flush=True,
        )


def cpu_s(pid: int) -> float:
    """A process's user and system CPU so far (/proc), 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * TICK_S


def server_cpu_s(root, database: str) -> float:
    """The CPU so far of the server processes connected to `database`."""
    pids = root.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (database,)).fetchall()
    return sum(cpu_s(pid) for (pid,) in pids)


def statement_ms(root, database: str) -> float:
    """The time the database's top-level statements executed so far (pg_stat_statements), in ms."""
    return root.execute(
        "SELECT coalesce(sum(s.total_exec_time), 0) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
        "WHERE d.datname = %s AND s.toplevel",
        (database,),
    ).fetchone()[0]


def through_services(dbs: dict[str, tuple[str, Path]], root, count: int) -> None:
    """POST /v1/long through each service ({name: (database, tree)}) in turn, who goes first rotating; per write:
    the wall, the CPU of the service and of its database's server processes, and the statements' time."""
    with contextlib.ExitStack() as stack:
        procs = {
            name: stack.enter_context(start_service(db, register=AGENT, tree=tree)) for name, (db, tree) in dbs.items()
        }
        databases = {name: db.rsplit("/", 1)[1] for name, (db, _) in dbs.items() if db.startswith("postgresql")}
        clients = {name: Client(proc.port, timeout=60) for name, proc in procs.items()}
        walls: dict[str, list[float]] = {name: [] for name in procs}
        time.sleep(1.0)  # the keyword index fills (a database of a few rows)
        cpu = {name: cpu_s(proc.popen.pid) for name, proc in procs.items()}
        server = {name: server_cpu_s(root, database) for name, database in databases.items()}
        executed = {name: statement_ms(root, database) for name, database in databases.items()}
        flushes = wal_syncs(root)
        names, stamp = list(procs), time.time()
        for n in range(count):
            for name in names[n % len(names) :] + names[: n % len(names)]:
                body = {"agent": AGENT, "topic": TOPIC, "fact": FACT.format(n=f"{name} {n}", stamp=stamp)}
                started = time.perf_counter()
                status, answer = clients[name].json("POST", "/v1/long", body)
                walls[name].append(time.perf_counter() - started)
                if status != 201:
                    raise SystemExit(f"{name} answered {status}: {answer}")
        for client in clients.values():
            client.close()
        lite = count / sum(walls["SQLite"])
        for name in names:
            f, per_s = percentiles(walls[name]), count / sum(walls[name])
            line = (
                f"  {name:<28} p50 {f['p50']:5.2f}  mean {f['mean']:5.2f} ms  {per_s:5.0f}/s ({per_s / lite:4.2f}x)  "
                f"CPU ms a write: service {(cpu_s(procs[name].popen.pid) - cpu[name]) / count * 1000:4.2f}"
            )
            if name in databases:
                used = server_cpu_s(root, databases[name]) - server[name]
                ran = statement_ms(root, databases[name]) - executed[name]
                line += f", server {used / count * 1000:4.2f}; statements {ran / count:4.2f} ms a write"
            print(line, flush=True)
        syncs, sync_ms = (after - before for after, before in zip(wal_syncs(root), flushes))
        written = count * len(databases)
        print(
            f"  the server's WAL flushes (every database): {syncs / written:.2f} a write, "
            f"{sync_ms / max(syncs, 1):.2f} ms each",
            flush=True,
        )


def wal_syncs(root) -> tuple[int, float]:
    """The server's WAL flushes so far and the ms they took (pg_stat_wal, track_wal_io_timing on)."""
    return root.execute("SELECT wal_sync, wal_sync_time FROM pg_stat_wal").fetchone()


def wait_for_sync(admin, name: str) -> None:
    """Until the standby streams as the synchronous one (pg_stat_replication), at most 30 s."""
    deadline = time.monotonic() + 30
    while ("sync",) not in admin.execute(
        "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s", (name,)
    ).fetchall():
        if time.monotonic() > deadline:
            raise SystemExit(f"the standby {name} did not become synchronous in 30 s")
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--writes", type=int, default=400, help="serial writes per store and line (default: %(default)s)"
    )
    parser.add_argument("--no-standby", action="store_true", help="skip the synchronous standby's line")
    parser.add_argument("--no-services", action="store_true", help="skip the writes through the services")
    parser.add_argument(
        "--base",
        default="none",
        help="git revision or checkout of the tree before, in the services' line (default: none)",
    )
    args = parser.parse_args()
    try:
        import psycopg
        from pg_server import ThrowawayPostgres, unavailable_reason

        import solos_store_pg
    except ImportError as error:
        raise SystemExit(f"pg_write_profile.py needs psycopg ({error}): run it with .venv/bin/python") from None
    if reason := unavailable_reason():
        raise SystemExit(f"no PostgreSQL: {reason}")
    print(machine_note())
    with ThrowawayPostgres() as server, tempfile.TemporaryDirectory(prefix="solos-bench-") as scratch:
        with psycopg.connect(server.url, autocommit=True) as root:  # the statements' time, for the services' line
            root.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
            root.execute("ALTER SYSTEM SET track_wal_io_timing = on")  # pg_stat_wal's flush times
        server.stop()
        server.start()
        root = psycopg.connect(server.url, autocommit=True)
        root.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        url = server.fresh_database()
        admin = solos_store_pg.PgStore(url, admin=True)
        admin.migrate()
        admin.register_agents([AGENT])
        lite = solos_store.Store(str(Path(scratch) / "solos.db"), admin=True)
        lite.migrate()
        lite.register_agents([AGENT])
        pg = solos_store_pg.PgStore(url)
        standby = None
        try:
            conn = admin.checkout()
            try:
                version = conn.execute("SHOW server_version").fetchone()[0]
                print(f"PostgreSQL {version}, a throwaway server of this run (stock settings, fsync on)")
                print(f"\nserver side: microseconds per row, {LOOP_ROWS} rows in a loop")
                for label, us in server_side(conn).items():
                    print(f"  {label:<40} {us:7.1f} us")
            finally:
                admin.checkin(conn)
            print(f"\nserver side: the server process's CPU per call, {args.writes} calls, a transaction each")
            for label, us in one_transaction_each(url, args.writes).items():
                print(f"  {label:<40} {us:7.1f} us", flush=True)
            writers = {
                "SQLite": lambda fact: lite.upsert_long(AGENT, TOPIC, fact, None, None, []),
                "PostgreSQL, one statement": lambda fact: pg.upsert_long(AGENT, TOPIC, fact, None, None, []),
                "PostgreSQL, Store's steps": lambda fact: solos_store.Store.upsert_long(
                    pg, AGENT, TOPIC, fact, None, None, []
                ),
            }
            show(f"serial writes, {args.writes} each, taking turns", serial(writers, args.writes))
            if not args.no_services:
                dbs = {
                    "SQLite": (str(Path(scratch) / "services.db"), ROOT),
                    "PostgreSQL": (server.fresh_database(), ROOT),
                }
                base = base_tree(args.base, Path(scratch))
                if base is not None:
                    dbs["PostgreSQL, the tree before"] = (server.fresh_database(), base)
                print(f"\nthrough the services, {args.writes} writes each, taking turns")
                through_services(dbs, root, args.writes)
            if not args.no_standby:
                standby = server.start_standby(STANDBY)
                with psycopg.connect(server.url, autocommit=True) as root:
                    root.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY}'")
                    root.execute("SELECT pg_reload_conf()")
                    wait_for_sync(root, STANDBY)
                show("the same with a synchronous standby (its flush in every commit)", serial(writers, args.writes))
        finally:
            pg.close()
            admin.close()
            lite.close()
            root.close()
            if standby is not None:
                standby.send_signal(signal.SIGINT)
                standby.wait(30)
    print(f"\n{machine_note()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
