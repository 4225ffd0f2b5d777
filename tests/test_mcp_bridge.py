"""MCP protocol behaviour of mcp_bridge through HTTP.

The first part hosts the bridge alone on a tiny stdlib server with fake tools,
so protocol rules are tested without the service; the last part drives the
real service (the `server` fixture) over /mcp and compares with REST.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from conftest import raw_exchange, statuses_in
from mcp_types.methods import validate_server_result  # the mcp SDK's wire schemas, as its client checks them

import mcp_bridge  # importable: conftest.py puts the repository root on sys.path
import solos_memory
from mcp_bridge import McpBridge, Tool, ToolOutcome

MODERN = "2026-07-28"
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"

FAKE_TOOLS = [
    Tool(
        "echo",
        "Echo",
        "Returns its arguments.",
        {"type": "object", "properties": {"text": {"type": "string"}}},
        {"type": "object"},
        {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True},
    ),
    Tool(
        "refuse",
        None,
        "Always a rule violation.",
        {"type": "object"},
        None,
        {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False},
    ),
    Tool("crash", None, "Raises, like a bug would.", {"type": "object"}, None, {"readOnlyHint": True}),
    Tool("wéird name", None, "Not header-safe, so Mcp-Name arrives base64-encoded.", {"type": "object"}, None, {}),
]


def fake_invoke(name: str, arguments: dict, headers: Any) -> ToolOutcome:
    if name == "refuse":
        return ToolOutcome({"error": {"code": "forbidden", "message": "no"}}, True, {})
    if name == "crash":
        raise RuntimeError("secret path /var/lib/solos.db")
    return ToolOutcome({"echo": arguments, "auth": headers.get("Authorization")}, False, {"X-Echo": "yes"})


class BridgeHost:
    """The bridge alone behind a stdlib ThreadingHTTPServer on an ephemeral port."""

    def __init__(self) -> None:
        bridge_ref: list[McpBridge] = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, headers, payload = bridge_ref[0].handle(self.command, self.headers, body)
                head = [f"HTTP/1.1 {status} X", f"Content-Length: {len(payload)}"]
                head += [f"{name}: {value}" for name, value in headers.items()]
                self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload)

            do_GET = do_HEAD = do_DELETE = do_POST

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.host = f"127.0.0.1:{self.port}"
        bridge_ref.append(
            McpBridge(
                FAKE_TOOLS,
                fake_invoke,
                server_name="fake",
                server_version="9.9",
                allowed_hosts=[self.host, f"localhost:{self.port}"],
                allowed_origins=[f"http://{self.host}"],
                instructions="Be kind.",
            )
        )
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def request(self, method: str, body: Any = None, headers: dict | None = None, raw: bytes | None = None):
        """(status, lower-cased headers, parsed JSON or None, raw bytes)."""
        payload = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        all_headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        all_headers.update(headers or {})
        all_headers = {name: value for name, value in all_headers.items() if value is not None}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(method, "/mcp", body=payload, headers=all_headers)
            response = conn.getresponse()
            data = response.read()
            parsed = json.loads(data) if data else None
            return response.status, {k.lower(): v for k, v in response.getheaders()}, parsed, data
        finally:
            conn.close()

    def rpc(self, method: str, params: dict | None = None, headers: dict | None = None, request_id: Any = 1):
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        return self.request("POST", message, headers)


@pytest.fixture(scope="module")
def host():
    running = BridgeHost()
    yield running
    running.httpd.shutdown()
    running.httpd.server_close()


def modern_rpc(
    host: BridgeHost, method: str, params: dict | None = None, headers: dict | None = None, version: str = MODERN
):
    """A 2026-07-28 request with the envelope and mirrored headers the mcp SDK sends."""
    params = dict(params or {})
    params["_meta"] = {
        META_VERSION: version,
        META_CAPABILITIES: {},
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "0"},
    }
    sent = {"MCP-Protocol-Version": version, "Mcp-Method": method}
    if method == "tools/call":
        sent["Mcp-Name"] = params["name"]
    sent.update(headers or {})
    return host.rpc(method, params, {k: v for k, v in sent.items() if v is not None})


def check_result(method: str, version: str, result: dict) -> None:
    """Validate a result against the mcp SDK's wire schema for that version."""
    validate_server_result(method, version, result)


