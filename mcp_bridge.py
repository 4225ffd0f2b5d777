"""MCP over StreamableHTTP for solos-memory: JSON-RPC framing, protocol versions, tools.

The service mounts one `McpBridge` at `POST /mcp` and hands it the operation
table as `Tool` rows plus an `invoke` callable; this module imports nothing
from the service, so no rule lives here twice.

Two eras are served statelessly on the same endpoint:

- handshake era (2025-11-25, 2025-06-18, 2025-03-26): `initialize` answers
  with the negotiated version, then every request stands alone. No session id
  is minted, so clients never open the GET stream or send DELETE.
- 2026-07-28: every request carries its version, client capabilities and
  mirrored `MCP-Protocol-Version` / `Mcp-Method` / `Mcp-Name` headers;
  `server/discover` replaces `initialize`. The mcp SDK's `Client(mode="auto")`
  probes this first and settles on it.

Every request is answered with one `application/json` body, never SSE.
Spec: https://modelcontextprotocol.io/specification/2026-07-28/basic/transports/streamable-http
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# ==== Protocol constants ====

HANDSHAKE_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")  # newest first
MODERN_VERSIONS = ("2026-07-28",)
SUPPORTED_VERSIONS = MODERN_VERSIONS + HANDSHAKE_VERSIONS
# 2025-06-18 transports: a request without MCP-Protocol-Version "SHOULD" be
# taken as 2025-03-26, the last revision before the header existed.
VERSION_WITHOUT_HEADER = "2025-03-26"
# 2025-06-18 removed JSON-RPC batches; 2025-03-26 servers MUST accept them.
BATCH_VERSIONS = frozenset({"2025-03-26"})
# A batch multiplies one call's answer (8 read_events calls in 1,480 bytes once built 1.5 GB). At most
# this many items, and replies past this many bytes in all are errors asking for the call on its own.
MAX_BATCH_ITEMS = 16
MAX_BATCH_BYTES = 4 << 20

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
HEADER_MISMATCH = -32020
UNSUPPORTED_PROTOCOL_VERSION = -32022

META_PROTOCOL_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"

# 2026-07-28 gives protocol errors HTTP statuses (the mcp SDK client reads the
# JSON-RPC body of a 4xx). Handshake-era errors after dispatch stay 200: older
# SDK clients (the one inside Hermes) raise on any 4xx/5xx instead of reading it.
MODERN_ERROR_STATUS = {
    PARSE_ERROR: 400,
    INVALID_REQUEST: 400,
    INVALID_PARAMS: 400,
    HEADER_MISMATCH: 400,
    UNSUPPORTED_PROTOCOL_VERSION: 400,
    METHOD_NOT_FOUND: 404,
}
HANDSHAKE_ERROR_STATUS = {PARSE_ERROR: 400, INVALID_REQUEST: 400}

# Body field each 2026-07-28 method mirrors into the Mcp-Name header.
NAME_BEARING_PARAMS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}

CAPABILITIES = {"tools": {"listChanged": False}}
# 2026-07-28 results that carry caching hints. ttlMs 0: the tool list is fixed
# per process, but a .pyz upgrade restarts the service with new tools and
# clients should see them at once. "private": per-agent tokens may later
# narrow the list per caller.
CACHE_HINTS = {"ttlMs": 0, "cacheScope": "private"}


# ==== Contract with the service ====


@dataclass(frozen=True)
class Tool:
    """One operation as an MCP tool; built by the service from its operation table."""

    name: str
    title: str | None
    description: str
    input_schema: dict
    output_schema: dict | None
    annotations: dict


@dataclass
class ToolOutcome:
    """What one tool call produced; `is_error` marks a rule violation the agent can read and retry."""

    payload: dict
    is_error: bool
    headers: dict[str, str] = field(default_factory=dict)


Invoke = Callable[[str, dict, Mapping[str, str]], ToolOutcome]


class RpcError(Exception):
    """A JSON-RPC error to send back in reply to some message."""

    def __init__(self, code: int, message: str, data: Any = None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data

    def reply(self, message: Any = None) -> dict:
        """The error response, echoing the message's id when it has a usable one (else null)."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return {"jsonrpc": "2.0", "id": _request_id_of(message), "error": error}


# ==== The bridge ====


