"""solos-memory: shared, attributed memory for an agent fleet, over REST and MCP.

Agents write memory in tiers (short-term key/value with a TTL, long-term facts,
episodic events) and recall each other's, every row labelled with who wrote it
and whether it is foreign to the caller. A fourth tier, durable (the fleet's
`persona/<agent>` records), is read-only and private to its agent.

Run:   python3 solos_memory.py serve --register atlas,sol
Test:  make test

Data lives in one SQLite file (`--db`, default ./solos.db) shared with the
fleet's other writers; it is created from schema.sql if missing. REST is served
under /v1, MCP StreamableHTTP at /mcp, both from the operation table below.

Settings (a flag beats the environment, which beats the default):
  --db               SOLOS_MEMORY_DB               ./solos.db
  --host             SOLOS_MEMORY_HOST             127.0.0.1
  --port             SOLOS_MEMORY_PORT             8437
  --busy-timeout-ms  SOLOS_MEMORY_BUSY_TIMEOUT_MS  5000
  --tokens-file      SOLOS_MEMORY_TOKENS_FILE      (none: loopback trust)
  --model-dir        SOLOS_MEMORY_MODEL_DIR        ./models/all-MiniLM-L6-v2 or "off"
  --qdrant-url, --qdrant-path, --qdrant-collection: SOLOS_MEMORY_QDRANT_*  (none: no mirror)
"""

from __future__ import annotations

import argparse
import bisect
import concurrent.futures
import hashlib
import hmac
import json
import logging
import math
import os
import queue
import re
import secrets
import signal
import socket
import sqlite3
import stat
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import parse_qsl, urlsplit

import mcp_bridge
import solos_check
import solos_connections
import solos_dataspace
import solos_lifecycle
import solos_qdrant
import solos_rank
import solos_snapshot
import solos_status

# Run as a script this module is __main__; the modules it carries import it by name and must get this copy.
sys.modules.setdefault("solos_memory", sys.modules[__name__])

__version__ = "0.1.0"

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


def env_default(name: str, default: str | None) -> str | None:
    """The SOLOS_MEMORY_<NAME> environment value, else the default."""
    return os.environ.get("SOLOS_MEMORY_" + name, default)


def env_int(name: str, default: int) -> int:
    """An integer setting from SOLOS_MEMORY_<NAME>, else the default; a bad value stops startup."""
    raw = os.environ.get("SOLOS_MEMORY_" + name)
    try:
        return default if raw is None else int(raw)
    except ValueError:
        raise SystemExit(f"SOLOS_MEMORY_{name} must be an integer, got {raw!r}") from None


def log_event(event: str, **fields: Any) -> None:
    """One JSON line on stderr (the journal under systemd)."""
    record = {"ts": utc_now(), "event": event, **fields}
    sys.stderr.write(json.dumps(record, default=str) + "\n")
    sys.stderr.flush()


class JsonLogHandler(logging.Handler):
    """Route `logging` (tracebacks included) into the same one-line JSON as log_event."""

    def emit(self, record: logging.LogRecord) -> None:
        fields: dict[str, Any] = {
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            fields["traceback"] = logging.Formatter().formatException(record.exc_info)
        log_event("log", **fields)


def utc_now() -> str:
    """Now as the schema's timestamp format (UTC, milliseconds, 'Z')."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


# ==== Errors ====


class ServiceError(Exception):
    """Base for expected errors; subclasses set status and code."""

    status, code = 500, "internal"
    retry_after_s: int | None = None  # set for conditions that pass by themselves

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field
        self.counted = False  # set once Stats.reject has logged and counted it

    def headers(self) -> dict[str, str]:
        """Response headers this error needs besides its body (Allow, Retry-After, ...)."""
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


class BadRequest(ServiceError):
    """A field is missing, of the wrong type, or out of range."""

    status, code = 400, "bad_request"


class Unauthorized(ServiceError):
    """Tokens are enabled and the request carries no valid bearer token."""

    status, code = 401, "unauthorized"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Bearer realm="solos-memory"'}


class Forbidden(ServiceError):
    """The caller may not do this (another agent's persona, another agent's identity)."""

    status, code = 403, "forbidden"


class NotFound(ServiceError):
    """No such route, or no such row for this agent."""

    status, code = 404, "not_found"


class MethodNotAllowed(ServiceError):
    """The route exists, the method does not."""

    status, code = 405, "method_not_allowed"

    def __init__(self, message: str, allow: list[str]):
        super().__init__(message)
        self.allow = allow

    def headers(self) -> dict[str, str]:
        return {"Allow": ", ".join(self.allow)}


class Conflict(ServiceError):
    """An idempotency key was reused with different content."""

    status, code = 409, "conflict"


class LengthRequired(ServiceError):
    """A body without Content-Length (chunked bodies are not accepted)."""

    status, code = 411, "length_required"


class PayloadTooLarge(ServiceError):
    """The body is over MAX_BODY_BYTES."""

    status, code = 413, "payload_too_large"


class UnsupportedMediaType(ServiceError):
    """A body that is not application/json."""

    status, code = 415, "unsupported_media_type"


class UnknownAgent(ServiceError):
    """The agent is not in agent_registry: no orphan rows, ever."""

    status, code = 422, "unknown_agent"


class ProtocolError(ServiceError):
    """http.server's own refusals (a malformed request line, headers too long), in the one JSON shape."""

    def __init__(self, status: int, message: str | None):
        phrase = HTTPStatus(status).phrase
        super().__init__(message or phrase)
        self.status, self.code = status, phrase.lower().replace(" ", "_")  # per instance: the status varies


class RequestTimeout(ServiceError):
    """The body did not arrive within BODY_DEADLINE_S (a slow-body attack, or a stalled client)."""

    status, code = 408, "request_timeout"


class Busy(ServiceError):
    """The database stayed locked through every retry; never an empty success."""

    status, code = 503, "busy"
    retry_after_s = 1


class StorageUnavailable(ServiceError):
    """The database cannot be written or read right now (read-only, disk full, I/O error).

    A condition outside the service that an operator fixes; the service recovers by itself once it is gone.
    """

    status, code = 503, "storage_unavailable"
    retry_after_s = 5


def error_body(error: ServiceError) -> dict:
    """The one JSON shape every error takes, on REST and inside MCP results."""
    body: dict[str, Any] = {"code": error.code, "status": error.status, "message": error.message}
    if error.field:
        body["field"] = error.field
    return {"error": body}


# ==== Validation ====

# Fields are checked once, here, against the same JSON Schema MCP advertises.
AGENT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
NO_NUL = "^[^\\u0000]*$"  # stored text: C-string consumers of the database would cut it at a NUL
TAGS_SCHEMA = {
    "type": "array",
    "maxItems": 32,
    "items": {"type": "string", "minLength": 1, "maxLength": 64, "pattern": NO_NUL},
    "description": "Labels, at most 32 strings of 1-64 characters.",
}
AGENT_SCHEMA = {
    "type": "string",
    "pattern": AGENT_PATTERN,
    "description": "The calling agent, as registered in agent_registry.",
}
JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "array": list,
    "object": dict,
}


def describe(value: Any) -> str:
    """A short rendering of a bad value for an error message, whatever the value (deep, huge, odd)."""
    try:
        text = json.dumps(value) if not isinstance(value, str) else repr(value)
    except (RecursionError, ValueError):  # nesting past the recursion limit; ints past 4,300 digits
        text = f"a deeply nested {type(value).__name__}" if isinstance(value, (list, dict)) else "a huge number"
    return text if len(text) <= 60 else text[:57] + "..."


def fully_matches(pattern: str, value: str) -> bool:
    """The whole value matches an anchored schema pattern (`$` alone would admit a trailing newline)."""
    return re.fullmatch(pattern.removeprefix("^").removesuffix("$"), value) is not None


LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # valid in a JSON escape, not encodable as UTF-8


def check_value(name: str, schema: dict, value: Any) -> Any:
    """Check one value against its schema; raise BadRequest naming the field.

    `name` may point inside the field (`tags[2]`); the error's field is the top-level name.
    """
    try:
        return check_one(name, schema, value)
    except BadRequest as error:
        error.field = name.split("[")[0]
        raise


def check_one(name: str, schema: dict, value: Any) -> Any:
    kind = schema["type"]
    is_bool = isinstance(value, bool)
    right_type = isinstance(value, JSON_TYPES[kind])  # kept apart: mypy would narrow value to object
    if not right_type or (is_bool and kind != "boolean"):
        raise BadRequest(f"{name} must be {article(kind)} {kind}, got {describe(value)}", name)
    if isinstance(value, float) and not math.isfinite(value):
        raise BadRequest(f"{name} must be a finite number, got {describe(value)}", name)
    if kind in ("integer", "number"):
        low, high = schema.get("minimum"), schema.get("maximum")
        low_open = schema.get("exclusiveMinimum")
        if (
            (low is not None and value < low)
            or (high is not None and value > high)
            or (low_open is not None and value <= low_open)
        ):
            raise BadRequest(f"{name} must be {kind_range(schema)}, got {describe(value)}", name)
    if kind == "string":
        if LONE_SURROGATE.search(value):
            raise BadRequest(f"{name} must be valid Unicode text: it holds a lone surrogate (\\ud800-\\udfff)", name)
        if "enum" in schema and value not in schema["enum"]:
            raise BadRequest(f"{name} must be one of {', '.join(schema['enum'])}, got {describe(value)}", name)
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", 1 << 30):
            raise BadRequest(
                f"{name} must be {schema.get('minLength', 0)}-{schema.get('maxLength')} characters, got {len(value)}",
                name,
            )
        if "pattern" in schema and not fully_matches(schema["pattern"], value):
            if schema["pattern"] == NO_NUL:
                raise BadRequest(f"{name} must not contain NUL characters", name)
            raise BadRequest(f"{name} must match {schema['pattern']}, got {describe(value)}", name)
    if kind == "array":
        if len(value) > schema.get("maxItems", 1 << 30):
            raise BadRequest(f"{name} must have at most {schema['maxItems']} items, got {len(value)}", name)
        value = [check_one(f"{name}[{i}]", schema["items"], item) for i, item in enumerate(value)]
        if schema.get("uniqueItems"):
            value = list(dict.fromkeys(value))
    return value


def article(kind: str) -> str:
    return "an" if kind[0] in "aeiou" else "a"


def kind_range(schema: dict) -> str:
    """'a number in (0, 31536000]' style description of a numeric range."""
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    left = "[" if "minimum" in schema else "("
    return f"{article(schema['type'])} {schema['type']} in {left}{low}, {schema.get('maximum')}]"


def check_args(schema: dict, args: Any) -> dict:
    """Validate an argument object; return it with defaults filled in."""
    if not isinstance(args, dict):
        raise BadRequest(f"arguments must be a JSON object, got {describe(args)}", "body")
    properties = schema["properties"]
    unknown = sorted(set(args) - set(properties))
    if unknown:
        raise BadRequest(f"{unknown[0]} is not a known field (known: {', '.join(properties)})", unknown[0])
    checked = {}
    for name, spec in properties.items():
        if name in args and args[name] is not None:
            checked[name] = check_value(name, spec, args[name])
        elif name in schema.get("required", ()):
            raise BadRequest(f"{name} is required", name)
        else:
            checked[name] = spec.get("default")
    return checked


