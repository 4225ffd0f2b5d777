"""solos-memory: shared, attributed memory for an agent fleet, over REST and MCP.

Agents write memory in tiers (short-term key/value with a TTL, long-term facts,
episodic events) and recall each other's, every row labelled with who wrote it
and whether it is foreign to the caller. A fourth tier, durable (the fleet's
`persona/<agent>` records), is read-only and private to its agent.

Run: `python3 solos_memory.py serve --register atlas,sol`; test: `make test`.

Data lives in one SQLite file (`--db`, default ./solos.db) shared with the
fleet's other writers, or a PostgreSQL database (`--db postgresql://…`); it is
created from schema.sql (schema_pg.sql) if missing. REST is under /v1, MCP
StreamableHTTP at /mcp, both from the operation table this module assembles
from every capability module's OPERATION_ROWS.

Settings: a flag beats the environment (SOLOS_MEMORY_*), which beats the
default; every one is in the Configuration table of docs/operations.md,
which tests/test_docs.py checks against this module's options.

This module is the spine: config, Memory and the operations that are no module's, the table's assembly, the
REST transport and the CLI. Recall is solos_recall's, the embedding worker solos_embed_worker's; no module
imports this one (tests/test_shape.py).
"""

from __future__ import annotations

import signal
import sys

if __name__ == "__main__":  # Ctrl-C as the modules below load, or before serving: one line, no traceback
    signal.signal(signal.SIGINT, lambda *_: sys.exit("solos-memory: interrupted"))
import argparse
import concurrent.futures
import dataclasses
import functools
import json
import logging
import os
import re
import socket
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import SplitResult, urlsplit

import mcp_bridge
import solos_bounds
import solos_check
import solos_connections
import solos_embed_worker
import solos_events
import solos_forget
import solos_jobs
import solos_judge
import solos_lifecycle
import solos_malloc
import solos_migrate
import solos_operations
import solos_provenance
import solos_qdrant
import solos_rank
import solos_recall
import solos_snapshot
import solos_sqlite
import solos_status
import solos_store
import solos_telemetry
import solos_tokens
import solos_validation
import solos_workers
from solos_connections import http_head
from solos_operations import WRITE_OUTPUT, Operation, object_schema, result_schema, text_field
from solos_store import (
    EMBEDDED_TIERS,
    FTS_TABLES,
    STORAGE_FAILURES,
    TIER_TABLE,
    BadRequest,
    Busy,
    Forbidden,
    JsonLogHandler,
    LengthRequired,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    ProtocolError,
    RequestTimeout,
    SchemaMismatch,
    ServiceError,
    StorageUnavailable,
    Store,
    Unauthorized,
    UnsupportedMediaType,
    error_body,
    log_event,
    primary_code,
)
from solos_tokens import OPERATOR, Tokens
from solos_validation import (
    AGENT_PATTERN,
    AGENT_SCHEMA,
    TAGS_SCHEMA,
    check_args,
    check_head,
    coerce_query,
    describe,
    fully_matches,
    on_off,
    parse_json_body,
    query_pairs,
)

__version__ = solos_store.__version__

# ==== Configuration ====

DEFAULT_PORT = 8437
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class Config:
    """Every setting the service reads, loaded once by main()."""

    db: str = "solos.db"
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    busy_timeout_ms: int = 5000
    allow_remote: bool = False
    tokens_file: str | None = None
    model_dir: str | None = None  # None: the carried default; "off": keyword only
    log_requests: bool = True
    allowed_origins: tuple[str, ...] = ()
    qdrant: solos_qdrant.Target | None = None  # the mirror's target; None: no mirror
    rerank: bool = True  # the learned reranker reorders keyword and hybrid recall's best rows
    copy_name: str | None = None  # None: hostname:port
    admit: int | None = None  # requests running at once, the rest queued; 0: no cap; None: solos_workers.places
    workers: int = 1  # processes answering on the port (solos_workers); 1: this process alone
    worker_socket: str = "shared"  # how workers share the port: one inherited socket, or SO_REUSEPORT
    pin_threads: bool | None = None  # each worker's connection threads on its own cores; None: solos_workers.settled


def env_default(name: str, default: str | None) -> str | None:
    """The SOLOS_MEMORY_<NAME> environment value, else the default."""
    return os.environ.get("SOLOS_MEMORY_" + name, default)


# ==== Embeddings (optional) ====

QUERY_EMBED_TIMEOUT_S = 2.0  # past this, recall answers keyword-only (degraded) rather than wait
# Recall is degraded while more rows than this lack a vector: the fleet's direct writes (10k rows an hour would be
# embedded as they come) never reach it; a bulk import or a stalled embedder does. The worker embeds about
# 200 rows/s on 2 cores (bench/recall_ab.py), so this is a few seconds behind.
DEGRADED_BACKLOG_ROWS = 1000


# ==== Operations ====

KEYWORD_ONLY_REASON = "keyword-only recall: no embedder is loaded"


