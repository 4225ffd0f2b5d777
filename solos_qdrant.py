"""The fleet's Qdrant collection and solos-memory: import its points, mirror long facts back.

Reading: `import-qdrant` brings the collection's points (both payload shapes)
into memory_longterm as long facts, each with source `qdrant:<collection>/<point id>`.
Attribution is coalesce(payload.agent, payload.agent_id). A point is left out,
its reason recorded in qdrant_import (which the output, /v1/stats and /metrics
count), when it has no agent or no text, its agent is not in agent_registry,
the service wrote it, its fields break the API's own rules (write_long's
schema: `invalid_fact`, `invalid_topic`, ...), its writer forgot a fact of
that very text (`forgotten`: an old copy never brings it back), or its payload says
`memory_scope: private` (long facts are read by every agent;
`--import-private` brings those in as the agent's own episodic rows instead,
which only it reads while it has not opted in to sharing; each is recorded
against its point, so forgetting the episode queues the point's delete for
the mirror: `relink` finds those an earlier import left unrecorded). Forgetting
an imported fact queues its point's delete the same way (forget_imported_point),
outbox triggers on or not. Idempotent and
resumable: every batch is one short write transaction, and a point already
imported (same id, same text) is passed over on the next run.

Point ids are unsigned integers or UUIDs. qdrant_import keeps them as text,
and `qdrant_id` gives each back in its own type: the text `1001` is the
integer 1001 (Qdrant refuses the string, and local mode deletes nothing for
it). `qdrant-verify` compares the collection with the table: points per row,
strays (points of rows that are gone), missing points.

Mirror: with a target configured (`--qdrant-url` or `--qdrant-path`), triggers
in schema.sql queue every insert, update and delete of memory_longterm in
qdrant_outbox, inside the writer's own transaction. A background thread
drains the queue into Qdrant, retrying with backoff: a write never waits for,
or fails because of, Qdrant. Points get id uuid5(agent:long:sha256(fact))
and a payload both old readers understand. A forget leaves only the text's
hash in its outbox entry (`keep_only_hash`), so the text leaves the database
at once, whether or not a mirror runs.

qdrant-client is imported only here and only when used; the service runs
without it. Nothing here imports at module level what the service lacks.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import struct
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import solos_store
from solos_validation import is_loopback

COLLECTION = "long_term"
BATCH = 256  # points per scroll page and per import or drain transaction
DRAIN_INTERVAL_S = 0.5  # how often an idle mirror looks at the outbox (one indexed read)
MAX_BACKOFF_S = 30.0  # Qdrant down: retry after 1, 2, 4 ... 30 s
ROW_RETRY_S = 60.0  # a row that cannot be sent (no vector for it yet) waits this long
ENQUEUE_CHUNK = 5_000  # rows per transaction when a first mirror queues the existing facts
QUEUED_THROUGH = "qdrant_mirror_queued_through"  # meta: the last fact a first mirror queued, "done" at its end
SERVICE_MARK = "solos-memory"  # payload.written_by on points the service wrote
TEXT_FIELDS = ("content", "fact", "text", "memory")  # where each payload shape keeps the text
LEGACY_TEXT_LIMIT = 2_000  # the old node cut text here; such points are tagged maybe-truncated
MAX_INT_ID = 2**64 - 1  # Qdrant's integer ids are unsigned 64-bit
PRIVATE_EVENT = "qdrant_private_memory"  # event_type of a private point imported with --import-private
NOW = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
FORGET_PENDING = solos_store.FORGET_PENDING  # qdrant_import.reason: a forgotten row's imported point, to delete


Validate = Callable[[str, dict], dict]  # (operation, arguments) -> checked arguments, or BadRequest


class QdrantUnavailable(Exception):
    """Qdrant (or qdrant-client) cannot be reached or used; the message says which and why."""


@dataclass(frozen=True)
class Target:
    """Where the collection lives: a server URL or a local-mode folder."""

    url: str | None = None
    path: str | None = None
    collection: str = COLLECTION

    def describe(self) -> str:
        return f"{self.url or 'local:' + str(self.path)} collection {self.collection}"


def point_id(agent: str, tier: str, text: str) -> str:
    """uuid5 of agent:tier:sha256(full text); the same as solos_langgraph.point_id."""
    return point_id_of(agent, tier, sha256(text))


def point_id_of(agent: str, tier: str, digest: str) -> str:
    """point_id from the text's sha256, for a forgotten fact whose text is gone."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{agent}:{tier}:{digest}"))


def qdrant_id(text: str) -> int | str | None:
    """A stored point id in the type Qdrant takes: an int for digits, a UUID's canonical text; None for neither."""
    if text.isascii() and text.isdigit():
        number = int(text)
        return number if number <= MAX_INT_ID else None
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return None


