"""The Host and Origin rule on every route: a rebound DNS name or a foreign origin is 403 and changes nothing;
loopback names and an allowed origin with its own host pass."""

from __future__ import annotations

import json

import pytest
from conftest import refused_at_start

EVERY_ROUTE = [
    ("GET", "/health", None),
    ("GET", "/metrics", None),
    ("GET", "/openapi.json", None),
    ("GET", "/", None),
    ("GET", "/v1/recall?agent=sol&q=x", None),
    ("GET", "/v1/stats", None),
    ("GET", "/v1/audit?agent=atlas", None),
    ("POST", "/v1/long", {"agent": "atlas", "fact": "rebound write"}),
    ("POST", "/v1/short", {"agent": "atlas", "key": "k", "value": "rebound"}),
    ("POST", "/v1/episodic", {"agent": "atlas", "event_type": "t", "summary": "rebound"}),
    ("PUT", "/v1/sharing", {"agent": "atlas", "episodic": True}),
    ("DELETE", "/v1/short?agent=atlas&key=keep", None),
    ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
]


@pytest.mark.parametrize("method,path,body", EVERY_ROUTE)
@pytest.mark.parametrize("foreign", ["host", "origin"])
def test_a_rebound_name_or_a_foreign_origin_is_403_on_every_route_and_changes_nothing(
    server, method, path, body, foreign
):
    server.post("/v1/short", {"agent": "atlas", "key": "keep", "value": "kept"})
    headers = {"Host": f"evil.example:{server.port}", "Origin": "http://evil.example"}
    if foreign == "origin":
        headers["Host"] = f"127.0.0.1:{server.port}"
    reply = server.request(method, path, body=body, headers=headers)
    assert reply.status == 403, (method, path, reply.status, reply.raw[:200])
    message = json.dumps(reply.body)
    assert ("Host" if foreign == "host" else "Origin") in message and "evil.example" in message
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM memory_episodic").fetchone()[0] == 0
        assert conn.execute("SELECT value FROM memory_short WHERE key = 'keep'").fetchone()[0] == "kept"
        assert conn.execute("SELECT count(*) FROM episodic_sharing").fetchone()[0] == 0


def test_the_issue_reproduction_now_answers_403_with_the_rule_named(server):
    reply = server.request(
        "POST",
        "/v1/long",
        body={"agent": "atlas", "fact": "x"},
        headers={"Host": f"evil.example:{server.port}", "Origin": "http://evil.example"},
    )
    assert reply.status == 403 and reply.body["error"]["field"] == "Host"
    assert "DNS rebinding" in reply.body["error"]["message"]


def test_loopback_names_and_an_allowed_origin_with_its_host_pass(make_server):
    server = make_server(allowed_origins=("http://fleet.example:9999",))
    for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", "fleet.example:9999"):
        assert server.request("GET", "/health", headers={"Host": host}).status == 200, host
    page = {"Host": "fleet.example:9999", "Origin": "http://fleet.example:9999"}
    assert server.post("/v1/long", {"agent": "atlas", "fact": "from the trusted page"}, headers=page).status == 201
    assert server.request("GET", "/health", headers={"Host": "fleet.example:1234"}).status == 403


@pytest.mark.parametrize(
    "given",
    ["fleet.example:9999", "http://fleet.example:9999/", "http://fleet.example:9999/page", "ftp://fleet.example", "*"],
)
def test_an_allowed_origin_that_no_browser_sends_stops_startup(tmp_path, given):
    """An Origin header is scheme://host[:port], nothing more: the operator who wrote `fleet.example:9999` or a
    trailing slash got a service that started and then answered their page 403 on every call, and an empty
    host name ("" as Host) was let in."""
    argv = ["serve", "--db", str(tmp_path / "o.db"), "--port", "0", "--model-dir", "off", "--allowed-origin", given]
    last = refused_at_start(argv)
    assert "--allowed-origin" in last and "scheme://host[:port]" in last and repr(given) in last, last
    assert not (tmp_path / "o.db").exists()
