"""Bad requests and framing: what a malformed, oversized or conflicting request gets on REST and MCP (a 4xx
naming what is wrong, never a 500), and that no request's body is ever read as the next request."""

from __future__ import annotations

import json

import pytest
from conftest import raw_exchange, statuses_in

import solos_bounds

# ---- REST integers as long as MCP's; a method the path does not take is 405 with or without a body ----


def test_rest_takes_every_integer_mcp_takes(server):
    largest = str(solos_bounds.MAX_ID)
    rest = server.get("/v1/events", agent="sol", since=largest)
    mcp = server.mcp_tool("read_events", {"agent": "sol", "since": solos_bounds.MAX_ID})
    assert rest.status == 200, rest.body
    assert mcp.status == 200 and not mcp.body["result"]["isError"], mcp.body
    assert rest.body["next_since"] == mcp.body["result"]["structuredContent"]["next_since"] == solos_bounds.MAX_ID


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
    assert status == 411 and body["error"]["field"] == "Content-Length"


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
