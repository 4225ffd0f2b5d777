"""solos_dataspace: memory as a dataspace. Forget that really forgets, and event subscriptions.

An agent asserts facts (the write operations), retracts its own (`forget`),
and whoever may recall a row may also observe it change (`read_events`, and
`GET /v1/events` as Server-Sent Events). solos_snapshot keeps the whole store
safe, and re-applies this module's retractions on restore.

Like the other carried modules it imports solos_memory (the spine, which
registers itself under that name when run as a script) only inside
functions, for its errors, rules and recall's labels.

    forget     op_forget_memory -> find_row + erase (one transaction) -> Dataspace.scrub
    events     triggers in schema.sql fill memory_event; Dataspace fans them out to subscribers
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import queue
import re
import socket
import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

log = logging.getLogger("solos_dataspace")

# ==== Configuration ====

EVENT_RETENTION_S = 7 * 86_400  # a week: an agent offline over a weekend still catches up by id
MAX_SUBSCRIBERS = 32  # streams each hold a thread; past this, 503 (MAX_CONNECTIONS stays for everyone else)
SUBSCRIBER_BUFFER = 1024  # events queued for one stream; a consumer that far behind is dropped, not waited for
HEARTBEAT_S = 15.0  # under common proxy idle timeouts (30-60 s) and the handler's 30 s socket timeout
POLL_S = 0.05  # how often the fleet's own direct writes are looked for while anyone subscribes
SWEEP_S = 1.0  # expiry events are at most this late
PRUNE_EVERY_S = 600
BATCH = 500  # events read per query
WIRE_CACHE = 4096  # encoded events kept for the streams still to send them
SCAN_LIMIT = 5000  # events one read_events call examines at most (next_since says where it stopped)
MERGE_PAGES = 128  # FTS5 pages one merge step writes: about 10 ms at 100k facts, so no long write lock
MAX_MERGE_STEPS = 10_000
CHECKPOINT_WAIT_MS = 250  # a WAL checkpoint waits this long for readers; past it, the hub retries later
RETRY_CHECKPOINT_S = 5.0

# Where a tier's rows live: an archived episode (solos_lifecycle) keeps its id in the archive table.
RETRACTABLE = {
    "short": ("memory_short",),
    "long": ("memory_longterm",),
    "episodic": ("memory_episodic", "memory_episodic_archive"),
}
KEYWORD_INDEX = {
    "short": ("memory_short_fts",),
    "long": ("memory_longterm_fts",),
    "episodic": ("memory_episodic_fts", "memory_episodic_archive_fts"),
}
# A text query matches a row's own columns: a long fact's context column holds its neighbours' words.
OWN_COLUMNS = {"long": "{topic fact tags agent} : ", "short": "", "episodic": ""}
CONTENT_FIELDS = {
    "long": ("fact",),
    "episodic": ("event_type", "summary", "details", "outcome"),
    "short": ("key", "value"),
}
REMOVALS = ("delete", "forget", "expire", "archive")  # events that carry no row
# A removal reaches a stream with a tags or q filter only if the row matched that filter when it was shown written
# or when the service removed it: decided while the text exists, kept in memory as row ids only. Up to this many
# distinct filters (streams' and read_events callers', most recent kept) and rows each.
REMEMBERED_FILTERS = 256
REMEMBERED_MATCHES = 10_000

# ==== Schema pieces for the operation table ====

FORGET_FIELDS = {
    "tier": {
        "type": "string",
        "enum": ["short", "long", "episodic", "durable"],
        "description": "The row's tier. Durable records are the fleet's, read-only: forgetting one is refused (403).",
    },
    "id": {"type": "integer", "minimum": 1, "description": "The row's id, as recall returned it."},
}
FORGET_OUTPUT = {
    "tier": {"type": "string"},
    "agent": {"type": "string"},
    "id": {"type": "integer"},
    "status": {"type": "string", "enum": ["forgotten"]},
    "content_hash": {"type": "string", "description": "sha256 of what the row said; the text itself is gone."},
    "retraction_id": {"type": "integer"},
    "wal_checkpoint": {
        "type": "string",
        "enum": ["complete", "pending"],
        "description": "complete: the text has left the database file and its WAL; pending: a reader held "
        "the WAL, or the Qdrant mirror's outbox still holds the row; the service finishes it within seconds.",
    },
    "mirror": {
        "type": "string",
        "enum": ["none", "pending"],
        "description": "pending: the Qdrant point's delete is queued in the mirror's outbox (same transaction).",
    },
}
EVENTS_OUTPUT = {
    "agent": {"type": "string"},
    "since": {"type": "integer"},
    "next_since": {"type": "integer", "description": "Pass as since next time: the last event examined."},
    "count": {"type": "integer"},
    "events": {"type": "array", "items": {"type": "object"}},
    "gap": {"type": ["object", "null"], "description": "Set when events after since were pruned (retention)."},
    "retention_s": {"type": "integer"},
}


def event_fields(agent: dict, tags: dict, tiers: Sequence[str], scopes: Sequence[str], default: Sequence[str]) -> dict:
    """read_events' input fields, built from the spine's own agent, tags, tier and scope schemas."""
    return {
        "agent": agent,
        "since": {
            "type": "integer",
            "minimum": 0,
            "description": "Only events with a larger id (the stream: or Last-Event-ID). Default: the oldest kept.",
        },
        "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100, "description": "At most, 1-1000."},
        "tiers": {
            "type": "array",
            "items": {"type": "string", "enum": list(tiers)},
            "maxItems": len(tiers),
            "uniqueItems": True,
            "default": list(default),
            "description": f"Tiers to watch (REST: comma-separated). Default {','.join(default)}.",
        },
        "scope": {
            "type": "string",
            "enum": list(scopes),
            "default": "shared",
            "description": "own, shared or shared_except_self, as in recall.",
        },
        "writers": {
            "type": "array",
            "items": agent,
            "maxItems": 32,
            "uniqueItems": True,
            "description": "Only rows these agents wrote (REST: comma-separated).",
        },
        "tags": {**tags, "description": "Only writes carrying one of these tags."},
        "q": {
            "type": "string",
            "maxLength": 1000,
            "default": "",
            "description": "Only writes whose text matches these words, as recall's keyword search matches.",
        },
    }


# ==== Operations: forget, read_events, and the stream's door ====


def op_forget_memory(memory: Any, args: dict) -> dict:
    """Forget one of the calling agent's own rows (short, long or episodic) by id: only its author may.

    The row, its index entries, vector and the copies neighbours carry as context go in one transaction, then
    the index is merged and the WAL checkpointed so the text leaves the database file. A retraction is kept
    without the text (who, which row, when, a content hash); subscribers get a `forget` event.
    """
    import solos_memory as core
    import solos_rank

    agent, tier, row_id = args["agent"], args["tier"], args["id"]
    if tier == "durable":
        raise core.Forbidden("durable records are the fleet's and read-only; they cannot be forgotten", "tier")

    def work(conn: sqlite3.Connection) -> dict:
        core.Store.require_agent(conn, agent)
        found = find_row(conn, tier, row_id)
        if found is None:
            raise core.NotFound(f"there is no {tier} row with id {row_id}", "id")
        if found[1]["agent"] != agent:
            raise core.Forbidden(
                f"{tier} row {row_id} was written by another agent; only its author can forget it", "id"
            )
        memory.dataspace.note_removal(conn, tier, [row_id])
        return erase(conn, tier, row_id)

    retraction = memory.store.write(work)
    memory.written()
    solos_rank.drop_kept_texts()
    return {
        "tier": tier,
        "agent": agent,
        "id": row_id,
        "status": "forgotten",
        **retraction,
        **memory.dataspace.scrub(tier, row_id),
    }


def op_read_events(memory: Any, args: dict) -> dict:
    """Read what changed since an event id: writes, updates, forgets, deletes and expiries, oldest first.

    Filtered as recall is (scope, tiers, the audited episodic opt-in, durable privacy), plus writers, tags and
    words that writes must match. Pass `next_since` back as `since`; `gap` says when events were pruned (kept a
    week). Over REST, `Accept: text/event-stream` makes the same call a live Server-Sent Events stream.
    """
    return memory.dataspace.read(event_pattern(memory, args), args["since"] or 0, args["limit"])


def event_pattern(memory: Any, args: dict) -> Pattern:
    """What a subscriber watches, after recall's checks: a registered caller, durable rows private."""
    import solos_memory as core
    import solos_rank

    tiers = tuple(dict.fromkeys(args["tiers"] or core.DEFAULT_TIERS))
    if "durable" in tiers and args["scope"] == "shared_except_self":
        raise core.Forbidden("durable memory is private: an agent may watch only its own persona/<agent>", "tiers")
    memory.store.read(lambda conn: core.Store.require_agent(conn, args["agent"]))
    return Pattern.of(args, tiers, solos_rank.make_fts_query(solos_rank.query_words(args["q"] or "")))