def sha256(text: str) -> str:
    """Hex sha256 of the text's UTF-8; a lone surrogate (a bad point's text) is hashed, not raised."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def connect(target: Target) -> Any:
    """A QdrantClient for the target; QdrantUnavailable if the package or the target is not there."""
    try:
        from qdrant_client import QdrantClient
    except ImportError:
        raise QdrantUnavailable("qdrant-client is not installed (pip install qdrant-client)") from None
    try:
        if target.url:
            # No version check: qdrant-client asks it in a thread of its own, which against a hung server holds a
            # connection for the timeout and warns, many lines long, into the JSON-line log.
            options: dict[str, Any] = {"timeout": 5}
            if "check_compatibility" in inspect.signature(QdrantClient).parameters:  # where the client has it
                options["check_compatibility"] = False
            # httpx follows http_proxy even to 127.0.0.1: a loopback Qdrant is reached directly.
            if is_loopback(urlsplit(target.url).hostname or ""):
                options["trust_env"] = False  # passed on to httpx
            return QdrantClient(url=target.url, **options)
        return QdrantClient(path=target.path)
    except Exception as error:  # a locked local folder raises RuntimeError, a bad URL ValueError
        raise unavailable(target, error) from None


def unavailable(target: Target, error: Exception) -> QdrantUnavailable:
    return QdrantUnavailable(f"{target.describe()}: {type(error).__name__}: {error}")


# ==== Reading: attribution and import ====


def attribute(payload: dict) -> tuple[str | None, str | None]:
    """(agent, text) of a point of either shape; None where the payload has none."""
    agent = next((payload[k] for k in ("agent", "agent_id") if isinstance(payload.get(k), str) and payload[k]), None)
    text = next((payload[k] for k in TEXT_FIELDS if isinstance(payload.get(k), str) and payload[k].strip()), None)
    return agent, text


def import_points(
    store: Any,
    target: Target,
    validate: Validate,
    progress: Callable[[Counter], None] | None = None,
    *,
    private: bool = False,
) -> Counter:
    """Bring the collection's attributable points into the service; return counts by outcome.

    validate(operation, arguments) checks a row as that operation's schema would (BadRequest if not).
    private: points with `memory_scope: private` become their agent's own episodic rows (else left out).
    """
    client = connect(target)
    counts: Counter = Counter()
    try:
        for points in pages(client, target, with_payload=True):
            batch = [(str(p.id), p.payload or {}) for p in points]
            counts.update(
                store.write(
                    lambda conn, batch=batch: import_batch(conn, target.collection, batch, validate, private=private)
                )
            )
            if progress:
                progress(counts)
        return counts
    finally:
        client.close()


def pages(client: Any, target: Target, with_payload: Any) -> Iterator[list]:
    """The collection's points, BATCH at a time (import and verify both read it whole); QdrantUnavailable with
    the reason when the server refuses, fails or does not answer (qdrant-client raises its own kinds for each)."""
    try:
        exists = client.collection_exists(target.collection)
    except Exception as error:
        raise unavailable(target, error) from None
    if not exists:
        raise QdrantUnavailable(f"{target.describe()}: no such collection")
    offset = None
    while True:
        try:
            points, offset = client.scroll(
                target.collection, limit=BATCH, offset=offset, with_payload=with_payload, with_vectors=False
            )
        except Exception as error:
            raise unavailable(target, error) from None
        yield points
        if offset is None:
            return


def import_batch(
    conn: Any, collection: str, points: list[tuple[str, dict]], validate: Validate, *, private: bool = False
) -> Counter:
    """One page of points, in one transaction: import, pass over, or record why it is left out."""
    registered = {row[0] for row in conn.execute("SELECT agent FROM agent_registry")}
    counts: Counter = Counter()
    for pid, payload in points:
        agent, text = attribute(payload)
        digest = sha256(text) if text else ""
        known = conn.execute(
            "SELECT row_id, reason FROM qdrant_import WHERE collection = ? AND point_id = ? AND content_sha256 = ?",
            (collection, pid, digest),
        ).fetchone()
        if known and known[0] is None and known[1] == "imported_private" and agent and text:
            counts[relink(conn, collection, pid, digest, agent, text, payload, validate)] += 1
            continue
        if known and (known[0] is not None or known[1] in ("imported_private", FORGET_PENDING)):
            counts["already_imported"] += 1
            continue
        # An earlier verdict on this point (unregistered agent, since registered; older text) is replaced.
        conn.execute(
            "DELETE FROM qdrant_import WHERE collection = ? AND point_id = ? AND row_id IS NULL "
            "AND reason NOT IN ('imported_private', ?)",
            (collection, pid, FORGET_PENDING),
        )
        outcome, row_id = import_point(conn, collection, pid, payload, agent, text, registered, private, validate)
        # A fact: the long row, no reason. A private point: the episode it became (its forget deletes the point).
        reason = None if row_id is not None and outcome != "imported_private" else outcome.removeprefix("left_out:")
        conn.execute(
            "INSERT INTO qdrant_import (collection, point_id, content_sha256, row_id, reason) VALUES (?, ?, ?, ?, ?)",
            (collection, pid, digest, row_id, reason),
        )
        counts[outcome] += 1
    return counts


def import_point(
    conn: Any,
    collection: str,
    pid: str,
    payload: dict,
    agent: str | None,
    text: str | None,
    registered: set[str],
    private: bool,
    validate: Validate,
) -> tuple[str, int | None]:
    """(outcome, row id or None): the point imported as a fact (its long row), as a private episode (the episode),
    or why it is left out."""
    if payload.get("written_by") == SERVICE_MARK:
        return "left_out:written_by_service", None  # the service's own copy of a row it holds
    if agent is None:
        return "left_out:no_agent", None
    if text is None:
        return "left_out:no_text", None
    if agent not in registered:
        return "left_out:unregistered_agent", None
    is_private = private_scope(payload.get("memory_scope"))
    if is_private and not private:
        return "left_out:private", None
    try:
        if is_private:
            return import_private(conn, collection, pid, agent, text, payload, validate)
        return import_fact(conn, collection, pid, agent, text, payload, validate)
    except solos_store.BadRequest as refused:  # the API's own rule, as POST /v1/long would answer it
        return f"left_out:invalid_{refused.field}", None
    except Forgotten:
        return "left_out:forgotten", None


class Forgotten(Exception):
    """The point's writer forgot a fact with this very text (memory_retraction holds its hash)."""


