"""The fleet's Qdrant collection and solos-memory: import its points, mirror long facts back.

Reading: `import-qdrant` brings the collection's points (both payload shapes)
into memory_longterm as long facts, each with source `qdrant:<collection>/<point id>`.
Attribution is coalesce(payload.agent, payload.agent_id); a point without an
agent, without text, or whose agent is not in agent_registry is left out and
its reason recorded in qdrant_import, which /v1/stats counts. Idempotent and
resumable: every batch is one short write transaction, and a point already
imported (same id, same text) is passed over on the next run.

Mirror: with a target configured (`--qdrant-url` or `--qdrant-path`), triggers
in schema.sql queue every insert, update and delete of memory_longterm in
qdrant_outbox, inside the writer's own transaction. A background thread
drains the queue into Qdrant, retrying with backoff: a write never waits for,
or fails because of, Qdrant. Points get id uuid5(agent:long:sha256(fact))
and a payload both old readers understand.

qdrant-client is imported only here and only when used; the service runs
without it. Nothing here imports at module level what the service lacks.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import solos_rank

COLLECTION = "long_term"
BATCH = 256  # points per scroll page and per import or drain transaction
DRAIN_INTERVAL_S = 0.5  # how often an idle mirror looks at the outbox (one indexed read)
MAX_BACKOFF_S = 30.0  # Qdrant down: retry after 1, 2, 4 ... 30 s
ROW_RETRY_S = 60.0  # a row that cannot be sent (no vector for it yet) waits this long
ENQUEUE_CHUNK = 5_000  # rows per transaction when a first mirror queues the existing facts
SERVICE_MARK = "solos-memory"  # payload.written_by on points the service wrote
TEXT_FIELDS = ("content", "fact", "text", "memory")  # where each payload shape keeps the text
LEGACY_TEXT_LIMIT = 2_000  # the old node cut text here; such points are tagged maybe-truncated
NOW = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"


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
    """uuid5 of agent:tier:sha256(full text); the same as solos_store_memory.point_id."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{agent}:{tier}:{sha256(text)}"))


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def connect(target: Target) -> Any:
    """A QdrantClient for the target; QdrantUnavailable if the package or the target is not there."""
    try:
        from qdrant_client import QdrantClient
    except ImportError:
        raise QdrantUnavailable("qdrant-client is not installed (pip install qdrant-client)") from None
    try:
        if target.url:
            return QdrantClient(url=target.url, timeout=5)
        return QdrantClient(path=target.path)
    except Exception as error:  # a locked local folder raises RuntimeError, a bad URL ValueError
        raise QdrantUnavailable(f"{target.describe()}: {type(error).__name__}: {error}") from None


# ==== Reading: attribution and import ====


def attribute(payload: dict) -> tuple[str | None, str | None]:
    """(agent, text) of a point of either shape; None where the payload has none."""
    agent = next((payload[k] for k in ("agent", "agent_id") if isinstance(payload.get(k), str) and payload[k]), None)
    text = next((payload[k] for k in TEXT_FIELDS if isinstance(payload.get(k), str) and payload[k].strip()), None)
    return agent, text


def import_points(store: Any, target: Target, progress: Callable[[Counter], None] | None = None) -> Counter:
    """Bring the collection's attributable points into memory_longterm; return counts by outcome."""
    client = connect(target)
    counts: Counter = Counter()
    try:
        if not client.collection_exists(target.collection):
            raise QdrantUnavailable(f"{target.describe()}: no such collection")
        offset = None
        while True:
            points, offset = client.scroll(
                target.collection, limit=BATCH, offset=offset, with_payload=True, with_vectors=False
            )
            batch = [(str(p.id), p.payload or {}) for p in points]
            counts.update(store.write(lambda conn, batch=batch: import_batch(conn, target.collection, batch)))
            if progress:
                progress(counts)
            if offset is None:
                return counts
    finally:
        client.close()


