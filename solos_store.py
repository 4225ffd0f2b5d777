"""solos_store: the SQLite store below everything: connections, transactions, the tier table and every query.

Every module imports this one; of the service's it imports only solos_errors (the errors it raises, busy:
503, unknown agent: 422, and the log lines), whose names it re-exports.

SQL lives here (Store, Queries; PostgreSQL's in solos_store_pg) and in schema.sql, with these exceptions, each
a module's own table or file, said here so the rule stays one rule:
    solos_qdrant     the qdrant_outbox it drains and the long facts an import writes (SQLite only)
    solos_jobs       memory_job_run, and the transaction it records a run in when no store could be opened
    solos_status     memory_activity, the recall counters kept per minute
    solos_snapshot   the snapshot files' own checks and copies (VACUUM INTO, integrity, counts), SQLite only
    solos_migrate    the table-by-table COPY from an SQLite file into PostgreSQL
    solos_events     EventHub.own_read: the hub's own connection and transaction (its reads never wait for the
                     pool or a queued write); the queries it runs there are Queries'.

Public surface (what the operations and the service's other modules call; a
second backend subclasses Store and Queries and overrides what its SQL says
differently, as solos_store_pg's PgStore and PgQueries do, so mypy checks every
override):

    Store(path, busy_timeout_ms, admin)      connect, read(work), read_alone(work), write(work), migrate(), close()
      bulk          in_chunks(chunk, more): a job's short transactions, the write lock free between two
      writes        upsert_short, upsert_long, put_long, known_long, insert_long, append_episodic,
                    delete_short, set_sharing, purge_expired, record_audit, register_agents
      reads         read_audit, counts, writes_by_hour, list_agents, require_agent, persona
      recall        Visibility (one caller, one scope: where, mask, allows), refuse_foreign_persona,
                    Store.recent_rows, rows_by_id, ranked_rows, indexed_rows, matches_up_to, topic_neighbours
      vectors       vector_generation, load_vectors, rows_missing_vectors, lacking_vectors, save_vectors,
                    embedding_failed, keep_vector (a write's own, in its transaction), count_missing_vectors,
                    count_vectors, vectors_by_id
      copies        shared_by_copies, listen(wake) (PostgreSQL: solos_copies)
    Queries                                  store.queries (conn.queries where only a connection is at hand;
                                             SQLITE for a snapshot's or migration source's SQLite file);
                                             each takes the connection first: store.queries.erase(conn, ...)
      dialect       NOW, SHIFTED, IDS_IN, SAME, LEAST, GREATEST, TAGGED, id_list, text_list, tagged_params
      forget        find_row, erase, own_retraction, queue_scrub, queued_scrubs, scrubs_done, purge_expired_short,
                    merge_step, checkpoint_truncate, retractions_after, last_retraction, reapply, mirror_waiting,
                    keep_only_hash, forget_imported_point
      events        head_event, events_after, current_rows, text_matches, sweep_expired, expiry_due,
                    prune_step, sharing_agents, job_running (solos_jobs)
      meta and ids  meta_value, set_meta, table_exists, row_id_marks, mark_row_ids
      lifecycle     episodes_by_id, link_promotion, archive_batch, lifecycle_counts, delete_tagged_facts (check)
      provenance    record_deliveries, replaced_since, delivery_log_size, read_deliveries, purge_deliveries,
                    first_delivery, near_duplicates_version,
                    near_candidates, notify_forgotten, read_notices, ack_notices, versions_of, rows_as_of,
                    retracted_as_of, delivered_by (erase also erases a row's versions and keeps its span)
    tiers           Tier, TIER_TABLE, TIERS, DEFAULT_TIERS, SCOPES, LIVE_TIERS, EMBEDDED_TIERS,
                    tier_tables, tier_indexes
    errors          ServiceError and its subclasses, error_body (solos_errors's)
    log and time    log_event, JsonLogHandler, utc_now, stamp (solos_errors's)
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import queue
import re
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from solos_errors import (  # the service's errors and log lines, raised and written here too
    BadRequest as BadRequest,
    Busy as Busy,
    Conflict as Conflict,
    Forbidden as Forbidden,
    JsonLogHandler as JsonLogHandler,
    LengthRequired as LengthRequired,
    MethodNotAllowed as MethodNotAllowed,
    NotFound as NotFound,
    PayloadTooLarge as PayloadTooLarge,
    ProtocolError as ProtocolError,
    RequestTimeout as RequestTimeout,
    ServiceError as ServiceError,
    StorageUnavailable as StorageUnavailable,
    Unauthorized as Unauthorized,
    UnknownAgent as UnknownAgent,
    UnsupportedMediaType as UnsupportedMediaType,
    error_body as error_body,
    log_event as log_event,
    stamp as stamp,
    stamp_seconds as stamp_seconds,
    utc_now as utc_now,
)

# The release, in one place: --version, /health, the status page, /openapi.json, MCP serverInfo and the Server
# header all show this. solos_client.py stands alone and repeats it; tests/test_release.py keeps the two equal.
__version__ = "0.3.0"

log = logging.getLogger("solos_store")

# ==== Storage: connections, transactions, the tier table and the tiers' queries ====

BUSY_RETRIES = 3
BUSY_SLACK_MS = 100  # a call that has used less than this of its busy budget waits with the full timeout
# Between two chunks of a bulk write (Store.in_chunks) the write lock stays free as long as the chunk held it,
# within these bounds. A writer waiting in SQLite's busy handler looks again after sleeps that grow with its wait
# (1, 2, 5, 10, 15, 20, 25 ... 100 ms), so back-to-back chunks of 10-80 ms starved an agent for 1.5 s at 100k
# rows; a pause as long as the chunk, never under 10 ms nor over the handler's longest sleep, lets it in
# (bench/write_lock.py).
CHUNK_PAUSE_S = (0.01, 0.1)
OVERFETCH = 4  # ranked keyword matches read per wanted row when scope, sharing or expiry filters apply
POOL_SIZE = 8
SCHEMA_VERSION = "2"
JOBS_WATCHED_SINCE = "jobs_watched_since"  # solos_memory_meta key, read by solos_jobs
DATABASE_ID = "database_id"  # solos_memory_meta: a random id an SQLite database gets at its first start
Embedded = tuple[str, bytes]  # a text's vector, embedded before the write of it: (model, float32 blob)
VECTOR_SAVED_AT = "vector_saved_at"  # keep_vector's key in a write's outcome: the generation its vector joined

# What the service reads from the fleet's tables; startup refuses if one is missing.
REQUIRED_COLUMNS = {
    "agent_registry": ("agent",),
    "memory_durable": ("id", "key", "value", "updated_at"),
    "memory_longterm": (
        "id",
        "agent",
        "topic",
        "fact",
        "source",
        "confidence",
        "tags",
        "embedding",
        "created_at",
        "updated_at",
    ),
    "memory_episodic": ("id", "agent", "event_type", "summary", "details", "outcome", "duration_s", "timestamp"),
}


@dataclass(frozen=True)
class Tier:
    """One searchable table: how recall reads, ranks, labels and embeds its rows."""

    name: str  # recall's internal name, and memory_vector.tier
    label: str  # what results call it
    table: str
    fts: str
    columns: str  # selected for results
    time_column: str  # recency order, and when a row was written
    bm25_weights: str  # FTS5 column weights, in the index's column order
    text_column: str  # the result's `text`
    result_columns: tuple[str, ...]  # returned as they are
    embedded: tuple[str, ...] = ()  # what a vector is made of: (writer, label, text); a change drops the vector
    vector_sql: str = ""  # the model's vectors with what the vector search filters on
    opt_in: bool = False  # other agents read it only where its author opted in, and each read is audited
    archived: bool = False  # archived episodes: searched only with archive=true
    expires: bool = False  # rows past expires_at are never returned
    threaded: bool = False  # rows of one topic form a thread: a match lends its neighbours score
    content: tuple[str, ...] = ()  # what a retraction's content hash covers (long: the fact alone, as its write key)
    own_match: str = ""  # FTS5 column filter for a row's own text (a long fact's context holds its neighbours')

    def embedding_text(self, row: Any) -> str:
        """What a row's vector is made of: its writer and label carry signal (LoCoMo vector hit@5 +0.19)."""
        return labelled_text(*(row[name] for name in self.embedded))


def labelled_text(agent: str, label: str | None, text: str) -> str:
    """A row as the embedder and the cross-encoder read it: `agent (label): text`, or `agent: text`."""
    return f"{agent} ({label}): {text}" if label else f"{agent}: {text}"


def read_as(kind: str, *columns: str) -> str:
    """SELECT items reading each column of t (`name` or `name AS alias`) as `kind`, whatever a fleet writer stored:
    text, a BLOB as the text its bytes spell (invalid UTF-8 as U+FFFD); a number, NULL for anything else. A BLOB
    read as it is failed every recall, events page and embedding pass that met the row (bytes are not text)."""
    items = []
    for column in columns:
        name, _, alias = column.partition(" AS ")
        if kind == "text":
            items.append(f"CAST(t.{name} AS TEXT) AS {alias or name}")
        else:  # the same on both stores: DOUBLE PRECISION is PostgreSQL's float8 and SQLite's REAL
            items.append(
                f"CASE WHEN t.{name} = CAST(t.{name} AS DOUBLE PRECISION) THEN t.{name} END AS {alias or name}"
            )
    return ", ".join(items)


PERSONA_COLUMNS = "t.id, " + read_as("text", "key", "value", "updated_at")  # the fleet's persona records
EPISODE_COLUMNS = ", ".join(
    (
        "t.id",
        read_as("text", "agent", "event_type", "summary", "details", "outcome"),
        read_as("number", "duration_s"),
        read_as("text", "timestamp AS ts"),
    )
)
EPISODE_RESULT = ("event_type", "summary", "details", "outcome", "duration_s")  # also what a write gives
EPISODE_CONTENT = ("event_type", "summary", "details", "outcome")
ARCHIVE_TIER = "episodic_archive"  # recall's internal name for the archived rows; results say "episodic"
TIER_TABLE = {
    tier.name: tier
    for tier in (
        Tier(
            "long",
            "long",
            "memory_longterm",
            "memory_longterm_fts",
            ", ".join(
                (
                    "t.id",
                    read_as("text", "agent", "topic", "fact", "source"),
                    read_as("number", "confidence"),
                    read_as("text", "tags", "created_at", "updated_at AS ts"),
                )
            ),
            "updated_at",
            "1.0, 1.0, 0.5, 0.5, 0.3",
            "fact",
            ("source", "topic", "fact", "confidence", "tags"),
            embedded=("agent", "topic", "fact"),
            # Ordered by topic, so a row's neighbours (the same topic, adjacent ids) sit beside it.
            vector_sql="SELECT t.id, t.agent, t.topic AS thread, NULL AS expires_at, t.embedding AS vector "
            "FROM memory_vector v JOIN memory_longterm t ON t.id = v.row_id "
            "WHERE v.tier = ? AND v.model = ? AND t.embedding IS NOT NULL ORDER BY t.topic, t.id",
            threaded=True,
            content=("fact",),
            own_match="{topic fact tags agent} : ",
        ),
        Tier(
            "episodic",
            "episodic",
            "memory_episodic",
            "memory_episodic_fts",
            EPISODE_COLUMNS,
            "timestamp",
            "0.5, 1.0, 0.7, 0.7, 0.5",
            "summary",
            EPISODE_RESULT,
            embedded=("agent", "event_type", "summary"),
            vector_sql="SELECT t.id, t.agent, NULL AS thread, NULL AS expires_at, v.vector FROM memory_vector v "
            "JOIN memory_episodic t ON t.id = v.row_id WHERE v.tier = ? AND v.model = ?",
            opt_in=True,
            content=EPISODE_CONTENT,
        ),
        Tier(
            ARCHIVE_TIER,
            "episodic",
            "memory_episodic_archive",
            "memory_episodic_archive_fts",
            EPISODE_COLUMNS,
            "timestamp",
            "0.5, 1.0, 0.7, 0.7, 0.5",
            "summary",
            EPISODE_RESULT,
            opt_in=True,
            archived=True,
            content=EPISODE_CONTENT,
        ),
        Tier(
            "short",
            "short",
            "memory_short",
            "memory_short_fts",
            "t.id, " + read_as("text", "agent", "key", "value", "tags", "expires_at", "created_at AS ts"),
            "created_at",
            "1.0, 1.0, 0.5, 0.5",
            "value",
            ("key", "value", "tags", "expires_at"),
            embedded=("agent", "key", "value"),
            vector_sql="SELECT t.id, t.agent, NULL AS thread, t.expires_at, v.vector FROM memory_vector v "
            "JOIN memory_short t ON t.id = v.row_id WHERE v.tier = ? AND v.model = ?",
            expires=True,
            content=("key", "value"),
        ),
    )
}
EMBEDDED_TIERS = tuple(tier for tier in TIER_TABLE.values() if tier.embedded)
LIVE_TIERS = tuple(tier for tier in TIER_TABLE.values() if not tier.archived)  # where writes land
WRITTEN_TIERS = f"({', '.join(repr(tier.name) for tier in LIVE_TIERS)})"  # SQL: their names in the event log


