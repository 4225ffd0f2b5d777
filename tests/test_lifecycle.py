"""Promotion (episodic -> long, linking to an equal fact) and the episodic archive, over REST and MCP."""

from __future__ import annotations

import json

import pytest
from conftest import PROPERTY_SETTINGS, age, episode, fresh_agents, marker, purge, sentences
from hypothesis import given, strategies as st


def mcp_result(reply) -> tuple[bool, dict]:
    result = reply.body["result"]
    return result.get("isError", False), json.loads(result["content"][0]["text"])


def table_counts(server) -> tuple:
    with server.db() as conn:
        return tuple(
            conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("memory_longterm", "memory_promotion", "memory_episodic", "memory_durable", "memory_write_key")
        )


def test_promote_makes_one_long_fact_that_records_its_sources(server):
    first = episode(server, "atlas", "Rolled back gateway v2 after 5xx spike")
    second = episode(server, "atlas", "Gateway v2 fixed by raising the upstream timeout")
    reply = server.post(
        "/v1/promote",
        {
            "agent": "atlas",
            "ids": [second, first],
            "topic": "gateway",
            "fact": "Gateway v2 needs a 30 s upstream timeout",
        },
    )
    assert reply.status == 201, reply.body
    assert reply.body == {
        "tier": "long",
        "agent": "atlas",
        "id": reply.body["id"],
        "status": "created",
        "sources": [first, second],
    }
    recalled = server.recall("sol", "gateway upstream timeout", k=1).body["results"][0]
    assert (recalled["tier"], recalled["agent"], recalled["foreign"]) == ("long", "atlas", True)
    assert recalled["source"] == f"promoted:memory_episodic#{first},{second}"
    assert recalled["fact"] == "Gateway v2 needs a 30 s upstream timeout" and recalled["tags"] == ["promoted"]
    with server.db() as conn:
        sources = conn.execute(
            "SELECT episodic_id, agent FROM memory_promotion WHERE long_id = ? ORDER BY 1", (reply.body["id"],)
        ).fetchall()
        assert [tuple(r) for r in sources] == [(first, "atlas"), (second, "atlas")]
        # One-way: the episodes stay episodes.
        assert conn.execute("SELECT count(*) FROM memory_episodic").fetchone()[0] == 2
    again = server.post(
        "/v1/promote", {"agent": "atlas", "ids": [first, second], "fact": "Gateway v2 needs a 30 s upstream timeout"}
    )
    assert (again.status, again.body["status"], again.body["id"]) == (200, "linked", reply.body["id"])
    joined = server.post("/v1/promote", {"agent": "atlas", "ids": [first]})
    assert joined.status == 201
    with server.db() as conn:
        fact = conn.execute("SELECT fact FROM memory_longterm WHERE id = ?", (joined.body["id"],)).fetchone()[0]
    assert fact == "Rolled back gateway v2 after 5xx spike"
    assert server.get("/v1/stats").body["promoted_facts"] == 2


def test_promote_refuses_foreign_and_unknown_ids_alike_on_rest_and_mcp(server):
    mine = episode(server, "atlas", "Mine")
    theirs = episode(server, "sol", "Theirs")
    before = table_counts(server)
    cases = [
        ({"agent": "atlas", "ids": [mine, theirs]}, 404, "not_found", f"ids {theirs}"),  # sol shares no episodes
        ({"agent": "atlas", "ids": [mine, 999, 1000]}, 404, "not_found", "999, 1000"),
        ({"agent": "atlas", "ids": []}, 400, "bad_request", "at least one"),
        ({"agent": "atlas", "ids": ["x"]}, 400, "bad_request", "ids[0]"),
        ({"agent": "mallory", "ids": [mine]}, 422, "unknown_agent", "mallory"),
    ]
    for args, status, code, named in cases:
        rest = server.post("/v1/promote", args)
        assert (rest.status, rest.body["error"]["code"]) == (status, code), rest.body
        assert named in rest.body["error"]["message"]
        is_error, payload = mcp_result(server.mcp_tool("promote", args))
        assert is_error and payload == rest.body
    assert table_counts(server) == before  # a rejected call changes nothing
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0] == 0


