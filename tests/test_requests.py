"""Bad requests and framing: what a malformed, oversized or conflicting request gets on REST and MCP (a 4xx
naming what is wrong, never a 500), and that no request's body is ever read as the next request."""

from __future__ import annotations

import json
import os

import pytest
from conftest import raw_exchange, statuses_in

import solos_bounds
import solos_memory

# ---- REST integers as long as MCP's; a method the path does not take is 405 with or without a body ----


def test_rest_takes_every_integer_mcp_takes(server):
    largest = str(solos_bounds.MAX_ID)
    rest = server.get("/v1/events", agent="sol", since=largest)
    mcp = server.mcp_tool("read_events", {"agent": "sol", "since": solos_bounds.MAX_ID})
    assert rest.status == 200, rest.body
    assert mcp.status == 200 and not mcp.body["result"]["isError"], mcp.body
    both = (rest.body, mcp.body["result"]["structuredContent"])
    # both taken, and both say no event of this store was ever that high (a fresh store: reading goes on from 0)
    assert [(one["next_since"], one["gap"]["through"]) for one in both] == [(0, solos_bounds.MAX_ID)] * 2, both


@pytest.mark.parametrize(
    ("since", "named"),
    [
        (str(solos_bounds.MAX_ID + 1), "at most"),  # one past: the range check names it, as MCP's does
        ("9" * 40, "at most"),
        ("١٢", "integer"),  # Arabic-Indic digits: int() reads them, the schema's integer is ASCII
        ("12x", "integer"),
    ],
)
def test_rest_integers_out_of_range_or_malformed_are_a_400_naming_the_field(server, since, named):
    reply = server.get("/v1/events", agent="sol", since=since)
    assert reply.status == 400, reply.body
    assert reply.body["error"]["field"] == "since" and named in reply.body["error"]["message"]


def bare(server, method: str, path: str) -> tuple[int, dict, dict]:
    """A request without a body or a Content-Length (curl -X PUT URL): status, headers, JSON body."""
    raw = raw_exchange(server.port, f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
    head, _, body = raw.partition(b"\r\n\r\n")
    fields = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])
    return statuses_in(raw)[0], {k.lower(): v for k, v in fields.items()}, json.loads(body)


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [("PUT", "/v1/recall", "GET"), ("POST", "/v1/recall", "GET"), ("PUT", "/v1/long", "POST")],
)
def test_a_method_the_path_does_not_take_is_405_without_a_body_too(server, method, path, allowed):
    status, headers, body = bare(server, method, path)
    with_body = server.request(method, path, body={})
    assert (status, with_body.status) == (405, 405), body
    assert allowed in headers["allow"] and body["error"]["code"] == with_body.body["error"]["code"]


@pytest.mark.parametrize(("method", "path"), [("PUT", "/v1/sharing"), ("POST", "/v1/long"), ("POST", "/mcp")])
def test_a_method_the_path_takes_still_needs_its_body(server, method, path):
    status, _, body = bare(server, method, path)
    error = body["error"]["data"] if path == "/mcp" else body["error"]  # /mcp: inside a JSON-RPC error
    assert status == 411 and error["field"] == "Content-Length"


# ---- integers past 64 bits; a listed Content-Length ----


@pytest.mark.parametrize(
    ("name", "arguments", "field"),
    [
        ("read_events", {"agent": "atlas", "since": 2**63}, "since"),
        ("forget", {"agent": "atlas", "tier": "long", "id": 2**64}, "id"),
        ("read_audit", {"agent": "atlas", "before_id": 2**63}, "before_id"),
        ("promote", {"agent": "atlas", "ids": [2**63], "fact": "x"}, "ids"),
    ],
)
def test_integers_past_64_bits_are_a_4xx_naming_the_field(server, name, arguments, field):
    result = server.mcp_tool(name, arguments).body["result"]
    error = result["structuredContent"]["error"]
    assert result["isError"] and error["status"] == 400 and error["field"] == field, error


