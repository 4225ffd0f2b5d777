"""solos_copies: several copies of the service over one PostgreSQL database, and how they take turns.

One copy runs on each host, bound to its own loopback; the copies never talk to each other, only to the
database, so everything they must agree on goes through it:

- Background work runs on one copy at a time, under advisory locks (LOCK_CLASS): the expiry sweep and the
  event pruning skip a round another copy is doing, the VACUUM after a forget waits for the scrubber's next
  round, and each daily job runs once per period across the cluster (`job_lock`; solos_jobs.recorded says
  when it skips). A session's lock dies with it: a job whose copy died stays 'running' in memory_job_run with
  its lock free, which `job_running` tells solos_jobs.status, and the next run does it again.
- The embedder claims the rows it embeds (memory_embed_claim, CLAIM_SQL), so no two copies embed one row.
- Each copy's event hub is woken by LISTEN/NOTIFY (`Listener`) when any copy, or the fleet, commits an event;
  the hub's own poll stays the safety net. The service's own writes NOTIFY after their commit (`Notifier`), so
  concurrent writers do not queue for each other's WAL flush.

Imported by solos_store_pg only, so psycopg 3 is needed only for a PostgreSQL database. Its SQL runs on
solos_store_pg's connections (sqlite3's `?` placeholders).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from solos_store import log_event

# ==== Advisory locks: one copy at a time ====

# pg_advisory_lock(LOCK_CLASS, key): the two-integer form, so pg_locks shows them as classid 8437, objsubid 2,
# apart from the migration lock (solos_store_pg.MIGRATION_LOCK, the one-bigint form) and the write keys.
LOCK_CLASS = 8437
EXPIRY_SWEEP, EVENT_PRUNE, FORGET_VACUUM = 1, 2, 3
# Fixed numbers, so copies of different releases agree; a job not named here gets one from its name.
JOB_KEYS = {"purge": 101, "archive": 102, "snapshot": 103}


def job_key(job: str) -> int:
    return JOB_KEYS.get(job) or 1000 + zlib.crc32(job.encode()) % 1_000_000


def try_turn(conn: Any, key: int) -> bool:
    """This transaction's turn at `key`, if no other copy holds it now; it ends with the transaction."""
    return bool(conn.execute("SELECT pg_try_advisory_xact_lock(?, ?)", (LOCK_CLASS, key)).fetchone()[0])


def hold_turn(conn: Any, key: int) -> bool:
    """This session's turn at `key` until the connection closes, if no other copy holds it now."""
    return bool(conn.execute("SELECT pg_try_advisory_lock(?, ?)", (LOCK_CLASS, key)).fetchone()[0])


# The server's TCP keepalive on a job's turn connection, which is idle for the whole run: a host that dies without
# a word (power, a cut network) is noticed by the server after idle + interval * count seconds, which ends the
# session and frees the turn (the run then shows failed). The server's default is the kernel's, 2 h 11 min.
# Per session and over TCP only (a Unix socket's peer is the server's own host).
KEEPALIVE = {"tcp_keepalives_idle": 60, "tcp_keepalives_interval": 10, "tcp_keepalives_count": 6}


def dead_turn_s() -> int:
    """The most a dead host's job's turn outlives it (the server's keepalive probes all unanswered)."""
    return KEEPALIVE["tcp_keepalives_idle"] + KEEPALIVE["tcp_keepalives_interval"] * KEEPALIVE["tcp_keepalives_count"]


@contextlib.contextmanager
def job_lock(connect: Callable[[], Any], job: str) -> Iterator[bool]:
    """Hold the job's turn for the whole run on a connection of its own (True), or say another copy holds it
    (False). The connection closes after the run, freeing the turn, as the death of the copy would: the server
    probes it (KEEPALIVE), so a host that dies silently frees it within dead_turn_s()."""
    conn = connect()
    try:
        for name, seconds in KEEPALIVE.items():
            conn.execute(f"SET {name} = {int(seconds)}")
        yield hold_turn(conn, job_key(job))
    finally:
        conn.close()


def job_running(conn: Any, job: str) -> bool:
    """Whether a session holds the job's lock now: a run recorded 'running' without it has died."""
    return bool(
        conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2 "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND classid::bigint = ? AND objid::bigint = ?)",
            (LOCK_CLASS, job_key(job)),
        ).fetchone()[0]
    )