def import_batch(conn: Any, collection: str, points: list[tuple[str, dict]]) -> Counter:
    """One page of points, in one transaction: import, pass over, or record why it is left out."""
    registered = {row[0] for row in conn.execute("SELECT agent FROM agent_registry")}
    counts: Counter = Counter()
    for pid, payload in points:
        if payload.get("written_by") == SERVICE_MARK:
            counts["mirrored_by_service"] += 1  # the service's own copy of a row it holds
            continue
        agent, text = attribute(payload)
        digest = sha256(text) if text else ""
        known = conn.execute(
            "SELECT row_id FROM qdrant_import WHERE collection = ? AND point_id = ? AND content_sha256 = ?",
            (collection, pid, digest),
        ).fetchone()
        if known and known[0] is not None:
            counts["already_imported"] += 1
            continue
        # An earlier verdict on this point (unregistered agent, since registered; older text) is replaced.
        conn.execute(
            "DELETE FROM qdrant_import WHERE collection = ? AND point_id = ? AND row_id IS NULL", (collection, pid)
        )
        reason = (
            "no_agent"
            if agent is None
            else "no_text"
            if text is None
            else "unregistered_agent"
            if agent not in registered
            else None
        )
        if reason or agent is None or text is None:
            conn.execute(
                "INSERT INTO qdrant_import (collection, point_id, content_sha256, row_id, reason) "
                "VALUES (?, ?, ?, NULL, ?)",
                (collection, pid, digest, reason),
            )
            counts[f"left_out:{reason}"] += 1
            continue
        row_id, outcome = import_fact(conn, collection, pid, agent, text, payload)
        conn.execute(
            "INSERT INTO qdrant_import (collection, point_id, content_sha256, row_id) VALUES (?, ?, ?, ?)",
            (collection, pid, digest, row_id),
        )
        counts[outcome] += 1
    return counts


def import_fact(conn: Any, collection: str, pid: str, agent: str, text: str, payload: dict) -> tuple[int, str]:
    """The row for this fact: the writer's existing one (same full text), else a new one keyed like write_long's."""
    import solos_memory

    existing = solos_memory.Store.known_long(conn, agent, text)
    if existing is not None:
        return existing, "same_fact_already_stored"
    topic = payload.get("topic") if isinstance(payload.get("topic"), str) else None
    score = payload.get("importance_score", payload.get("confidence"))
    confidence = score if isinstance(score, (int, float)) and not isinstance(score, bool) and 0 <= score <= 1 else None
    tags = ["qdrant-import"]
    if isinstance(payload.get("memory_scope"), str):
        tags.append(f"scope:{payload['memory_scope']}")
    if len(text) >= LEGACY_TEXT_LIMIT:
        tags.append("maybe-truncated")
    source = f"qdrant:{collection}/{pid}"
    return solos_memory.Store.insert_long(conn, agent, topic, text, source, confidence, tags), "imported"


def import_counts(conn: Any) -> dict:
    """What imports brought in and what they left out, by reason (each point's latest verdict)."""
    rows = conn.execute(
        "SELECT coalesce(reason, 'imported'), count(DISTINCT collection || '/' || point_id) FROM qdrant_import "
        "GROUP BY reason"
    ).fetchall()
    counts = {row[0]: row[1] for row in rows}
    return {"imported_points": counts.pop("imported", 0), "left_out": counts}


# ==== Mirror: outbox and drain ====

ROW_SQL = "SELECT id, agent, topic, fact, source, confidence, tags, embedding, updated_at FROM memory_longterm"


class RowUnsendable(Exception):
    """This row cannot be sent yet (no vector of the collection's size); it waits, the others go on."""


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

    def enable(self) -> int:
        """Turn the outbox triggers on; the first time, queue every existing fact. Return how many were queued."""

        def switch(conn: Any) -> bool:
            row = conn.execute("SELECT value FROM solos_memory_meta WHERE key = 'qdrant_mirror'").fetchone()
            conn.execute(
                "INSERT INTO solos_memory_meta (key, value) VALUES ('qdrant_mirror', 'on') "
                "ON CONFLICT (key) DO UPDATE SET value = 'on'"
            )
            return row is None or row[0] != "on"

        if not self.store.write(switch):
            return 0
        queued, last = 0, 0
        while True:  # in chunks, so no write lock is held long; rows written meanwhile are queued by the triggers
            chunk = self.store.write(
                lambda conn, last=last: conn.execute(
                    "INSERT INTO qdrant_outbox (action, row_id) SELECT 'upsert', id FROM memory_longterm "
                    "WHERE id > ? ORDER BY id LIMIT ? RETURNING row_id",
                    (last, ENQUEUE_CHUNK),
                ).fetchall()
            )
            if not chunk:
                return queued
            queued += len(chunk)
            last = max(row[0] for row in chunk)

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
                entries = self.store.read(
                    lambda conn: conn.execute(
                        f"SELECT id, action, row_id, agent, fact FROM qdrant_outbox WHERE next_try_at <= {NOW} "
                        "ORDER BY id LIMIT ?",
                        (BATCH,),
                    ).fetchall()
                )
                if not entries:
                    return done
                if client is None:
                    client = connect(self.target)
                    size = self.vector_size(client)
                done += self.send(client, size, entries)
        finally:
            if client is not None:
                client.close()  # a local-mode folder stays locked while a client holds it
        return done

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

        upserts, deletes, legacy = self.store.read(lambda conn: plan(conn, entries))
        points, waiting = [], {}
        for pid, row in upserts.items():
            try:
                points.append(models.PointStruct(id=pid, vector=self.vector(row, size), payload=payload(row)))
            except RowUnsendable as error:
                waiting[row["id"]] = str(error)
            else:
                deletes |= legacy.get(pid, set())  # only once its canonical point is written
        if points:
            client.upsert(self.target.collection, points=points, wait=True)
        if deletes:
            client.delete(self.target.collection, models.PointIdsList(points=sorted(deletes)), wait=True)
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
        self.sent_total += len(points) + len(deletes)
        self.last_drained_at = utc_now()
        if waiting:
            self.last_error = f"{len(waiting)} rows wait for a vector: {next(iter(waiting.values()))}"
            self.last_error_at = utc_now()
        return len(finished)

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
            label = f" ({row['topic']})" if row["topic"] else ""
            text = f"{row['agent']}{label}: {row['fact']}"  # as the service embeds it (embedding_text)
            blob = self.embedder.embed([text])[0]
        return list(struct.unpack(f"<{size}f", blob))

    def status(self, conn: Any) -> dict:
        """Backlog and health for /v1/stats and /metrics."""
        backlog, oldest, waiting = conn.execute(
            f"SELECT count(*), min(created_at), count(*) FILTER (WHERE next_try_at > {NOW}) FROM qdrant_outbox"
        ).fetchone()
        return {
            "configured": True,
            "target": self.target.describe(),
            "backlog": backlog,
            "oldest_queued_at": oldest,
            "rows_waiting_for_retry": waiting,
            "sent_total": self.sent_total,
            "consecutive_failures": self.failures,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "last_drained_at": self.last_drained_at,
        }