def test_rest_integers_past_64_bits_are_400(server):
    reply = server.get("/v1/events", agent="atlas", since=str(2**63))
    assert reply.status == 400 and reply.body["error"]["field"] == "since"
    reply = server.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": str(2**70)})
    assert reply.status == 400 and reply.body["error"]["field"] == "id"


@pytest.mark.parametrize("lengths", ["Content-Length: {n}, {n}", "Content-Length: {n}\r\nContent-Length: {n}"])
def test_a_listed_content_length_is_refused(server, lengths):
    body = json.dumps({"agent": "atlas", "fact": "framed twice"})
    request = (
        f"POST /v1/long HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
        f"{lengths.format(n=len(body))}\r\n\r\n{body}"
    ).encode()
    answer = raw_exchange(server.port, request)
    assert statuses_in(answer) == [400]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["field"] == "Content-Length"
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0] == 0


# ---- lone surrogates: refused at validation on both transports; stored junk never 500s anyone ----


SURROGATE_WRITES = [
    ("write_long", {"agent": "atlas", "fact": "bad \ud800 text"}, "fact"),
    ("write_long", {"agent": "atlas", "fact": "fine", "tags": ["ok", "\udfff"]}, "tags"),
    ("write_short", {"agent": "atlas", "key": "k\ud800", "value": "v"}, "key"),
    ("write_episodic", {"agent": "atlas", "event_type": "t", "summary": "s", "details": "\ud83d"}, "details"),
    ("recall", {"agent": "atlas", "q": "\ud800"}, "q"),
]


@pytest.mark.parametrize("tool,args,field", SURROGATE_WRITES)
def test_a_lone_surrogate_is_400_naming_the_field_on_rest_and_mcp(server, tool, args, field):
    op = solos_memory.OPERATIONS[tool]
    raw = json.dumps(args).encode()  # ensure_ascii: the surrogate travels as a valid \ud800 escape
    if op.method == "GET":  # a query string is UTF-8 percent-encoding: the nearest REST form is %ED%A0%80
        rest = server.request("GET", f"{op.path}?agent=atlas&q=%ED%A0%80")
    else:
        rest = server.request(op.method, op.path, raw=raw, headers={"Content-Type": "application/json"})
    assert rest.status == 400 and rest.body["error"]["field"] == field
    reply = server.mcp_tool(tool, args)
    result = reply.body["result"]
    assert reply.status == 200 and result["isError"] is True, reply.raw
    assert result["structuredContent"]["error"]["field"] == field
    with server.db() as conn:
        for table in ("memory_longterm", "memory_short", "memory_episodic"):
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0


def test_rows_other_writers_stored_with_bad_text_never_fail_a_recall(server):
    """Invalid UTF-8 bytes and an escaped lone surrogate in tags, written straight into the database."""
    with server.db() as conn:
        conn.execute(
            "INSERT INTO memory_longterm (agent, topic, fact, tags, created_at, updated_at) "
            "VALUES ('atlas', 't', CAST(X'6d61726b657220ff20627974657320e2' AS TEXT), '[\"\\ud800\"]', "
            "strftime('%Y-%m-%dT%H:%M:%fZ'), strftime('%Y-%m-%dT%H:%M:%fZ'))"
        )
        conn.execute(
            "INSERT INTO memory_longterm (agent, topic, fact, tags, created_at, updated_at) "
            "VALUES ('atlas', 't', 'marker clean fact', '[\"\\ud800\"]', "
            "strftime('%Y-%m-%dT%H:%M:%fZ'), strftime('%Y-%m-%dT%H:%M:%fZ'))"
        )
    for caller in ("sol", "atlas", "nova"):
        rest = server.recall(caller, "marker")
        assert rest.status == 200 and rest.body["count"] == 2, rest.raw[:300]
        assert any("\ufffd" in row["text"] for row in rest.body["results"])
        mcp = server.mcp_tool("recall", {"agent": caller, "q": "marker"})
        assert mcp.status == 200 and mcp.body["result"]["isError"] is False, mcp.raw[:300]
        assert mcp.body["result"]["structuredContent"]["count"] == 2