def test_promote_answers_an_unseen_episode_as_no_episode_and_a_shared_one_as_forbidden(server):
    """A refusal must not tell an agent that an episode it cannot see exists, nor whose it is."""
    theirs = episode(server, "sol", "Sol's unshared note")
    unseen = server.post("/v1/promote", {"agent": "atlas", "ids": [theirs]}).body["error"]
    missing = server.post("/v1/promote", {"agent": "atlas", "ids": [theirs + 1000]}).body["error"]
    assert unseen["code"] == missing["code"] == "not_found"
    assert unseen["message"] == missing["message"].replace(str(theirs + 1000), str(theirs))
    server.request("PUT", "/v1/sharing", body={"agent": "sol", "episodic": True})
    shared = server.post("/v1/promote", {"agent": "atlas", "ids": [theirs]})
    assert (shared.status, shared.body["error"]["code"]) == (403, "forbidden")


def test_promote_over_mcp_matches_rest(server):
    mine = episode(server, "atlas", "Certificates renewed on the edge nodes")
    is_error, payload = mcp_result(server.mcp_tool("promote", {"agent": "atlas", "ids": [mine]}))
    assert not is_error and payload["status"] == "created" and payload["sources"] == [mine]
    tools = server.request(
        "POST",
        "/mcp",
        body={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"},
    ).body["result"]["tools"]
    assert "promote" in {tool["name"] for tool in tools}
    assert "/v1/promote" in server.get("/openapi.json").body["paths"]


def test_promotion_links_to_an_equal_fact_without_rewriting_it(server):
    kept = {"agent": "atlas", "topic": "gateway", "fact": "Gateway v2 needs a 30 s timeout", "source": "runbook"}
    kept.update(confidence=0.9, tags=["ops"])
    fact_id = server.post("/v1/long", kept).body["id"]
    episode = server.post("/v1/episodic", {"agent": "atlas", "event_type": "task", "summary": "raised the timeout"})
    reply = server.post("/v1/promote", {"agent": "atlas", "ids": [episode.body["id"]], "fact": kept["fact"]})
    assert (reply.status, reply.body["status"], reply.body["id"]) == (200, "linked", fact_id)
    with server.db() as conn:
        row = conn.execute("SELECT topic, source, confidence, tags FROM memory_longterm WHERE id = ?", (fact_id,))
        assert tuple(row.fetchone()) == ("gateway", "runbook", 0.9, '["ops"]')
        links = conn.execute("SELECT long_id, episodic_id FROM memory_promotion").fetchall()
        assert [tuple(r) for r in links] == [(fact_id, episode.body["id"])]


def test_forgetting_a_promoted_fact_removes_its_promotion_rows(server):
    episode = server.post("/v1/episodic", {"agent": "atlas", "event_type": "task", "summary": "rolled back v2"})
    promoted = server.post("/v1/promote", {"agent": "atlas", "ids": [episode.body["id"]]}).body["id"]
    assert server.get("/v1/stats").body["promoted_facts"] == 1
    forgot = server.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": promoted})
    assert forgot.status == 200
    assert server.get("/v1/stats").body["promoted_facts"] == 0
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_promotion").fetchone()[0] == 0


# ==== Archive ====


def test_old_episodes_leave_the_hot_indexes_but_stay_recallable_when_asked(server):
    old = [episode(server, "atlas", f"Quarterly failover drill number {i}") for i in range(3)]
    fresh = episode(server, "atlas", "Failover drill scheduled for next week")
    age(server, old)
    purge(server, "0")  # 0: never archive
    assert server.get("/v1/stats").body["episodic_archived"] == 0
    purge(server)
    with server.db() as conn:
        assert [r[0] for r in conn.execute("SELECT id FROM memory_episodic")] == [fresh]
        assert sorted(r[0] for r in conn.execute("SELECT id FROM memory_episodic_archive")) == old
        hot = conn.execute("SELECT count(*) FROM memory_episodic_fts WHERE memory_episodic_fts MATCH 'quarterly'")
        assert hot.fetchone()[0] == 0
    hot_only = server.recall("atlas", "failover drill", tiers="episodic", k=10).body["results"]
    assert [r["id"] for r in hot_only] == [fresh]
    everything = server.recall("atlas", "quarterly failover drill", tiers="episodic", archive="true", k=10).body
    archived = [r for r in everything["results"] if r["archived"]]
    assert sorted(r["id"] for r in archived) == old
    assert {(r["tier"], r["agent"], r["foreign"]) for r in archived} == {("episodic", "atlas", False)}
    assert {r["source"] for r in archived} == {f"memory_episodic_archive#{i}" for i in old}
    # MCP answers the same.
    is_error, payload = mcp_result(
        server.mcp_tool(
            "recall",
            {"agent": "atlas", "q": "quarterly failover drill", "tiers": ["episodic"], "archive": True, "k": 10},
        )
    )
    assert not is_error and [r["id"] for r in payload["results"]] == [r["id"] for r in everything["results"]]
    recency = server.recall("atlas", "", tiers="episodic", archive="true", k=10).body["results"]
    assert {r["id"] for r in recency} == {fresh, *old}
    assert server.get("/v1/stats").body["episodic_archived"] == 3
    # Promotion reaches archived episodes too.
    assert server.post("/v1/promote", {"agent": "atlas", "ids": old}).status == 201


def test_archived_episodes_keep_the_sharing_and_audit_rules(server):
    old = episode(server, "atlas", "Migrated the billing database")
    episode(server, "atlas", "Newest event stays hot")
    age(server, [old])
    purge(server)
    query = {"tiers": "episodic", "archive": "true", "k": 10}
    assert server.recall("sol", "billing database", **query).body["results"] == []
    server.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True})
    shared = server.recall("sol", "billing database", **query).body["results"]
    assert [(r["id"], r["agent"], r["foreign"], r["archived"]) for r in shared] == [(old, "atlas", True, True)]
    reads = server.get("/v1/audit", agent="atlas").body["reads"]
    assert [(r["reader"], r["row_id"]) for r in reads] == [("sol", old)]
    refused = server.recall("sol", "billing", archive="true")
    assert (refused.status, refused.body["error"]["field"]) == (400, "archive")