def event_row(tier: str, row: Any, caller: str) -> dict:
    """A row as recall shows it, for an event."""
    import solos_memory as core
    import solos_rank

    if tier == "durable":
        return solos_rank.durable_result(row, caller)
    result = solos_rank.tier_result(core.TIER_TABLE[tier], row, caller)
    return {**result, "tags": solos_rank.parse_tags(result["tags"])} if "tags" in result else result


def serve_stream(handler: Any, query: str) -> None:
    """GET /v1/events with Accept: text/event-stream: read_events' checks and filter, then events as they commit.

    `handler` is the spine's MemoryHandler. Refusals raise its errors (JSON 4xx/503, before any event byte).
    A stream gives its connection slot back while it lasts: it counts against MAX_SUBSCRIBERS instead.
    """
    import solos_memory as core

    handler.only(("GET",))
    resume = handler.headers.get("Last-Event-ID")  # a reconnecting EventSource: it wins over the URL's since
    if resume is not None and not resume.strip().isdigit():
        raise core.BadRequest(
            f"Last-Event-ID must be an event id (an integer), got {core.describe(resume)}", "Last-Event-ID"
        )
    op = core.OPERATIONS["read_events"]
    pairs = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if resume is None or k != "since"]
    args = core.coerce_query(op.input_schema, pairs + ([("since", resume.strip())] if resume else []))
    server = handler.server
    subscribe = dataclasses.replace(
        op, function=lambda memory, checked: {"pattern": event_pattern(memory, checked), "since": checked["since"]}
    )
    checked = core.invoke(server.memory, server.tokens, subscribe, args, handler.headers)
    subscriber = server.memory.dataspace.subscribe(checked["pattern"], handler.connection)
    if subscriber is None:
        raise core.Busy(f"{server.memory.dataspace.max_subscribers} event streams are open; that is the cap")
    handler.close_connection = True
    server.slots.release()
    server.unslotted.add(handler.connection)
    handler.status_sent = 200
    handler.count_request()
    server.memory.dataspace.stream(subscriber, checked["since"], handler.wfile.write)