# ==== handshake era ====


@pytest.mark.parametrize(
    "offered, answered",
    [
        ("2025-11-25", "2025-11-25"),
        ("2025-06-18", "2025-06-18"),
        ("2025-03-26", "2025-03-26"),
        ("2024-11-05", "2025-11-25"),
        ("1999-01-01", "2025-11-25"),
        (MODERN, "2025-11-25"),
    ],
)
def test_initialize_echoes_a_version_we_speak_else_offers_our_newest(host, offered, answered):
    status, headers, reply, _ = host.rpc(
        "initialize", {"protocolVersion": offered, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    )
    assert status == 200 and headers["content-type"] == "application/json"
    result = reply["result"]
    assert result["protocolVersion"] == answered
    assert result["capabilities"] == {"tools": {"listChanged": False}}
    assert result["serverInfo"] == {"name": "fake", "version": "9.9"}
    assert result["instructions"] == "Be kind."
    assert "mcp-session-id" not in headers  # stateless
    check_result("initialize", answered, result)


def test_initialize_without_a_version_is_invalid_params(host):
    _, _, reply, _ = host.rpc("initialize", {"capabilities": {}})
    assert reply["error"]["code"] == -32602


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}},
        {"jsonrpc": "2.0", "id": 7, "result": {}},
        {"jsonrpc": "2.0", "id": 7, "error": {"code": -1, "message": "x"}},
    ],
)
def test_notifications_and_responses_get_202_without_body(host, message):
    status, _, _, raw = host.request("POST", message)
    assert (status, raw) == (202, b"")


@pytest.mark.parametrize("version", [None, "2025-03-26", "2025-11-25"])
def test_a_request_sent_without_an_id_is_400_not_accepted_and_dropped(host, version):
    """202 means accepted: a tools/call without its id was answered 202 and never run."""
    call = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "echo", "arguments": {"a": 1}}}
    status, _, reply, _ = host.request("POST", call, {"MCP-Protocol-Version": version} if version else {})
    assert status == 400 and reply["id"] is None and reply["error"]["code"] == -32600
    assert "tools/call" in reply["error"]["message"] and "id" in reply["error"]["message"]
    if version in (None, "2025-03-26"):  # in a batch: an error for it, and the rest answered
        status, _, replies, _ = host.request("POST", [call, {"jsonrpc": "2.0", "id": 2, "method": "ping"}])
        assert status == 200 and [(r["id"], "error" in r) for r in replies] == [(None, True), (2, False)]


@pytest.mark.parametrize("method", ["GET", "HEAD", "DELETE"])
def test_only_post_is_served(host, method):
    # Hermes probes HEAD/GET before connecting and gives up on a 2xx page.
    status, headers, _, raw = host.request(method)
    assert status == 405 and headers["allow"] == "POST" and raw == b""


def test_ping_answers_an_empty_object(host):
    assert host.rpc("ping", request_id="p-1")[2] == {"jsonrpc": "2.0", "id": "p-1", "result": {}}


def test_tools_list_describes_every_tool(host):
    status, _, reply, _ = host.rpc("tools/list", headers={"MCP-Protocol-Version": "2025-11-25"})
    assert status == 200
    tools = reply["result"]["tools"]
    assert [tool["name"] for tool in tools] == [tool.name for tool in FAKE_TOOLS]
    echo = tools[0]
    assert echo == {
        "name": "echo",
        "title": "Echo",
        "description": "Returns its arguments.",
        "inputSchema": FAKE_TOOLS[0].input_schema,
        "outputSchema": {"type": "object"},
        "annotations": {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True},
    }
    assert "title" not in tools[1] and "outputSchema" not in tools[1]
    check_result("tools/list", "2025-11-25", reply["result"])


