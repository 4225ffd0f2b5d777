"""solos_pg_keyword: each copy's own keyword index over PostgreSQL, in SQLite's FTS5, fed by the event log.

PostgreSQL stays the one source of truth; this index is derived from it, as each copy's vector index is
(solos_rank.VectorIndex), and holds only what ranking needs: per tier, the FTS5 table of the embedded store
(schema.sql's columns and tokenizer, so bm25() with the tier's weights is SQLite's own, by construction) and
the columns the caller's visibility filters read (writer, expiry, tags; a long fact's topic, to find the facts
that quote it as context). Ranking runs solos_store.Store.ranked_rows on it; the rows a recall returns are
then read back from PostgreSQL by id in the recall's own snapshot, through the same filters, so an index that
runs ahead of a snapshot never hands out a row that snapshot cannot see.

- Filled at start from one REPEATABLE READ snapshot of PostgreSQL (`fill`), on a thread of its own, into a
  file of its own in the temporary folder (removed at close): the index is as large as the text, so it lives
  on disk, and its page cache is bounded (CACHE_KIB per connection). Until it is full, recall ranks by the
  SQL path in solos_store_pg (correct, slower) and /health says `keyword_index: filling`.
- Kept current from memory_event, which the schema's triggers write for every change to the tiers, whoever
  makes it: `catch_up` reads the events a snapshot sees that the index has not applied, and applies each
  touched row's state as that snapshot has it (read again by id: insert, replace or drop). What was applied
  is one snapshot's visibility (xmax and the transactions running in it, `Applied`), so events that commit
  out of id order are never skipped. A recall first applies what its snapshot sees (read-your-writes across
  copies); the thread applies what any copy commits (woken by LISTEN, solos_copies.Listener, the commits of
  GATHER_S at once) or every POLL_S, so a forget leaves every copy's index at once, and is then merged out of
  the file and its WAL (the embedded store's own scrub steps).
- A recall that finds more than RECALL_APPLIES_AT_MOST events to apply, or the thread busy applying, ranks by
  the SQL path this once rather than wait; a failure of the index does the same, and /health says `failing`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import logging
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import solos_store
from solos_store import RETRACTABLE, SQLITE, TIER_TABLE, Tier, Visibility, log_event

log = logging.getLogger("solos_pg_keyword")

# schema.sql's FTS5 columns per table, in its order (tests/test_pg_keyword.py holds them to schema.sql), and
# what PostgreSQL's row gives each: the same text the embedded store's triggers index.
FTS_COLUMNS = {
    "memory_longterm": ("topic", "fact", "tags", "agent", "context"),
    "memory_episodic": ("event_type", "summary", "details", "outcome", "agent"),
    "memory_episodic_archive": ("event_type", "summary", "details", "outcome", "agent"),
    "memory_short": ("key", "value", "tags", "agent"),
}
TOKENIZER = "porter unicode61 remove_diacritics 2"  # schema.sql's
# What the visibility filters read (Visibility.where over alias t), and the topic a long fact's neighbours share.
FILTER_COLUMNS = ("agent", "topic", "tags", "expires_at")
EVENT_TIERS = tuple(RETRACTABLE)  # long, episodic, short: the tiers' events (not durable's, not notices)
FILL_PAGE = 5000  # rows read from PostgreSQL and inserted per step of the fill
RECALL_APPLIES_AT_MOST = 2000  # events a recall applies itself; past this it ranks by SQL while the thread applies
APPLY_WAIT_S = 0.25  # how long a recall waits for the thread's apply before it ranks by SQL this once
POLL_S = 1.0  # the thread looks for events this often without a wake (the fleet's writes are woken too)
# After a wake the thread waits this long for more commits before it applies them: serial writes woke one
# catch-up each, its round trip and FTS5 work beside every write (a recall applies what it sees itself).
GATHER_S = 0.1
CACHE_KIB = 16_384  # SQLite page cache per connection: the index's RAM; the file holds the rest
MAX_ROUNDS = 6  # a recall widens its read of the index this often when PostgreSQL's filters drop rows
SCRUB_STEPS = 10_000  # merge steps after a forget, at most (solos_forget's bound)
CHECKPOINT_WAIT_MS = 1000  # a scrub's WAL checkpoint waits this long for the index's readers (recalls) ...
SCRUB_RETRY_S = 5.0  # ... and is tried again this much later, with the lock free meanwhile (solos_forget's retry)
# An expired short row's words are merged out of the short index this long after its `expire` is applied: the
# fleet's expiries come one by one, and a merge per expiry would rewrite that index over and over.
EXPIRY_SCRUB_S = 10.0


FOLDER_PREFIX = "solos-keyword-"  # then the copy's pid and a dash: a later start removes those of dead copies


def remove_stale(folder: str) -> list[str]:
    """Remove the index folders of copies that died without closing (at 1M rows each holds 0.6 GB): those whose
    pid runs no more. The folders removed."""
    removed = []
    for path in glob.glob(os.path.join(glob.escape(folder), FOLDER_PREFIX + "*-*")):
        pid = os.path.basename(path)[len(FOLDER_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        except OSError:  # alive, another user's
            continue
    return removed


def fts_name(table: str) -> str:
    return table + "_fts"


def pg_columns(table: str) -> str:
    """The SELECT list (alias t) of one table's row for the index: id, the FTS5 columns, the filter columns."""
    have = {"id", *FTS_COLUMNS[table], *(("expires_at",) if table == "memory_short" else ())}
    wanted = ("id", *FTS_COLUMNS[table], *(c for c in FILTER_COLUMNS if c not in FTS_COLUMNS[table]))
    return ", ".join(f"t.{c}" if c in have else f"NULL AS {c}" for c in wanted)