# ==== Storage: forget, retractions and the event log (this module's SQL) ====


def utc_stamp(conn: sqlite3.Connection) -> str:
    return conn.execute("SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now')").fetchone()[0]


def secure_delete(conn: sqlite3.Connection) -> None:
    """Deleted cells and freed pages are overwritten with zeros on this connection; read back to be sure."""
    conn.execute("PRAGMA secure_delete=ON")
    if conn.execute("PRAGMA secure_delete").fetchone()[0] != 1:
        raise RuntimeError("PRAGMA secure_delete did not take: forgotten text would stay in free pages")


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def content_hash(tier: str, row: Any) -> str:
    """The hash a retraction keeps: long facts by their text (as their write key), others by their fields."""
    fields = CONTENT_FIELDS[tier]
    return sha256_text(row["fact"] if tier == "long" else json.dumps([row[name] for name in fields]))


def find_row(conn: sqlite3.Connection, tier: str, row_id: int) -> tuple[str, Any] | None:
    """The table holding the row and the row itself, or None when there is no such row."""
    for table in RETRACTABLE[tier]:
        if table_exists(conn, table):
            row = conn.execute(f"SELECT * FROM {table} WHERE id = ?", (row_id,)).fetchone()
            if row is not None:
                return table, row
    return None


def row_owner(conn: sqlite3.Connection, tier: str, row_id: int) -> str | None:
    """Who wrote the row, or None when there is no such row."""
    found = find_row(conn, tier, row_id)
    return None if found is None else found[1]["agent"]


def context_carriers(conn: sqlite3.Connection, row: Any) -> list[int]:
    """Long facts whose keyword-index row holds this fact's text as context.

    The insert trigger copies the two previous facts of a topic into the next
    ones' context column; a topic's later edits can leave copies further on,
    so the index itself is asked too (phrase match, then the exact copy).
    """
    carriers = {
        r[0]
        for r in conn.execute(
            "SELECT id FROM memory_longterm WHERE topic <> '' AND topic = ? AND id > ? ORDER BY id LIMIT 2",
            (row["topic"], row["id"]),
        )
    }
    phrase = 'context : "' + row["fact"].replace('"', '""') + '"'
    copy = f"{row['agent']}: {row['fact']}"
    carriers.update(
        r[0]
        for r in conn.execute(
            "SELECT rowid FROM memory_longterm_fts WHERE memory_longterm_fts MATCH ? AND instr(context, ?) > 0",
            (phrase, copy),
        )
    )
    return sorted(carriers)


def erase(conn: sqlite3.Connection, tier: str, row_id: int, forgotten_at: str | None = None) -> dict:
    """Delete one row and every copy of its text in the database; record the retraction, without the text.

    Runs inside the caller's write transaction. The delete's triggers drop the
    row's keyword-index entry and its vector; its write key goes here; long
    facts that carried it as context are re-indexed without it (an update of
    `tags` to itself re-runs the index trigger, and nothing else); the event
    log says `forget`. The index's old segments and the WAL still hold the
    words until Dataspace.scrub runs.
    """
    secure_delete(conn)
    found = find_row(conn, tier, row_id)
    assert found is not None, "erase is called for a row the caller found"
    table, row = found
    digest = content_hash(tier, row)
    key_hash = sha256_text(row["key"]) if tier == "short" else None
    conn.execute(f"DELETE FROM {table} WHERE id = ?", (row_id,))
    conn.execute(
        "DELETE FROM memory_write_key WHERE agent = ? AND tier = ? AND row_id = ?", (row["agent"], tier, row_id)
    )
    if tier == "long":
        carriers = context_carriers(conn, row)
        conn.execute(
            "UPDATE memory_longterm SET tags = tags WHERE id IN (SELECT value FROM json_each(?))",
            (json.dumps(carriers),),
        )
    logged = conn.execute(
        "UPDATE memory_event SET kind = 'forget' "
        "WHERE id = (SELECT max(id) FROM memory_event) AND tier = ? AND row_id = ?",
        (tier, row_id),
    ).rowcount
    if not logged:  # an expired short row already reported: its delete logged nothing
        conn.execute(
            "INSERT INTO memory_event (kind, tier, row_id, agent) VALUES ('forget', ?, ?, ?)",
            (tier, row_id, row["agent"]),
        )
    retraction = conn.execute(
        "INSERT INTO memory_retraction (agent, tier, row_id, content_hash, key_hash, forgotten_at) "
        "VALUES (?, ?, ?, ?, ?, coalesce(?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))) RETURNING id",
        (row["agent"], tier, row_id, digest, key_hash, forgotten_at),
    ).fetchone()[0]
    return {"content_hash": digest, "retraction_id": retraction}


def merge_step(conn: sqlite3.Connection, fts: str) -> int:
    """One bounded FTS5 merge toward a single segment; returns the changes it made (under 2: nothing left)."""
    secure_delete(conn)
    before = conn.total_changes
    conn.execute(f"INSERT INTO {fts} ({fts}, rank) VALUES ('merge', ?)", (-MERGE_PAGES,))
    return conn.total_changes - before


def checkpoint_truncate(conn: sqlite3.Connection, wait_ms: int) -> bool:
    """Copy the WAL into the database and cut it to zero bytes; False if a reader kept it (nothing waits long)."""
    conn.execute(f"PRAGMA busy_timeout={int(wait_ms)}")
    busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    return busy == 0


