"""Byte bounds: answers cut by bytes and saying so, pages of events, the MCP batch cap, the request body cap;
each counts bytes, not characters.

An emoji is one character and four bytes of UTF-8 (twelve as ASCII JSON's surrogate pair), a CJK character
three (six); a bound that counts characters lets such text through several times over."""

from __future__ import annotations

import http.client
import json

import pytest
from conftest import subscribed

import mcp_bridge
import solos_bounds
import solos_memory

JSON = {"Content-Type": "application/json"}
WIDE = pytest.mark.parametrize("char", ["\U0001f600", "\u6f22"], ids=["emoji", "cjk"])


def utf8_post(server, path: str, body: dict):
    """A POST whose JSON is UTF-8, as most clients send it (solos_client, Node, the mcp SDK)."""
    return server.request("POST", path, raw=json.dumps(body, ensure_ascii=False).encode(), headers=JSON)


def wide_episodes(server, char: str, count: int) -> None:
    for n in range(count):  # 20,000 characters each
        body = {
            "agent": "atlas",
            "event_type": "task",
            "summary": f"wide {n} " + char * 3_900,
            "details": char * 16_000,
        }
        reply = utf8_post(server, "/v1/episodic", body)
        assert reply.status == 201, reply.body


def batch_call(n: int, name: str, arguments: dict) -> dict:
    return {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


@WIDE
def test_an_mcp_batch_cap_counts_the_bytes_it_sends(server, char):
    wide_episodes(server, char, 8)
    arguments = {"agent": "atlas", "since": 0, "limit": 1000, "tiers": ["episodic"]}
    batch = [batch_call(n, "read_events", arguments) for n in range(mcp_bridge.MAX_BATCH_ITEMS)]
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-03-26"}
    reply = server.request("POST", "/mcp", body=batch, headers=headers)
    assert reply.status == 200
    assert len(reply.raw) <= mcp_bridge.MAX_BATCH_BYTES, len(reply.raw)  # was 9.3-12.2 MB
    replies = json.loads(reply.raw)
    assert [r["id"] for r in replies] == list(range(mcp_bridge.MAX_BATCH_ITEMS))
    carried = [r for r in replies if "result" in r]
    refused = [r for r in replies if "error" in r]
    assert carried and refused and all("on its own" in r["error"]["message"] for r in refused)
    assert all(r["result"]["structuredContent"]["count"] > 0 for r in carried)


BATCH_HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-03-26"}


def test_a_write_in_an_mcp_batch_past_its_byte_cap_is_answered_as_stored(server):
    # Reads fill the batch's reply past its cap; the write after them is run all the same. Its reply was
    # replaced by "send this call on its own", so a client resent it and stored the episode twice.
    wide_episodes(server, "\U0001f600", 8)
    reads = {"agent": "atlas", "since": 0, "limit": 1000, "tiers": ["episodic"]}
    write = {"agent": "atlas", "event_type": "task", "summary": "written after the cap"}
    batch = [batch_call(n, "read_events", reads) for n in range(mcp_bridge.MAX_BATCH_ITEMS - 1)]
    batch.append(batch_call(99, "write_episodic", write))
    reply = server.request("POST", "/mcp", body=batch, headers=BATCH_HEADERS)
    assert reply.status == 200
    replies = {r["id"]: r for r in json.loads(reply.raw)}
    assert any("error" in r for r in replies.values())  # the cap was passed: some read was refused
    with server.db() as conn:
        found = conn.execute("SELECT id FROM memory_episodic WHERE summary = ?", (write["summary"],))
        stored = [row[0] for row in found]
    assert len(stored) == 1
    assert "result" in replies[99], replies[99]  # the reply says what happened: stored, with its id
    assert replies[99]["result"]["structuredContent"]["id"] == stored[0]


@WIDE
def test_an_answer_cut_by_bytes_is_cut_by_its_bytes(char):
    rows = [{"text": char * 20_000}] * 10
    kept = solos_bounds.fitting(rows)
    assert len(json.dumps(rows[:kept]).encode()) <= solos_bounds.ANSWER_BYTES
    assert kept == len(rows) or len(json.dumps(rows[: kept + 1]).encode()) > solos_bounds.ANSWER_BYTES


def largest(char: str, length: int) -> str:
    return char * length


@WIDE
def test_the_largest_valid_write_fits_the_body_cap_in_any_json(server, char):
    """Python's json (and so requests, solos_langgraph.py) sends ASCII JSON: an emoji is 12 bytes there."""
    tags = [largest(char, 64) for _ in range(32)]
    short = {"agent": "atlas", "key": largest(char, 256), "value": largest(char, 16_384), "tags": tags}
    episode = {
        "agent": "atlas",
        "event_type": largest(char, 64),
        "summary": largest(char, 4_096),
        "details": largest(char, 16_384),
        "outcome": largest(char, 1_024),
        "idempotency_key": largest(char, 128),
    }
    for path, body in (("/v1/short", short), ("/v1/episodic", episode)):
        reply = server.post(path, body)  # ASCII JSON
        assert reply.status == 201, (path, reply.status, reply.body)
        assert utf8_post(server, path, body).status == 200  # the same write in UTF-8: unchanged or updated


def test_the_body_cap_admits_every_operations_largest_arguments_as_ascii_json():
    """Each operation's arguments may arrive as a JSON body: a REST write's, or any tools/call on /mcp."""
    for name, operation in solos_memory.OPERATIONS.items():
        largest_body = {}
        for field, schema in operation.input_schema.get("properties", {}).items():
            if schema.get("type") == "string":
                largest_body[field] = largest("\U0001f600", schema.get("maxLength", 64))
            elif schema.get("type") == "array" and schema.get("items", {}).get("type") == "string":
                item = largest("\U0001f600", schema["items"].get("maxLength", 64))
                largest_body[field] = [item] * schema.get("maxItems", 1)
        assert len(json.dumps(largest_body)) <= solos_memory.MAX_BODY_BYTES, name


# ---- answers and pages cut by bytes, and the MCP batch cap in items and bytes ----


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


@pytest.mark.slow
def test_an_mcp_batch_is_capped_in_items_and_in_bytes(server):
    heavy_episodes(server, 40)
    too_many = [batch_call(n, "stats", {}) for n in range(mcp_bridge.MAX_BATCH_ITEMS + 1)]
    status, raw = mcp_post(server, too_many)
    assert status == 400 and b"at most 16" in raw
    events = {"agent": "atlas", "since": 0, "limit": 1000, "tiers": ["episodic"]}
    status, raw = mcp_post(server, [batch_call(n, "read_events", events) for n in range(mcp_bridge.MAX_BATCH_ITEMS)])
    assert status == 200
    assert len(raw) <= mcp_bridge.MAX_BATCH_BYTES + 64 * 1024, len(raw)
    replies = json.loads(raw)
    assert [r["id"] for r in replies] == list(range(mcp_bridge.MAX_BATCH_ITEMS))
    carried = [r for r in replies if "result" in r]
    refused = [r for r in replies if "error" in r]
    assert carried and refused and all("on its own" in r["error"]["message"] for r in refused)
    alone = mcp_post(server, batch_call(99, "read_events", events), version="2025-11-25")[1]
    assert json.loads(alone)["result"]["structuredContent"]["count"] > 0  # the call on its own is answered


# ---- the event cache bounded by bytes ----


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
