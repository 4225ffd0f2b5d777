"""solos_provenance: who knew what, and when. The delivery log, corroboration, as-of recall, retraction notices.

Attribution says who wrote a row; this module records who was shown it, so
the service can tell agreement from echo and tell readers when what they
relied on is gone.

- The delivery log: the rows recall, read_events or a stream hands an agent
  (reader, row, writer, time; never text), once per (reader, row, version)
  per WINDOW_S, written before the answer (`DeliveryLog`), kept RETENTION_S.
  Its author sees who read their rows, the operator everything (`read_deliveries`).
- Corroboration: each long result names the other agents holding the same or
  a near-duplicate fact (`witnesses`), `independent` or `echo` by the log.
- As-of recall: what the fleet's memory held at a time (`recall_as_of`), from
  the rows and the versions schema.sql's triggers keep; with `reader`, what
  one agent had been shown by then.
- Retraction notices: an agent delivered a row that is then forgotten or
  replaced is told (`read_notices`, `ack_notices`, and its event stream).

solos_recall's present() calls `witnessed`; the spine adds `OPERATION_ROWS` to its table.
Imports the store, ranking helpers, the operation rows' pieces and validation schemas; never the spine.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import functools
import hashlib
import heapq
import itertools
import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import solos_bounds
import solos_jobs
import solos_rank
import solos_store
import solos_tokens
from solos_operations import Operation, object_schema, result_schema
from solos_store import BadRequest, Forbidden
from solos_validation import AGENT_SCHEMA

log = logging.getLogger("solos_provenance")

# ==== Configuration ====

RETENTION_S = 90 * 86_400  # deliveries, acknowledged notices, replaced versions and forgotten spans
LOGGED_TIERS = ("short", "long", "episodic")  # a persona is its own agent's: never a delivery
WINDOW_S = 3600  # one delivery row per (reader, row, version) per clock hour: a reader paging rows adds no more
KEPT_DELIVERIES = 200_000  # (reader, row, version) keys remembered as logged this window (~40 MB at most)
CHUNK_ROWS = 500  # deliveries per write transaction: other writers wait behind at most this many inserts
BUFFER_ROWS = 20_000  # deliveries a failed write left for the thread to retry (~2 MB); past it the newest are dropped
WAIT_S = 10.0  # the most a request waits for another request's write of the same delivery (a busy timeout's worth)
FLUSH_S = 0.1  # the thread's pause between looks (retries, and rows the fleet replaced)
PURGE_BATCH = 5_000
# Near-duplicate facts: the same content key (case and spacing folded), or the same numbers and negation and a
# word overlap (Jaccard of stems) of at least TOKEN_JACCARD. On tests/data/near_duplicates.jsonl (97 pairs, chosen
# on the same sample: optimistic) precision 1.000, recall 0.905 (held out: see TEXT_VECTORS); at 0.6 precision
# fell to 0.732: one swapped subject in a short fact ("Alice owns ..." / "Bob owns ...") still overlaps 0.6
# (bench/near_duplicates.py).
TOKEN_JACCARD = 0.8
COSINE = 0.9
# Stored vectors embed "<agent> (<topic>): <text>", so the writer's name decided the cosine (one
# text by two writers 0.81-0.92, "Sol prefers ..." by atlas and "Atlas prefers ..." by sol 0.983): witnesses
# compare the facts' text by the text rule in every mode, stored vectors never. On 40 held-out pairs
# written after the rule was chosen (tests/data/near_duplicates_heldout.jsonl) the text rule measured precision
# 1.000 (14 of 14), recall 0.700: it misses paraphrases that change words, such as passive voice.
TEXT_VECTORS = False
NEAR_KEY_WORDS = 3  # a fact's longest words a candidate must share (an FTS5 AND query: cheap, selective)
NEAR_CANDIDATES = 20  # the first that match, unranked: ranking them doubled the query's cost (0.25 -> 0.11 ms)
KEPT_CLUSTERS = 4096  # long results whose near-duplicate clusters are kept between recalls (ids and times, no text)
NEGATIONS = frozenset({"not", "no", "never", "none", "cannot", "without", "nobody", "nothing", "t"})
NUMBER = re.compile(r"\d+(?:[.:,]\d+)*")
# As-of reads versions without an index (bench/as_of_memory.py): at most AS_OF_CALLS at once per process (a
# worker, a copy), a newcomer waits AS_OF_WAIT_S for a place, then gets 503 with Retry-After.
AS_OF_CALLS = 4
AS_OF_WAIT_S = 2.0
AS_OF_SLOTS = threading.BoundedSemaphore(AS_OF_CALLS)
# [0-9], not \d: JSON Schema reads patterns as ECMA-262, where \d is ASCII, and Python's \d admits '٢٠٢٦', which
# then compares past every stamp; "format" refuses the impossible (month 13, 24:00) the pattern cannot.
TIMESTAMP = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,3})?Z$"


# ==== The delivery log ====


class DeliveryLog:
    """Deliveries written before the answer, once per (reader, row, version) per WINDOW_S.

    A reader handed the same version of a row again within the window adds
    no row: what the log is for (echo needs the first delivery, a notice
    needs one delivery of each version, as-of a reader's versions) is all
    there, and paging the same rows no longer grows it (one reader paging
    1,000 rows adds at most 1,000 rows an hour, not thousands a second). Which
    keys were logged is kept in memory (KEPT_DELIVERIES, oldest forgotten
    first: forgetting one only logs it again); a version is the row's label
    and text, and a row the fleet replaced (a new `update` version, read by
    the thread each FLUSH_S) is forgotten at once, so its next version is
    logged even if its text returned to an earlier one.

    The new rows are written in the request, before its answer, in
    transactions of at most CHUNK_ROWS, so a crash after a 200 loses none
    (the old batch thread lost up to 0.1 s of them, and their notices). Only
    when that write fails (a busy or broken database) does the answer go out
    with them buffered for the thread to retry: counted in `deferred`, and
    lost if the process dies before the retry succeeds.
    """

    def __init__(self, store: solos_store.Store, capacity: int = BUFFER_ROWS, flush_s: float = FLUSH_S):
        self.store, self.capacity, self.flush_s = store, capacity, flush_s
        self.lock = threading.Lock()  # the buffer, in_flight, the kept keys and the counters
        self.write_lock = threading.Lock()  # one batch at a time: flush() waits for the thread's batch
        self.buffer: list[tuple[str, str, int, str, str]] = []
        self.in_flight: list[tuple[str, str, int, str, str]] = []
        self.logged_keys: collections.OrderedDict[tuple, int] = collections.OrderedDict()  # key -> its window
        self.writing: dict[tuple, threading.Event] = {}  # keys a request is writing now -> set when it is done
        self.versions_seen: int | None = None  # the newest memory_version id read (None: not yet)
        # The database's clock less this host's, read with the versions each FLUSH_S: delivered_at is compared with
        # versions the database stamps, so a copy whose clock runs ahead would otherwise miss their notices.
        self.clock_offset_s = 0.0
        self.counters = {"logged": 0, "repeats_skipped": 0, "deferred": 0, "dropped": 0, "failed_batches": 0}
        self.per_minute: collections.deque[list[int]] = collections.deque(maxlen=60)  # [minute, rows logged]
        self.last_error: str | None = None
        self.wake = threading.Event()
        self.stopped = False
        self.forget_replaced()  # where the versions stand at start: every later update counts
        self.thread = threading.Thread(target=self.run, name="delivery-log", daemon=True)
        self.thread.start()

    def record(self, reader: str, rows: Iterable[tuple]) -> None:
        """Log that reader was handed these (tier, row_id, writer[, version]) rows, now, before the answer.

        A key another request is writing now is waited for, not written twice: 4 threads paging the same rows
        wrote each row 4 times, and answering before that write commits would hand it over unlogged.
        """
        stamp, window = solos_jobs.stamp(time.time() + self.clock_offset_s), int(time.time() // WINDOW_S)
        entries: list[tuple[str, str, int, str, str]] = []
        keys: dict[tuple, None] = {}
        others: set[threading.Event] = set()
        mine = threading.Event()
        with self.lock:
            for tier, row_id, writer, *version in rows:
                if tier not in LOGGED_TIERS:
                    continue
                key = (reader, tier, row_id, hashlib.blake2b(repr(version).encode(), digest_size=8).digest())
                if self.logged_keys.get(key) == window or key in keys:
                    self.counters["repeats_skipped"] += 1
                    if key in self.writing:
                        others.add(self.writing[key])
                    continue
                entries.append((reader, tier, row_id, writer, stamp))
                keys[key] = None
                self.writing[key] = mine
                self.logged_keys[key] = window
                self.logged_keys.move_to_end(key)
            while len(self.logged_keys) > KEPT_DELIVERIES:
                self.logged_keys.popitem(last=False)
        try:
            self.write_now(entries)
        finally:
            with self.lock:
                for key in keys:
                    self.writing.pop(key, None)
            mine.set()
        for other in others:
            other.wait(WAIT_S)

    def write_now(self, entries: list[tuple[str, str, int, str, str]]) -> None:
        """In transactions of CHUNK_ROWS; what a busy or broken database refuses is left for the thread."""
        start = 0
        try:
            for start in range(0, len(entries), CHUNK_ROWS):
                chunk = entries[start : start + CHUNK_ROWS]
                # Another worker (or copy) may have logged some this window: the database says, not this process.
                write = functools.partial(self.store.queries.record_deliveries, rows=chunk, window_s=WINDOW_S)
                self.logged(self.store.write(write), len(chunk))
        except solos_store.ServiceError as error:  # the answer still goes; the thread retries
            self.defer(entries[start:], error)

    def logged(self, count: int, handed: int) -> None:
        """`count` rows logged of the `handed` (the rest another process logged this window, or a retry's first
        write had)."""
        minute = int(time.time() // 60)
        with self.lock:
            self.counters["logged"] += count
            self.counters["repeats_skipped"] += max(0, handed - count)
            if self.per_minute and self.per_minute[-1][0] == minute:
                self.per_minute[-1][1] += count
            else:
                self.per_minute.append([minute, count])

    def defer(self, entries: list, error: Exception) -> None:
        """A failed write before the answer: the thread retries; past `capacity` waiting, the newest are dropped."""
        self.last_error = f"{type(error).__name__}: {error}"
        log.warning("delivery log: %d deliveries not written before the answer, retrying: %s", len(entries), error)
        with self.lock:
            room = max(0, self.capacity - len(self.buffer))
            self.buffer.extend(entries[:room])
            self.counters["deferred"] += min(room, len(entries))
            self.counters["dropped"] += max(0, len(entries) - room)
        self.wake.set()

    def pending(self) -> list[tuple[str, str, int, str, str]]:
        """Deliveries not yet committed (take this before reading the log: a batch may commit in between)."""
        with self.lock:
            return self.buffer + self.in_flight

    def flush(self) -> int:
        """Write what a failed request left buffered now (a forget calls this first, so its notices see them)."""
        written = 0
        with self.write_lock:
            while True:
                with self.lock:
                    if not self.in_flight:
                        self.in_flight, self.buffer = self.buffer[:CHUNK_ROWS], self.buffer[CHUNK_ROWS:]
                    batch = self.in_flight
                if not batch:
                    return written
                # again: the batch's first write may have committed before it raised (its answer lost)
                record = self.store.queries.record_deliveries
                count = self.store.write(functools.partial(record, rows=batch, again=True, window_s=WINDOW_S))
                with self.lock:
                    self.in_flight = []
                self.logged(count, len(batch))
                written += count

    def forget_replaced(self) -> None:
        """Rows the fleet replaced since the last look: their next delivery is logged whatever its text."""
        # replaced_since's second statement reads versions up to the first's newest id: a later snapshot sees them too.
        asked = time.time()
        newest, replaced, now = self.store.read_alone(
            lambda conn: self.store.queries.replaced_since(conn, self.versions_seen)
        )
        if not self.store.host_clock:  # estimated to within half the read's time: only where the clocks differ
            self.clock_offset_s = solos_jobs.seconds(now) - (asked + time.time()) / 2
        with self.lock:
            if self.versions_seen is not None and replaced:
                gone = set(replaced)
                for key in [k for k in self.logged_keys if (k[1], k[2]) in gone]:
                    del self.logged_keys[key]
            self.versions_seen = newest

    def run(self) -> None:
        while not self.stopped:
            self.wake.wait(self.flush_s)
            self.wake.clear()
            try:
                self.forget_replaced()
                self.flush()
                self.last_error = None
            except Exception as error:  # busy or broken database: the batch stays in flight for the next round
                self.last_error = f"{type(error).__name__}: {error}"
                with self.lock:
                    self.counters["failed_batches"] += 1
                log.warning("delivery log batch not written, retrying: %s", self.last_error)
                time.sleep(1)

    def stats(self) -> dict:
        """The counters, rows logged in the last minute and hour, and the log's size in the database."""
        minute = int(time.time() // 60)
        with self.lock:
            recent = {
                "logged_last_minute": sum(n for m, n in self.per_minute if m >= minute - 1),
                "logged_last_hour": sum(n for m, n in self.per_minute if m > minute - 60),
            }
            counters = {**self.counters, "buffered": len(self.buffer) + len(self.in_flight)}
        size = self.store.read(self.store.queries.delivery_log_size)
        return {
            **counters,
            **recent,
            **size,
            "window_s": WINDOW_S,
            "retention_days": RETENTION_S // 86_400,
            "last_error": self.last_error,
        }

    def close(self) -> None:
        """Stop the thread and write what is left."""
        self.stopped = True
        self.wake.set()
        self.thread.join(timeout=10)
        try:
            self.flush()
        except solos_store.ServiceError as error:
            log.warning("delivery log: %d deliveries not written at close: %s", len(self.pending()), error)


def purge(store: solos_store.Store, now: float | None = None) -> int:
    """The daily purge: deliveries, acknowledged notices, replaced versions and spans older than RETENTION_S."""
    cutoff = solos_jobs.stamp((time.time() if now is None else now) - RETENTION_S)
    return store.in_chunks(
        lambda: store.write(lambda conn: store.queries.purge_deliveries(conn, cutoff, PURGE_BATCH)), bool
    )


# ==== Corroboration ====


@functools.lru_cache(maxsize=4096)  # a fact is compared with each of its candidates: worked out once
def content_words(text: str) -> frozenset[str]:
    """A text's word stems less stop words: what two phrasings of one fact share."""
    return frozenset(
        stem for stem in solos_rank.stems(text) if stem not in solos_rank.STOP_WORDS and not stem.isdigit()
    )


@functools.lru_cache(maxsize=4096)
def numbers(text: str) -> frozenset[str]:
    return frozenset(NUMBER.findall(text))


@functools.lru_cache(maxsize=4096)
def negated(text: str) -> bool:
    return bool(NEGATIONS & set(re.findall(r"[a-z]+", text.lower())))


def drop_kept_texts() -> None:
    """After a forget: the caches above may hold the forgotten fact's words."""
    for cached in (content_words, numbers, negated):
        cached.cache_clear()


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


def cosine(a: bytes | None, b: bytes | None) -> float | None:
    """Of two stored unit vectors (little-endian float32), or None when either is missing."""
    if not a or not b or len(a) != len(b):
        return None
    import numpy as np

    return float(np.dot(np.frombuffer(a, dtype="<f4"), np.frombuffer(b, dtype="<f4")))


def near_duplicate(
    a: str, b: str, vector_a: bytes | None = None, vector_b: bytes | None = None, vectors: bool = False
) -> str | None:
    """How two facts are the same fact ('content_key', 'cosine', 'token_overlap'), or None.

    Beyond the content key, both must carry the same numbers and the same
    negation: "backups at 02:00" and "backups at 03:00" share every word and
    are different facts. With vectors on, a pair with both vectors is judged
    by cosine; any other pair, and every pair with vectors off, by word overlap.
    """
    if solos_rank.duplicate_key(a) == solos_rank.duplicate_key(b):
        return "content_key"
    if numbers(a) != numbers(b) or negated(a) != negated(b):
        return None
    similarity = cosine(vector_a, vector_b) if vectors else None
    if similarity is not None:
        return "cosine" if similarity >= COSINE else None
    return "token_overlap" if jaccard(content_words(a), content_words(b)) >= TOKEN_JACCARD else None


def rule_ran(vectors: bool) -> str:
    """What the answer says about the rule: the text rule alone when the embedder is off."""
    text = f"content_key, or same numbers and negation and word overlap >= {TOKEN_JACCARD}"
    return f"{text}; with vectors on both facts: cosine >= {COSINE} instead of word overlap" if vectors else text


def witnessed(memory: Any, reader: str, results: list[dict], collapsed: list[dict]) -> dict | None:
    """Recall's hook (present): corroborate the long results, then log every row handed over as delivered."""
    answer = corroborate(memory, results)
    memory.deliveries.record(
        reader, [(r["tier"], r["id"], r["agent"], r.get("label"), r.get("text")) for r in results + collapsed]
    )
    return answer


def corroborate(memory: Any, results: list[dict]) -> dict | None:
    """Give each long result `witnesses` and `single_source`; the rule that ran, or None without long results.

    A witness is another agent holding the same or a near-duplicate fact:
    `independent` if it wrote its fact before it was ever delivered any of
    the others' copies, else `echo` (the log at millisecond resolution).
    """
    longs = [r for r in results if r["tier"] == "long"]
    if not longs:
        return None
    vectors = memory.embedder is not None and TEXT_VECTORS  # the text rule in every mode (TEXT_VECTORS)
    pending = memory.deliveries.pending()  # before the read: a batch committing in between is in one or the other

    def work(conn: Any) -> None:
        clusters = memory.near.clusters(conn, longs, vectors)
        for result, cluster in zip(longs, clusters):
            result["witnesses"] = witnesses_of(conn, result, cluster, pending)
            result["single_source"] = not result["witnesses"]

    memory.store.read(work)
    return {"rule": rule_ran(vectors), "vectors": vectors, "candidates": NEAR_CANDIDATES}


def near_key(text: str) -> str:
    """An FTS5 query a near-duplicate of text matches: its NEAR_KEY_WORDS longest words, all of them."""
    words = [w for w in solos_rank.query_words(text) if w not in solos_rank.STOP_WORDS]
    return " AND ".join(f'"{w}"' for w in sorted(words, key=len, reverse=True)[:NEAR_KEY_WORDS])


Cluster = dict[int, tuple[str, str, str]]  # row id -> (writer, written at, how it matched); the result's own first


def near_cluster(conn: Any, result: dict, vectors: bool) -> Cluster:
    """The result's fact and every other agent's fact that is the same or a near-duplicate of it."""
    key = near_key(result["text"])
    candidates = conn.queries.near_candidates(conn, key, NEAR_CANDIDATES) if key else []
    own = next((c["embedding"] for c in candidates if c["id"] == result["id"]), None)
    cluster: Cluster = {result["id"]: (result["agent"], "", "")}
    for c in candidates:
        if c["agent"] != result["agent"] and c["id"] != result["id"]:
            how = near_duplicate(result["text"], c["fact"], own, c["embedding"], vectors and TEXT_VECTORS)
            if how:
                cluster[c["id"]] = (c["agent"], c["created_at"], how)
    return cluster


class NearDuplicates:
    """Each long result's cluster (near_cluster: one FTS5 query, 70 us to 0.2 ms), kept for the next recall that
    returns it while the long tier's keyword index and its vectors are unchanged.

    Whether they changed is read in the corroboration's own transaction (on SQLite: FTS5's structure record,
    rewritten by every change to the index, and the vector generation), so a kept cluster is the one the query
    would find. Kept per result id and digest of its text, never the text; KEPT_CLUSTERS at most. On
    PostgreSQL nothing is kept (no such record): each result queries.
    """

    def __init__(self, kept: int = KEPT_CLUSTERS):
        self.lock = threading.Lock()
        self.most = kept
        self.version: Any = None
        self.kept: collections.OrderedDict[tuple[int, bytes], Cluster] = collections.OrderedDict()

    def clusters(self, conn: Any, results: Sequence[dict], vectors: bool) -> list[Cluster]:
        version = conn.queries.near_duplicates_version(conn)
        with self.lock:
            if version is None or version != self.version:
                self.kept.clear()
                self.version = version
        found = []
        for result in results:
            key = (result["id"], hashlib.blake2b(result["text"].encode(), digest_size=16).digest())
            with self.lock:
                cluster = self.kept.get(key) if version is not None and version == self.version else None
                if cluster is not None:
                    self.kept.move_to_end(key)
            if cluster is None:
                cluster = near_cluster(conn, result, vectors)
                with self.lock:
                    if version is not None and version == self.version:
                        self.kept[key] = cluster
                        while len(self.kept) > self.most:
                            self.kept.popitem(last=False)
            found.append(cluster)
        return found


def witnesses_of(conn: Any, result: dict, cluster: Cluster, pending: Sequence[tuple]) -> list[dict]:
    """The other agents in result's cluster, each as independent or echo of the others' copies."""
    found = []
    for agent in dict.fromkeys(a for a, _, _ in cluster.values() if a != result["agent"]):
        born, row_id, how = min((born, row_id, how) for row_id, (a, born, how) in cluster.items() if a == agent)
        others = {i for i, (a, _, _) in cluster.items() if a != agent}
        shown = [at for reader, tier, i, _, at in pending if reader == agent and tier == "long" and i in others]
        logged = conn.queries.first_delivery(conn, agent, "long", sorted(others))
        first = min([*shown, *([logged] if logged else [])], default=None)
        found.append(
            {
                "agent": agent,
                "id": row_id,
                "written_at": born,
                "match": how,
                "kind": "independent" if first is None or born < first else "echo",
                "first_shown_at": first,
            }
        )
    return found


# ==== Operations ====


def op_read_deliveries(memory: Any, args: dict) -> dict:
    """Who was handed which rows, and when (never the text), newest first, kept 90 days.

    An agent sees the deliveries of the rows it wrote: who read them. The operator (the operator token, or no
    agent under loopback trust) sees every delivery. Filter by `tier` and `id` for one row.
    """
    agent = args["agent"]
    if agent is not None:
        memory.store.read(lambda conn: solos_store.Store.require_agent(conn, agent))
    memory.deliveries.flush()  # what was delivered a moment ago is part of the answer
    store: solos_store.Store = memory.store
    rows = store.read(
        lambda conn: store.queries.read_deliveries(
            conn, agent, args["tier"], args["id"], args["limit"], args["before_id"] or solos_bounds.MAX_ID
        )
    )
    return {"agent": agent, "view": "operator" if agent is None else "author", "count": len(rows), "deliveries": rows}


def op_read_notices(memory: Any, args: dict) -> dict:
    """Retraction notices for the calling agent: rows it was delivered that were since forgotten or replaced.

    Each names the row, its writer, the kind (`forgotten`, or `superseded` with `new_id`: updates are in place,
    so the same id now holds the new version) and when; never the text. Open notices only unless
    `include_acked`; acknowledge with ack_notices. They also arrive on the agent's event stream.
    """
    agent = args["agent"]
    memory.store.read(lambda conn: solos_store.Store.require_agent(conn, agent))
    memory.deliveries.flush()  # a row replaced since a delivery still in the buffer: its notice is written now
    store: solos_store.Store = memory.store
    notices = store.read(
        lambda conn: store.queries.read_notices(
            conn, agent, args["after_id"] or 0, args["limit"], args["include_acked"]
        )
    )
    return {"agent": agent, "count": len(notices), "notices": notices}


def op_ack_notices(memory: Any, args: dict) -> dict:
    """Acknowledge the calling agent's retraction notices by id, so read_notices stops returning them."""
    agent = args["agent"]

    store: solos_store.Store = memory.store

    def work(conn: Any) -> int:
        solos_store.Store.require_agent(conn, agent)
        return store.queries.ack_notices(conn, agent, args["ids"])

    return {"agent": agent, "acked": store.write(work)}


def op_recall_as_of(memory: Any, args: dict) -> dict:
    """What the fleet's memory held at time `as_of` (UTC, e.g. 2026-11-30T06:00:00.000Z), as the caller may see it.

    Updated rows answer with the version valid then; short rows count until their expiry; forgotten rows never
    come back: one forgotten after `as_of` appears only under `retracted` (no text). Another agent's episode
    shows only in versions current while its author shared episodes, and another agent's row its writer deleted
    not at all. With `reader`: what that agent had been shown by then (the delivery log), for post-mortems; the
    caller must be that agent, or the operator (no agent: the operator token), who sees no episode its author
    did not share. Words in `q` keep rows holding one in any form (backup: Backups), most shared
    first; not ranked like recall. Rows handed to the caller's own view are logged as deliveries, foreign
    episodes audited. At most 1 MiB of rows (`truncated` says so). Reaches back 90 days.
    """
    agent, reader, at = args["agent"], args["reader"], normal_stamp(args["as_of"])
    if agent is not None and reader is not None and reader != agent:
        raise Forbidden(f"only {reader!r} itself or the operator may ask what {reader!r} was shown", "reader")
    view = reader or agent
    if view is None:
        raise BadRequest("name the agent whose view to answer (agent), or as the operator a reader", "agent")
    if at < solos_jobs.stamp(time.time() - RETENTION_S):
        raise BadRequest(f"as_of must be within the last {RETENTION_S // 86_400} days, got {at}", "as_of")
    tiers = tuple(dict.fromkeys(args["tiers"] or ("long", "short")))
    words = [w for w in solos_rank.query_words(args["q"] or "") if w not in solos_rank.STOP_WORDS]
    forms = WordForms(words) if words else None
    k, operator = args["k"], agent is None
    if reader is not None:
        memory.deliveries.flush()

    store: solos_store.Store = memory.store

    def work(conn: Any) -> tuple[list[tuple[int, dict]], list[dict], solos_store.Visibility]:
        solos_store.Store.require_agent(conn, view)
        seen = solos_store.Visibility.read_past(conn, view, args["scope"], operator)
        if reader is None:
            fragments = [] if forms is None else forms.narrowing
            rows: Iterable[dict] = itertools.chain.from_iterable(
                store.queries.rows_as_of(conn, t, at, seen, fragments, 0 if forms else k) for t in tiers
            )
            gone = store.queries.retracted_as_of(conn, at)
        else:
            rows, gone = shown_to(conn, reader, at, tiers, seen)
        best = best_of(rows, forms, k)  # streamed: at most k rows held, whatever the tier's size
        return best, [retraction(g) for g in gone if g["tier"] in tiers and retraction_shown(seen, g)], seen

    with as_of_slot():
        ranked, retracted, seen = memory.store.read(work)
    kept, truncated = solos_bounds.cut([as_of_result(r, view) for _, r in ranked])
    handed = [(r["tier"], r["agent"], r["id"]) for r in kept]
    seen.audit(memory.store, handed, solos_tokens.OPERATOR if operator else None)
    if reader is None:  # the caller's own view is a hand-over like recall's; a reader's replays what it was shown
        memory.deliveries.record(agent, [(tier, row_id, writer) for tier, writer, row_id in handed])
    return {
        "agent": agent,
        "reader": reader,
        "as_of": at,
        "tiers": list(tiers),
        "count": len(kept),
        "results": kept,
        "retracted": retracted,
        "ranking": "word_overlap" if forms is not None else "recency",
        "truncated": truncated,
    }


def retraction_shown(seen: solos_store.Visibility, gone: dict) -> bool:
    """A forgotten row's retraction follows its versions' rule over its whole life: another agent's episode only
    if it lived while its author shared (and that author shares now)."""
    return seen.allows_version(gone["tier"], gone["agent"], gone["born_at"], gone["lived_until"], False)


def retraction(gone: dict) -> dict:
    """A retraction as the answer gives it: which row, whose, when it was forgotten; no text, no life span."""
    return {name: gone[name] for name in ("tier", "row_id", "agent", "forgotten_at")}


@contextlib.contextmanager
def as_of_slot() -> Iterator[None]:
    """One of AS_OF_CALLS places, or Busy (503, Retry-After) after AS_OF_WAIT_S: an as-of reads versions without
    an index, so a crowd of them must not take every core and connection from recall and writes."""
    if not AS_OF_SLOTS.acquire(timeout=AS_OF_WAIT_S):
        raise solos_store.Busy(f"{AS_OF_CALLS} as-of recalls are running; retry in a moment", reason="as_of")
    try:
        yield
    finally:
        AS_OF_SLOTS.release()


VOWEL = re.compile(r"[aeiouy]")


def word_stem(word: str) -> str:
    """A word's form-free stem: Porter's first step (plurals, -ed, -ing, y/i), so "Backups" and "backup" meet
    as recall's keyword index has them meet (FTS5's porter tokenizer; PostgreSQL's english stemmer)."""
    w = word.lower()
    if w.endswith(("sses", "ies")):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith(("ss", "us")) and len(w) > 3:
        w = w[:-1]
    if w.endswith("eed"):
        w = w[:-1] if len(w) > 4 else w
    elif w.endswith("ed") and VOWEL.search(w[:-2]):
        w = w[:-2]
    elif w.endswith("ing") and VOWEL.search(w[:-3]):
        w = w[:-3]
    if w.endswith("y") and len(w) > 2 and VOWEL.search(w[:-1]):
        w = w[:-1] + "i"
    return w


def stem_fragment(stem: str) -> str:
    """What every word with this stem begins with (lower-cased): the stem, less a final i that was a y."""
    return stem[:-1] if stem.endswith("i") and len(stem) > 2 else stem


# Words one as-of call remembers the stems of (each stemmed once, not once a row); past this many, or longer than
# STEMMED_WORD_CHARS, a word is stemmed where it is met.
STEMS_KEPT = 50_000
STEMMED_WORD_CHARS = 64
# The store's SQL narrows an as-of by the question's fragments (LIKE) only for this many at most: each is a LIKE
# over every version, and frequent words pass nearly every row anyway (64 of them over 11k rows: SQL 301 ms
# against 38 ms unnarrowed, and 770 ms of CPU in all, 100x an ordinary recall; bench/heavy_calls.py).
NARROWED_FRAGMENTS = 4
WORD = re.compile(r"\w+")


class WordForms:
    """The question's words as stems: which of them a text holds in any form, and the fragments the store's
    SQL narrows by (a row without one of them cannot match)."""

    def __init__(self, words: Sequence[str]):
        self.stemmed = {w: word_stem(w) for w in words}  # the words met so far, their stems
        self.stems = frozenset(self.stemmed.values())
        self.fragments = sorted({stem_fragment(s) for s in self.stems}, key=len, reverse=True)
        few = len(self.fragments) <= NARROWED_FRAGMENTS
        self.narrowing = self.fragments if few else []
        # The words a text holds that may hold a stem: those beginning like a fragment (a few alternatives); of
        # many fragments, every word (a regex of 64 alternatives tries each at every word: 31 us a row).
        alternatives = "|".join(map(re.escape, self.fragments))
        self.words = re.compile(r"\b(?:" + alternatives + r")\w*", re.IGNORECASE) if few else WORD

    def stem(self, word: str) -> str:
        stem = self.stemmed.get(word)
        if stem is None:
            stem = word_stem(word)
            if len(self.stemmed) < STEMS_KEPT and len(word) <= STEMMED_WORD_CHARS:
                self.stemmed[word] = stem
        return stem

    def shared(self, text: str) -> int:
        """How many of the question's stems the text holds: its distinct words that may hold one (`words`), each
        stemmed once a call."""
        return len({self.stem(word) for word in set(self.words.findall(text))} & self.stems)


def best_of(rows: Iterable[dict], forms: WordForms | None, k: int) -> list[tuple[int, dict]]:
    """The k rows sharing the most word stems with the question (newest first among equals), or the k newest."""
    if forms is None:
        scored: Iterable[tuple[int, dict]] = ((0, r) for r in rows)
    else:
        shared = ((forms.shared(f"{r['label'] or ''} {r['text']}"), r) for r in rows)
        scored = ((n, r) for n, r in shared if n)
    return heapq.nlargest(k, scored, key=lambda pair: (pair[0], pair[1]["valid_from"], pair[1]["id"]))


def shown_to(
    conn: Any, reader: str, at: str, tiers: Sequence[str], seen: solos_store.Visibility
) -> tuple[list[dict], list[dict]]:
    """Each version reader was delivered up to `at` (the one valid at its delivery) that `seen` allows, and the
    forgotten ones."""
    delivered = [d for d in conn.queries.delivered_by(conn, reader, at) if d["tier"] in tiers]
    rows: dict[tuple, dict] = {}
    gone: set[tuple[str, int]] = set()
    for tier in tiers:
        mine = [d for d in delivered if d["tier"] == tier]
        versions: dict[int, list[dict]] = {}
        for version in conn.queries.versions_of(conn, tier, sorted({d["row_id"] for d in mine})):
            versions.setdefault(version["id"], []).append(version)
        ends: dict[int, list[str]] = {}
        for row_id, lives in versions.items():  # by end (a row's versions follow each other, so by start too)
            lives.sort(key=lambda v: (v["valid_to"] or "~", v["valid_from"]))
            ends[row_id] = [v["valid_to"] or "~" for v in lives]
        for delivery in mine:
            then, lives = delivery["delivered_at"], versions.get(delivery["row_id"], [])
            # The one valid then: the first to end after then that had begun (the next, unless a clock went back).
            start = bisect.bisect_right(ends.get(delivery["row_id"], []), then)
            match = next((lives[i] for i in range(start, len(lives)) if lives[i]["valid_from"] <= then), None)
            if match is None:  # forgotten since (its versions went with it), or replaced within the same millisecond
                gone.add((tier, delivery["row_id"]))
            elif seen.allows_version(tier, match["agent"], match["valid_from"], match["valid_to"], match["deleted"]):
                rows[(tier, match["id"], match["valid_from"])] = {**match, "tier": tier}
    spans = {(g["tier"], g["row_id"]): g for g in conn.queries.retracted_as_of(conn, at)}
    return list(rows.values()), [spans[key] for key in gone if key in spans]


def as_of_result(row: dict, caller: str) -> dict:
    return {
        "tier": row["tier"],
        "id": row["id"],
        "agent": row["agent"],
        "foreign": row["agent"] != caller,
        "label": row["label"],
        "text": row["text"],
        "tags": solos_store.parse_tags(row["tags"]) if row["tags"] else [],
        "expires_at": row["expires_at"],
        "valid_from": row["valid_from"],
        "valid_to": row["valid_to"],
    }


def normal_stamp(text: str) -> str:
    """A timestamp in the schema's own form (milliseconds), so text order is time order."""
    seconds, _, fraction = text.rstrip("Z").partition(".")
    return f"{seconds}.{(fraction + '000')[:3]}Z"


# ==== The operation table's rows ====

LIMIT = {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100, "description": "At most, 1-1000."}
ROW_ID = {"type": "integer", "minimum": 1, "maximum": solos_bounds.MAX_ID}
VERSIONED_TIERS = list(solos_store.VERSIONED)


OPTIONAL_AGENT = {**AGENT_SCHEMA, "description": "The calling agent; none: the operator's view (operator token)."}

OPERATION_ROWS = (
    Operation(
        "read_deliveries",
        "GET",
        "/v1/deliveries",
        op_read_deliveries,
        object_schema(
            {
                "agent": OPTIONAL_AGENT,
                "tier": {"type": "string", "enum": list(LOGGED_TIERS), "description": "Only this tier's rows."},
                "id": {**ROW_ID, "description": "Only this row (with tier)."},
                "limit": LIMIT,
                "before_id": {**ROW_ID, "description": "Page: only deliveries with a smaller id."},
            },
            (),
        ),
        result_schema(
            {
                "agent": {"type": ["string", "null"]},
                "view": {"type": "string", "enum": ["author", "operator"]},
                "count": {"type": "integer"},
                "deliveries": {"type": "array", "items": {"type": "object"}},
            }
        ),
        writes=False,
        idempotent=True,
        title="Who was shown my rows",
        operator=True,
    ),
    Operation(
        "recall_as_of",
        "GET",
        "/v1/recall/as_of",
        op_recall_as_of,
        object_schema(
            {
                "agent": OPTIONAL_AGENT,
                "as_of": {
                    "type": "string",
                    "pattern": TIMESTAMP,
                    "format": "date-time",
                    "description": "The time, UTC: 2026-11-30T06:00:00.000Z.",
                },
                "reader": {**AGENT_SCHEMA, "description": "Answer what this agent had been shown by as_of."},
                "q": {"type": "string", "maxLength": 1000, "default": "", "description": "Words to look for."},
                "k": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10, "description": "1-100."},
                "tiers": {
                    "type": "array",
                    "items": {"type": "string", "enum": VERSIONED_TIERS},
                    "uniqueItems": True,
                    "maxItems": len(VERSIONED_TIERS),
                    "default": ["long", "short"],
                    "description": "Tiers (REST: comma-separated). Default long,short.",
                },
                "scope": {
                    "type": "string",
                    "enum": list(solos_store.SCOPES),
                    "default": "shared",
                    "description": "own, shared or shared_except_self, as in recall.",
                },
            },
            ("as_of",),
        ),
        result_schema(
            {
                "as_of": {"type": "string"},
                "count": {"type": "integer"},
                "results": {"type": "array", "items": {"type": "object"}},
                "retracted": {
                    "type": "array",
                    "items": {"type": "object"},
                    "description": "Rows that existed then and were forgotten since: tier, row_id, agent, "
                    "forgotten_at; no text.",
                },
                "truncated": {
                    "type": ["object", "null"],
                    "description": "Set when the next results would pass 1 MiB: how many were left out.",
                },
            }
        ),
        writes=False,
        idempotent=True,
        title="Recall as of a time",
        operator=True,
    ),
    Operation(
        "read_notices",
        "GET",
        "/v1/notices",
        op_read_notices,
        object_schema(
            {
                "agent": AGENT_SCHEMA,
                "after_id": {**ROW_ID, "minimum": 0, "description": "Only notices with a larger id."},
                "limit": LIMIT,
                "include_acked": {"type": "boolean", "default": False, "description": "Acknowledged ones too."},
            }
        ),
        result_schema(
            {
                "agent": {"type": "string"},
                "count": {"type": "integer"},
                "notices": {"type": "array", "items": {"type": "object"}},
            }
        ),
        writes=False,
        idempotent=True,
        title="Retraction notices for me",
    ),
    Operation(
        "ack_notices",
        "POST",
        "/v1/notices/ack",
        op_ack_notices,
        object_schema(
            {
                "agent": AGENT_SCHEMA,
                "ids": {
                    "type": "array",
                    "items": ROW_ID,
                    "maxItems": 1000,
                    "uniqueItems": True,
                    "description": "The notices' ids (REST body: a JSON array).",
                },
            },
            ("agent", "ids"),
        ),
        result_schema({"agent": {"type": "string"}, "acked": {"type": "integer"}}),
        writes=True,
        idempotent=True,
        title="Acknowledge retraction notices",
    ),
)