def retractions_after(conn: sqlite3.Connection, after_id: int) -> list[dict]:
    if not table_exists(conn, "memory_retraction"):
        return []
    rows = conn.execute(
        "SELECT id, agent, tier, row_id, content_hash, key_hash, forgotten_at FROM memory_retraction "
        "WHERE id > ? ORDER BY id",
        (after_id,),
    )
    return [dict(zip(("id", "agent", "tier", "row_id", "content_hash", "key_hash", "forgotten_at"), r)) for r in rows]


def reapply(conn: sqlite3.Connection, retraction: dict) -> bool:
    """Forget the row a retraction names if this database still has it, and record the retraction. True if erased.

    The row must be the same one: tier, id and writer, and the same content
    hash (a short row: or the same key, since its value changes on upsert).
    An id reused later by another row is left alone.
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
    found = find_row(conn, tier, row_id)
    row = found[1] if found is not None and found[1]["agent"] == agent else None
    if row is not None and (
        content_hash(tier, row) == retraction["content_hash"]
        or (tier == "short" and sha256_text(row["key"]) == retraction["key_hash"])
    ):
        erase(conn, tier, row_id, retraction["forgotten_at"])
        return True
    conn.execute(
        "INSERT INTO memory_retraction (tier, row_id, agent, content_hash, forgotten_at, key_hash) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (*fields, retraction["key_hash"]),
    )
    return False


def mirror_waiting(conn: sqlite3.Connection, row_ids: Iterable[int]) -> set[int]:
    """Long rows whose delete still waits in the Qdrant mirror's outbox (it keeps their text until sent)."""
    if not table_exists(conn, "qdrant_outbox"):
        return set()
    rows = conn.execute(
        "SELECT DISTINCT row_id FROM qdrant_outbox "
        "WHERE action = 'delete' AND row_id IN (SELECT value FROM json_each(?))",
        (json.dumps(list(row_ids)),),
    )
    return {row[0] for row in rows}