def plan(conn: Any, entries: list) -> tuple[dict[str, Any], set[str], dict[str, set[str]]]:
    """The batch's final state per point id: rows to upsert (read now), points to delete, legacy points per id."""
    final: dict[str, Any] = {}  # point id -> row to upsert, or None to delete
    legacy: dict[str, set[str]] = {}
    for entry in entries:
        if entry["action"] == "upsert":
            row = conn.execute(ROW_SQL + " WHERE id = ?", (entry["row_id"],)).fetchone()
            if row is None:
                continue  # deleted since: its delete entry follows
            agent, fact = row["agent"], row["fact"]
        else:
            agent, fact = entry["agent"], entry["fact"]
            # Another row may still hold the same writer and text (a fleet writer's duplicate): keep its point.
            row = conn.execute(
                ROW_SQL + " WHERE agent = ? AND fact = ? AND id != ? ORDER BY id LIMIT 1",
                (agent, fact, entry["row_id"]),
            ).fetchone()
        pid = point_id(agent, "long", fact)
        final[pid] = row
        # The point an import came from is replaced by the canonical one: never two points for one record.
        legacy.setdefault(pid, set()).update(
            r[0]
            for r in conn.execute(
                "SELECT point_id FROM qdrant_import WHERE row_id = ? AND content_sha256 = ?",
                (entry["row_id"], sha256(fact)),
            )
        )
    upserts = {pid: row for pid, row in final.items() if row is not None}
    deletes = {pid for pid, row in final.items() if row is None}
    for pid in list(deletes):  # a deleted fact's imported point goes too
        deletes |= legacy.pop(pid, set())
    return upserts, deletes, {pid: ids - set(final) for pid, ids in legacy.items()}


def payload(row: Any) -> dict:
    """Both shapes in one payload: agent/topic/content for old readers, agent_id/importance_score for newer."""
    tags = solos_rank.parse_tags(row["tags"])
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
        backlog = conn.execute("SELECT count(*) FROM qdrant_outbox").fetchone()[0]
        return {"configured": False, "outbox_on": bool(on and on[0] == "on"), "backlog": backlog, "import": imported}

    return store.read(work)


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


def utc_now() -> str:
    import solos_memory

    return solos_memory.utc_now()


def log(event: str, **fields: Any) -> None:
    import solos_memory

    solos_memory.log_event(event, **fields)


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


def run_import(store: Any, target: Target | None) -> int:
    """import-qdrant: progress on stderr, the counts as one JSON line; exit 1 if Qdrant cannot be read."""
    if target is None:
        log("failed", command="import-qdrant", reason="give --qdrant-url or --qdrant-path")
        return 1
    started = time.monotonic()

    def progress(counts: Counter) -> None:
        sys.stderr.write(f"\rimport-qdrant: {sum(counts.values())} points read, {counts['imported']} imported")
        sys.stderr.flush()

    try:
        counts = import_points(store, target, progress)
    except QdrantUnavailable as error:
        log("failed", command="import-qdrant", reason=str(error))
        return 1
    sys.stderr.write("\n")
    summary = {"points": sum(counts.values()), **dict(sorted(counts.items()))}
    print(json.dumps(summary))
    log("imported_qdrant", target=target.describe(), seconds=round(time.monotonic() - started, 2), **summary)
    return 0