# ==== Embedding claims ====

# How long a claim holds: a batch embeds in well under a second (32 rows, about 5 ms each); past this, the copy
# that claimed it is taken for dead and another copy embeds the rows.
CLAIM_S = 60
# Rows without a vector from the model that no live claim holds, claimed for this copy in one short
# transaction. SKIP LOCKED passes over the rows another copy is claiming at this moment, and the insert is the
# arbiter: a row another copy claimed since this statement's snapshot meets its live claim and is not returned.
CLAIM_SQL = (
    "WITH wanted AS (SELECT t.id FROM {table} t "
    "LEFT JOIN memory_vector v ON v.tier = ? AND v.row_id = t.id AND v.model = ? "
    "LEFT JOIN memory_embed_claim c ON c.tier = ? AND c.row_id = t.id "
    "WHERE v.row_id IS NULL AND t.id > ? AND (c.row_id IS NULL OR c.until <= solos_now()){only} "
    "ORDER BY t.id LIMIT ? FOR UPDATE OF t SKIP LOCKED) "
    "INSERT INTO memory_embed_claim (tier, row_id, claimed_by, until) "
    "SELECT ?, id, ?, solos_at(?::interval) FROM wanted "
    "ON CONFLICT (tier, row_id) DO UPDATE SET claimed_by = excluded.claimed_by, until = excluded.until "
    "WHERE memory_embed_claim.until <= solos_now() RETURNING row_id"
)
CLAIMANT = f"{socket.gethostname()}:{os.getpid()}"  # who holds a claim, for an operator reading the table


def claim(conn: Any, table: str, tier: str, model: str, limit: int, ids: list[int] | None, after: int = 0) -> list[int]:
    """Claim up to `limit` rows of the tier that lack a vector from `model` (of `ids` if given, past id `after`);
    their ids."""
    only = "" if ids is None else " AND t.id = ANY(?)"
    ranged = (tier, model, tier, after, *(() if ids is None else (list(ids),)))
    params = (*ranged, limit, tier, CLAIMANT, f"{CLAIM_S} seconds")
    return sorted(row[0] for row in conn.execute(CLAIM_SQL.format(table=table, only=only), params))


def release(conn: Any, tier: str, ids: list[int]) -> None:
    conn.execute("DELETE FROM memory_embed_claim WHERE tier = ? AND row_id = ANY(?)", (tier, ids))


# ==== LISTEN/NOTIFY: woken when any copy commits ====

CHANNEL = "solos_memory_event"  # schema_pg.sql's solos_log_event NOTIFYs it with every event it logs
WAIT_S = 0.5  # how often the listener looks up from its socket to see whether it should stop
PING_S = 10.0  # a quiet connection is checked this often, so a database that vanished silently is noticed
RECONNECT_S = (0.5, 5.0)  # first and longest pause between attempts while the database is away
CONNECT_TIMEOUT_S = 5
# How long the Notifier gathers the writes that commit after a first one before it sends their one NOTIFY: each
# NOTIFY wakes every other copy's listener, hub and keyword index, and one per serial write cost about 0.2 ms of CPU
# a write here (service and server, against none: 1.52 -> 1.32 ms a write with a 20 ms gathering). The copies hear
# of a write this much later at most: a hub with streams looks every solos_events.POLL_S (50 ms) anyway, and a
# recall brings its copy's keyword index to its own snapshot first.
NOTIFY_GATHER_S = 0.05


