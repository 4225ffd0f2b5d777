"""Byte bounds: answers cut by bytes and saying so, pages of events, the MCP batch cap, the request body cap;
each counts bytes, not characters.

An emoji is one character and four bytes of UTF-8 (twelve as ASCII JSON's surrogate pair), a CJK character
three (six); a bound that counts characters lets such text through several times over."""

from __future__ import annotations

import json

import pytest

import mcp_bridge
import solos_bounds
import solos_memory

JSON = {"Content-Type": "application/json"}
WIDE = pytest.mark.parametrize("char", ["\U0001f600", "\u6f22"], ids=["emoji", "cjk"])


def utf8_post(server, path: str, body: dict):
    """A POST whose JSON is UTF-8, as most clients send it (solos_client, Node, the mcp SDK)."""
    return server.request("POST", path, raw=json.dumps(body, ensure_ascii=False).encode(), headers=JSON)


def wide_episodes(server, char: str, count: int) -> None:
    for n in range(count):  # 20,000 characters each, as in the issue
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