def test_tools_call_returns_structured_content_and_the_same_json_as_text(host):
    status, headers, reply, _ = host.rpc(
        "tools/call", {"name": "echo", "arguments": {"text": "hé"}}, headers={"Authorization": "Bearer t"}
    )
    assert status == 200 and headers["x-echo"] == "yes"  # the outcome's headers reach HTTP
    result = reply["result"]
    assert result["structuredContent"] == {"echo": {"text": "hé"}, "auth": "Bearer t"}
    assert result["content"][0]["type"] == "text"
    assert json.loads(result["content"][0]["text"]) == result["structuredContent"]
    assert result["isError"] is False
    check_result("tools/call", "2025-11-25", result)


def test_tools_call_without_arguments_passes_an_empty_object(host):
    assert host.rpc("tools/call", {"name": "echo"})[2]["result"]["structuredContent"]["echo"] == {}


def test_rule_violation_is_a_result_with_is_error(host):
    _, _, reply, _ = host.rpc("tools/call", {"name": "refuse", "arguments": {}})
    assert reply["result"]["isError"] is True
    assert reply["result"]["structuredContent"] == {"error": {"code": "forbidden", "message": "no"}}


def test_a_crashing_tool_is_internal_error_without_details(host, caplog):
    with caplog.at_level(logging.ERROR, logger="mcp_bridge"):
        status, _, reply, raw = host.rpc("tools/call", {"name": "crash", "arguments": {}})
    assert status == 200 and reply["error"] == {"code": -32603, "message": "Internal error"}
    assert b"secret" not in raw and b"RuntimeError" not in raw
    assert any("secret path" in (record.exc_text or "") for record in caplog.records)


@pytest.mark.parametrize(
    "params",
    [
        {"name": "nope", "arguments": {}},
        {"name": "echo", "arguments": [1, 2]},
        {"name": "echo", "arguments": "text"},
        {"arguments": {}},
        {"name": 5},
    ],
)
def test_unknown_tools_and_malformed_calls_are_invalid_params(host, params):
    status, _, reply, _ = host.rpc("tools/call", params)
    assert status == 200 and reply["error"]["code"] == -32602 and reply["id"] == 1


def test_unknown_method_is_method_not_found(host):
    for method in ("prompts/list", "resources/list", "server/discover"):
        status, _, reply, _ = host.rpc(method)
        assert status == 200 and reply["error"]["code"] == -32601


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"\xff\xfe",
        b"",
        b"1" * 5000,
        b"[" * 100000,  # bad UTF-8, huge int, deep nesting
    ],
)
def test_unparseable_body_is_parse_error(host, raw):
    status, _, reply, _ = host.request("POST", raw=raw)
    assert status == 400 and reply == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32700, "message": "Parse error: the body is not JSON"},
    }


CALL_WITH = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": %s}}'


@pytest.mark.parametrize(
    ("raw", "name"),
    [(b'{"jsonrpc": "2.0", "id": 1, "id": 2, "method": "ping"}', "id"), (CALL_WITH % b'{"a": 1, "a": 2}', "a")],
)
def test_a_name_given_twice_in_one_object_is_a_parse_error_naming_it(host, raw, name):
    """Parsers disagree on which value counts: refused, never read as the last one."""
    status, _, reply, _ = host.request("POST", raw=raw)
    assert status == 400 and reply["error"]["code"] == -32700 and reply["id"] is None, reply
    assert f"{name!r} is given more than once" in reply["error"]["message"], reply