class Listener(threading.Thread):
    """Calls `wake` each time a transaction that logged an event commits, whichever copy or fleet writer made it.

    On a connection of its own in autocommit (LISTEN delivers only between transactions). It wakes once more
    on every (re)connection, for what committed while it was not listening, and while the database is away it
    tries again, from half a second up to every 5 s, saying so once in the log each way. A NOTIFY from the server
    process `own()` names (this copy's Notifier) wakes nothing: it tells of this copy's own writes, which woke
    what they had to as they were acknowledged (a NOTIFY each woke the listener, hub and index thread for none).
    """

    def __init__(self, url: str, wake: Callable[[], None], own: Callable[[], int | None] = lambda: None):
        super().__init__(name="pg-listen", daemon=True)
        self.url, self.wake, self.own = url, wake, own
        self.heard = self.ignored = 0  # notifications received, and those of them from this copy's own notifier
        self.stopped = threading.Event()
        self.listening = threading.Event()

    def stop(self) -> None:
        self.stopped.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=2 * WAIT_S + 1)

    def run(self) -> None:
        pause, lost = RECONNECT_S[0], False
        while not self.stopped.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    if lost:
                        log_event("listen_resumed", channel=CHANNEL)
                    pause, lost = RECONNECT_S[0], False
                    self.listening.set()
                    self.wake()
                    self.follow(conn)
            except psycopg.Error as error:
                if not lost:
                    log_event("listen_lost", channel=CHANNEL, error=(str(error).strip().splitlines() or ["?"])[0])
                lost = True
            self.listening.clear()
            self.wake()  # the hub's poll covers the gap
            self.stopped.wait(pause)
            pause = min(pause * 2, RECONNECT_S[1])

    def follow(self, conn: psycopg.Connection) -> None:
        next_ping = time.monotonic() + PING_S
        while not self.stopped.is_set():
            for note in conn.notifies(timeout=WAIT_S):
                self.heard += 1
                if note.pid == self.own():
                    self.ignored += 1
                    continue
                self.wake()
            if time.monotonic() >= next_ping:
                conn.execute("SELECT 1")
                next_ping = time.monotonic() + PING_S


class Notifier(threading.Thread):
    """Tells the copies' listeners that the service's writes committed, after their commit, off the request.

    A NOTIFY in the writing transaction takes PostgreSQL's notify-queue lock at commit and holds it until the
    commit is flushed, so every writer of the database that notifies waits for the previous one's WAL flush: 16
    writers shared none (nearly every active server process waited on that lock). The service's one-statement
    writes (schema_pg.sql's solos_write_*) leave the NOTIFY out (`solos.notify_after_commit`) and poke this
    thread, which sends one NOTIFY, outside any write, for the pokes of NOTIFY_GATHER_S after the first: writes
    that commit while it sends are told with the next. Every other writer, the fleet's included, still NOTIFYs
    as it commits. While the database is away it tries again as the listener does; the copies' event hubs poll
    meanwhile.
    """

    def __init__(self, url: str):
        super().__init__(name="pg-notify", daemon=True)
        self.url = url
        self.poked = threading.Event()
        self.stopped = False
        self.halted = threading.Event()  # set by stop(): no more waiting for a database that is away
        self.sent = 0  # NOTIFYs sent
        self.pid: int | None = None  # its server process, while connected
        self.launch = threading.Lock()  # two writers' first pokes at once must not both start the thread
        self.launched = False

    def poke(self) -> None:
        """A write committed: notify soon (and start the thread on the first poke).

        Thread.start is not safe against two callers at once: both pass its started check, two OS threads run
        this one loop, and one of them dies in threading's bookkeeping (a KeyError in _limbo)."""
        self.poked.set()
        if self.launched or self.stopped:
            return
        with self.launch:
            if not self.launched and not self.stopped:
                self.launched = True
                self.start()

    def stop(self) -> None:
        """Send what was poked, then stop (a CLI process writing and exiting still tells the copies)."""
        self.stopped = True
        self.halted.set()
        self.poked.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=CONNECT_TIMEOUT_S + 1)

    def run(self) -> None:
        pause, lost = RECONNECT_S[0], False
        while not (self.stopped and not self.poked.is_set()):
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
                    if lost:
                        log_event("notify_resumed", channel=CHANNEL)
                    pause, lost, self.pid = RECONNECT_S[0], False, conn.info.backend_pid
                    while not (self.stopped and not self.poked.is_set()):
                        if not self.poked.wait(PING_S):
                            conn.execute("SELECT 1")  # a quiet connection: is the database still there?
                            continue
                        time.sleep(NOTIFY_GATHER_S)
                        self.poked.clear()
                        conn.execute(f"NOTIFY {CHANNEL}")
                        self.sent += 1
            except psycopg.Error as error:
                if not lost:
                    log_event("notify_lost", channel=CHANNEL, error=(str(error).strip().splitlines() or ["?"])[0])
                lost = True
                self.poked.set()  # what was poked before the failure is sent once the database is back
                if self.halted.wait(pause):
                    return
                pause = min(pause * 2, RECONNECT_S[1])