@dataclasses.dataclass(frozen=True)
class Applied:
    """What the index holds: every event a snapshot sees whose transaction is below `xmax` and not in `running`."""

    xmax: int
    running: frozenset[int]

    @classmethod
    def of(cls, conn: Any) -> Applied:
        xmax, running = conn.execute(
            "SELECT pg_snapshot_xmax(s)::text::bigint, array(SELECT x::text::bigint FROM pg_snapshot_xip(s) x) "
            "FROM pg_current_snapshot() s"
        ).fetchone()
        return cls(int(xmax), frozenset(running or ()))

    def sees(self, xid: int) -> bool:
        """Whether this snapshot's events from transaction `xid` (if it committed) are applied."""
        return xid < self.xmax and xid not in self.running

    def joined(self, other: Applied) -> Applied:
        """What the index holds once `other`'s events are applied too: a transaction either saw is applied."""
        running = {x for x in self.running if not other.sees(x)} | {x for x in other.running if not self.sees(x)}
        return Applied(max(self.xmax, other.xmax), frozenset(running))


# One round trip at every recall: the snapshot, the vectors' generation (solos_store_pg.near_duplicates_version)
# and the events it sees that `Applied` lacks: from transactions at or past its xmax, or running in it (ids are
# the transaction's xid8 in the high bits: schema_pg.sql's memory_event), each range read by the primary key.
CATCH_UP_SQL = (
    "SELECT pg_snapshot_xmax(s)::text::bigint, array(SELECT x::text::bigint FROM pg_snapshot_xip(s) x), "
    "  (SELECT value FROM solos_memory_meta WHERE key = 'vector_generation'), "
    "  (SELECT json_agg(json_build_array(id, kind, tier, row_id) ORDER BY id) FROM ("
    # Each part ordered by the key and cut at the bound: a plan PostgreSQL cannot take for a large sort (its
    # generic plan of one cut over both parts sorted in parallel workers: 10 ms for no event at 100k rows).
    "    (SELECT id, kind, tier, row_id FROM memory_event WHERE id >= ? AND tier = ANY(?) ORDER BY id LIMIT ?) "
    "    UNION ALL (SELECT e.* FROM unnest(?::bigint[]) x CROSS JOIN LATERAL (SELECT id, kind, tier, row_id "
    "      FROM memory_event WHERE id >= x << 24 AND id < (x + 1) << 24 AND tier = ANY(?) ORDER BY id LIMIT ?) e)"
    "  ) events) "
    "FROM pg_current_snapshot() s"
)