# ---- request smuggling: framing errors close the connection; conflicting framing is 400 ----


def head(server, request_line: str, *headers: str) -> bytes:
    lines = [request_line, f"Host: 127.0.0.1:{server.port}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")  # headers are ISO-8859-1 on the wire


def victim_present(server) -> bool:
    with server.db() as conn:
        return conn.execute("SELECT count(*) FROM memory_short WHERE key = 'victim'").fetchone()[0] == 1


SMUGGLED = b"DELETE /v1/short?agent=atlas&key=victim HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n"


@pytest.mark.parametrize(
    "framing",
    [
        ("POST /v1/long HTTP/1.1", "Content-Type: application/json"),  # no Content-Length: 411
        ("POST /v1/long HTTP/1.1", "Content-Type: application/json", "Content-Length: 2", "Content-Length: 0"),
        ("POST /v1/long HTTP/1.1", "Content-Type: application/json", "Content-Length: 2, 0"),
        ("POST /v1/long HTTP/1.1", "Content-Type: application/json", "Transfer-Encoding: gzip"),
        ("POST /v1/long HTTP/1.1", "Transfer-Encoding: chunked", "Content-Length: 2"),
        ("POST /mcp HTTP/1.1", "Content-Type: application/json"),
        ("PUT /v1/sharing HTTP/1.1", "Content-Type: application/json"),
        ("GET /v1/recall?agent=sol HTTP/1.1", "Content-Length: \u00b2"),
        ("POST /v1/long HTTP/1.1", "Content-Type: application/json", "Content-Length: 1\u00b3"),
    ],
)
def test_a_body_is_never_parsed_as_the_next_request(server, framing):
    assert server.post("/v1/short", {"agent": "atlas", "key": "victim", "value": "v"}).status == 201
    response = raw_exchange(server.port, head(server, *framing) + SMUGGLED % server.port)
    statuses = statuses_in(response)
    assert len(statuses) == 1 and statuses[0] in (400, 411), response[:300]
    assert b"Connection: close" in response
    assert victim_present(server), "the smuggled DELETE ran"


def test_a_body_sent_to_a_route_that_ignores_it_is_drained_not_run(server):
    assert server.post("/v1/short", {"agent": "atlas", "key": "victim", "value": "v"}).status == 201
    smuggled = SMUGGLED % server.port
    for route in ("/health", "/metrics", "/v1/recall?agent=sol", "/openapi.json"):
        data = head(server, f"GET {route} HTTP/1.1", f"Content-Length: {len(smuggled)}") + smuggled
        statuses = statuses_in(raw_exchange(server.port, data))
        assert statuses == [200], (route, statuses)
        assert victim_present(server), f"a body sent to GET {route} ran as a request"


@pytest.mark.parametrize("line", ["X-Note : hi", "X-Note\t: hi", "a line without a colon", ": no name", "X-\x01: b"])
def test_a_header_line_that_is_not_name_colon_value_is_400_and_hides_no_header_after_it(server, line):
    """Python's header parser ended the head at such a line: the Content-Length and Origin after it went unseen,
    so a GET's body ran as the next request and a foreign page's write passed the Origin rule."""
    assert server.post("/v1/short", {"agent": "atlas", "key": "victim", "value": "v"}).status == 201
    smuggled = SMUGGLED % server.port
    data = head(server, "GET /health HTTP/1.1", line, f"Content-Length: {len(smuggled)}") + smuggled
    response = raw_exchange(server.port, data)
    assert statuses_in(response) == [400] and b"Connection: close" in response, response[:300]
    assert b'"field": "headers"' in response and victim_present(server), "the smuggled DELETE ran"
    write = b'{"agent": "atlas", "fact": "from a foreign page"}'
    fields = ["Content-Type: application/json", f"Content-Length: {len(write)}", line, "Origin: http://evil.example"]
    assert statuses_in(raw_exchange(server.port, head(server, "POST /v1/long HTTP/1.1", *fields) + write)) == [400]
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0] == 0