class Memory:
    """What operations work on: the store, the optional embedder and its vectors, the counters."""

    def __init__(self, store: Store, embedder: Any = None, embedder_error: str | None = None, rerank: bool = True):
        self.store, self.rerank, self.embedder = store, rerank, embedder
        self.embedder_error = embedder_error or (None if embedder else KEYWORD_ONLY_REASON)
        self.stats = solos_telemetry.Stats()
        self.copy = socket.gethostname()  # which copy this is (MemoryServer adds the port, or --copy-name)
        self.serving: dict = {}  # workers: how many, and which this is (solos_workers.Worker.describe)
        self.activity = solos_status.Activity(store)
        self.vectors = solos_rank.VectorIndex(embedder.model_id, [t.name for t in EMBEDDED_TIERS]) if embedder else None
        self.common_words = solos_rank.CommonWords(store)
        self.judge = solos_judge.load(solos_judge.JUDGE_PATH)  # once; its sha256 checked; never raises
        self.worker = solos_embed_worker.EmbedWorker(store, embedder) if embedder else None
        self.query_pool = concurrent.futures.ThreadPoolExecutor(1, "embed-query") if embedder else None
        self.stuck_query: concurrent.futures.Future | None = None
        self.mirror: solos_qdrant.Mirror | None = None
        if self.worker:
            self.worker.start()
        self.scrubber = solos_forget.Scrubber(store)
        self.events = solos_events.EventHub(store, self.scrubber)
        self.deliveries = self.events.deliveries = solos_provenance.DeliveryLog(store)
        self.near = solos_provenance.NearDuplicates()
        self.events.forgotten_elsewhere = lambda: solos_forget.forgotten_elsewhere(self)

    def embedder_state(self, paths: bool = False) -> dict:
        """The embedder's state: one answer for /health, /v1/stats, /metrics, the startup line and recall.

        Machine paths (the interpreter, the model folder) only with `paths`: the operator's view; /health
        answers anyone who can reach it."""
        worker, backlog = self.worker, self.worker.backlog if self.worker else None
        state, reason = ("off", self.embedder_error) if worker is None else ("ready", None)
        if worker and self.stuck_query is not None and not self.stuck_query.done():
            state, reason = "busy", "keyword-only recall: the embedder is still busy with a query that timed out"
        elif worker and worker.last_error:
            state, reason = "failing", f"rows without a vector rank by keywords: embedding failed ({worker.last_error})"
        elif backlog and backlog > DEGRADED_BACKLOG_ROWS:
            state, reason = (
                "catching_up",
                (
                    f"catching up: {backlog} rows without a vector yet, over {DEGRADED_BACKLOG_ROWS} "
                    "(embedding them now; until then they rank by keywords)"
                ),
            )
        elif backlog:  # a few of the fleet's direct writes: each recall's receipt counts those it met
            state = "catching_up"
        reason = reason if paths or reason is None else solos_status.without_paths(reason)
        return {"embedder_state": state, "embed_backlog": backlog, "degraded": bool(reason), "degraded_reason": reason}

    def written(self, tier: str | None = None, row_id: int | None = None, embedded: bool = False) -> None:
        """A row was written (or removed: no row): embed it unless its write did, before it is acknowledged; wake."""
        if self.worker and tier is not None and row_id is not None:
            if not embedded:
                self.worker.embed_written(tier, row_id, self.vectors)
            self.worker.wake.set()  # as before: a write also has the fleet's direct writes looked for
        self.events.written()

    def write(self, tier: str, args: dict, write: Callable[..., dict]) -> dict:
        """write(vector=…) with the row's vector embedded first, so row and vector commit together (one commit)."""
        vector = self.worker.embed_first(tier, args) if self.worker else None
        outcome = write(vector=vector)
        indexed = self.vectors is not None and self.vectors.written(self.store, TIER_TABLE[tier], args, outcome, vector)
        self.written(tier, outcome["id"], indexed)
        return outcome

    def start_embedding(self, text: str) -> Callable[[], tuple[Any, str | None]]:
        """Start embedding a question; the call returned waits for its vector, or None and why (no embedder,
        still busy, failed, or over QUERY_EMBED_TIMEOUT_S from now). Recall starts it before its read, so the
        model runs beside the keyword leg instead of before it."""
        if self.embedder is None:
            return lambda: (None, self.embedder_error)
        if self.stuck_query is not None and not self.stuck_query.done():
            return lambda: (None, "keyword-only recall: the embedder is still busy with a query that timed out")
        assert self.query_pool is not None  # set whenever embedder is
        future = self.query_pool.submit(self.embedder.embed, [text])
        deadline = time.monotonic() + QUERY_EMBED_TIMEOUT_S

        @functools.cache  # a read retried after busy asks again
        def vector() -> tuple[Any, str | None]:
            try:
                blob = future.result(timeout=max(0.0, deadline - time.monotonic()))[0]
            except concurrent.futures.TimeoutError:
                self.stuck_query = future  # later queries degrade at once instead of queueing behind it
                return None, f"keyword-only recall: the embedder took over {QUERY_EMBED_TIMEOUT_S} s"
            except Exception as error:
                return None, f"keyword-only recall: the embedder failed ({type(error).__name__}: {error})"
            import numpy as np

            return np.frombuffer(blob, dtype="<f4"), None

        return vector

    def close(self) -> None:
        self.activity.close()
        self.events.stop()
        self.deliveries.close()
        if self.worker:
            self.worker.stop()
        if self.query_pool:
            self.query_pool.shutdown(wait=False, cancel_futures=True)
        self.common_words.close()
        if self.mirror:
            self.mirror.stop()
            self.mirror.join(timeout=10)  # it closes its client: a local-mode folder is unlocked after this
        self.store.close()


def op_write_short(memory: Memory, args: dict) -> dict:
    """Write a short-term key/value for the calling agent, expiring after ttl_s seconds.

    Upserts on (agent, key): writing the same key again replaces the value and
    restarts its TTL. Expired keys are never recalled.
    """
    put = functools.partial(memory.store.upsert_short, args["agent"], args["key"], args["value"], args["ttl_s"])
    outcome = memory.write("short", args, functools.partial(put, args["tags"] or []))
    return {"tier": "short", "agent": args["agent"], "key": args["key"], **outcome}


def op_write_long(memory: Memory, args: dict) -> dict:
    """Store a long-term fact attributed to the calling agent.

    The write key is the fact's full content: the same fact from the same
    agent updates one row (topic, source, confidence, tags), and an identical
    retry answers `unchanged` and changes nothing; a different fact is a new
    row, however long a prefix the two share.
    """
    put = functools.partial(memory.store.upsert_long, args["agent"], args["topic"], args["fact"], args["source"])
    outcome = memory.write("long", args, functools.partial(put, args["confidence"], args["tags"] or []))
    return {"tier": "long", "agent": args["agent"], **outcome}


def op_write_episodic(memory: Memory, args: dict) -> dict:
    """Append an episodic event (what happened, how it went) for the calling agent.

    Give an idempotency_key to make retries safe: a retried write with the
    same key and content returns the first row (status `unchanged`).
    """
    event = {name: args[name] for name in ("event_type", "summary", "details", "outcome", "duration_s")}
    put = functools.partial(memory.store.append_episodic, args["agent"], event, args["idempotency_key"])
    outcome = memory.write("episodic", args, put)
    return {"tier": "episodic", "agent": args["agent"], **outcome}


def op_delete_short(memory: Memory, args: dict) -> dict:
    """Delete one of the calling agent's short-term keys (never another agent's)."""
    outcome = memory.store.delete_short(args["agent"], args["key"], memory.events.note_removal)
    solos_rank.drop_kept_texts()
    return {"tier": "short", "agent": args["agent"], "key": args["key"], **outcome}


def op_set_sharing(memory: Memory, args: dict) -> dict:
    """Opt the calling agent's episodic memory in to (or out of) recall by other agents.

    Off by default. While on, every episodic row another agent recalls is
    written to an audit log the author can read with read_audit.
    """
    outcome = memory.store.set_sharing(args["agent"], args["episodic"])
    return {"agent": args["agent"], "episodic": args["episodic"], **outcome}


def op_read_audit(memory: Memory, args: dict) -> dict:
    """List who read the calling agent's episodic rows, newest first."""
    reads = memory.store.read_audit(args["agent"], args["limit"], args["before_id"])
    return {"agent": args["agent"], "count": len(reads), "reads": reads}


def op_read_stats(memory: Memory, args: dict) -> dict:
    """Counts per tier, embed backlog, degraded state, counters, agents' writes and recalls (hour, day, and
    per hour with recall latency), and the daily jobs' last runs.

    An agent sees its own recent rejections and activity only; the operator view (the operator token, or
    no agent named under loopback trust) sees everyone's.
    """
    embedder, snapshot = memory.embedder, memory.stats.snapshot()
    snapshot["recent_rejections"] = [r for r in snapshot["recent_rejections"] if args["agent"] in (None, r["agent"])]
    answer = {
        "version": __version__,
        "copy": memory.copy,
        **memory.serving,
        "view": "operator" if args["agent"] is None else "agent",
        **memory.store.counts(),
        **snapshot,
        "embedder": embedder.model_id if embedder else None,
        "vectors": memory.store.count_vectors(embedder.model_id) if embedder else {},
        "embed_error": memory.worker.last_error if memory.worker else None,
        **memory.embedder_state(paths=args["agent"] is None),
        "judge": memory.judge.state(),
        "activity": memory.activity.snapshot(memory.store.writes_by_hour(), args["agent"]),
        "qdrant": solos_qdrant.mirror_status(memory.store, memory.mirror),
        **memory.store.read(memory.store.queries.lifecycle_counts),
        "event_streams": memory.events.stats(),
        "delivery_log": memory.deliveries.stats(),
        "jobs": memory.store.read(lambda conn: solos_jobs.status(memory.store.queries, conn)),
    }
    return solos_status.for_caller(args["agent"] is None, answer)  # an agent's: no machine paths in messages


