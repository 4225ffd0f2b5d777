"""Hardening, round three (issue 31, item 12): byte bounds count bytes, not characters.

An emoji is one character and four bytes of UTF-8 (twelve as ASCII JSON's surrogate pair), a CJK character
three (six); a bound that counts characters lets such text through several times over."""

from __future__ import annotations

import json

import pytest

import mcp_bridge
import solos_bounds

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