@pytest.mark.parametrize(
    "fields,named",
    [
        (["Host: evil.example"], "Host"),  # after head()'s own Host: 127.0.0.1
        (["Origin: http://127.0.0.1:{port}", "Origin: http://evil.example"], "Origin"),
        (["Authorization: Bearer a", "Authorization: Bearer b"], "Authorization"),
        (["Content-Type: application/json", "Content-Type: text/plain"], "Content-Type"),
        (["MCP-Protocol-Version: 2025-11-25", "MCP-Protocol-Version: 2025-03-26"], "MCP-Protocol-Version"),
    ],
)
def test_a_header_the_service_reads_once_given_twice_is_400_naming_it(server, fields, named):
    """The service read the first; a proxy in front that reads the last (HTTP/1.1 says a second Host is 400)
    would pass one Host, Origin or token and the service act on another."""
    write = b'{"agent": "atlas", "fact": "given twice"}'
    typed = [] if named == "Content-Type" else ["Content-Type: application/json"]
    fields = [field.format(port=server.port) for field in fields]
    data = head(server, "POST /v1/long HTTP/1.1", *fields, *typed, f"Content-Length: {len(write)}")
    response = raw_exchange(server.port, data + write)
    assert statuses_in(response) == [400], response[:300]
    assert f'"field": "{named}"'.encode() in response and b"Connection: close" in response
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0] == 0


def test_a_request_head_past_64_kib_is_431_and_closes(server):
    """Each line under http.server's 64 KiB and fewer than its 100 lines, a head reached 6.4 MB, all kept in
    memory: 20 such requests took the service from 34 to 247 MB, and 128 connections could hold 1.3 GB."""
    lines = [f"X-Filler-{i}: {'a' * 4000}" for i in range(20)]  # 80 KB
    response = raw_exchange(server.port, head(server, "GET /health HTTP/1.1", *lines))
    assert statuses_in(response) == [431] and b"Connection: close" in response, response[:300]
    assert b"65536 bytes" in response
    fitting = [f"X-Filler-{i}: {'a' * 4000}" for i in range(15)]  # 60 KB: a large head, still served
    assert statuses_in(raw_exchange(server.port, head(server, "GET /health HTTP/1.1", *fitting))) == [200]


# ---- 4xx, never 500: Content-Length digits, huge integers, deep nesting ----


def test_unicode_digits_in_content_length_are_400(server):
    response = raw_exchange(server.port, head(server, "POST /v1/long HTTP/1.1", "Content-Length: \u00b2") + b"{}")
    assert statuses_in(response) == [400] and b'"field": "Content-Length"' in response