# ==== Operation table ====

OPERATION_ROWS = (
    Operation(
        "write_short",
        "POST",
        "/v1/short",
        op_write_short,
        object_schema(
            {
                "agent": AGENT_SCHEMA,
                "key": text_field("The key, unique per agent.", 256, 1),
                "value": text_field("The value (text).", 16_384, 1),
                "ttl_s": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "maximum": 31_536_000,
                    "default": 86_400,
                    "description": "Seconds until it expires (default one day, at most a year).",
                },
                "tags": TAGS_SCHEMA,
            },
            ("agent", "key", "value"),
        ),
        WRITE_OUTPUT,
        writes=True,
        idempotent=True,
        title="Write short-term memory",
    ),
    Operation(
        "write_long",
        "POST",
        "/v1/long",
        op_write_long,
        object_schema(
            {
                "agent": AGENT_SCHEMA,
                "topic": text_field("What the fact is about.", 256),
                "fact": text_field("The fact, one statement.", 8_192, 1),
                "source": text_field("Where it came from (URL, file, conversation).", 512),
                "confidence": {"type": "number", "minimum": 0, "maximum": 1, "description": "How sure, 0-1."},
                "tags": TAGS_SCHEMA,
            },
            ("agent", "fact"),
        ),
        WRITE_OUTPUT,
        writes=True,
        idempotent=True,
        title="Write a long-term fact",
    ),
    Operation(
        "write_episodic",
        "POST",
        "/v1/episodic",
        op_write_episodic,
        object_schema(
            {
                "agent": AGENT_SCHEMA,
                "event_type": text_field("Kind of event (task, error, …).", 64, 1),
                "summary": text_field("What happened.", 4_096, 1),
                "details": text_field("More detail.", 16_384),
                "outcome": text_field("How it ended.", 1_024),
                "duration_s": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": 31_536_000,
                    "description": "How long it took.",
                },
                "idempotency_key": text_field("Makes a retried write safe: same key, same event, one row.", 128, 1),
            },
            ("agent", "event_type", "summary"),
        ),
        WRITE_OUTPUT,
        writes=True,
        idempotent=False,
        title="Append an episodic event",
    ),
    Operation(
        "delete_short",
        "DELETE",
        "/v1/short",
        op_delete_short,
        object_schema(
            {
                "agent": AGENT_SCHEMA,
                "key": text_field("The key to delete.", 256, 1),
            },
            ("agent", "key"),
        ),
        WRITE_OUTPUT,
        writes=True,
        idempotent=True,
        destructive=True,
        title="Delete a short-term key",
    ),
    Operation(
        "set_sharing",
        "PUT",
        "/v1/sharing",
        op_set_sharing,
        object_schema(
            {
                "agent": AGENT_SCHEMA,
                "episodic": {
                    "type": "boolean",
                    "description": "true: other agents may recall my episodic rows (audited).",
                },
            },
            ("agent", "episodic"),
        ),
        result_schema(
            {
                "agent": {"type": "string"},
                "episodic": {"type": "boolean"},
                "status": {"type": "string", "enum": ["created", "updated"]},
            }
        ),
        writes=True,
        idempotent=True,
        title="Share episodic memory",
    ),
    Operation(
        "read_audit",
        "GET",
        "/v1/audit",
        op_read_audit,
        object_schema(
            {
                "agent": AGENT_SCHEMA,
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 1000,
                    "default": 100,
                    "description": "At most this many, 1-1000.",
                },
                "before_id": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": solos_bounds.MAX_ID,
                    "description": "Page: only reads with a smaller id.",
                },
            }
        ),
        result_schema(
            {
                "agent": {"type": "string"},
                "count": {"type": "integer"},
                "reads": {
                    "type": "array",
                    "items": result_schema(
                        {
                            "id": {"type": "integer"},
                            "reader": {"type": "string"},
                            "author": {"type": "string"},
                            "row_id": {"type": "integer"},
                            "read_at": {"type": "string"},
                        }
                    ),
                },
            }
        ),
        writes=False,
        idempotent=True,
        title="Who read my episodes",
    ),
    Operation(
        "stats",
        "GET",
        "/v1/stats",
        op_read_stats,
        object_schema(
            {
                "agent": {
                    **AGENT_SCHEMA,
                    "description": "Show only this agent's recent rejections; set by the token when tokens are on.",
                }
            },
            (),
        ),
        result_schema(
            {
                "version": {"type": "string"},
                "rows": {"type": "object"},
                "calls": {"type": "object"},
                "rejections": {"type": "object"},
                "recall_hits": {"type": "object"},
                "duplicates_suppressed": {"type": "integer"},
                "degraded": {"type": "boolean"},
            }
        ),
        writes=False,
        idempotent=True,
        title="Service statistics",
        operator=True,
    ),
)
OPERATIONS = solos_operations.table(
    solos_recall.OPERATION_ROWS,
    OPERATION_ROWS,
    solos_lifecycle.OPERATION_ROWS,
    solos_forget.OPERATION_ROWS,
    solos_events.OPERATION_ROWS,
    solos_provenance.OPERATION_ROWS,
)
ROUTES = {(op.method, op.path): op for op in OPERATIONS.values()}
WRITES = {route for route, op in ROUTES.items() if op.writes}  # their own admission lane (solos_connections)


def validate_for(name: str, args: dict) -> dict:
    """An operation's argument check, for the modules that write rows outside a request (import-qdrant)."""
    return check_args(OPERATIONS[name].input_schema, args)


def invoke(memory: Memory, tokens: Tokens | None, op: Operation, raw_args: Any, headers: Mapping[str, str]) -> dict:
    """Authenticate, validate and run one operation; count and log refusals.

    The one path both transports take, so validation, identity and errors
    live once.
    """
    claimed = raw_args.get("agent") if isinstance(raw_args, dict) else None
    # Who the rejection log names: loopback trust's claimed agent if it is a name (else `claimed_agent`, kept short)
    agent = claimed if not tokens and isinstance(claimed, str) and fully_matches(AGENT_PATTERN, claimed) else None
    memory.stats.count("calls", op.name)
    try:
        if tokens:  # a tokens file, or tokens kept in the database (on while any exists)
            caller = agent = tokens.agent_for(headers.get("Authorization"))
            if caller == OPERATOR:
                if not op.operator:
                    raise Forbidden(f"the operator token may not call {op.name}; agents use their own", "agent")
                if claimed is not None:  # it speaks for no agent: naming one would open that agent's own view
                    raise Forbidden(f"the operator token speaks for no agent, not {describe(claimed)}", "agent")
            elif "agent" in op.input_schema["properties"] and isinstance(raw_args, dict):
                if claimed not in (None, caller):
                    raise Forbidden(f"the token belongs to {caller!r}, not {describe(claimed)}", "agent")
                raw_args = {**raw_args, "agent": caller}
        args = check_args(op.input_schema, raw_args)
        return op.function(memory, args)
    except ServiceError as error:
        memory.stats.reject(agent, op.name, error, claimed)
        raise


# ==== Transport: REST /v1 (and mounting /mcp) ====