def private_scope(scope: Any) -> bool:
    """The node's private memory, however it was spelt (`Private`, ` PRIVATE `): never a fact every agent reads."""
    return isinstance(scope, str) and scope.strip().casefold() == "private"


def import_private(
    conn: Any, collection: str, pid: str, agent: str, text: str, payload: dict, validate: Validate
) -> tuple[str, int | None]:
    """A private point as its agent's own episodic row: others read it only if the agent opts in to sharing.

    Returns ("imported_private", the episode's id), recorded against the point so forgetting the episode deletes
    the point too; raises Forgotten if its agent forgot an episode of these very fields."""
    shares = conn.execute("SELECT shared FROM episodic_sharing WHERE agent = ?", (agent,)).fetchone()
    if shares and shares[0]:
        return "left_out:private_agent_shares_episodic", None
    event = private_episode(collection, pid, agent, text, payload, validate)
    if forgot_episode(conn, agent, event):
        raise Forgotten()
    row = conn.execute(
        "INSERT INTO memory_episodic (agent, event_type, summary, details, outcome) VALUES (?, ?, ?, ?, ?) "
        "RETURNING id",
        (agent, event["event_type"], event["summary"], event["details"], event["outcome"]),
    ).fetchone()
    return "imported_private", row[0]


def private_episode(collection: str, pid: str, agent: str, text: str, payload: dict, validate: Validate) -> dict:
    """The episode a private point becomes, checked by write_episodic's schema (BadRequest if it would refuse)."""
    topic = payload.get("topic") if isinstance(payload.get("topic"), str) and payload["topic"] else None
    return validate(
        "write_episodic",
        {
            "agent": agent,
            "event_type": PRIVATE_EVENT,
            "summary": f"{private_summary(collection, pid)}" + (f" ({topic})" if topic else ""),
            "details": text,
            "outcome": "imported",
        },
    )


def private_summary(collection: str, pid: str) -> str:
    return f"Private memory imported from qdrant:{collection}/{pid}"


def forgot(conn: Any, agent: str, tier: str, digest: str) -> bool:
    """The agent forgot a row of this tier whose content hashed so (memory_retraction keeps the hash)."""
    return (
        conn.execute(
            "SELECT 1 FROM memory_retraction WHERE agent = ? AND tier = ? AND content_hash = ? LIMIT 1",
            (agent, tier, digest),
        ).fetchone()
        is not None
    )


def forgot_episode(conn: Any, agent: str, event: dict) -> bool:
    """The agent forgot an episode of exactly these fields."""
    return forgot(conn, agent, "episodic", solos_store.content_hash("episodic", event))


def relink(
    conn: Any, collection: str, pid: str, digest: str, agent: str, text: str, payload: dict, validate: Validate
) -> str:
    """A private point an earlier import brought in without recording its episode: find that episode now.

    Its episode still there (or archived): the link is recorded (`linked_private`), so its forget deletes the point.
    Forgotten meanwhile (its retraction holds the hash of these fields): the point's delete is queued
    (`forget_queued`). Neither (another writer deleted it, or the point's topic changed since): `already_imported`.
    """
    try:
        event = private_episode(collection, pid, agent, text, payload, validate)
    except solos_store.BadRequest:
        return "already_imported"
    prefix = private_summary(collection, pid)
    where = "WHERE collection = ? AND point_id = ? AND content_sha256 = ?"
    for table in ("memory_episodic", "memory_episodic_archive"):
        found = conn.execute(
            f"SELECT id FROM {table} WHERE agent = ? AND event_type = ? AND details = ? "
            "AND (summary = ? OR substr(summary, 1, ?) = ?) ORDER BY id LIMIT 1",
            (agent, PRIVATE_EVENT, event["details"], prefix, len(prefix) + 2, prefix + " ("),
        ).fetchone()
        if found is not None:
            conn.execute(f"UPDATE qdrant_import SET row_id = ? {where}", (found[0], collection, pid, digest))
            return "linked_private"
    if forgot_episode(conn, agent, event):
        conn.execute(f"UPDATE qdrant_import SET reason = ? {where}", (FORGET_PENDING, collection, pid, digest))
        return "forget_queued"
    return "already_imported"


