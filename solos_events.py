"""solos_events: whoever may recall a row may watch it change. read_events, and the hub behind the streams.

Triggers in schema.sql log every write, update, delete, forget, expiry and
archive to memory_event (the fleet's direct writers too); the EventHub reads
them once, filters them per subscriber as recall would (scope, tiers, the
audited episodic opt-in, durable privacy, writers, tags, words) and queues
them to each stream without waiting. The Server-Sent Events door is the
transport's (solos_memory.MemoryHandler.serve_stream).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import queue
import re
import select
import socket
import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import solos_bounds
import solos_rank
import solos_store
from solos_operations import Operation, object_schema, result_schema
from solos_store import DEFAULT_TIERS, SCOPES, TIERS, BadRequest
from solos_validation import AGENT_SCHEMA, TAGS_SCHEMA, describe

log = logging.getLogger("solos_events")

# ==== Configuration ====

EVENT_RETENTION_S = 7 * 86_400  # a week: an agent offline over a weekend still catches up by id
MAX_SUBSCRIBERS = 32  # streams each hold a thread; past this, 503 (MAX_CONNECTIONS stays for everyone else)
# One agent's share: its newest stream replaces its oldest past this, and at the cap an agent holding more
# than a newcomer's share gives up its oldest, so no agent holds every stream.
STREAMS_PER_AGENT = 4
GONE_CHECK_S = 1.0  # how often a quiet stream looks for a client that hung up
SUBSCRIBER_BUFFER = 1024  # events queued for one stream; a consumer that far behind is dropped, not waited for
# A queued write older than this is read again before it is sent (the row gone: skipped), so a stream held up by
# a slow socket never hands out a row forgotten while it waited; a fresher one went out as a recall's would.
RECHECK_AFTER_S = 0.25
# A queued short row whose expiry is this close to the host's clock is read again too, by the database's clock
# (PostgreSQL's may run ahead of this host's), so no row goes out past its expiry.
EXPIRY_MARGIN_S = 1.0
HEARTBEAT_S = 15.0  # under common proxy idle timeouts (30-60 s) and the handler's 30 s socket timeout
POLL_S = 0.05  # how often the fleet's own direct writes are looked for while anyone subscribes
SWEEP_S = 1.0  # expiry events are at most this late
PRUNE_EVERY_S = 600
BATCH = 500  # events read per query
# A removal reaches a stream with a tags or q filter only if the row matched that filter when it was shown written
# or when the service removed it: decided while the text exists, kept in memory as row ids only. Up to this many
# distinct filters (streams' and read_events callers', most recent kept) and rows each.
REMEMBERED_FILTERS = 256
SHARED_MATCHES = ("removals matched on other workers",)  # its place in a batch's renderings (visible's `shared`)
REMEMBERED_MATCHES = 10_000
WIRE_CACHE_BYTES = 8 << 20  # encoded events kept for the streams still to send them: 8 MiB, 4,000 small ones
SCAN_LIMIT = 5000  # events one read_events call examines at most (next_since says where it stopped)

# ==== Schema pieces for the operation's row ====

EVENTS_OUTPUT = {
    "agent": {"type": "string"},
    "since": {"type": "integer"},
    "next_since": {"type": "integer", "description": "Pass as since next time: the last event examined."},
    "count": {"type": "integer"},
    "events": {"type": "array", "items": {"type": "object"}},
    "gap": {
        "type": ["object", "null"],
        "description": "Set when events after since were pruned (retention), or (PostgreSQL) when the read went past "
        "a transaction running too long to wait for, whose events, if it commits, come before next_since.",
    },
    "retention_s": {"type": "integer"},
}


EVENT_FIELDS = {  # read_events' input
    "agent": AGENT_SCHEMA,
    "since": {
        "type": "integer",
        "minimum": 0,
        "maximum": solos_bounds.MAX_ID,
        "description": "Only events with a larger id (the stream: or Last-Event-ID). Default: the oldest kept.",
    },
    "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100, "description": "At most, 1-1000."},
    "tiers": {
        "type": "array",
        "items": {"type": "string", "enum": list(TIERS)},
        "maxItems": len(TIERS),
        "uniqueItems": True,
        "default": list(DEFAULT_TIERS),
        "description": f"Tiers to watch (REST: comma-separated). Default {','.join(DEFAULT_TIERS)}.",
    },
    "scope": {
        "type": "string",
        "enum": list(SCOPES),
        "default": "shared",
        "description": "own, shared or shared_except_self, as in recall.",
    },
    "writers": {
        "type": "array",
        "items": AGENT_SCHEMA,
        "maxItems": 32,
        "uniqueItems": True,
        "description": "Only rows these agents wrote (REST: comma-separated).",
    },
    "tags": {**TAGS_SCHEMA, "description": "Only writes carrying one of these tags."},
    "q": {
        "type": "string",
        "maxLength": 1000,
        "default": "",
        "description": "Only writes whose text matches these words, as recall's keyword search matches.",
    },
}


# ==== The operation ====


def op_read_events(memory: Any, args: dict) -> dict:
    """Read what changed since an event id: writes, updates, forgets, deletes and expiries, oldest first.

    Filtered as recall is (scope, tiers, the audited episodic opt-in, durable privacy), plus writers, tags and
    words that writes must match. Pass `next_since` back as `since`; `gap` says when events were pruned (kept a
    week). Over REST, `Accept: text/event-stream` makes the same call a live Server-Sent Events stream.
    """
    return memory.events.read(event_pattern(memory, args), args["since"] or 0, args["limit"])


def event_pattern(memory: Any, args: dict) -> Pattern:
    """What a subscriber watches, after recall's checks: a registered caller, durable rows private."""
    tiers = tuple(dict.fromkeys(args["tiers"] or solos_store.DEFAULT_TIERS))
    solos_store.refuse_foreign_persona(tiers, args["scope"])
    memory.store.read(lambda conn: solos_store.Store.require_agent(conn, args["agent"]))
    return Pattern.of(args, tiers, solos_rank.make_fts_query(solos_rank.query_words(args["q"] or "")))


