"""Hypothesis properties over HTTP. One module-scoped server; each example gets fresh agents and a fresh marker word."""

from __future__ import annotations

import sqlite3

import pytest
from conftest import BUDGET_MS, PROPERTY_SETTINGS, fresh_agents, marker, sentences
from hypothesis import HealthCheck, given, settings, strategies as st

pytestmark = pytest.mark.slow  # hypothesis: hundreds of requests per test

SHARED_SERVER_CONFIG = {"busy_timeout_ms": BUDGET_MS}  # the locked-database property waits this long for its 503


@PROPERTY_SETTINGS
@given(data=st.data())
def test_attribution_and_foreign_label(shared_server, data):
    agents = fresh_agents(shared_server)
    tag = marker()
    writes = data.draw(st.lists(st.tuples(st.sampled_from(agents), sentences), min_size=1, max_size=8))
    writers: dict[str, set[str]] = {}
    for agent, text in writes:
        fact = f"{tag} {text}"
        reply = shared_server.post("/v1/long", {"agent": agent, "fact": fact})
        assert reply.status in (200, 201)
        writers.setdefault(" ".join(fact.split()).casefold(), set()).add(agent)
    with shared_server.db() as conn:
        stored = conn.execute("SELECT agent, fact FROM memory_longterm WHERE fact LIKE ?", (tag + " %",)).fetchall()
    for row in stored:
        assert row["agent"] in writers[" ".join(row["fact"].split()).casefold()]
    caller = data.draw(st.sampled_from(agents))
    scope = data.draw(st.sampled_from(["own", "shared", "shared_except_self"]))
    reply = shared_server.recall(caller, tag, k=100, scope=scope)
    assert reply.status == 200
    for result in reply.body["results"]:
        text = " ".join(result["text"].split()).casefold()
        assert result["agent"] in writers[text]
        assert result["foreign"] == (result["agent"] != caller)
        if scope == "own":
            assert result["agent"] == caller
        if scope == "shared_except_self":
            assert result["agent"] != caller
    if scope == "shared":
        assert reply.body["count"] == len(writers)


@PROPERTY_SETTINGS
@given(value=st.text(min_size=1, max_size=300).filter(lambda s: "\x00" not in s), repeats=st.integers(1, 4))
def test_upserts_are_idempotent_and_values_come_back_unchanged(shared_server, value, repeats):
    (agent,) = fresh_agents(shared_server, 1)
    key = marker()
    replies = [shared_server.post("/v1/short", {"agent": agent, "key": key, "value": value}) for _ in range(repeats)]
    assert [r.body["status"] for r in replies] == ["created"] + ["updated"] * (repeats - 1)
    assert len({r.body["id"] for r in replies}) == 1
    longs = [shared_server.post("/v1/long", {"agent": agent, "fact": value}) for _ in range(repeats)]
    assert len({r.body["id"] for r in longs}) == 1
    with shared_server.db() as conn:
        assert conn.execute("SELECT value FROM memory_short WHERE agent = ?", (agent,)).fetchall()[0][0] == value
        facts = conn.execute("SELECT fact FROM memory_longterm WHERE agent = ?", (agent,)).fetchall()
    assert [f[0] for f in facts] == [value]
    recent = shared_server.recall(agent, "", scope="own", tiers="short,long", k=10)
    assert {r["text"] for r in recent.body["results"]} == {value}


@PROPERTY_SETTINGS
@given(q=st.text(max_size=2000), tiers=st.sets(st.sampled_from(["short", "long", "episodic", "durable"]), min_size=1))
def test_any_query_answers_and_always_says_whether_it_is_degraded(shared_server, q, tiers):
    reply = shared_server.get("/v1/recall", agent="atlas", q=q, tiers=",".join(sorted(tiers)))
    assert reply.status == 200, reply.body
    assert reply.body["degraded"] is True
    assert reply.headers["x-memory-degraded"] == "true"


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(q=sentences, k=st.integers(1, 100))
def test_no_empty_success_while_the_database_is_locked(shared_server, q, k):
    """Under an exclusive foreign lock, recall is a 503 with a reason, never a 200 with nothing."""
    (agent,) = fresh_agents(shared_server, 1)
    tag = marker()
    shared_server.post("/v1/long", {"agent": agent, "fact": f"{tag} {q}"})
    shared_server.server.memory.events.stop()  # its background sweeps would open connections too
    shared_server.server.memory.deliveries.close()  # and the delivery log's batches
    shared_server.server.memory.store.close()
    holder = sqlite3.connect(shared_server.db_path, isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("INSERT INTO memory_short (agent, key, value, expires_at) VALUES ('atlas', ?, 'x', 'z')", (tag,))
    try:
        reply = shared_server.recall(agent, f"{tag} {q}", k=k)
        assert reply.status == 503 and reply.body["error"]["code"] == "busy"
        write = shared_server.post("/v1/long", {"agent": agent, "fact": f"{tag} second"})
        assert write.status == 503
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    reply = shared_server.recall(agent, tag, k=k)
    assert reply.status == 200 and [r["text"] for r in reply.body["results"]] == [f"{tag} {q}"]


def without_history(answer: dict) -> dict:
    """A recall answer less what the first of two identical recalls changes: the REST call's delivery is logged,
    so the MCP call's witnesses may say when the caller was first shown a copy."""
    results = [
        {**row, "witnesses": [{k: v for k, v in w.items() if k != "first_shown_at"} for w in row["witnesses"]]}
        if "witnesses" in row
        else row
        for row in answer.get("results", [])
    ]
    return {**answer, "results": results} if "results" in answer else answer


@PROPERTY_SETTINGS
@given(data=st.data())
def test_rest_and_mcp_agree(shared_server, data):
    agents = fresh_agents(shared_server)
    tag = marker()
    for agent, text in data.draw(st.lists(st.tuples(st.sampled_from(agents), sentences), min_size=1, max_size=6)):
        shared_server.post("/v1/long", {"agent": agent, "fact": f"{tag} {text}"})
    arguments = {
        "agent": data.draw(st.sampled_from(agents + ["unregistered-agent"])),
        "q": data.draw(st.sampled_from([tag, "", f"{tag} " + data.draw(sentences)])),
        "k": data.draw(st.integers(0, 101)),
        "scope": data.draw(st.sampled_from(["own", "shared", "shared_except_self", "everyone"])),
        "tiers": data.draw(
            st.lists(st.sampled_from(["long", "short", "durable", "nope"]), min_size=1, max_size=2, unique=True)
        ),
    }
    rest = shared_server.get("/v1/recall", **{**arguments, "tiers": ",".join(arguments["tiers"])})
    reply = shared_server.mcp_tool("recall", arguments)
    assert reply.status == 200 and "result" in reply.body, reply.raw
    result, headers = reply.body["result"], reply.headers
    assert without_history(result["structuredContent"]) == without_history(rest.body)
    assert result.get("isError", False) == (rest.status >= 400)
    if rest.status == 200:
        assert headers["x-memory-degraded"] == rest.headers["x-memory-degraded"] == "true"
