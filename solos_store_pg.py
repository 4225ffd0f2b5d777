"""solos_store_pg: the same store over PostgreSQL, for a fleet on more than one host (`--db postgresql://…`).

Imported only when the database is a PostgreSQL URL, so the core keeps needing the standard library alone.
PgStore is solos_store.Store with PostgreSQL's connections, transactions and SQL; its queries are PgQueries,
solos_store.Queries with PostgreSQL's SQL where the two databases differ. The schema is schema_pg.sql.

What is not the same, and why:

- Keyword recall ranks on each serving copy's own FTS5 index (solos_pg_keyword: SQLite's bm25(), rows read
  back from here). Until it is filled, or when a recall cannot bring it to its snapshot at once, it is Okapi
  BM25 computed in SQL from a tsvector per row (FTS5's formula, same k1, b and column weights), since
  PostgreSQL's ts_rank ignores how rare a word is.
- Writers do not queue behind one lock: PostgreSQL takes row locks. Writes that must not race (the same long
  fact, the same idempotency key) take a transaction-scoped advisory lock on their key.
- The service's writes (short, long, episodic) are one statement each, schema_pg.sql's solos_write_* functions
  doing Store's steps (write_row): a round trip is a wake-up of another process, and the steps took 8 of them.
- Events are read only below the oldest running transaction (xid8), because ids commit out of order; but not
  below one of another database, nor one this copy has seen running for EVENT_WAIT_S (an idle session holding an
  xid): readers are told of the gap it may leave (`passed_over`), and /health and stats show the wait.
- A forget's dead tuples go with a VACUUM of the touched tables, run by a thread of its own; WAL segments
  and base backups keep the text until they are recycled (SECURITY.md).
- Snapshots are pg_dump's (docs/operations.md): `snapshot` and `restore` refuse a PostgreSQL URL.
- Several copies of the service may share the database (solos_copies): background work takes turns under
  advisory locks, the embedder claims its rows, and each copy's event hub listens for the others' commits.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import queue
import re
import select
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import psycopg.errors
from psycopg.types.numeric import FloatLoader

import solos_copies
import solos_pg_keyword
import solos_store
from solos_store import (
    RETRACTABLE,
    TIER_TABLE,
    Busy,
    Embedded,
    StorageUnavailable,
    Tier,
    Visibility,
    log_event,
    read_resource,
)

SERVICE_ROLE = "solos_memory_service"
MIGRATION_LOCK = 8437  # pg_advisory_xact_lock key: copies starting together create the schema one at a time
# schema_pg.sql's revision, raised with every change to it (tests/test_release.py pins the file's sha256 to it) and
# recorded in solos_memory_meta: a copy of an earlier release does not apply its older functions over a later one's.
SCHEMA_PG_REVISION = 4
# How long a start applying a changed schema waits for a table another transaction holds: its locks stop the other
# copies' writes to the tables it locked already, so it gives up (and says so) rather than wait with no bound.
SCHEMA_LOCK_TIMEOUT_MS = 5000
STATEMENT_TIMEOUT_MS = 30_000
# Connections kept open between uses: the writes' admission lane at the default --admit on 2 cores (16). A
# PostgreSQL connection costs a server process and a few round trips to open, and its first calls plan and
# compile afresh, so with SQLite's 8 a run of 16 writers opened ~11 a second and reached 425-475 acknowledged
# writes/s against 560-636 with 16 (bench/write_throughput.py's clients, one run, load 7). Each copy holds up to
# this many, the listener and the event hub's own besides: size max_connections for the copies (the cluster
# allows 200).
POOL_SIZE = 16
CONNECT_TIMEOUT_S = 5
UNREACHABLE = "the PostgreSQL server cannot be reached"  # /health's storage reason (the 503 names the address)
# The longest the event cursor waits for one running transaction of this database: one
# session idle in transaction held every stream and read_events of every copy for as long as it lived. The
# service's own write transactions last milliseconds and its statements at most STATEMENT_TIMEOUT_MS; a fleet
# writer's transaction older than this is taken for stuck, and its events, if it commits, reach only readers
# still before them (a gap says so to the ones past them).
EVENT_WAIT_S = 10.0
HELD_SHOWN_S = 1.0  # a wait this long shows the cursor as stalled in /health and stats
SHOWN_TRANSACTIONS = 8  # transactions the cursor's state lists at most
VACUUM_WAIT_S = 30.0  # how long closing the store waits for a VACUUM after a forget to finish
MARK_WAIT_MS = 100  # how long the expiry sweep waits for the short writes in flight (PgQueries.mark_taken)
STATS_TTL_S = 1.0  # how long a tier's row count and mean length (BM25's N and avgdl) are reused
BM25_K1, BM25_B = 1.2, 0.75  # FTS5's
# The first, bounded pass of keyword recall (PgStore.ranked_rows) scores the rows holding a question's rarest
# words, as many words as match this many rows or this share of the tier's rows, whichever is more. The share was
# set on LoCoMo-shaped rows (20 questions): 0.1 gives a first pass that clears the bound on 19 of 20 at 100k rows
# (p50 1,058 -> 304 ms), 0.25 scores more rows than needed (451 ms).
FIRST_PASS_ROWS, FIRST_PASS_SHARE = 2000, 0.1
PASS_GROWTH = 3  # a pass that does not clear the bound: the next takes the next word, and words for 3x the rows
# Per table: the weight of each tsvector class A-D, from the FTS5 column weights (solos_store.TIER_TABLE) as
# schema_pg.sql files the columns; OWN_CLASSES: a row's own text (FTS5's column filter {topic fact tags agent}).
WEIGHTS = {
    "memory_longterm": (1.0, 0.5, 0.3, 0.0),
    "memory_episodic": (1.0, 0.7, 0.5, 0.0),
    "memory_episodic_archive": (1.0, 0.7, 0.5, 0.0),
    "memory_short": (1.0, 0.5, 0.0, 0.0),
}
ALL_CLASSES, OWN_CLASSES, FACT_CLASS = "ABCD", "AB", "A"
QUOTED = re.compile(r'"((?:[^"]|"")*)"')

# SQLSTATEs: retried as a busy database (serialization, deadlock), refused as busy (a lock wait ran out).
RETRIED = ("40001", "40P01")
LOCK_TIMEOUT = "55P03"


class PgRow(tuple):
    """A result row read by position or by column name, and as a dict: what sqlite3.Row gives the callers."""

    names: dict[str, int]

    def __new__(cls, values: Sequence[Any], names: dict[str, int]) -> PgRow:
        row = super().__new__(cls, values)
        row.names = names
        return row

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        return super().__getitem__(self.names[key] if isinstance(key, str) else key)

    def keys(self) -> list[str]:
        return list(self.names)


def pg_rows(cursor: Any) -> Callable[[Sequence[Any]], PgRow]:
    names = {column.name: index for index, column in enumerate(cursor.description or ())}
    return lambda values: PgRow(values, names)


def placeholders(sql: str) -> str:
    """The store's SQL uses sqlite3's `?`; psycopg's is `%s` (a literal % doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