# The largest valid write (write_episodic: 21,696 characters of text) in the largest JSON a client may send
# it as: ASCII JSON, Python's json default (requests, solos_langgraph.py), spells an emoji as a 12-byte
# surrogate pair (\ud83d\ude00), so about 255 KiB; 320 KiB admits every valid write and stops a
# memory-hungry body early. The cap before, 128 KiB sized at 6 bytes a character, refused 16 KiB emoji values.
MAX_BODY_BYTES = 320 * 1024
# The whole body, not each byte: a per-read timeout let a client hold a thread forever at one byte per 29 s.
# 320 KiB in 10 s is 33 KB/s, far below any loopback or LAN client.
BODY_DEADLINE_S = 10
SERVED_METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")


def degraded_header(result: dict) -> dict[str, str]:
    return {"X-Memory-Degraded": "true" if result["degraded"] else "false"} if "degraded" in result else {}


class MemoryHandler(solos_connections.BoundedHead, BaseHTTPRequestHandler):
    """Answers every request itself: JSON bodies, Content-Length, one write per response."""

    protocol_version = "HTTP/1.1"
    server_version = "solos-memory/" + __version__
    timeout = solos_connections.KEEPALIVE_IDLE_S
    server: MemoryServer
    started: float | None = None  # when the current request's route() began
    unsent = b""  # the answer respond() made, written by send_unsent()

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.idle(self.connection)

    def finish(self) -> None:
        self.server.forget(self.connection)
        super().finish()

    def do_GET(self) -> None:
        self.route()

    do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = do_GET  # = SERVED_METHODS

    def log_message(self, format: str, *args: Any) -> None:
        """http.server's own messages (bad request lines) as JSON lines."""
        log_event("http", client=self.client_address[0], message=format % args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Malformed request lines and headers get JSON, not http.server's HTML page.

        A method nobody serves (TRACE, BREW) is the client's mistake: 405 with Allow, not 501.
        """
        self.close_connection = True
        error: ServiceError
        if code == HTTPStatus.NOT_IMPLEMENTED:
            error = MethodNotAllowed(f"{self.command} is not a method this service answers", list(SERVED_METHODS))
        else:
            error = ProtocolError(code, explain or message)  # http.server's explain says which bound (431)
        self.respond(*self.refused(urlsplit(getattr(self, "path", "")), error, None), error.headers())
        self.send_unsent()

    def respond(
        self,
        status: int,
        payload: dict | bytes | None,
        headers: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        body = payload if isinstance(payload, bytes) else b"" if payload is None else json.dumps(payload).encode()
        fields = {"Server": self.server_version, "Date": self.date_time_string()}
        if body or status not in (202, 204):
            fields["Content-Type"] = content_type
        fields["Content-Length"] = str(len(body))
        fields.update(headers or {})
        fields.update(self.server.worker_header)
        if self.close_connection or self.server.stopping:  # stopping: the client sends no next request on it
            fields["Connection"] = "close"
        head = http_head(status, fields)
        self.status_sent = status
        self.count_request()  # before the write: a client that reads /metrics next must see this one
        self.unsent = head if self.command == "HEAD" else head + body

    def send_unsent(self) -> None:
        """The answer in one write (headers and body apart meet Nagle + delayed ACK: ~40 ms), then forgotten."""
        answer, self.unsent = self.unsent, b""
        self.server.sending(self.connection)
        try:
            self.wfile.write(answer)
        except OSError:  # the client went away (or was evicted as idle); nothing left to tell it
            self.close_connection = True

    def count_request(self) -> None:
        """Requests by route, method and status, and their latency, for /metrics."""
        path = urlsplit(self.path).path if getattr(self, "path", None) else ""
        route = path if path in KNOWN_PATHS else "other"  # bounded label sets: a client's junk never adds a series
        method = self.command if self.command in SERVED_METHODS else "other"
        started = getattr(self, "started", None) or time.perf_counter()
        self.server.memory.stats.observe(route, method, self.status_sent, time.perf_counter() - started)
        self.started = None

    def route(self) -> None:
        if self.request_version == "HTTP/0.9":  # no headers, no status line: a line cut short, not a client
            self.close_connection = True
            return
        started = self.started = time.perf_counter()
        self.status_sent = 0
        url = urlsplit(self.path)
        body: bytes | None = None  # until read, an error must close the connection: its body is unread
        try:
            check_head(self.headers)
            if url.path != "/mcp":  # the bridge applies the same rule and answers in JSON-RPC
                asked, server = cast(Mapping[str, str], self.headers), self.server  # SERVED: pages, documents
                refusal = mcp_bridge.foreign_caller(asked, server.allowed_hosts, server.origins, url.path in SERVED)
                if refusal is not None:
                    raise Forbidden(refusal, "Host" if refusal.startswith("Host") else "Origin")
            body = self.read_body()
            self.server.working(self.connection)  # in flight: not to be evicted (Busy once a stop has begun)
            if url.path == "/v1/events" and "text/event-stream" in self.headers.get("Accept", ""):
                self.serve_stream(url.query)  # long-lived, outside the admission cap, as are the documents and page
            else:
                exempt, writes = url.path in UNQUEUED, (self.command, url.path) in WRITES
                if url.path == "/mcp":  # by what it calls: no tool, at once; a writing tool, the writes' lane
                    exempt, writes = self.server.bridge.admission(body, cast(Mapping[str, str], self.headers))
                with self.server.admitted(exempt=exempt, writes=writes):
                    SERVED.get(url.path, MemoryHandler.call_operation)(self, url, body)
        except ServiceError as error:
            if body is None:
                self.close_connection = True  # what follows on the socket cannot be told from this body
            if not error.counted:
                self.server.memory.stats.reject(None, f"{self.command} {url.path}"[:200], error)
            self.respond(*self.refused(url, error, body), error.headers())
        except Exception:
            logging.exception("unexpected error on %s %s", self.command, url.path)
            self.close_connection = True
            self.respond(*self.refused(url, ServiceError("internal error; see the service log"), body))
        finally:  # the answer goes out once its admission place is given back: a client that reads none holds none
            self.send_unsent()
            self.server.idle(self.connection, served=True)
            if self.server.config.log_requests:
                log_event(
                    "request",
                    method=self.command,
                    path=url.path,
                    status=self.status_sent,
                    ms=round((time.perf_counter() - started) * 1000, 2),
                )

    def refused(self, url: SplitResult, error: ServiceError, body: bytes | None) -> tuple[int, dict | None]:
        """The error's status and one JSON shape; on /mcp a JSON-RPC error (mcp_bridge.refusal), send_error's too."""
        reply, headers = error_body(error), cast(Mapping[str, str], getattr(self, "headers", {}))  # send_error: none
        return mcp_bridge.refusal(reply["error"], headers, body) if url.path == "/mcp" else (error.status, reply)

    def serve_stream(self, query: str) -> None:
        """GET /v1/events with Accept: text/event-stream: read_events' checks and filter, then events as they commit.

        Refusals raise the service's errors (JSON 4xx/503, before any event byte).
        A stream gives its connection slot back while it lasts: it counts against MAX_SUBSCRIBERS instead.
        """
        self.only(("GET",))
        resume = solos_events.last_event_id(self.headers.get("Last-Event-ID"))  # it wins over the URL's since
        op = OPERATIONS["read_events"]
        pairs = [(k, v) for k, v in query_pairs(query) if resume is None or k != "since"]
        args = coerce_query(op.input_schema, pairs + ([("since", resume.strip())] if resume else []))
        server = self.server
        subscribe = dataclasses.replace(
            op,
            function=lambda memory, checked: {
                "pattern": solos_events.event_pattern(memory, checked),
                "since": checked["since"],
            },
        )
        checked = invoke(server.memory, server.tokens, subscribe, args, cast(Mapping[str, str], self.headers))
        confirm = server.tokens is not None and functools.partial(server.tokens.confirm, self.headers["Authorization"])
        subscriber = server.memory.events.subscribe(checked["pattern"], self.connection, confirm or None)
        if subscriber is None:
            raise Busy(f"{server.memory.events.max_subscribers} event streams are open: the cap", reason="streams")
        self.close_connection = True
        server.unslot(self.connection)
        self.status_sent = 200
        self.count_request()
        fields = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-store"}
        head = http_head(200, {**fields, "X-Accel-Buffering": "no", "Connection": "close", **server.worker_header})
        server.memory.events.stream(subscriber, checked["since"], self.wfile.write, head)

    def only(self, methods: tuple[str, ...]) -> None:
        if self.command not in methods:
            raise MethodNotAllowed(f"{self.command} is not allowed on {urlsplit(self.path).path}", list(methods))

    def serve_document(self, url: SplitResult, body: bytes) -> None:
        """/health, /openapi.json, /metrics: documents about the service itself."""
        self.only(("GET", "HEAD"))
        content_type, produce = SERVICE_DOCUMENTS[url.path]
        self.respond(200, produce(self.server), content_type=content_type)

    def serve_status(self, url: SplitResult, body: bytes) -> None:
        """The status page: what /v1/stats shows the same caller, readable."""
        self.only(("GET", "HEAD"))
        server = self.server
        stats = lambda auth: invoke(server.memory, server.tokens, OPERATIONS["stats"], {}, auth)  # noqa: E731
        page = solos_status.serve_page(self.headers.get("Authorization"), stats, server.health, Unauthorized)
        self.respond(*page, content_type="text/html; charset=utf-8")

    def serve_mcp(self, url: SplitResult, body: bytes) -> None:
        """/mcp: the bridge answers from the same operation table."""
        asked, bridge = cast(Mapping[str, str], self.headers), self.server.bridge
        if self.server.tokens and self.command == "POST" and bridge.admits(asked):  # a foreign Host: 403 first
            # Refused at the door, not per tool: Hermes says "not connected", not tripping its breaker on calls.
            self.server.tokens.agent_for(asked.get("Authorization"))
        status, headers, reply = bridge.handle(self.command, asked, body)
        self.respond(status, reply or None, headers, headers.pop("Content-Type", "application/json"))

    def call_operation(self, url: SplitResult, body: bytes) -> None:
        """/v1/...: one operation of the table, its arguments from the query (GET, DELETE) or the JSON body."""
        path, query = url.path, url.query
        op = ROUTES.get((self.command, path))
        if op is None:
            allowed = [method for method, route in ROUTES if route == path]
            if allowed:
                raise MethodNotAllowed(f"{self.command} is not allowed on {path}", allowed)
            raise NotFound(f"no route {path}; see README.md for the API")
        if op.method in ("GET", "DELETE"):
            args: Any = coerce_query(op.input_schema, query_pairs(query))
        else:
            content_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
            if content_type != "application/json":
                raise UnsupportedMediaType(
                    f"Content-Type must be application/json, got {describe(content_type)}", "Content-Type"
                )
            args = parse_json_body(body)
        result = invoke(self.server.memory, self.server.tokens, op, args, cast(Mapping[str, str], self.headers))
        self.respond(201 if result.get("status") == "created" else 200, result, degraded_header(result))

    def read_body(self) -> bytes:
        """The whole request body, strictly framed, capped at MAX_BODY_BYTES and read within BODY_DEADLINE_S.

        Every request's body is read (or the connection closed) before it is answered, so no body can be
        taken for the next request on a kept-alive connection.
        """
        if self.headers.get("Transfer-Encoding") is not None:
            if "chunked" in self.headers["Transfer-Encoding"].lower():
                raise LengthRequired("chunked bodies are not accepted; send Content-Length", "Content-Length")
            raise BadRequest("Transfer-Encoding is not accepted; send Content-Length", "Transfer-Encoding")
        lengths = self.headers.get_all("Content-Length") or []
        if not lengths:  # a method the path does not take (any PATCH, PUT /v1/recall) gets 405 with Allow, not 411
            route = (self.command, urlsplit(self.path).path)
            if route in ROUTES and self.command in ("POST", "PUT") or route == ("POST", "/mcp"):
                raise LengthRequired(f"a {self.command} needs a body with Content-Length", "Content-Length")
            return b""
        if len(lengths) > 1 or "," in lengths[0]:  # even "N, N", which RFC 9110 lets a server accept: one framing
            raise BadRequest(f"Content-Length must be one number, got {describe(', '.join(lengths))}", "Content-Length")
        raw_length = lengths[0].strip()
        if not re.fullmatch(r"[0-9]{1,15}", raw_length):  # not isdigit(): it admits '²', which int() refuses
            raise BadRequest(f"Content-Length must be a number, got {describe(raw_length)}", "Content-Length")
        length = int(raw_length)
        if length > MAX_BODY_BYTES:
            raise PayloadTooLarge(f"body is {length} bytes; the limit is {MAX_BODY_BYTES}", "body")
        chunks, received = [], 0
        deadline = time.monotonic() + BODY_DEADLINE_S
        self.server.receiving(self.connection)
        try:
            while received < length:
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    raise RequestTimeout(f"the body did not arrive within {BODY_DEADLINE_S} s", "body")
                self.connection.settimeout(remaining_s)
                try:
                    chunk = self.rfile.read1(length - received)
                except TimeoutError:
                    raise RequestTimeout(f"the body did not arrive within {BODY_DEADLINE_S} s", "body") from None
                except OSError:
                    chunk = b""
                if not chunk:
                    raise BadRequest("body ended before Content-Length bytes arrived", "body")
                chunks.append(chunk)
                received += len(chunk)
                self.server.received(self.connection, received)
        finally:
            self.connection.settimeout(solos_connections.KEEPALIVE_IDLE_S)
        return b"".join(chunks)


ERROR_FIELDS = {"code": {"type": "string"}, "status": {"type": "integer"}, "message": {"type": "string"}}
ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": result_schema(ERROR_FIELDS)}}


# Documents about the service itself, served on GET next to the operations.
SERVICE_DOCUMENTS: dict[str, tuple[str, Callable[[MemoryServer], Any]]] = {
    "/health": ("application/json", lambda server: server.health()),
    "/openapi.json": (
        "application/json",
        lambda server: solos_telemetry.openapi_document(OPERATIONS, __version__, ERROR_SCHEMA),
    ),
    "/metrics": (
        "text/plain; version=0.0.4; charset=utf-8",
        lambda server: solos_telemetry.metrics_text(server.memory),
    ),
}
STATUS_PAGES = ("/", "/status")  # the operator's page (solos_status.py)
# Paths that are not operations, and who serves them; any other path is an operation's (ROUTES) or a 404.
SERVED: dict[str, Callable[[MemoryHandler, SplitResult, bytes], None]] = {
    **dict.fromkeys(SERVICE_DOCUMENTS, MemoryHandler.serve_document),
    **dict.fromkeys(STATUS_PAGES, MemoryHandler.serve_status),
    "/mcp": MemoryHandler.serve_mcp,
}
UNQUEUED = {*SERVICE_DOCUMENTS, *STATUS_PAGES, "/v1/stats"}  # answered at once however busy: they show the queue
KNOWN_PATHS = {*SERVICE_DOCUMENTS, *STATUS_PAGES, "/mcp", *(op.path for op in OPERATIONS.values())}


def mcp_tools(operations: Mapping[str, Operation]) -> list[mcp_bridge.Tool]:
    """The MCP tool list, one per operation, with the operation's own schema."""
    return [
        mcp_bridge.Tool(
            name=op.name,
            title=op.title,
            description=op.description,
            input_schema=op.input_schema,
            output_schema=op.output_schema,
            annotations={
                "readOnlyHint": not op.writes,
                "destructiveHint": op.destructive,
                "idempotentHint": op.idempotent,
                "openWorldHint": False,
            },
        )
        for op in operations.values()
    ]


class MemoryServer(solos_connections.BoundedConnections, solos_workers.WorkerSocket, ThreadingHTTPServer):
    """ThreadingHTTPServer with bounded threads, the memory, and /mcp mounted; a worker's socket is shared."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    hold: solos_snapshot.Hold | None = None  # the lock a restore checks; released once the database is closed
    memory: Memory

    def __init__(self, config: Config, memory: Memory, tokens: Tokens | None, worker: Any = None):
        self.address_family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        self.config, self.memory, self.tokens = config, memory, tokens  # before binding: a failed bind closes them
        self.worker = worker  # solos_workers.Worker: its socket is the supervisor's, or SO_REUSEPORT's
        super().__init__((config.host, worker.port if worker else config.port), MemoryHandler)
        self.port = self.server_address[1]
        memory.copy = config.copy_name or f"{socket.gethostname()}:{self.port}"
        self.worker_header = {"X-Memory-Worker": str(worker.index)} if worker else {}
        self.bound_connections(solos_workers.places(config, worker))
        memory.stats.load = self.load  # in-flight requests and queueing, for /v1/stats and the page
        names = [
            f"{name}:{self.port}" if ":" not in name else f"[{name}]:{self.port}"
            for name in {config.host, *LOOPBACK_HOSTS}
        ]
        # An extra allowed origin (a page or proxy the operator trusts) brings its host name with it.
        origins = [*(f"http://{name}" for name in names), *config.allowed_origins]
        self.origins = frozenset(origin.lower() for origin in origins)
        self.allowed_hosts = frozenset([*names, *(urlsplit(origin).netloc.lower() for origin in self.origins)])
        self.bridge = mcp_bridge.McpBridge(
            mcp_tools(OPERATIONS),
            self.call_tool,
            server_name="solos-memory",
            server_version=__version__,
            allowed_hosts=self.allowed_hosts,
            allowed_origins=self.origins,
            instructions="Shared fleet memory. Call recall before answering from memory; "
            "write_long for durable facts, write_short for scratch state, write_episodic for events.",
        )

    def server_close(self) -> None:
        super().server_close()
        self.memory.close()
        if self.hold:
            self.hold.release()

    def call_tool(self, name: str, arguments: dict, headers: Mapping[str, str]) -> mcp_bridge.ToolOutcome:
        try:
            result = invoke(self.memory, self.tokens, OPERATIONS[name], arguments, headers)
        except ServiceError as error:
            return mcp_bridge.ToolOutcome(error_body(error), True, {})
        return mcp_bridge.ToolOutcome(result, False, degraded_header(result))

    def health(self) -> dict:
        return {
            "status": "ok",
            "version": __version__,
            "copy": self.memory.copy,
            **self.memory.serving,
            "auth": "tokens" if self.tokens else "loopback-trust",
            **self.memory.embedder_state(),
            "judge": solos_status.without_paths_in(self.memory.judge.state()),  # as recall's receipts say it
            "event_cursor": self.memory.store.event_cursor()["state"],  # PostgreSQL: stalled, skipping (stats)
            "keyword_index": self.memory.store.keyword_index_state(),  # PostgreSQL: filling, ready, failing
            "storage": self.memory.store.storage_state(),  # failing for a minute after a full disk or a lost server
        }

    def refusal(self) -> bytes:
        """The whole 503 answer for a newcomer no slot can be made for; counted."""
        self.memory.stats.count("rejections", "too_many_connections")
        error = Busy("too many connections are working; retry shortly")
        body = json.dumps(error_body(error)).encode()
        fields = {"Content-Type": "application/json", "Connection": "close", **error.headers()}
        return http_head(503, {**fields, "Content-Length": str(len(body))}) + body

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A dropped connection is one log line; anything else keeps its traceback in the log."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            log_event("connection_error", client=client_address[0], error=type(error).__name__)
        else:
            logging.exception("unexpected error serving %s", client_address[0])


# ==== Server and CLI ====


def load_embedder(config: Config, threads: int | None = 1) -> tuple[Any, str | None]:
    """The optional embedder, or None and the reason it is not there.

    The service runs it on one thread: a default pool's spinning threads
    slowed the vector search after a query 5x on a 2-core host, and one
    thread embeds a question fastest (bench/service_rss.py). Batch backfill,
    a process of its own, leaves the choice to solos_embed (threads=None).
    """
    if config.model_dir == "off":
        return None, "keyword-only recall: embeddings are turned off (--model-dir off)"
    try:
        import solos_embed
    except ImportError as error:
        return None, f"keyword-only recall: {error}"
    try:
        return solos_embed.load_embedder(config.model_dir, threads=threads), None
    except solos_embed.EmbeddingsUnavailable as error:
        return None, f"keyword-only recall: {error}"


def open_store(config: Config, admin: bool = False) -> Store:
    """The database, migrated (additively); a PostgreSQL URL loads solos_store_pg (and psycopg) only then."""
    if solos_store.is_postgres(config.db):
        try:
            import solos_store_pg
        except ImportError as error:
            raise StorageUnavailable(
                f"a PostgreSQL database needs psycopg 3 ({error}): {solos_store.PSYCOPG}"
            ) from None
        store: Store = solos_store_pg.PgStore(config.db, config.busy_timeout_ms, admin)
    else:
        solos_snapshot.create_private(config.db)  # a new database, and so its -wal and -shm, is its owner's alone
        store = Store(config.db, config.busy_timeout_ms, admin)
    store.migrate()
    return store


def register_agents(config: Config, names: list[str]) -> list[str]:
    """Register agents through a short-lived admin store (never the serving one)."""
    store = open_store(config, admin=True)
    try:
        return store.register_agents(check_agent_names(names))
    finally:
        store.close()


def build_server(config: Config, register: Sequence[str] = ()) -> MemoryServer:
    """Hold the database (a restore refuses while the service runs), then open it and bind (open_server)."""
    hold = hold_database(config)
    try:
        server = open_server(config, register)
    except BaseException:
        if hold:
            hold.release()
        raise
    server.hold = hold
    return server


def hold_database(config: Config) -> solos_snapshot.Hold | None:
    """The lock a restore checks (SQLite; None on PostgreSQL: pg_restore is the operator's, not restore's)."""
    if solos_store.is_postgres(config.db):
        if config.qdrant:
            raise SystemExit("the Qdrant mirror runs on SQLite only; drop --qdrant-url/--qdrant-path for PostgreSQL")
        return None
    if config.qdrant and config.workers > 1:
        raise SystemExit("the Qdrant mirror runs in one process: drop --workers, or the mirror")
    try:
        hold = solos_snapshot.hold_database(config.db, tokens_on=config.tokens_file is not None)
    except solos_snapshot.SnapshotError as error:
        raise SystemExit(f"{config.db}: cannot start: {error}") from None
    for warning in hold.warnings:
        log_event("warning", db=solos_store.shown(config.db), message=warning)
    return hold


def open_server(config: Config, register: Sequence[str], worker: solos_workers.Worker | None = None) -> MemoryServer:
    """Open (or create) the database, register agents, load extras, bind the socket (a worker: take it)."""
    tokens = Tokens.load(config.tokens_file) if config.tokens_file is not None else None  # before the database
    store = open_database(config, register)
    if tokens is None and store.keeps_tokens:  # PostgreSQL: in the database, so every copy agrees
        tokens = solos_tokens.StoredTokens(store.token_hashes)
    embedder, reason = load_embedder(config)
    if worker:  # what the other workers commit reaches this one as copies' commits do (solos_workers)
        store.shared_by_copies, store.embed_share = True, (worker.index - 1, worker.count)
    try:
        server = MemoryServer(config, Memory(store, embedder, reason, config.rerank), tokens, worker)
    except OSError as error:  # the port is taken, or the address is not this host's
        raise SystemExit(f"cannot listen on {config.host}:{config.port}: {error.strerror or error}") from None
    if worker:
        server.memory.serving = worker.describe()
        server.memory.events.seats = worker.seats = solos_workers.Seats(worker.seats_path, worker.index)
    if config.qdrant:
        server.memory.mirror = solos_qdrant.start_mirror(store, config.qdrant, embedder)
    return server


def open_database(config: Config, register: Sequence[str]) -> Store:
    """Refuse a remote address without --allow-remote; register agents; open (or create) the database."""
    if not solos_validation.is_loopback(config.host) and not config.allow_remote:
        raise SystemExit(
            f"refusing to bind {config.host}: not a loopback address. Anyone who can reach it could read and "
            f"write every agent's memory; pass --allow-remote (and use --tokens-file) if that is intended."
        )
    try:
        if register:
            register_agents(config, list(register))
        store = open_store(config)
    except SchemaMismatch as error:
        raise SystemExit(f"{solos_store.shown(config.db)}: {error}") from None
    except StorageUnavailable as error:
        raise SystemExit(f"{solos_store.shown(config.db)}: cannot start: {error.message}") from None
    except sqlite3.Error as error:
        failure = STORAGE_FAILURES.get(primary_code(error) or 0, "the database cannot be used")
        raise SystemExit(f"{config.db}: cannot start: {failure} ({error})") from None
    return store


def check_agent_names(names: list[str]) -> list[str]:
    for name in names:
        if not fully_matches(AGENT_PATTERN, name):
            raise SystemExit(f"agent name {name!r} must match {AGENT_PATTERN}")
    return names


def split_names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def add_database_options(parser: argparse.ArgumentParser, db_help: str, nested: bool = False) -> None:
    """--db and --busy-timeout-ms on a subcommand.

    A nested subcommand (agents add) takes them with no default of its own: argparse would otherwise
    overwrite the value given before it (`agents --db X add NAME` wrote ./solos.db).
    """
    wait_help = "how long a call waits for a locked database before 503 (default: %(default)s)"
    if nested:  # no default to show: %(default)s would fail --help
        db_help, wait_help = db_help.replace("%(default)s", "as given before"), wait_help.replace("%(default)s", "5000")
    db_default = argparse.SUPPRESS if nested else env_default("DB", "solos.db")
    parser.add_argument("--db", type=solos_validation.database_name, default=db_default, help=db_help)
    parser.add_argument(
        "--busy-timeout-ms",
        type=solos_validation.number_in(0, 2**31 - 1, "SOLOS_MEMORY_BUSY_TIMEOUT_MS"),  # a C int in SQLite
        default=argparse.SUPPRESS if nested else env_default("BUSY_TIMEOUT_MS", "5000"),
        help=wait_help,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    creates, existing = solos_jobs.CREATES_HELP, solos_jobs.EXISTING_HELP  # which commands make a new database
    parser = argparse.ArgumentParser(prog="solos-memory", description="Shared, attributed memory for an agent fleet.")
    parser.add_argument("--version", action="version", version=f"solos-memory {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the HTTP service (REST /v1, MCP /mcp)")
    add_database_options(serve, creates)
    serve.add_argument(
        "--host", default=env_default("HOST", "127.0.0.1"), help="address to bind (default: %(default)s)"
    )
    serve.add_argument(
        "--port",
        type=solos_validation.number_in(0, 65535, "SOLOS_MEMORY_PORT"),
        default=env_default("PORT", str(DEFAULT_PORT)),
        help="port to bind, 0 for any free one (default: %(default)s)",
    )
    serve.add_argument(
        "--register",
        type=split_names,
        default=[],
        help="comma-separated agents to register before serving, e.g. atlas,sol (default: none)",
    )
    serve.add_argument(
        "--allow-remote", action="store_true", help="allow binding a non-loopback address (default: refuse)"
    )
    serve.add_argument(
        "--tokens-file",
        default=env_default("TOKENS_FILE", None),
        help="per-agent bearer tokens file (default: none, loopback trust)",
    )
    serve.add_argument(
        "--model-dir",
        type=solos_validation.folder_or_off,
        default=env_default("MODEL_DIR", None),
        help="embedder tokenizer/config folder, or 'off' (default: the carried all-MiniLM-L6-v2)",
    )
    serve.add_argument(
        "--allowed-origin",
        type=solos_validation.web_origin,
        action="append",
        default=[],
        help="extra Origin (and its host name as Host) allowed on every route, repeatable, e.g. http://fleet.lan:8437 "
        "(default: only this server's own names)",
    )
    serve.add_argument(
        "--no-request-log",
        dest="log_requests",
        action="store_false",
        help="do not log one line per request (default: log them; rejections are always logged)",
    )
    serve.add_argument(
        "--rerank",
        type=on_off,  # argparse converts a string default too: a bad SOLOS_MEMORY_RERANK stops startup
        metavar="on|off",
        default=env_default("RERANK", "on"),
        help="reorder keyword and hybrid recall's best rows with the learned reranker (default: %(default)s)",
    )
    serve.add_argument(
        "--copy-name",
        type=solos_validation.copy_name,
        default=env_default("COPY_NAME", None),
        help="which copy of the service this is, in /health, /v1/stats, /metrics and the page (default: hostname:port)",
    )
    admit_help = "requests running at once, the rest queued in turn; 0: no cap (default: 2 per core; a pinned SQLite "
    admit_help += "worker: one per core it runs on)"
    admit = solos_validation.number_in(0, None, "SOLOS_MEMORY_ADMIT")
    serve.add_argument("--admit", type=admit, default=env_default("ADMIT", None), help=admit_help)
    solos_workers.add_arguments(serve, env_default)
    solos_qdrant.add_arguments(serve, env_default)

    agents = commands.add_parser("agents", help="register or list agents (admin; never over HTTP)")
    add_database_options(agents, creates)
    agent_commands = agents.add_subparsers(dest="agents_command", required=True)
    add = agent_commands.add_parser("add", help="register agents")
    add_database_options(add, creates, nested=True)
    add.add_argument("names", nargs="+", help="agent names")
    add_database_options(agent_commands.add_parser("list", help="list registered agents"), existing, nested=True)

    purge = commands.add_parser("purge", help="delete expired short-term rows, archive old episodes; exit 1 on failure")
    add_database_options(purge, existing)
    purge.add_argument(
        "--archive-after-days",
        type=solos_validation.number_in(0, None, "SOLOS_MEMORY_ARCHIVE_AFTER_DAYS", whole=False),
        default=env_default("ARCHIVE_AFTER_DAYS", "30"),
        help="move episodic rows older than this to the archive, 0 never (default: %(default)s)",
    )
    add_database_options(commands.add_parser("reindex", help="rebuild the keyword indexes from the tables"), existing)
    solos_snapshot.add_commands(commands, add_database_options)
    solos_migrate.add_parser(commands)
    for qdrant_command in solos_qdrant.add_commands(commands, env_default):
        add_database_options(qdrant_command, creates if qdrant_command.prog.endswith(solos_jobs.CREATES) else existing)

    check = commands.add_parser("check", help="rollout checks against a running instance; --cleanup removes their rows")
    add_database_options(check, "the service's database, for --cleanup; must exist (default: %(default)s)")
    solos_check.add_arguments(check)
    check.set_defaults(cleanup_command=f"python3 {sys.argv[0]} check --cleanup --db PATH")

    backfill = commands.add_parser(
        "backfill", help="embed every row that lacks a vector; resumable, safe while the service runs"
    )
    add_database_options(backfill, existing)
    backfill.add_argument(
        "--model-dir",
        type=solos_validation.folder_or_off,
        default=env_default("MODEL_DIR", None),
        help="embedder tokenizer/config folder (default: the carried all-MiniLM-L6-v2)",
    )
    backfill.add_argument(
        "--batch",
        type=solos_validation.number_in(1),
        default=solos_embed_worker.EMBED_BATCH,
        help="rows per embedding batch and write transaction (default: %(default)s)",
    )

    commands.add_parser("client", add_help=False, help="call a running service: client recall|remember|event --help")
    token = commands.add_parser("token", help="issue a bearer token for an agent, appended (hashed) to a tokens file")
    token.add_argument("agent", help=f"the agent the token speaks for, or {OPERATOR} for the operator view of stats")
    token.add_argument("--tokens-file", help="tokens file to append to (created with mode 600); wins over --db")
    token.add_argument("--db", default=env_default("DB", ""), help="a postgresql:// URL: keep the token there instead")
    return parser.parse_args(argv)


def config_from(args: argparse.Namespace) -> Config:
    """The one Config for this run: the flags a command has, defaults for the rest."""
    return Config(
        db=args.db,
        host=getattr(args, "host", Config.host),
        port=getattr(args, "port", Config.port),
        busy_timeout_ms=args.busy_timeout_ms,
        allow_remote=getattr(args, "allow_remote", Config.allow_remote),
        tokens_file=getattr(args, "tokens_file", Config.tokens_file),
        model_dir=getattr(args, "model_dir", Config.model_dir),
        allowed_origins=tuple(getattr(args, "allowed_origin", ())),
        log_requests=getattr(args, "log_requests", Config.log_requests),
        qdrant=solos_qdrant.target_from(args),
        rerank=getattr(args, "rerank", Config.rerank),
        copy_name=getattr(args, "copy_name", Config.copy_name),
        admit=getattr(args, "admit", Config.admit),
        workers=getattr(args, "workers", Config.workers),
        worker_socket=getattr(args, "worker_socket", Config.worker_socket),
        pin_threads=getattr(args, "pin_threads", Config.pin_threads),
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status so tests can call it."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["client"]:  # the rest is solos_client's own command line
        import solos_client

        return solos_client.main(argv[1:])
    args = parse_args(argv)
    if args.command == "token":
        keep = lambda: open_store(Config(db=args.db), admin=True)  # noqa: E731
        return solos_tokens.issue_token(args.agent, args.tokens_file, args.db, keep)
    if args.command in ("check", "migrate"):  # each its own module's command line
        return solos_check.run(args) if args.command == "check" else solos_migrate.run(args)
    config = config_from(args)
    if args.command == "serve":
        return serve(config, args.register)
    try:
        return run_admin_command(args, config)
    except (ServiceError, SchemaMismatch, sqlite3.Error, OSError, RuntimeError) as error:
        # The purge timer's unit turns this exit status into a failed run with this line in the journal.
        log_event("failed", command=args.command, db=args.db, reason=str(error))
        return 1


def serve(config: Config, register: list[str]) -> int:
    """This process serves; or, with --workers N, it binds, forks N workers and keeps them (solos_workers)."""
    logging.basicConfig(level=logging.INFO, handlers=[JsonLogHandler()], force=True)
    solos_judge.check_switch()  # before the database: SOLOS_MEMORY_JUDGE=0 is no silent "on"
    if config.workers < 1:
        raise SystemExit(f"--workers must be 1 or more, got {config.workers}")
    config = solos_workers.settled(config)  # --pin-threads unsaid: on for SQLite workers with a core each
    if config.pin_threads and config.workers < 2:
        raise SystemExit("--pin-threads on needs --workers 2 or more (one process's threads keep every core)")
    solos_sqlite.statistics_off()  # one thread, no connection yet; workers inherit it through the fork
    solos_malloc.arenas_capped()  # one thread yet, so no arena past the cap; workers inherit it too
    if config.workers == 1:
        return solos_workers.run(build_server(config, register), config)
    hold = hold_database(config)  # the supervisor's, for the workers' whole life; they register nothing again
    Tokens.load(config.tokens_file) if config.tokens_file is not None else None  # one it cannot use stops here
    open_database(config, register).close()  # registered and migrated once, and a broken database stops here
    start = lambda worker: solos_workers.run(open_server(config, (), worker), config, worker)  # noqa: E731
    try:
        return solos_workers.supervise(config.workers, config.host, config.port, config.worker_socket, start)
    finally:
        if hold:
            hold.release()


def run_admin_command(args: argparse.Namespace, config: Config) -> int:
    """agents, purge, reindex, snapshot, restore: short transactions against the shared database."""
    if solos_store.is_postgres(config.db) and args.command in (*solos_snapshot.COMMANDS, *solos_qdrant.COMMANDS):
        raise SystemExit(f"{args.command} works on SQLite only; PostgreSQL: see docs/operations.md (pg_dump)")
    if args.command in solos_snapshot.COMMANDS:  # before open_store: restore checks before touching --db
        migrate = lambda path: Store(str(path), config.busy_timeout_ms, admin=True).migrate()  # noqa: E731
        log_event(args.command, **solos_snapshot.run_command(args, solos_store.SCHEMA_VERSION, migrate))
        return 0
    if args.command == "agents" and args.agents_command == "add":
        added = register_agents(config, args.names)
        print(f"registered {len(added)} new of {len(args.names)}: {', '.join(added) or '-'}")
        return 0
    store = solos_jobs.opened(config.db, args.command, lambda: open_store(config), config.busy_timeout_ms)
    try:
        if args.command == "agents":
            print("\n".join(store.list_agents()))
        elif args.command == "purge":
            db = store if solos_store.is_postgres(config.db) else config.db  # PostgreSQL: runs recorded there
            rows = solos_jobs.recorded(db, "purge", lambda: solos_forget.purge(store))
            archived = solos_jobs.recorded(
                db, "archive", lambda: solos_lifecycle.archive_episodic(store, args.archive_after_days)
            )
            log_event("purged", rows=rows, archived=archived)
        elif args.command == "reindex":
            store.reindex()
            log_event("reindexed", tables=list(FTS_TABLES))
        elif args.command in solos_qdrant.COMMANDS:
            return solos_qdrant.run_command(args, store, config.qdrant, validate_for)
        elif args.command == "backfill":
            return solos_embed_worker.backfill(store, load_embedder(config, threads=None), args.batch)
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
