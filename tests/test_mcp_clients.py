"""Real MCP clients against the live service: the mcp SDK client and the Inspector CLI.

Each tool is called through MCP and its effect or answer is compared with
what REST gives for the same data, so the two transports cannot drift apart.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import mcp
import pytest
from node_tooling import run_node_tool

import solos_memory

pytestmark = pytest.mark.slow  # Node and the MCP SDKs

CLIENT_TIMEOUT_S = 60
INSPECTOR_TIMEOUT_S = 120  # Node start-up dominates; a call takes well under a second

FACT = "The kettle is in the blue cupboard."
# One call per tool, in an order where each sees the previous ones' data. sol
# writes, atlas reads: atlas's recall must see sol's rows labelled foreign.
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("write_long", {"agent": "sol", "topic": "kitchen", "fact": FACT, "source": "test"}),
    ("write_short", {"agent": "sol", "key": "kettle-state", "value": "kettle is warm", "ttl_s": 600}),
    ("write_episodic", {"agent": "sol", "event_type": "task", "summary": "Boiled the kettle", "idempotency_key": "k1"}),
    ("promote", {"agent": "sol", "ids": [1], "fact": "The kettle boils in three minutes."}),
    ("set_sharing", {"agent": "sol", "episodic": True}),
    ("recall", {"agent": "atlas", "q": "kettle", "k": 10, "tiers": ["long", "short", "episodic"]}),
    ("read_events", {"agent": "atlas", "since": 0, "tiers": ["long", "short", "episodic"]}),
    ("read_audit", {"agent": "sol"}),
    ("delete_short", {"agent": "sol", "key": "kettle-state"}),
    ("forget", {"agent": "sol", "tier": "long", "id": 1}),
    ("read_deliveries", {"agent": "sol", "tier": "long"}),
    ("recall_as_of", {"agent": "atlas", "as_of": "2099-01-01T00:00:00Z", "q": "kettle"}),
    ("read_notices", {"agent": "atlas"}),
    ("ack_notices", {"agent": "atlas", "ids": [1]}),
    ("stats", {}),
]


def rest_call(server, name: str, arguments: dict[str, Any]):
    """The same operation over REST, with the arguments spelled the REST way (lists comma-separated)."""
    op = solos_memory.OPERATIONS[name]
    if op.method in ("GET", "DELETE"):
        query = {key: ",".join(value) if isinstance(value, list) else value for key, value in arguments.items()}
        return server.request(op.method, op.path, query=query)
    return server.request(op.method, op.path, body=arguments)


async def call_every_tool(server, mode: str) -> tuple[str, list, dict[str, Any], dict[str, Any], Any]:
    """Connect, list tools, run CALLS, asking REST the same right after each read.

    Returns (version, tools, MCP results, REST answers to the reads, a refused call).
    """
    async with mcp.Client(f"{server.url}/mcp", mode=mode) as client:
        tools = (await client.list_tools()).tools
        results, rest_answers = {}, {}
        for name, arguments in CALLS:
            result = await client.call_tool(name, arguments)
            assert not result.is_error, (name, result)
            assert json.loads(result.content[0].text) == result.structured_content
            results[name] = result.structured_content
            if not solos_memory.OPERATIONS[name].writes:
                rest_answers[name] = rest_call(server, name, arguments).body
        refused = await client.call_tool("write_long", {"agent": "nobody", "fact": "x"})
        return client.protocol_version, tools, results, rest_answers, refused


@pytest.mark.parametrize("mode, version", [("auto", "2026-07-28"), ("legacy", "2025-11-25")])
def test_mcp_sdk_client_calls_every_tool_and_agrees_with_rest(server, mode, version):
    negotiated, tools, results, rest_answers, refused = asyncio.run(
        asyncio.wait_for(call_every_tool(server, mode), CLIENT_TIMEOUT_S)
    )
    # auto mode probes server/discover first; it must settle on 2026-07-28, not fall back.
    assert negotiated == version
    assert {tool.name for tool in tools} == set(solos_memory.OPERATIONS) == {name for name, _ in CALLS}
    for tool in tools:
        op = solos_memory.OPERATIONS[tool.name]
        assert tool.description and tool.title and tool.input_schema == op.input_schema
        assert tool.annotations.read_only_hint is (not op.writes)
        assert tool.annotations.idempotent_hint is op.idempotent
        assert tool.annotations.destructive_hint is op.destructive

    # The writes landed: REST shows what MCP recall showed, foreign to atlas.
    recalled = results["recall"]["results"]
    assert {(row["tier"], row["agent"], row["foreign"]) for row in recalled} == {
        ("long", "sol", True),
        ("short", "sol", True),
        ("episodic", "sol", True),
    }
    assert any(row.get("fact") == FACT for row in recalled)
    assert rest_answers["recall"] == results["recall"]
    assert rest_answers["read_audit"] == results["read_audit"]
    assert rest_answers["read_events"] == results["read_events"]
    assert [(e["kind"], e["tier"], e["agent"]) for e in results["read_events"]["events"]] == [
        ("write", "long", "sol"),
        ("write", "short", "sol"),
        ("write", "episodic", "sol"),
        ("write", "long", "sol"),  # the promoted fact
    ]
    # forget took effect: the first fact is gone from recall, the promoted one stays
    texts = [
        row["text"] for row in rest_call(server, "recall", {"agent": "atlas", "q": "kettle cupboard"}).body["results"]
    ]
    assert FACT not in texts and texts == ["The kettle boils in three minutes."]
    assert results["read_audit"]["count"] >= 1  # atlas's recall of sol's shared episode was audited
    assert rest_answers["stats"].keys() == results["stats"].keys()  # counters move with every call
    # atlas was shown sol's fact, which sol then forgot: the log says so, and atlas was told
    assert rest_answers["read_deliveries"] == results["read_deliveries"]
    assert ("atlas", 1) in {(d["reader"], d["row_id"]) for d in results["read_deliveries"]["deliveries"]}
    assert rest_answers["recall_as_of"] == results["recall_as_of"]
    assert [(n["row_id"], n["kind"]) for n in results["read_notices"]["notices"]] == [(1, "forgotten")]
    assert results["ack_notices"]["acked"] == 1
    # delete_short took effect: REST no longer recalls the short row.
    rest = rest_call(server, "recall", {"agent": "atlas", "q": "kettle", "tiers": ["short"]})
    assert rest.body["results"] == []

    # A rule violation is a tool result carrying the same error JSON REST gives.
    assert refused.is_error
    rest = rest_call(server, "write_long", {"agent": "nobody", "fact": "x"})
    assert rest.status >= 400 and refused.structured_content == rest.body


def run_inspector(server, tmp_path, *args: str) -> Any:
    """The Inspector CLI's JSON answer for one method call against the service."""
    stdout = run_node_tool("mcp-inspector", ["--cli", f"{server.url}/mcp", *args], tmp_path, INSPECTOR_TIMEOUT_S)
    return json.loads(stdout)


def test_inspector_cli_lists_the_tools(server, tmp_path):
    listed = run_inspector(server, tmp_path, "--method", "tools/list")
    assert {tool["name"] for tool in listed["tools"]} == set(solos_memory.OPERATIONS)


def test_inspector_cli_calls_recall(server, tmp_path):
    assert rest_call(server, "write_long", {"agent": "atlas", "fact": FACT}).status == 201
    called = run_inspector(
        server, tmp_path, "--method", "tools/call", "--tool-name", "recall", "--tool-arg", "agent=sol", "q=kettle"
    )
    assert called["isError"] is False
    (row,) = called["structuredContent"]["results"]
    assert (row["agent"], row["foreign"], row["fact"]) == ("atlas", True, FACT)
    assert called["structuredContent"] == rest_call(server, "recall", {"agent": "sol", "q": "kettle"}).body