class WriteTally:
    """Writes per writer and minute of the last day, counted from the event log as it grows (Store.writes_by_hour):
    each count reads only the events past `head`, the newest it counted. SQLite logs events in commit order (one
    writer at a time, AUTOINCREMENT ids), so none lands below it later."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.head = 0  # the newest event counted; 0: none yet
        self.minutes: Counter[tuple[str, int]] = Counter()  # (agent, minutes since the epoch) -> writes

    def add(self, rows: Iterable[tuple[str, int, int]], head: int) -> dict[str, list[int]]:
        """Count the rows (agent, minute, writes) up to event `head`; the day's writes per writer and hour ago."""
        self.minutes.update({(agent, minute): count for agent, minute, count in rows})
        self.head = head
        now = time.time()
        day_ago = (now - 86_400) // 60
        hours: dict[str, list[int]] = {}
        for (agent, minute), count in list(self.minutes.items()):
            if minute < day_ago:
                del self.minutes[(agent, minute)]
            else:
                hours.setdefault(agent, [0] * 24)[min(23, max(0, int((now - minute * 60) // 3600)))] += count
        return hours


TIERS = ("short", "long", "episodic", "durable")  # what callers name; durable is the fleet's persona records
DEFAULT_TIERS = ("long", "short")
SCOPES = ("own", "shared", "shared_except_self")
# Derived from the tier table. Where a tier's rows and their keyword indexes live: an archived episode keeps its
# id in the archive table. CONTENT_FIELDS: what a retraction's hash covers; OWN_COLUMNS: a row's own text in FTS5.
RETRACTABLE = {t.name: tuple(x.table for x in TIER_TABLE.values() if x.label == t.label) for t in LIVE_TIERS}
KEYWORD_INDEX = {t.name: tuple(x.fts for x in TIER_TABLE.values() if x.label == t.label) for t in LIVE_TIERS}
CONTENT_FIELDS = {t.name: t.content for t in LIVE_TIERS}
OWN_COLUMNS = {t.name: t.own_match for t in LIVE_TIERS}
FTS_TABLES = tuple(tier.fts for tier in TIER_TABLE.values())
REMOVALS = ("delete", "forget", "expire", "archive")  # events that carry no row
CARRIER_TEXTS = 20  # texts a forget looks for as context per keyword query (a fact's versions: solos_store.held_as)
MERGE_PAGES = 128  # FTS5 pages one merge step writes: about 10 ms at 100k facts, so no long write lock


PSYCOPG = "pip install 'psycopg[binary]==3.3.9' 'psycopg-pool==3.3.3'"


def is_postgres(db: str) -> bool:
    """Whether --db names a PostgreSQL database (solos_store_pg) rather than an SQLite file."""
    return db.startswith(("postgresql://", "postgres://"))


def shown(db: str) -> str:
    """--db as logs show it: an SQLite file's absolute path, a PostgreSQL URL without its password."""
    return re.sub(r"//([^:/@]*):[^@/]*@", r"//\1:***@", db) if is_postgres(db) else os.path.abspath(db)


class SchemaMismatch(Exception):
    """The fleet's database lacks a column the service needs."""


def read_resource(name: str) -> bytes:
    """A file shipped beside this module, also from inside the .pyz."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    loader = globals().get("__loader__")
    if loader is not None and hasattr(loader, "get_data"):
        return loader.get_data(path)
    with open(path, "rb") as handle:
        return handle.read()


def primary_code(error: sqlite3.Error) -> int | None:
    """SQLite's primary result code (extended codes carry it in their low byte)."""
    code = getattr(error, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def is_busy(error: sqlite3.Error) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED: another connection holds the lock."""
    return primary_code(error) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "locked" in str(error)


STORAGE_FAILING_S = 60  # /health says storage is failing this long after a call met a storage failure

# Conditions of the disk or the file, not of the request: 503 with Retry-After, and the connection is not reused.
STORAGE_FAILURES = {
    sqlite3.SQLITE_READONLY: "the database is read-only (file or folder permissions, or a read-only mount)",
    sqlite3.SQLITE_FULL: "the disk holding the database is full",
    sqlite3.SQLITE_IOERR: "the disk reported an I/O error",
    sqlite3.SQLITE_CANTOPEN: "the database file cannot be opened",
    sqlite3.SQLITE_PERM: "access to the database is denied",
    sqlite3.SQLITE_CORRUPT: "the database file is damaged",
    sqlite3.SQLITE_NOTADB: "the database file is not an SQLite database",
}


def unopenable(path: str) -> str | None:
    """Why SQLite cannot open or make a database at path, as the file system tells it; None where it does not.

    SQLite says only "unable to open database file" for all of these."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return "it is a folder, not a database file"
    if not os.path.isdir(folder):
        return f"its folder {folder} does not exist"
    if not os.path.exists(path) and not os.access(folder, os.W_OK | os.X_OK):
        return f"its folder {folder} cannot be written, so the database cannot be made there"
    return None


def read_varint(blob: bytes) -> int:
    """SQLite's varint at the start of blob: 7 bits a byte, high bit set while more follow; a ninth byte has 8."""
    value = 0
    for index, byte in enumerate(blob[:9]):
        if index == 8:
            return (value << 8) | byte
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            break
    return value


def decode_text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def leniently(conn: Any, begin: str, work: Callable[[Any], Any]) -> Any:
    """work(conn) inside the transaction `begin` opened; text another writer stored as invalid UTF-8 is read
    with U+FFFD rather than failing every call (and every round of a background thread) that meets the row.
    Only then, and from scratch: the C decoder is 0.1 ms per recall faster."""
    try:
        return work(conn)
    except sqlite3.OperationalError as error:
        if "Could not decode to UTF-8" not in str(error) or conn.text_factory is not str:
            raise
        # Once per connection (it reads leniently from now on): the column, never the text. migrate names the row.
        column = re.search(r"column '([^']*)'", str(error))
        log_event("text_not_utf8", column=column and column[1], read_as="U+FFFD for each byte that is not UTF-8")
        conn.execute("ROLLBACK")
        conn.text_factory = decode_text
        conn.execute(begin)
        return work(conn)


def unregistered(agent: str) -> UnknownAgent:
    """A write or read by an agent agent_registry does not hold (both stores raise this one)."""
    return UnknownAgent(f"agent {agent!r} is not registered in agent_registry", "agent")


def reused_key(idempotency_key: str, earlier_id: int) -> Conflict:
    """An episodic write whose idempotency key an earlier, different event holds (both stores raise this one)."""
    return Conflict(
        f"idempotency_key {idempotency_key!r} was used for a different event (id {earlier_id})", "idempotency_key"
    )


@dataclass(eq=False)
class QueuedWrite:
    """One write waiting for a group commit (Store.run): whether it leads the next one, and once done its result or
    its error. `woken` is set when it is done, or when it is handed the lead."""

    work: Callable[[sqlite3.Connection], Any]
    leads: bool = False
    done: bool = False
    result: Any = None
    error: BaseException | None = None
    woken: threading.Event = field(default_factory=threading.Event)

    def finish(self, result: Any, error: BaseException | None) -> None:
        self.result, self.error, self.done = result, error, True
        self.woken.set()


def run_each(batch: list[QueuedWrite], conn: sqlite3.Connection) -> list[tuple[Any, BaseException | None]]:
    """Each queued write in a savepoint: its own failure (a refusal, a constraint) rolls back its changes alone.

    What fails the transaction itself (busy, a storage failure, text to decode again) propagates to
    Store.attempt, which retries or fails the whole batch as it would one write.
    """
    outcomes: list[tuple[Any, BaseException | None]] = []
    for queued in batch:
        conn.execute("SAVEPOINT queued_write")
        try:
            outcomes.append((queued.work(conn), None))
        except sqlite3.Error as error:
            if whole_transaction(error):
                raise
            conn.execute("ROLLBACK TO queued_write")
            outcomes.append((None, error))
        except Exception as error:  # a ServiceError (Conflict, UnknownAgent, ...) or a bug: this write's alone
            conn.execute("ROLLBACK TO queued_write")
            outcomes.append((None, error))
        conn.execute("RELEASE queued_write")
    return outcomes


def whole_transaction(error: sqlite3.Error) -> bool:
    """Errors Store.attempt handles for the whole transaction: busy, storage failures, undecodable text."""
    return (
        STORAGE_FAILURES.get(primary_code(error) or 0) is not None
        or (isinstance(error, sqlite3.OperationalError) and is_busy(error))
        or "Could not decode to UTF-8" in str(error)
    )


class PooledConnection(sqlite3.Connection):
    """A connection that knows whether it may go back to the pool, and carries its store's queries (Visibility.read
    and the capabilities' helpers that are handed only a connection reach them as `conn.queries`)."""

    queries: Queries

    # False for one opened while the file was not writable (SQLite then silently opens it read-only, for
    # good) and for one that met a storage failure: reusing either kept writes failing after the cause was gone.
    reusable = True
    shortened = False  # its busy_timeout is cut to what is left of one call's budget, until the call ends


FLEET_OWNED_TABLES = ("agent_registry", "memory_durable")
WRITE_ACTIONS = (sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE)


def deny_fleet_writes(action: int, table: str | None, *_: Any) -> int:
    """SQLite authorizer: the service never writes the fleet's registry or durable records."""
    if action in WRITE_ACTIONS and table in FLEET_OWNED_TABLES:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


class Visibility:
    """Which rows one caller may see in one scope: one rule, asked three ways, built once per call.

    `where` gives SQL over alias t (recall's keyword leg, every read by id or recency), `mask` a numpy filter
    over an array of writers (the vector leg), `allows` the answer for one row (events). `sharing` holds the
    agents who opted in to episodic sharing, read in the caller's own transaction, so the three forms agree
    row for row (tests/test_visibility.py). A durable row (a persona) is its own agent's alone.

    As of a past time the rule says more, asked two ways (`where_as_of` over versions, `allows_version` for
    one): another agent's episode is shown only in versions that were current while its author was sharing
    (`spans`, episodic_sharing_span), and another agent's row its writer deleted before its end is shown no
    more. `operator` is the operator's view of what `caller` was shown: the caller's own episodes count as
    anyone's, shown only where their author shared them. Every row a caller is handed goes through `audit`,
    which logs the foreign episodic ones, whichever operation hands them over (tests/test_provenance.py walks
    every operation that returns rows).
    """

    def __init__(
        self,
        caller: str,
        scope: str,
        sharing: Iterable[str] = (),
        queries: Queries | None = None,
        spans: Iterable[tuple[str, str, str | None]] = (),
        operator: bool = False,
    ):
        self.caller, self.scope, self.sharing = caller, scope, frozenset(sharing)
        self.queries: Queries = queries or SQLITE  # whose SQL `where` speaks
        self.spans, self.operator = tuple(spans), operator

    @classmethod
    def read(cls, conn: Any, caller: str, scope: str) -> Visibility:
        return cls(caller, scope, conn.queries.sharing_agents(conn), conn.queries)

    @classmethod
    def read_past(cls, conn: Any, caller: str, scope: str, operator: bool = False) -> Visibility:
        """For as-of reads: with when each author was sharing."""
        queries: Queries = conn.queries
        return cls(caller, scope, queries.sharing_agents(conn), queries, queries.sharing_spans(conn), operator)

    def widened(self) -> Visibility:
        """The same caller in scope shared: for rows read as ranking inputs only, never returned."""
        return Visibility(self.caller, "shared", self.sharing, self.queries, self.spans, self.operator)

    def own(self, agent: str) -> bool:
        """Whether an opt-in row of agent's is the caller's own (never in the operator's view)."""
        return agent == self.caller and not self.operator

    def allows(self, tier: str, agent: str, expires_at: str | None = None, now: str | None = None) -> bool:
        """One row: its writer's, and with `expires_at`, whether it is still live at `now` (default: now)."""
        if expires_at and TIER_TABLE[tier].expires and expires_at <= (now or utc_now()):
            return False
        if tier == "durable":
            return self.own(agent)
        if (self.scope == "own" and agent != self.caller) or (
            self.scope == "shared_except_self" and agent == self.caller
        ):
            return False
        return not TIER_TABLE[tier].opt_in or self.own(agent) or agent in self.sharing

    def hides(self, tier: str, row: Any, live: bool = True) -> bool:
        """Whether a row another agent wrote is one the caller could not recall now (unshared, expired, deleted):
        a call naming it answers as for no row at all, so a refusal never tells that the row exists."""
        fields = dict(row)
        return not live or not self.allows(tier, fields["agent"], fields.get("expires_at"))

    def shared_at(self, tier: str, agent: str, at: str) -> bool:
        """Whether another agent's opt-in row was shared at `at` (`spans`): a removal event carries no row to judge
        now, so it reaches others only if its author shared when it was made (and, by `allows`, shares now)."""
        return (
            tier not in TIER_TABLE  # durable: its own agent's alone (allows)
            or not TIER_TABLE[tier].opt_in
            or self.own(agent)
            or any(a == agent and start <= at < (end or "~") for a, start, end in self.spans)
        )

    def allows_version(self, tier: str, agent: str, valid_from: str, valid_to: str | None, deleted: bool) -> bool:
        """One version as of a past time (valid_to None: the current one); `deleted`: its row was deleted."""
        if not self.allows(tier, agent) or (deleted and not self.own(agent)):
            return False
        until = valid_to or "~"  # after every timestamp
        return (
            not TIER_TABLE[tier].opt_in
            or self.own(agent)
            or any(a == agent and start < until and (end or "~") > valid_from for a, start, end in self.spans)
        )

    @staticmethod
    def unexpired(tier: Tier, now: str) -> list[str]:
        """SQL (alias t): the row is live at `now` (SQL: the store's NOW), for a tier whose rows expire."""
        return [f"t.expires_at > {now}"] if tier.expires else []

    def where(self, tier: Tier) -> tuple[list[str], list[Any]]:
        """SQL (alias t): the rows of `tier` the caller may see now (live: not expired)."""
        where, params = self.scoped(tier)
        return where + self.unexpired(tier, self.queries.NOW), params

    def scoped(self, tier: Tier) -> tuple[list[str], list[Any]]:
        """SQL (alias t): scope and sharing, as of any time."""
        where: list[str] = []
        params: list[Any] = []
        if self.scope == "own":
            where.append("t.agent = ?")
            params.append(self.caller)
        elif self.scope == "shared_except_self":
            where.append("t.agent != ?")
            params.append(self.caller)
        if tier.opt_in:
            where.append(f"(t.agent = ? OR t.agent {self.queries.IDS_IN})")
            params.extend([self.caller if not self.operator else "", self.queries.text_list(sorted(self.sharing))])
        return where, params

    def where_as_of(self, tier: Tier, deleted: str, at: str) -> tuple[list[str], list[Any]]:
        """`where` over versions (alias t: VERSION_FIELDS) as of `at`, with the sharing and delete rules and expiry
        as of `at`; `deleted` is SQL true when t's row was deleted."""
        where, params = self.scoped(tier)
        where.append("(t.expires_at IS NULL OR t.expires_at > ?)")
        params.append(at)
        own = "" if self.operator else self.caller
        where.append(f"(t.agent = ? OR NOT {deleted})")
        params.append(own)
        if tier.opt_in:
            where.append(
                "(t.agent = ? OR EXISTS (SELECT 1 FROM episodic_sharing_span s WHERE s.agent = t.agent "
                "AND s.shared_from < coalesce(t.valid_to, '~') AND coalesce(s.shared_until, '~') > t.valid_from))"
            )
            params.append(own)
        return where, params

    def mask(self, tier: Tier, agents: Any, expires: Any = None, now: str | None = None) -> Any:
        """A boolean array: which of these writers' rows of `tier` the caller may see (numpy); with `expires` (an
        array of expires_at, "" for none), only those live at `now` (default: this second, as the vector leg's
        candidates are re-read through `where`)."""
        import numpy as np

        mask = np.ones(len(agents), dtype=bool)
        if expires is not None and tier.expires:
            now = now or time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
            mask &= ((expires == "") | (expires > now)).astype(bool)
        if self.scope == "own":
            mask &= agents == self.caller
        elif self.scope == "shared_except_self":
            mask &= agents != self.caller
        if tier.opt_in:
            mask &= np.isin(agents, [*self.sharing, *([] if self.operator else [self.caller])])
        return mask.astype(bool)

    def audit(self, store: Any, rows: Iterable[tuple[str, str, int]], reader: str | None = None) -> None:
        """Log the foreign episodic rows among these (tier, writer, id) before they are handed to the caller (or
        `reader`, who asks on its behalf); a failed audit raises, so nothing goes out unlogged."""
        foreign = [
            (agent, row_id)
            for tier, agent, row_id in rows
            if tier in TIER_TABLE and TIER_TABLE[tier].opt_in and not self.own(agent)
        ]
        if foreign:
            store.record_audit(reader or self.caller, foreign)


def refuse_foreign_persona(tiers: Sequence[str], scope: str) -> None:
    """Durable memory is private: shared_except_self with durable asks for other agents' personas."""
    if "durable" in tiers and scope == "shared_except_self":
        raise Forbidden("durable memory is private: an agent may read only its own persona/<agent> record", "tiers")


class Store:
    """The SQLite database: connections, transactions with retry, every query.

    An admin store (the CLI registering agents) may write agent_registry; the
    serving store cannot, enforced by an authorizer on every connection.
    """

    BEGIN_READ, BEGIN_WRITE = "BEGIN", "BEGIN IMMEDIATE"  # a read snapshot; a write that takes the lock up front
    shared_by_copies = False  # one service per SQLite file; PostgreSQL's store may have copies on other hosts
    host_clock = True  # the database stamps rows by this host's clock (SQLite's strftime); PostgreSQL's by its own
    # Workers (solos_workers): (this one's remainder, count): its background pass embeds the rows whose id leaves
    # that remainder, so no two workers embed one row (PostgreSQL's store claims rows instead).
    embed_share: tuple[int, int] | None = None

    def __init__(self, path: str, busy_timeout_ms: int = 5000, admin: bool = False):
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self.admin = admin
        self.pool: queue.LifoQueue[PooledConnection] = queue.LifoQueue()
        # The service's own writers queue here, in order, rather than race for SQLite's lock: its busy
        # handler polls with sleeps of up to 100 ms, so sixteen threads contending lose their time asleep
        # (bench/write_throughput.py, 16 clients: p99 104 -> 11 ms) and the fleet's writers meet sixteen rivals.
        self.write_lock = threading.Lock()
        # Writes queued behind the lock's holder, which commits them with its own (group commit, see run).
        self.queued: list[QueuedWrite] = []
        self.queue_lock = threading.Lock()
        self.leading = False  # a queued write leads: the next ones wait for it, not for the lock
        self.queries: Queries = SQLITE  # every query outside Store's own (PgStore: PgQueries)
        self.tally = WriteTally()  # writes per writer and minute, for writes_by_hour
        # The last storage failure (why, when): what /health says of the database.
        self.storage_failure: tuple[str, float] | None = None

    # -- connections --

    def connect(self) -> PooledConnection:
        """A connection with the fleet's pragmas, read back to be sure they took."""
        writable = os.access(self.path, os.W_OK) and os.access(os.path.dirname(os.path.abspath(self.path)), os.W_OK)
        conn = sqlite3.connect(
            self.path,
            isolation_level=None,
            check_same_thread=False,
            timeout=self.busy_timeout_ms / 1000,
            factory=PooledConnection,
        )
        conn.reusable = writable
        conn.queries = self.queries
        conn.row_factory = sqlite3.Row
        # WAL lets agents read while one writes; busy_timeout absorbs the fleet's short write locks.
        mode = conn.execute("PRAGMA journal_mode=wal").fetchone()[0]
        if mode != "wal":
            conn.close()
            raise StorageUnavailable(f"journal_mode is {mode!r}: WAL could not be enabled (is the folder writable?)")
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
        if conn.execute("PRAGMA busy_timeout").fetchone()[0] != self.busy_timeout_ms:
            raise RuntimeError(f"{self.path}: busy_timeout did not take")
        # FULL: an acknowledged write survives power loss, not only a process crash.
        conn.execute("PRAGMA synchronous=FULL")
        self.queries.secure_delete(conn)  # what any delete removes is zeroed, not left in free pages (forget)
        if not self.admin:
            conn.set_authorizer(deny_fleet_writes)
        return conn

    def checkout(self) -> PooledConnection:
        try:
            return self.pool.get_nowait()
        except queue.Empty:
            return self.connect()

    def checkin(self, conn: PooledConnection) -> None:
        if conn.reusable and conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                conn.reusable = False
        if conn.reusable and self.pool.qsize() < POOL_SIZE:
            self.pool.put(conn)
        else:
            conn.close()

    def close(self) -> None:
        while not self.pool.empty():
            self.pool.get_nowait().close()

    def run(self, work: Callable[[sqlite3.Connection], Any], write: bool) -> Any:
        """Run work on one connection, in a short BEGIN IMMEDIATE if it writes.

        A busy database is retried with backoff up to BUSY_RETRIES times, all
        inside one busy_timeout budget, then refused with Busy (503): never an
        empty success.
        """
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        if not write:
            return self.attempt(work, write, deadline)
        # Group commit: a write queues; the first of a run leads. The leader takes the lock and runs every write
        # queued by then in one transaction, each in a savepoint of its own, and its one COMMIT (one WAL sync,
        # FULL as ever) acknowledges them all, each woken by its own event; then it hands the lead to the first
        # write queued since. Sixteen writers otherwise pay sixteen syncs and a chain of sixteen lock hand-offs,
        # each waking one thread after the other (bench/write_throughput.py).
        mine = QueuedWrite(work)
        with self.queue_lock:
            self.queued.append(mine)
            mine.leads, self.leading = not self.leading, True
        if not mine.leads and not mine.woken.wait(self.busy_timeout_ms / 1000):
            with self.queue_lock:
                abandoned = not mine.leads and mine in self.queued
                if abandoned:
                    self.queued.remove(mine)
            if abandoned:
                raise Busy(f"database is locked: this service's own writes queued for {self.busy_timeout_ms} ms")
        if mine.leads and not mine.done:
            self.lead(mine, deadline)
        mine.woken.wait()  # a leader carries it: its outcome comes with that leader's COMMIT
        if mine.error is not None:
            raise mine.error
        return mine.result

    def lead(self, mine: QueuedWrite, deadline: float) -> None:
        """Commit everything queued in one transaction under the write lock, then hand the lead on."""
        try:
            if not self.write_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                with self.queue_lock:  # only the leader gives up: the rest stay queued for the next one
                    self.queued.remove(mine)
                mine.finish(
                    None, Busy(f"database is locked: this service's own writes queued for {self.busy_timeout_ms} ms")
                )
                return
            try:
                with self.queue_lock:
                    batch, self.queued = self.queued, []
                self.commit_together(batch, deadline)
            finally:
                self.write_lock.release()
        finally:
            with self.queue_lock:
                if self.queued:
                    self.queued[0].leads = True
                    self.queued[0].woken.set()
                else:
                    self.leading = False

    def commit_together(self, batch: list[QueuedWrite], deadline: float) -> None:
        """The queued writes in one transaction: each one's own failure undoes only its savepoint; a busy or
        failing database fails them all (none is acknowledged)."""
        outcomes: list[tuple[Any, BaseException | None]]
        try:
            if len(batch) == 1:  # alone: as it always ran, no savepoint
                outcomes = [(self.attempt(batch[0].work, True, deadline), None)]
            else:
                outcomes = self.attempt(functools.partial(run_each, batch), True, deadline)
        except BaseException as failure:  # handed to every writer in the batch, raised in each
            outcomes = [(None, failure)] * len(batch)
        for queued, (result, error) in zip(batch, outcomes):
            queued.finish(result, error)

    def attempt(self, work: Callable[[sqlite3.Connection], Any], write: bool, deadline: float) -> Any:
        """run's retries: up to BUSY_RETRIES more tries before the deadline, then Busy."""
        for attempt in range(BUSY_RETRIES + 1):
            conn = None
            try:
                conn = self.checkout()
                remaining_ms = max(1, int((deadline - time.monotonic()) * 1000))
                if (attempt or write) and remaining_ms < self.busy_timeout_ms - BUSY_SLACK_MS:
                    # A retry, or a write that queued, waits only for what is left. One that has hardly
                    # waited keeps the full timeout: two PRAGMAs were 7% of a write (bench/write_throughput.py).
                    conn.execute(f"PRAGMA busy_timeout={remaining_ms}")
                    conn.shortened = True
                # Reads get one snapshot (cheap under WAL); writes take the lock up front, briefly.
                begin = "BEGIN IMMEDIATE" if write else "BEGIN"
                conn.execute(begin)
                result = leniently(conn, begin, work)
                conn.execute("COMMIT")
                return result
            except sqlite3.Error as error:
                failure = STORAGE_FAILURES.get(primary_code(error) or 0)
                if failure is not None:
                    self.storage_failed(failure)
                    if conn is not None:
                        conn.reusable = False
                    self.close()  # its pool-mates may have opened in the same spell: start afresh
                    log_event("storage_failure", db=self.path, reason=failure, error=str(error))
                    raise StorageUnavailable(f"{failure}; nothing was changed, retry later") from None
                if not (isinstance(error, sqlite3.OperationalError) and is_busy(error)):
                    raise
                last_error = error
            finally:
                if conn is not None:
                    if conn.shortened and conn.reusable:
                        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
                        conn.shortened = False
                    self.checkin(conn)
            pause = min(0.05 * 2**attempt, deadline - time.monotonic())
            if pause <= 0 or attempt == BUSY_RETRIES:
                break
            time.sleep(pause)
        raise Busy(
            f"database is locked by another writer; gave up after {attempt + 1} attempts "
            f"in {self.busy_timeout_ms} ms ({last_error})"
        )

    def read(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        return self.run(work, write=False)

    def read_alone(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        """A read whose statements need no snapshot in common (one, or each valid on its own): on PostgreSQL each
        is its own transaction, with no BEGIN and COMMIT round trips (a thread's look every 0.1 s took three)."""
        return self.read(work)

    def write(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        return self.run(work, write=True)

    def in_chunks(self, chunk: Callable[[], int], more: Callable[[int], bool]) -> int:
        """A bulk write as short transactions: `chunk()` writes one (its own BEGIN IMMEDIATE) and returns its
        rows, `more(rows)` says whether another follows; between two the lock is left free (between_chunks), so
        the fleet's writers get in. Returns the rows of all. Each chunk commits whole, so a crash between two
        leaves what the job did so far committed; a job that picks its rows afresh each time (purge, archive, event
        prune, merge, reindex) carries on from there at its next run."""
        total = 0
        while True:
            started = time.monotonic()
            rows = chunk()
            total += rows
            if not more(rows):
                return total
            self.between_chunks(time.monotonic() - started)

    def between_chunks(self, held_s: float) -> None:
        """Leave SQLite's write lock free for as long as the last chunk held it (CHUNK_PAUSE_S bounds)."""
        time.sleep(min(max(held_s, CHUNK_PAUSE_S[0]), CHUNK_PAUSE_S[1]))

    # -- schema --

    def migrate(self) -> None:
        """Create what is missing (additive only) after checking what exists."""
        try:
            conn = self.connect()
        except sqlite3.OperationalError as error:  # at start: say which path, not only SQLite's "unable to open"
            why = unopenable(self.path) if primary_code(error) == sqlite3.SQLITE_CANTOPEN else None
            if why is None:
                raise
            raise StorageUnavailable(f"the database cannot be opened: {why} ({error})") from None
        try:
            if not conn.execute("SELECT sqlite_compileoption_used('ENABLE_FTS5')").fetchone()[0]:
                raise SchemaMismatch("this SQLite has no FTS5; keyword recall needs it")
            existing = {
                row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")
            }
            for table, needed in REQUIRED_COLUMNS.items():
                if table not in existing:
                    continue
                have = {row[1] for row in conn.execute("SELECT * FROM pragma_table_info(?)", (table,))}
                for column in needed:
                    if column not in have:
                        raise SchemaMismatch(f"table {table} has no column {column}; solos-memory needs it")
            schema = read_resource("schema.sql").decode("utf-8")
            # One transaction with the new indexes' fill: a new index committed empty would never be filled, the
            # next start finding it there.
            conn.executescript("BEGIN IMMEDIATE;\n" + schema)
            for fts in FTS_TABLES:
                if fts not in existing:  # new index over rows the fleet already has
                    self.rebuild_index(conn, fts)
            conn.execute(
                "INSERT INTO solos_memory_meta (key, value) VALUES ('schema_version', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (SCHEMA_VERSION,),
            )
            conn.execute("INSERT OR IGNORE INTO solos_memory_meta (key, value) VALUES ('vector_generation', 0)")
            # When this database began expecting the daily jobs (solos_jobs): one never run is overdue a period later.
            conn.execute(
                "INSERT OR IGNORE INTO solos_memory_meta (key, value) "
                "VALUES (?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
                (JOBS_WATCHED_SINCE,),
            )
            # This database's identity, made once (copies, backups and snapshots of the file share it):
            # `migrate` records it in its target and refuses another source's.
            conn.execute(
                "INSERT OR IGNORE INTO solos_memory_meta (key, value) VALUES (?, lower(hex(randomblob(16))))",
                (DATABASE_ID,),
            )
            self.queries.mark_row_ids(conn)
            conn.execute("COMMIT")
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.close()

    @staticmethod
    def rebuild_index(conn: sqlite3.Connection, fts: str) -> None:
        """Refill one keyword index from its table, as the triggers would have."""
        if fts != "memory_longterm_fts":
            conn.execute(f"INSERT INTO {fts} ({fts}) VALUES ('rebuild')")
            return
        conn.execute("DELETE FROM memory_longterm_fts")
        # context: the two previous facts of the same topic, newest first, as the insert trigger writes it.
        conn.execute(
            "INSERT INTO memory_longterm_fts (rowid, topic, fact, tags, agent, context) "
            "SELECT id, topic, fact, tags, agent, CASE WHEN topic <> '' THEN trim("
            "    coalesce(lag(agent, 1) OVER w || ': ' || lag(fact, 1) OVER w, '') || ' ' || "
            "    coalesce(lag(agent, 2) OVER w || ': ' || lag(fact, 2) OVER w, '')) ELSE '' END "
            "FROM memory_longterm WINDOW w AS (PARTITION BY topic ORDER BY id)"
        )

    def reindex(self) -> None:
        """Rebuild the keyword indexes from their tables, each in a write transaction of its own with the lock left
        free between two (in_chunks). One index's rebuild is one FTS5 statement that cannot be cut: the largest
        holds the lock longest (1.5 s per 100k episodes, bench/write_lock.py). Stopped between two, each index is
        either its old self or rebuilt, and a second run rebuilds them all."""
        left = list(FTS_TABLES)

        def one() -> int:
            fts = left.pop(0)
            self.write(lambda conn: self.rebuild_index(conn, fts))
            return len(left)

        self.in_chunks(one, bool)

    # -- agents (admin CLI only; the HTTP service never writes agent_registry) --

    def register_agents(self, names: list[str]) -> list[str]:
        """Insert agents that are not registered yet; return the ones added."""

        def work(conn: sqlite3.Connection) -> list[str]:
            added = []
            for name in names:
                cursor = conn.execute("INSERT INTO agent_registry (agent) VALUES (?) ON CONFLICT DO NOTHING", (name,))
                if cursor.rowcount:
                    added.append(name)
            return added

        return self.write(work)

    def list_agents(self) -> list[str]:
        return self.read(
            lambda conn: [row[0] for row in conn.execute("SELECT agent FROM agent_registry ORDER BY agent")]
        )

    @staticmethod
    def require_agent(conn: sqlite3.Connection, agent: str) -> None:
        if conn.execute("SELECT 1 FROM agent_registry WHERE agent = ?", (agent,)).fetchone() is None:
            raise unregistered(agent)

    # -- writes --

    def upsert_short(
        self, agent: str, key: str, value: str, ttl_s: float, tags: list[str], vector: Embedded | None = None
    ) -> dict:
        def work(conn: sqlite3.Connection) -> dict:
            self.require_agent(conn, agent)
            self.hold_key(conn, agent, "short", key)  # the same key written twice at once: one is `created`
            existing = conn.execute("SELECT id FROM memory_short WHERE agent = ? AND key = ?", (agent, key)).fetchone()
            row = conn.execute(
                "INSERT INTO memory_short (agent, key, value, tags, created_at, expires_at) "
                f"VALUES (?, ?, ?, ?, {self.queries.NOW}, {self.queries.SHIFTED}) "
                "ON CONFLICT (agent, key) DO UPDATE SET value = excluded.value, tags = excluded.tags, "
                "    created_at = excluded.created_at, expires_at = excluded.expires_at "
                "RETURNING id, expires_at",
                (agent, key, value, json.dumps(tags), f"+{ttl_s:.3f} seconds"),
            ).fetchone()
            outcome = {"id": row["id"], "status": "updated" if existing else "created", "expires_at": row["expires_at"]}
            return self.keep_vector(conn, "short", outcome, vector)

        return self.write(work)

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
        return self.write(
            lambda conn: self.keep_vector(
                conn, "long", self.put_long(conn, agent, topic, fact, source, confidence, tags), vector
            )
        )

    def put_long(
        self,
        conn: sqlite3.Connection,
        agent: str,
        topic: str | None,
        fact: str,
        source: str | None,
        confidence: float | None,
        tags: list[str],
    ) -> dict:
        """upsert_long inside the caller's transaction: an identical retry changes nothing (`unchanged`)."""
        self.require_agent(conn, agent)
        self.hold_key(conn, agent, "long", sha256_text(fact))
        known = self.known_long(conn, agent, fact)
        if known is None:
            return {"id": self.insert_long(conn, agent, topic, fact, source, confidence, tags), "status": "created"}
        same = self.queries.SAME
        changed = conn.execute(
            f"UPDATE memory_longterm SET topic = ?, source = ?, confidence = ?, tags = ?, "
            f"updated_at = {self.queries.NOW} "
            f"WHERE id = ? AND NOT (topic {same} ? AND source {same} ? AND confidence {same} ? AND tags {same} ?)",
            (topic, source, confidence, json.dumps(tags), known, topic, source, confidence, json.dumps(tags)),
        ).rowcount
        return {"id": known, "status": "updated" if changed else "unchanged"}

    @staticmethod
    def hold_key(conn: sqlite3.Connection, agent: str, tier: str, key: str) -> None:
        """Serialize writes of one write key until commit: SQLite's single writer already does."""

    @staticmethod
    def known_long(conn: Any, agent: str, fact: str) -> int | None:
        """The writer's row holding exactly this fact (keyed by the full text's sha256), if there is one; locked until
        commit (a forget deleting it now is waited for, and then it is not found)."""
        row = conn.execute(
            "SELECT l.id FROM memory_write_key k JOIN memory_longterm l ON l.id = k.row_id "
            "WHERE k.agent = ? AND k.tier = 'long' AND k.key = ? AND l.agent = k.agent AND l.fact = ? "
            + conn.queries.LOCKED,
            (agent, hashlib.sha256(fact.encode("utf-8")).hexdigest(), fact),
        ).fetchone()
        return None if row is None else row[0]

    @staticmethod
    def insert_long(
        conn: sqlite3.Connection,
        agent: str,
        topic: str | None,
        fact: str,
        source: str | None,
        confidence: float | None,
        tags: list[str],
    ) -> int:
        """A new long fact and its write key (the full text's sha256), so the same fact again finds it."""
        row_id = conn.execute(
            "INSERT INTO memory_longterm (agent, topic, fact, source, confidence, tags) "
            "VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
            (agent, topic, fact, source, confidence, json.dumps(tags)),
        ).fetchone()[0]
        Store.remember_key(conn, agent, "long", hashlib.sha256(fact.encode("utf-8")).hexdigest(), row_id)
        return row_id

    def append_episodic(
        self, agent: str, event: dict, idempotency_key: str | None, vector: Embedded | None = None
    ) -> dict:
        columns = EPISODE_RESULT

        def work(conn: sqlite3.Connection) -> dict:
            self.require_agent(conn, agent)
            if idempotency_key:
                self.hold_key(conn, agent, "episodic", idempotency_key)
                # The key's episode, in the hot table or, once `purge` moved it, in the archive (no vector there).
                earlier = conn.execute(
                    f"SELECT e.id, {', '.join(columns)}, 0 AS archived FROM memory_write_key k "
                    "JOIN memory_episodic e ON e.id = k.row_id "
                    "WHERE k.agent = ? AND k.tier = 'episodic' AND k.key = ? AND e.agent = k.agent UNION ALL "
                    f"SELECT a.id, {', '.join(columns)}, 1 FROM memory_write_key k "
                    "JOIN memory_episodic_archive a ON a.id = k.row_id "
                    "WHERE k.agent = ? AND k.tier = 'episodic' AND k.key = ? AND a.agent = k.agent",
                    (agent, idempotency_key, agent, idempotency_key),
                ).fetchone()
                if earlier:
                    if any(earlier[c] != event[c] for c in columns):
                        raise reused_key(idempotency_key, earlier["id"])
                    unchanged = {"id": earlier["id"], "status": "unchanged"}
                    return unchanged if earlier["archived"] else self.keep_vector(conn, "episodic", unchanged, vector)
            row_id = conn.execute(
                "INSERT INTO memory_episodic (agent, event_type, summary, details, outcome, duration_s) "
                "VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
                (agent, *(event[c] for c in columns)),
            ).fetchone()[0]
            if idempotency_key:
                self.remember_key(conn, agent, "episodic", idempotency_key, row_id)
            return self.keep_vector(conn, "episodic", {"id": row_id, "status": "created"}, vector)

        return self.write(work)

    @staticmethod
    def remember_key(conn: sqlite3.Connection, agent: str, tier: str, key: str, row_id: int) -> None:
        conn.execute(
            "INSERT INTO memory_write_key (agent, tier, key, row_id) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (agent, tier, key) DO UPDATE SET row_id = excluded.row_id",
            (agent, tier, key, row_id),
        )

    def delete_short(
        self, agent: str, key: str, before: Callable[[sqlite3.Connection, str, list[int]], None] | None = None
    ) -> dict:
        """Delete one short row; `before` is told its id first, in the same transaction (its text still there)."""

        def work(conn: sqlite3.Connection) -> dict:
            self.require_agent(conn, agent)
            found = conn.execute("SELECT id FROM memory_short WHERE agent = ? AND key = ?", (agent, key)).fetchone()
            if before is not None and found is not None:
                before(conn, "short", [found[0]])
            row = conn.execute(
                "DELETE FROM memory_short WHERE agent = ? AND key = ? "
                f"RETURNING id, expires_at <= {self.queries.NOW} AS expired",
                (agent, key),
            ).fetchone()
            if row is None:
                raise NotFound(f"agent {agent!r} has no short-term key {key!r}", "key")
            return {"id": row["id"], "status": "deleted", "was_expired": bool(row["expired"])}

        return self.write(work)

    def set_sharing(self, agent: str, episodic: bool) -> dict:
        def work(conn: sqlite3.Connection) -> dict:
            self.require_agent(conn, agent)
            self.hold_key(conn, agent, "sharing", "")  # as for a short key: one `created`
            existing = conn.execute("SELECT 1 FROM episodic_sharing WHERE agent = ?", (agent,)).fetchone()
            conn.execute(
                "INSERT INTO episodic_sharing (agent, shared) VALUES (?, ?) ON CONFLICT (agent) DO UPDATE "
                f"SET shared = excluded.shared, updated_at = {self.queries.NOW}",
                (agent, int(episodic)),
            )
            return {"status": "updated" if existing else "created"}

        return self.write(work)

    def purge_expired(self, batch: int = 1000) -> int:
        """Delete expired short rows and the kept versions of short values past their expiry, in short batches so
        no write lock is held long; returns the rows deleted. Each batch queues the short tier's scrub
        (solos_forget.purge runs it): the index segments and the WAL still hold the words."""
        full: list[bool] = []

        def chunk() -> int:
            removed, versions = self.write(lambda conn: self.queries.purge_expired_short(conn, batch))
            full.append(max(removed, versions) >= batch)
            return removed

        return self.in_chunks(chunk, lambda _: full[-1])

    def record_audit(self, reader: str, rows: list[tuple[str, int]]) -> None:
        """Log foreign episodic rows handed to reader; they are not returned unlogged."""
        self.write(
            lambda conn: conn.executemany(
                "INSERT INTO episodic_read_audit (reader, author, row_id) VALUES (?, ?, ?)",
                [(reader, author, row_id) for author, row_id in rows],
            )
        )

    # -- reads --

    def read_audit(self, author: str, limit: int, before_id: int | None) -> list[dict]:
        def work(conn: sqlite3.Connection) -> list[dict]:
            self.require_agent(conn, author)
            rows = conn.execute(
                "SELECT id, reader, author, row_id, read_at FROM episodic_read_audit "
                "WHERE author = ? AND id < ? ORDER BY id DESC LIMIT ?",
                (author, before_id or (1 << 62), limit),
            )
            return [dict(row) for row in rows]

        return self.read(work)

    def counts(self) -> dict:
        def work(conn: sqlite3.Connection) -> dict:
            one = lambda sql: conn.execute(sql).fetchone()[0]  # noqa: E731
            return {
                "agents": one("SELECT count(*) FROM agent_registry"),
                "rows": {
                    "short": one(f"SELECT count(*) FROM memory_short WHERE expires_at > {self.queries.NOW}"),
                    "short_expired": one(f"SELECT count(*) FROM memory_short WHERE expires_at <= {self.queries.NOW}"),
                    "long": one("SELECT count(*) FROM memory_longterm"),
                    "episodic": one("SELECT count(*) FROM memory_episodic"),
                    "durable": one("SELECT count(*) FROM memory_durable"),
                },
                "episodic_sharing_agents": one("SELECT count(*) FROM episodic_sharing WHERE shared = 1"),
                "audit_rows": one("SELECT count(*) FROM episodic_read_audit"),
            }

        return self.read(work)

    def writes_by_hour(self) -> dict[str, list[int]]:
        """Writes (rows created or changed) by each writer, the fleet's too, per hour of the last day (index 0:
        the last hour), from the event log: a row deleted or forgotten since still counts its writes.

        Counted per minute as the log grows (`WriteTally`): a call reads the events logged since the last one
        (the first, the day's). Scanning the day's log at every call cost stats and each load of the status page
        93 ms of CPU at 111k events a day (now 11 ms)."""
        day = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-1 day')"
        counted = (
            "SELECT CAST(agent AS TEXT), "
            "ifnull(CAST(strftime('%s', ts) AS INTEGER), CAST(strftime('%s', 'now') AS INTEGER)) / 60, "
            "count(*) FROM memory_event WHERE id > {since} AND id <= ? "
            f"AND ts >= {day} AND kind IN ('write', 'update') AND tier IN {WRITTEN_TIERS} GROUP BY 1, 2"
        )
        # Events are logged in id order, so the newest id before the day bounds the first count to the day's events.
        first = counted.format(
            since=f"ifnull((SELECT id FROM memory_event WHERE ts < {day} ORDER BY id DESC LIMIT 1), 0)"
        )
        later = counted.format(since="?")

        def work(conn: sqlite3.Connection) -> dict[str, list[int]]:
            head = conn.execute("SELECT ifnull(max(id), 0) FROM memory_event").fetchone()[0]
            with self.tally.lock:
                since = self.tally.head
                if not 0 < since <= head:  # nothing counted yet, or another database (restored): the day afresh
                    self.tally.minutes.clear()
                    rows = conn.execute(first, (head,)).fetchall()
                else:
                    rows = conn.execute(later, (since, head)).fetchall()
                return self.tally.add(rows, head)

        return self.read(work)

    # -- recall's reads: each filters by scope, sharing and expiry before any ranking --

    @staticmethod
    def visible(tier: Tier, seen: Visibility, tags: Sequence[str] = ()) -> tuple[list[str], list[Any]]:
        """WHERE clauses (over alias t) and their parameters: the rows of `tier` the caller may see, live (not
        expired), and with `tags`, carrying one of them (a tier without tags has none)."""
        where, params = seen.where(tier)
        queries = seen.queries
        if tags:
            where.append(queries.TAGGED if "tags" in tier.result_columns else "1 = 0")
            params.extend(queries.tagged_params(tags) if "tags" in tier.result_columns else [])
        return where, params

    def recent_rows(
        self, conn: sqlite3.Connection, tier: Tier, seen: Visibility, limit: int, tags: Sequence[str] = ()
    ) -> list:
        """The most recent rows the caller may read (a recall without words)."""
        where, params = self.visible(tier, seen, tags)
        sql = (
            f"SELECT {tier.columns}, 0.0 AS score FROM {tier.table} t "
            f"{'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY t.{tier.time_column} DESC, t.id DESC LIMIT ?"
        )
        return conn.execute(sql, (*params, limit)).fetchall()

    def rows_by_id(
        self, conn: sqlite3.Connection, tier: Tier, seen: Visibility, ids: list[int], tags: Sequence[str] = ()
    ) -> list:
        """Exactly these rows (another leg's candidates, a match's neighbours), if the caller may read them."""
        where, params = self.visible(tier, seen, tags)
        where.append(f"t.id {seen.queries.IDS_IN}")
        sql = f"SELECT {tier.columns}, 0.0 AS score FROM {tier.table} t WHERE {' AND '.join(where)}"
        return conn.execute(sql, (*params, seen.queries.id_list(ids))).fetchall()

    def ranked_rows(
        self,
        conn: sqlite3.Connection,
        tier: Tier,
        seen: Visibility,
        match: str,
        limit: int,
        tags: Sequence[str] = (),
    ) -> list[sqlite3.Row]:
        """The best BM25 matches the caller may read; `score` is -bm25 (higher is better)."""
        where, params = self.visible(tier, seen, tags)
        fts, weights = tier.fts, tier.bm25_weights
        # Rank inside FTS5, then join only the best: joining before the sort costs a table lookup
        # per matching row (bench/recall_latency.py, 1M rows: long tier p50 6.6 -> 3.9 ms, episodic
        # 35 -> 24 ms). With filters, rank OVERFETCH times as many; only when fewer than `limit`
        # pass them and more matches exist can allowed rows rank lower: then the full join runs.
        fetch = limit * OVERFETCH if where else limit
        ranked = (
            f"WITH m AS MATERIALIZED (SELECT rowid AS id, bm25({fts}, {weights}) AS rank FROM {fts} "
            f"WHERE {fts} MATCH ? ORDER BY rank LIMIT ?) "
            f"SELECT {tier.columns}, -m.rank AS score, (SELECT count(*) FROM m) AS ranked FROM m "
            f"JOIN {tier.table} t ON t.id = m.id {'WHERE ' + ' AND '.join(where) if where else ''} "
            "ORDER BY m.rank LIMIT ?"
        )
        rows = conn.execute(ranked, (match, fetch, *params, limit)).fetchall()
        if len(rows) == limit or not where or (rows and rows[0]["ranked"] < fetch):
            return rows
        sql = (
            f"SELECT {tier.columns}, -bm25({fts}, {weights}) AS score FROM {fts} "
            f"JOIN {tier.table} t ON t.id = {fts}.rowid WHERE {fts} MATCH ? "
            f"{''.join(' AND ' + w for w in where)} ORDER BY bm25({fts}, {weights}) LIMIT ?"
        )
        return conn.execute(sql, (match, *params, limit)).fetchall()

    def indexed_rows(self, conn: sqlite3.Connection, tier: Tier) -> int | None:
        """Rows in the tier's FTS5 index, read from FTS5's averages record (its first varint): no count scan."""
        row = conn.execute(f"SELECT block FROM {tier.fts}_data WHERE id = 1").fetchone()
        return read_varint(row[0]) if row and isinstance(row[0], bytes) and row[0] else None

    def matches_at_least(self, conn: sqlite3.Connection, tier: Tier, match: str, count: int) -> bool:
        """Whether `match` finds at least `count` rows of the tier's index; reads no more than that many."""
        return self.matches_up_to(conn, tier, match, count) >= count

    def matches_up_to(self, conn: sqlite3.Connection, tier: Tier, match: str, most: int) -> int:
        """The rows of the tier's index `match` finds, counted up to `most` (no more are read)."""
        sql = f"SELECT count(*) FROM (SELECT 1 FROM {tier.fts} WHERE {tier.fts} MATCH ? LIMIT ?)"
        return conn.execute(sql, (match, most)).fetchone()[0]

    def topic_neighbours(self, conn: sqlite3.Connection, ids: list[int]) -> dict[int, tuple[int | None, int | None]]:
        """For long facts, the previous and next fact of the same (non-empty) topic."""
        rows = conn.execute(
            "SELECT l.id, "
            "  (SELECT max(p.id) FROM memory_longterm p WHERE p.topic = l.topic AND p.id < l.id) AS previous, "
            "  (SELECT min(n.id) FROM memory_longterm n WHERE n.topic = l.topic AND n.id > l.id) AS following "
            f"FROM memory_longterm l WHERE l.topic <> '' AND l.id {self.queries.IDS_IN}",
            (self.queries.id_list(ids),),
        )
        return {row[0]: (row[1], row[2]) for row in rows}

    # -- vectors --

    def vector_generation(self, conn: sqlite3.Connection) -> int:
        return int(self.queries.meta_value(conn, "vector_generation") or 0)

    def load_vectors(self, conn: sqlite3.Connection, tier: str, model: str) -> sqlite3.Cursor:
        """Every vector of one tier made by `model`, with what the vector search filters on, row by row."""
        return conn.execute(TIER_TABLE[tier].vector_sql, (tier, model))

    def rows_missing_vectors(
        self, tier: str, model: str, limit: int, ids: list[int] | None = None, after: int = 0
    ) -> list[sqlite3.Row]:
        """Rows with no vector from `model` (new, changed, or embedded by another model), of `ids` if given; without
        ids, only this process's share of them (`embed_share`); past id `after` (a pass pages through them)."""
        table, select = TIER_TABLE[tier].table, TIER_TABLE[tier].columns
        only, params = ("", []) if ids is None else (" AND t.id " + self.queries.IDS_IN, [self.queries.id_list(ids)])
        if ids is None and self.embed_share is not None:
            only, params = " AND t.id % ? = ?", [self.embed_share[1], self.embed_share[0]]
        return self.read(
            lambda conn: conn.execute(
                f"SELECT {select} FROM {table} t LEFT JOIN memory_vector v ON v.tier = ? AND v.row_id = t.id "
                f"AND v.model = ? WHERE v.row_id IS NULL AND t.id > ?{only} ORDER BY t.id LIMIT ?",
                (tier, model, after, *params, limit),
            ).fetchall()
        )

    def lacking_vectors(self, tier: str, model: str, ids: list[int]) -> list[int]:
        """Which of these rows have no vector from `model` yet: on PostgreSQL, rows rows_missing_vectors did not
        hand over because another pass holds them (or is claiming them at this moment)."""
        table = TIER_TABLE[tier].table
        return self.read(
            lambda conn: [
                row[0]
                for row in conn.execute(
                    f"SELECT t.id FROM {table} t LEFT JOIN memory_vector v ON v.tier = ? AND v.row_id = t.id "
                    f"AND v.model = ? WHERE v.row_id IS NULL AND t.id {self.queries.IDS_IN} ORDER BY t.id",
                    (tier, model, self.queries.id_list(ids)),
                )
            ]
        )

    def save_vectors(self, tier: str, model: str, embedded: list[tuple[sqlite3.Row, bytes]]) -> tuple[list[int], int]:
        """Store vectors for rows whose text is still what was embedded; the ids saved and the vector generation."""
        table, fields = TIER_TABLE[tier].table, TIER_TABLE[tier].embedded

        def work(conn: sqlite3.Connection) -> tuple[list[int], int]:
            # As the row was read (read_as): a fleet writer's BLOB compares as its text, so its vector is kept.
            same_text = " AND ".join(f"CAST({name} AS TEXT) {self.queries.SAME} ?" for name in fields)
            saved = []
            for row, vector in embedded:
                current = (row["id"], *(row[name] for name in fields))
                if tier == "long":
                    changed = conn.execute(
                        f"UPDATE memory_longterm SET embedding = ? WHERE id = ? AND {same_text}", (vector, *current)
                    ).rowcount
                    stored = None  # the long tier keeps its vector in memory_longterm.embedding
                else:  # locked, as the UPDATE above locks it: a forget deleting it is waited for, not read past
                    stored = vector
                    same = f"SELECT 1 FROM {table} l WHERE id = ? AND {same_text} {self.queries.LOCKED}"
                    changed = conn.execute(same, current).fetchone() is not None
                if changed:
                    conn.execute(
                        "INSERT INTO memory_vector (tier, row_id, model, vector) VALUES (?, ?, ?, ?) ON CONFLICT "
                        "(tier, row_id) DO UPDATE SET model = excluded.model, vector = excluded.vector",
                        (tier, row["id"], model, stored),
                    )
                    saved.append(row["id"])
            self.embedding_done(conn, tier, [row["id"] for row, _ in embedded])
            return saved, self.vector_generation(conn)

        return self.write(work)

    def keep_vector(self, conn: sqlite3.Connection, tier: str, outcome: dict, vector: Embedded | None) -> dict:
        """In a write's transaction, the vector embedded from the text it writes, before it began, unless the row
        holds one from that model (its text unchanged): the write's outcome, with the vector generation to pop
        (`VECTOR_SAVED_AT`) when saved. One transaction for row and vector: a hybrid write costs one commit."""
        if vector is None:
            return outcome
        model, blob = vector
        held = conn.execute("SELECT model FROM memory_vector WHERE tier = ? AND row_id = ?", (tier, outcome["id"]))
        if (held.fetchone() or [None])[0] == model:  # asked first: PostgreSQL's generation moves on any statement
            return outcome
        conn.execute(
            "INSERT INTO memory_vector (tier, row_id, model, vector) VALUES (?, ?, ?, ?) ON CONFLICT (tier, row_id) "
            "DO UPDATE SET model = excluded.model, vector = excluded.vector",
            (tier, outcome["id"], model, None if tier == "long" else blob),
        )
        if tier == "long":  # the long tier keeps its vector in memory_longterm.embedding
            conn.execute("UPDATE memory_longterm SET embedding = ? WHERE id = ?", (blob, outcome["id"]))
        return {**outcome, VECTOR_SAVED_AT: self.vector_generation(conn)}

    def embedding_done(self, conn: sqlite3.Connection, tier: str, ids: list[int]) -> None:
        """These rows' embedding is over, saved or not (in save_vectors' transaction): nothing to release here;
        PostgreSQL's store releases their claims."""

    def embedding_failed(self, tier: str, ids: list[int]) -> None:
        """The embedder failed on these rows, not saved: nothing held here; PostgreSQL's store releases their
        claims at once, so another copy may embed them."""

    def vectors_by_id(self, conn: sqlite3.Connection, tier: str, model: str, ids: list[int]) -> list:
        """These rows' vectors from `model`, as load_vectors reads them: what other copies (or workers) saved since
        the vector index's snapshot (solos_rank.VectorIndex.fill and catch_up, only while copies share the store;
        one service alone has its own rows' vectors already, and the fleet's join at the reload)."""
        sql = f"SELECT * FROM ({TIER_TABLE[tier].vector_sql}) v WHERE v.id {self.queries.IDS_IN}"
        return conn.execute(sql, (tier, model, self.queries.id_list(ids))).fetchall()

    def count_missing_vectors(self, model: str) -> int:
        return self.read(
            lambda conn: sum(
                conn.execute(
                    f"SELECT count(*) FROM {tier.table} t LEFT JOIN memory_vector v "
                    f"ON v.tier = ? AND v.row_id = t.id AND v.model = ? WHERE v.row_id IS NULL",
                    (tier.name, model),
                ).fetchone()[0]
                for tier in EMBEDDED_TIERS
            )
        )

    def count_vectors(self, model: str) -> dict:
        return self.read(
            lambda conn: {
                row[0]: row[1]
                for row in conn.execute(
                    "SELECT tier, count(*) FROM memory_vector WHERE model = ? GROUP BY tier", (model,)
                )
            }
        )

    def clear_forgotten(self, wait_ms: int) -> bool:
        """After a forget: a TRUNCATE checkpoint takes the old page images (the text) out of the WAL. Under the
        write lock, on a pooled connection; False if a reader kept the WAL (the scrubber retries)."""
        with self.write_lock:
            conn = self.checkout()
            try:
                done = self.queries.checkpoint_truncate(conn, wait_ms)
            finally:
                conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
                self.checkin(conn)
        if not done:
            log.warning("WAL checkpoint after a forget or purge waits for a reader; the scrubber retries it")
        return done

    keeps_tokens = False  # PostgreSQL keeps them in the database (solos_tokens.StoredTokens)

    def listen(self, wake: Callable[[], None]) -> Any:
        """Nothing to listen to: the service's own writes wake the event hub (Memory.written), and it polls for
        the fleet's. PostgreSQL's store returns a listener for the other copies' commits."""
        return None

    def storage_failed(self, reason: str) -> None:
        """A call met a storage failure: storage_state says so, and why, for STORAGE_FAILING_S."""
        self.storage_failure = (reason, time.time())

    def storage_state(self) -> dict:
        """`failing` while a call met a storage failure (a full disk, a read-only file, a lost server: 503
        storage_unavailable) in the last STORAGE_FAILING_S, else `ok`; and the last failure's reason and time (UTC).
        A time, not the next write: a small write may fit on a full disk while the agents' writes do not."""
        failure = self.storage_failure
        if failure is None:
            return {"state": "ok", "last_failure": None}
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(failure[1]))
        state = "failing" if time.time() - failure[1] < STORAGE_FAILING_S else "ok"
        return {"state": state, "last_failure": {"reason": failure[0], "at": at}}

    def keyword_index_state(self) -> str:
        """/health's `keyword_index`: SQLite's FTS5 tables live in the database, kept by its triggers (PostgreSQL:
        each copy's own index, solos_pg_keyword)."""
        return "ready"

    def event_cursor(self, conn: Any = None) -> dict:
        """Whether the event cursor waits for a running transaction: never here, where events commit in id
        order (PostgreSQL's store: solos_store_pg.RunningTransactions)."""
        return {"state": "ok"}

    def token_hashes(self) -> dict[str, str]:
        """Bearer tokens kept in the database (PostgreSQL's); SQLite's are in the tokens file."""
        return {}

    def keep_token(self, digest: str, agent: str) -> None:
        raise NotImplementedError("SQLite keeps tokens in the tokens file (token --tokens-file)")

    def persona(self, conn: sqlite3.Connection, agent: str) -> sqlite3.Row | None:
        return conn.execute(
            f"SELECT {PERSONA_COLUMNS} FROM memory_durable t WHERE t.key = ?", ("persona/" + agent,)
        ).fetchone()


# ==== The queries: forget, retractions, the event log, meta, provenance, lifecycle ====


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def content_hash(tier: str, row: Any) -> str:
    """The hash a retraction keeps: long facts by their text (as their write key), others by their fields."""
    fields = CONTENT_FIELDS[tier]
    return sha256_text(row["fact"] if tier == "long" else json.dumps([row[name] for name in fields]))


def parse_tags(raw: Any) -> list[str]:
    """Tags as stored: a JSON array from this service, maybe a comma list from other writers."""
    if not raw:
        return []
    try:
        tags = json.loads(raw)
    except (TypeError, ValueError, RecursionError):  # RecursionError: arrays nested thousands deep
        return [part.strip() for part in str(raw).split(",") if part.strip()]
    return [str(tag) for tag in tags] if isinstance(tags, list) else [str(tags)]


# A forgotten fact's Qdrant outbox entry holds this plus the text's sha256 instead of the text.
# The API refuses NUL in a fact, so no fact the service stores starts with it.
HASH_ONLY = "\x00sha256:"
FORGET_PENDING = "forget_pending"  # qdrant_import.reason: an imported point whose row was forgotten, to delete


DELIVERY_COLUMNS = "id, reader, tier, row_id, writer, delivered_at"


NOTICE_COLUMNS = "id, agent, tier, row_id, writer, kind, new_id, version_id, at, acked_at"


# Per versioned tier: its tables (an archived episode lives on in the archive), and the columns a version keeps.
VERSIONED = {
    "long": (("memory_longterm",), "topic", "fact", "tags", "NULL", "created_at"),
    "short": (("memory_short",), "key", "value", "tags", "expires_at", "created_at"),
    "episodic": (("memory_episodic", "memory_episodic_archive"), "event_type", "summary", "NULL", "NULL", "timestamp"),
}


VERSION_FIELDS = "id, agent, label, text, tags, expires_at, valid_from, valid_to"
# What as-of reads return of a version: its fields, text as text (read_as).
VERSION_READ = "t.id, " + read_as("text", *VERSION_FIELDS.split(", ")[1:])


def short_gaps(lives: Sequence[tuple[str, str, str | None]]) -> list[tuple[str, str]]:
    """The times between a short row's versions (valid_from, valid_to, expires_at) when it counted for none:
    expired, until written again. A version counts from valid_from until the earlier of valid_to and its expiry."""
    gaps, counted_until = [], None
    for start, end, expires in sorted(lives):
        if counted_until is not None and counted_until < start:
            gaps.append((counted_until, start))
        until = min(end, expires or end)
        counted_until = until if counted_until is None else max(counted_until, until)
    return gaps


def lives_sql(tier: str, greatest: str) -> str:
    """Every version of the tier's rows as one relation: the current ones (valid_to NULL) and the replaced."""
    tables, label, text, tags, expires, born = VERSIONED[tier]
    since = f"(SELECT max(v.valid_to) FROM memory_version v WHERE v.tier = '{tier}' AND v.row_id = c.id)"
    current = " UNION ALL ".join(
        f"SELECT c.id, c.agent, c.{label}, c.{text}, {'c.' + tags if tags != 'NULL' else 'NULL'}, "
        f"{'c.' + expires if expires != 'NULL' else 'NULL'}, {greatest}(c.{born}, coalesce({since}, '')), NULL "
        f"FROM {table} c WHERE c.agent <> ''"
        for table in tables
    )
    return f"{current} UNION ALL SELECT {VERSION_FIELDS.replace('id,', 'row_id,', 1)} FROM memory_version v " + (
        f"WHERE v.tier = '{tier}'"
    )


def deleted_sql(tier: str) -> str:
    """SQL true when version t's row was deleted before its end (a short row's end is its expiry): taken back by
    its writer or the fleet, so shown to no one else as of any time."""
    return f"EXISTS ({deleted_rows_sql(tier, '= t.id')})"


def deleted_rows_sql(tier: str, rows: str) -> str:
    """SQL selecting the ids of the rows `d.row_id {rows}` names that were deleted so (deleted_sql)."""
    return (
        f"SELECT d.row_id FROM memory_version d WHERE d.tier = '{tier}' AND d.row_id {rows} "
        "AND d.ended_by = 'delete' AND (d.expires_at IS NULL OR d.valid_to < d.expires_at)"
    )


class Queries:
    """Every query outside Store's own, in SQLite's SQL: reached as `store.queries` (or `conn.queries` where only
    a connection is at hand); solos_store_pg.PgQueries overrides what PostgreSQL says differently, so mypy checks
    each override and no caller can run SQLite's SQL on PostgreSQL by naming a module function."""

    # The SQL that differs between the two databases, named once (PgQueries says it in PostgreSQL's terms).
    NOW = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"  # UTC, milliseconds, 'Z': text order is time order
    SHIFTED = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?)"  # now moved by '+3.000 seconds', '-30 days'
    IDS_IN = "IN (SELECT value FROM json_each(?))"  # with id_list(ids), or text_list(names), as its parameter
    SAME = "IS"  # equal, NULL equal to NULL
    LOCKED = ""  # a row read to be written (alias l): SQLite's one writer holds every row already
    LEAST, GREATEST = "min", "max"  # of two values
    # A row carries one of the wanted tags (a JSON array of them is the parameter, twice): tags as this service
    # stores them (a JSON array) or as a comma list, which other writers of the fleet use.
    TAGGED = (
        "CASE WHEN json_valid(t.tags) THEN EXISTS (SELECT 1 FROM json_each(t.tags) AS have "
        "WHERE have.value IN (SELECT value FROM json_each(?))) "
        "ELSE EXISTS (SELECT 1 FROM json_each(?) AS want "
        "WHERE instr(',' || replace(t.tags, ', ', ',') || ',', ',' || want.value || ',') > 0) END"
    )

    def id_list(self, values: Iterable[Any]) -> Any:
        return json.dumps(list(values))

    text_list = id_list

    def tagged_params(self, tags: Sequence[str]) -> list[Any]:
        return [json.dumps(list(tags))] * 2

    # ==== Forget, retractions, the event log and meta ====

    def utc_stamp(self, conn: sqlite3.Connection) -> str:
        return conn.execute("SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now')").fetchone()[0]

    def secure_delete(self, conn: sqlite3.Connection) -> None:
        """Deleted cells and freed pages are overwritten with zeros on this connection; read back to be sure."""
        conn.execute("PRAGMA secure_delete=ON")
        if conn.execute("PRAGMA secure_delete").fetchone()[0] != 1:
            raise RuntimeError("PRAGMA secure_delete did not take: forgotten text would stay in free pages")

    def find_row(self, conn: sqlite3.Connection, tier: str, row_id: int) -> tuple[str, Any] | None:
        """The table holding the row and the row itself, or None when there is no such row."""
        for table in RETRACTABLE[tier]:
            if self.table_exists(conn, table):
                row = conn.execute(f"SELECT * FROM {table} WHERE id = ?", (row_id,)).fetchone()
                if row is not None:
                    return table, row
        return None

    def gone_row(self, conn: sqlite3.Connection, tier: str, row_id: int) -> tuple[str, dict] | None:
        """A row deleted (or purged after its expiry) whose versions are still kept, as its last version read as the
        row (no table: ""), so a forget finds it and erases them; None when there are none."""
        if tier not in VERSIONED:
            return None
        last = conn.execute(
            "SELECT agent, label, text, tags, expires_at, valid_from, (SELECT min(valid_from) FROM memory_version "
            "WHERE tier = ? AND row_id = ?) AS born FROM memory_version WHERE tier = ? AND row_id = ? "
            "ORDER BY valid_to DESC, id DESC LIMIT 1",
            (tier, row_id, tier, row_id),
        ).fetchone()
        if last is None:
            return None
        label, text, tags, expires, born = (VERSIONED[tier][i] for i in range(1, 6))
        row = {"id": row_id, "agent": last["agent"], label: last["label"], text: last["text"], born: last["born"]}
        row |= {"tags": last["tags"], "expires_at": last["expires_at"], "details": None, "outcome": None}
        return "", row

    def row_owner(self, conn: sqlite3.Connection, tier: str, row_id: int) -> str | None:
        """Who wrote the row, or None when there is no such row."""
        found = self.find_row(conn, tier, row_id)
        return None if found is None else found[1]["agent"]

    def held_as(self, conn: sqlite3.Connection, row: Any) -> tuple[list[str], list[tuple[str, str]]]:
        """The topics a long fact had and every (writer, text) it held: now, and in the versions kept of it. A
        fleet's rewrite in place leaves the old text as context in the next facts of the topic it had then; the
        forget takes those copies out too."""
        topics, texts = {row["topic"]}, {(row["agent"], row["fact"])}
        if self.table_exists(conn, "memory_version"):
            for agent, topic, fact in conn.execute(
                "SELECT agent, label, text FROM memory_version WHERE tier = 'long' AND row_id = ?", (row["id"],)
            ):
                topics.add(topic)
                texts.add((agent, fact))
        return sorted(t for t in topics if t), sorted(texts)

    def context_carriers(self, conn: sqlite3.Connection, row: Any) -> list[int]:
        """Long facts whose keyword-index row holds this fact's text, or a text it held before, as context.

        The insert trigger copies the two previous facts of a topic into the next
        ones' context column; a topic's later edits can leave copies further on,
        so the index itself is asked too (phrase match, then the exact copy).
        """
        topics, texts = self.held_as(conn, row)
        carriers: set[int] = set()
        for topic in topics:
            carriers.update(
                r[0]
                for r in conn.execute(
                    "SELECT id FROM memory_longterm WHERE topic = ? AND id > ? ORDER BY id LIMIT 2", (topic, row["id"])
                )
            )
        for start in range(0, len(texts), CARRIER_TEXTS):  # a fact the fleet rewrote often: a query per 20 texts
            chunk = texts[start : start + CARRIER_TEXTS]
            phrases = " OR ".join('"' + fact.replace('"', '""') + '"' for _, fact in chunk)
            carriers.update(
                r[0]
                for r in conn.execute(
                    "SELECT rowid FROM memory_longterm_fts WHERE memory_longterm_fts MATCH ? AND EXISTS "
                    "(SELECT 1 FROM json_each(?) AS copy WHERE instr(context, copy.value) > 0)",
                    (f"context : ({phrases})", json.dumps([f"{agent}: {fact}" for agent, fact in chunk])),
                )
            )
        return sorted(carriers)

    def erase(self, conn: sqlite3.Connection, tier: str, row_id: int, forgotten_at: str | None = None) -> dict:
        """Delete one row and every copy of its text in the database; record the retraction, without the text.

        Runs inside the caller's write transaction. The delete's triggers drop the
        row's keyword-index entry and its vector; its write key goes here; long
        facts that carried it as context are re-indexed without it (an update of
        `tags` to itself re-runs the index trigger, and nothing else); the event
        log says `forget`. The index's old segments and the WAL still hold the
        words until Scrubber.scrub runs.
        """
        self.zero_freed(conn)
        found = self.find_row(conn, tier, row_id) or self.gone_row(conn, tier, row_id)
        assert found is not None, "erase is called for a row the caller found"
        table, row = found
        digest = content_hash(tier, row)
        key_hash = sha256_text(row["key"]) if tier == "short" else None
        if table:
            conn.execute(f"DELETE FROM {table} WHERE id = ?", (row_id,))
        conn.execute(
            "DELETE FROM memory_write_key WHERE agent = ? AND tier = ? AND row_id = ?", (row["agent"], tier, row_id)
        )
        if tier == "long":
            self.keep_only_hash(conn, row_id)
            self.reindex_context_carriers(conn, row)
        self.forget_imported_point(conn, tier, row)
        self.log_forget(conn, tier, row_id, row["agent"])
        retraction = conn.execute(
            "INSERT INTO memory_retraction (agent, tier, row_id, content_hash, key_hash, forgotten_at) "
            f"VALUES (?, ?, ?, ?, ?, coalesce(?, {self.NOW})) RETURNING id",
            (row["agent"], tier, row_id, digest, key_hash, forgotten_at),
        ).fetchone()[0]
        self.erase_versions(conn, tier, row, retraction)
        self.queue_scrub(conn, tier, retraction)
        return {"content_hash": digest, "retraction_id": retraction}

    zero_freed = secure_delete

    def reindex_context_carriers(self, conn: sqlite3.Connection, row: Any) -> None:
        """Facts that carried the forgotten one as context are indexed again without it (an update of `tags` to
        itself re-runs the index trigger, and nothing else)."""
        conn.execute(
            f"UPDATE memory_longterm SET tags = tags WHERE id {self.IDS_IN}",
            (self.id_list(self.context_carriers(conn, row)),),
        )

    def log_forget(self, conn: sqlite3.Connection, tier: str, row_id: int, agent: str) -> None:
        """The delete's event says `forget`; an expired short row already reported logged none: one is added."""
        logged = conn.execute(
            "UPDATE memory_event SET kind = 'forget' "
            "WHERE id = (SELECT max(id) FROM memory_event) AND tier = ? AND row_id = ?",
            (tier, row_id),
        ).rowcount
        if not logged:
            conn.execute(
                "INSERT INTO memory_event (kind, tier, row_id, agent) VALUES ('forget', ?, ?, ?)", (tier, row_id, agent)
            )

    def own_retraction(self, conn: sqlite3.Connection, agent: str, tier: str, row_id: int) -> dict | None:
        """The agent's latest retraction of this row, as forget answers it (with the readers its notices went to);
        None if it never forgot it."""
        row = conn.execute(
            "SELECT r.content_hash, r.id, (SELECT count(DISTINCT n.agent) FROM memory_notice n WHERE n.tier = r.tier "
            "AND n.row_id = r.row_id AND n.kind = 'forgotten' AND n.at = r.forgotten_at) FROM memory_retraction r "
            "WHERE r.agent = ? AND r.tier = ? AND r.row_id = ? ORDER BY r.id DESC LIMIT 1",
            (agent, tier, row_id),
        ).fetchone()
        return None if row is None else {"content_hash": row[0], "retraction_id": row[1], "notified": row[2]}

    def queue_scrub(self, conn: sqlite3.Connection, tier: str, retraction_id: int) -> None:
        """Record, in the forget's own transaction, that the tier's index segments and the WAL still hold its text.

        Scrubber.scrub clears it once they no longer do; a service that died
        first finishes it when it starts again (Scrubber.finish). Queued over
        an entry, the number rises past it, even where the two are equal (the
        purge's is the next forget's): a scrub under way clears only what it
        read (scrubs_done), so this queueing waits for a scrub after it.
        """
        conn.execute(
            "INSERT INTO memory_scrub_pending (tier, retraction_id) VALUES (?, ?) ON CONFLICT (tier) DO UPDATE "
            f"SET retraction_id = {self.GREATEST}(memory_scrub_pending.retraction_id + 1, excluded.retraction_id)",
            (tier, retraction_id),
        )

    def purge_expired_short(self, conn: sqlite3.Connection, batch: int) -> tuple[int, int]:
        """Up to `batch` expired short rows, then up to `batch` kept versions of short values past their own expiry
        (the purged rows' own among them; a rewritten key's old value once its TTL has passed): the writer's TTL
        bounds how long a value is kept, as-of recall's history of it included. Returns (rows, versions); when
        either went, the short tier's scrub is queued, numbered past the latest retraction so a scrub already
        under way (it clears what it read) leaves it queued."""
        self.zero_freed(conn)
        removed = conn.execute(
            "DELETE FROM memory_short WHERE id IN (SELECT id FROM memory_short "
            f"WHERE expires_at <= {self.NOW} LIMIT ?)",
            (batch,),
        ).rowcount
        versions = conn.execute(
            "DELETE FROM memory_version WHERE id IN (SELECT id FROM memory_version "
            f"WHERE tier = 'short' AND expires_at <= {self.NOW} LIMIT ?)",
            (batch,),
        ).rowcount
        if removed or versions:
            after = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM memory_retraction").fetchone()[0]
            self.queue_scrub(conn, "short", after)
        return removed, versions

    def queued_scrubs(self, conn: sqlite3.Connection) -> dict[str, int]:
        """Tiers whose scrub is still to finish, each with its number (at least the latest retraction it covers,
        raised by every queueing: queue_scrub), which scrubs_done is given back."""
        return dict(conn.execute("SELECT tier, retraction_id FROM memory_scrub_pending").fetchall())

    def scrubs_done(self, conn: sqlite3.Connection, done: dict[str, int]) -> None:
        """Clear what a finished scrub covered; a forget that committed meanwhile keeps its own entry."""
        for tier, through in done.items():
            conn.execute("DELETE FROM memory_scrub_pending WHERE tier = ? AND retraction_id <= ?", (tier, through))

    def merge_step(self, conn: sqlite3.Connection, fts: str) -> int:
        """One bounded FTS5 merge toward a single segment; returns the changes it made (under 2: nothing left)."""
        self.secure_delete(conn)
        before = conn.total_changes
        conn.execute(f"INSERT INTO {fts} ({fts}, rank) VALUES ('merge', ?)", (-MERGE_PAGES,))
        return conn.total_changes - before

    def checkpoint_truncate(self, conn: sqlite3.Connection, wait_ms: int) -> bool:
        """Copy the WAL into the database and cut it to zero bytes; False if a reader kept it (nothing waits long)."""
        conn.execute(f"PRAGMA busy_timeout={int(wait_ms)}")
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return busy == 0

    def retractions_after(self, conn: sqlite3.Connection, after_id: int) -> list[dict]:
        """The retractions after `after_id`, each with when its row was born (`born_at`, None if not recorded)."""
        if not self.table_exists(conn, "memory_retraction"):
            return []
        born = "s.born_at" if self.table_exists(conn, "memory_forgotten_span") else "NULL"
        joined = "LEFT JOIN memory_forgotten_span s ON s.retraction_id = r.id" if born != "NULL" else ""
        rows = conn.execute(
            f"SELECT r.id, r.agent, r.tier, r.row_id, r.content_hash, r.key_hash, r.forgotten_at, {born} "
            f"FROM memory_retraction r {joined} WHERE r.id > ? ORDER BY r.id",
            (after_id,),
        )
        fields = ("id", "agent", "tier", "row_id", "content_hash", "key_hash", "forgotten_at", "born_at")
        return [dict(zip(fields, r)) for r in rows]

    def last_retraction(self, conn: sqlite3.Connection) -> int:
        """The newest retraction's id: another copy's forget shows here (solos_events.EventHub.watch_forgets)."""
        return conn.execute("SELECT coalesce(max(id), 0) FROM memory_retraction").fetchone()[0]

    def reapply(self, conn: sqlite3.Connection, retraction: dict) -> bool:
        """Forget the row a retraction names if this database still has it, and record the retraction. True if erased.

        The row must be the same one: tier, id and writer, and the same content
        hash (a short row: or the same key, since its value changes on upsert),
        or born no earlier than the forgotten row (`born_at`, when the retraction
        carries it): the fleet may have rewritten its text in place after the
        snapshot. An id an earlier row held, reused later by another, is left alone.
        """
        tier, row_id, agent = retraction["tier"], retraction["row_id"], retraction["agent"]
        fields = (tier, row_id, agent, retraction["content_hash"], retraction["forgotten_at"])
        known = conn.execute(
            "SELECT 1 FROM memory_retraction WHERE tier = ? AND row_id = ? AND agent = ? AND content_hash = ? "
            "AND forgotten_at = ?",
            fields,
        ).fetchone()
        if known:  # this database already applied it
            return False
        found = self.find_row(conn, tier, row_id)
        row = found[1] if found is not None and found[1]["agent"] == agent else None
        born_at = retraction.get("born_at")  # manifests before it was recorded lack it
        if row is not None and (
            content_hash(tier, row) == retraction["content_hash"]
            or (tier == "short" and sha256_text(row["key"]) == retraction["key_hash"])
            or (born_at is not None and row[VERSIONED[tier][5]] >= born_at)
        ):
            self.erase(conn, tier, row_id, retraction["forgotten_at"])
            return True
        conn.execute(
            "INSERT INTO memory_retraction (tier, row_id, agent, content_hash, forgotten_at, key_hash) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (*fields, retraction["key_hash"]),
        )
        return False

    def mirror_waiting(
        self, conn: sqlite3.Connection, row_ids: Iterable[int], tier: str = "long", collection: str | None = None
    ) -> set[int]:
        """Rows whose Qdrant point delete still waits for the mirror: long facts' in its outbox, and the points
        import-qdrant made them of (forget_imported_point) in qdrant_import, of `collection` if named (a mirror
        deletes only in its own). There one id may name an episode and a long fact both: a long fact's entry is
        the one whose hash is the text's its retraction keeps."""
        ids = self.id_list(row_ids)
        waiting: set[int] = set()
        if tier == "long" and self.table_exists(conn, "qdrant_outbox"):
            rows = conn.execute(
                f"SELECT DISTINCT row_id FROM qdrant_outbox WHERE action = 'delete' AND row_id {self.IDS_IN}", (ids,)
            )
            waiting |= {row[0] for row in rows}
        if tier in ("long", "episodic") and self.table_exists(conn, "qdrant_import"):
            long_fact = "EXISTS (SELECT 1 FROM memory_retraction r WHERE r.tier = 'long' AND r.row_id = q.row_id "
            long_fact += "AND r.content_hash = q.content_sha256)"
            rows = conn.execute(
                f"SELECT DISTINCT q.row_id FROM qdrant_import q WHERE q.reason = '{FORGET_PENDING}' "
                f"AND q.row_id {self.IDS_IN} AND {'' if tier == 'long' else 'NOT '}{long_fact} "
                "AND (CAST(? AS TEXT) IS NULL OR q.collection = ?)",
                (ids, collection, collection),
            )
            waiting |= {row[0] for row in rows}
        return waiting

    def table_exists(self, conn: sqlite3.Connection, name: str) -> bool:
        return (
            conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
            is not None
        )

    def meta_value(self, conn: sqlite3.Connection, key: str) -> str | None:
        row = conn.execute("SELECT value FROM solos_memory_meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, conn: sqlite3.Connection, key: str, value: Any) -> None:
        conn.execute(
            "INSERT INTO solos_memory_meta (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, str(value)),
        )

    def row_id_marks(self, conn: sqlite3.Connection) -> dict[str, int]:
        """Each id space's high-water mark: its kept mark, or any larger id the database still names."""
        marks = {}
        for tier, tables in RETRACTABLE.items():
            named = [f"SELECT max(id) AS id FROM {table}" for table in tables if self.table_exists(conn, table)] + [
                f"SELECT max(row_id) FROM {table} WHERE tier = :tier"
                for table in ("memory_event", "memory_retraction", "memory_write_key")
                if self.table_exists(conn, table)
            ]
            if self.table_exists(conn, "solos_memory_meta"):
                named.append("SELECT CAST(value AS INTEGER) FROM solos_memory_meta WHERE key = 'row_id_high:' || :tier")
            sql = f"SELECT coalesce(max(id), 0) FROM ({' UNION ALL '.join(named)})"
            marks[tier] = int(conn.execute(sql, {"tier": tier}).fetchone()[0])
        return marks

    def mark_row_ids(self, conn: sqlite3.Connection, floor: dict[str, int] | None = None) -> None:
        """Raise the id marks to every id named here or in `floor` (a replaced database's), and drop stray placeholders.

        The triggers keep the marks (schema.sql, "Row ids: never reused"); this covers a database that had rows
        forgotten before the marks existed, a restore (ids the replaced database handed out stay spent), and a
        placeholder an ignored INSERT OR IGNORE left behind.
        """
        for tier, mark in self.row_id_marks(conn).items():
            self.set_meta(conn, f"row_id_high:{tier}", max(mark, (floor or {}).get(tier, 0)))
            table, column = TIER_TABLE[tier].table, TIER_TABLE[tier].text_column
            conn.execute(f"DELETE FROM {table} WHERE agent = '' AND {column} = '(row id reserved by solos-memory)'")
        if self.table_exists(conn, "memory_event"):
            conn.execute("DELETE FROM memory_event WHERE agent = ''")

    def job_running(self, conn: sqlite3.Connection, job: str) -> bool:
        """Whether a run recorded 'running' is alive: SQLite cannot tell (a purge killed there stays 'running'
        until the next run), so it is taken for alive; PostgreSQL asks whether a session holds the job's turn."""
        return True

    def head_event(self, conn: sqlite3.Connection) -> int:
        return conn.execute("SELECT coalesce(max(id), 0) FROM memory_event").fetchone()[0]

    def event_ceiling(self, conn: sqlite3.Connection) -> int:
        """The largest event id this store may have handed out (AUTOINCREMENT's counter): a cursor above it is
        another store's, never this one's."""
        return conn.execute(
            "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'memory_event'), 0), "
            "coalesce((SELECT max(id) FROM memory_event), 0))"
        ).fetchone()[0]

    def events_after(self, conn: sqlite3.Connection, after: int, limit: int) -> list[sqlite3.Row]:
        return conn.execute(
            "SELECT id, ts, kind, tier, row_id, agent FROM memory_event WHERE id > ? ORDER BY id LIMIT ?",
            (after, limit),
        ).fetchall()

    def passed_over(self, conn: sqlite3.Connection) -> list[dict]:
        """Running transactions the event cursor went past (solos_store_pg's): none here, one writer at a time."""
        return []

    def current_rows(self, conn: sqlite3.Connection, tiers: dict, events: Sequence[Any]) -> dict[tuple[str, int], Any]:
        """The rows that write and update events name, as they are now and only if recall could return them."""
        wanted: dict[str, list[int]] = {}
        for event in events:
            if event["kind"] not in REMOVALS:
                wanted.setdefault(event["tier"], []).append(event["row_id"])
        found = {}
        for tier, ids in wanted.items():
            if tier == "durable":
                sql = f"SELECT {PERSONA_COLUMNS} FROM memory_durable t WHERE t.id {self.IDS_IN}"
            elif tier == "notice":
                sql = f"SELECT {NOTICE_COLUMNS} FROM memory_notice WHERE id {self.IDS_IN}"
            else:
                live = "".join(" AND " + w for w in Visibility.unexpired(tiers[tier], self.NOW))
                sql = (
                    f"SELECT {tiers[tier].columns}, 0.0 AS score FROM {tiers[tier].table} t "
                    f"WHERE t.id {self.IDS_IN}{live}"
                )
            found.update({(tier, row["id"]): row for row in conn.execute(sql, (self.id_list(ids),))})
        return found

    def tags_of(self, conn: sqlite3.Connection, tier: str, ids: list[int]) -> dict[int, set[str]]:
        """The tags of these rows of a tier that has tags (short, long): a JSON array or the fleet's comma list."""
        if "tags" not in TIER_TABLE[tier].result_columns:
            return {}
        found = conn.execute(
            f"SELECT id, tags FROM {TIER_TABLE[tier].table} WHERE id {self.IDS_IN}", (self.id_list(ids),)
        )
        return {row[0]: set(parse_tags(row[1])) for row in found}

    def sharing_agents(self, conn: sqlite3.Connection) -> set[str]:
        """Who opted in; an opt-in a fleet writer stored under a BLOB names no agent, so it shares nothing."""
        rows = conn.execute("SELECT agent FROM episodic_sharing WHERE shared = 1")
        return {row[0] for row in rows if isinstance(row[0], str)}

    def sharing_spans(self, conn: sqlite3.Connection) -> list[tuple[str, str, str | None]]:
        """When each author was sharing its episodes: (agent, from, until or None), for Visibility."""
        rows = conn.execute("SELECT agent, shared_from, shared_until FROM episodic_sharing_span")
        return [tuple(row) for row in rows if isinstance(row[0], str)]

    TEXT_MATCH_IDS = 200

    def text_matches(
        self, conn: sqlite3.Connection, match: str, candidates: dict[str, list[int]]
    ) -> set[tuple[str, int]]:
        """Which candidate rows the FTS5 query matches, per tier, on the rows' own columns. FTS5 looks up a list of
        rowids one by one, matching each (0.1 s for an expiry sweep's 10,000, per filter, in the sweep's write
        transaction): past TEXT_MATCH_IDS candidates, the query's rows are read once and the candidates kept."""
        found: set[tuple[str, int]] = set()
        for tier, ids in candidates.items():
            fts = KEYWORD_INDEX[tier][0]
            few = len(ids) <= self.TEXT_MATCH_IDS
            rows = conn.execute(
                f"SELECT rowid FROM {fts} WHERE {fts} MATCH ? AND rowid IN (SELECT value FROM json_each(?))"
                if few
                else f"SELECT value FROM json_each(?2) WHERE value IN (SELECT rowid FROM {fts} WHERE {fts} MATCH ?1)",
                (f"{OWN_COLUMNS[tier]}({match})", json.dumps(ids)),
            )
            found.update((tier, row[0]) for row in rows)
        return found

    # The short rows whose expiry the sweep reports, (id, agent) by expiry: those in its window since the mark, and
    # those written with (or moved to) an expiry at or before the mark, which the schema's triggers list in
    # memory_short_late_expiry. Each part read by index (memory_short_expiry's range, the late rows' ids), never
    # the whole table (a UNION ordered by expiry itself would have SQLite walk the expiry index whole).
    EXPIRING = (
        "FROM (SELECT id, agent, expires_at FROM memory_short WHERE expires_at > ? AND expires_at <= ? UNION ALL "
        "SELECT id, agent, expires_at FROM memory_short WHERE id IN (SELECT row_id FROM memory_short_late_expiry)) "
        "AS due ORDER BY expires_at, id"
    )

    def sweep_expired(
        self, conn: sqlite3.Connection, note: Callable[[sqlite3.Connection, str, list[int]], None]
    ) -> int:
        """Log 'expire' for short rows whose TTL passed since the last sweep, and for those written already past the
        last sweep's mark (inside a write transaction); `note` is told their ids first, while their text exists."""
        now = self.utc_stamp(conn)
        through = self.meta_value(conn, "events_expired_through")
        added = 0
        if through is not None:
            note(conn, "short", [row[0] for row in conn.execute(f"SELECT id {self.EXPIRING}", (through, now))])
            added = conn.execute(
                f"INSERT INTO memory_event (kind, tier, row_id, agent) SELECT 'expire', 'short', id, agent "
                f"{self.EXPIRING}",
                (through, now),
            ).rowcount
            self.clear_late_expiry(conn)
        self.set_meta(conn, "events_expired_through", now)
        return added

    def clear_late_expiry(self, conn: Any) -> None:
        """The late rows are reported: the list emptied (looked at first: emptying an empty table still writes)."""
        if conn.execute("SELECT 1 FROM memory_short_late_expiry LIMIT 1").fetchone() is not None:
            conn.execute("DELETE FROM memory_short_late_expiry")

    def expiry_due(self, conn: sqlite3.Connection) -> bool:
        through = self.meta_value(conn, "events_expired_through")
        return through is None or (
            conn.execute(
                f"SELECT 1 FROM memory_short WHERE expires_at > ? AND expires_at <= {self.NOW} "
                "UNION ALL SELECT 1 FROM memory_short_late_expiry LIMIT 1",
                (through,),
            ).fetchone()
            is not None
        )

    def prune_step(self, conn: sqlite3.Connection, cutoff: str, batch: int) -> int:
        """Delete up to `batch` of the oldest events older than cutoff; remember the last id pruned."""
        pruned = conn.execute(
            "DELETE FROM memory_event WHERE id IN (SELECT id FROM memory_event ORDER BY id LIMIT ?) AND ts < ? "
            "RETURNING id",
            (batch, cutoff),
        ).fetchall()
        if pruned:
            through = max(int(self.meta_value(conn, "events_pruned_through") or 0), max(row[0] for row in pruned))
            self.set_meta(conn, "events_pruned_through", through)
        return len(pruned)

    def keep_only_hash(self, conn: Any, row_id: int) -> None:
        """After a forget, inside its transaction: the row's queued point delete keeps the text's hash, not the text.

        So the text leaves the database with the WAL checkpoint, mirror running or
        not. A writer's twin row (same text) keeps the point: the entry becomes its upsert.
        """
        entries = conn.execute(
            "SELECT id, agent, fact FROM qdrant_outbox WHERE action = 'delete' AND row_id = ? AND fact IS NOT NULL",
            (row_id,),
        ).fetchall()
        for entry_id, agent, fact in entries:
            if fact.startswith(HASH_ONLY):
                continue
            twin = self.twin_fact(conn, agent, fact, row_id)
            if twin is not None:
                conn.execute(
                    "UPDATE qdrant_outbox SET action = 'upsert', row_id = ?, agent = NULL, fact = NULL WHERE id = ?",
                    (twin, entry_id),
                )
            else:
                conn.execute(
                    "UPDATE qdrant_outbox SET fact = ? WHERE id = ?", (HASH_ONLY + sha256_text(fact), entry_id)
                )

    def forget_imported_point(self, conn: Any, tier: str, row: Any) -> None:
        """After a forget, inside its transaction: the point import-qdrant made this row of (a long fact's, or a
        private point's episode) has its delete queued; qdrant_import keeps its id and the text's hash, never the
        text, and a mirror sends it whenever one runs (Mirror.due). A long fact's writer still holding the same
        text in another row keeps the point: the import is recorded against that row instead."""
        # A fact's import has no reason (an imported or an already stored fact); a private point's episode's says so.
        imported = {"long": "reason IS NULL", "episodic": "reason = 'imported_private'"}.get(tier)
        if (
            imported is None
            or not conn.execute(
                f"SELECT 1 FROM qdrant_import WHERE {imported} AND row_id = ? LIMIT 1", (row["id"],)
            ).fetchone()
        ):
            return
        twin = self.twin_fact(conn, row["agent"], row["fact"], row["id"]) if tier == "long" else None
        if twin is not None:
            conn.execute(f"UPDATE qdrant_import SET row_id = ? WHERE {imported} AND row_id = ?", (twin, row["id"]))
        else:
            conn.execute(
                f"UPDATE qdrant_import SET reason = '{FORGET_PENDING}' WHERE {imported} AND row_id = ?", (row["id"],)
            )

    @staticmethod
    def twin_fact(conn: Any, agent: str, fact: str, row_id: int) -> int | None:
        """Another row of the writer's holding the same text (the fleet's direct writes may make one): it keeps
        the Qdrant point a forgotten row's delete would take."""
        twin = conn.execute(
            "SELECT id FROM memory_longterm WHERE agent = ? AND fact = ? AND id != ? ORDER BY id LIMIT 1",
            (agent, fact, row_id),
        ).fetchone()
        return None if twin is None else twin[0]

    # ==== Provenance: deliveries, versions, notices (solos_provenance) ====

    def record_deliveries(
        self,
        conn: sqlite3.Connection,
        rows: Sequence[tuple[str, str, int, str, str]],
        again: bool = False,
        window_s: int | None = None,
    ) -> int:
        """Log (reader, tier, row_id, writer, delivered_at) rows; notices for any already forgotten or replaced since.
        Returns how many were logged.

        The log is written after the fact, in batches: a row forgotten or updated between its delivery and this
        write gets its notice here (the forget's and the update trigger's notices saw the log without it).
        `again`: a retry of a write that raised, which may have committed (its answer lost): a row already logged
        with its very stamp is not logged twice. `window_s`: nor one its reader was handed earlier in the same
        window (of that many seconds since the epoch) by another process, unchanged since (no version of it ended
        after that delivery): workers and copies each keep only their own deliveries in memory. A later one logged
        first stands for none: the earliest says when the reader first saw the row (an echo's witness).
        """
        after = conn.execute("SELECT coalesce(max(id), 0) FROM memory_delivery").fetchone()[0]
        if again or window_s:
            never = "~"  # sorts after every timestamp: no delivery is in its window
            since = (lambda at: stamp(stamp_seconds(at) // window_s * window_s)) if window_s else lambda at: never
            cursor = conn.executemany(
                "INSERT INTO memory_delivery (reader, tier, row_id, writer, delivered_at) "
                "SELECT ?, ?, CAST(? AS BIGINT), ?, ? WHERE NOT EXISTS (SELECT 1 FROM memory_delivery d "
                "WHERE d.tier = ? AND d.row_id = CAST(? AS BIGINT) AND d.reader = ? AND (d.delivered_at = ? "
                "OR d.delivered_at >= ? AND d.delivered_at <= ? AND NOT EXISTS (SELECT 1 FROM memory_version v "
                "WHERE v.tier = d.tier AND v.row_id = d.row_id AND v.valid_to > d.delivered_at)))",
                [(*row, row[1], row[2], row[0], row[4] if again else never, since(row[4]), row[4]) for row in rows],
            )
        else:
            cursor = conn.executemany(
                "INSERT INTO memory_delivery (reader, tier, row_id, writer, delivered_at) VALUES (?, ?, ?, ?, ?)", rows
            )
        logged = cursor.rowcount
        conn.execute(
            "INSERT INTO memory_notice (agent, tier, row_id, writer, kind, new_id, version_id, at) "
            "SELECT DISTINCT d.reader, v.tier, v.row_id, v.agent, 'superseded', v.row_id, v.id, v.valid_to "
            "FROM memory_delivery d JOIN memory_version v ON v.tier = d.tier AND v.row_id = d.row_id "
            "AND v.ended_by = 'update' AND d.delivered_at >= v.valid_from AND d.delivered_at <= v.valid_to "
            "WHERE d.id > ? AND d.reader <> v.agent ORDER BY v.id ON CONFLICT DO NOTHING",  # the newest last: it stays
            (after,),
        )
        conn.execute(
            "INSERT INTO memory_notice (agent, tier, row_id, writer, kind, at) "
            "SELECT DISTINCT d.reader, s.tier, s.row_id, s.agent, 'forgotten', s.forgotten_at "
            "FROM memory_delivery d JOIN memory_forgotten_span s ON s.tier = d.tier AND s.row_id = d.row_id "
            "WHERE d.id > ? AND d.reader <> s.agent ON CONFLICT DO NOTHING",
            (after,),
        )
        return len(rows) if logged is None or logged < 0 else logged

    def replaced_since(self, conn: sqlite3.Connection, after: int | None) -> tuple[int, list[tuple[str, int]], str]:
        """The newest version's id, the rows an update replaced after version `after` (None: none, just the id),
        and the database's time (the clock versions are stamped by, which deliveries are compared with)."""
        newest, now = conn.execute(f"SELECT coalesce(max(id), 0), {self.NOW} FROM memory_version").fetchone()
        if after is None or newest <= after:
            return newest, [], now
        rows = conn.execute(
            "SELECT DISTINCT tier, row_id FROM memory_version WHERE id > ? AND id <= ? AND ended_by = 'update'",
            (after, newest),
        )
        return newest, [(row[0], row[1]) for row in rows], now

    def delivery_log_size(self, conn: sqlite3.Connection) -> dict:
        """The delivery log's rows and its oldest delivery, and the open notices (for stats, each page load): the
        oldest is the first by id, as purge_deliveries takes it; min(delivered_at) walked an index, 290 ms at 2M."""
        rows = conn.execute("SELECT count(*) FROM memory_delivery").fetchone()[0]
        first = conn.execute("SELECT delivered_at FROM memory_delivery ORDER BY id LIMIT 1").fetchone()
        oldest = first[0] if first else None
        notices = conn.execute("SELECT count(*) FROM memory_notice WHERE acked_at IS NULL").fetchone()[0]
        return {"rows": rows, "oldest": oldest, "open_notices": notices}

    def read_deliveries(
        self,
        conn: sqlite3.Connection,
        writer: str | None,
        tier: str | None,
        row_id: int | None,
        limit: int,
        before_id: int,
    ) -> list[dict]:
        """Deliveries newest first: of `writer`'s rows (None: everyone's), optionally of one row. Only the filters
        given are in the SQL: SQLite uses no index for `(? IS NULL OR writer = ?)`, and read the whole log. With
        a row, `writer || ''` leaves the writer's index to the row's (SQLite took the writer's, all its rows)."""
        by_writer = "writer" if tier is None or row_id is None else "writer || ''"
        given = ((by_writer, writer), ("tier", tier), ("row_id", row_id))
        filters = "".join(f" AND {column} = ?" for column, value in given if value is not None)
        rows = conn.execute(
            f"SELECT {DELIVERY_COLUMNS} FROM memory_delivery WHERE id < ?{filters} ORDER BY id DESC LIMIT ?",
            (before_id, *[value for _, value in given if value is not None], limit),
        )
        return [dict(row) for row in rows]

    def purge_deliveries(self, conn: sqlite3.Connection, cutoff: str, batch: int) -> int:
        """Delete up to `batch` of the oldest deliveries, notices (acknowledged or not), versions and spans older
        than cutoff."""
        removed = conn.execute(
            "DELETE FROM memory_delivery WHERE id IN (SELECT id FROM memory_delivery ORDER BY id LIMIT ?) "
            "AND delivered_at < ?",
            (batch, cutoff),
        ).rowcount
        for sql in (
            # open ones too: a notice nobody acknowledged in RETENTION_S is about a delivery the log no longer holds
            "DELETE FROM memory_notice WHERE id IN "
            "(SELECT id FROM memory_notice WHERE coalesce(acked_at, at) < ? LIMIT ?)",
            "DELETE FROM memory_version WHERE id IN (SELECT id FROM memory_version WHERE valid_to < ? LIMIT ?)",
            "DELETE FROM memory_forgotten_gap WHERE retraction_id IN "
            "(SELECT retraction_id FROM memory_forgotten_span WHERE forgotten_at < ? LIMIT ?)",
            "DELETE FROM memory_forgotten_span WHERE retraction_id IN "
            "(SELECT retraction_id FROM memory_forgotten_span WHERE forgotten_at < ? LIMIT ?)",
        ):
            removed += conn.execute(sql, (cutoff, batch)).rowcount
        return removed

    def first_delivery(self, conn: sqlite3.Connection, reader: str, tier: str, ids: Sequence[int]) -> str | None:
        """When `reader` was first delivered any of these rows, or None."""
        return conn.execute(
            f"SELECT min(delivered_at) FROM memory_delivery WHERE tier = ? AND reader = ? AND row_id {self.IDS_IN}",
            (tier, reader, self.id_list(ids)),
        ).fetchone()[0]

    def near_duplicates_version(self, conn: sqlite3.Connection) -> tuple[bytes | None, int] | None:
        """What near_candidates' answers depend on, as of this transaction: the long facts' keyword index (FTS5
        rewrites its structure record, with a write counter, at every change) and the vectors (their generation)."""
        row = conn.execute("SELECT block FROM memory_longterm_fts_data WHERE id = 10").fetchone()
        return (row[0] if row else None), int(self.meta_value(conn, "vector_generation") or 0)

    def near_candidates(self, conn: sqlite3.Connection, match: str, limit: int) -> list[sqlite3.Row]:
        """Up to `limit` long facts whose own text matches `match` (an FTS5 query), unranked: id, agent, fact,
        created_at, vector."""
        return conn.execute(
            "SELECT l.id, l.agent, l.fact, l.created_at, l.embedding FROM (SELECT rowid AS id "
            "FROM memory_longterm_fts WHERE memory_longterm_fts MATCH ? LIMIT ?) m "
            "JOIN memory_longterm l ON l.id = m.id",
            ("{fact} : (" + match + ")", limit),
        ).fetchall()

    def erase_versions(self, conn: sqlite3.Connection, tier: str, row: Any, retraction_id: int) -> None:
        """Inside a forget: delete every version of the row (their text), keeping only when it lived (a span)."""
        if tier not in VERSIONED or not self.table_exists(conn, "memory_version"):
            return
        born = row[VERSIONED[tier][5]]
        earliest = conn.execute(
            "SELECT min(valid_from) FROM memory_version WHERE tier = ? AND row_id = ?", (tier, row["id"])
        ).fetchone()[0]
        conn.execute(
            "INSERT INTO memory_forgotten_span "
            "(retraction_id, tier, row_id, agent, born_at, forgotten_at, lived_until) "
            f"SELECT id, tier, row_id, agent, ?, forgotten_at, {self.LEAST}(coalesce(?, forgotten_at), forgotten_at) "
            "FROM memory_retraction WHERE id = ? ON CONFLICT (retraction_id) DO UPDATE SET born_at = excluded.born_at, "
            "forgotten_at = excluded.forgotten_at, lived_until = excluded.lived_until",
            (min(born, earliest or born), row["expires_at"] if tier == "short" else None, retraction_id),
        )
        if tier == "short":  # expired, then written again: not there to be shown in between
            lives = conn.execute(
                "SELECT valid_from, valid_to, expires_at FROM memory_version WHERE tier = 'short' AND row_id = ?",
                (row["id"],),
            ).fetchall()
            conn.executemany(
                "INSERT INTO memory_forgotten_gap (retraction_id, gap_from, gap_until) VALUES (?, ?, ?) "
                "ON CONFLICT (retraction_id, gap_from) DO UPDATE SET gap_until = excluded.gap_until",
                [(retraction_id, *gap) for gap in short_gaps([tuple(life) for life in lives])],
            )
        conn.execute("DELETE FROM memory_version WHERE tier = ? AND row_id = ?", (tier, row["id"]))
        if tier == "short":  # the key names the row: earlier rows of it (deleted, then written again) go too
            conn.execute(
                "DELETE FROM memory_version WHERE tier = 'short' AND agent = ? AND label = ? AND row_id < ?",
                (row["agent"], row["key"], row["id"]),
            )

    def notify_forgotten(self, conn: sqlite3.Connection, tier: str, row_id: int, retraction_id: int) -> int:
        """A notice for every agent but the writer that was delivered the forgotten row; how many."""
        return conn.execute(
            "INSERT INTO memory_notice (agent, tier, row_id, writer, kind, at) "
            "SELECT d.reader, r.tier, r.row_id, r.agent, 'forgotten', r.forgotten_at "
            "FROM memory_retraction r JOIN memory_delivery d ON d.tier = r.tier AND d.row_id = r.row_id "
            "WHERE r.id = ? AND d.reader <> r.agent AND r.tier = ? AND r.row_id = ? "
            # the readers in the order they were first shown it, so both stores number their notices alike
            "GROUP BY d.reader, r.tier, r.row_id, r.agent, r.forgotten_at ORDER BY min(d.delivered_at), min(d.id) "
            "ON CONFLICT DO NOTHING",
            (retraction_id, tier, row_id),
        ).rowcount

    def read_notices(self, conn: sqlite3.Connection, agent: str, after_id: int, limit: int, acked: bool) -> list[dict]:
        """The agent's notices after an id, oldest first; acknowledged ones only if asked. The open ones by the
        index's (agent, acked_at): `(? OR acked_at IS NULL)` had SQLite read every one the agent acknowledged."""
        rows = conn.execute(
            f"SELECT {NOTICE_COLUMNS} FROM memory_notice WHERE agent = ? AND id > ?"
            + ("" if acked else " AND acked_at IS NULL")
            + " ORDER BY id LIMIT ?",
            (agent, after_id, limit),
        )
        return [dict(row) for row in rows]

    def ack_notices(self, conn: sqlite3.Connection, agent: str, ids: Sequence[int]) -> int:
        """Acknowledge the agent's own notices by id; how many were open."""
        return conn.execute(
            f"UPDATE memory_notice SET acked_at = {self.NOW} WHERE agent = ? AND acked_at IS NULL AND id {self.IDS_IN}",
            (agent, self.id_list(ids)),
        ).rowcount

    def stream(self, conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> Iterable[Any]:
        """Rows one at a time as the query yields them, not the whole answer in memory (sqlite3 steps lazily)."""
        return conn.execute(sql, params)

    def rows_as_of(
        self,
        conn: sqlite3.Connection,
        tier: str,
        at: str,
        seen: Visibility,
        contains: Sequence[str] = (),
        limit: int = 0,
    ) -> Iterable[dict]:
        """The tier's versions as they stood at `at` that the caller may see (Visibility.where_as_of; expiry as of
        `at`), streamed. `contains`: only those whose label or text holds one of these lower-cased fragments; `limit`:
        the newest that many, else unordered."""
        where, params = seen.where_as_of(TIER_TABLE[tier], deleted_sql(tier), at)
        if contains:
            like = "lower(coalesce(t.label, '') || ' ' || t.text) LIKE ? ESCAPE '\\'"
            where.append("(" + " OR ".join([like] * len(contains)) + ")")
            params.extend("%" + re.sub(r"([\\%_])", r"\\\1", fragment) + "%" for fragment in contains)
        sql = (
            f"WITH t ({VERSION_FIELDS}) AS ({lives_sql(tier, self.GREATEST)}) SELECT {VERSION_READ} FROM t "
            "WHERE t.valid_from <= ? "
            "AND (t.valid_to IS NULL OR t.valid_to > ?)"
            + "".join(" AND " + w for w in where)
            + (" ORDER BY t.valid_from DESC, t.id DESC LIMIT ?" if limit else "")
        )
        rows = self.stream(conn, sql, (at, at, *params, *([limit] if limit else [])))
        return ({**dict(row), "tier": tier} for row in rows)

    def versions_of(self, conn: sqlite3.Connection, tier: str, ids: Sequence[int]) -> list[dict]:
        """Every version (current and replaced) of these rows, each saying whether its row was deleted: asked once
        a row (deleted_sql looks through the row's versions; asked of each, a row rewritten V times cost V²)."""
        sql = (
            f"WITH t ({VERSION_FIELDS}) AS ({lives_sql(tier, self.GREATEST)}) "
            f"SELECT {VERSION_READ}, t.id IN ({deleted_rows_sql(tier, self.IDS_IN)}) AS deleted FROM t "
            f"WHERE t.id {self.IDS_IN}"
        )
        chosen = self.id_list(ids)
        return [dict(row) for row in conn.execute(sql, (chosen, chosen))]

    def retracted_as_of(self, conn: sqlite3.Connection, at: str) -> list[dict]:
        """Rows that lived at `at` and were forgotten after it: tier, row_id, agent, forgotten_at (no text), and
        born_at and lived_until (for Visibility.allows_version); a short row not while it was expired
        (memory_forgotten_gap)."""
        rows = conn.execute(
            "SELECT tier, row_id, agent, forgotten_at, born_at, lived_until FROM memory_forgotten_span s "
            "WHERE born_at <= ? AND lived_until > ? AND NOT EXISTS (SELECT 1 FROM memory_forgotten_gap g "
            "WHERE g.retraction_id = s.retraction_id AND g.gap_from <= ? AND g.gap_until > ?) "
            "ORDER BY forgotten_at",
            (at, at, at, at),
        )
        return [dict(row) for row in rows]

    def delivered_by(self, conn: sqlite3.Connection, reader: str, at: str) -> list[dict]:
        """What `reader` was delivered up to `at`, oldest first."""
        rows = conn.execute(
            f"SELECT {DELIVERY_COLUMNS} FROM memory_delivery WHERE reader = ? AND delivered_at <= ? "
            "ORDER BY delivered_at",
            (reader, at),
        )
        return [dict(row) for row in rows]

    # ==== Promotion and archive (solos_lifecycle) ====

    def episodes_by_id(self, conn: sqlite3.Connection, ids: list[int]) -> dict[int, sqlite3.Row]:
        """Episodic rows by id, live or archived (id, agent, summary)."""
        ids_in, chosen = self.IDS_IN, self.id_list(ids)
        rows = conn.execute(
            f"SELECT id, agent, summary FROM memory_episodic WHERE id {ids_in} "
            f"UNION ALL SELECT id, agent, summary FROM memory_episodic_archive WHERE id {ids_in}",
            (chosen, chosen),
        )
        return {row["id"]: row for row in rows}

    def link_promotion(self, conn: sqlite3.Connection, long_id: int, episodic_ids: list[int], agent: str) -> None:
        conn.executemany(
            "INSERT INTO memory_promotion (long_id, episodic_id, agent) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            [(long_id, i, agent) for i in episodic_ids],
        )

    def archive_batch(self, conn: sqlite3.Connection, cutoff: str, limit: int) -> int:
        """Move up to `limit` episodes older than cutoff ('-30 days') into the archive, with their ids."""
        columns = "id, agent, event_type, summary, details, outcome, duration_s, timestamp"
        ids = [
            row[0]
            for row in conn.execute(
                f"SELECT id FROM memory_episodic WHERE timestamp < {self.SHIFTED} ORDER BY id LIMIT ?", (cutoff, limit)
            )
        ]
        conn.execute(
            f"INSERT INTO memory_episodic_archive ({columns}) "
            f"SELECT {columns} FROM memory_episodic WHERE id {self.IDS_IN}",
            (self.id_list(ids),),
        )
        conn.execute(f"DELETE FROM memory_episodic WHERE id {self.IDS_IN}", (self.id_list(ids),))
        return len(ids)

    def lifecycle_counts(self, conn: sqlite3.Connection) -> dict:
        """Archived episodic rows and promotions, for /v1/stats."""
        return {
            "episodic_archived": conn.execute("SELECT count(*) FROM memory_episodic_archive").fetchone()[0],
            "promoted_facts": conn.execute("SELECT count(DISTINCT long_id) FROM memory_promotion").fetchone()[0],
        }

    # ==== The rollout checks' own rows (solos_check) ====

    def delete_tagged_facts(self, conn: sqlite3.Connection, source: str, tag: str) -> int:
        """Delete the long facts whose source is `source` and whose JSON tags hold `tag` (and their write keys), in
        one short write transaction: the database is shared with running agents. An agent's fact carrying only the
        tag stays. Returns how many went."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            deleted = [
                row[0]
                for row in conn.execute(
                    "DELETE FROM memory_longterm WHERE source = ? AND EXISTS ("
                    "  SELECT 1 FROM json_each(CASE WHEN json_valid(tags) THEN tags ELSE '[]' END) WHERE value = ?"
                    ") RETURNING id",
                    (source, tag),
                )
            ]
            conn.executemany(
                "DELETE FROM memory_write_key WHERE tier = 'long' AND row_id = ?", [(row_id,) for row_id in deleted]
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return len(deleted)


SQLITE = Queries()  # SQLite's: the embedded store's, and the snapshot files'