def last_event_id(header: str | None) -> str | None:
    """A reconnecting EventSource's Last-Event-ID, if it sent one: an event id, or a 400 naming the header (digits
    str.isdigit takes but int() does not, or past 64 bits, were refused as `since`, which the client never sent)."""
    if header is not None and not (re.fullmatch(r"[0-9]{1,19}", header.strip()) and int(header) <= solos_bounds.MAX_ID):
        raise BadRequest(f"Last-Event-ID must be an event id (an integer), got {describe(header)}", "Last-Event-ID")
    return header


def event_row(tier: str, row: Any, caller: str) -> dict:
    """A row as recall shows it, for an event."""
    if tier == "durable":
        return solos_rank.durable_result(row, caller)
    result = solos_rank.tier_result(solos_store.TIER_TABLE[tier], row, caller)
    return {**result, "tags": solos_store.parse_tags(result["tags"])} if "tags" in result else result


def logged_for(event: Any, row: Any) -> bool:
    """The row is the one the event was logged for: the same writer, and not written after the event.

    Row ids are never reused (schema.sql), so this is the second lock: an id
    that named another row when the event was logged (a database from before
    the marks, or a fleet writer choosing ids) is never shown in its place.
    A persona's id is the fleet's (no marks): it must still be persona/<the event's agent>, not the persona
    the fleet renamed it to or gave its id next.
    """
    if event["tier"] == "durable":
        return bool(row["key"] == "persona/" + event["agent"])
    born = {"long": "created_at", "episodic": "ts"}.get(event["tier"])  # short rows restart created_at on update
    return row["agent"] == event["agent"] and (born is None or row[born] <= event["ts"])


OPERATION_ROWS = (
    Operation(
        "read_events",
        "GET",
        "/v1/events",
        op_read_events,
        object_schema(EVENT_FIELDS),
        result_schema(EVENTS_OUTPUT),
        writes=False,
        idempotent=True,
        title="What changed since an event id",
    ),
)


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


def choose_victim(streams: Sequence[tuple[str, float, Any]], agent: str, per_agent: int, cap: int) -> Any:
    """Which open stream a newcomer of `agent` replaces: the key of one, None (a seat is free), or "refuse".

    `streams` is (agent, opened, key) of every open stream. An agent at `per_agent` gives up its own oldest
    for its newest. At the cap, the agent holding the most streams gives up its oldest if it holds more than
    the newcomer's agent would.
    """
    held: dict[str, list[Any]] = {}
    for holder, _, key in sorted(streams, key=lambda stream: stream[1]):
        held.setdefault(holder, []).append(key)
    mine = held.get(agent, [])
    if len(mine) >= per_agent:
        return mine[0]
    if len(streams) >= cap:
        most = max(held.values(), key=len)
        return "refuse" if len(most) <= len(mine) + 1 else most[0]
    return None


@dataclass(eq=False)
class Subscriber:
    """One open stream: its pattern, a bounded queue the hub fills, and the socket to cut if it falls behind."""

    pattern: Pattern
    connection: socket.socket | None
    queue: queue.Queue = field(default_factory=lambda: queue.Queue(SUBSCRIBER_BUFFER))
    dropped: str | None = None
    opened: float = field(default_factory=time.monotonic)
    seat: int | None = None  # workers: its seat in solos_workers.Seats
    confirm: Callable[[str], None] | None = None  # with tokens: raises once the token no longer names the caller

    def gone(self) -> bool:
        """The client hung up: its socket reads end-of-file (an SSE client sends nothing after its request)."""
        if self.connection is None:
            return False
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (OSError, ValueError):
            return True

    def offer(self, events: list[dict]) -> bool:
        """Queue events (with when they were queued) without ever waiting; False (and dropped) when the queue is
        full."""
        now = time.monotonic()
        for event in events:
            try:
                self.queue.put_nowait((now, event))
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


SSE_PREAMBLE = b"retry: 2000\n\n"  # after the transport's head: how long a client waits to reconnect