def import_fact(
    conn: Any, collection: str, pid: str, agent: str, text: str, payload: dict, validate: Validate
) -> tuple[str, int]:
    """The row for this fact: the writer's existing one (same full text), else a new one keyed like write_long's.

    Its fields go through write_long's schema first: a point the API would refuse raises BadRequest; one whose
    writer forgot a fact of this text (and holds none) raises Forgotten.
    """
    topic = payload.get("topic") if isinstance(payload.get("topic"), str) else None
    score = payload.get("importance_score", payload.get("confidence"))
    confidence = score if isinstance(score, (int, float)) and not isinstance(score, bool) and 0 <= score <= 1 else None
    tags = ["qdrant-import"]
    if isinstance(payload.get("memory_scope"), str):
        tags.append(f"scope:{payload['memory_scope']}")
    if len(text) >= LEGACY_TEXT_LIMIT:
        tags.append("maybe-truncated")
    fact = validate(
        "write_long",
        {
            "agent": agent,
            "topic": topic,
            "fact": text,
            "source": f"qdrant:{collection}/{pid}",
            "confidence": confidence,
            "tags": tags,
        },
    )
    existing = solos_store.Store.known_long(conn, agent, text)
    if existing is not None:
        return "same_fact_already_stored", existing
    if forgot(conn, agent, "long", sha256(text)):  # the writer forgot these words: an old copy must not bring them back
        raise Forgotten()
    row_id = solos_store.Store.insert_long(
        conn, agent, fact["topic"], text, fact["source"], fact["confidence"], fact["tags"]
    )
    return "imported", row_id


def import_counts(conn: Any) -> dict:
    """What imports brought in and what they left out, by reason (each point's latest verdict)."""
    rows = conn.execute(
        "SELECT coalesce(reason, 'imported'), count(DISTINCT collection || '/' || point_id) FROM qdrant_import "
        "GROUP BY reason"
    ).fetchall()
    counts = {row[0]: row[1] for row in rows}
    return {
        "imported_points": counts.pop("imported", 0),
        "imported_private": counts.pop("imported_private", 0),
        "left_out": counts,
    }


# ==== Mirror: outbox and drain ====

# A row's embedding only while memory_vector says it is the current text's: a fleet writer's UPDATE of the fact
# drops that row (schema.sql's vector triggers) but leaves the column holding the old text's vector.
ROW_SQL = (
    "SELECT id, agent, topic, fact, source, confidence, tags, CASE WHEN EXISTS (SELECT 1 FROM memory_vector v "
    "WHERE v.tier = 'long' AND v.row_id = memory_longterm.id) THEN embedding END AS embedding, updated_at "
    "FROM memory_longterm"
)


class RowUnsendable(Exception):
    """This row cannot be sent yet (no vector of the collection's size, or the embedder failed on it); it waits,
    the others go on."""


