"""The Host and Origin rule on every route: a rebound DNS name or a foreign origin is 403 and changes nothing;
loopback names and an allowed origin with its own host pass."""

from __future__ import annotations

import json

import pytest
from conftest import episode, refused_at_start

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


@pytest.mark.parametrize("site", ["cross-site", "same-site"])
def test_a_page_of_another_site_cannot_make_the_browser_read_as_an_agent(server, site):
    """A page on any site the operator opens could embed <img src="http://127.0.0.1:8437/v1/recall?agent=sol&...">:
    the browser sends no Origin for such a GET, so under loopback trust the recall ran as sol, audited sol as a
    reader of atlas's episodes and logged the deliveries, all forged by the page. Browsers say where a request
    comes from (Sec-Fetch-Site); one from another site without an allowed Origin is refused."""
    server.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True})
    episode(server, "atlas", "atlas rotated the backup keys")
    query = "/v1/recall?agent=sol&q=backup+keys&scope=shared&tiers=episodic"
    embedded = server.request("GET", query, headers={"Sec-Fetch-Site": site, "Sec-Fetch-Mode": "no-cors"})
    assert embedded.status == 403 and "Sec-Fetch-Site" in embedded.body["error"]["message"], embedded.body
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM episodic_read_audit").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM memory_delivery").fetchone()[0] == 0
    for own in ({"Sec-Fetch-Site": "none"}, {"Sec-Fetch-Site": "same-origin"}, {}):
        assert server.request("GET", query, headers=own).status == 200, own
    page = {"Sec-Fetch-Site": site, "Origin": f"http://localhost:{server.port}"}  # an allowed origin's fetch
    assert server.request("GET", query, headers=page).status == 200
    framed = {"Sec-Fetch-Site": site, "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe"}
    assert server.request("GET", query, headers=framed).status == 403
    followed = {"Sec-Fetch-Site": site, "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}
    assert server.request("GET", "/", headers=followed).status == 200  # the status page, linked from a dashboard


@pytest.mark.parametrize("user", [{}, {"Sec-Fetch-User": "?1"}], ids=["script", "click"])
def test_a_page_of_another_site_cannot_navigate_the_browser_into_a_read_as_an_agent(server, user):
    """A navigation carries no Origin either: another site's script (`location = ".../v1/recall?agent=sol&..."`),
    or a link on it, ran the recall as sol under loopback trust, audited and logged as sol's, as the <img> did. A
    navigation from another site reaches only what an operator follows a link to: the status page and the
    service's documents, which do nothing on an agent's behalf."""
    server.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True})
    episode(server, "atlas", "atlas rotated the backup keys")
    navigation = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document", **user}
    query = "/v1/recall?agent=sol&q=backup+keys&scope=shared&tiers=episodic"
    refused = server.request("GET", query, headers=navigation)
    assert refused.status == 403 and "Sec-Fetch-Site" in refused.body["error"]["message"], refused.body
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM episodic_read_audit").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM memory_delivery").fetchone()[0] == 0
    for page in ("/", "/status", "/health", "/metrics", "/openapi.json"):
        assert server.request("GET", page, headers=navigation).status == 200, page
    assert server.request("GET", query, headers={**navigation, "Sec-Fetch-Site": "none"}).status == 200  # typed