def coerce_query(schema: dict, pairs: list[tuple[str, str]]) -> dict:
    """Turn query-string pairs into typed arguments, per the operation's schema.

    REST clients send `k=5` and `tiers=long,short`; MCP clients send 5 and
    ["long", "short"]. Both then meet the same check_args.
    """
    args: dict[str, Any] = {}
    for name, raw in pairs:
        if name in args:
            raise BadRequest(f"{name} is given more than once", name)
        kind = schema["properties"].get(name, {}).get("type")
        if kind == "integer":
            args[name] = int(raw) if re.fullmatch(r"-?\d{1,12}", raw) else raw
        elif kind == "number":
            args[name] = float(raw) if re.fullmatch(r"-?\d{1,12}(\.\d{1,12})?", raw) else raw
        elif kind == "boolean":
            args[name] = {"true": True, "false": False}.get(raw, raw)
        elif kind == "array":
            args[name] = [part.strip() for part in raw.split(",") if part.strip()]
        else:
            args[name] = raw
    return args


def reject_constant(name: str) -> None:
    """json.loads hook: NaN and Infinity are not JSON."""
    raise BadRequest(f"body must be valid JSON: {name} is not a JSON number", "body")


def parse_json_body(body: bytes) -> Any:
    """Decode a request body as strict UTF-8 JSON."""
    try:
        return json.loads(body.decode("utf-8"), parse_constant=reject_constant)
    except UnicodeDecodeError:
        raise BadRequest("body must be UTF-8 encoded JSON", "body") from None
    except RecursionError:
        raise BadRequest("body nests too deeply", "body") from None
    except json.JSONDecodeError as error:
        raise BadRequest(
            f"body must be valid JSON: {error.msg} at line {error.lineno} column {error.colno}", "body"
        ) from None
    except ValueError:  # an integer past Python's 4,300-digit conversion limit
        raise BadRequest("body holds a number too long to read", "body") from None


# ==== Storage: all SQL lives here ====

BUSY_RETRIES = 3
OVERFETCH = 4  # ranked keyword matches read per wanted row when scope, sharing or expiry filters apply
POOL_SIZE = 8
SCHEMA_VERSION = "1"

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
# A row carries one of the wanted tags (a JSON array of them is the parameter, twice): tags as this service
# stores them (a JSON array) or as a comma list, which other writers of the fleet use.
TAGGED_SQL = (
    "CASE WHEN json_valid(t.tags) THEN EXISTS (SELECT 1 FROM json_each(t.tags) AS have "
    "WHERE have.value IN (SELECT value FROM json_each(?))) "
    "ELSE EXISTS (SELECT 1 FROM json_each(?) AS want "
    "WHERE instr(',' || replace(t.tags, ', ', ',') || ',', ',' || want.value || ',') > 0) END"
)
FTS_TABLES = ("memory_longterm_fts", "memory_episodic_fts", "memory_short_fts", "memory_episodic_archive_fts")


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


EPISODE_COLUMNS = "t.id, t.agent, t.event_type, t.summary, t.details, t.outcome, t.duration_s, t.timestamp AS ts"
EPISODE_RESULT = ("event_type", "summary", "details", "outcome", "duration_s")
TIER_TABLE = {
    tier.name: tier
    for tier in (
        Tier(
            "long",
            "long",
            "memory_longterm",
            "memory_longterm_fts",
            "t.id, t.agent, t.topic, t.fact, t.source, t.confidence, t.tags, t.created_at, t.updated_at AS ts",
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
        ),
        Tier(
            solos_lifecycle.ARCHIVE_TIER,
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
        ),
        Tier(
            "short",
            "short",
            "memory_short",
            "memory_short_fts",
            "t.id, t.agent, t.key, t.value, t.tags, t.expires_at, t.created_at AS ts",
            "created_at",
            "1.0, 1.0, 0.5, 0.5",
            "value",
            ("key", "value", "tags", "expires_at"),
            embedded=("agent", "key", "value"),
            vector_sql="SELECT t.id, t.agent, NULL AS thread, t.expires_at, v.vector FROM memory_vector v "
            "JOIN memory_short t ON t.id = v.row_id WHERE v.tier = ? AND v.model = ?",
            expires=True,
        ),
    )
}
EMBEDDED_TIERS = tuple(tier for tier in TIER_TABLE.values() if tier.embedded)
LIVE_TIERS = tuple(tier for tier in TIER_TABLE.values() if not tier.archived)  # where writes land


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


class PooledConnection(sqlite3.Connection):
    """A connection that knows whether it may go back to the pool."""

    # False for one opened while the file was not writable (SQLite then silently opens it read-only, for
    # good) and for one that met a storage failure: reusing either kept writes failing after the cause was gone.
    reusable = True


FLEET_OWNED_TABLES = ("agent_registry", "memory_durable")
WRITE_ACTIONS = (sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE)


def deny_fleet_writes(action: int, table: str | None, *_: Any) -> int:
    """SQLite authorizer: the service never writes the fleet's registry or durable records."""
    if action in WRITE_ACTIONS and table in FLEET_OWNED_TABLES:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