class Mirror(threading.Thread):
    """Drains qdrant_outbox into the collection in the background, with retries and backoff."""

    def __init__(self, store: Any, target: Target, embedder: Any = None):
        super().__init__(name="qdrant-mirror", daemon=True)
        self.store, self.target, self.embedder = store, target, embedder
        self.wake = threading.Event()
        self.stopped = False
        self.failures = 0
        self.last_error: str | None = None
        self.last_error_at: str | None = None
        self.last_drained_at: str | None = None
        self.sent_total = 0
        self.refused_ids = 0  # point ids Qdrant would refuse, never sent

    def enable(self) -> int:
        """Turn the outbox triggers on; the first time, queue every existing fact. Return how many were queued.

        The first queueing runs in chunks and notes the last fact queued in each chunk's own transaction
        (QUEUED_THROUGH), so a service stopped half way carries on from there at its next start, where the mirror
        already reads `on` and nothing else would queue the rest."""

        def switch(conn: Any) -> int | None:
            row = conn.execute("SELECT value FROM solos_memory_meta WHERE key = 'qdrant_mirror'").fetchone()
            queued = conn.execute("SELECT value FROM solos_memory_meta WHERE key = ?", (QUEUED_THROUGH,)).fetchone()
            conn.execute(
                "INSERT INTO solos_memory_meta (key, value) VALUES ('qdrant_mirror', 'on') "
                "ON CONFLICT (key) DO UPDATE SET value = 'on'"
            )
            if row is None or row[0] != "on":
                return 0  # the first time: every fact
            return None if queued is None or queued[0] == "done" else int(queued[0])

        start = self.store.write(switch)
        if start is None:
            return 0
        last = [start]

        def chunk() -> int:  # rows written meanwhile are queued by the triggers
            def queue(conn: Any) -> list:
                rows = conn.execute(
                    "INSERT INTO qdrant_outbox (action, row_id) SELECT 'upsert', id FROM memory_longterm "
                    "WHERE id > ? ORDER BY id LIMIT ? RETURNING row_id",
                    (last[0], ENQUEUE_CHUNK),
                ).fetchall()
                through = str(max([last[0], *(row[0] for row in rows)])) if rows else "done"
                conn.execute(
                    "INSERT INTO solos_memory_meta (key, value) VALUES (?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (QUEUED_THROUGH, through),
                )
                return rows

            rows = self.store.write(queue)
            last[0] = max([last[0], *(row[0] for row in rows)])
            return len(rows)

        return self.store.in_chunks(chunk, bool)  # in chunks, the write lock free between two

    def run(self) -> None:
        delay = DRAIN_INTERVAL_S
        while not self.stopped:
            self.wake.wait(delay)
            self.wake.clear()
            if self.stopped:
                return
            try:
                self.drain()
                self.failures, delay = 0, DRAIN_INTERVAL_S
            except Exception as error:  # Qdrant down or refusing: the queue keeps every change until it is back
                self.failures += 1
                self.last_error = f"{type(error).__name__}: {error}"[:500]
                self.last_error_at = utc_now()
                delay = min(MAX_BACKOFF_S, 2 ** (self.failures - 1))
                log("qdrant_mirror_failed", reason=self.last_error, retry_in_s=delay)

    def stop(self) -> None:
        self.stopped = True
        self.wake.set()

    def drain(self) -> int:
        """Send every due outbox entry, batch by batch; return how many entries were done."""
        done = 0
        client = None
        try:
            while not self.stopped:
                entries, forgotten = self.store.read(self.due)
                if not entries and not forgotten:
                    return done
                if client is None:
                    client = connect(self.target)
                    size = self.vector_size(client)
                if entries:
                    done += self.send(client, size, entries)
                if forgotten:
                    done += self.delete_forgotten(client, forgotten)
        finally:
            if client is not None:
                client.close()  # a local-mode folder stays locked while a client holds it
        return done

    def due(self, conn: Any) -> tuple[list, list]:
        """The outbox entries due now, and the imported points of forgotten rows (forget_imported_point)."""
        entries = conn.execute(
            f"SELECT id, action, row_id, agent, fact FROM qdrant_outbox WHERE next_try_at <= {NOW} ORDER BY id LIMIT ?",
            (BATCH,),
        ).fetchall()
        forgotten = conn.execute(  # the partial index: the primary key's (collection) would read every point
            "SELECT point_id, content_sha256 FROM qdrant_import INDEXED BY qdrant_import_forget_pending "
            f"WHERE reason = '{FORGET_PENDING}' AND collection = ? LIMIT ?",
            (self.target.collection, BATCH),
        ).fetchall()
        return entries, forgotten

    def delete_forgotten(self, client: Any, forgotten: list) -> int:
        """Delete the imported points of forgotten rows; their verdict becomes `forgotten` once Qdrant has."""
        from qdrant_client import models

        ids = self.valid_ids({row[0] for row in forgotten})
        if ids:
            client.delete(self.target.collection, models.PointIdsList(points=ids), wait=True)
        self.store.write(
            lambda conn: conn.executemany(
                "UPDATE qdrant_import SET reason = 'forgotten', row_id = NULL "
                f"WHERE collection = ? AND point_id = ? AND content_sha256 = ? AND reason = '{FORGET_PENDING}'",
                [(self.target.collection, pid, digest) for pid, digest in forgotten],
            )
        )
        self.sent_total += len(ids)
        self.last_drained_at = utc_now()
        return len(forgotten)

    def vector_size(self, client: Any) -> int | None:
        """The collection's vector size (None: it has no vectors), creating it if missing."""
        from qdrant_client import models

        name = self.target.collection
        if not client.collection_exists(name):
            dim = getattr(self.embedder, "dim", None)
            config: Any = models.VectorParams(size=dim, distance=models.Distance.COSINE) if dim else {}
            client.create_collection(name, vectors_config=config)
            log("qdrant_collection_created", collection=name, vector_size=dim)
        params = client.get_collection(name).config.params.vectors
        if isinstance(params, dict):
            if params:
                raise QdrantUnavailable(f"{name} has named vectors ({', '.join(params)}); one unnamed is supported")
            return None
        return params.size

    def send(self, client: Any, size: int | None, entries: list) -> int:
        """Apply one batch: final state per point, upserts then deletes, then drop the entries from the outbox."""
        from qdrant_client import models

        upserts, deletes, legacy = self.store.read(lambda conn: plan(conn, entries, self.target.collection))
        points, waiting = [], {}
        for pid, row in upserts.items():
            try:
                points.append(models.PointStruct(id=pid, vector=self.vector(row, size), payload=payload(row)))
            except RowUnsendable as error:
                waiting[row["id"]] = str(error)
            else:
                deletes |= legacy.get(pid, set())  # only once its canonical point is written
        ids = self.valid_ids(deletes)
        if points:
            client.upsert(self.target.collection, points=points, wait=True)
        if ids:
            client.delete(self.target.collection, models.PointIdsList(points=ids), wait=True)
        finished = [e["id"] for e in entries if e["action"] == "delete" or e["row_id"] not in waiting]

        def settle(conn: Any) -> None:
            done = json.dumps(finished)
            conn.execute("DELETE FROM qdrant_outbox WHERE id IN (SELECT value FROM json_each(?))", (done,))
            for entry in entries:
                if entry["id"] not in finished:
                    conn.execute(
                        f"UPDATE qdrant_outbox SET attempts = attempts + 1, last_error = ?, "
                        f"next_try_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '+{ROW_RETRY_S:.0f} seconds') "
                        f"WHERE id = ?",
                        (waiting[entry["row_id"]], entry["id"]),
                    )

        self.store.write(settle)
        self.sent_total += len(points) + len(ids)
        self.last_drained_at = utc_now()
        if waiting:
            self.last_error = f"{len(waiting)} rows wait for a vector: {next(iter(waiting.values()))}"
            self.last_error_at = utc_now()
        return len(finished)

    def valid_ids(self, texts: set[str]) -> list[int | str | uuid.UUID]:
        """The ids in Qdrant's types; one it would refuse is counted and logged, never sent (it would retry forever)."""
        ids: list[int | str | uuid.UUID] = []
        refused = []
        for text in sorted(texts):
            pid = qdrant_id(text)
            if pid is None:
                refused.append(text)
            else:
                ids.append(pid)
        if refused:
            self.refused_ids += len(refused)
            log("qdrant_point_ids_refused", count=len(refused), example=refused[0][:80])
        return ids

    def vector(self, row: Any, size: int | None) -> Any:
        """The row's vector for a collection of this size: its stored embedding, else a fresh one."""
        if size is None:
            return {}
        blob = row["embedding"]
        if blob is None or len(blob) != 4 * size:
            if self.embedder is None or getattr(self.embedder, "dim", None) != size:
                raise RowUnsendable(
                    f"the collection wants {size}-dim vectors and the service has no embedder of that size"
                )
            try:
                blob = self.embedder.embed([solos_store.TIER_TABLE["long"].embedding_text(row)])[0]
            except Exception as error:  # this row's text, or a broken model: it waits, the batch's deletes go on
                raise RowUnsendable(f"the embedder failed on it: {type(error).__name__}: {error}") from None
        return list(struct.unpack(f"<{size}f", blob))

    def status(self, conn: Any) -> dict:
        """Backlog and health for /v1/stats and /metrics."""
        backlog, oldest, waiting = conn.execute(
            f"SELECT count(*), min(created_at), count(*) FILTER (WHERE next_try_at > {NOW}) FROM qdrant_outbox"
        ).fetchone()
        waiting_deletes = forgotten_waiting(conn)
        return {
            "configured": True,
            "target": self.target.describe(),
            "backlog": backlog + waiting_deletes.pop(self.target.collection, 0),
            "deletes_for_other_collections": sum(waiting_deletes.values()),
            "oldest_queued_at": oldest,
            "rows_waiting_for_retry": waiting,
            "sent_total": self.sent_total,
            "refused_point_ids": self.refused_ids,
            "consecutive_failures": self.failures,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "last_drained_at": self.last_drained_at,
        }