def test_an_integer_past_4300_digits_is_400_on_rest_and_a_parse_error_on_mcp(server):
    body = b'{"agent": "atlas", "fact": "f", "confidence": ' + b"9" * 5000 + b"}"
    rest = server.request("POST", "/v1/long", raw=body, headers={"Content-Type": "application/json"})
    assert rest.status == 400 and rest.body["error"]["field"] == "body"
    rpc = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "recall", "arguments": {"k": '
    mcp = server.request("POST", "/mcp", raw=rpc + b"9" * 5000 + b"}}}", headers={"Content-Type": "application/json"})
    assert mcp.status == 400 and mcp.body["error"]["code"] == -32700


@pytest.mark.parametrize("depth", [200, 900, 2000])
def test_deep_nesting_inside_a_field_is_a_4xx_naming_it(server, depth):
    body = b'{"agent": "atlas", "fact": ' + b"[" * depth + b"]" * depth + b"}"
    rest = server.request("POST", "/v1/long", raw=body, headers={"Content-Type": "application/json"})
    assert rest.status == 400 and rest.body["error"]["field"] in ("fact", "body"), rest.raw[:200]
    rpc = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "write_long", "arguments": '
    mcp = server.request("POST", "/mcp", raw=rpc + body + b"}}", headers={"Content-Type": "application/json"})
    assert mcp.status in (200, 400), mcp.raw[:200]
    assert mcp.body.get("error") or mcp.body["result"]["isError"] is True


# ---- one validation, one answer: MCP refuses what REST refuses ----


@pytest.mark.parametrize(
    "tool,arguments",
    [
        ("write_long", b'{"agent": "atlas", "fact": "f", "confidence": NaN}'),
        ("write_episodic", b'{"agent": "atlas", "event_type": "t", "summary": "s", "duration_s": Infinity}'),
        ("write_short", b'{"agent": "atlas", "key": "k", "value": "v", "ttl_s": NaN}'),
    ],
)
def test_nan_and_infinity_are_refused_on_both_transports_and_nothing_is_stored(server, tool, arguments):
    op = solos_memory.OPERATIONS[tool]
    rest = server.request(op.method, op.path, raw=arguments, headers={"Content-Type": "application/json"})
    assert rest.status == 400, rest.raw
    rpc = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "%s", "arguments": %s}}'
    mcp = server.request(
        "POST", "/mcp", raw=rpc % (tool.encode(), arguments), headers={"Content-Type": "application/json"}
    )
    assert mcp.status == 400 and mcp.body["error"]["code"] == -32700, mcp.raw
    with server.db() as conn:
        for table in ("memory_longterm", "memory_short", "memory_episodic"):
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0


def test_non_finite_numbers_are_refused_by_validation_itself():
    schema = solos_memory.OPERATIONS["write_long"].input_schema
    for value in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(solos_memory.BadRequest) as refused:
            solos_memory.check_args(schema, {"agent": "atlas", "fact": "f", "confidence": value})
        assert refused.value.field == "confidence"


def test_a_utf16_body_is_refused_on_mcp_as_on_rest(server):
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "write_long", "arguments": {}}}
    rpc["params"]["arguments"] = {"agent": "atlas", "fact": "sent as UTF-16"}
    raw = json.dumps(rpc).encode("utf-16")
    mcp = server.request("POST", "/mcp", raw=raw, headers={"Content-Type": "application/json"})
    assert mcp.status == 400 and mcp.body["error"]["code"] == -32700
    rest = server.request(
        "POST",
        "/v1/long",
        raw=json.dumps(rpc["params"]["arguments"]).encode("utf-16"),
        headers={"Content-Type": "application/json"},
    )
    assert rest.status == 400
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0] == 0


# ---- patterns guard whole values: no trailing newline ----


def test_an_agent_name_ending_in_a_newline_is_refused_everywhere(server, tmp_path):
    rest = server.post("/v1/long", {"agent": "atlas\n", "fact": "f"})
    assert rest.status == 400 and rest.body["error"]["field"] == "agent"
    mcp = server.mcp_tool("write_long", {"agent": "atlas\n", "fact": "f"})
    assert mcp.body["result"]["isError"] is True
    assert mcp.body["result"]["structuredContent"]["error"]["field"] == "agent"
    with pytest.raises(SystemExit):
        solos_memory.check_agent_names(["atlas\n"])
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text("0" * 64 + " atlas\n\n")
    os.chmod(tokens_file, 0o600)
    assert solos_memory.Tokens.load(str(tokens_file)).by_hash == {"0" * 64: "atlas"}
    assert not solos_memory.fully_matches(solos_memory.AGENT_PATTERN, "atlas\n")


@pytest.mark.parametrize("target", ["http://[::1", "http://]/v1/recall", "http://[::1/mcp"])
def test_a_request_target_that_is_not_a_url_is_400_not_a_dropped_connection(server, target):
    """urlsplit refuses an unclosed IPv6 bracket: the request was dropped unanswered, a traceback logged."""
    response = raw_exchange(server.port, head(server, f"GET {target} HTTP/1.1"))
    assert statuses_in(response) == [400], response[:300]
    assert b"request target" in response and b"Connection: close" in response
    assert statuses_in(raw_exchange(server.port, head(server, "GET /health HTTP/1.1"))) == [200]
