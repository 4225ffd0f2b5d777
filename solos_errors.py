"""solos_errors: the service's expected errors (each carries its HTTP status and code), their one JSON shape,
and its log lines. Imports nothing of the project: the store raises these (busy: 503, unknown agent: 422) and
every module above it raises or logs them; solos_store re-exports them, so `solos_store.BadRequest` still reads.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import datetime
from http import HTTPStatus
from typing import Any

# ==== Log lines and time ====


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
    return stamp(time.time())


def stamp(unix: float) -> str:
    """A Unix time as the schema's timestamps read (UTC, milliseconds, 'Z')."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(unix)) + f".{int(unix % 1 * 1000):03d}Z"


def stamp_seconds(timestamp: str) -> float:
    """A schema timestamp ('2026-11-30T06:00:00.000Z') as a Unix time: stamp's inverse."""
    return datetime.fromisoformat(timestamp).timestamp()


# ==== Errors ====


class ServiceError(Exception):
    """Base for expected errors; subclasses set status and code."""

    status, code = 500, "internal"
    retry_after_s: int | None = None  # set for conditions that pass by themselves
    reason: str | None = None  # a word for machines where the code alone does not say why (Busy's queue_full)

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
    """The database stayed locked through every retry, or more requests came than the service runs and queues
    (`reason`: queue_full, queue_wait; solos_connections.Admission); never an empty success or a silent stall."""

    status, code = 503, "busy"
    retry_after_s = 1

    def __init__(self, message: str, field: str | None = None, reason: str | None = None):
        super().__init__(message, field)
        self.reason = reason


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
    if error.reason:
        body["reason"] = error.reason
    return {"error": body}