@pytest.mark.parametrize(
    "message",
    [
        {"id": 1, "method": "ping"},
        {"jsonrpc": "1.0", "id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "id": None, "method": "ping"},
        {"jsonrpc": "2.0", "id": True, "method": "ping"},
        {"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"},
        {"jsonrpc": "2.0", "id": 1, "method": 5},
        "ping",
        42,
    ],
)
def test_malformed_requests_are_invalid_request(host, message):
    status, _, reply, _ = host.request("POST", message)
    assert status == 400 and reply["error"]["code"] == -32600


def test_params_that_are_not_an_object_are_invalid_params(host):
    _, _, reply, _ = host.request("POST", {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [1]})
    assert reply["error"]["code"] == -32602


@pytest.mark.parametrize("version", ["1999-01-01", "2024-11-05", "latest", ""])
def test_unsupported_protocol_version_header_is_400(host, version):
    status, _, reply, _ = host.rpc("tools/list", headers={"MCP-Protocol-Version": version})
    assert status == 400 and reply["error"]["code"] == -32022 and reply["id"] == 1
    assert reply["error"]["data"] == {"supported": list(mcp_bridge.SUPPORTED_VERSIONS), "requested": version}


def test_batches_are_refused_from_2025_06_18_on(host):
    batch = [{"jsonrpc": "2.0", "id": 1, "method": "ping"}]
    for version in ("2025-06-18", "2025-11-25"):
        status, _, reply, _ = host.request("POST", batch, {"MCP-Protocol-Version": version})
        assert status == 400 and reply["error"]["code"] == -32600


def test_batches_are_served_at_2025_03_26(host):
    # No header means 2025-03-26 (spec), whose servers MUST accept batches.
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {"a": 1}}},
        {"jsonrpc": "2.0", "id": 3, "method": "initialize", "params": {"protocolVersion": "2025-03-26"}},
        {"jsonrpc": "2.0", "id": 4, "method": "nope"},
        "junk",
    ]
    status, headers, replies, _ = host.request("POST", batch)
    assert status == 200 and headers["x-echo"] == "yes"
    assert [reply["id"] for reply in replies] == [1, 2, 3, 4, None]
    assert replies[0]["result"] == {}
    assert replies[1]["result"]["structuredContent"]["echo"] == {"a": 1}
    assert [reply["error"]["code"] for reply in replies[2:]] == [-32600, -32601, -32600]
    status, _, _, raw = host.request("POST", batch[1:2], {"MCP-Protocol-Version": "2025-03-26"})
    assert (status, raw) == (202, b"")
    status, _, reply, _ = host.request("POST", [])
    assert status == 400 and reply["error"]["code"] == -32600


# ==== security ====