class EventHub:
    """The event log's readers and keeper: subscriptions, fan-out, expiry sweeps, pruning; retries forget's scrubs.

    One thread ("dataspace"), while anyone subscribes, looks for new events
    every POLL_S (an indexed read past its cursor; the fleet's direct writers
    are seen this way) or at once when the service commits, reads them once, filters
    them per subscriber and queues them without waiting: a write never waits
    for a subscriber, and a subscriber whose queue is full is dropped (it
    resumes by Last-Event-ID). Each stream's own handler thread writes to its
    socket, with heartbeats.

    On PostgreSQL, other copies of the service write the same log: a listener
    (Store.listen) wakes the hub as they commit, and the hub drops what this
    copy keeps of a row another copy forgot (`watch_forgets`).
    """

    def __init__(self, store: solos_store.Store, scrubber: Any = None):
        self.store, self.tiers, self.render = store, solos_store.TIER_TABLE, event_row
        self.scrubber = scrubber  # solos_forget.Scrubber: its unfinished scrubs are retried on this thread
        self.lock = threading.Lock()
        self.subscribers: set[Subscriber] = set()
        self.cursor = 0  # the last event id fanned out
        self.wakeup = threading.Event()
        self.stopped = False
        self.wire_lock = threading.Lock()
        self.wire: dict[tuple[int, bool], tuple[dict, bytes]] = {}  # rendered and encoded events, oldest first
        self.wire_bytes = 0
        self.max_subscribers, self.heartbeat_s, self.poll_s = MAX_SUBSCRIBERS, HEARTBEAT_S, POLL_S
        self.streams_per_agent = STREAMS_PER_AGENT
        self.counters = {"delivered": 0, "dropped": 0, "refused": 0, "replaced": 0}
        # (tags, q, match) of a filter -> the rows it matched, oldest first: what removals are decided by.
        self.matched: dict[tuple, dict[tuple[str, int], None]] = {}
        self.deliveries: Any = None  # solos_provenance.DeliveryLog: what a read or a stream hands out is logged
        # Its own connection, kept off the request pool, for the thread's reads and its rare writes.
        self.own, self.own_lock = store.connect(), threading.Lock()
        self.retracted: int | None = None  # the newest retraction seen (watch_forgets)
        self.forgotten_elsewhere: Callable[[], None] | None = None  # the spine's caches to drop after one
        self.retraction_lock = threading.Lock()
        self.seats: Any = None  # workers: solos_workers.Seats, every worker's streams under the caps
        self.thread = threading.Thread(target=self.run, name="dataspace", daemon=True)
        self.thread.start()
        self.listener = store.listen(self.wake)  # None but on PostgreSQL: other copies' commits wake the hub too

    def stop(self) -> None:
        """Drop every stream and end the thread; once this returns the hub opens no connection."""
        self.stopped = True
        self.wakeup.set()
        if self.listener is not None:
            self.listener.stop()
        with self.lock:
            for subscriber in self.subscribers:
                subscriber.drop("the service is stopping")
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=10)

    def stats(self) -> dict:
        """Open streams, events delivered, streams dropped as slow, refused at the cap, the encoded-event cache,
        and the cursor: whether a running transaction holds it (PostgreSQL; Store.event_cursor)."""
        with self.lock:
            found = {"open": len(self.subscribers), **self.counters}
        with self.wire_lock:
            found = {**found, "cache_events": len(self.wire), "cache_bytes": self.wire_bytes}
        if self.seats is not None:
            found.update(self.seats.count())
        return {**found, "cursor": self.store.event_cursor()}

    def forget_encoded(self) -> None:
        """Drop every encoded event: after a forget, one may quote the forgotten row."""
        with self.wire_lock:
            self.wire.clear()
            self.wire_bytes = 0

    def wake(self) -> None:
        """A write committed (another copy's, on PostgreSQL): look now rather than at the next poll."""
        self.wakeup.set()

    def written(self) -> None:
        """This service wrote or removed a row: `wake`, if anyone subscribes; else the thread has nothing a write
        changes (its sweeps keep their clock, `subscribe` wakes it for the first stream), and waking it took a
        thread switch in every write's path."""
        if self.subscribers:
            self.wakeup.set()

    # -- the thread --

    def run(self) -> None:
        try:
            self.loop()
        finally:
            with self.own_lock:
                self.own.close()

    def own_read(self, work: Callable[[sqlite3.Connection], Any], write: bool = False, alone: bool = False) -> Any:
        """One transaction on the hub's own connection; its writes (expiry sweeps, pruning) are short and rare.
        `alone`: work is one statement, its own transaction (no BEGIN and COMMIT: two round trips fewer)."""
        with self.own_lock:
            if getattr(self.own, "broken", False):  # a PostgreSQL server that went away and came back
                self.own = self.store.connect()
            if alone:
                return work(self.own)
            begin = self.store.BEGIN_WRITE if write else self.store.BEGIN_READ
            self.own.execute(begin)
            try:
                result = solos_store.leniently(self.own, begin, work)
            except BaseException:
                if not getattr(self.own, "broken", False):
                    self.own.execute("ROLLBACK")
                raise
            self.own.execute("COMMIT")
            return result

    def loop(self) -> None:
        next_sweep, next_prune, next_checkpoint = 0.0, time.monotonic() + PRUNE_EVERY_S / 10, 0.0
        next_forget_check = 0.0
        while not self.stopped:
            self.wakeup.wait(self.poll_s if self.subscribers else SWEEP_S)
            self.wakeup.clear()
            try:
                now = time.monotonic()
                if now >= next_sweep:
                    next_sweep = now + SWEEP_S
                    if self.store.shared_by_copies:  # the cursor's state for /health and stats, with or without streams
                        self.own_read(self.store.event_cursor)
                    if self.own_read(self.store.queries.expiry_due):
                        self.own_read(
                            lambda conn: self.store.queries.sweep_expired(conn, self.note_removal), write=True
                        )
                if now >= next_prune:
                    next_prune = now + PRUNE_EVERY_S
                    self.prune()
                scrubber = self.scrubber
                if scrubber is not None and now >= next_checkpoint:  # also what another process queued (purge)
                    next_checkpoint = now + scrubber.retry_s
                    scrubber.finish()
                if self.store.shared_by_copies and now >= next_forget_check:
                    next_forget_check = now + self.forget_check_s()
                    self.watch_forgets()
                if self.subscribers:
                    self.cut_seats()
                self.fan_out()
            except Exception:  # a busy or broken database: log it, the next round tries again
                log.exception("dataspace round failed")
                time.sleep(1)

    def retracted_since(self, conn: Any) -> None:
        """Another copy (or worker) forgot a row: drop what this one keeps that may quote it (encoded events here,
        recall's texts and vectors through `forgotten_elsewhere`), as the one that forgot it did (solos_forget).
        On the hub's round (`watch_forgets`), and at the start of every recall's read while copies share the
        store, so no answer after the forget's comes from what was kept before it."""
        last = self.store.queries.last_retraction(conn)
        with self.retraction_lock:
            moved, self.retracted = self.retracted is not None and last > self.retracted, max(self.retracted or 0, last)
        if moved:
            self.forget_encoded()
            if self.forgotten_elsewhere is not None:
                self.forgotten_elsewhere()

    def watch_forgets(self) -> None:
        self.own_read(self.retracted_since, alone=True)

    def forget_check_s(self) -> float:
        """How soon the hub looks for another copy's forget again: every poll while streams (or their encoded
        events) may hand out what it keeps; else every SWEEP_S, since a recall looks first itself
        (`retracted_since`). Each look is a round trip, and every write of this copy woke one (20 a second)."""
        with self.lock:
            streaming = bool(self.subscribers)
        if not streaming:
            self.forget_encoded()  # kept for streams still to send them: there are none
        return self.poll_s if streaming else SWEEP_S

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
        events = self.store.queries.events_after(conn, after, BATCH)
        if not events:
            return {}, after
        rows, sharing = (
            self.store.queries.current_rows(conn, self.tiers, events),
            self.store.queries.sharing_agents(conn),
        )
        shared: dict[tuple, dict] = {}
        skipped = self.skipped_gap(conn, after, events[-1]["id"])
        marks = [{"id": 0, "gap": skipped}] if skipped else []  # the stream writes it as a `gap` event (stream)
        spans = self.spans_for(conn, events)
        shares = {s: marks + self.visible(conn, s.pattern, events, rows, sharing, shared, spans) for s in subscribers}
        return shares, events[-1]["id"]

    # -- filtering: what a subscriber may see is what it could recall --

    def visible(
        self,
        conn: sqlite3.Connection,
        pattern: Pattern,
        events: Sequence[Any],
        rows: dict,
        sharing: set,
        shared: dict | None = None,
        spans: Sequence[tuple[str, str, str | None]] = (),
    ) -> list:
        """The events this pattern lets its caller see, rendered for it, in order.

        `shared` carries renderings across the subscribers of one batch: an event looks the same to every
        caller it is foreign to (or not), so it is rendered (and later encoded) once, not per stream. `spans`
        (spans_for): when authors shared their episodes, for removals, which carry no row to judge now.
        """
        caller = pattern.caller
        kept: list[tuple[Any, Any]] = []
        notices: list[tuple[Any, Any]] = []
        shared = {} if shared is None else shared
        seen = solos_store.Visibility(caller, pattern.scope, sharing, spans=spans)  # recall's rule, row by row
        content = self.content_filter(pattern)
        for event in events:
            tier, agent = event["tier"], event["agent"]
            if event["kind"] == "notice":  # a retraction notice reaches its agent whatever the filter
                notice = rows.get(("notice", event["row_id"]))
                if agent == caller and notice is not None:
                    notices.append((event, dict(notice)))
                continue
            if tier not in pattern.tiers or not seen.allows(tier, agent):
                continue
            if tier != "durable" and pattern.writers and agent not in pattern.writers:
                continue
            shown = None
            if event["kind"] in solos_store.REMOVALS:
                if not seen.shared_at(tier, agent, event["ts"]):  # removed while its author did not share
                    continue
                if content is not None and not self.had_matched(content, (tier, event["row_id"]), shared):
                    continue
            else:
                row = rows.get((tier, event["row_id"]))
                if row is None or not logged_for(event, row):  # gone or expired since: a later event says so
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
        for event, shown in sorted(kept + notices, key=lambda pair: pair[0]["id"]) if notices else kept:
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
                    "row": None if event["kind"] == "notice" else shown,
                    **({"notice": shown} if event["kind"] == "notice" else {}),
                }
            found.append(shared[message])
        return found

    def spans_for(self, conn: sqlite3.Connection, events: Sequence[Any]) -> list[tuple[str, str, str | None]]:
        """When each author shared its episodes, if these events remove an opt-in row (else none: not read)."""
        removes_opt_in = any(
            e["kind"] in solos_store.REMOVALS and e["tier"] in self.tiers and self.tiers[e["tier"]].opt_in
            for e in events
        )
        return self.store.queries.sharing_spans(conn) if removes_opt_in else []

    # -- removals follow the filters: decided while the row's text exists, remembered as row ids --

    def content_filter(self, pattern: Pattern) -> tuple | None:
        """The pattern's tags and q (None without either), registered so the service's removals are matched
        against it from now on."""
        if not pattern.tags and not pattern.q:
            return None
        key = (pattern.tags, pattern.q, pattern.match)
        with self.lock:
            new, dropped = key not in self.matched, None
            if new:
                if len(self.matched) >= REMEMBERED_FILTERS:
                    dropped = next(iter(self.matched))
                    del self.matched[dropped]
                self.matched[key] = {}
        if new and self.seats is not None:  # workers: the others match their removals against it too
            self.seats.filters.register(key, dropped)
        return key

    def remember(self, content: tuple, keys: Iterable[tuple[str, int]]) -> None:
        with self.lock:
            rows = self.matched.setdefault(content, {})
            for key in keys:
                rows.pop(key, None)
                rows[key] = None
            while len(rows) > REMEMBERED_MATCHES:
                del rows[next(iter(rows))]

    def had_matched(self, content: tuple, key: tuple[str, int], batch: dict | None = None) -> bool:
        """Whether the row matched the filter when it was shown or removed; workers: by any worker, whose matches
        are read once per `batch` (its removals committed, and so left their matches, before it was read)."""
        with self.lock:
            if key in self.matched.get(content, {}):
                return True
        if self.seats is None:
            return False
        batch = {} if batch is None else batch
        if SHARED_MATCHES not in batch:
            batch[SHARED_MATCHES] = self.seats.filters.matches()
        return self.seats.filters.entry(content, key) in batch[SHARED_MATCHES]

    def note_removal(self, conn: sqlite3.Connection, tier: str, ids: list[int]) -> None:
        """Rows the service is about to remove (forget, delete, expiry), inside that transaction: which known
        filters they match, by their tags and words as they are now. Workers: every worker's filters, and what
        matched is written for the others before the removal commits (solos_workers.Filters)."""
        if not ids or tier not in solos_store.RETRACTABLE:
            return
        with self.lock:
            own = list(self.matched)
        shared = self.seats.filters if self.seats is not None else None
        filters = own + [key for key in shared.registered() if key not in own] if shared is not None else own
        if not filters:
            return
        tags = self.store.queries.tags_of(conn, tier, ids)
        published: list[tuple[tuple, str, int]] = []
        for content in filters:
            wanted, q, match = content
            hits = [i for i in ids if not wanted or set(wanted) & tags.get(i, set())]
            if q and hits:
                words = self.store.queries.text_matches(conn, match, {tier: hits}) if match else set()
                hits = [i for i in hits if (tier, i) in words]
            if content in own:
                self.remember(content, [(tier, i) for i in hits])
            published.extend((content, tier, i) for i in hits)
        if shared is not None:
            shared.matched(published)

    def text_filter(self, conn: sqlite3.Connection, pattern: Pattern, kept: list) -> list:
        """Writes whose row matches the text query; removals carry no text and pass."""
        if pattern.match is None:
            return [(event, shown) for event, shown in kept if shown is None]
        candidates: dict[str, list[int]] = {}
        for event, shown in kept:
            if shown is not None and event["tier"] != "durable":
                candidates.setdefault(event["tier"], []).append(event["row_id"])
        matched = self.store.queries.text_matches(conn, pattern.match, candidates)
        words = set(re.findall(r"\w+", pattern.q.lower()))
        return [
            (event, shown)
            for event, shown in kept
            if shown is None
            or (event["tier"], event["row_id"]) in matched
            or (event["tier"] == "durable" and words & set(re.findall(r"\w+", shown["text"].lower())))
        ]

    # -- reading by id (read_events, and a stream's catch-up) --

    def gap(self, conn: sqlite3.Connection, since: int, through: int | None = None) -> dict | None:
        """Say plainly when events after `since` were pruned before anyone read them, or when reading up to
        `through` went past a transaction the cursor no longer waits for (skipped_gap); one gap for both."""
        gaps = [self.pruned_gap(conn, since), self.skipped_gap(conn, since, through) if through else None]
        found = [gap for gap in gaps if gap]
        if len(found) < 2:
            return found[0] if found else None
        return {
            **found[1],
            "from": min(gap["from"] for gap in found),
            "through": max(gap["through"] for gap in found),
            "message": " ".join(gap["message"] for gap in found),
        }

    def resume(self, conn: sqlite3.Connection, since: int) -> tuple[int, dict | None]:
        """Where reading after `since` starts, and a gap if not there. A cursor above every id this store could
        have handed out (another store's, or one kept across a restore into an empty folder) would wait for ids
        this store reaches only much later, skipping everything until then: it starts at the head, and says so."""
        ceiling = self.store.queries.event_ceiling(conn)
        if since <= ceiling:
            return since, None
        head = self.store.queries.head_event(conn)
        return head, {
            "from": ceiling + 1,
            "through": since,
            "message": f"since {since} is past every event id this store handed out (at most {ceiling}): it was "
            f"never this store's (another store's, or kept from before a restore); continuing from {head}, so "
            "recall to catch up",
        }

    def pruned_gap(self, conn: sqlite3.Connection, since: int) -> dict | None:
        pruned = int(self.store.queries.meta_value(conn, "events_pruned_through") or 0)
        if since >= pruned:
            return None
        return {
            "from": since + 1,
            "through": pruned,
            "message": f"events {since + 1}-{pruned} are older than the {EVENT_RETENTION_S // 86_400}-day "
            f"retention and were pruned; recall to catch up, then continue from next_since",
        }

    def skipped_gap(self, conn: sqlite3.Connection, since: int, through: int) -> dict | None:
        """PostgreSQL: reading (since, through] went past transactions of this database that had run too long to
        wait for (solos_store_pg.EVENT_WAIT_S, an idle session holding an xid): what they log if they commit
        lands among ids already read. Read in the same transaction as the events, so it names exactly those."""
        skipped = [
            one for one in self.store.queries.passed_over(conn) if one["from"] <= through and one["through"] > since
        ]
        if not skipped:
            return None
        named = ", ".join(f"{one['xid']} (pid {one['pid']})" for one in skipped)
        return {
            "from": min(one["from"] for one in skipped),
            "through": max(one["through"] for one in skipped),
            "not_waited_for": [{"xid": one["xid"], "pid": one["pid"]} for one in skipped],
            "message": f"transactions {named} of the database ran too long to wait for; events they log if they "
            "commit come before next_since and will not be read from it: recall to catch up",
        }

    def collect(
        self, conn: sqlite3.Connection, pattern: Pattern, since: int, limit: int = BATCH
    ) -> tuple[list[dict], int]:
        """Up to `limit` matching events after `since`, examining at most SCAN_LIMIT and holding at most
        solos_bounds.ANSWER_BYTES of JSON (always one event at least); (events, last examined)."""
        found: list[dict] = []
        examined, scanned, size = since, 0, 0
        while len(found) < limit and scanned < SCAN_LIMIT:
            events = self.store.queries.events_after(conn, examined, BATCH)
            if not events:
                break
            scanned += len(events)
            shown = {
                e["id"]: e
                for e in self.visible(
                    conn,
                    pattern,
                    events,
                    self.store.queries.current_rows(conn, self.tiers, events),
                    self.store.queries.sharing_agents(conn),
                    spans=self.spans_for(conn, events),
                )
            }
            for event in events:
                if event["id"] in shown:
                    size += solos_bounds.json_bytes(shown[event["id"]]) + 1
                    if len(found) == limit or (found and size > solos_bounds.ANSWER_BYTES):
                        return found, examined
                    found.append(shown[event["id"]])
                examined = event["id"]
        return found, examined

    def audit(self, caller: str, events: Iterable[dict]) -> None:
        """Foreign episodic rows handed out are audited first, as recall's are; a failed audit hands out nothing."""
        rows = [(e["tier"], e["agent"], e["row_id"]) for e in events if e["row"]]
        solos_store.Visibility(caller, "shared").audit(self.store, rows)

    def logged(self, caller: str, events: Iterable[dict]) -> None:
        """Rows handed out go to the delivery log (provenance), as recall's do."""
        if self.deliveries is not None:
            self.deliveries.record(
                caller,
                [
                    (e["tier"], e["row_id"], e["agent"], e["row"].get("label"), e["row"].get("text"))
                    for e in events
                    if e["row"]
                ],
            )

    def read(self, pattern: Pattern, since: int, limit: int) -> dict:
        """read_events: the matching events after `since`, the id to continue from, and any gap."""

        def work(conn: sqlite3.Connection) -> tuple:
            start, ahead = self.resume(conn, since)
            events, examined = self.collect(conn, pattern, start, limit)
            return events, max(examined, start), ahead or self.gap(conn, start, examined)

        events, examined, gap = self.store.read(work)
        self.audit(pattern.caller, events)
        self.logged(pattern.caller, events)
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

    def subscribe(
        self, pattern: Pattern, connection: socket.socket | None, confirm: Callable[[str], None] | None = None
    ) -> Subscriber | None:
        """Register a stream, or None when the cap is reached and no agent holds more than its share. `confirm`
        (tokens on): asked before every delivery and heartbeat, so a revoked token's stream ends.

        An agent at STREAMS_PER_AGENT gives up its own oldest stream for its newest. At the cap, the agent
        holding the most streams gives up its oldest if it holds more than the newcomer's agent would.
        """
        decide = functools.partial(choose_victim, per_agent=self.streams_per_agent, cap=self.max_subscribers)
        # Its tags and q are matched against every removal from now on (note_removal), not from the first batch of
        # events that reaches it: a row written before it opened and removed before another event came was missed.
        self.content_filter(pattern)
        head = self.store.read(self.store.queries.head_event)  # before a seat is taken: a failed read takes none
        with self.lock:
            seat = None
            if self.seats is None:  # one process: its own streams
                victim = decide([(s.pattern.caller, s.opened, s) for s in self.subscribers], pattern.caller)
            else:  # workers: every worker's streams (solos_workers.Seats); another's victim is cut by its worker
                seat, replaced = self.seats.take(pattern.caller, decide)
                victim = "refuse" if seat is None else None
                if replaced is not None:
                    mine = [s for s in self.subscribers if replaced == (self.seats.worker, s.seat)]
                    victim = mine[0] if mine else "elsewhere"  # its worker drops it (cut_seats)
            if victim == "refuse":
                self.counters["refused"] += 1
                return None
            if victim is not None:
                self.counters["replaced"] += 1
            if isinstance(victim, Subscriber):
                self.subscribers.discard(victim)
                victim.seat = None
                victim.drop(f"replaced by a newer stream ({victim.pattern.caller} holds its share)")
            if not self.subscribers:  # nobody was listening: start from the head, not from a backlog
                self.cursor = head
            subscriber = Subscriber(pattern, connection, seat=seat, confirm=confirm)
            self.subscribers.add(subscriber)
        self.wakeup.set()
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        with self.lock:
            self.subscribers.discard(subscriber)
            if self.seats is not None and subscriber.seat is not None:
                self.seats.leave(subscriber.seat)
                subscriber.seat = None

    def cut_seats(self) -> None:
        """Workers: drop this worker's streams that another worker's newcomer replaced (solos_workers.Seats)."""
        if self.seats is None:
            return
        cut = set(self.seats.cut_for())
        with self.lock:
            for subscriber in [s for s in self.subscribers if s.seat in cut]:
                self.subscribers.discard(subscriber)
                subscriber.seat = None  # already gone from the seats
                subscriber.drop(f"replaced by a newer stream ({subscriber.pattern.caller} holds its share)")

    def stream(self, subscriber: Subscriber, since: int | None, write: Callable[[bytes], Any], head: bytes) -> None:
        """Write the SSE response: catch-up from `since` (None: from now), then live events and heartbeats.

        Returns when the client goes away, the subscriber is dropped, an audit
        fails (an `error` event says so) or the service stops.
        """
        pattern = subscriber.pattern
        try:
            if since is None:
                last, gap = self.store.read(self.store.queries.head_event), None
            else:
                last, gap = self.store.read(lambda conn: self.resume(conn, since))  # pruned events: catch_up's
            write(head + SSE_PREAMBLE + (sse(gap, "gap") if gap else b""))
            told: set[int] = set()  # transactions a gap event named already
            pruned_told = 0  # the last pruned id a gap event named
            while not self.stopped:  # catch up from the log until it has nothing newer
                events, examined, skipped, pruned = self.store.read(functools.partial(self.catch_up, pattern, last))
                if pruned is not None and pruned["through"] > pruned_told:
                    pruned_told = pruned["through"]
                    write(sse(pruned, "gap"))
                if examined == last:
                    break
                self.tell_gap(skipped, told, write)
                last = self.deliver(subscriber, events, examined, write)
            next_heartbeat = time.monotonic() + self.heartbeat_s
            while not self.stopped and not subscriber.dropped:
                try:
                    queued = [subscriber.queue.get(timeout=min(GONE_CHECK_S, self.heartbeat_s))]
                except queue.Empty:
                    if subscriber.gone():  # found within a second, not at the next failed heartbeat's write
                        return
                    if time.monotonic() < next_heartbeat:
                        continue
                    next_heartbeat = time.monotonic() + self.heartbeat_s
                    self.still_allowed(subscriber)
                    with self.lock:  # nothing queued under the lock: everything up to the cursor was examined
                        cursor = self.cursor if subscriber.queue.empty() else last
                    last = max(last, cursor)
                    write(sse(comment="heartbeat", event_id=last))
                    continue
                while not subscriber.queue.empty():
                    queued.append(subscriber.queue.get_nowait())
                for _, event in queued:
                    self.tell_gap(event.get("gap"), told, write)
                fresh = [(at, event) for at, event in queued if "gap" not in event and event["id"] > last]
                if fresh:
                    last = self.deliver(subscriber, self.still_there(pattern, fresh), fresh[-1][1]["id"], write)
        except OSError:  # the client went away, or drop() cut the socket
            pass
        except Exception as error:  # e.g. the audit could not be written: say so, hand out nothing more
            log.warning("event stream for %s ended: %s", pattern.caller, error)
            with contextlib.suppress(OSError):
                write(sse({"message": f"stream ended: {type(error).__name__}: {error}"}, "error"))
        finally:
            self.unsubscribe(subscriber)

    def still_there(self, pattern: Pattern, queued: list[tuple[float, dict]]) -> list[dict]:
        """The queued events to send: a write or update queued over RECHECK_AFTER_S ago, or whose short row's
        expiry is near, only if its row is still there, unexpired, and the caller may still see it (its author
        still shares it: a stream held up by a slow socket)."""
        due, near = time.monotonic() - RECHECK_AFTER_S, solos_store.stamp(time.time() + EXPIRY_MARGIN_S)
        stale = [
            event
            for at, event in queued
            if event.get("row") is not None and (at < due or (event["row"].get("expires_at") or "~") <= near)
        ]
        if not stale:
            return [event for _, event in queued]

        def read(conn: sqlite3.Connection) -> tuple[dict, set]:
            return self.store.queries.current_rows(conn, self.tiers, stale), self.store.queries.sharing_agents(conn)

        there, sharing = self.store.read(read)
        seen = solos_store.Visibility(pattern.caller, pattern.scope, sharing)
        gone = {
            event["id"]
            for event in stale
            if (event["tier"], event["row_id"]) not in there or not seen.allows(event["tier"], event["agent"])
        }
        return [event for _, event in queued if event["id"] not in gone]

    def catch_up(self, pattern: Pattern, since: int, conn: sqlite3.Connection) -> tuple[list, int, Any, Any]:
        """A stream's catch-up step: collect's events after `since`, the transactions it went past, and the events
        after `since` pruned before they were read, in one transaction: the prune may run between two steps."""
        events, examined = self.collect(conn, pattern, since)
        skipped = self.skipped_gap(conn, since, examined) if examined > since else None
        return events, examined, skipped, self.pruned_gap(conn, since)

    @staticmethod
    def tell_gap(gap: dict | None, told: set[int], write: Callable[[bytes], Any]) -> None:
        """A `gap` event for transactions the stream went past, each named once."""
        if gap is None or not {one["xid"] for one in gap["not_waited_for"]} - told:
            return
        told.update(one["xid"] for one in gap["not_waited_for"])
        write(sse(gap, "gap"))

    def deliver(self, subscriber: Subscriber, events: list[dict], examined: int, write: Callable[[bytes], Any]) -> int:
        """Audit, then write the events in sends of at most solos_bounds.ANSWER_BYTES; returns the new last id."""
        self.still_allowed(subscriber)
        self.audit(subscriber.pattern.caller, events)
        self.logged(subscriber.pattern.caller, events)
        pending: list[bytes] = []
        size = 0
        for event in events:
            wire = self.encode(event)
            if pending and size + len(wire) > solos_bounds.ANSWER_BYTES:
                write(b"".join(pending))
                pending, size = [], 0
            pending.append(wire)
            size += len(wire)
        write(b"".join(pending) + (sse(event_id=examined) if not events or events[-1]["id"] != examined else b""))
        with self.lock:
            self.counters["delivered"] += len(events)
        return examined

    @staticmethod
    def still_allowed(subscriber: Subscriber) -> None:
        """The stream's token still names its caller (tokens on); raises (the stream ends with an `error`) if not."""
        if subscriber.confirm is not None:
            subscriber.confirm(subscriber.pattern.caller)

    def encode(self, event: dict) -> bytes:
        """The event as an SSE message, encoded once for all the streams it goes to.

        The newest encodings are kept up to WIRE_CACHE_BYTES in all: bounded by bytes, since one event can
        encode to a quarter of a megabyte (bounded by count, 4,000 large events held 1.1 GiB). Each is kept
        with the rendering it encodes and serves only that one (the hub's fan-out renders an event once for
        all its streams): a stream catching up renders the row as it is now, and was sent the bytes of a
        rendering from before the fleet rewrote it.
        """
        key = (event["id"], event["foreign"])
        with self.wire_lock:
            rendered, wire = self.wire.get(key, (None, b""))
        if rendered is not event:
            wire = sse(event, event_id=event["id"])
            with self.wire_lock:
                if key not in self.wire:
                    self.wire[key] = (event, wire)
                    self.wire_bytes += len(wire)
                while self.wire_bytes > WIRE_CACHE_BYTES:
                    self.wire_bytes -= len(self.wire.pop(next(iter(self.wire)))[1])
        return wire

    def prune(self) -> int:
        """Drop events older than the retention window, in short batches."""
        cutoff = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(time.time() - EVENT_RETENTION_S))
        return self.store.in_chunks(
            lambda: self.own_read(lambda conn: self.store.queries.prune_step(conn, cutoff, BATCH * 10), write=True),
            lambda pruned: pruned >= BATCH * 10,
        )