class McpBridge:
    """Answers HTTP requests to /mcp; `handle` is the only entry point."""

    def __init__(
        self,
        tools: list[Tool],
        invoke: Invoke,
        *,
        server_name: str,
        server_version: str,
        allowed_hosts: Collection[str],
        allowed_origins: Collection[str],
        instructions: str | None = None,
    ):
        self._tools = {tool.name: tool for tool in tools}
        self._tool_list = [describe_tool(tool) for tool in tools]
        self._invoke = invoke
        self._server_info = {"name": server_name, "version": server_version}
        self._allowed_hosts = frozenset(host.lower() for host in allowed_hosts)
        self._allowed_origins = frozenset(origin.lower() for origin in allowed_origins)
        self._instructions = instructions

    def admits(self, headers: Mapping[str, str]) -> bool:
        """Whether the Host and Origin rule lets the request in (else `handle` answers 403, before anything)."""
        return foreign_caller(headers, self._allowed_hosts, self._allowed_origins) is None

    def handle(self, method: str, headers: Mapping[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        """Answer one HTTP request: (status, headers, body); the caller adds Content-Length."""
        refusal = foreign_caller(headers, self._allowed_hosts, self._allowed_origins)
        if refusal is not None:
            return _respond(403, RpcError(INVALID_REQUEST, refusal).reply())
        if method != "POST":
            # Hermes probes HEAD/GET before connecting and gives up on a 2xx page; the
            # Inspector (TypeScript SDK) tries a GET event stream after initialize and
            # reads 405 as "this server has none". With no session id there is no DELETE.
            return 405, {"Allow": "POST"}, b""
        media = refused_media(headers)
        if media is not None:
            return _respond(media[0], RpcError(INVALID_REQUEST, media[1]).reply())
        try:
            # Strict: UTF-8 only (json.loads would sniff UTF-16/32 from bytes) and no NaN or Infinity, which
            # are not JSON; so a body means the same here as on the service's REST routes.
            message = json.loads(
                body.decode("utf-8"), parse_constant=_reject_constant, object_pairs_hook=one_value_per_name
            )
        except RepeatedName as error:
            return _respond(400, RpcError(PARSE_ERROR, f"Parse error: {error}").reply())
        except (ValueError, RecursionError):  # bad UTF-8 and huge integers raise ValueError too
            return _respond(400, RpcError(PARSE_ERROR, "Parse error: the body is not JSON").reply())
        requested = headers.get("MCP-Protocol-Version")
        if requested in MODERN_VERSIONS or _carries_modern_envelope(message):
            return self._answer_modern(message, headers)
        if requested is not None and requested not in HANDSHAKE_VERSIONS:
            return _respond(400, _unsupported_version(requested).reply(message))
        version = requested or VERSION_WITHOUT_HEADER
        if isinstance(message, list):
            return self._answer_batch(message, version, headers)
        response_headers: dict[str, str] = {}
        reply = self._answer_handshake_era(message, headers, response_headers, in_batch=False)
        if reply is None:
            return 202, response_headers, b""
        return _respond(_status_of(reply, HANDSHAKE_ERROR_STATUS), reply, response_headers)

    # ---- handshake era: 2025-03-26 .. 2025-11-25 ----

    def _answer_batch(self, batch: list, version: str, headers: Mapping[str, str]) -> tuple[int, dict[str, str], bytes]:
        """A 2025-03-26 JSON-RPC batch: one array of replies, 202 if nothing needed one."""
        if version not in BATCH_VERSIONS:
            error = RpcError(INVALID_REQUEST, f"JSON-RPC batches are not part of MCP {version}")
            return _respond(400, error.reply())
        if not batch:
            return _respond(400, RpcError(INVALID_REQUEST, "Empty batch").reply())
        if len(batch) > MAX_BATCH_ITEMS:
            error = RpcError(INVALID_REQUEST, f"a batch holds at most {MAX_BATCH_ITEMS} messages, got {len(batch)}")
            return _respond(400, error.reply())
        response_headers: dict[str, str] = {}
        # Each reply is encoded once and its bytes counted as they go out (counting characters let
        # 16 calls over emoji episodes answer 9.26 MB, a character being up to 4 bytes of UTF-8).
        answered: list[bytes] = []
        size = len(b"[]")
        for item in batch:
            reply = self._answer_handshake_era(item, headers, response_headers, in_batch=True)
            if reply is None:
                continue
            encoded = _encode(reply)
            size += len(encoded) + (1 if answered else 0)  # and the comma between replies
            if size > MAX_BATCH_BYTES and self._reads_only(item):
                # Answered, but not carried: the client asks again with the call alone. Only a read's: a write
                # has happened, and its reply (a few hundred bytes) must say so, or a client resends it.
                message = f"the batch's replies passed {MAX_BATCH_BYTES} bytes; send this call on its own"
                encoded = _encode(RpcError(INVALID_REQUEST, message).reply(item))
            answered.append(encoded)
        if not answered:
            return 202, response_headers, b""
        return 200, {**response_headers, "Content-Type": "application/json"}, b"[" + b",".join(answered) + b"]"

    def admission(self, body: bytes, headers: Mapping[str, str]) -> tuple[bool, bool]:
        """(unqueued, writes): how the service admits this request. A tools/call of a tool that may write takes the
        writes' lane (it waits for the write lock and batches in group commit as a REST write does); a request that
        calls no tool (initialize, ping, tools/list, a notification, a body handle() refuses) touches no database
        and is answered at once, as /health is; a batch by its calls. One the Host/Origin rule refuses is answered
        (403) at once too, as REST answers it before any queue: never busy, and holding no place."""
        if not self.admits(headers):
            return True, False
        try:
            message = json.loads(body)
        except (ValueError, RecursionError):
            return True, False
        messages = message if isinstance(message, list) else [message]
        calls = [item for item in messages if isinstance(item, dict) and item.get("method") == "tools/call"]
        return not calls, any(not self._reads_only(item) for item in calls)

    def _reads_only(self, message: Any) -> bool:
        """Whether asking for this message again is harmless: anything but a call of a tool that may write."""
        if not isinstance(message, dict) or message.get("method") != "tools/call":
            return True
        name = message["params"].get("name") if isinstance(message.get("params"), dict) else None
        tool = self._tools.get(name) if isinstance(name, str) else None
        return tool is None or tool.annotations.get("readOnlyHint") is True

    def _answer_handshake_era(
        self, message: Any, headers: Mapping[str, str], response_headers: dict[str, str], *, in_batch: bool
    ) -> dict | None:
        """Reply to one message, or None for notifications and for responses the client sends us."""
        if isinstance(message, dict) and "method" not in message and ("result" in message or "error" in message):
            return None
        if _is_notification(message):
            return None  # notifications/initialized and the like: nothing to remember, stateless
        try:
            request_id, method, params = _parse_request(message)
            if in_batch and method == "initialize":
                raise RpcError(INVALID_REQUEST, "initialize must not be part of a batch")
            result = self._dispatch(method, params, headers, response_headers, modern=False)
        except RpcError as error:
            return error.reply(message)
        return {"jsonrpc": "2.0", "id": request_id, "result": result}

    # ---- 2026-07-28 ----

    def _answer_modern(self, message: Any, headers: Mapping[str, str]) -> tuple[int, dict[str, str], bytes]:
        """One 2026-07-28 request: validate the per-request envelope and headers, then dispatch."""
        if _is_notification(message):
            # 2026-07-28 defines no client notifications on HTTP, but clients still
            # POST notifications/cancelled; the spec lets a server accept and drop them.
            return 202, {}, b""
        response_headers: dict[str, str] = {}
        try:
            if isinstance(message, list):
                raise RpcError(INVALID_REQUEST, "JSON-RPC batches are not part of MCP 2026-07-28")
            request_id, method, params = _parse_request(message)
            _check_modern_envelope(method, params, headers)
            result = self._dispatch(method, params, headers, response_headers, modern=True)
        except RpcError as error:
            reply = error.reply(message)
            return _respond(_status_of(reply, MODERN_ERROR_STATUS), reply)
        return _respond(200, {"jsonrpc": "2.0", "id": request_id, "result": result}, response_headers)

    # ---- methods ----

    def _dispatch(
        self,
        method: str,
        params: dict,
        headers: Mapping[str, str],
        response_headers: dict[str, str],
        *,
        modern: bool,
    ) -> dict:
        """Run one method; 2026-07-28 results get resultType and, where cacheable, caching hints."""
        if method == "tools/list":
            result: dict = {"tools": self._tool_list}
        elif method == "tools/call":
            result = self._call_tool(params, headers, response_headers)
        elif method == "initialize" and not modern:
            return self._initialize(params)
        elif method == "ping" and not modern:
            return {}
        elif method == "server/discover" and modern:
            result = self._discover()
        else:
            raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")
        if modern:
            result["resultType"] = "complete"
            if method in ("tools/list", "server/discover"):
                result.update(CACHE_HINTS)
        return result

    def _initialize(self, params: dict) -> dict:
        """Echo the client's version when we speak it, else offer our newest (spec lifecycle)."""
        requested = params.get("protocolVersion")
        if not isinstance(requested, str):
            raise RpcError(INVALID_PARAMS, "initialize needs params.protocolVersion, a string")
        result = {
            "protocolVersion": requested if requested in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[0],
            "capabilities": CAPABILITIES,
            "serverInfo": self._server_info,
        }
        if self._instructions:
            result["instructions"] = self._instructions
        return result

    def _discover(self) -> dict:
        """server/discover: every version we serve, the capabilities, and who we are."""
        result = {
            "supportedVersions": list(SUPPORTED_VERSIONS),
            "capabilities": CAPABILITIES,
            "_meta": {META_SERVER_INFO: self._server_info},
        }
        if self._instructions:
            result["instructions"] = self._instructions
        return result

    def _call_tool(self, params: dict, headers: Mapping[str, str], response_headers: dict[str, str]) -> dict:
        """Run a tool through `invoke`; its rule violations become isError results, its bugs -32603."""
        name, arguments = params.get("name"), params.get("arguments", {})
        if not isinstance(name, str):
            raise RpcError(INVALID_PARAMS, "tools/call needs params.name, a string")
        if name not in self._tools:
            raise RpcError(INVALID_PARAMS, f"Unknown tool: {name}")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise RpcError(INVALID_PARAMS, f"tools/call arguments must be an object, got {type(arguments).__name__}")
        try:
            outcome = self._invoke(name, arguments, headers)
        except Exception:
            log.exception("tool %s raised", name)
            raise RpcError(INTERNAL_ERROR, "Internal error") from None
        response_headers.update(outcome.headers)
        return {
            "content": [{"type": "text", "text": json.dumps(outcome.payload, ensure_ascii=False)}],
            "structuredContent": outcome.payload,
            "isError": outcome.is_error,
        }


# ==== Helpers ====


def foreign_caller(
    headers: Mapping[str, str],
    allowed_hosts: Collection[str],
    allowed_origins: Collection[str],
    navigable: bool = False,
) -> str | None:
    """Why a request must get 403 (DNS rebinding, cross-site pages), or None; the sets are lower-case. `navigable`:
    the route is one a link from another site may lead to (a page or document that acts for no one).

    A page that rebinds its own name to 127.0.0.1 still sends that name as Host. An absent Origin is
    fine: non-browser clients (Hermes, the mcp SDK, curl) send none, nor Sec-Fetch-Site. The service applies
    this to every route.
    """
    host = headers.get("Host")
    if host is None or host.lower() not in allowed_hosts:
        return f"Host {host!r} is not allowed (DNS rebinding protection: only this server's own names)"
    origin = headers.get("Origin")
    if origin is not None and origin.lower() not in allowed_origins:
        return f"Origin {origin!r} is not allowed (cross-site protection: see --allowed-origin)"
    # A browser sends no Origin for a page's <img>, <script> or <iframe> GET, but says where it comes from: another
    # site's page must not make the operator's browser call as an agent (a recall's audit and deliveries, forged).
    # A link the operator follows (a top-level navigation: the status page from a dashboard) is theirs, to a page
    # only: another site's script navigates the browser as freely (`location = ".../v1/recall?agent=sol"`).
    site, mode, dest = (headers.get(f"Sec-Fetch-{name}", "").lower() for name in ("Site", "Mode", "Dest"))
    followed = navigable and (mode, dest) == ("navigate", "document")
    if origin is None and site not in ("", "same-origin", "none") and not followed:
        return f"Sec-Fetch-Site {site!r}: a page of another site, without an allowed Origin (cross-site protection)"
    return None


def refusal(error: Mapping[str, Any], headers: Mapping[str, str], body: bytes | None) -> tuple[int, dict | None]:
    """The service's refusal of an HTTP request to /mcp (its body over the cap, no token, busy, a bug) as a JSON-RPC
    error: (HTTP status, reply, None for none). `error` is the service's own error object, kept whole as `data`
    (code, field, reason); a 5xx is -32603, anything else -32600. `body` is the request's, None when unread.

    REST's shape was no JSON-RPC error, which the mcp SDK client reads from a 4xx/5xx (the spec lets that body be
    one without an id; else it says only "Server returned an error response"). A read body's id is echoed. And a
    handshake-era request refused busy (503) is answered as the other errors of its era, at 200 (a notification:
    202, accepted and dropped as ever): mcp 1.26 (inside Hermes) raises on any 4xx/5xx, and its whole session with
    it. A 401 keeps its status: the service refuses at the door on purpose (`serve_mcp`).
    """
    code = INTERNAL_ERROR if error["status"] >= 500 else INVALID_REQUEST
    reply = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": error["message"], "data": dict(error)}}
    try:
        message = json.loads(body.decode("utf-8")) if body else None
    except (ValueError, RecursionError):
        message = None
    reply["id"] = _request_id_of(message)
    modern = headers.get("MCP-Protocol-Version") in MODERN_VERSIONS or _carries_modern_envelope(message)
    if error["status"] != 503 or modern or not isinstance(message, dict):
        return error["status"], reply
    return (202, None) if _is_notification(message) else (200, reply)


def refused_media(headers: Mapping[str, str]) -> tuple[int, str] | None:
    """(415 or 406, why) for a POST whose body is not declared JSON or whose client takes no JSON back, else None.

    415 as REST gives it: a text/plain POST is what a page may send without a CORS preflight. Accept is read more
    leniently than the spec's "MUST list both application/json and text/event-stream": every answer here is JSON,
    so any Accept that takes JSON (curl's */*, a JSON-only client) or none at all is served.
    """
    content_type = headers.get("Content-Type")
    if (content_type or "").split(";")[0].strip().lower() != "application/json":
        return 415, f"Content-Type must be application/json, got {content_type!r}"[:200]
    accept = headers.get("Accept")
    if accept is None:
        return None
    for media_range in accept.split(","):
        media, *parameters = (part.strip().lower() for part in media_range.split(";"))
        weights = [value for name, _, value in (p.partition("=") for p in parameters) if name.strip() == "q"]
        if media in ("application/json", "application/*", "*/*") and not _zero_weight(weights):
            return None
    return 406, f"every answer on /mcp is application/json, which Accept {accept!r} does not take"[:200]


def _zero_weight(weights: list[str]) -> bool:
    """Whether a media range's q parameter says "not acceptable" (q=0, 0.0, 0.000)."""
    return bool(weights) and weights[0].strip().rstrip("0").rstrip(".") in ("0", "")


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


class RepeatedName(ValueError):
    """A name given twice in one JSON object; `name` is the name, whole."""

    def __init__(self, name: str):
        super().__init__(f"the name {name[:60]!r} is given more than once in one object")
        self.name = name


def one_value_per_name(pairs: list[tuple[str, Any]]) -> dict:
    """json.loads hook: each name once per object, here and on the service's REST bodies (solos_validation uses
    it). Parsers disagree on which of two values counts (RFC 8259 section 4), so a gateway reading the first and
    this bridge the last would see two different calls."""
    result = dict(pairs)
    if len(result) < len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise RepeatedName(name)
            seen.add(name)
    return result


def describe_tool(tool: Tool) -> dict:
    """The tools/list entry for one tool."""
    entry: dict[str, Any] = {"name": tool.name}
    if tool.title is not None:
        entry["title"] = tool.title
    entry.update(description=tool.description, inputSchema=tool.input_schema)
    if tool.output_schema is not None:
        entry["outputSchema"] = tool.output_schema
    entry["annotations"] = tool.annotations
    return entry


def _parse_request(message: Any) -> tuple[Any, str, dict]:
    """(id, method, params) of a JSON-RPC request, or RpcError naming what is wrong."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, 'Invalid Request: expected a JSON-RPC 2.0 object with "jsonrpc": "2.0"')
    if "id" not in message:
        method = message.get("method")
        named = repr(method[:60]) if isinstance(method, str) else "a request"
        raise RpcError(INVALID_REQUEST, f"Invalid Request: {named} needs an id; only notifications/... go without")
    request_id = message.get("id")
    # MCP forbids null ids; bool is an int subclass in Python but not a JSON-RPC id.
    if isinstance(request_id, bool) or not isinstance(request_id, (str, int)):
        raise RpcError(INVALID_REQUEST, "Invalid Request: id must be a string or an integer")
    method = message.get("method")
    if not isinstance(method, str):
        raise RpcError(INVALID_REQUEST, "Invalid Request: method must be a string")
    params = message.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, "params must be an object")
    return request_id, method, params


def _is_notification(message: Any) -> bool:
    """A notification, accepted with 202 and dropped: no id member (JSON-RPC 2.0 section 4.1) and one of MCP's
    `notifications/...` methods. A request sent without its id (a tools/call) is not one: 202 would tell its
    client a write was accepted that never ran."""
    method = message.get("method") if isinstance(message, dict) else None
    return isinstance(method, str) and method.startswith("notifications/") and "id" not in message


def _carries_modern_envelope(message: Any) -> bool:
    """Whether a body declares its version in params._meta, the 2026-07-28 way."""
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and META_PROTOCOL_VERSION in meta


def _check_modern_envelope(method: str, params: dict, headers: Mapping[str, str]) -> None:
    """The 2026-07-28 ladder: envelope keys, then header/body agreement, then the version itself."""
    meta = params.get("_meta")
    if not isinstance(meta, dict) or META_PROTOCOL_VERSION not in meta or META_CLIENT_CAPABILITIES not in meta:
        raise RpcError(
            INVALID_PARAMS,
            f"params._meta must carry {META_PROTOCOL_VERSION!r} and {META_CLIENT_CAPABILITIES!r}",
        )
    version = meta[META_PROTOCOL_VERSION]
    # Mismatch is checked before support, so a client that disagrees with itself is told so.
    if headers.get("MCP-Protocol-Version") != version:
        raise RpcError(HEADER_MISMATCH, "MCP-Protocol-Version header does not match params._meta")
    if headers.get("Mcp-Method") != method:
        raise RpcError(HEADER_MISMATCH, "Mcp-Method header does not match the body's method")
    name_param = NAME_BEARING_PARAMS.get(method)
    named = params.get(name_param) if name_param else None
    if named is not None and _decode_header_value(headers.get("Mcp-Name")) != named:
        raise RpcError(HEADER_MISMATCH, f"Mcp-Name header does not match params.{name_param}")
    if version not in MODERN_VERSIONS:
        raise _unsupported_version(version)


def _decode_header_value(value: str | None) -> str | None:
    """Undo the spec's `=?base64?...?=` sentinel; None for a malformed one, so it never matches."""
    if value is None or not (value.startswith("=?base64?") and value.endswith("?=")):
        return value
    try:
        return base64.b64decode(value[len("=?base64?") : -len("?=")], validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def _unsupported_version(requested: str) -> RpcError:
    """-32022 listing what we serve; the mcp SDK retries at a listed version or falls back to initialize."""
    data = {"supported": list(SUPPORTED_VERSIONS), "requested": requested}
    return RpcError(UNSUPPORTED_PROTOCOL_VERSION, "Unsupported protocol version", data)


def _request_id_of(message: Any) -> Any:
    """The id to echo in an error about a message, when it has a usable one."""
    request_id = message.get("id") if isinstance(message, dict) else None
    return request_id if isinstance(request_id, (str, int)) and not isinstance(request_id, bool) else None


def _status_of(reply: dict, error_status: Mapping[int, int]) -> int:
    """HTTP status for a single reply: 200 unless the era maps its error code to a 4xx."""
    return error_status.get(reply["error"]["code"], 200) if "error" in reply else 200


def _encode(payload: Any) -> bytes:
    """Compact JSON in UTF-8, as it goes on the wire."""
    try:
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from some stored row: escaped, it is still valid JSON
        return json.dumps(payload, separators=(",", ":")).encode("ascii")


def _respond(status: int, payload: Any, headers: Mapping[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """A JSON response; every answer is application/json, never SSE."""
    return status, {**(headers or {}), "Content-Type": "application/json"}, _encode(payload)