@pytest.mark.parametrize(
    "headers, expected",
    [
        ({}, 200),  # Hermes and the mcp SDK send no Origin
        ({"Origin": "http://127.0.0.1:{port}"}, 200),
        ({"Origin": "HTTP://127.0.0.1:{port}"}, 200),
        ({"Origin": "http://evil.example.com"}, 403),
        ({"Origin": "null"}, 403),
        ({"Host": "evil.example.com"}, 403),
        ({"Host": "evil.example.com:{port}"}, 403),
        ({"Host": "localhost:{port}"}, 200),
    ],
)
def test_host_and_origin_are_checked_against_dns_rebinding(host, headers, expected):
    headers = {name: value.format(port=host.port) for name, value in headers.items()}
    for method in ("POST", "GET"):
        status, _, reply, _ = host.request(method, {"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers)
        assert status == (expected if method == "POST" or expected == 403 else 405)
        if status == 403:
            assert reply["id"] is None and "not allowed" in reply["error"]["message"]


# ==== 2026-07-28 ====


def test_discover_lists_versions_capabilities_and_server_info(host):
    status, headers, reply, _ = modern_rpc(host, "server/discover")
    assert status == 200 and headers["content-type"] == "application/json"
    result = reply["result"]
    assert result["supportedVersions"][0] == MODERN and "2025-11-25" in result["supportedVersions"]
    assert result["capabilities"] == {"tools": {"listChanged": False}}
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"] == {"name": "fake", "version": "9.9"}
    assert result["resultType"] == "complete" and result["instructions"] == "Be kind."
    check_result("server/discover", MODERN, result)


def test_modern_tools_list_and_call_carry_result_type(host):
    _, _, reply, _ = modern_rpc(host, "tools/list")
    assert len(reply["result"]["tools"]) == len(FAKE_TOOLS)
    check_result("tools/list", MODERN, reply["result"])
    status, headers, reply, _ = modern_rpc(host, "tools/call", {"name": "echo", "arguments": {"text": "x"}})
    assert status == 200 and headers["x-echo"] == "yes"
    assert reply["result"]["structuredContent"]["echo"] == {"text": "x"}
    check_result("tools/call", MODERN, reply["result"])


def test_modern_mcp_name_may_be_base64_encoded(host):
    encoded = "=?base64?" + base64.b64encode("wéird name".encode()).decode() + "?="
    _, _, reply, _ = modern_rpc(host, "tools/call", {"name": "wéird name"}, {"Mcp-Name": encoded})
    assert reply["result"]["isError"] is False


@pytest.mark.parametrize(
    "params, headers",
    [
        ({}, {"MCP-Protocol-Version": "2025-11-25"}),  # header and _meta disagree
        ({}, {"MCP-Protocol-Version": None}),  # _meta alone: the header is required
        ({}, {"Mcp-Method": "tools/call"}),
        ({}, {"Mcp-Method": None}),
        ({"name": "echo"}, {"Mcp-Name": "refuse"}),
        ({"name": "echo"}, {"Mcp-Name": None}),
        ({"name": "echo"}, {"Mcp-Name": "=?base64?not base64!?="}),
    ],
)
def test_modern_header_mismatch_is_400_with_32020(host, params, headers):
    method = "tools/call" if params else "tools/list"
    status, _, reply, _ = modern_rpc(host, method, params, headers)
    assert status == 400 and reply["error"]["code"] == -32020 and reply["id"] == 1


def test_modern_request_without_envelope_is_invalid_params(host):
    status, _, reply, _ = host.rpc("tools/list", {}, {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/list"})
    assert status == 400 and reply["error"]["code"] == -32602


def test_modern_unknown_version_lists_what_we_serve(host):
    status, _, reply, _ = modern_rpc(host, "server/discover", version="2099-01-01")
    assert status == 400 and reply["error"]["code"] == -32022
    assert MODERN in reply["error"]["data"]["supported"]


@pytest.mark.parametrize("method", ["ping", "initialize", "prompts/list", "resources/list"])
def test_modern_methods_we_do_not_serve_are_404(host, method):
    status, _, reply, _ = modern_rpc(host, method)
    assert status == 404 and reply["error"]["code"] == -32601


def test_modern_rule_violation_and_unknown_tool(host):
    status, _, reply, _ = modern_rpc(host, "tools/call", {"name": "refuse"})
    assert status == 200 and reply["result"]["isError"] is True
    status, _, reply, _ = modern_rpc(host, "tools/call", {"name": "nope"})
    assert status == 400 and reply["error"]["code"] == -32602


def test_modern_notification_is_202_and_batch_is_400(host):
    headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "notifications/cancelled"}
    status, _, _, raw = host.request("POST", {"jsonrpc": "2.0", "method": "notifications/cancelled"}, headers)
    assert (status, raw) == (202, b"")
    headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "echo"}
    meta = {META_VERSION: MODERN, META_CAPABILITIES: {}}
    call = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "echo", "_meta": meta}}
    status, _, reply, _ = host.request("POST", call, headers)
    assert status == 400 and reply["error"]["code"] == -32600  # a request without its id: not dropped with 202
    status, _, reply, _ = host.request(
        "POST", [{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}], {"MCP-Protocol-Version": MODERN}
    )
    assert status == 400 and reply["error"]["code"] == -32600


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "", None])
def test_a_body_that_is_not_declared_json_is_415(host, content_type):
    """REST's rule on /mcp too: a text/plain POST is what a page sends without a CORS preflight."""
    status, _, reply, _ = host.request(
        "POST", {"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"Content-Type": content_type}
    )
    assert status == 415 and reply["id"] is None and reply["error"]["code"] == -32600
    assert "Content-Type must be application/json" in reply["error"]["message"]


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8", "Application/JSON"])
def test_json_content_types_are_served(host, content_type):
    status, _, reply, _ = host.request(
        "POST", {"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"Content-Type": content_type}
    )
    assert status == 200 and reply["result"] == {}


@pytest.mark.parametrize("accept", ["text/html", "text/event-stream", "application/json;q=0, text/event-stream"])
def test_a_client_that_accepts_no_json_is_406(host, accept):
    """Every answer is application/json: a client that says it cannot take that is told, not sent it."""
    status, _, reply, _ = host.request("POST", {"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"Accept": accept})
    assert status == 406 and reply["id"] is None and reply["error"]["code"] == -32600
    assert "application/json" in reply["error"]["message"]


@pytest.mark.parametrize(
    "accept", [None, "*/*", "application/*", "application/json", "text/event-stream, application/json;q=0.5"]
)
def test_any_accept_that_takes_json_is_served(host, accept):
    """Lenient where the spec is strict ("MUST list both"): curl's */* and JSON-only clients are served."""
    status, _, reply, _ = host.request("POST", {"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"Accept": accept})
    assert status == 200 and reply["result"] == {}


# ==== mounted in the real service ====


def call_recall(server, headers: dict | None = None):
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "recall", "arguments": {"agent": "atlas", "q": "kettle"}},
    }
    return server.post("/mcp", message, headers=headers)


def test_service_a_write_sent_without_an_id_is_400_and_stores_nothing(server):
    call = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "write_long", "arguments": {}}}
    call["params"]["arguments"] = {"agent": "atlas", "fact": "sent as a notification"}
    reply = server.post("/mcp", call, headers={"MCP-Protocol-Version": "2025-11-25"})
    assert reply.status == 400 and reply.body["error"]["code"] == -32600  # was 202, and nothing stored
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0] == 0


def test_service_lists_one_tool_per_operation(server):
    reply = server.post("/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    tools = reply.body["result"]["tools"]
    assert [tool["name"] for tool in tools] == list(solos_memory.OPERATIONS)
    for tool in tools:
        assert {"readOnlyHint", "destructiveHint", "idempotentHint"} <= tool["annotations"].keys()
        assert tool["description"] and tool["inputSchema"]["type"] == "object" and "outputSchema" in tool
    check_result("tools/list", "2025-11-25", reply.body["result"])


def test_service_recall_over_mcp_carries_the_degraded_flag_and_header(server):
    reply = call_recall(server)
    result = reply.body["result"]
    degraded = result["structuredContent"]["degraded"]
    assert reply.status == 200 and result["isError"] is False and isinstance(degraded, bool)
    assert reply.headers["x-memory-degraded"] == str(degraded).lower()
    assert server.recall("atlas", "kettle").headers["x-memory-degraded"] == reply.headers["x-memory-degraded"]


def test_service_refuses_foreign_origins_and_serves_only_post(server):
    assert call_recall(server, {"Origin": "http://evil.example.com"}).status == 403
    assert call_recall(server, {"Host": "evil.example.com"}).status == 403
    assert call_recall(server, {"Origin": server.url}).status == 200
    for method in ("GET", "HEAD", "DELETE"):
        reply = server.request(method, "/mcp")
        assert reply.status == 405 and reply.headers["allow"] == "POST"


# ---- refusals before the bridge: the service's own, in JSON-RPC's shape on /mcp ----


def assert_rpc_refusal(reply, status: int, service_code: str, rpc_code: int, request_id: Any = None) -> dict:
    """A refusal of the HTTP request the mcp SDK client can read: a JSON-RPC error with no id, the service's error
    object (code, field, reason) as its data. REST's shape there read as "Server returned an error response"."""
    assert reply.status == status, reply.raw[:300]
    assert reply.headers["content-type"] == "application/json"
    assert reply.body["jsonrpc"] == "2.0" and reply.body["id"] == request_id and "result" not in reply.body
    error = reply.body["error"]
    assert error["code"] == rpc_code and error["data"]["code"] == service_code and error["data"]["status"] == status
    assert error["message"] == error["data"]["message"]
    return error


def test_service_a_body_over_the_cap_on_mcp_is_a_json_rpc_error(server):
    reply = server.post("/mcp", {"x": "y" * (solos_memory.MAX_BODY_BYTES + 10)})
    error = assert_rpc_refusal(reply, 413, "payload_too_large", mcp_bridge.INVALID_REQUEST)
    assert error["data"]["field"] == "body" and str(solos_memory.MAX_BODY_BYTES) in error["message"]


@pytest.fixture
def busy(server, monkeypatch):
    """The service with every place taken and its queue full."""

    def full(exempt: bool = False, writes: bool = False):
        raise solos_memory.Busy("queue full: a test", reason="queue_full")

    monkeypatch.setattr(server.server, "admitted", full)
    return server


def modern_recall(server):
    """recall as the mcp SDK's 2026-07-28 client sends it: the envelope and its mirrored headers."""
    meta = {META_VERSION: MODERN, META_CAPABILITIES: {}}
    params = {"name": "recall", "arguments": {"agent": "atlas", "q": "kettle"}, "_meta": meta}
    message = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}
    headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "recall"}
    return server.post("/mcp", message, headers=headers)


