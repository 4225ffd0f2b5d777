"""Hardening, round two (issue 18): bounded answers, the event cache and streams, integer bounds, framing,
and which connection makes room at the cap. Row ids: tests/test_row_ids.py."""

from __future__ import annotations

import http.client
import json
import socket
import time

import pytest
from conftest import raw_exchange, statuses_in, subscribed, wait_until

import mcp_bridge
import solos_bounds
import solos_connections

# Text whose JSON is as large as JSON gets: every control character is six bytes (\u0001).
HEAVY = "\x01" * 8000


def heavy_episodes(server, count: int) -> list[int]:
    ids = []
    for n in range(count):
        reply = server.post(
            "/v1/episodic",
            {"agent": "atlas", "event_type": "task", "summary": f"heavy {n} " + HEAVY[:4000], "details": HEAVY * 2},
        )
        assert reply.status == 201, reply.body
        ids.append(reply.body["id"])
    return ids


def test_read_events_pages_by_bytes_and_loses_nothing(server):
    ids = heavy_episodes(server, 40)  # about 150 KB of JSON each: 6 MB unbounded
    seen, since, pages = [], 0, 0
    while True:
        reply = server.get("/v1/events", agent="atlas", since=since, limit=1000, tiers="episodic")
        assert reply.status == 200
        assert len(reply.raw) <= solos_bounds.ANSWER_BYTES + 64 * 1024, len(reply.raw)
        if not reply.body["events"]:
            break
        pages += 1
        seen += [e["row_id"] for e in reply.body["events"]]
        assert reply.body["next_since"] == reply.body["events"][-1]["id"]  # continue right after the last one
        since = reply.body["next_since"]
    assert seen == ids and pages >= 5


def test_recall_is_cut_by_bytes_and_says_so(server):
    for n in range(60):
        fact = f"ballast fact {n} " + HEAVY[:8000]
        assert server.post("/v1/long", {"agent": "atlas", "fact": fact}).status == 201
    reply = server.recall("sol", "ballast", k=100)
    assert reply.status == 200
    assert len(reply.raw) <= solos_bounds.ANSWER_BYTES + 64 * 1024, len(reply.raw)
    body = reply.body
    assert body["truncated"]["left_out"] > 0 and body["count"] + body["truncated"]["left_out"] == 60
    assert "ballast" in body["truncated"]["message"] or "bytes" in body["truncated"]["message"]
    small = server.recall("sol", "ballast", k=3).body
    assert small["count"] == 3 and small["truncated"] is None


def test_a_foreign_episode_left_out_for_size_is_not_audited(server):
    server.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True})
    heavy_episodes(server, 30)
    body = server.recall("sol", "heavy", k=30, tiers="episodic").body
    assert body["truncated"]["left_out"] > 0
    with server.db() as conn:
        audited = {r[0] for r in conn.execute("SELECT row_id FROM episodic_read_audit WHERE reader = 'sol'")}
    assert audited == {r["id"] for r in body["results"]}


def mcp_post(server, payload, version: str = "2025-03-26") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": version,
        }
        conn.request("POST", "/mcp", body=json.dumps(payload), headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def call(n: int, name: str, arguments: dict) -> dict:
    return {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


@pytest.mark.slow
def test_an_mcp_batch_is_capped_in_items_and_in_bytes(server):
    heavy_episodes(server, 40)
    too_many = [call(n, "stats", {}) for n in range(mcp_bridge.MAX_BATCH_ITEMS + 1)]
    status, raw = mcp_post(server, too_many)
    assert status == 400 and b"at most 16" in raw
    events = {"agent": "atlas", "since": 0, "limit": 1000, "tiers": ["episodic"]}
    status, raw = mcp_post(server, [call(n, "read_events", events) for n in range(mcp_bridge.MAX_BATCH_ITEMS)])
    assert status == 200
    assert len(raw) <= mcp_bridge.MAX_BATCH_BYTES + 64 * 1024, len(raw)
    replies = json.loads(raw)
    assert [r["id"] for r in replies] == list(range(mcp_bridge.MAX_BATCH_ITEMS))
    carried = [r for r in replies if "result" in r]
    refused = [r for r in replies if "error" in r]
    assert carried and refused and all("on its own" in r["error"]["message"] for r in refused)
    alone = mcp_post(server, call(99, "read_events", events), version="2025-11-25")[1]
    assert json.loads(alone)["result"]["structuredContent"]["count"] > 0  # the call on its own is answered


def test_the_event_cache_is_bounded_by_bytes_and_shown_in_stats(server, streams, monkeypatch):
    import solos_events

    monkeypatch.setattr(solos_events, "WIRE_CACHE_BYTES", 1 << 20)
    stream = subscribed(streams(server, {"agent": "sol"}))
    for n in range(30):  # about 300 KB encoded each
        fact = f"cached fact {n} " + HEAVY[:8000]
        assert server.post("/v1/long", {"agent": "atlas", "fact": fact}).status == 201
    assert len(stream.events(30, timeout=20)) == 30
    cache = server.get("/v1/stats").body["event_streams"]
    assert 0 < cache["cache_bytes"] <= 1 << 20 and cache["cache_events"] < 30
    assert b"solos_memory_event_cache_bytes" in server.get("/metrics").raw


@pytest.mark.slow
def test_an_agent_gets_its_share_of_streams_and_the_oldest_goes(server, streams):
    hub = server.server.memory.events
    hub.max_subscribers, hub.streams_per_agent = 4, 2
    sol = [subscribed(streams(server, {"agent": "sol"})) for _ in range(3)]
    sol[0].closed.wait(5)
    assert sol[0].closed.is_set()  # sol's oldest gave way to its newest
    atlas = [subscribed(streams(server, {"agent": "atlas"})) for _ in range(2)]
    nova = subscribed(streams(server, {"agent": "nova"}))  # the cap is full: the biggest holder's oldest goes
    assert nova.status == 200 and len(hub.subscribers) == 4
    assert sum(s.closed.wait(5) for s in (sol[1], atlas[0])) == 1
    assert hub.stats()["replaced"] == 2


@pytest.mark.slow
def test_a_closed_stream_gives_its_slot_back_within_seconds(server, streams):
    hub = server.server.memory.events
    stream = subscribed(streams(server, {"agent": "sol"}))
    assert len(hub.subscribers) == 1
    stream.close()
    started = time.monotonic()
    while hub.subscribers and time.monotonic() - started < 10:
        time.sleep(0.05)
    took = time.monotonic() - started
    assert not hub.subscribers and took < 3, f"the closed stream kept its slot for {took:.1f} s"


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


def test_past_the_cap_a_kept_alive_client_keeps_its_connection(make_server, monkeypatch):
    monkeypatch.setattr(solos_connections, "MAX_CONNECTIONS", 8)
    server = make_server()
    kept = []
    for _ in range(4):  # clients that finished a request and keep the connection for their next one
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.request("GET", "/health")
        assert conn.getresponse().read()
        kept.append(conn)
    silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]  # never send a head
    wait_until(lambda: len(server.server.waiting) == 8, "the silent sockets to take the last slots")
    newcomers = []
    for _ in range(4):  # past the cap: each evicts someone
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.request("GET", "/health")
        assert conn.getresponse().status == 200
        newcomers.append(conn)
    try:
        for conn in kept:  # every reuse still works: the silent sockets made room
            conn.request("GET", "/health")
            assert conn.getresponse().status == 200
    finally:
        for conn in kept + newcomers:
            conn.close()
        for sock in silent:
            sock.close()
