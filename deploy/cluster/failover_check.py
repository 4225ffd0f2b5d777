#!/usr/bin/env python3
"""Kill the database leader under 16 writers; count what comes back.

    .venv/bin/python deploy/cluster/failover_check.py [--state DIR] [--whole-node]

Needs a running `cluster.py up` and psycopg. Sixteen threads insert rows with
unique ids through HAProxy's primary port, each remembering the ids whose
INSERT returned (autocommit, so returning means committed and, in
synchronous_mode, flushed on the sync standby). Partway it kills the leader
(`cluster.py kill-leader`), measures how long until a write on a connection
opened after the kill succeeds, then stops and looks every acknowledged id up on the primary.
Loopback only; the run stops by itself (a minute and a half at most, alarm at
two) and exits 0 only if writes came back and nothing acknowledged is missing.
"""

from __future__ import annotations

import argparse
import secrets
import signal
import sys
import threading
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster  # noqa: E402 - the folder beside this file

WRITERS = 16
WARMUP_S = 8.0
# The bar: writes back within 15 s; past this the run gives up and reports a failure.
RECOVERY_DEADLINE_S = 45.0
# Writes keep going this long after they come back, so late failures show.
TAIL_S = 5.0
VERIFY_TIMEOUT_S = 20.0
ALARM_S = 120

TABLE_SQL = """
create table if not exists failover_check (
    id text primary key,
    run text not null,
    writer integer not null,
    at timestamptz not null default clock_timestamp()
)"""


def connect(url: str) -> psycopg.Connection:
    """A connection through HAProxy. No statement_timeout on purpose: a query
    cancelled while waiting for the sync standby reports success for a commit
    that was never replicated, which is exactly what this check must not count."""
    return psycopg.connect(url, autocommit=True, connect_timeout=2)


def scalar(conn: psycopg.Connection, sql: str):
    """The one value a one-row query returns."""
    row = conn.execute(sql).fetchone()
    assert row is not None, sql
    return row[0]


class Writers:
    """Sixteen threads inserting unique ids and keeping the acknowledged ones."""

    def __init__(self, url: str, run: str):
        self.url, self.run = url, run
        self.stop = threading.Event()
        # id, when its connection was opened, when the INSERT returned
        self.acked: list[tuple[str, float, float]] = []
        self.failed: list[tuple[str, float]] = []  # id, failed at: may or may not be in
        self.threads = [threading.Thread(target=self.write, args=(n,), daemon=True) for n in range(WRITERS)]

    def write(self, writer: int) -> None:
        conn = None
        opened = 0.0  # when the current connection's attempt began
        seq = 0
        while not self.stop.is_set():
            seq += 1
            row_id = f"{self.run}-{writer}-{seq}"
            try:
                if conn is None:
                    opened = time.monotonic()
                    conn = connect(self.url)
                conn.execute(
                    "insert into failover_check (id, run, writer) values (%s, %s, %s)", (row_id, self.run, writer)
                )
                self.acked.append((row_id, opened, time.monotonic()))
            except psycopg.Error:
                self.failed.append((row_id, time.monotonic()))
                if conn is not None:
                    conn.close()
                conn = None
                self.stop.wait(0.05)
        if conn is not None:
            conn.close()


def present_ids(url: str, run: str, deadline: float) -> tuple[set[str], str]:
    """Every id of this run on the primary, and the port that answered."""
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with connect(url) as conn:
                if scalar(conn, "select pg_is_in_recovery()"):
                    raise RuntimeError("HAProxy's primary port reached a replica")
                port = scalar(conn, "select inet_server_port()")
                rows = conn.execute("select id from failover_check where run = %s", (run,)).fetchall()
                return {row[0] for row in rows}, str(port)
        except (psycopg.Error, RuntimeError) as error:
            last_error = error
            time.sleep(0.5)
    raise SystemExit(f"could not read the rows back from the primary: {last_error}")