# The transactions running as a snapshot sees them (xid8s below its xmax), each with its backend's pid and
# whether that backend is in another database (it can never log an event here). A prepared transaction has no
# backend: it counts as this database's.
RUNNING_SQL = (
    "SELECT pg_snapshot_xmax(s)::text::bigint, x::text::bigint, a.pid, "
    "a.pid IS NOT NULL AND a.datid IS DISTINCT FROM (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "FROM pg_current_snapshot() s LEFT JOIN LATERAL pg_snapshot_xip(s) x ON true "
    "LEFT JOIN pg_stat_activity a ON a.backend_xid = x::xid ORDER BY 2"
)


class RunningTransactions:
    """How far the event cursor may read (`horizon`), and since when this copy has seen each transaction of this
    database running. pg_stat_activity's xact_start is hidden from the service's role for other users' sessions,
    so a transaction's age is this copy's own observation: at most EVENT_WAIT_S after it was first seen, it is no
    longer waited for."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: dict[int, float] = {}  # xid8 -> monotonic time this copy first saw it running
        self.passed: set[int] = set()  # running transactions the cursor no longer waits for
        self.passed_total = 0
        self.last: dict = {"held_by": None, "not_waited_for": []}

    def horizon(self, conn: Any) -> tuple[int, list[dict]]:
        """The xid8 events are read below, and the running transactions of this database left behind it."""
        rows = conn.execute(RUNNING_SQL).fetchall()
        now, horizon = time.monotonic(), rows[0][0]
        held, passed = None, []
        with self.lock:
            ours = [(xid, pid) for _, xid, pid, elsewhere in rows if xid is not None and not elsewhere]
            running = {xid for xid, _ in ours}
            self.seen = {xid: self.seen.get(xid, now) for xid in running}
            self.passed &= running
            for xid, pid in ours:
                waited = now - self.seen[xid]
                if waited < EVENT_WAIT_S:
                    horizon, held = xid, {"xid": xid, "pid": pid, "held_s": round(waited, 1)}
                    break
                passed.append({"xid": xid, "pid": pid, "seen_running_s": round(waited, 1)})
                if xid not in self.passed:
                    self.passed.add(xid)
                    self.passed_total += 1
                    log_event("event_wait_ended", xid=xid, pid=pid, waited_s=round(waited, 1))
            self.last = {"held_by": held, "not_waited_for": passed[:SHOWN_TRANSACTIONS]}
        return horizon, passed

    def state(self) -> dict:
        """The cursor as last read: `stalled` while a transaction has held it HELD_SHOWN_S or more, `skipping`
        while one it no longer waits for still runs (its events would reach no reader already past them)."""
        with self.lock:
            last, passed_total = self.last, self.passed_total
        held = last["held_by"]
        state = "skipping" if last["not_waited_for"] else "stalled" if held and held["held_s"] >= HELD_SHOWN_S else "ok"
        return {"state": state, "wait_bound_s": EVENT_WAIT_S, **last, "not_waited_for_total": passed_total}


class PgConnection(psycopg.Connection):
    """A psycopg connection that runs the store's `?` SQL and carries its store's queries (PgQueries)."""

    queries: solos_store.Queries  # its store's: PgQueries
    reusable = True
    keyword_snapshot: Any = None  # the snapshot this transaction's keyword index was brought to (PgStore.read)
    keyword_vectors = 0  # and the vectors' generation in it, read in the same round trip
    running = RunningTransactions()  # PgStore.connect gives each store's connections the store's own

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:  # type: ignore[override]
        return super().execute(placeholders(query), params or (), **kwargs)

    def executemany(self, query: str, params_seq: Iterable[Sequence[Any]]) -> Any:
        cursor = self.cursor()
        cursor.executemany(placeholders(query), list(params_seq))
        return cursor

    @property
    def in_transaction(self) -> bool:
        return self.info.transaction_status != psycopg.pq.TransactionStatus.IDLE


# ==== The store ====


class PgStore(solos_store.Store):
    """The PostgreSQL database: a pool of connections working as the service's role, every query."""

    BEGIN_READ, BEGIN_WRITE = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "BEGIN"
    shared_by_copies = True
    host_clock = False

    def __init__(self, url: str, busy_timeout_ms: int = 5000, admin: bool = False):
        super().__init__(url, busy_timeout_ms, admin)
        self.stats: dict[str, tuple[float, int, float]] = {}  # table -> (read at, rows, mean tokens)
        self.stats_lock = threading.Lock()
        self.stats_due: set[str] = set()  # tables whose figures a thread is reading again
        self.counter = ThreadPoolExecutor(1, "pg-counts")
        self.vacuum_lock = threading.Lock()
        self.vacuuming: threading.Thread | None = None
        self.vacuum_wanted = False
        self.running = RunningTransactions()
        self.queries = PgQueries()
        self.keyword: solos_pg_keyword.KeywordIndex | None = None  # a serving copy's own (listen starts it)
        self.notifier = solos_copies.Notifier(url)

    def event_cursor(self, conn: Any = None) -> dict:
        """The event cursor's state (RunningTransactions.state): read again on `conn` if given (the event hub's
        round), else as last read."""
        if conn is not None:
            self.running.horizon(conn)
        return self.running.state()

    def connect(self) -> PgConnection:  # type: ignore[override]
        try:
            conn = PgConnection.connect(self.path, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.OperationalError as error:
            self.storage_failed(UNREACHABLE)
            raise StorageUnavailable(unreachable(self.path, error)) from None
        conn.row_factory = pg_rows  # type: ignore[assignment]
        conn.running = self.running
        conn.queries = self.queries
        conn.adapters.register_loader("numeric", FloatLoader)  # sums and averages: JSON numbers, as SQLite's are
        conn.execute(f"SET lock_timeout = {int(self.busy_timeout_ms)}")
        conn.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
        conn.execute("SET TIME ZONE 'UTC'")
        if not self.admin:
            conn.execute(f"SET ROLE {SERVICE_ROLE}")  # the fleet's registry and personas: read, never written
        return conn

    def checkin(self, conn: Any) -> None:
        if conn.reusable and not conn.closed and conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:
                conn.reusable = False
        if conn.reusable and not conn.closed and self.pool.qsize() < POOL_SIZE:
            self.pool.put(conn)
        else:
            conn.close()

    def between_chunks(self, held_s: float) -> None:
        """No pause: PostgreSQL has no single write lock, a chunk holds only the rows it touches."""

    def run(self, work: Callable[[Any], Any], write: bool, one_statement: bool = False) -> Any:
        """Run work in one transaction (reads: one REPEATABLE READ snapshot), retrying serialization failures and
        deadlocks within busy_timeout; a lock wait past it is Busy, an unreachable server StorageUnavailable.
        With `one_statement`, work runs one statement, which is its own transaction: no BEGIN, and its COMMIT
        comes back in the statement's round trip (write_row).

        A COMMIT waiting for the synchronous standby is never cancelled by statement_timeout (which would report
        success for a commit not yet replicated): PostgreSQL lifts the timeout before it commits, explicit COMMIT
        or a statement's own (tests/test_pg_faults.py holds it)."""
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        for attempt in range(solos_store.BUSY_RETRIES + 1):
            conn = self.checkout()
            committing = write and one_statement  # a connection lost from here on leaves the write in doubt
            try:
                if not one_statement:
                    conn.execute(self.BEGIN_WRITE if write else self.BEGIN_READ)
                result = work(conn)
                if not one_statement:
                    committing = write
                    conn.execute("COMMIT")
                return result
            except psycopg.errors.QueryCanceled as error:  # before OperationalError, its parent class
                raise Busy(f"the database took longer than {STATEMENT_TIMEOUT_MS} ms ({error})") from None
            except psycopg.OperationalError as error:
                state = getattr(error, "sqlstate", None)
                if state == LOCK_TIMEOUT:
                    raise Busy(f"database is locked: a lock wait passed {self.busy_timeout_ms} ms ({error})") from None
                if state not in RETRIED:
                    conn.reusable = False
                    super().close()  # its pool-mates lost the same server
                    log_event("storage_failure", db=solos_store.shown(self.path), error=str(error))
                    self.storage_failed(UNREACHABLE)
                    raise StorageUnavailable((in_doubt if committing else unreachable)(self.path, error)) from None
                last_error = error
            except psycopg.errors.ReadOnlySqlTransaction as error:
                # A standby: during a failover HAProxy sends connections to the node Patroni is promoting a
                # moment before it takes writes. The database's state, not the request's: 503.
                conn.reusable = False
                log_event("storage_failure", db=solos_store.shown(self.path), error=str(error))
                self.storage_failed("the PostgreSQL database is read-only right now (a standby)")
                raise StorageUnavailable(
                    f"the PostgreSQL database at {solos_store.shown(self.path)} is read-only right now (a standby, "
                    f"as during a failover: {first_line(error)}); nothing was changed, retry later"
                ) from None
            finally:
                self.checkin(conn)
            pause = min(0.05 * 2**attempt, deadline - time.monotonic())
            if pause <= 0:
                break
            time.sleep(pause)
        raise Busy(f"transaction kept conflicting with other writers ({last_error})")

    def read(self, work: Callable[[Any], Any]) -> Any:
        """solos_store's; each transaction starts with no keyword snapshot (solos_pg_keyword.caught_up)."""

        def fresh(conn: Any) -> Any:
            conn.keyword_snapshot = None
            return work(conn)

        return super().read(fresh)

    def read_alone(self, work: Callable[[Any], Any]) -> Any:
        return self.run(work, write=False, one_statement=True)

    def checkout(self) -> Any:
        """A pooled connection the server has not ended, else a new one. A restart, a failover or
        pg_terminate_backend ends every idle one: the server's goodbye (or the socket's end) waits unread on it, and
        the next call would meet it as "cannot be reached" with the database up again."""
        while True:
            try:
                conn: Any = self.pool.get_nowait()
            except queue.Empty:
                return self.connect()
            if not (conn.closed or conn.broken or ended(conn)):
                return conn
            conn.close()

    # -- schema --

    def migrate(self) -> None:
        """Create what is missing (schema_pg.sql, additive), one copy at a time; say clearly what stops it."""
        schema = read_resource("schema_pg.sql").decode("utf-8")
        try:
            self.create_schema(schema)
        except psycopg.errors.LockNotAvailable as error:  # before OperationalError, its parent class
            raise StorageUnavailable(
                f"the schema could not be applied to the PostgreSQL database at {solos_store.shown(self.path)}: "
                f"another transaction holds a table it changes for more than {SCHEMA_LOCK_TIMEOUT_MS} ms "
                f"({first_line(error)}); nothing was changed, start again once it ends"
            ) from None
        except psycopg.OperationalError as error:
            raise StorageUnavailable(unreachable(self.path, error)) from None
        except psycopg.errors.InsufficientPrivilege as error:
            if self.applied_by_owner(schema):
                log_event("schema_applied_by_owner", user_may_not=first_line(error))
                return
            raise solos_store.SchemaMismatch(
                f"the database user may not create or grant solos-memory's schema ({first_line(error)}); "
                "run the service once as the database's owner, or apply schema_pg.sql as it"
            ) from None
        except psycopg.Error as error:
            raise solos_store.SchemaMismatch(f"schema_pg.sql could not be applied: {first_line(error)}") from None

    def applied_by_owner(self, schema: str) -> bool:
        """Whether the owner applied this very schema_pg.sql and this user may work as the service's role: a
        service logging in as a member of that role alone (SECURITY.md) starts without applying it again."""
        try:
            conn = PgConnection.connect(self.path, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.Error:
            return False
        try:
            member = conn.execute("SELECT pg_has_role(current_user, ?, 'MEMBER')", (SERVICE_ROLE,)).fetchone()[0]
            applied = (
                conn.execute("SELECT value FROM solos_memory_meta WHERE key = 'schema_pg_sha256'").fetchone()
                if member
                else None
            )
        except psycopg.Error:
            return False
        finally:
            conn.close()
        return applied is not None and applied[0] == schema_digest(schema)

    def create_schema(self, schema: str) -> None:
        conn = PgConnection.connect(self.path, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK,))
                refuse_a_later_schema(conn)
                if not applied_already(conn, schema):
                    conn.execute(f"SET LOCAL lock_timeout = {int(SCHEMA_LOCK_TIMEOUT_MS)}")
                    super(PgConnection, conn).execute(schema)
                    conn.execute(
                        "INSERT INTO solos_memory_meta (key, value) VALUES ('schema_version', ?), "
                        "('schema_pg_sha256', ?), ('schema_pg_revision', ?) "
                        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                        (solos_store.SCHEMA_VERSION, schema_digest(schema), str(SCHEMA_PG_REVISION)),
                    )
                conn.execute(
                    "INSERT INTO solos_memory_meta (key, value) VALUES ('vector_generation', '0'), (?, solos_now()) "
                    "ON CONFLICT DO NOTHING",
                    (solos_store.JOBS_WATCHED_SINCE,),
                )
                superuser = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]
                if not superuser:
                    conn.execute(f"GRANT {SERVICE_ROLE} TO CURRENT_USER")
        finally:
            conn.close()

    def reindex(self) -> None:
        def work(conn: Any) -> None:
            for tier in TIER_TABLE.values():
                conn.execute(f"UPDATE {tier.table} SET fts = NULL")

        self.write(work)

    # -- agents --

    # -- writes --

    # -- reads --

    def writes_by_hour(self) -> dict[str, list[int]]:
        hours_ago = (
            "coalesce(least(23, greatest(0, floor(extract(epoch FROM clock_timestamp() - "
            "solos_parse_time(ts)) / 3600)))::int, 0)"
        )
        sql = (
            f"SELECT agent, {hours_ago}, count(*) FROM memory_event WHERE ts >= solos_at('-1 day') "
            f"AND kind IN ('write', 'update') AND tier IN {solos_store.WRITTEN_TIERS} GROUP BY 1, 2"
        )

        def work(conn: Any) -> dict[str, list[int]]:
            hours: dict[str, list[int]] = {}
            for agent, ago, count in conn.execute(sql):
                hours.setdefault(agent, [0] * 24)[ago] += count
            return hours

        return self.read(work)

    # -- recall's reads --

    def ranked_rows(
        self, conn: Any, tier: Tier, seen: Visibility, match: str, limit: int, tags: Sequence[str] = ()
    ) -> list:
        """The best Okapi BM25 matches the caller may read (FTS5's formula, weights and IDF clamp); `score` is
        the BM25 score, higher is better, as -bm25() is on SQLite.

        Exact top `limit` without scoring every matching row (MaxScore): a word adds at most idf * (k1 + 1) to
        a row's score, so once the rows holding the rarest words are scored, a row holding none of them (only
        common words) cannot pass the `limit`-th score if those common words' bounds add up to less. The rare
        words are as many as match FIRST_PASS_ROWS rows or FIRST_PASS_SHARE of the tier; while their scores do
        not clear the bound, the next pass takes the next word and PASS_GROWTH times the rows, the last one
        every matching row, as before. One REPEATABLE READ snapshot: every pass sees the same rows.

        A serving copy ranks by its own FTS5 index instead (solos_pg_keyword), once it is filled."""
        if self.keyword is not None:
            found = self.keyword.ranked_rows(conn, tier, seen, match, limit, tags)
            if found is not None:
                return found
        text, classes = match_words(match)
        rows, _ = self.size(conn, tier.table)
        counted = conn.execute(
            f"SELECT w.lexeme, (SELECT count(*) FROM {tier.table} x "
            "    WHERE x.fts @@ (quote_literal(w.lexeme) || ?)::tsquery) "
            "FROM (SELECT DISTINCT lexeme FROM unnest(to_tsvector('solos', ?))) w",
            (labels(classes), text),
        ).fetchall()
        terms = sorted(((lexeme, int(df)) for lexeme, df in counted if df), key=lambda term: (term[1], term[0]))
        if not terms:
            return []
        rare, matched, budget = 0, 0, max(FIRST_PASS_ROWS, rows * FIRST_PASS_SHARE)
        while True:
            while rare < len(terms) and (rare == 0 or matched + terms[rare][1] <= budget):
                matched += terms[rare][1]
                rare += 1
            found = self.scored(conn, tier, seen, terms, terms[:rare], classes, limit, tags)
            if rare == len(terms):
                return found
            bound = sum(bm25_idf(rows, df) * (BM25_K1 + 1) for _, df in terms[rare:]) * (1 + 1e-9)
            if len(found) == limit and found[-1]["score"] > bound:
                return found
            budget, rare, matched = budget * PASS_GROWTH, rare + 1, matched + terms[rare][1]

    def scored(
        self,
        conn: Any,
        tier: Tier,
        seen: Visibility,
        terms: list[tuple[str, int]],
        matching: list[tuple[str, int]],
        classes: str,
        limit: int,
        tags: Sequence[str],
    ) -> list:
        """The top `limit` of the visible rows holding any of `matching`'s words, scored by all of `terms`
        ((lexeme, rows holding it))."""
        where, params = self.visible(tier, seen, tags)
        rows, tokens = self.size(conn, tier.table)
        a, b, c, d = WEIGHTS[tier.table]
        sql = (
            "WITH terms AS MATERIALIZED (SELECT * FROM unnest(?::text[], ?::float8[]) AS w(lexeme, df)), "
            f"m AS MATERIALIZED (SELECT t.id, t.fts, t.fts_tokens FROM {tier.table} t "
            f"    WHERE t.fts @@ (SELECT string_agg(quote_literal(lexeme) || ?, ' | ')::tsquery "
            f"        FROM unnest(?::text[]) lexeme){''.join(' AND ' + w for w in where)}), "
            "scored AS (SELECT m.id, sum(greatest(ln(greatest((? - terms.df + 0.5) / (terms.df + 0.5), 1e-9)), 1e-6) "
            "    * (tf.weight * (? + 1)) / (tf.weight + ? * (1 - ? + ? * m.fts_tokens / ?)) "
            "    ORDER BY tf.lexeme) AS score "
            # Summed in one order (the lexemes'), so rows of the same text tie exactly in every pass and plan.
            # Only the question's lexemes of a matching row are weighed, in plain arithmetic: a subquery for every
            # lexeme of every matching row took 0.5 s of one LoCoMo question on 10k rows (bench/store_compare.py).
            "  FROM m CROSS JOIN LATERAL (SELECT u.lexeme, ?::float8 * cardinality(array_positions(u.weights, 'A')) "
            "      + ?::float8 * cardinality(array_positions(u.weights, 'B')) "
            "      + ?::float8 * cardinality(array_positions(u.weights, 'C')) "
            "      + ?::float8 * cardinality(array_positions(u.weights, 'D')) AS weight "
            "    FROM unnest(m.fts) u WHERE u.lexeme = ANY(ARRAY(SELECT lexeme FROM terms))) tf "
            "  JOIN terms ON terms.lexeme = tf.lexeme WHERE tf.weight > 0 GROUP BY m.id) "
            f"SELECT {tier.columns}, s.score FROM scored s JOIN {tier.table} t ON t.id = s.id "
            "ORDER BY s.score DESC, t.id LIMIT ?"  # ties: the older row first, as FTS5 gives them
        )
        keep = [w if k in classes else 0.0 for k, w in zip("ABCD", (a, b, c, d))]
        mean = max(tokens, 1e-9)
        lexemes, dfs, searched = (
            [term[0] for term in terms],
            [float(term[1]) for term in terms],
            [m[0] for m in matching],
        )
        args = (
            lexemes,
            dfs,
            labels(classes),
            searched,
            *params,
            float(rows),
            BM25_K1,
            BM25_K1,
            BM25_B,
            BM25_B,
            mean,
            *keep,
            limit,
        )
        return conn.execute(sql, args).fetchall()

    def size(self, conn: Any, table: str) -> tuple[int, float]:
        """A table's rows and mean tokens per row (BM25's N and avgdl). Read here the first time; later, a
        figure older than STATS_TTL_S is read again on a thread of its own (a scan of the table: about 0.1 s
        at 1M rows), and this recall takes the last one."""
        known = self.stats.get(table)
        if known is None:
            return self.count_rows(conn, table)
        if time.monotonic() - known[0] > STATS_TTL_S:
            with self.stats_lock:
                due = table not in self.stats_due
                self.stats_due.add(table)
            if due:
                with contextlib.suppress(RuntimeError):  # the store is closing: the last figure stands
                    self.counter.submit(self.recount, table)
        return known[1], known[2]

    def recount(self, table: str) -> None:
        try:
            self.read(lambda conn: self.count_rows(conn, table))
        finally:
            with self.stats_lock:
                self.stats_due.discard(table)

    def count_rows(self, conn: Any, table: str) -> tuple[int, float]:
        rows, mean = conn.execute(f"SELECT count(*), coalesce(avg(fts_tokens), 0) FROM {table}").fetchone()
        self.stats[table] = (time.monotonic(), int(rows), float(mean))
        return int(rows), float(mean)

    def topic_neighbours(self, conn: Any, ids: list[int]) -> dict[int, tuple[int | None, int | None]]:
        found = self.keyword.topic_neighbours(conn, ids) if self.keyword is not None else None
        return found if found is not None else super().topic_neighbours(conn, ids)

    def indexed_rows(self, conn: Any, tier: Tier) -> int | None:
        counted = self.keyword.indexed_rows(tier) if self.keyword is not None else None
        return counted if counted is not None else self.size(conn, tier.table)[0]

    def matches_up_to(self, conn: Any, tier: Tier, match: str, most: int) -> int:
        found = self.keyword.matches_up_to(tier, match, most) if self.keyword is not None else None
        if found is not None:
            return found
        text, classes = match_words(match)
        sql = f"SELECT count(*) FROM (SELECT 1 FROM {tier.table} t WHERE t.fts @@ solos_query(?, ?) LIMIT ?) enough"
        return conn.execute(sql, (text, classes, most)).fetchone()[0]

    # -- vectors --

    def rows_missing_vectors(
        self, tier: str, model: str, limit: int, ids: list[int] | None = None, after: int = 0
    ) -> list:
        """Rows with no vector from `model` (of `ids` if given, past id `after`), claimed for this copy
        (solos_copies.claim): no other copy embeds them until save_vectors releases them, or the claim lapses with
        a copy that died."""
        table, select = TIER_TABLE[tier].table, TIER_TABLE[tier].columns

        def work(conn: Any) -> list:
            claimed = solos_copies.claim(conn, table, tier, model, limit, ids, after)
            if not claimed:
                return []
            return conn.execute(
                f"SELECT {select} FROM {table} t WHERE t.id = ANY(?) ORDER BY t.id", (claimed,)
            ).fetchall()

        return self.write(work)

    def embedding_done(self, conn: Any, tier: str, ids: list[int]) -> None:
        """Release the rows' claims in the transaction that saves their vectors (solos_store's save_vectors)."""
        solos_copies.release(conn, tier, ids)

    def save_vectors(self, tier: str, model: str, embedded: list[tuple[Any, bytes]]) -> tuple[list[int], int]:
        """solos_store's; if the save fails, the claims are released on their own, so another pass may retry."""
        try:
            return super().save_vectors(tier, model, embedded)
        except Exception:
            self.embedding_failed(tier, [row["id"] for row, _ in embedded])
            raise

    def embedding_failed(self, tier: str, ids: list[int]) -> None:
        """Release the claims of rows not saved, in a transaction of their own, so another pass may take them."""
        with contextlib.suppress(solos_store.ServiceError):  # else they lapse (solos_copies.CLAIM_S)
            self.write(lambda conn: solos_copies.release(conn, tier, ids))

    @staticmethod
    def hold_key(conn: Any, agent: str, tier: str, key: str) -> None:
        """Writers do not queue behind one lock here: the same write key waits for the other's commit."""
        conn.execute("SELECT pg_advisory_xact_lock(?)", (key_lock(agent, tier, key),))

    # -- the service's writes: one statement each --

    def upsert_short(
        self, agent: str, key: str, value: str, ttl_s: float, tags: list[str], vector: Embedded | None = None
    ) -> dict:
        values = (value, json.dumps(tags), f"+{ttl_s:.3f} seconds")
        return self.write_row("solos_write_short", agent, "short", key, values, vector)

    def upsert_long(
        self,
        agent: str,
        topic: str | None,
        fact: str,
        source: str | None,
        confidence: float | None,
        tags: list[str],
        vector: Embedded | None = None,
    ) -> dict:
        values = (topic, fact, source, confidence, json.dumps(tags))
        return self.write_row("solos_write_long", agent, "long", solos_store.sha256_text(fact), values, vector)

    def append_episodic(
        self, agent: str, event: dict, idempotency_key: str | None, vector: Embedded | None = None
    ) -> dict:
        values = tuple(event[c] for c in solos_store.EPISODE_RESULT)
        return self.write_row("solos_write_episodic", agent, "episodic", idempotency_key or None, values, vector)

    def write_row(
        self, function: str, agent: str, tier: str, key: str | None, values: Sequence[Any], vector: Embedded | None
    ) -> dict:
        """One of the service's writes as schema_pg.sql's function for it (solos_write_short, _long, _episodic:
        solos_store.Store's steps in one statement, its own transaction): one round trip where the steps took
        eight for a new long fact, with the same outcome and the same refusals."""
        model, blob = vector if vector is not None else (None, None)
        params = (agent, None if key is None else key_lock(agent, tier, key), key, *values, model, blob)
        sql = f"SELECT * FROM {function}({', '.join('?' * len(params))})"
        row_id, status, expires_at, generation = self.run(
            lambda conn: conn.execute(sql, params).fetchone(), write=True, one_statement=True
        )
        self.notifier.poke()  # the function left its NOTIFY to after the commit (solos_copies.Notifier)
        if self.keyword is not None:  # this copy's listener does not hear its own notifier (listen)
            self.keyword.written()
        if status == "unknown_agent":
            raise solos_store.unregistered(agent)
        if status == "conflict":
            raise solos_store.reused_key(str(key), row_id)
        outcome = {"id": row_id, "status": status}
        if expires_at is not None:
            outcome["expires_at"] = expires_at
        if generation is not None:
            outcome[solos_store.VECTOR_SAVED_AT] = generation
        return outcome

    # -- tokens --

    keeps_tokens = True

    def token_hashes(self) -> dict[str, str]:
        return self.read(
            lambda conn: {row[0]: row[1] for row in conn.execute("SELECT token_sha256, agent FROM memory_token")}
        )

    def keep_token(self, digest: str, agent: str) -> None:
        """The `token` command's write, as the URL's user (an admin store): the service's role may only read
        memory_token, so SQL on a serving connection cannot mint a token."""
        try:
            self.write(
                lambda conn: conn.execute(
                    "INSERT INTO memory_token (token_sha256, agent) VALUES (?, ?)", (digest, agent)
                )
            )
        except psycopg.errors.InsufficientPrivilege as error:
            raise SystemExit(
                f"token: the database user may not write memory_token ({first_line(error)}); "
                "issue tokens with the URL of the user that owns the schema"
            ) from None

    # -- copies: notifications and the daily jobs' turns --

    def listen(self, wake: Callable[[], None]) -> solos_copies.Listener:
        """Call `wake` whenever another copy (or fleet writer) commits an event; `.stop()` the listener returned.
        A serving copy listens: its own keyword index starts filling here, and is woken alike. This copy's own
        notifier is not heard: the service's writes wake the event hub (the spine's Memory.written) and the index
        (write_row) as they are acknowledged."""
        if self.keyword is None:
            try:
                self.keyword = solos_pg_keyword.KeywordIndex(self)
            except (OSError, sqlite3.Error) as error:  # no file for it: recall ranks by SQL, /health says off
                log_event("keyword_index_unavailable", error=str(error))
            else:
                if isinstance(self.queries, PgQueries):  # near-duplicate clusters kept while it holds the snapshot
                    self.queries.keyword = self.keyword
                self.keyword.start()
        keyword = self.keyword

        def woken() -> None:
            wake()
            if keyword is not None:
                keyword.wake()

        listener = solos_copies.Listener(self.path, woken, own=lambda: self.notifier.pid)
        listener.start()
        return listener

    def keyword_index_state(self) -> str:
        return "off" if self.keyword is None else self.keyword.health()

    def counts(self) -> dict:
        """solos_store's, and this copy's keyword index: its state, rows filled, file size, answers by it and by SQL."""
        return {**super().counts(), "keyword_index": self.keyword.stats() if self.keyword is not None else None}

    def job_lock(self, job: str) -> Any:
        """A context holding the job's turn for the run (True), or False while another copy runs it."""
        return solos_copies.job_lock(self.connect, job)

    # -- after a forget --

    def close(self) -> None:
        """The pool, a count under way, and a VACUUM still running (they finish first, so they never outlive
        the database); the notifier sends what it was poked for first."""
        if self.keyword is not None:
            self.keyword.close()
        super().close()
        self.notifier.stop()
        self.notifier = solos_copies.Notifier(self.path)  # unstarted, should the store write again
        self.counter.shutdown(wait=True)
        vacuuming = self.vacuuming
        if vacuuming is not None:
            vacuuming.join(VACUUM_WAIT_S)

    def clear_forgotten(self, wait_ms: int) -> bool:
        """VACUUM the tables forgets touched, on a thread of its own (never the request's); True once no scrub
        is queued and none runs, so the scrubber stops asking."""
        with self.vacuum_lock:
            running = self.vacuuming is not None and self.vacuuming.is_alive()
            if running:
                self.vacuum_wanted = True
                return False
        if not self.read(self.queries.queued_scrubs):
            return True
        with self.vacuum_lock:
            self.vacuum_wanted = True
            self.vacuuming = threading.Thread(target=self.vacuum_forgotten, name="pg-vacuum", daemon=True)
            self.vacuuming.start()
        return False

    def vacuum_forgotten(self) -> None:
        while True:
            with self.vacuum_lock:
                if not self.vacuum_wanted:
                    return
                self.vacuum_wanted = False
            try:
                conn = PgConnection.connect(self.path, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
                try:
                    self.vacuum_queued(conn)
                finally:
                    conn.close()  # and with it the turn
            except Exception as error:  # retried on the scrubber's next round
                log_event("vacuum_failed", error=str(error))
                return

    def vacuum_queued(self, conn: Any) -> None:
        """VACUUM the tables the queued scrubs touched and clear them, in this copy's turn (one copy at a time:
        the queue is read under it, so a turn covers every forget committed before it; a forget later than a
        turn another copy holds is left to the scrubber's next round)."""
        if not solos_copies.hold_turn(conn, solos_copies.FORGET_VACUUM):
            log_event("vacuum_deferred", reason="another copy is vacuuming")
            return
        queued = self.read(self.queries.queued_scrubs)
        if not queued:
            return
        tables = sorted(
            {"memory_event", "memory_version", "memory_write_key", "memory_vector"}.union(
                *(RETRACTABLE[tier] for tier in queued)
            )
        )
        warnings: list[str] = []  # PostgreSQL 15 skips, with a warning, a table the login does not own

        def heard(notice: Any) -> None:
            if notice.severity_nonlocalized == "WARNING":
                warnings.append(notice.message_primary or "")

        conn.add_notice_handler(heard)
        conn.execute(f"VACUUM {', '.join(tables)}")
        self.write(lambda conn: self.queries.scrubs_done(conn, queued))  # another VACUUM would skip them too
        if warnings:
            log_event("vacuum_skipped", tables=tables, reason=warnings[0], left_to="autovacuum")
        else:
            log_event("forgotten_vacuumed", tables=tables)


def ended(conn: Any) -> bool:
    """Whether an idle connection has something to read: nothing is owed to it between statements, so that is the
    server ending it (a FATAL message, or the socket closed); a reported setting changing (rare) costs a reconnect."""
    try:
        return bool(select.select([conn.fileno()], [], [], 0)[0])
    except (OSError, ValueError, psycopg.Error):
        return True


def key_lock(agent: str, tier: str, key: str) -> int:
    """The transaction-scoped advisory lock that serializes writes of one write key (hold_key, write_row)."""
    return int.from_bytes(hashlib.sha256(f"{agent}\0{tier}\0{key}".encode()).digest()[:8], "big", signed=True)


def refuse_a_later_schema(conn: Any) -> None:
    """Stop a copy whose schema_pg.sql is older than the one a later release applied to this database: applying it
    would put its older functions and triggers under every copy (the schema is applied at each start)."""
    if not conn.execute("SELECT to_regclass('solos_memory_meta') IS NOT NULL").fetchone()[0]:
        return
    row = conn.execute("SELECT value FROM solos_memory_meta WHERE key = 'schema_pg_revision'").fetchone()
    if row is not None and str(row[0]).isdigit() and int(row[0]) > SCHEMA_PG_REVISION:
        raise solos_store.SchemaMismatch(
            f"the database's schema is revision {row[0]}, applied by a later release of solos-memory; this copy's is "
            f"{SCHEMA_PG_REVISION}: run the later release here too (this one would put its older functions and "
            "triggers under every copy)"
        )


def applied_already(conn: Any, schema: str) -> bool:
    """Whether this very schema_pg.sql (digest and revision) is the one applied: applying it again changes nothing,
    and would lock every table it indexes (CREATE INDEX IF NOT EXISTS takes its table's SHARE lock first)."""
    if not conn.execute("SELECT to_regclass('solos_memory_meta') IS NOT NULL").fetchone()[0]:
        return False
    applied = dict(
        conn.execute(
            "SELECT key, value FROM solos_memory_meta WHERE key IN ('schema_pg_sha256', 'schema_pg_revision')"
        ).fetchall()
    )
    return applied == {"schema_pg_sha256": schema_digest(schema), "schema_pg_revision": str(SCHEMA_PG_REVISION)}


def schema_digest(schema: str) -> str:
    return hashlib.sha256(schema.encode("utf-8")).hexdigest()


def first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def unreachable(url: str, error: BaseException) -> str:
    return (
        f"the PostgreSQL database at {solos_store.shown(url)} cannot be reached ({first_line(error)}); "
        "nothing was changed, retry later"
    )


def in_doubt(url: str, error: BaseException) -> str:
    """A write whose connection was lost once its commit was sent: PostgreSQL may have committed it (the answer is
    what was lost) or not (the server was gone already); the service cannot tell which."""
    return (
        f"the PostgreSQL database at {solos_store.shown(url)} cannot be reached ({first_line(error)}); the "
        "connection was lost after the write was sent, so it may have been stored: recall before writing it "
        "again (a write with a key, a short key, a long fact or an idempotency_key, may simply be sent again)"
    )


def bm25_idf(rows: int, df: int) -> float:
    """A word's weight in BM25 as FTS5 clamps it (and the SQL of PgStore.scored computes it)."""
    return max(math.log(max((rows - df + 0.5) / (df + 0.5), 1e-9)), 1e-6)


def labels(classes: str) -> str:
    """A tsquery word's weight labels for `classes`: none for all four, which match the same rows without making
    the GIN index recheck each one against its tsvector (a count of 48,000 matches: 53 -> 15 ms)."""
    return "" if classes == ALL_CLASSES else ":" + classes


def match_words(match: str) -> tuple[str, str]:
    """An FTS5 query as solos_rank and solos_events build it (quoted words OR-ed, maybe a column filter):
    its words as one text, and the tsvector classes to match (a row's own text, or all of it)."""
    words = " ".join(part.replace('""', '"') for part in QUOTED.findall(match))
    if match.startswith("{fact}"):
        return words, FACT_CLASS
    return words, OWN_CLASSES if match.startswith("{") else ALL_CLASSES


# ==== The queries in PostgreSQL's SQL (PgStore.queries) ====


class PgQueries(solos_store.Queries):
    """solos_store.Queries where PostgreSQL says it differently; the rest is SQL both databases read alike."""

    # solos_store's names for the SQL that differs (see there), in PostgreSQL's terms.
    NOW = "solos_now()"
    SHIFTED = "solos_at(?::interval)"
    IDS_IN = "= ANY(?)"
    SAME = "IS NOT DISTINCT FROM"
    LOCKED = "FOR NO KEY UPDATE OF l"
    LEAST, GREATEST = "least", "greatest"
    TAGGED = "solos_tags(t.tags) && ?::text[]"

    def id_list(self, values: Iterable[Any]) -> list[Any]:
        return list(values)

    text_list = id_list

    def tagged_params(self, tags: Sequence[str]) -> list[Any]:
        return [list(tags)]

    def table_exists(self, conn: Any, name: str) -> bool:
        return conn.execute("SELECT to_regclass(?) IS NOT NULL", (name,)).fetchone()[0]

    def zero_freed(self, conn: Any) -> None:
        """Nothing to set: a forget's dead tuples go with VACUUM (PgStore.clear_forgotten)."""

    def reindex_context_carriers(self, conn: Any, row: Any) -> None:
        """Later facts of a topic the forgotten one had that quote it, or a text it held before, as context: their
        index is computed again."""
        topics, texts = self.held_as(conn, row)
        conn.execute(
            "UPDATE memory_longterm SET fts = NULL WHERE topic = ANY(?) AND id > ? "
            "AND EXISTS (SELECT 1 FROM unnest(?::text[]) AS c (copy) WHERE strpos(context, c.copy) > 0)",
            (topics, row["id"], [f"{agent}: {fact}" for agent, fact in texts]),
        )

    def log_forget(self, conn: Any, tier: str, row_id: int, agent: str) -> None:
        """This transaction's event for the row says `forget` (or one is added)."""
        logged = conn.execute(
            "UPDATE memory_event SET kind = 'forget' WHERE id = (SELECT max(id) FROM memory_event "
            "WHERE xid = pg_current_xact_id() AND tier = ? AND row_id = ?)",
            (tier, row_id),
        ).rowcount
        if not logged:
            conn.execute("SELECT solos_log_event('forget', ?, ?, ?)", (tier, row_id, agent))

    def merge_step(self, conn: Any, fts: str) -> int:
        """No segments to merge: a GIN index drops a deleted row's entries at VACUUM (clear_forgotten)."""
        return 0

    def head_event(self, conn: Any) -> int:
        horizon, _ = conn.running.horizon(conn)
        return conn.execute(
            "SELECT coalesce(max(id), 0) FROM memory_event WHERE xid < ?::text::xid8", (str(horizon),)
        ).fetchone()[0]

    def event_ceiling(self, conn: Any) -> int:
        """Below the next transaction id shifted as solos_log_event shifts it: no transaction logged above (no xid
        is taken for the asking: pg_current_xact_id would give this read one); or the largest id kept, if above
        (events copied into a database whose transaction ids started again lower)."""
        return conn.execute(
            "SELECT greatest((pg_snapshot_xmax(pg_current_snapshot())::text::bigint << 24) - 1, "
            "(SELECT coalesce(max(id), 0) FROM memory_event))"
        ).fetchone()[0]

    def events_after(self, conn: Any, after: int, limit: int) -> list:
        """Events after an id, only those below every running transaction the cursor waits for: one still running
        may hold a smaller id, and would be skipped for good if a later one were read first. Transactions of other
        databases are not waited for (they never log here), nor one seen running for EVENT_WAIT_S (`passed_over`)."""
        horizon, _ = conn.running.horizon(conn)
        return conn.execute(
            "SELECT id, ts, kind, tier, row_id, agent FROM memory_event WHERE id > ? "
            "AND xid < ?::text::xid8 ORDER BY id LIMIT ?",
            (after, str(horizon), limit),
        ).fetchall()

    def passed_over(self, conn: Any) -> list[dict]:
        """Running transactions of this database the cursor no longer waits for, with the event ids each would
        log (its xid8 in the high bits: schema_pg.sql's memory_event): a reader past them never gets those."""
        _, passed = conn.running.horizon(conn)
        return [{**one, "from": (one["xid"] << 24) + 1, "through": ((one["xid"] + 1) << 24) - 1} for one in passed]

    def text_matches(self, conn: Any, match: str, candidates: dict[str, list[int]]) -> set[tuple[str, int]]:
        found: set[tuple[str, int]] = set()
        text, _ = match_words(match)
        for tier, ids in candidates.items():
            table = RETRACTABLE[tier][0]
            classes = OWN_CLASSES if solos_store.OWN_COLUMNS[tier] else ALL_CLASSES
            rows = conn.execute(
                f"SELECT id FROM {table} WHERE fts @@ solos_query(?, ?) AND id = ANY(?::bigint[])", (text, classes, ids)
            )
            found.update((tier, row[0]) for row in rows)
        return found

    def sweep_expired(self, conn: Any, note: Callable[[Any, str, list[int]], None]) -> int:
        """solos_store's, one copy at a time: a copy that finds another sweeping skips the round, and the mark is read
        under the turn, so no two copies log 'expire' for one row. The mark is read FOR UPDATE first: a write or
        delete of a short row reads it FOR SHARE (solos_short_changed), so one in flight (a purge deleting a row,
        the fleet back-dating one) commits before this sweep reads the rows, or waits and sees its new mark."""
        if not solos_copies.try_turn(conn, solos_copies.EXPIRY_SWEEP) or not self.mark_taken(conn):
            return 0
        now = conn.execute("SELECT solos_now()").fetchone()[0]
        through = self.meta_value(conn, "events_expired_through")
        added = 0
        if through is not None:
            expiring = conn.execute(f"SELECT id, agent {self.EXPIRING}", (through, now)).fetchall()
            note(conn, "short", [row_id for row_id, _ in expiring])
            for row_id, agent in expiring:
                conn.execute("SELECT solos_log_event('expire', 'short', ?, ?)", (row_id, agent))
            self.clear_late_expiry(conn)
            added = len(expiring)
        self.set_meta(conn, "events_expired_through", now)
        return added

    def mark_taken(self, conn: Any) -> bool:
        """The sweep's mark row FOR UPDATE, waiting at most MARK_WAIT_MS: a short write holds it FOR SHARE until it
        commits, and the writes after would queue behind a sweep still waiting, so one the fleet leaves open has
        this round skipped (the next, a second later, tries again) rather than every short write held up."""
        prior = conn.execute("SHOW lock_timeout").fetchone()[0]
        conn.execute("SAVEPOINT sweep_mark")
        conn.execute("SELECT set_config('lock_timeout', ?, true)", (f"{MARK_WAIT_MS}ms",))
        try:
            conn.execute("SELECT value FROM solos_memory_meta WHERE key = 'events_expired_through' FOR UPDATE")
        except psycopg.errors.LockNotAvailable:
            conn.execute("ROLLBACK TO SAVEPOINT sweep_mark")
            return False
        conn.execute("RELEASE SAVEPOINT sweep_mark")
        conn.execute("SELECT set_config('lock_timeout', ?, true)", (prior,))
        return True

    def prune_step(self, conn: Any, cutoff: str, batch: int) -> int:
        """solos_store's, one copy at a time: another copy pruning now ends this copy's pass (0 pruned)."""
        if not solos_copies.try_turn(conn, solos_copies.EVENT_PRUNE):
            return 0
        return super().prune_step(conn, cutoff, batch)

    def job_running(self, conn: Any, job: str) -> bool:
        return solos_copies.job_running(conn, job)

    def last_retraction(self, conn: Any) -> int:
        """The newest retraction's id: another copy's forget shows here (solos_events.EventHub.watch_forgets)."""
        return conn.execute("SELECT coalesce(max(id), 0) FROM memory_retraction").fetchone()[0]

    def stream(self, conn: Any, sql: str, params: Sequence[Any]) -> Iterable[Any]:
        """Rows one at a time (psycopg's single-row mode): a client-side cursor would hold the whole answer."""
        return conn.cursor().stream(placeholders(sql), params)

    keyword: Any = None  # the store's keyword index, on a serving copy (solos_pg_keyword)

    def near_duplicates_version(self, conn: Any) -> tuple[bytes, int] | None:
        """solos_store's, from this copy's keyword index while it holds exactly this snapshot; else None: no cheap
        mark of every change to the long facts' text, and near-duplicate clusters are not kept."""
        block = self.keyword.long_facts_version(conn) if self.keyword is not None else None
        return None if block is None else (block, conn.keyword_vectors)

    def near_candidates(self, conn: Any, match: str, limit: int) -> list:
        if self.keyword is not None and self.keyword.alone(conn, match):
            return []  # the result's own fact at most: no other can join its cluster, nothing to read
        text, classes = match_words("{fact} : (" + match + ")")
        every = "&" if " AND " in match else "|"  # solos_provenance.near_key: all of its words
        # The query in a subquery, made once: psycopg prepares a statement run often, and PostgreSQL's generic plan
        # for a small table scans it, calling solos_query for every row (14 ms a call at 419 rows).
        return conn.execute(
            "SELECT id, agent, fact, created_at, embedding FROM memory_longterm "
            "WHERE fts @@ (SELECT solos_query(?, ?, ?)) LIMIT ?",
            (text, classes, every, limit),
        ).fetchall()