def table_exists(conn: sqlite3.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None


def meta_value(conn: sqlite3.Connection, key: str) -> str | None:
    row = conn.execute("SELECT value FROM solos_memory_meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def set_meta(conn: sqlite3.Connection, key: str, value: Any) -> None:
    conn.execute(
        "INSERT INTO solos_memory_meta (key, value) VALUES (?, ?) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (key, str(value)),
    )


def head_event(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT coalesce(max(id), 0) FROM memory_event").fetchone()[0]


def events_after(conn: sqlite3.Connection, after: int, limit: int) -> list[sqlite3.Row]:
    return conn.execute(
        "SELECT id, ts, kind, tier, row_id, agent FROM memory_event WHERE id > ? ORDER BY id LIMIT ?", (after, limit)
    ).fetchall()


def current_rows(conn: sqlite3.Connection, tiers: dict, events: Sequence[Any]) -> dict[tuple[str, int], Any]:
    """The rows that write and update events name, as they are now and only if recall could return them."""
    wanted: dict[str, list[int]] = {}
    for event in events:
        if event["kind"] not in REMOVALS:
            wanted.setdefault(event["tier"], []).append(event["row_id"])
    found = {}
    for tier, ids in wanted.items():
        if tier == "durable":
            sql = (
                "SELECT id, key, value, updated_at FROM memory_durable t WHERE t.id IN (SELECT value FROM json_each(?))"
            )
        else:
            live = " AND t.expires_at > strftime('%Y-%m-%dT%H:%M:%fZ', 'now')" if tiers[tier].expires else ""
            sql = (
                f"SELECT {tiers[tier].columns}, 0.0 AS score FROM {tiers[tier].table} t "
                f"WHERE t.id IN (SELECT value FROM json_each(?)){live}"
            )
        found.update({(tier, row["id"]): row for row in conn.execute(sql, (json.dumps(ids),))})
    return found


def sharing_agents(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute("SELECT agent FROM episodic_sharing WHERE shared = 1")}


def text_matches(conn: sqlite3.Connection, match: str, candidates: dict[str, list[int]]) -> set[tuple[str, int]]:
    """Which candidate rows the FTS5 query matches, per tier, on the rows' own columns."""
    found: set[tuple[str, int]] = set()
    for tier, ids in candidates.items():
        fts = KEYWORD_INDEX[tier][0]
        rows = conn.execute(
            f"SELECT rowid FROM {fts} WHERE {fts} MATCH ? AND rowid IN (SELECT value FROM json_each(?))",
            (f"{OWN_COLUMNS[tier]}({match})", json.dumps(ids)),
        )
        found.update((tier, row[0]) for row in rows)
    return found


def sweep_expired(conn: sqlite3.Connection, note: Callable[[sqlite3.Connection, str, list[int]], None]) -> int:
    """Log 'expire' for short rows whose TTL passed since the last sweep (inside a write transaction); `note` is
    told their ids first, while their text exists."""
    now = utc_stamp(conn)
    through = meta_value(conn, "events_expired_through")
    added = 0
    if through is not None:
        expiring = conn.execute(
            "SELECT id FROM memory_short WHERE expires_at > ? AND expires_at <= ?", (through, now)
        ).fetchall()
        note(conn, "short", [row[0] for row in expiring])
        added = conn.execute(
            "INSERT INTO memory_event (kind, tier, row_id, agent) SELECT 'expire', 'short', id, agent "
            "FROM memory_short WHERE expires_at > ? AND expires_at <= ? ORDER BY expires_at, id",
            (through, now),
        ).rowcount
    set_meta(conn, "events_expired_through", now)
    return added


def expiry_due(conn: sqlite3.Connection) -> bool:
    through = meta_value(conn, "events_expired_through")
    return through is None or (
        conn.execute(
            "SELECT 1 FROM memory_short WHERE expires_at > ? AND expires_at <= strftime('%Y-%m-%dT%H:%M:%fZ', 'now') "
            "LIMIT 1",
            (through,),
        ).fetchone()
        is not None
    )


def prune_step(conn: sqlite3.Connection, cutoff: str, batch: int) -> int:
    """Delete up to `batch` of the oldest events older than cutoff; remember the last id pruned."""
    pruned = conn.execute(
        "DELETE FROM memory_event WHERE id IN (SELECT id FROM memory_event ORDER BY id LIMIT ?) AND ts < ? "
        "RETURNING id",
        (batch, cutoff),
    ).fetchall()
    if pruned:
        through = max(int(meta_value(conn, "events_pruned_through") or 0), max(row[0] for row in pruned))
        set_meta(conn, "events_pruned_through", through)
    return len(pruned)


# ==== Events: filter, fan-out, Server-Sent Events ====


@dataclass(frozen=True)
class Pattern:
    """What a subscriber watches; the spine builds it after recall's own checks (registered, durable private)."""

    caller: str
    scope: str
    tiers: tuple[str, ...]
    writers: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    q: str = ""
    match: str | None = None  # q as an FTS5 query; None with a q means q has no words, so no write matches

    @classmethod
    def of(cls, args: dict, tiers: tuple[str, ...], match: str | None) -> Pattern:
        """From read_events' checked arguments."""
        writers, tags = tuple(args["writers"] or ()), tuple(args["tags"] or ())
        return cls(args["agent"], args["scope"], tiers, writers, tags, args["q"] or "", match)


@dataclass(eq=False)
class Subscriber:
    """One open stream: its pattern, a bounded queue the hub fills, and the socket to cut if it falls behind."""

    pattern: Pattern
    connection: socket.socket | None
    queue: queue.Queue = field(default_factory=lambda: queue.Queue(SUBSCRIBER_BUFFER))
    dropped: str | None = None

    def offer(self, events: list[dict]) -> bool:
        """Queue events without ever waiting; False (and dropped) when the queue is full."""
        for event in events:
            try:
                self.queue.put_nowait(event)
            except queue.Full:
                self.drop(f"slow consumer: {self.queue.qsize()} events undelivered")
                return False
        return True

    def drop(self, reason: str) -> None:
        """Cut the stream: its thread, maybe blocked writing to a full socket, ends at once.

        Linger 0: the close resets the connection and discards what the kernel
        still buffers for the client (megabytes, which a slow client would
        otherwise crawl through before seeing the end).
        """
        self.dropped = reason
        if self.connection is not None:
            with contextlib.suppress(OSError):
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.shutdown(socket.SHUT_RDWR)


def sse(event: dict | None = None, name: str | None = None, event_id: int | None = None, comment: str = "") -> bytes:
    """One Server-Sent Events message. An id without data moves the client's Last-Event-ID and dispatches nothing."""
    lines = [f": {comment}"] if comment else []
    if name:
        lines.append(f"event: {name}")
    if event_id is not None:
        lines.append(f"id: {event_id}")
    if event is not None:
        lines.append("data: " + json.dumps(event, default=str))
    return ("\n".join(lines) + "\n\n").encode()


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nCache-Control: no-store\r\n"
    b"X-Accel-Buffering: no\r\nConnection: close\r\n\r\nretry: 2000\n\n"
)


class Dataspace:
    """The event log's readers and keeper: subscriptions, fan-out, expiry sweeps, pruning, forget's scrub.

    One thread ("dataspace"), while anyone subscribes, looks for new events
    every POLL_S (an indexed read past its cursor; the fleet's direct writers
    are seen this way) or at once when the service commits, reads them once, filters
    them per subscriber and queues them without waiting: a write never waits
    for a subscriber, and a subscriber whose queue is full is dropped (it
    resumes by Last-Event-ID). Each stream's own handler thread writes to its
    socket, with heartbeats.
    """

    def __init__(self, store: Any):
        import solos_memory as core

        self.store, self.tiers, self.render = store, core.TIER_TABLE, event_row
        self.lock = threading.Lock()
        self.subscribers: set[Subscriber] = set()
        self.cursor = 0  # the last event id fanned out
        self.wakeup = threading.Event()
        self.stopped = False
        self.checkpoint_pending = False
        self.mirror_waits: set[int] = set()  # forgotten long rows the Qdrant outbox still holds
        self.wire_lock = threading.Lock()
        self.wire: dict[tuple[int, bool], bytes] = {}  # encoded events, oldest first
        self.max_subscribers, self.heartbeat_s, self.poll_s = MAX_SUBSCRIBERS, HEARTBEAT_S, POLL_S
        self.counters = {"delivered": 0, "dropped": 0, "refused": 0}
        # (tags, q, match) of a filter -> the rows it matched, oldest first: what removals are decided by.
        self.matched: dict[tuple, dict[tuple[str, int], None]] = {}
        # Its own connection, kept off the request pool, for the thread's reads and its rare writes.
        self.own, self.own_lock = store.connect(), threading.Lock()
        self.thread = threading.Thread(target=self.run, name="dataspace", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Drop every stream and end the thread; once this returns the hub opens no connection."""
        self.stopped = True
        self.wakeup.set()
        with self.lock:
            for subscriber in self.subscribers:
                subscriber.drop("the service is stopping")
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=10)

    def stats(self) -> dict:
        """Open streams, events delivered, streams dropped as slow, streams refused at the cap."""
        with self.lock:
            return {"open": len(self.subscribers), **self.counters}

    def wake(self) -> None:
        """A write committed: look now rather than at the next poll."""
        self.wakeup.set()

    # -- the thread --

    def run(self) -> None:
        try:
            self.loop()
        finally:
            with self.own_lock:
                self.own.close()

    def own_read(self, work: Callable[[sqlite3.Connection], Any], write: bool = False) -> Any:
        """One transaction on the hub's own connection; its writes (expiry sweeps, pruning) are short and rare."""
        with self.own_lock:
            self.own.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                result = work(self.own)
            except BaseException:
                self.own.execute("ROLLBACK")
                raise
            self.own.execute("COMMIT")
            return result

    def loop(self) -> None:
        next_sweep, next_prune, next_checkpoint = 0.0, time.monotonic() + PRUNE_EVERY_S / 10, 0.0
        while not self.stopped:
            self.wakeup.wait(self.poll_s if self.subscribers else SWEEP_S)
            self.wakeup.clear()
            try:
                now = time.monotonic()
                if now >= next_sweep:
                    next_sweep = now + SWEEP_S
                    if self.own_read(expiry_due):
                        self.own_read(functools.partial(sweep_expired, note=self.note_removal), write=True)
                if now >= next_prune:
                    next_prune = now + PRUNE_EVERY_S
                    self.prune()
                if (self.checkpoint_pending or self.mirror_waits) and now >= next_checkpoint:
                    next_checkpoint = now + RETRY_CHECKPOINT_S
                    self.mirror_waits &= self.own_read(functools.partial(mirror_waiting, row_ids=self.mirror_waits))
                    if not self.mirror_waits:
                        self.checkpoint()
                self.fan_out()
            except Exception:  # a busy or broken database: log it, the next round tries again
                log.exception("dataspace round failed")
                time.sleep(1)

    def fan_out(self) -> None:
        """Read what committed since the cursor, once, and queue each subscriber its share."""
        while True:
            with self.lock:
                subscribers, after = list(self.subscribers), self.cursor
            if not subscribers:
                return
            shares, last = self.own_read(functools.partial(self.prepare, subscribers=subscribers, after=after))
            with self.lock:
                for subscriber, events in shares.items():
                    if events and subscriber in self.subscribers and not subscriber.offer(events):
                        self.subscribers.discard(subscriber)
                        self.counters["dropped"] += 1
                self.cursor = max(self.cursor, last)
            if last == after:
                return

    def prepare(self, conn: sqlite3.Connection, subscribers: list[Subscriber], after: int) -> tuple[dict, int]:
        """The next batch after `after`, filtered and rendered per subscriber; (shares, last id read)."""
        events = events_after(conn, after, BATCH)
        if not events:
            return {}, after
        rows, sharing = current_rows(conn, self.tiers, events), sharing_agents(conn)
        shared: dict[tuple, dict] = {}
        return {s: self.visible(conn, s.pattern, events, rows, sharing, shared) for s in subscribers}, events[-1]["id"]

    # -- filtering: what a subscriber may see is what it could recall --

    def visible(
        self,
        conn: sqlite3.Connection,
        pattern: Pattern,
        events: Sequence[Any],
        rows: dict,
        sharing: set,
        shared: dict | None = None,
    ) -> list:
        """The events this pattern lets its caller see, rendered for it, in order.

        `shared` carries renderings across the subscribers of one batch: an event looks the same to every
        caller it is foreign to (or not), so it is rendered (and later encoded) once, not per stream.
        """
        caller, kept = pattern.caller, []
        shared = {} if shared is None else shared
        content = self.content_filter(pattern)
        for event in events:
            tier, agent = event["tier"], event["agent"]
            if tier not in pattern.tiers:
                continue
            if tier == "durable":
                if agent != caller:  # a persona is its own agent's alone
                    continue
            elif (
                (pattern.scope == "own" and agent != caller)
                or (pattern.scope == "shared_except_self" and agent == caller)
                or (pattern.writers and agent not in pattern.writers)
                or (tier == "episodic" and agent != caller and agent not in sharing)
            ):
                continue
            shown = None
            if event["kind"] in REMOVALS:
                if content is not None and not self.had_matched(content, (tier, event["row_id"])):
                    continue
            else:
                row = rows.get((tier, event["row_id"]))
                if row is None:  # gone or expired since: a later event says so
                    continue
                key = (event["id"], agent != caller)
                if key not in shared:
                    shared[key] = self.render(tier, row, caller)
                shown = shared[key]
                if pattern.tags and not set(pattern.tags) & set(shown.get("tags") or ()):
                    continue
            kept.append((event, shown))
        if pattern.q:
            kept = self.text_filter(conn, pattern, kept)
        if content is not None:
            self.remember(content, [(event["tier"], event["row_id"]) for event, shown in kept if shown is not None])
        found = []
        for event, shown in kept:
            message = ("event", event["id"], event["agent"] != caller)
            if message not in shared:
                shared[message] = {
                    "id": event["id"],
                    "kind": event["kind"],
                    "tier": event["tier"],
                    "row_id": event["row_id"],
                    "agent": event["agent"],
                    "foreign": event["agent"] != caller,
                    "ts": event["ts"],
                    "row": shown,
                }
            found.append(shared[message])
        return found

    # -- removals follow the filters: decided while the row's text exists, remembered as row ids --

    def content_filter(self, pattern: Pattern) -> tuple | None:
        """The pattern's tags and q (None without either), registered so the service's removals are matched
        against it from now on."""
        if not pattern.tags and not pattern.q:
            return None
        key = (pattern.tags, pattern.q, pattern.match)
        with self.lock:
            if key not in self.matched:
                if len(self.matched) >= REMEMBERED_FILTERS:
                    del self.matched[next(iter(self.matched))]
                self.matched[key] = {}
        return key

    def remember(self, content: tuple, keys: Iterable[tuple[str, int]]) -> None:
        with self.lock:
            rows = self.matched.setdefault(content, {})
            for key in keys:
                rows.pop(key, None)
                rows[key] = None
            while len(rows) > REMEMBERED_MATCHES:
                del rows[next(iter(rows))]

    def had_matched(self, content: tuple, key: tuple[str, int]) -> bool:
        with self.lock:
            return key in self.matched.get(content, {})

    def note_removal(self, conn: sqlite3.Connection, tier: str, ids: list[int]) -> None:
        """Rows the service is about to remove (forget, delete, expiry), inside that transaction: which known
        filters they match, by their tags and words as they are now."""
        import solos_rank

        with self.lock:
            filters = list(self.matched)
        if not ids or not filters or tier not in RETRACTABLE:
            return
        tags = {}
        if tier in ("short", "long"):
            table = RETRACTABLE[tier][0]
            found = conn.execute(
                f"SELECT id, tags FROM {table} WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(ids),)
            )
            tags = {row[0]: set(solos_rank.parse_tags(row[1])) for row in found}
        for content in filters:
            wanted, q, match = content
            hits = [i for i in ids if not wanted or set(wanted) & tags.get(i, set())]
            if q and hits:
                words = text_matches(conn, match, {tier: hits}) if match else set()
                hits = [i for i in hits if (tier, i) in words]
            self.remember(content, [(tier, i) for i in hits])

    @staticmethod
    def text_filter(conn: sqlite3.Connection, pattern: Pattern, kept: list) -> list:
        """Writes whose row matches the text query; removals carry no text and pass."""
        if pattern.match is None:
            return [(event, shown) for event, shown in kept if shown is None]
        candidates: dict[str, list[int]] = {}
        for event, shown in kept:
            if shown is not None and event["tier"] != "durable":
                candidates.setdefault(event["tier"], []).append(event["row_id"])
        matched = text_matches(conn, pattern.match, candidates)
        words = set(re.findall(r"\w+", pattern.q.lower()))
        return [
            (event, shown)
            for event, shown in kept
            if shown is None
            or (event["tier"], event["row_id"]) in matched
            or (event["tier"] == "durable" and words & set(re.findall(r"\w+", shown["text"].lower())))
        ]

    # -- reading by id (read_events, and a stream's catch-up) --

    def gap(self, conn: sqlite3.Connection, since: int) -> dict | None:
        """Say plainly when events after `since` were pruned before anyone read them."""
        pruned = int(meta_value(conn, "events_pruned_through") or 0)
        if since >= pruned:
            return None
        return {
            "from": since + 1,
            "through": pruned,
            "message": f"events {since + 1}-{pruned} are older than the {EVENT_RETENTION_S // 86_400}-day "
            f"retention and were pruned; recall to catch up, then continue from next_since",
        }

    def collect(
        self, conn: sqlite3.Connection, pattern: Pattern, since: int, limit: int = BATCH
    ) -> tuple[list[dict], int]:
        """Up to `limit` matching events after `since`, examining at most SCAN_LIMIT; (events, last examined)."""
        found: list[dict] = []
        examined, scanned = since, 0
        while len(found) < limit and scanned < SCAN_LIMIT:
            events = events_after(conn, examined, BATCH)
            if not events:
                break
            scanned += len(events)
            shown = {
                e["id"]: e
                for e in self.visible(
                    conn, pattern, events, current_rows(conn, self.tiers, events), sharing_agents(conn)
                )
            }
            for event in events:
                if event["id"] in shown:
                    if len(found) == limit:
                        return found, examined
                    found.append(shown[event["id"]])
                examined = event["id"]
        return found, examined

    def audit(self, caller: str, events: Iterable[dict]) -> None:
        """Foreign episodic rows handed out are audited first, as recall's are; a failed audit hands out nothing."""
        rows = [(e["agent"], e["row_id"]) for e in events if e["tier"] == "episodic" and e["foreign"] and e["row"]]
        if rows:
            self.store.record_audit(caller, rows)

    def read(self, pattern: Pattern, since: int, limit: int) -> dict:
        """read_events: the matching events after `since`, the id to continue from, and any gap."""

        def work(conn: sqlite3.Connection) -> tuple:
            events, examined = self.collect(conn, pattern, since, limit)
            return events, max(examined, since), self.gap(conn, since)

        events, examined, gap = self.store.read(work)
        self.audit(pattern.caller, events)
        with self.lock:
            self.counters["delivered"] += len(events)
        return {
            "agent": pattern.caller,
            "since": since,
            "next_since": examined,
            "count": len(events),
            "events": events,
            "gap": gap,
            "retention_s": EVENT_RETENTION_S,
        }

    # -- streams --

    def subscribe(self, pattern: Pattern, connection: socket.socket | None) -> Subscriber | None:
        """Register a stream, or None when MAX_SUBSCRIBERS are already open."""
        with self.lock:
            if len(self.subscribers) >= self.max_subscribers:
                self.counters["refused"] += 1
                return None
            if not self.subscribers:  # nobody was listening: start from the head, not from a backlog
                self.cursor = self.store.read(head_event)
            subscriber = Subscriber(pattern, connection)
            self.subscribers.add(subscriber)
        self.wakeup.set()
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        with self.lock:
            self.subscribers.discard(subscriber)

    def stream(self, subscriber: Subscriber, since: int | None, write: Callable[[bytes], Any]) -> None:
        """Write the SSE response: catch-up from `since` (None: from now), then live events and heartbeats.

        Returns when the client goes away, the subscriber is dropped, an audit
        fails (an `error` event says so) or the service stops.
        """
        pattern = subscriber.pattern
        try:
            last = since if since is not None else self.store.read(head_event)
            gap = self.store.read(lambda conn: self.gap(conn, last)) if since is not None else None
            write(SSE_HEAD + (sse(gap, "gap") if gap else b""))
            while not self.stopped:  # catch up from the log until it has nothing newer
                events, examined = self.store.read(functools.partial(self.collect, pattern=pattern, since=last))
                if examined == last:
                    break
                last = self.deliver(subscriber, events, examined, write)
            while not self.stopped and not subscriber.dropped:
                try:
                    events = [subscriber.queue.get(timeout=self.heartbeat_s)]
                except queue.Empty:
                    with self.lock:  # nothing queued under the lock: everything up to the cursor was examined
                        cursor = self.cursor if subscriber.queue.empty() else last
                    last = max(last, cursor)
                    write(sse(comment="heartbeat", event_id=last))
                    continue
                while not subscriber.queue.empty():
                    events.append(subscriber.queue.get_nowait())
                fresh = [event for event in events if event["id"] > last]
                if fresh:
                    last = self.deliver(subscriber, fresh, fresh[-1]["id"], write)
        except OSError:  # the client went away, or drop() cut the socket
            pass
        except Exception as error:  # e.g. the audit could not be written: say so, hand out nothing more
            log.warning("event stream for %s ended: %s", pattern.caller, error)
            with contextlib.suppress(OSError):
                write(sse({"message": f"stream ended: {type(error).__name__}: {error}"}, "error"))
        finally:
            self.unsubscribe(subscriber)

    def deliver(self, subscriber: Subscriber, events: list[dict], examined: int, write: Callable[[bytes], Any]) -> int:
        """Audit, then write the events in one send; returns the new last id."""
        self.audit(subscriber.pattern.caller, events)
        payload = b"".join(self.encode(event) for event in events)
        write(payload + (sse(event_id=examined) if not events or events[-1]["id"] != examined else b""))
        with self.lock:
            self.counters["delivered"] += len(events)
        return examined

    def encode(self, event: dict) -> bytes:
        """The event as an SSE message, encoded once for all the streams it goes to (the last WIRE_CACHE kept)."""
        key = (event["id"], event["foreign"])
        with self.wire_lock:
            wire = self.wire.get(key)
        if wire is None:
            wire = sse(event, event_id=event["id"])
            with self.wire_lock:
                self.wire[key] = wire
                while len(self.wire) > WIRE_CACHE:
                    del self.wire[next(iter(self.wire))]
        return wire

    # -- forget's scrub, pruning --

    def scrub(self, tier: str, row_id: int) -> dict:
        """After a forget: merge the tier's keyword index into one segment, then cut the WAL to zero.

        FTS5 deletes only add tombstones (3.40 has no secure-delete option), so
        the forgotten words stay in old index segments until a merge rewrites
        them; each merge step is its own short write transaction. Then a
        TRUNCATE checkpoint moves the zeroed pages into the database file and
        empties the WAL, where older page images still held the text.
        """
        with self.wire_lock:  # encoded events may quote the forgotten row
            self.wire.clear()
        for fts in KEYWORD_INDEX[tier]:
            self.merge(fts)
        if tier == "long" and self.store.read(functools.partial(mirror_waiting, row_ids=[row_id])):
            self.mirror_waits.add(row_id)  # the mirror sends the point's delete; then the hub checkpoints
            return {"wal_checkpoint": "pending", "mirror": "pending"}
        return {"wal_checkpoint": "complete" if self.checkpoint() else "pending", "mirror": "none"}

    def merge(self, fts: str) -> None:
        """Merge one keyword index down to a single segment, a short write transaction per step."""
        for _ in range(MAX_MERGE_STEPS):
            if self.store.write(lambda conn: merge_step(conn, fts)) < 2:
                return
        log.warning("keyword index %s still merging after %d steps; retried on the next forget", fts, MAX_MERGE_STEPS)

    def checkpoint(self) -> bool:
        """TRUNCATE checkpoint on a pooled connection, waiting briefly; remembered for a retry if it did not finish."""
        with self.store.write_lock:
            conn = self.store.checkout()
            try:
                done = checkpoint_truncate(conn, CHECKPOINT_WAIT_MS)
            finally:
                conn.execute(f"PRAGMA busy_timeout={int(self.store.busy_timeout_ms)}")
                self.store.checkin(conn)
        if not done:
            log.warning("WAL checkpoint after a forget waits for a reader; retrying every %s s", RETRY_CHECKPOINT_S)
        self.checkpoint_pending = not done
        return done

    def prune(self) -> int:
        """Drop events older than the retention window, in short batches."""
        cutoff = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(time.time() - EVENT_RETENTION_S))
        total = 0
        while True:
            pruned = self.own_read(functools.partial(prune_step, cutoff=cutoff, batch=BATCH * 10), write=True)
            total += pruned
            if pruned < BATCH * 10:
                return total