def test_service_a_busy_2026_call_is_503_with_its_reason_in_json_rpc(busy):
    reply = modern_recall(busy)  # its body was read before the refusal: its id is echoed
    error = assert_rpc_refusal(reply, 503, "busy", mcp_bridge.INTERNAL_ERROR, request_id=7)
    assert error["data"]["reason"] == "queue_full" and reply.headers["retry-after"] == "1"


@pytest.mark.parametrize("version", ["2025-11-25", "2025-06-18", None])
def test_service_a_busy_handshake_era_call_is_a_json_rpc_error_its_client_reads(busy, version):
    """mcp 1.26 (inside Hermes) raises on any 4xx/5xx and its whole session dies with it (ExceptionGroup, then
    ClosedResourceError on every later call); as other errors of its era, busy comes at 200 with the call's id."""
    reply = call_recall(busy, {"MCP-Protocol-Version": version} if version else None)
    assert reply.status == 200 and reply.body["id"] == 1 and "result" not in reply.body
    error = reply.body["error"]
    assert error["code"] == mcp_bridge.INTERNAL_ERROR and error["data"]["code"] == "busy"
    assert error["data"]["reason"] == "queue_full" and error["data"]["status"] == 503
    assert reply.headers["retry-after"] == "1"
    with busy.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0] == 0