def plan(conn: Any, entries: list, collection: str) -> tuple[dict[str, Any], set[str], dict[str, set[str]]]:
    """The batch's final state per point id: rows to upsert (read now), points to delete, legacy points per id.

    Legacy ids are qdrant_import's text, of this collection only (another's point 5 is not this one's);
    `send` turns them into Qdrant's types.
    """
    final: dict[str, Any] = {}  # point id -> row to upsert, or None to delete
    legacy: dict[str, set[str]] = {}
    for entry in entries:
        if entry["action"] == "upsert":
            row = conn.execute(ROW_SQL + " WHERE id = ?", (entry["row_id"],)).fetchone()
            if row is None:
                continue  # deleted since: its delete entry follows
            agent, digest = row["agent"], sha256(row["fact"])
        elif (entry["fact"] or "").startswith(
            solos_store.HASH_ONLY
        ):  # a forgotten fact: keep_only_hash checked for twins
            agent, digest, row = entry["agent"], entry["fact"][len(solos_store.HASH_ONLY) :], None
        else:
            agent, fact = entry["agent"], entry["fact"]
            digest = sha256(fact)
            # Another row may still hold the same writer and text (a fleet writer's duplicate): keep its point.
            row = conn.execute(
                ROW_SQL + " WHERE agent = ? AND fact = ? AND id != ? ORDER BY id LIMIT 1",
                (agent, fact, entry["row_id"]),
            ).fetchone()
        pid = point_id_of(agent, "long", digest)
        final[pid] = row
        # The point an import came from is replaced by the canonical one: never two points for one record.
        legacy.setdefault(pid, set()).update(
            r[0]
            for r in conn.execute(
                "SELECT point_id FROM qdrant_import "
                "WHERE row_id = ? AND content_sha256 = ? AND collection = ? AND reason IS NULL",
                (entry["row_id"], digest, collection),
            )
        )
    upserts = {pid: row for pid, row in final.items() if row is not None}
    deletes = {pid for pid, row in final.items() if row is None}
    for pid in list(deletes):  # a deleted fact's imported point goes too
        deletes |= legacy.pop(pid, set())
    return upserts, deletes, {pid: ids - set(final) for pid, ids in legacy.items()}