class Store:
    """The SQLite database: connections, transactions with retry, every query.

    An admin store (the CLI registering agents) may write agent_registry; the
    serving store cannot, enforced by an authorizer on every connection.
    """

    def __init__(self, path: str, busy_timeout_ms: int = 5000, admin: bool = False):
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self.admin = admin
        self.pool: queue.LifoQueue[PooledConnection] = queue.LifoQueue()
        # The service's own writers queue here, in order, rather than race for SQLite's lock: its busy
        # handler polls with sleeps of up to 100 ms, so sixteen threads contending lose their time asleep
        # (bench/write_throughput.py, 16 clients: p99 104 -> 11 ms) and the fleet's writers meet sixteen rivals.
        self.write_lock = threading.Lock()

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
        solos_dataspace.secure_delete(conn)  # what any delete removes is zeroed, not left in free pages (forget)
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
        if not self.write_lock.acquire(timeout=self.busy_timeout_ms / 1000):
            raise Busy(f"database is locked: this service's own writes queued for {self.busy_timeout_ms} ms")
        try:
            return self.attempt(work, write, deadline)
        finally:
            self.write_lock.release()

    def attempt(self, work: Callable[[sqlite3.Connection], Any], write: bool, deadline: float) -> Any:
        """run's retries: up to BUSY_RETRIES more tries before the deadline, then Busy."""
        for attempt in range(BUSY_RETRIES + 1):
            conn = None
            try:
                conn = self.checkout()
                if attempt or write:  # a retry, or a write that queued, waits only for what is left
                    remaining_ms = max(1, int((deadline - time.monotonic()) * 1000))
                    conn.execute(f"PRAGMA busy_timeout={remaining_ms}")
                # Reads get one snapshot (cheap under WAL); writes take the lock up front, briefly.
                begin = "BEGIN IMMEDIATE" if write else "BEGIN"
                conn.execute(begin)
                try:
                    result = work(conn)
                except sqlite3.OperationalError as error:
                    if "Could not decode to UTF-8" not in str(error) or conn.text_factory is not str:
                        raise
                    # Text another writer stored as invalid UTF-8: read it with U+FFFD rather than fail every
                    # call that meets the row. Only then, and from scratch: the C decoder is 0.1 ms per recall faster.
                    conn.execute("ROLLBACK")
                    conn.text_factory = decode_text
                    conn.execute(begin)
                    result = work(conn)
                conn.execute("COMMIT")
                return result
            except sqlite3.Error as error:
                failure = STORAGE_FAILURES.get(primary_code(error) or 0)
                if failure is not None:
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
                    if (attempt or write) and conn.reusable:
                        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
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

    def write(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        return self.run(work, write=True)

    # -- schema --

    def migrate(self) -> None:
        """Create what is missing (additive only) after checking what exists."""
        conn = self.connect()
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
            conn.executescript("BEGIN IMMEDIATE;\n" + schema + "\nCOMMIT;")
            conn.execute("BEGIN IMMEDIATE")
            for fts in FTS_TABLES:
                if fts not in existing:  # new index over rows the fleet already has
                    self.rebuild_index(conn, fts)
            conn.execute(
                "INSERT INTO solos_memory_meta (key, value) VALUES ('schema_version', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (SCHEMA_VERSION,),
            )
            conn.execute("INSERT OR IGNORE INTO solos_memory_meta (key, value) VALUES ('vector_generation', 0)")
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
        """Rebuild the keyword indexes from their tables (one write transaction)."""

        def work(conn: sqlite3.Connection) -> None:
            for fts in FTS_TABLES:
                self.rebuild_index(conn, fts)

        self.write(work)

    # -- agents (admin CLI only; the HTTP service never writes agent_registry) --

    def register_agents(self, names: list[str]) -> list[str]:
        """Insert agents that are not registered yet; return the ones added."""

        def work(conn: sqlite3.Connection) -> list[str]:
            added = []
            for name in names:
                cursor = conn.execute("INSERT OR IGNORE INTO agent_registry (agent) VALUES (?)", (name,))
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
            raise UnknownAgent(f"agent {agent!r} is not registered in agent_registry", "agent")

    # -- writes --

    def upsert_short(self, agent: str, key: str, value: str, ttl_s: float, tags: list[str]) -> dict:
        def work(conn: sqlite3.Connection) -> dict:
            self.require_agent(conn, agent)
            existing = conn.execute("SELECT id FROM memory_short WHERE agent = ? AND key = ?", (agent, key)).fetchone()
            row = conn.execute(
                "INSERT INTO memory_short (agent, key, value, tags, created_at, expires_at) "
                "VALUES (?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), "
                "        strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?)) "
                "ON CONFLICT (agent, key) DO UPDATE SET value = excluded.value, tags = excluded.tags, "
                "    created_at = excluded.created_at, expires_at = excluded.expires_at "
                "RETURNING id, expires_at",
                (agent, key, value, json.dumps(tags), f"+{ttl_s:.3f} seconds"),
            ).fetchone()
            return {"id": row["id"], "status": "updated" if existing else "created", "expires_at": row["expires_at"]}

        return self.write(work)

    def upsert_long(
        self, agent: str, topic: str | None, fact: str, source: str | None, confidence: float | None, tags: list[str]
    ) -> dict:
        return self.write(lambda conn: self.put_long(conn, agent, topic, fact, source, confidence, tags))

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
        known = self.known_long(conn, agent, fact)
        if known is None:
            return {"id": self.insert_long(conn, agent, topic, fact, source, confidence, tags), "status": "created"}
        changed = conn.execute(
            "UPDATE memory_longterm SET topic = ?, source = ?, confidence = ?, tags = ?, "
            "updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE id = ? "
            "AND (topic, source, confidence, tags) IS NOT (?, ?, ?, ?)",
            (topic, source, confidence, json.dumps(tags), known, topic, source, confidence, json.dumps(tags)),
        ).rowcount
        return {"id": known, "status": "updated" if changed else "unchanged"}

    @staticmethod
    def known_long(conn: sqlite3.Connection, agent: str, fact: str) -> int | None:
        """The writer's row holding exactly this fact (keyed by the full text's sha256), if there is one."""
        row = conn.execute(
            "SELECT l.id FROM memory_write_key k JOIN memory_longterm l ON l.id = k.row_id "
            "WHERE k.agent = ? AND k.tier = 'long' AND k.key = ? AND l.agent = k.agent AND l.fact = ?",
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

    def append_episodic(self, agent: str, event: dict, idempotency_key: str | None) -> dict:
        columns = ("event_type", "summary", "details", "outcome", "duration_s")

        def work(conn: sqlite3.Connection) -> dict:
            self.require_agent(conn, agent)
            if idempotency_key:
                earlier = conn.execute(
                    "SELECT e.* FROM memory_write_key k JOIN memory_episodic e ON e.id = k.row_id "
                    "WHERE k.agent = ? AND k.tier = 'episodic' AND k.key = ? AND e.agent = k.agent",
                    (agent, idempotency_key),
                ).fetchone()
                if earlier:
                    if any(earlier[c] != event[c] for c in columns):
                        raise Conflict(
                            f"idempotency_key {idempotency_key!r} was used for a different event (id {earlier['id']})",
                            "idempotency_key",
                        )
                    return {"id": earlier["id"], "status": "unchanged"}
            row_id = conn.execute(
                "INSERT INTO memory_episodic (agent, event_type, summary, details, outcome, duration_s) "
                "VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
                (agent, *(event[c] for c in columns)),
            ).fetchone()[0]
            if idempotency_key:
                self.remember_key(conn, agent, "episodic", idempotency_key, row_id)
            return {"id": row_id, "status": "created"}

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
                "RETURNING id, expires_at <= strftime('%Y-%m-%dT%H:%M:%fZ', 'now') AS expired",
                (agent, key),
            ).fetchone()
            if row is None:
                raise NotFound(f"agent {agent!r} has no short-term key {key!r}", "key")
            return {"id": row["id"], "status": "deleted", "was_expired": bool(row["expired"])}

        return self.write(work)

    def set_sharing(self, agent: str, episodic: bool) -> dict:
        def work(conn: sqlite3.Connection) -> dict:
            self.require_agent(conn, agent)
            existing = conn.execute("SELECT 1 FROM episodic_sharing WHERE agent = ?", (agent,)).fetchone()
            conn.execute(
                "INSERT INTO episodic_sharing (agent, shared) VALUES (?, ?) ON CONFLICT (agent) DO UPDATE "
                "SET shared = excluded.shared, updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
                (agent, int(episodic)),
            )
            return {"status": "updated" if existing else "created"}

        return self.write(work)

    def purge_expired(self, batch: int = 1000) -> int:
        """Delete expired short rows in short batches, so no write lock is held long."""
        total = 0
        while True:
            removed = self.write(
                lambda conn: (
                    conn.execute(
                        "DELETE FROM memory_short WHERE id IN (SELECT id FROM memory_short "
                        "WHERE expires_at <= strftime('%Y-%m-%dT%H:%M:%fZ', 'now') LIMIT ?)",
                        (batch,),
                    ).rowcount
                )
            )
            total += removed
            if removed < batch:
                return total

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
                    "short": one(
                        "SELECT count(*) FROM memory_short WHERE expires_at > strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
                    ),
                    "short_expired": one(
                        "SELECT count(*) FROM memory_short WHERE expires_at <= strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
                    ),
                    "long": one("SELECT count(*) FROM memory_longterm"),
                    "episodic": one("SELECT count(*) FROM memory_episodic"),
                    "durable": one("SELECT count(*) FROM memory_durable"),
                },
                "episodic_sharing_agents": one("SELECT count(*) FROM episodic_sharing WHERE shared = 1"),
                "audit_rows": one("SELECT count(*) FROM episodic_read_audit"),
            }

        return self.read(work)

    def writes_by_agent(self) -> dict[str, tuple[int, int]]:
        """Rows each writer (the fleet's too) created or changed in the last hour and day, by the rows' timestamps."""
        since = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-1 {}')"
        recent = " UNION ALL ".join(
            f"SELECT agent, {column} AS ts FROM {table} WHERE {column} >= {since.format('day')}"
            for table, column in {tier.table: tier.time_column for tier in LIVE_TIERS}.items()
        )
        sql = f"SELECT agent, sum(ts >= {since.format('hour')}), count(*) FROM ({recent}) GROUP BY agent"
        return self.read(lambda conn: {row[0]: (row[1], row[2]) for row in conn.execute(sql)})

    # -- recall's reads: each filters by scope, sharing and expiry before any ranking --

    @staticmethod
    def visible(tier: Tier, caller: str, scope: str, tags: Sequence[str] = ()) -> tuple[list[str], list[Any]]:
        """WHERE clauses (over alias t) and their parameters: what `caller` may read of `tier` in `scope`, and
        with `tags`, only rows carrying one of them (a tier without tags has none)."""
        where, params = [], []
        if tags:
            where.append(TAGGED_SQL if "tags" in tier.result_columns else "0")
            params.extend([json.dumps(list(tags))] * (2 if "tags" in tier.result_columns else 0))
        if scope == "own":
            where.append("t.agent = ?")
            params.append(caller)
        elif scope == "shared_except_self":
            where.append("t.agent != ?")
            params.append(caller)
        if tier.opt_in:
            where.append("(t.agent = ? OR t.agent IN (SELECT agent FROM episodic_sharing WHERE shared = 1))")
            params.append(caller)
        if tier.expires:
            where.append("t.expires_at > strftime('%Y-%m-%dT%H:%M:%fZ', 'now')")
        return where, params

    def recent_rows(
        self, conn: sqlite3.Connection, tier: Tier, caller: str, scope: str, limit: int, tags: Sequence[str] = ()
    ) -> list:
        """The most recent rows the caller may read (a recall without words)."""
        where, params = self.visible(tier, caller, scope, tags)
        sql = (
            f"SELECT {tier.columns}, 0.0 AS score FROM {tier.table} t "
            f"{'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY t.{tier.time_column} DESC, t.id DESC LIMIT ?"
        )
        return conn.execute(sql, (*params, limit)).fetchall()

    def rows_by_id(
        self, conn: sqlite3.Connection, tier: Tier, caller: str, scope: str, ids: list[int], tags: Sequence[str] = ()
    ) -> list:
        """Exactly these rows (another leg's candidates, a match's neighbours), if the caller may read them."""
        where, params = self.visible(tier, caller, scope, tags)
        where.append("t.id IN (SELECT value FROM json_each(?))")
        sql = f"SELECT {tier.columns}, 0.0 AS score FROM {tier.table} t WHERE {' AND '.join(where)}"
        return conn.execute(sql, (*params, json.dumps(ids))).fetchall()

    def ranked_rows(
        self,
        conn: sqlite3.Connection,
        tier: Tier,
        caller: str,
        scope: str,
        match: str,
        limit: int,
        tags: Sequence[str] = (),
    ) -> list[sqlite3.Row]:
        """The best BM25 matches the caller may read; `score` is -bm25 (higher is better)."""
        where, params = self.visible(tier, caller, scope, tags)
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
        sql = f"SELECT count(*) FROM (SELECT 1 FROM {tier.fts} WHERE {tier.fts} MATCH ? LIMIT ?)"
        return conn.execute(sql, (match, count)).fetchone()[0] >= count

    def topic_neighbours(self, conn: sqlite3.Connection, ids: list[int]) -> dict[int, tuple[int | None, int | None]]:
        """For long facts, the previous and next fact of the same (non-empty) topic."""
        rows = conn.execute(
            "SELECT l.id, "
            "  (SELECT max(p.id) FROM memory_longterm p WHERE p.topic = l.topic AND p.id < l.id) AS previous, "
            "  (SELECT min(n.id) FROM memory_longterm n WHERE n.topic = l.topic AND n.id > l.id) AS following "
            "FROM memory_longterm l WHERE l.topic <> '' AND l.id IN (SELECT value FROM json_each(?))",
            (json.dumps(ids),),
        )
        return {row[0]: (row[1], row[2]) for row in rows}

    def sharing_agents(self, conn: sqlite3.Connection) -> set[str]:
        return {row[0] for row in conn.execute("SELECT agent FROM episodic_sharing WHERE shared = 1")}

    # -- vectors --

    def vector_generation(self, conn: sqlite3.Connection) -> int:
        row = conn.execute("SELECT value FROM solos_memory_meta WHERE key = 'vector_generation'").fetchone()
        return int(row[0]) if row else 0

    def load_vectors(self, conn: sqlite3.Connection, tier: str, model: str) -> sqlite3.Cursor:
        """Every vector of one tier made by `model`, with what the vector search filters on, row by row."""
        return conn.execute(TIER_TABLE[tier].vector_sql, (tier, model))

    def rows_missing_vectors(
        self, tier: str, model: str, limit: int, ids: list[int] | None = None
    ) -> list[sqlite3.Row]:
        """Rows with no vector from `model` (new, changed, or embedded by another model), of `ids` if given."""
        table, select = TIER_TABLE[tier].table, TIER_TABLE[tier].columns
        only = "" if ids is None else " AND t.id IN (SELECT value FROM json_each(?))"
        return self.read(
            lambda conn: conn.execute(
                f"SELECT {select} FROM {table} t LEFT JOIN memory_vector v "
                f"ON v.tier = ? AND v.row_id = t.id AND v.model = ? WHERE v.row_id IS NULL{only} ORDER BY t.id LIMIT ?",
                (tier, model, *(() if ids is None else (json.dumps(ids),)), limit),
            ).fetchall()
        )

    def save_vectors(self, tier: str, model: str, embedded: list[tuple[sqlite3.Row, bytes]]) -> tuple[list[int], int]:
        """Store vectors for rows whose text is still what was embedded; the ids saved and the vector generation."""
        table, fields = TIER_TABLE[tier].table, TIER_TABLE[tier].embedded
        same_text = " AND ".join(f"{name} IS ?" for name in fields)

        def work(conn: sqlite3.Connection) -> tuple[list[int], int]:
            saved = []
            for row, vector in embedded:
                current = (row["id"], *(row[name] for name in fields))
                if tier == "long":
                    changed = conn.execute(
                        f"UPDATE memory_longterm SET embedding = ? WHERE id = ? AND {same_text}", (vector, *current)
                    ).rowcount
                    stored = None  # the long tier keeps its vector in memory_longterm.embedding
                else:
                    stored = vector
                    changed = conn.execute(
                        f"SELECT count(*) FROM {table} WHERE id = ? AND {same_text}", current
                    ).fetchone()[0]
                if changed:
                    conn.execute(
                        "INSERT OR REPLACE INTO memory_vector (tier, row_id, model, vector) VALUES (?, ?, ?, ?)",
                        (tier, row["id"], model, stored),
                    )
                    saved.append(row["id"])
            return saved, self.vector_generation(conn)

        return self.write(work)

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

    def persona(self, conn: sqlite3.Connection, agent: str) -> sqlite3.Row | None:
        return conn.execute(
            "SELECT id, key, value, updated_at FROM memory_durable WHERE key = ?", ("persona/" + agent,)
        ).fetchone()


# ==== Embeddings (optional) ====

QUERY_EMBED_TIMEOUT_S = 2.0  # past this, recall answers keyword-only (degraded) rather than wait
EMBED_BATCH = 32
SWEEP_INTERVAL_S = 30  # the worker also looks for rows other writers added without vectors
WRITE_EMBED_TIMEOUT_S = 1.0  # a write waits this long for its row's vector (about 5 ms); then the worker has it
# Recall is degraded while more rows than this lack a vector: the fleet's direct writes (10k rows an hour would be
# embedded as they come) never reach it; a bulk import or a stalled embedder does. The worker embeds about
# 200 rows/s on 2 cores (bench/recall_ab.py), so this is a few seconds behind.
DEGRADED_BACKLOG_ROWS = 1000