# ==== Properties: attribution and the foreign label hold for archived and promoted rows ====


@pytest.mark.slow
@PROPERTY_SETTINGS
@given(data=st.data())
def test_archived_and_promoted_rows_keep_their_writer_and_foreign_label(shared_server, data):
    agents = fresh_agents(shared_server)
    tag = marker()
    writes = data.draw(st.lists(st.tuples(st.sampled_from(agents), sentences), min_size=1, max_size=6))
    ids = {}
    for agent, text in writes:
        ids[episode(shared_server, agent, f"{tag} {text}")] = agent
    for agent in agents:
        shared_server.request("PUT", "/v1/sharing", body={"agent": agent, "episodic": True})
    age(shared_server, list(ids))
    purge(shared_server)
    reader = data.draw(st.sampled_from(agents))
    reply = shared_server.recall(reader, tag, tiers="episodic", archive="true", k=100).body
    assert reply["count"] + reply["suppressed_duplicates"] == len(ids)
    for row in reply["results"]:
        assert row["agent"] == ids[row["id"]] and row["foreign"] is (row["agent"] != reader)
    chosen = data.draw(st.lists(st.sampled_from(sorted(ids)), min_size=1, max_size=4, unique=True))
    promoted = shared_server.post("/v1/promote", {"agent": reader, "ids": chosen, "fact": f"{tag} promoted"})
    if all(ids[i] == reader for i in chosen):
        assert promoted.status in (200, 201) and promoted.body["sources"] == sorted(chosen)
        fact = shared_server.recall(agents[0], f"{tag} promoted", k=1).body["results"][0]
        assert (fact["tier"], fact["agent"], fact["foreign"]) == ("long", reader, reader != agents[0])
    else:
        assert promoted.status == 403 and promoted.body["error"]["field"] == "ids"