def payload(row: Any) -> dict:
    """Both shapes in one payload: agent/topic/content for old readers, agent_id/importance_score for newer."""
    tags = solos_store.parse_tags(row["tags"])
    scope = next((tag[6:] for tag in tags if tag.startswith("scope:")), "shared")
    return {
        "agent": row["agent"],
        "agent_id": row["agent"],
        "topic": row["topic"] or "",
        "content": row["fact"],
        "sha256": sha256(row["fact"]),
        "solos_row_id": row["id"],
        "tier": "long",
        "source": row["source"],
        "confidence": row["confidence"],
        "importance_score": row["confidence"],
        "memory_scope": scope,
        "tags": tags,
        "updated_at": row["updated_at"],
        "written_by": SERVICE_MARK,
    }


def mirror_status(store: Any, mirror: Mirror | None) -> dict:
    """The qdrant section of /v1/stats: mirror health, or the backlog of a mirror switched on but not configured."""

    def work(conn: Any) -> dict:
        imported = import_counts(conn)
        if mirror is not None:
            return {**mirror.status(conn), "import": imported}
        on = conn.execute("SELECT value FROM solos_memory_meta WHERE key = 'qdrant_mirror'").fetchone()
        queued = conn.execute("SELECT count(*) FROM qdrant_outbox").fetchone()[0]
        backlog = queued + sum(forgotten_waiting(conn).values())
        return {"configured": False, "outbox_on": bool(on and on[0] == "on"), "backlog": backlog, "import": imported}

    return store.read(work)


def forgotten_waiting(conn: Any) -> dict[str, int]:
    """Points of forgotten rows whose delete has not reached Qdrant yet, by collection (a mirror sends its own)."""
    rows = conn.execute(
        f"SELECT collection, count(*) FROM qdrant_import WHERE reason = '{FORGET_PENDING}' GROUP BY collection"
    )
    return {collection: count for collection, count in rows}


def metrics_lines(status: dict) -> list[str]:
    """Prometheus lines for the mirror's backlog, failures and the import's left-out counts."""
    lines = [
        "# HELP solos_memory_qdrant_outbox_backlog Long-fact changes queued for Qdrant.",
        "# TYPE solos_memory_qdrant_outbox_backlog gauge",
        f"solos_memory_qdrant_outbox_backlog {status['backlog']}",
        "# HELP solos_memory_qdrant_mirror_failing 1 while the last attempt to reach Qdrant failed.",
        "# TYPE solos_memory_qdrant_mirror_failing gauge",
        f"solos_memory_qdrant_mirror_failing {int(bool(status.get('consecutive_failures')))}",
        "# HELP solos_memory_qdrant_left_out Imported points left out, by reason.",
        "# TYPE solos_memory_qdrant_left_out gauge",
    ]
    for reason, count in sorted(status["import"]["left_out"].items()):
        lines.append(f'solos_memory_qdrant_left_out{{reason="{reason}"}} {count}')
    return lines


def start_mirror(store: Any, target: Target, embedder: Any) -> Mirror:
    """Switch the outbox on, start draining; the first start queues the facts already stored.

    A missing qdrant-client stops startup: that is a setup mistake, not an outage to queue through.
    """
    import importlib.util

    if importlib.util.find_spec("qdrant_client") is None:
        raise SystemExit(f"--qdrant-url/--qdrant-path need qdrant-client in this Python ({sys.executable})")
    mirror = Mirror(store, target, embedder)
    queued = mirror.enable()
    log("qdrant_mirror_started", target=target.describe(), queued_existing=queued)
    mirror.start()
    return mirror


utc_now = solos_store.utc_now
log = solos_store.log_event


# ==== CLI ====


def add_arguments(parser: Any, env_default: Callable[[str, str | None], str | None]) -> None:
    """--qdrant-url / --qdrant-path / --qdrant-collection, for serve (the mirror) and import-qdrant."""
    parser.add_argument(
        "--qdrant-url",
        default=env_default("QDRANT_URL", None),
        help="Qdrant server to mirror long facts to / import from, e.g. http://127.0.0.1:6333 (default: none)",
    )
    parser.add_argument(
        "--qdrant-path",
        default=env_default("QDRANT_PATH", None),
        help="or a qdrant-client local-mode folder, for one process at a time (default: none)",
    )
    parser.add_argument(
        "--qdrant-collection",
        default=env_default("QDRANT_COLLECTION", COLLECTION),
        help="the collection (default: %(default)s)",
    )


def target_from(args: Any) -> Target | None:
    """The configured target, or None; both a URL and a path is a mistake worth stopping for."""
    url, path = getattr(args, "qdrant_url", None), getattr(args, "qdrant_path", None)
    if url and path:
        raise SystemExit("give --qdrant-url or --qdrant-path, not both")
    return Target(url, path, args.qdrant_collection) if url or path else None


COMMANDS = ("import-qdrant", "qdrant-verify")