def test_service_a_busy_handshake_era_notification_is_accepted_as_ever(busy):
    """The bridge accepts and drops notifications; a 503 for notifications/initialized ended mcp 1.26's session."""
    message = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    reply = busy.post("/mcp", message, headers={"MCP-Protocol-Version": "2025-11-25"})
    assert reply.status == 202 and reply.raw == b""


def test_service_an_mcp_call_without_a_token_is_401_in_json_rpc(token_server):
    reply = call_recall(token_server)
    assert_rpc_refusal(reply, 401, "unauthorized", mcp_bridge.INVALID_REQUEST, request_id=1)
    assert reply.headers["www-authenticate"].startswith("Bearer")


def test_service_an_unexpected_error_on_mcp_is_32603_without_details(server, monkeypatch, caplog):
    def crash(*args: Any) -> Any:
        raise RuntimeError("secret path /var/lib/solos.db")

    monkeypatch.setattr(server.server.bridge, "handle", crash)
    with caplog.at_level(logging.ERROR):
        reply = call_recall(server)
    assert_rpc_refusal(reply, 500, "internal", mcp_bridge.INTERNAL_ERROR, request_id=1)
    assert b"secret" not in reply.raw and "secret path" in caplog.text


def test_service_rest_refusals_keep_rest_shape(server, monkeypatch):
    reply = server.post("/v1/long", {"x": "y" * (solos_memory.MAX_BODY_BYTES + 10)})
    assert reply.status == 413 and reply.body["error"]["code"] == "payload_too_large" and "jsonrpc" not in reply.body


def test_service_a_head_past_the_cap_on_mcp_is_431_in_json_rpc(server):
    """http.server's own refusals (send_error) of a request to /mcp take the same shape."""
    lines = [
        "POST /mcp HTTP/1.1",
        f"Host: 127.0.0.1:{server.port}",
        *(f"X-Filler-{i}: {'a' * 4000}" for i in range(20)),
    ]
    response = raw_exchange(server.port, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    assert statuses_in(response) == [431], response[:300]
    reply = json.loads(response.split(b"\r\n\r\n", 1)[1])
    assert reply["id"] is None and reply["error"]["code"] == mcp_bridge.INVALID_REQUEST
    assert reply["error"]["data"]["status"] == 431 and "65536 bytes" in reply["error"]["message"]