def node_counts(meta: dict, run: str, acked: set[str]) -> list[str]:
    """How many acknowledged ids each node holds (replicas read directly)."""
    lines = []
    for node in meta["nodes"]:
        url = f"postgresql://postgres@127.0.0.1:{node['pg_port']}/{cluster.DATABASE}"
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
                role = "replica" if scalar(conn, "select pg_is_in_recovery()") else "primary"
                ids = {r[0] for r in conn.execute("select id from failover_check where run = %s", (run,))}
            lines.append(f"{node['name']} ({role}): {len(acked & ids)}/{len(acked)} acknowledged rows")
        except psycopg.Error as error:
            lines.append(f"{node['name']}: unreachable ({str(error).strip().splitlines()[0]})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--state",
        type=Path,
        default=cluster.DEFAULT_STATE,
        help=f"the cluster's folder (default: {cluster.DEFAULT_STATE})",
    )
    parser.add_argument(
        "--whole-node",
        action="store_true",
        help="kill the leader's Patroni too, forcing a failover to another node"
        " (default: the postmaster only, which Patroni restarts in place)",
    )
    args = parser.parse_args(argv)
    signal.alarm(ALARM_S)  # the backstop: whatever hangs, the run ends

    meta = cluster.load_meta(args.state.resolve())
    url = cluster.primary_url(meta)
    run = secrets.token_hex(4)
    with connect(url) as conn:
        conn.execute(TABLE_SQL)
    before = cluster.leader(meta)

    writers = Writers(url, run)
    for thread in writers.threads:
        thread.start()
    time.sleep(WARMUP_S)
    acked_before_kill = len(writers.acked)
    killed = cluster.kill_leader(meta, args.whole_node)
    killed_at = time.monotonic()

    recovered_at = None
    while time.monotonic() < killed_at + RECOVERY_DEADLINE_S:
        if recovered_at is None:
            # Writes on connections older than the kill can still be acknowledged
            # for a moment by the dying server's backends (the sync standby
            # confirms before they notice the postmaster is gone); they say
            # nothing about recovery, so only new connections count.
            after_kill = [done for _, opened, done in list(writers.acked) if opened > killed_at]
            if after_kill:
                recovered_at = min(after_kill)
        elif time.monotonic() > recovered_at + TAIL_S:
            break
        time.sleep(0.05)
    writers.stop.set()
    for thread in writers.threads:
        thread.join(timeout=max(0.1, killed_at + RECOVERY_DEADLINE_S + 10 - time.monotonic()))
    stuck = sum(thread.is_alive() for thread in writers.threads)
    ended_at = time.monotonic()

    acked = {row_id for row_id, _, _ in writers.acked}
    present, port = present_ids(url, run, time.monotonic() + VERIFY_TIMEOUT_S)
    lost = acked - present
    failed_but_in = {row_id for row_id, _ in writers.failed} & present
    done_times = sorted(done for _, _, done in writers.acked)
    gaps = [b - a for a, b in zip(done_times, done_times[1:])]
    after = cluster.leader(meta)

    print(
        f"leader before: {before['name'] if before else '?'}; killed {killed['name']}"
        f" (postmaster {killed['postmaster_pid']}"
        + (f", patroni {killed['patroni_pid']})" if "patroni_pid" in killed else ")")
        + f"; leader after: {after['name'] if after else '?'} (primary port now reaches {port})"
    )
    print(f"writers: {WRITERS}, {acked_before_kill / WARMUP_S:.0f} writes/s before the kill")
    if recovered_at is None:
        print(f"recovery: writes did NOT come back within {RECOVERY_DEADLINE_S:.0f} s")
    else:
        print(
            f"recovery: first write on a new connection acknowledged {recovered_at - killed_at:.2f} s"
            f" after it; longest gap between acknowledgements {max(gaps, default=0):.2f} s"
        )
    print(
        f"acknowledged: {len(acked)}; failed attempts: {len(writers.failed)}"
        f" (of which committed anyway: {len(failed_but_in)}); writers stuck at the end: {stuck}"
    )
    print(f"lost (acknowledged, missing on the primary): {len(lost)}")
    time.sleep(1)  # replicas apply shortly after the sync standby's flush acknowledged
    for line in node_counts(meta, run, acked):
        print(f"  {line}")
    print(f"run {run}: {ended_at - killed_at + WARMUP_S:.1f} s of writes")
    return 0 if recovered_at is not None and not lost else 1


if __name__ == "__main__":
    sys.exit(main())