def embedding_text(tier: str, row: Any) -> str:
    """What a row's vector is made of: its writer and topic carry signal (LoCoMo vector hit@5 +0.19)."""
    agent, label, text = (row[name] for name in TIER_TABLE[tier].embedded)
    return f"{agent} ({label}): {text}" if label else f"{agent}: {text}"


def embed_missing(
    store: Store, embedder: Any, batch: int = EMBED_BATCH, progress: Callable[[int], None] | None = None
) -> int:
    """Embed every row that lacks a vector from this model, batch by batch; return how many.

    Idempotent and resumable: it only ever picks rows without a vector, and
    each batch is its own short write transaction.
    """
    done = 0
    for tier in (tier.name for tier in EMBEDDED_TIERS):
        while True:
            rows = store.rows_missing_vectors(tier, embedder.model_id, batch)
            if not rows:
                break
            vectors = embedder.embed([embedding_text(tier, row) for row in rows])
            saved, _ = store.save_vectors(tier, embedder.model_id, list(zip(rows, vectors)))
            done += len(saved)
            if progress:
                progress(done)
            if not saved:
                break  # every row changed under us; the next sweep takes them
    return done


class EmbedWorker(threading.Thread):
    """Embeds rows at write (read-your-writes) and, in the background, whatever that missed.

    The service's own writes are embedded before they are acknowledged (about
    5 ms a row, bench/recall_ab.py), on a pool of one thread with a timeout: a
    write never fails because of the embedder, and one it could not embed in
    time waits for the background pass. The background pass also embeds the
    rows the fleet writes straight into the database, found at each sweep.
    """

    def __init__(self, store: Store, embedder: Any):
        super().__init__(name="embed-worker", daemon=True)
        self.store, self.embedder = store, embedder
        self.wake = threading.Event()
        self.halted = threading.Event()  # set by stop(): cuts a pause short
        self.wake.set()  # rows from before this start are embedded at once, not after the first sweep interval
        self.stopped = False
        self.last_error: str | None = None
        # Rows without a vector, each once: those the last count found (at start and each sweep: the fleet's
        # direct writes) less those embedded since, and the service's own rows its write could not embed.
        self.lock = threading.Lock()
        self.counted = store.count_missing_vectors(embedder.model_id)
        self.queued: set[tuple[str, int]] = set()
        self.pool = concurrent.futures.ThreadPoolExecutor(1, "embed-write")
        self.stuck: concurrent.futures.Future | None = None

    @property
    def backlog(self) -> int:
        return self.counted + len(self.queued)

    def queue(self, key: tuple[str, int]) -> None:
        """A row the write could not embed: count it (once), and embed it soon."""
        with self.lock:
            self.queued.add(key)
            self.wake.set()

    def embed_written(self, tier: str, row_id: int, index: solos_rank.VectorIndex | None) -> None:
        """Embed a row the service just wrote and put it in the vector index, before the write is acknowledged.

        Waits at most WRITE_EMBED_TIMEOUT_S (at once not at all while an earlier one still runs); then, or on
        any failure, the row waits for the background pass and the write goes on.
        """
        if self.stuck is not None and not self.stuck.done():
            self.queue((tier, row_id))
            return
        future = self.pool.submit(self.embed_rows, tier, [row_id], index)
        try:
            future.result(timeout=WRITE_EMBED_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            self.stuck = future
            self.queue((tier, row_id))
        except Exception as error:  # a broken embedder or a busy database: the background pass retries
            log_event("embed_failed", reason=f"{type(error).__name__}: {error}", tier=tier, id=row_id)
            self.queue((tier, row_id))

    def embed_rows(self, tier: str, ids: list[int], index: solos_rank.VectorIndex | None) -> None:
        """Embed these rows if they lack a vector, save the vectors, and hand them to the index."""
        import numpy as np

        rows = self.store.rows_missing_vectors(tier, self.embedder.model_id, len(ids), ids)
        if not rows:
            return  # unchanged text keeps its vector
        blobs = self.embedder.embed([embedding_text(tier, row) for row in rows])
        saved, generation = self.store.save_vectors(tier, self.embedder.model_id, list(zip(rows, blobs)))
        for row, blob in zip(rows, blobs):
            if index is not None and row["id"] in saved:
                expires = row["expires_at"] if "expires_at" in row.keys() else None
                vector = np.frombuffer(blob, dtype="<f4")
                index.add(self.store, tier, row["id"], row["agent"], expires, vector, generation)

    def run(self) -> None:
        while not self.stopped:
            woken = self.wake.wait(SWEEP_INTERVAL_S)
            if woken and not self.stopped:
                time.sleep(0.05)  # let a burst of writes arrive, to embed them as one batch
            if self.stopped:  # stop() wakes it: a stopped service writes nothing more
                return
            self.wake.clear()
            try:
                self.catch_up(recount=not woken)
                self.last_error = None
            except Exception as error:  # a broken embedder or a busy database: rows wait for the next sweep
                self.last_error = f"{type(error).__name__}: {error}"
                log_event("embed_failed", reason=self.last_error)
                self.halted.wait(1)

    def catch_up(self, recount: bool) -> None:
        """Embed every row without a vector, counting the backlog down; a timed sweep counts it afresh."""
        if recount:
            missing = self.store.count_missing_vectors(self.embedder.model_id)
            with self.lock:  # the count includes the queued rows
                self.counted, self.queued = missing, set()
        else:
            with self.lock:
                self.counted, self.queued = self.counted + len(self.queued), set()
        counted = [0]

        def progress(done: int) -> None:
            with self.lock:
                self.counted, counted[0] = max(0, self.counted - (done - counted[0])), done

        embed_missing(self.store, self.embedder, progress=progress)
        with self.lock:
            if not self.queued:  # nothing was queued meanwhile: nothing is left
                self.counted = 0

    def stop(self) -> None:
        """Stop and wait for a sweep in progress, so nothing writes after the service has closed."""
        self.stopped = True
        self.halted.set()
        self.wake.set()
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout=10)


# ==== Operations ====

TIERS = ("short", "long", "episodic", "durable")
DEFAULT_TIERS = ("long", "short")
SCOPES = ("own", "shared", "shared_except_self")
KEYWORD_ONLY_REASON = "keyword-only recall: no embedder is loaded"
RANKING_LEGS = {"recency": [], "keyword": ["keyword"], "vector": ["vector"], "hybrid": ["keyword", "vector"]}


LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass
class Stats:
    """Counters since start; /v1/stats shows them so a green 200 is never mistaken for working recall."""

    started: float = field(default_factory=time.time)
    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: Counter = field(default_factory=Counter)
    rejections: Counter = field(default_factory=Counter)
    recall_hits: Counter = field(default_factory=Counter)
    recall_empty: int = 0
    duplicates_suppressed: int = 0
    recent_rejections: list = field(default_factory=list)
    requests: Counter = field(default_factory=Counter)  # (route, method, status) -> count
    latency: dict = field(default_factory=dict)  # route -> [count per LATENCY_BUCKETS_S bucket..., +Inf, sum]

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        """Count one answered request and its latency, for /metrics."""
        with self.lock:
            self.requests[(route, method, status)] += 1
            buckets = self.latency.setdefault(route, [0] * (len(LATENCY_BUCKETS_S) + 1) + [0.0])
            buckets[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
            buckets[-1] += seconds

    def count(self, counter: str, key: str, amount: int = 1) -> None:
        with self.lock:
            getattr(self, counter)[key] += amount

    def reject(self, agent: str | None, operation: str, error: ServiceError, claimed: Any = None) -> None:
        """Log and count a refused call: the caller (its token's holder when tokens are on), operation, reason."""
        record = {"agent": agent, "operation": operation, "code": error.code, "reason": error.message}
        if claimed is not None and claimed != agent:
            record["claimed_agent"] = describe(claimed)
        error.counted = True
        log_event("rejected", **record)
        with self.lock:
            self.rejections[error.code] += 1
            self.recent_rejections = [{"ts": utc_now(), **record}, *self.recent_rejections[:19]]

    def record_recall(self, results: list[dict], suppressed: int) -> None:
        """One recall's rows per tier, whether it found nothing, and the duplicates it collapsed."""
        with self.lock:
            self.duplicates_suppressed += suppressed
            self.recall_hits.update(r["tier"] for r in results)
            self.recall_empty += not results

    def snapshot(self) -> dict:
        with self.lock:
            return {
                "uptime_s": round(time.time() - self.started, 1),
                "calls": dict(self.calls),
                "rejections": dict(self.rejections),
                "recent_rejections": list(self.recent_rejections),
                "recall_hits": dict(self.recall_hits),
                "recall_empty": self.recall_empty,
                "duplicates_suppressed": self.duplicates_suppressed,
                "answered_503": sum(n for (_, _, status), n in self.requests.items() if status == 503),
            }


class Memory:
    """What operations work on: the store, the optional embedder and its vectors, the counters."""

    def __init__(self, store: Store, embedder: Any = None, embedder_error: str | None = None, rerank: bool = True):
        self.store = store
        self.rerank = rerank
        self.embedder = embedder
        self.embedder_error = embedder_error or (None if embedder else KEYWORD_ONLY_REASON)
        self.stats = Stats()
        self.activity = solos_status.Activity()
        self.vectors = solos_rank.VectorIndex(embedder.model_id, [t.name for t in EMBEDDED_TIERS]) if embedder else None
        self.common_words = solos_rank.CommonWords(store)
        self.worker = EmbedWorker(store, embedder) if embedder else None
        self.query_pool = concurrent.futures.ThreadPoolExecutor(1, "embed-query") if embedder else None
        self.stuck_query: concurrent.futures.Future | None = None
        self.mirror: solos_qdrant.Mirror | None = None
        if self.worker:
            self.worker.start()
        self.dataspace = solos_dataspace.Dataspace(store)

    def embedder_state(self) -> dict:
        """The embedder's state: one answer for /health, /v1/stats, /metrics, the startup line and recall."""
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
        return {"embedder_state": state, "embed_backlog": backlog, "degraded": bool(reason), "degraded_reason": reason}

    def written(self, tier: str | None = None, row_id: int | None = None) -> None:
        """A row was written (or removed: no row): embed it before the write is acknowledged, wake subscribers."""
        if self.worker and tier is not None and row_id is not None:
            self.worker.embed_written(tier, row_id, self.vectors)
            self.worker.wake.set()  # as before: a write also has the fleet's direct writes looked for
        self.dataspace.wake()

    def embed_query(self, text: str) -> tuple[Any, str | None]:
        """The query's vector, or None and why (no embedder, still busy, failed, timed out)."""
        if self.embedder is None:
            return None, self.embedder_error
        if self.stuck_query is not None and not self.stuck_query.done():
            return None, "keyword-only recall: the embedder is still busy with a query that timed out"
        assert self.query_pool is not None  # set whenever embedder is
        future = self.query_pool.submit(self.embedder.embed, [text])
        try:
            blob = future.result(timeout=QUERY_EMBED_TIMEOUT_S)[0]
        except concurrent.futures.TimeoutError:
            self.stuck_query = future  # later queries degrade at once instead of queueing behind it
            return None, f"keyword-only recall: the embedder took over {QUERY_EMBED_TIMEOUT_S} s"
        except Exception as error:
            return None, f"keyword-only recall: the embedder failed ({type(error).__name__}: {error})"
        import numpy as np

        return np.frombuffer(blob, dtype="<f4"), None

    def close(self) -> None:
        self.dataspace.stop()
        if self.worker:
            self.worker.stop()
        if self.query_pool:
            self.query_pool.shutdown(wait=False, cancel_futures=True)
        self.common_words.close()
        if self.mirror:
            self.mirror.stop()
            self.mirror.join(timeout=10)  # it closes its client: a local-mode folder is unlocked after this
        self.store.close()


def op_recall_memory(memory: Memory, args: dict) -> dict:
    """Recall memory across agents and tiers, best match first.

    Every result names its writer (`agent`) and says whether it is `foreign`
    to the caller. With an empty `q` the most recent rows come back. Scope
    `own` reads only the caller's rows, `shared` everyone's, and
    `shared_except_self` everyone else's. Tiers default to long + short;
    `episodic` includes other agents' events only where they opted in (and
    the read is audited); `durable` is the caller's own persona only.
    Ranking fuses BM25 keyword matches with embedding similarity, then a
    learned reranker reorders the best (`reranked`); `score` is in [0, 1] and
    comparable within one response. Each row's `relevance` is the calibrated
    probability that it is relevant to `q`; rows under `min_relevance`
    (default 0: every match) are left out and counted in `below_floor`: an
    empty answer then means nothing relevant, not a failure. `tags` keeps rows
    carrying any of them. `receipt` says, without content, which legs ran and
    how many rows the caller may read were considered. `degraded: true` means
    part of the ranking was unavailable (the embedder missing, failing or far
    behind: keyword-only) and says why. Identical texts are collapsed and
    counted in `suppressed_duplicates`.
    """
    plan = plan_recall(memory, args)
    found, ranked = memory.store.read(lambda conn: rank(memory, plan, conn))
    return present(memory, plan, found, ranked)


@dataclass(frozen=True)
class RecallPlan:
    """What one recall will do, decided before it reads anything."""

    caller: str
    k: int
    scope: str
    tiers: tuple[str, ...]  # as asked, durable included
    searched: tuple[Tier, ...]
    query: str
    words: list[str]
    match: str | None  # the FTS5 query; None: no words to match
    vector: Any  # the question's embedding, or None
    ranking: str  # recency, keyword, vector or hybrid
    reason: str | None  # why ranking is degraded, or None
    depth: int  # candidates per tier and leg
    tags: tuple[str, ...]  # only rows carrying one of these; () for any
    floor: float  # min_relevance


@dataclass
class Gathered:
    """What one read found: the persona, each leg's candidates, and the ranking they allow."""

    persona: list[dict]
    candidates: dict[tuple[str, int], dict]
    similar: dict[tuple[str, int], float]
    ranking: str  # the plan's, or keyword when no row of these tiers has a vector yet
    around: solos_rank.Around = field(default_factory=dict)  # topic neighbours read so far
    reranked: bool = False  # the learned reranker ordered the best rows
    rerank_failure: str | None = None  # why it could not, leaving the first pass's order
    without_vector: int | None = None  # candidates with no vector yet; None: no embedder, or no question


def plan_recall(memory: Memory, args: dict) -> RecallPlan:
    """Check the request against the rules, parse the question, embed it if the embedder may rank."""
    caller, k, scope = args["agent"], args["k"], args["scope"]
    tiers = tuple(dict.fromkeys(args["tiers"] or DEFAULT_TIERS))
    if "durable" in tiers and scope == "shared_except_self":
        raise Forbidden("durable memory is private: an agent may read only its own persona/<agent> record", "tiers")
    searched = [TIER_TABLE[tier] for tier in tiers if tier != "durable"]
    if args["archive"]:
        if "episodic" not in tiers:
            raise BadRequest("archive=true searches archived episodic rows: add episodic to tiers", "archive")
        searched.append(TIER_TABLE[solos_lifecycle.ARCHIVE_TIER])
    query = args["q"] or ""
    words = solos_rank.query_words(query)
    match = solos_rank.make_fts_query(words)
    vector, reason = None, memory.embedder_state()["degraded_reason"]  # what /health says, this very moment
    if match and args["ranking"] != "keyword" and memory.embedder is not None:
        vector, failure = memory.embed_query(query)
        reason = failure or reason
    if match is None:
        ranking = "recency"
    else:
        ranking = "keyword" if vector is None else ("vector" if args["ranking"] == "vector" else "hybrid")
    depth = max(solos_rank.CANDIDATE_DEPTH, k * 4 + 20)  # room for collapsed duplicates without a second query
    tags = tuple(dict.fromkeys(args["tags"] or ()))
    return RecallPlan(
        caller,
        k,
        scope,
        tiers,
        tuple(searched),
        query,
        words,
        match,
        vector,
        ranking,
        reason,
        depth,
        tags,
        args["min_relevance"],
    )


def gather(memory: Memory, plan: RecallPlan, conn: sqlite3.Connection) -> Gathered:
    """Every candidate both legs find, in one read snapshot, already filtered by scope, sharing and expiry."""
    store, caller, scope = memory.store, plan.caller, plan.scope
    Store.require_agent(conn, caller)
    persona = []
    if "durable" in plan.tiers and not plan.tags:  # a persona has no tags
        row = store.persona(conn, caller)
        if row is not None and (plan.match is None or solos_rank.term_overlap(plan.query, row["value"])):
            persona.append(solos_rank.durable_result(row, caller))
    if plan.match is None:
        if plan.query.strip():  # words-free text (only punctuation): nothing can match
            return Gathered(persona, {}, {}, plan.ranking)
        recent = {
            (tier.name, row["id"]): solos_rank.tier_result(tier, row, caller)
            for tier in plan.searched
            for row in store.recent_rows(conn, tier, caller, scope, plan.depth, plan.tags)
        }
        return Gathered(persona, recent, {}, plan.ranking)
    ranking, vectors = plan.ranking, memory.vectors
    names = [tier.name for tier in plan.searched]
    if plan.vector is not None and vectors is not None:
        vectors.refresh(store, conn, names)
        if not vectors.count(names):  # no row of these tiers has a vector (yet): the keyword leg alone
            ranking = "keyword"
    candidates: dict[tuple[str, int], dict] = {}
    around: solos_rank.Around = {}
    if ranking != "vector":
        candidates = solos_rank.keyword_candidates(
            store,
            conn,
            plan.searched,
            caller,
            scope,
            plan.match,
            plan.words,
            plan.depth,
            around,
            memory.common_words,
            plan.tags,
        )
    similar: dict[tuple[str, int], float] = {}
    if ranking in ("vector", "hybrid") and vectors is not None:
        sharing = store.sharing_agents(conn)
        similar = solos_rank.vector_candidates(vectors, plan.vector, plan.searched, caller, scope, sharing, plan.depth)
        for tier in plan.searched:  # rows only the vector leg found, read through the same SQL filters
            missing = [row_id for (name, row_id) in similar if name == tier.name and (name, row_id) not in candidates]
            for row in store.rows_by_id(conn, tier, caller, scope, missing, plan.tags) if missing else ():
                candidates[(tier.name, row["id"])] = {**solos_rank.tier_result(tier, row, caller), "keyword": None}
    if vectors is not None:
        found = Gathered(persona, candidates, similar, ranking, around)
        found.without_vector = vectors.lacking(list(candidates))
        return found
    return Gathered(persona, candidates, similar, ranking, around)


def rank(memory: Memory, plan: RecallPlan, conn: sqlite3.Connection) -> tuple[Gathered, list[dict]]:
    """Gather, fuse, rerank: in one read snapshot, since the reranker reads the best rows' topic neighbours."""
    found = gather(memory, plan, conn)
    if found.ranking == "recency":
        return found, sorted(found.candidates.values(), key=lambda r: r["ts"] or "", reverse=True)
    fused = solos_rank.fuse(found.candidates, found.similar, found.ranking)
    if found.ranking == "vector":  # vector alone is for comparing the legs: no reranker, no relevance
        return found, fused.rows
    vectors = memory.vectors if found.ranking == "hybrid" else None
    ranked, found.rerank_failure = solos_rank.rerank(
        memory.store, conn, plan, fused, vectors, found.around, memory.rerank
    )
    found.reranked = memory.rerank and found.rerank_failure is None
    return found, ranked


def present(memory: Memory, plan: RecallPlan, found: Gathered, ranked: list[dict]) -> dict:
    """Collapse duplicates, cut to k after the relevance floor, audit foreign episodes, count; the response."""
    for result in found.persona:
        result["relevance"] = 1.0  # the caller's own persona, shown only when it shares a word with the question
    results, collapsed = solos_rank.collapse_duplicates(found.persona + ranked, plan.k)
    below = [r for r in results if r.get("relevance") is not None and r["relevance"] < plan.floor]
    if below:  # the top k as it would be with no floor, less the rows under it, refilled from those above it
        passing = [r for r in found.persona + ranked if r.get("relevance") is None or r["relevance"] >= plan.floor]
        results, collapsed = solos_rank.collapse_duplicates(passing, plan.k)
    for result in results:  # presentation work, only for the rows returned
        result["score"] = round(result["score"], 6)
        result["relevance"] = None if result.get("relevance") is None else round(result["relevance"], 6)
        if "tags" in result:
            result["tags"] = solos_rank.parse_tags(result["tags"])
    # A collapsed copy is revealed too (its twin's duplicates, also_written_by): its read is audited as well.
    audit = [(r["agent"], r["id"]) for r in results + collapsed if r["tier"] == "episodic" and r["foreign"]]
    if audit:
        memory.store.record_audit(plan.caller, audit)
    memory.stats.record_recall(results, len(collapsed))
    memory.activity.recalled(plan.caller, [r["agent"] for r in results])
    reason = "; ".join(why for why in (plan.reason, found.rerank_failure) if why) or None
    return {
        "agent": plan.caller,
        "q": plan.query,
        "k": plan.k,
        "scope": plan.scope,
        "tiers": list(plan.tiers),
        "count": len(results),
        "results": results,
        "suppressed_duplicates": len(collapsed),
        "min_relevance": plan.floor,
        "below_floor": len(below),
        "degraded": reason is not None,
        "degraded_reason": reason,
        "ranking": found.ranking,
        "reranked": found.reranked,
        "receipt": {
            "legs": RANKING_LEGS[found.ranking],
            "considered": len(found.persona) + len(found.candidates),
            "below_floor": len(below),
            "without_vector": found.without_vector,
        },
    }


def op_write_short(memory: Memory, args: dict) -> dict:
    """Write a short-term key/value for the calling agent, expiring after ttl_s seconds.

    Upserts on (agent, key): writing the same key again replaces the value and
    restarts its TTL. Expired keys are never recalled.
    """
    outcome = memory.store.upsert_short(args["agent"], args["key"], args["value"], args["ttl_s"], args["tags"] or [])
    memory.written("short", outcome["id"])
    return {"tier": "short", "agent": args["agent"], "key": args["key"], **outcome}


def op_write_long(memory: Memory, args: dict) -> dict:
    """Store a long-term fact attributed to the calling agent.

    The write key is the fact's full content: the same fact from the same
    agent updates one row (topic, source, confidence, tags), and an identical
    retry answers `unchanged` and changes nothing; a different fact is a new
    row, however long a prefix the two share.
    """
    outcome = memory.store.upsert_long(
        args["agent"], args["topic"], args["fact"], args["source"], args["confidence"], args["tags"] or []
    )
    memory.written("long", outcome["id"])
    return {"tier": "long", "agent": args["agent"], **outcome}


def op_write_episodic(memory: Memory, args: dict) -> dict:
    """Append an episodic event (what happened, how it went) for the calling agent.

    Give an idempotency_key to make retries safe: a retried write with the
    same key and content returns the first row (status `unchanged`).
    """
    event = {name: args[name] for name in ("event_type", "summary", "details", "outcome", "duration_s")}
    outcome = memory.store.append_episodic(args["agent"], event, args["idempotency_key"])
    memory.written("episodic", outcome["id"])
    return {"tier": "episodic", "agent": args["agent"], **outcome}


def op_delete_short(memory: Memory, args: dict) -> dict:
    """Delete one of the calling agent's short-term keys (never another agent's)."""
    outcome = memory.store.delete_short(args["agent"], args["key"], memory.dataspace.note_removal)
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
    """Counts per tier, embed backlog, degraded state, counters, and agents' writes and recalls (hour, day).

    An agent sees its own recent rejections and activity only; the operator view (the operator token, or
    no agent named under loopback trust) sees everyone's.
    """
    embedder, snapshot = memory.embedder, memory.stats.snapshot()
    if args["agent"] is not None:
        snapshot["recent_rejections"] = [r for r in snapshot["recent_rejections"] if r["agent"] == args["agent"]]
    return {
        "version": __version__,
        "view": "operator" if args["agent"] is None else "agent",
        **memory.store.counts(),
        **snapshot,
        "embedder": embedder.model_id if embedder else None,
        "vectors": memory.store.count_vectors(embedder.model_id) if embedder else {},
        "embed_error": memory.worker.last_error if memory.worker else None,
        **memory.embedder_state(),
        "activity": memory.activity.snapshot(memory.store.writes_by_agent(), args["agent"]),
        "qdrant": solos_qdrant.mirror_status(memory.store, memory.mirror),
        **memory.store.read(solos_lifecycle.lifecycle_counts),
        "event_streams": memory.dataspace.stats(),
    }


# ==== Operation table ====


@dataclass(frozen=True)
class Operation:
    """One capability: a REST route and an MCP tool over the same function and schema."""

    name: str
    method: str
    path: str
    function: Callable[[Memory, dict], dict]
    input_schema: dict
    output_schema: dict
    writes: bool
    idempotent: bool
    destructive: bool = False
    title: str = ""
    operator: bool = False  # the operator token may call it (an agent's token always may)

    @property
    def description(self) -> str:
        return " ".join((self.function.__doc__ or "").split())


def object_schema(properties: dict, required: tuple[str, ...] = ("agent",)) -> dict:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


def result_schema(properties: dict) -> dict:
    """An output schema: these fields always present, more may follow."""
    return {"type": "object", "properties": properties, "required": list(properties)}


NULLABLE_STRING = {"type": ["string", "null"]}


def text_field(description: str, max_length: int, min_length: int = 0) -> dict:
    """A stored text field's schema: a string without NUL, of bounded length."""
    bounds = {"minLength": min_length} if min_length else {}
    return {"type": "string", "pattern": NO_NUL, **bounds, "maxLength": max_length, "description": description}


WRITE_OUTPUT = result_schema(
    {
        "tier": {"type": "string", "enum": ["short", "long", "episodic"]},
        "agent": {"type": "string"},
        "id": {"type": "integer"},
        "status": {
            "type": "string",
            "enum": ["created", "updated", "unchanged", "deleted"],
            "description": "What the write did; REST answers 201 for created, else 200.",
        },
    }
)
RECALLED_ROW = result_schema(
    {
        "id": {"type": "integer"},
        "tier": {"type": "string", "enum": list(TIERS)},
        "agent": {"type": "string", "description": "Who wrote it."},
        "ts": NULLABLE_STRING,
        "score": {"type": "number", "description": "Higher is better; comparable within one response."},
        "source": {"type": "string"},
        "foreign": {"type": "boolean", "description": "true when another agent wrote it."},
        "text": {"type": "string"},
        "relevance": {
            "type": ["number", "null"],
            "description": "The probability (0-1) that the row is relevant to q, calibrated on a dev set; null "
            "without words to judge by (empty q) or with ranking=vector.",
        },
    }
)
RECALL_OUTPUT = result_schema(
    {
        "agent": {"type": "string"},
        "count": {"type": "integer"},
        "results": {"type": "array", "items": RECALLED_ROW},
        "suppressed_duplicates": {"type": "integer", "description": "Identical texts collapsed out of the results."},
        "min_relevance": {"type": "number", "description": "The floor this recall applied."},
        "below_floor": {
            "type": "integer",
            "description": "Rows of the top k left out for a relevance under the floor: with count 0, an honest "
            "'nothing relevant', not a failure.",
        },
        "receipt": {
            "type": "object",
            "description": "What this recall did, without content: legs run, visible rows considered, rows below "
            "the floor, and matches with no vector yet (null without an embedder). Counts only rows the caller "
            "may read.",
            "properties": {
                "legs": {"type": "array", "items": {"type": "string", "enum": ["keyword", "vector"]}},
                "considered": {"type": "integer"},
                "below_floor": {"type": "integer"},
                "without_vector": {"type": ["integer", "null"]},
            },
        },
        "degraded": {"type": "boolean", "description": "true: a leg or the reranker was unavailable (see the reason)."},
        "degraded_reason": NULLABLE_STRING,
        "ranking": {"type": "string"},
        "reranked": {"type": "boolean", "description": "true: the learned reranker ordered the best rows."},
    }
)


OPERATIONS = {
    "recall": Operation(
        "recall",
        "GET",
        "/v1/recall",
        op_recall_memory,
        object_schema(
            {
                "agent": AGENT_SCHEMA,
                "q": {
                    "type": "string",
                    "maxLength": 10_000,
                    "default": "",
                    "description": "What to look for, in plain words; empty returns the most recent rows.",
                },
                "k": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 100,
                    "default": 5,
                    "description": "How many results, 1-100.",
                },
                "scope": {
                    "type": "string",
                    "enum": list(SCOPES),
                    "default": "shared",
                    "description": "own: the caller's rows; shared: everyone's; shared_except_self: everyone else's.",
                },
                "ranking": {
                    "type": "string",
                    "enum": ["auto", "hybrid", "keyword", "vector"],
                    "default": "auto",
                    "description": "auto or hybrid: both legs when the embedder is loaded, else keyword "
                    "(degraded_reason says why); keyword or vector: one leg only (for comparison).",
                },
                "tiers": {
                    "type": "array",
                    "items": {"type": "string", "enum": list(TIERS)},
                    "maxItems": 4,
                    "uniqueItems": True,
                    "default": list(DEFAULT_TIERS),
                    "description": "Tiers to search (REST: comma-separated). Default long,short.",
                },
                "archive": {
                    "type": "boolean",
                    "default": False,
                    "description": "Also search archived episodic rows (needs episodic in tiers; keyword-ranked).",
                },
                "tags": {
                    **TAGS_SCHEMA,
                    "description": "Only rows carrying any of these tags (REST: comma-separated); rows of tiers "
                    "without tags (episodic, durable) never match. With an empty q: the newest such rows.",
                },
                "min_relevance": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": 1,
                    # 0 by default: the calibration is fitted on chat turns and rejects only 0.16 of foreign
                    # questions at the floor that keeps hit@5 (RESULTS-locomo.md, "Honest recall"), and misses
                    # paraphrases; dropping rows for every caller of the fleet needs better evidence than that.
                    # What goes straight into a prompt (turn_context, the Hermes prefetch) uses the floor.
                    "default": 0.0,
                    "description": "Leave out rows less likely than this to be relevant (see relevance); default 0: "
                    f"every match. The client's turn helpers use {solos_rank.RELEVANCE_FLOOR}. Not applied to an "
                    "empty q.",
                },
            }
        ),
        RECALL_OUTPUT,
        writes=False,
        idempotent=True,
        title="Recall memory",
    ),
    "write_short": Operation(
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
    "write_long": Operation(
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
    "write_episodic": Operation(
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
    "delete_short": Operation(
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
    "set_sharing": Operation(
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
    "read_audit": Operation(
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
                "before_id": {"type": "integer", "minimum": 1, "description": "Page: only reads with a smaller id."},
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
    "stats": Operation(
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
    "promote": Operation(
        "promote",
        "POST",
        "/v1/promote",
        solos_lifecycle.op_promote_memory,
        object_schema({"agent": AGENT_SCHEMA, **solos_lifecycle.PROMOTE_INPUT_PROPERTIES}, ("agent", "ids")),
        result_schema(solos_lifecycle.PROMOTE_OUTPUT_PROPERTIES),
        writes=True,
        idempotent=True,
        title="Promote episodes to a long-term fact",
    ),
    "forget": Operation(
        "forget",
        "DELETE",
        "/v1/memory",
        solos_dataspace.op_forget_memory,
        object_schema({"agent": AGENT_SCHEMA, **solos_dataspace.FORGET_FIELDS}, ("agent", "tier", "id")),
        result_schema(solos_dataspace.FORGET_OUTPUT),
        writes=True,
        idempotent=False,
        destructive=True,
        title="Forget one of my rows",
    ),
    "read_events": Operation(
        "read_events",
        "GET",
        "/v1/events",
        solos_dataspace.op_read_events,
        object_schema(solos_dataspace.event_fields(AGENT_SCHEMA, TAGS_SCHEMA, TIERS, SCOPES, DEFAULT_TIERS)),
        result_schema(solos_dataspace.EVENTS_OUTPUT),
        writes=False,
        idempotent=True,
        title="What changed since an event id",
    ),
}
ROUTES = {(op.method, op.path): op for op in OPERATIONS.values()}


OPERATOR = "@operator"  # the holder of the operator token: not an agent name (those start alphanumeric)


class Tokens:
    """Optional per-agent bearer tokens: the token, not the request body, names the caller.

    The file holds one `<sha256 hex of token> <agent>` per line (`@operator` for the operator view); it
    must not be readable by group or others. Tokens themselves are never stored or logged.
    """

    def __init__(self, by_hash: dict[str, str]):
        self.by_hash = by_hash

    @classmethod
    def load(cls, path: str) -> Tokens:
        mode = os.stat(path).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SystemExit(f"{path}: tokens file must not be accessible by group or others (chmod 600)")
        by_hash = {}
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip() or line.startswith("#"):
                    continue
                parts = line.split()
                if (
                    len(parts) != 2
                    or not re.fullmatch(r"[0-9a-f]{64}", parts[0])
                    or not (fully_matches(AGENT_PATTERN, parts[1]) or parts[1] == OPERATOR)
                ):
                    raise SystemExit(f"{path}:{number}: expected '<sha256 hex> <agent>'")
                by_hash[parts[0]] = parts[1]
        return cls(by_hash)

    def agent_for(self, authorization: str | None) -> str:
        """The agent a bearer token belongs to; compared in constant time."""
        if not authorization or not authorization.startswith("Bearer "):
            # Worded without the scheme name: Hermes redacts "Bearer <word>" from error text.
            raise Unauthorized("this service needs the calling agent's token in the Authorization header")
        digest = hashlib.sha256(authorization[7:].strip().encode("utf-8")).hexdigest()
        found = None
        for known, agent in self.by_hash.items():
            if hmac.compare_digest(known, digest):
                found = agent
        if found is None:
            raise Unauthorized("the bearer token is not known")
        return found


def invoke(memory: Memory, tokens: Tokens | None, op: Operation, raw_args: Any, headers: Mapping[str, str]) -> dict:
    """Authenticate, validate and run one operation; count and log refusals.

    The one path both transports take, so validation, identity and errors
    live once.
    """
    claimed = raw_args.get("agent") if isinstance(raw_args, dict) else None
    agent = claimed if tokens is None and isinstance(claimed, str) else None  # who the rejection log names
    memory.stats.count("calls", op.name)
    try:
        if tokens is not None:
            caller = agent = tokens.agent_for(headers.get("Authorization"))
            if caller == OPERATOR:
                if not op.operator:
                    raise Forbidden(f"the operator token may not call {op.name}; agents use their own", "agent")
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

# A write's largest field is 16 KiB of text; JSON escaping can grow it up to 6x
# (\uXXXX), so 128 KiB admits every valid write and stops a memory-hungry body early.
MAX_BODY_BYTES = 128 * 1024
# The whole body, not each byte: a per-read timeout let a client hold a thread forever at one byte per 29 s.
# 128 KiB in 10 s is 13 KB/s, far below any loopback or LAN client.
BODY_DEADLINE_S = 10
SERVED_METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")


def status_for(result: dict) -> int:
    return 201 if result.get("status") == "created" else 200


def degraded_header(result: dict) -> dict[str, str]:
    return {"X-Memory-Degraded": "true" if result["degraded"] else "false"} if "degraded" in result else {}


class MemoryHandler(BaseHTTPRequestHandler):
    """Answers every request itself: JSON bodies, Content-Length, one write per response."""

    protocol_version = "HTTP/1.1"
    server_version = "solos-memory/" + __version__
    timeout = solos_connections.KEEPALIVE_IDLE_S
    server: MemoryServer
    started: float | None = None  # when the current request's route() began

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
            error = ProtocolError(code, message)
        self.respond(error.status, error_body(error), error.headers())

    def respond(
        self,
        status: int,
        payload: dict | bytes | None,
        headers: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        body = payload if isinstance(payload, bytes) else b"" if payload is None else json.dumps(payload).encode()
        lines = [
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            f"Server: {self.server_version}",
            f"Date: {self.date_time_string()}",
        ]
        if body or status not in (202, 204):
            lines.append(f"Content-Type: {content_type}")
        lines.append(f"Content-Length: {len(body)}")
        for name, value in (headers or {}).items():
            lines.append(f"{name}: {value}")
        if self.close_connection:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.status_sent = status
        self.count_request()  # before the write: a client that reads /metrics next must see this one
        # One write: headers and body in separate segments meet Nagle + delayed ACK (~40 ms).
        try:
            self.wfile.write(head if self.command == "HEAD" else head + body)
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
            if url.path != "/mcp":  # the bridge applies the same rule and answers in JSON-RPC
                headers = cast(Mapping[str, str], self.headers)
                refusal = mcp_bridge.foreign_caller(headers, self.server.allowed_hosts, self.server.origins)
                if refusal is not None:
                    raise Forbidden(refusal, "Host" if refusal.startswith("Host") else "Origin")
            body = self.read_body()
            self.server.forget(self.connection)  # working: not to be evicted
            if url.path in SERVICE_DOCUMENTS:
                self.only(("GET", "HEAD"))
                content_type, produce = SERVICE_DOCUMENTS[url.path]
                self.respond(200, produce(self.server), content_type=content_type)
            elif url.path == "/v1/events" and "text/event-stream" in self.headers.get("Accept", ""):
                solos_dataspace.serve_stream(self, url.query)
            elif url.path in STATUS_PAGES:  # what /v1/stats shows the same caller, readable
                self.only(("GET", "HEAD"))
                server = self.server
                stats = lambda auth: invoke(server.memory, server.tokens, OPERATIONS["stats"], {}, auth)  # noqa: E731
                page = solos_status.serve_page(self.headers.get("Authorization"), stats, server.health, Unauthorized)
                self.respond(*page, content_type="text/html; charset=utf-8")
            elif url.path == "/mcp":
                if self.server.tokens is not None and self.command == "POST":
                    # Refuse at the door, not per tool: Hermes then reports the server as not connected
                    # instead of connecting and tripping its circuit breaker on failed calls.
                    self.server.tokens.agent_for(self.headers.get("Authorization"))
                status, headers, reply = self.server.bridge.handle(
                    self.command, cast(Mapping[str, str], self.headers), body
                )
                self.respond(status, reply or None, headers, headers.pop("Content-Type", "application/json"))
            else:
                self.call_operation(url.path, url.query, body)
        except ServiceError as error:
            if body is None:
                self.close_connection = True  # what follows on the socket cannot be told from this body
            if not error.counted:
                self.server.memory.stats.reject(None, f"{self.command} {url.path}"[:200], error)
            self.respond(error.status, error_body(error), error.headers())
        except Exception:
            logging.exception("unexpected error on %s %s", self.command, url.path)
            self.close_connection = True
            self.respond(500, error_body(ServiceError("internal error; see the service log")))
        finally:
            self.server.idle(self.connection)
            if self.server.config.log_requests:
                log_event(
                    "request",
                    method=self.command,
                    path=url.path,
                    status=self.status_sent,
                    ms=round((time.perf_counter() - started) * 1000, 2),
                )

    def only(self, methods: tuple[str, ...]) -> None:
        if self.command not in methods:
            raise MethodNotAllowed(f"{self.command} is not allowed on {urlsplit(self.path).path}", list(methods))

    def call_operation(self, path: str, query: str, body: bytes) -> None:
        op = ROUTES.get((self.command, path))
        if op is None:
            allowed = [method for method, route in ROUTES if route == path]
            if allowed:
                raise MethodNotAllowed(f"{self.command} is not allowed on {path}", allowed)
            raise NotFound(f"no route {path}; see README.md for the API")
        if op.method in ("GET", "DELETE"):
            try:
                pairs = parse_qsl(query, keep_blank_values=True, errors="strict")
            except UnicodeDecodeError:
                raise BadRequest("query string must be UTF-8 percent-encoded", "query") from None
            args: Any = coerce_query(op.input_schema, pairs)
        else:
            content_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
            if content_type != "application/json":
                raise UnsupportedMediaType(
                    f"Content-Type must be application/json, got {describe(content_type)}", "Content-Type"
                )
            args = parse_json_body(body)
        result = invoke(self.server.memory, self.server.tokens, op, args, cast(Mapping[str, str], self.headers))
        self.respond(status_for(result), result, degraded_header(result))

    def read_body(self) -> bytes:
        """The whole request body, strictly framed, capped at MAX_BODY_BYTES and read within BODY_DEADLINE_S.

        Every request's body is read (or the connection closed) before it is answered, so no body can be
        taken for the next request on a kept-alive connection.
        """
        if self.headers.get("Transfer-Encoding") is not None:
            if "chunked" in self.headers["Transfer-Encoding"].lower():
                raise LengthRequired("chunked bodies are not accepted; send Content-Length", "Content-Length")
            raise BadRequest("Transfer-Encoding is not accepted; send Content-Length", "Transfer-Encoding")
        lengths = {part.strip() for raw in self.headers.get_all("Content-Length") or () for part in raw.split(",")}
        if not lengths:
            if self.command in ("POST", "PUT", "PATCH"):
                raise LengthRequired(f"a {self.command} needs a body with Content-Length", "Content-Length")
            return b""
        if len(lengths) > 1:
            raise BadRequest(f"conflicting Content-Length headers: {', '.join(sorted(lengths))}", "Content-Length")
        raw_length = lengths.pop()
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


ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": result_schema(
            {"code": {"type": "string"}, "status": {"type": "integer"}, "message": {"type": "string"}}
        )
    },
}


def openapi_document(operations: Mapping[str, Operation]) -> dict:
    """OpenAPI 3.1 for /v1, generated from the operation table so it cannot drift."""
    paths: dict[str, dict] = {
        "/health": {
            "get": {
                "operationId": "health",
                "summary": "Liveness, auth mode and degraded state",
                "responses": {
                    "200": {"description": "Up", "content": {"application/json": {"schema": {"type": "object"}}}}
                },
            }
        }
    }
    errors = {
        str(status): {"description": phrase, "content": {"application/json": {"schema": ERROR_SCHEMA}}}
        for status, phrase in (
            (400, "A field is missing or invalid; the error names it"),
            (401, "Tokens are enabled and the token is missing or unknown"),
            (403, "Not allowed for this agent"),
            (404, "No such row"),
            (409, "Idempotency key reused for another event"),
            (413, "Body over the size cap"),
            (415, "Body is not application/json"),
            (422, "The agent is not registered"),
            (503, "Database locked past the retry budget; see Retry-After"),
        )
    }
    for op in operations.values():
        spec: dict[str, Any] = {
            "operationId": op.name,
            "summary": op.title,
            "description": op.description,
            "responses": {
                "200": {"description": "OK", "content": {"application/json": {"schema": op.output_schema}}},
                **errors,
            },
        }
        if op.name == "read_events":
            spec["responses"]["200"]["content"]["text/event-stream"] = {"schema": {"type": "string"}}
        if op.writes and op.method == "POST":
            spec["responses"]["201"] = {
                "description": "Created",
                "content": {"application/json": {"schema": op.output_schema}},
            }
        if op.method in ("GET", "DELETE"):
            spec["parameters"] = [
                {
                    "name": name,
                    "in": "query",
                    "required": name in op.input_schema["required"],
                    "schema": schema,
                    **({"style": "form", "explode": False} if schema["type"] == "array" else {}),
                }
                for name, schema in op.input_schema["properties"].items()
            ]
        else:
            spec["requestBody"] = {"required": True, "content": {"application/json": {"schema": op.input_schema}}}
        paths.setdefault(op.path, {})[op.method.lower()] = spec
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "solos-memory",
            "version": __version__,
            "description": "Shared, attributed memory for an agent fleet. MCP is served at /mcp.",
        },
        "servers": [{"url": "/"}],
        "paths": paths,
    }


def label(value: Any) -> str:
    """A Prometheus label value, escaped per the text exposition format (backslash, quote, newline)."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics_text(server: MemoryServer) -> bytes:
    """Prometheus text exposition: requests, latency, rejections, degraded state, rows per tier."""
    stats, lines = server.memory.stats, []

    def family(name: str, kind: str, help_text: str) -> None:
        lines.extend([f"# HELP solos_memory_{name} {help_text}", f"# TYPE solos_memory_{name} {kind}"])

    rows = server.memory.store.counts()["rows"]
    with stats.lock:
        requests, latency = dict(stats.requests), {k: list(v) for k, v in stats.latency.items()}
        rejections, hits = dict(stats.rejections), dict(stats.recall_hits)
        suppressed = stats.duplicates_suppressed
    family("requests_total", "counter", "HTTP requests answered, by route, method and status.")
    for (route, method, status), count in sorted(requests.items()):
        lines.append(
            f'solos_memory_requests_total{{route="{label(route)}",method="{label(method)}",status="{status}"}} {count}'
        )
    family("request_duration_seconds", "histogram", "Time from request line to response written.")
    for route, buckets in sorted(latency.items()):
        cumulative = 0
        for bound, count in zip((*LATENCY_BUCKETS_S, "+Inf"), buckets[:-1]):
            cumulative += count
            lines.append(
                f'solos_memory_request_duration_seconds_bucket{{route="{label(route)}",le="{bound}"}} {cumulative}'
            )
        lines.append(f'solos_memory_request_duration_seconds_sum{{route="{label(route)}"}} {buckets[-1]:.6f}')
        lines.append(f'solos_memory_request_duration_seconds_count{{route="{label(route)}"}} {cumulative}')
    family("rejections_total", "counter", "Refused calls by reason (error code).")
    for reason, count in sorted(rejections.items()):
        lines.append(f'solos_memory_rejections_total{{reason="{label(reason)}"}} {count}')
    family("recall_hits_total", "counter", "Rows returned by recall, by tier.")
    for tier, count in sorted(hits.items()):
        lines.append(f'solos_memory_recall_hits_total{{tier="{label(tier)}"}} {count}')
    family("duplicates_suppressed_total", "counter", "Identical texts collapsed out of recall results.")
    lines.append(f"solos_memory_duplicates_suppressed_total {suppressed}")
    family("degraded", "gauge", "1 while recall is not full hybrid (no embedder, or rows without vectors).")
    lines.append(f"solos_memory_degraded {int(server.memory.embedder_state()['degraded'])}")
    family("rows", "gauge", "Rows per tier (short: live only).")
    for tier, count in rows.items():
        lines.append(f'solos_memory_rows{{tier="{label(tier)}"}} {count}')
    lines.extend(solos_qdrant.metrics_lines(solos_qdrant.mirror_status(server.memory.store, server.memory.mirror)))
    return ("\n".join(lines) + "\n").encode()


# Documents about the service itself, served on GET next to the operations.
SERVICE_DOCUMENTS: dict[str, tuple[str, Callable[[MemoryServer], Any]]] = {
    "/health": ("application/json", lambda server: server.health()),
    "/openapi.json": ("application/json", lambda server: openapi_document(OPERATIONS)),
    "/metrics": ("text/plain; version=0.0.4; charset=utf-8", metrics_text),
}
STATUS_PAGES = ("/", "/status")  # the operator's page (solos_status.py)
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


class MemoryServer(solos_connections.BoundedConnections, ThreadingHTTPServer):
    """ThreadingHTTPServer with bounded threads, the memory, and /mcp mounted."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, config: Config, memory: Memory, tokens: Tokens | None):
        self.address_family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        self.config, self.memory, self.tokens = config, memory, tokens  # before binding: a failed bind closes them
        super().__init__((config.host, config.port), MemoryHandler)
        self.port = self.server_address[1]
        self.bound_connections()
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
            "auth": "tokens" if self.tokens else "loopback-trust",
            **self.memory.embedder_state(),
        }

    def refusal(self) -> bytes:
        """The whole 503 answer for a newcomer no slot can be made for; counted."""
        self.memory.stats.count("rejections", "too_many_connections")
        error = Busy("too many connections are working; retry shortly")
        body = json.dumps(error_body(error)).encode()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
            f"Retry-After: {error.retry_after_s}\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

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
    """The database, migrated (additively); SchemaMismatch names what a fleet table lacks."""
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
    """Open (or create) the database, register agents, load extras, bind the socket."""
    if config.host not in LOOPBACK_HOSTS and not config.allow_remote:
        raise SystemExit(
            f"refusing to bind {config.host}: not a loopback address. Anyone who can reach it could read and "
            f"write every agent's memory; pass --allow-remote (and use --tokens-file) if that is intended."
        )
    try:
        if register:
            register_agents(config, list(register))
        store = open_store(config)
    except SchemaMismatch as error:
        raise SystemExit(f"{config.db}: {error}") from None
    except StorageUnavailable as error:
        raise SystemExit(f"{config.db}: cannot start: {error.message}") from None
    except sqlite3.Error as error:
        failure = STORAGE_FAILURES.get(primary_code(error) or 0, "the database cannot be used")
        raise SystemExit(f"{config.db}: cannot start: {failure} ({error})") from None
    tokens = Tokens.load(config.tokens_file) if config.tokens_file else None
    embedder, reason = load_embedder(config)
    try:
        server = MemoryServer(config, Memory(store, embedder, reason, config.rerank), tokens)
    except OSError as error:  # the port is taken, or the address is not this host's
        raise SystemExit(f"cannot listen on {config.host}:{config.port}: {error.strerror or error}") from None
    if config.qdrant:
        server.memory.mirror = solos_qdrant.start_mirror(store, config.qdrant, embedder)
    return server


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
    parser.add_argument("--db", default=argparse.SUPPRESS if nested else env_default("DB", "solos.db"), help=db_help)
    parser.add_argument(
        "--busy-timeout-ms",
        type=int,
        default=argparse.SUPPRESS if nested else env_int("BUSY_TIMEOUT_MS", 5000),
        help="how long a call waits for a locked database before 503 (default: %(default)s)",
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    creates = "SQLite database, created from schema.sql if missing (default: %(default)s)"
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
        type=int,
        default=env_int("PORT", DEFAULT_PORT),
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
        default=env_default("MODEL_DIR", None),
        help="embedder tokenizer/config folder, or 'off' (default: the carried all-MiniLM-L6-v2)",
    )
    serve.add_argument(
        "--allowed-origin",
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
    solos_qdrant.add_arguments(serve, env_default)

    agents = commands.add_parser("agents", help="register or list agents (admin; never over HTTP)")
    add_database_options(agents, creates)
    agent_commands = agents.add_subparsers(dest="agents_command", required=True)
    add = agent_commands.add_parser("add", help="register agents")
    add_database_options(add, creates, nested=True)
    add.add_argument("names", nargs="+", help="agent names")
    add_database_options(agent_commands.add_parser("list", help="list registered agents"), creates, nested=True)

    purge = commands.add_parser("purge", help="delete expired short-term rows, archive old episodes; exit 1 on failure")
    add_database_options(purge, creates)
    purge.add_argument(
        "--archive-after-days",
        type=float,
        default=float(env_default("ARCHIVE_AFTER_DAYS", "30") or 30),
        help="move episodic rows older than this to the archive, 0 never (default: %(default)s)",
    )
    add_database_options(commands.add_parser("reindex", help="rebuild the keyword indexes from the tables"), creates)
    solos_snapshot.add_commands(commands, add_database_options)
    imports = commands.add_parser(
        "import-qdrant", help="bring the Qdrant collection's attributable points in as long facts"
    )
    add_database_options(imports, creates)
    solos_qdrant.add_arguments(imports, env_default)

    check = commands.add_parser("check", help="rollout checks against a running instance; --cleanup removes their rows")
    add_database_options(check, "the service's database, for --cleanup; must exist (default: %(default)s)")
    solos_check.add_arguments(check)
    check.set_defaults(cleanup_command=f"python3 {sys.argv[0]} check --cleanup --db PATH")

    backfill = commands.add_parser(
        "backfill", help="embed every row that lacks a vector; resumable, safe while the service runs"
    )
    add_database_options(backfill, creates)
    backfill.add_argument(
        "--model-dir",
        default=env_default("MODEL_DIR", None),
        help="embedder tokenizer/config folder (default: the carried all-MiniLM-L6-v2)",
    )
    backfill.add_argument(
        "--batch",
        type=int,
        default=EMBED_BATCH,
        help="rows per embedding batch and write transaction (default: %(default)s)",
    )

    commands.add_parser("client", add_help=False, help="call a running service: client recall|remember|event --help")
    token = commands.add_parser("token", help="issue a bearer token for an agent, appended (hashed) to a tokens file")
    token.add_argument("agent", help=f"the agent the token speaks for, or {OPERATOR} for the operator view of stats")
    token.add_argument("--tokens-file", required=True, help="tokens file to append to (created with mode 600)")
    return parser.parse_args(argv)


def on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return text == "on"


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
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status so tests can call it."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["client"]:  # the rest is solos_client's own command line
        import solos_client

        return solos_client.main(argv[1:])
    args = parse_args(argv)
    if args.command == "token":
        return issue_token(args.agent, args.tokens_file)
    if args.command == "check":
        return solos_check.run(args)
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
    logging.basicConfig(level=logging.INFO, handlers=[JsonLogHandler()], force=True)
    server = build_server(config, register)
    # systemd stops the unit with SIGTERM: stop accepting, close the database, say so in the journal.
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    log_event(
        "listening",
        host=config.host,
        port=server.port,
        db=os.path.abspath(config.db),
        version=__version__,
        auth="tokens" if server.tokens else "loopback-trust",
        **server.memory.embedder_state(),
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        log_event("stopped", port=server.port)
    return 0


def issue_token(agent: str, tokens_file: str) -> int:
    """Print a new token once; only its sha256 is kept, in a file readable by the owner alone."""
    if agent != OPERATOR:
        check_agent_names([agent])
    token = secrets.token_urlsafe(32)
    descriptor = os.open(tokens_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(descriptor, "a", encoding="utf-8") as handle:
        handle.write(f"{hashlib.sha256(token.encode()).hexdigest()} {agent}\n")
    print(token)
    return 0


def backfill(store: Store, config: Config, batch: int) -> int:
    """Embed rows without a vector, with a progress line and a final count; exit 1 without an embedder."""
    embedder, reason = load_embedder(config, threads=None)
    if embedder is None:
        log_event("failed", command="backfill", reason=reason)
        return 1
    todo = store.count_missing_vectors(embedder.model_id)
    started = time.monotonic()

    def progress(done: int) -> None:
        rate = done / max(time.monotonic() - started, 1e-9)
        sys.stderr.write(f"\rbackfill: {done}/{todo} rows embedded ({rate:.0f}/s)")
        sys.stderr.flush()

    done = embed_missing(store, embedder, batch, progress)
    sys.stderr.write("\n")
    log_event(
        "backfilled",
        rows=done,
        missing_before=todo,
        model=embedder.model_id,
        seconds=round(time.monotonic() - started, 1),
        vectors=store.count_vectors(embedder.model_id),
    )
    return 0


def run_admin_command(args: argparse.Namespace, config: Config) -> int:
    """agents, purge, reindex, snapshot, restore: short transactions against the shared database."""
    if args.command in solos_snapshot.COMMANDS:  # before open_store: restore checks before touching --db
        log_event(args.command, **solos_snapshot.run_command(args, SCHEMA_VERSION))
        return 0
    if args.command == "agents" and args.agents_command == "add":
        added = register_agents(config, args.names)
        print(f"registered {len(added)} new of {len(args.names)}: {', '.join(added) or '-'}")
        return 0
    store = open_store(config)
    try:
        if args.command == "agents":
            print("\n".join(store.list_agents()))
        elif args.command == "purge":
            rows = store.purge_expired()
            log_event("purged", rows=rows, archived=solos_lifecycle.archive_episodic(store, args.archive_after_days))
        elif args.command == "reindex":
            store.reindex()
            log_event("reindexed", tables=list(FTS_TABLES))
        elif args.command == "import-qdrant":
            return solos_qdrant.run_import(store, config.qdrant)
        elif args.command == "backfill":
            return backfill(store, config, args.batch)
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