class KeywordIndex:
    """One copy's FTS5 index of the tiers' text (see the module's docstring). `store` is the PgStore it
    derives from; `ranked_rows` answers as PgStore.ranked_rows does, or None: rank by SQL this once."""

    def __init__(self, store: Any, folder: str | None = None):
        self.store = store
        remove_stale(folder or tempfile.gettempdir())
        self.folder = tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-", dir=folder)
        self.path = os.path.join(self.folder, "keyword.db")
        self.writer = self.open()
        self.writer.executescript(local_schema())
        self.local = solos_store.Store(self.path)  # its reads: the embedded store's connections and ranking
        self.lock = threading.Lock()  # one apply at a time (the thread's, or a recall's)
        self.applied: Applied | None = None  # None until the fill is done
        self.state = "filling"
        self.reason: str | None = None  # why the index is failing
        self.filled_rows, self.fill_s = 0, 0.0
        self.wakeup, self.stopped = threading.Event(), threading.Event()
        self.own_writes = False  # this copy wrote since the thread last looked (`written`)
        self.scrub_due, self.scrub_after = False, 0.0  # a forget's scrub to run, not before (monotonic) this
        self.expired_scrub_at: float | None = None  # when (monotonic) to merge the short index after expiries
        self.answered = {"index": 0, "sql": 0}  # recalls' ranked reads by this index, and by SQL meanwhile
        self.thread = threading.Thread(target=self.run, name="pg-keyword", daemon=True)

    def open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=wal")
        conn.execute("PRAGMA synchronous=OFF")  # a rebuildable copy: a crash loses nothing (it is filled again)
        conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        SQLITE.secure_delete(conn)  # a forgotten row's text is zeroed, not left in free pages
        return conn

    def start(self) -> None:
        self.thread.start()

    def wake(self) -> None:
        self.wakeup.set()

    def close(self) -> None:
        self.stopped.set()
        self.wakeup.set()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout=30)
        with self.lock:
            self.local.close()
            self.writer.close()
            shutil.rmtree(self.folder, ignore_errors=True)

    def health(self) -> str:
        """`filling` until the index holds every row, then `ready`; `failing` while it cannot keep up (recall
        ranks by SQL meanwhile, correct and slower)."""
        return self.state

    def stats(self) -> dict:
        size = 0
        with contextlib.suppress(OSError):  # closing: the folder is going
            size = sum(os.path.getsize(os.path.join(self.folder, f)) for f in os.listdir(self.folder))
        return {
            "state": self.state,
            "reason": self.reason,
            "filled_rows": self.filled_rows,
            "fill_s": round(self.fill_s, 1),
            "file_bytes": size,
            "answered": dict(self.answered),
        }

    # -- the thread: fill, then apply what commits --

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.store.read(self.fill)
                break
            except Exception as error:  # the thread fills again from the start
                self.failed(error)
                self.stopped.wait(POLL_S)
        if self.stopped.is_set():
            return
        self.state = "ready"
        log_event("keyword_index_ready", rows=self.filled_rows, seconds=round(self.fill_s, 1))
        while not self.stopped.is_set():
            self.wait_for_commits()
            if self.stopped.is_set():
                break
            try:
                with self.lock:
                    self.store.read(lambda conn: self.apply(conn, None))
                if self.state != "ready":
                    self.state, self.reason = "ready", None
                    log_event("keyword_index_ready", rows=self.filled_rows, seconds=round(self.fill_s, 1))
                if self.scrub_due and time.monotonic() >= self.scrub_after:
                    self.scrub()
                elif self.expired_scrub_at is not None and time.monotonic() >= self.expired_scrub_at:
                    self.scrub(("memory_short",))
            except Exception as error:
                self.failed(error)
                self.stopped.wait(POLL_S)

    def written(self) -> None:
        """This copy wrote a row (PgStore.write_row): marked, not woken, so the write's answer does not wait for the
        thread to run; it looks every GATHER_S."""
        self.own_writes = True

    def wait_for_commits(self) -> None:
        """Until there is something to apply, gathered: other copies' commits (the listener's wake, then GATHER_S for
        the rest of their burst), this copy's own writes (marked by `written`, seen within GATHER_S), or POLL_S."""
        deadline = time.monotonic() + POLL_S
        while not self.stopped.is_set() and time.monotonic() < deadline:
            if self.wakeup.wait(GATHER_S):
                self.stopped.wait(GATHER_S)  # a burst of commits is applied at once, not one catch-up each
                break
            if self.own_writes:
                break
        self.wakeup.clear()
        self.own_writes = False  # before the apply: what commits from here on is marked again

    def failed(self, error: BaseException) -> None:
        """Say so (/health, stats), and log it once a spell: a database away for minutes is one line, not one a
        second; the thread says `keyword_index_ready` when it keeps up again."""
        if self.state != "failing":
            log.warning("keyword index failing, recall ranks by SQL: %s", error, exc_info=True)
        self.state, self.reason = "failing", f"{type(error).__name__}: {error}"

    def fill(self, conn: Any) -> None:
        """Every row of every tier as one snapshot has it, page by page, and that snapshot as what is applied."""
        started, self.state = time.monotonic(), "filling"
        applied = Applied.of(conn)  # the first statement: it fixes the transaction's snapshot
        self.filled_rows = 0
        with self.lock:
            for table in FTS_COLUMNS:
                self.writer.execute(f"DELETE FROM {fts_name(table)}")
                self.writer.execute(f"DELETE FROM {table}")
        for table in FTS_COLUMNS:
            after = 0
            while not self.stopped.is_set():
                rows = conn.execute(
                    f"SELECT {pg_columns(table)} FROM {table} t WHERE t.id > ? ORDER BY t.id LIMIT ?",
                    (after, FILL_PAGE),
                ).fetchall()
                if not rows:
                    break
                with self.lock:
                    self.put(table, rows)
                self.filled_rows += len(rows)
                after = rows[-1][0]
        self.fill_s = time.monotonic() - started
        with self.lock:
            self.applied = applied

    def put(self, table: str, rows: Sequence[Any]) -> None:
        """Insert (or replace) these PostgreSQL rows in the index, in one local transaction."""
        columns = FTS_COLUMNS[table]
        marks = ", ".join("?" * (len(columns) + 1))
        self.writer.execute("BEGIN")
        try:
            ids = [(row[0],) for row in rows]
            self.writer.executemany(f"DELETE FROM {fts_name(table)} WHERE rowid = ?", ids)
            self.writer.executemany(
                f"INSERT INTO {fts_name(table)} (rowid, {', '.join(columns)}) VALUES ({marks})",
                [tuple(row[: len(columns) + 1]) for row in rows],
            )
            self.writer.executemany(
                f"INSERT OR REPLACE INTO {table} (id, {', '.join(FILTER_COLUMNS)}) VALUES (?, ?, ?, ?, ?)",
                [(row["id"], *(row[c] for c in FILTER_COLUMNS)) for row in rows],
            )
            self.writer.execute("COMMIT")
        except BaseException:
            self.writer.execute("ROLLBACK")
            raise

    def drop(self, table: str, ids: Sequence[int]) -> None:
        self.writer.execute("BEGIN")
        try:
            pairs = [(row_id,) for row_id in ids]
            self.writer.executemany(f"DELETE FROM {fts_name(table)} WHERE rowid = ?", pairs)
            self.writer.executemany(f"DELETE FROM {table} WHERE id = ?", pairs)
            self.writer.execute("COMMIT")
        except BaseException:
            self.writer.execute("ROLLBACK")
            raise

    # -- applying what committed --

    def apply(self, conn: Any, most: int | None) -> Applied | None:
        """Apply the events `conn`'s snapshot sees that the index lacks, with the lock held: that snapshot, or
        None (nothing applied) if they are more than `most`."""
        assert self.applied is not None
        limit = most + 1 if most is not None else None
        tiers, running_before = list(EVENT_TIERS), sorted(self.applied.running)
        xmax, running, vectors, events = conn.execute(
            CATCH_UP_SQL, (self.applied.xmax << 24, tiers, limit, running_before, tiers, limit)
        ).fetchone()
        now, conn.keyword_vectors = Applied(int(xmax), frozenset(running or ())), int(vectors or 0)
        if now.xmax <= self.applied.xmax and not any(now.sees(x) for x in self.applied.running):
            return now  # this snapshot sees nothing the index lacks (it may be behind the index)
        events = events or []
        if most is not None and len(events) > most:
            return None
        last: dict[tuple[str, int], str] = {}
        for _, kind, tier, row_id in events:
            last[(tier, row_id)] = kind
        for tier in EVENT_TIERS:
            expired = [row_id for (t, row_id), kind in last.items() if t == tier and kind == "expire"]
            touched = [row_id for (t, row_id), kind in last.items() if t == tier and kind != "expire"]
            for table in RETRACTABLE[tier]:
                if expired:  # invisible to every reader from now; a later update writes it again
                    self.drop(table, expired)
                for start in range(0, len(touched), FILL_PAGE):  # a bulk load by the fleet: a page at a time
                    self.refresh(conn, table, touched[start : start + FILL_PAGE])
        if any(kind == "forget" for kind in last.values()):
            self.scrub_due = True
        if self.expired_scrub_at is None and any(kind == "expire" for kind in last.values()):
            self.expired_scrub_at = time.monotonic() + EXPIRY_SCRUB_S
        self.applied = self.applied.joined(now)
        return now

    def refresh(self, conn: Any, table: str, ids: list[int]) -> None:
        """These rows as `conn`'s snapshot has them: replaced, or dropped if gone. A long fact gone takes the facts
        that quoted it as context with it: they are read again too (PostgreSQL indexed them again without it)."""
        rows = conn.execute(f"SELECT {pg_columns(table)} FROM {table} t WHERE t.id = ANY(?)", (ids,)).fetchall()
        gone = sorted(set(ids) - {row[0] for row in rows})
        if table == "memory_longterm" and gone:  # those read already (touched themselves) only once: one rowid
            quoting = sorted(set(self.quoting(gone)) - {row[0] for row in rows})
            if quoting:
                rows += conn.execute(
                    f"SELECT {pg_columns(table)} FROM {table} t WHERE t.id = ANY(?)", (quoting,)
                ).fetchall()
        if gone:
            self.drop(table, gone)
        if rows:
            self.put(table, rows)

    def quoting(self, gone: list[int]) -> list[int]:
        """The facts whose context may quote one of these, as the index has them: the next two of its topic (whose
        context was its text when they were written, also a text the fleet rewrote since) and later ones of the
        topic that quote its text now."""
        found: set[int] = set()
        for row_id in gone:
            held = self.writer.execute(
                "SELECT topic, agent, fact FROM memory_longterm_fts WHERE rowid = ?", (row_id,)
            ).fetchone()
            if held is None or not held[0]:
                continue
            quoted = f"{held[1]}: {held[2]}"
            found.update(
                row[0]
                for row in self.writer.execute(
                    "SELECT t.id FROM memory_longterm t JOIN memory_longterm_fts f ON f.rowid = t.id "
                    "WHERE t.topic = ? AND t.id > ? AND (instr(f.context, ?) > 0 OR t.id IN "
                    "(SELECT id FROM memory_longterm WHERE topic = ? AND id > ? ORDER BY id LIMIT 2))",
                    (held[0], row_id, quoted, held[0], row_id),
                )
            )
        return sorted(found - set(gone))

    def scrub(self, tables: Sequence[str] = tuple(FTS_COLUMNS)) -> None:
        """After a forget (every index) or expiries (the short one's): merge (FTS5 deletes add tombstones) and empty
        the WAL, as solos_forget's scrub does for the embedded store; a reader that keeps the WAL from being cut
        leaves it due, retried."""
        if len(tables) == len(FTS_COLUMNS):
            self.scrub_due = False
        self.expired_scrub_at = None  # every scrub merges the short index
        for table in tables:
            for _ in range(SCRUB_STEPS):
                with self.lock:
                    if SQLITE.merge_step(self.writer, fts_name(table)) < 2:
                        break
        with self.lock:
            if not SQLITE.checkpoint_truncate(self.writer, CHECKPOINT_WAIT_MS):
                self.scrub_due, self.scrub_after = True, time.monotonic() + SCRUB_RETRY_S

    def caught_up(self, conn: Any) -> Applied | None:
        """Apply what the recall's snapshot sees first (read-your-writes across copies), once per transaction
        (PgStore.read marks each one's connection): that snapshot, or None: rank by SQL."""
        if self.state != "ready":
            return None
        if conn.keyword_snapshot is not None:
            return conn.keyword_snapshot
        if not self.lock.acquire(timeout=APPLY_WAIT_S):
            return None
        try:
            if self.applied is None:
                return None
            conn.keyword_snapshot = self.apply(conn, RECALL_APPLIES_AT_MOST)
            if conn.keyword_snapshot is None:
                self.wake()
            return conn.keyword_snapshot
        except Exception as error:
            self.failed(error)
            self.wake()
            return None
        finally:
            self.lock.release()

    # -- recall's reads --

    def ranked_rows(
        self, conn: Any, tier: Tier, seen: Visibility, match: str, limit: int, tags: Sequence[str] = ()
    ) -> list | None:
        """PgStore.ranked_rows's answer, ranked by FTS5 here: the best `limit` rows the caller may read, each
        read from PostgreSQL in `conn`'s snapshot with `score` -bm25(); None: rank by SQL this once."""
        if not self.caught_up(conn):
            self.answered["sql"] += 1
            return None
        local_tier = dataclasses.replace(tier, columns="t.id, t.agent")
        local_seen = Visibility(seen.caller, seen.scope, seen.sharing, SQLITE, seen.spans, seen.operator)
        want = limit
        for _ in range(MAX_ROUNDS):
            ranked: list = self.local.read(
                functools.partial(
                    self.local.ranked_rows, tier=local_tier, seen=local_seen, match=match, limit=want, tags=tags
                )
            )
            ids = [row["id"] for row in ranked]
            found = {row["id"]: row for row in self.store.rows_by_id(conn, tier, seen, ids, tags)} if ids else {}
            rows = [scored(found[row["id"]], row["score"]) for row in ranked if row["id"] in found]
            if len(rows) >= limit or len(ranked) < want:
                self.answered["index"] += 1
                return rows[:limit]
            want = want * 4  # the snapshot lacks rows the index holds (a write after it, an expiry): read deeper
        self.answered["sql"] += 1
        return None

    def read(self, work: Callable[[Any], Any]) -> Any:
        """`work` on the index (an embedded store's connection), or None while it is not ready."""
        return self.local.read(work) if self.state == "ready" else None

    def topic_neighbours(self, conn: Any, ids: list[int]) -> dict[int, tuple[int | None, int | None]] | None:
        """solos_store's answer from the index's topics, once it holds `conn`'s snapshot; None: ask PostgreSQL.
        (A fact written since that snapshot may be named: read through the snapshot's filters, it is not found,
        as the rows a recall reads by id are not.)"""
        if conn.keyword_snapshot is None or self.state != "ready":
            return None
        return self.local.read(lambda lc: self.local.topic_neighbours(lc, ids))

    def alone(self, conn: Any, match: str) -> bool:
        """Whether one long fact at most (a witness lookup's own result) has `match` in its own text, as the
        embedded store's near_candidates asks it: known only while the index holds exactly `conn`'s snapshot."""
        snapshot = self.caught_up(conn)
        if snapshot is None or not self.lock.acquire(timeout=APPLY_WAIT_S):
            return False
        try:
            long = TIER_TABLE["long"]
            return snapshot == self.applied and not self.local.matches_at_least(
                self.writer, long, "{fact} : (" + match + ")", 2
            )
        finally:
            self.lock.release()

    def long_facts_version(self, conn: Any) -> bytes | None:
        """The long facts' FTS5 structure record (rewritten at every change, as solos_store's near_duplicates_version
        reads it), if the index holds exactly `conn`'s snapshot; None: it may not (nothing is kept)."""
        snapshot = self.caught_up(conn)
        if snapshot is None or not self.lock.acquire(timeout=APPLY_WAIT_S):
            return None
        try:
            if snapshot != self.applied:
                return None
            row = self.writer.execute("SELECT block FROM memory_longterm_fts_data WHERE id = 10").fetchone()
        finally:
            self.lock.release()
        return row[0] if row else b""

    def indexed_rows(self, tier: Tier) -> int | None:
        return self.read(lambda lc: self.local.indexed_rows(lc, tier))

    def matches_up_to(self, tier: Tier, match: str, most: int) -> int | None:
        return self.read(lambda lc: self.local.matches_up_to(lc, tier, match, most))


def scored(row: Any, score: float) -> Any:
    """A PostgreSQL row (solos_store_pg.PgRow) with its `score` set to the index's."""
    values = list(row)
    values[row.names["score"]] = score
    return type(row)(values, row.names)


def local_schema() -> str:
    """The index's tables: schema.sql's FTS5 tables, self-contained (they hold the text they index), and the
    columns recall's filters read, under the tiers' own names (so Visibility's SQL reads them as alias t)."""
    statements = []
    for table, columns in FTS_COLUMNS.items():
        statements.append(
            f"CREATE VIRTUAL TABLE IF NOT EXISTS {fts_name(table)} USING fts5 ({', '.join(columns)}, "
            f"tokenize = '{TOKENIZER}');"
        )
        statements.append(f"CREATE TABLE IF NOT EXISTS {table} (id INTEGER PRIMARY KEY, {', '.join(FILTER_COLUMNS)});")
    statements.append("CREATE INDEX IF NOT EXISTS memory_longterm_topic ON memory_longterm (topic, id);")
    return "\n".join(statements)