def add_commands(commands: Any, env_default: Callable[[str, str | None], str | None]) -> list[Any]:
    """The import-qdrant and qdrant-verify subcommands; the caller adds the database options to each."""
    imports = commands.add_parser(
        "import-qdrant", help="bring the Qdrant collection's attributable points in as long facts"
    )
    add_arguments(imports, env_default)
    imports.add_argument(
        "--import-private",
        action="store_true",
        help="import `memory_scope: private` points as their agent's own episodic rows (default: leave them out)",
    )
    verify = commands.add_parser(
        "qdrant-verify",
        help="compare the collection with the long facts: points per row, strays, missing; exit 1 on any",
    )
    add_arguments(verify, env_default)
    return [imports, verify]


def run_command(args: Any, store: Any, target: Target | None, validate: Validate) -> int:
    if target is None:
        log("failed", command=args.command, reason="give --qdrant-url or --qdrant-path")
        return 1
    if args.command == "qdrant-verify":
        return run_verify(store, target)
    return run_import(store, target, validate, private=args.import_private)


def run_import(store: Any, target: Target, validate: Validate, *, private: bool = False) -> int:
    """import-qdrant: progress on stderr, the counts as one JSON line; exit 1 if Qdrant cannot be read."""
    started = time.monotonic()

    def progress(counts: Counter) -> None:
        sys.stderr.write(f"\rimport-qdrant: {sum(counts.values())} points read, {counts['imported']} imported")
        sys.stderr.flush()

    try:
        counts = import_points(store, target, validate, progress, private=private)
    except QdrantUnavailable as error:
        log("failed", command="import-qdrant", reason=str(error))
        return 1
    sys.stderr.write("\n")
    summary = {"points": sum(counts.values()), **dict(sorted(counts.items()))}
    print(json.dumps(summary))
    log("imported_qdrant", target=target.describe(), seconds=round(time.monotonic() - started, 2), **summary)
    return 0


# ==== Verify: the collection against the table ====

EXAMPLES = 5  # ids shown per kind of difference


def verify(store: Any, target: Target) -> dict:
    """Points per long row (its canonical point plus imported points still there), strays, missing points.

    A stray is a point of a row that is gone: one the service wrote, or one an
    import brought in whose row was since deleted or forgotten (one whose
    delete still waits too). Points the
    service never took in (left out, never imported) are `unmanaged`.
    """

    def expected(conn: Any) -> tuple[dict[str, int], dict[str, int], set[int], int, set[str]]:
        canonical = {
            point_id(agent, "long", fact): row
            for row, agent, fact in conn.execute("SELECT id, agent, fact FROM memory_longterm")
        }
        imported = {}
        for text, row in conn.execute(
            "SELECT point_id, row_id FROM qdrant_import WHERE row_id IS NOT NULL AND reason IS NULL AND collection = ?",
            (target.collection,),
        ):
            pid = qdrant_id(text)
            if pid is not None:
                imported[str(pid)] = row
        backlog = conn.execute("SELECT count(*) FROM qdrant_outbox").fetchone()[0]
        forgotten = {  # imported points of forgotten rows, their delete not sent yet
            str(qdrant_id(r[0]))
            for r in conn.execute(
                f"SELECT point_id FROM qdrant_import WHERE reason = '{FORGET_PENDING}' AND collection = ?",
                (target.collection,),
            )
        }
        return canonical, imported, set(canonical.values()), backlog + len(forgotten), forgotten

    canonical, imported, rows, backlog, forgotten = store.read(expected)
    per_row: Counter = Counter()
    strays: list[str] = []
    unmanaged = 0
    client = connect(target)
    try:
        for points in pages(client, target, with_payload=["written_by"]):
            for point in points:
                pid = str(point.id)
                row = canonical.get(pid, imported.get(pid))
                if row in rows:
                    per_row[row] += 1
                elif pid in imported or pid in forgotten or (point.payload or {}).get("written_by") == SERVICE_MARK:
                    strays.append(pid)
                else:
                    unmanaged += 1
    finally:
        client.close()
    missing = sorted(rows - set(per_row))
    doubled = sorted(row for row, count in per_row.items() if count > 1)
    histogram = Counter(per_row.values())
    histogram[0] = len(missing)
    return {
        "rows": len(rows),
        "points_per_row": {str(n): histogram[n] for n in sorted(histogram)},
        "missing": len(missing),
        "strays": len(strays),
        "rows_with_several_points": len(doubled),
        "unmanaged_points": unmanaged,
        "outbox_backlog": backlog,
        "examples": {
            "missing_rows": missing[:EXAMPLES],
            "stray_points": strays[:EXAMPLES],
            "rows_with_several_points": doubled[:EXAMPLES],
        },
        "matches": not (missing or strays or doubled),
    }


def run_verify(store: Any, target: Target) -> int:
    """qdrant-verify: the report as one JSON line; exit 0 when the collection matches, 1 on any difference."""
    try:
        report = verify(store, target)
    except QdrantUnavailable as error:
        log("failed", command="qdrant-verify", reason=str(error))
        return 1
    print(json.dumps(report))
    return 0 if report["matches"] else 1
