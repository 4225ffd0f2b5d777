"""The write contract: registered agents only, upsert on (agent, tier, key), validation naming the field, retries
that change nothing."""

from __future__ import annotations

import time

import pytest

LONG = {
    "agent": "atlas",
    "topic": "infra",
    "fact": "The backup job runs nightly at 02:00 UTC.",
    "source": "ops-runbook",
    "confidence": 0.9,
    "tags": ["ops", "backup"],
}
SHORT = {"agent": "atlas", "key": "current-task", "value": "rotating certificates", "ttl_s": 600, "tags": ["task"]}
EPISODE = {
    "agent": "atlas",
    "event_type": "deploy",
    "summary": "Deployed v2 of the gateway",
    "details": "two nodes",
    "outcome": "success",
    "duration_s": 42.5,
}


def table_rows(server, table: str) -> list[dict]:
    with server.db() as conn:
        return [dict(row) for row in conn.execute(f"SELECT * FROM {table} ORDER BY id")]


def test_long_write_creates_then_updates_the_same_row(server):
    first = server.post("/v1/long", LONG)
    assert first.status == 201
    assert first.body["status"] == "created" and first.body["tier"] == "long"
    again = server.post("/v1/long", {**LONG, "confidence": 0.5, "tags": ["changed"]})
    assert again.status == 200
    assert again.body == {**first.body, "status": "updated"}
    rows = table_rows(server, "memory_longterm")
    assert len(rows) == 1
    assert rows[0]["agent"] == "atlas" and rows[0]["confidence"] == 0.5 and rows[0]["tags"] == '["changed"]'


def test_long_facts_sharing_a_long_prefix_are_two_rows(server):
    prefix = "The incident review concluded that " + "the database failover " * 20
    one = server.post("/v1/long", {**LONG, "fact": prefix + "was too slow."})
    two = server.post("/v1/long", {**LONG, "fact": prefix + "was fast enough."})
    assert one.body["status"] == two.body["status"] == "created"
    assert one.body["id"] != two.body["id"]
    assert len(table_rows(server, "memory_longterm")) == 2


def test_the_same_fact_from_two_agents_is_two_rows_never_merged_across_agents(server):
    mine = server.post("/v1/long", LONG)
    theirs = server.post("/v1/long", {**LONG, "agent": "sol"})
    assert mine.body["id"] != theirs.body["id"]
    assert [r["agent"] for r in table_rows(server, "memory_longterm")] == ["atlas", "sol"]


def test_long_write_after_a_direct_edit_of_the_row_creates_a_new_row(server):
    first = server.post("/v1/long", LONG)
    with server.db() as conn:
        conn.execute("UPDATE memory_longterm SET fact = 'edited by another writer' WHERE id = ?", (first.body["id"],))
    again = server.post("/v1/long", LONG)
    assert again.body["status"] == "created" and again.body["id"] != first.body["id"]
    assert {r["fact"] for r in table_rows(server, "memory_longterm")} == {LONG["fact"], "edited by another writer"}


def test_short_write_upserts_on_agent_and_key(server):
    first = server.post("/v1/short", SHORT)
    assert first.status == 201 and first.body["status"] == "created"
    again = server.post("/v1/short", {**SHORT, "value": "renewing certificates"})
    assert again.status == 200 and again.body["status"] == "updated" and again.body["id"] == first.body["id"]
    other = server.post("/v1/short", {**SHORT, "agent": "sol"})
    assert other.body["status"] == "created" and other.body["id"] != first.body["id"]
    rows = table_rows(server, "memory_short")
    assert [(r["agent"], r["value"]) for r in rows] == [("atlas", "renewing certificates"), ("sol", SHORT["value"])]
    assert rows[0]["expires_at"] > rows[0]["created_at"]


def test_short_ttl_defaults_to_a_day(server):
    reply = server.post("/v1/short", {"agent": "atlas", "key": "k", "value": "v"})
    row = table_rows(server, "memory_short")[0]
    assert reply.body["expires_at"] == row["expires_at"]
    with server.db() as conn:
        seconds = conn.execute(
            "SELECT round((julianday(?) - julianday(?)) * 86400)", (row["expires_at"], row["created_at"])
        ).fetchone()[0]
    assert seconds == 86400


def test_episodic_appends_and_idempotency_key_prevents_duplicates(server):
    one = server.post("/v1/episodic", EPISODE)
    two = server.post("/v1/episodic", EPISODE)
    assert one.status == two.status == 201 and one.body["id"] != two.body["id"]
    keyed = {**EPISODE, "idempotency_key": "deploy-2026-11-30"}
    first = server.post("/v1/episodic", keyed)
    retry = server.post("/v1/episodic", keyed)
    assert first.status == 201 and first.body["status"] == "created"
    assert retry.status == 200 and retry.body["status"] == "unchanged" and retry.body["id"] == first.body["id"]
    assert len(table_rows(server, "memory_episodic")) == 3


def test_idempotency_key_reused_for_another_event_is_a_conflict(server):
    server.post("/v1/episodic", {**EPISODE, "idempotency_key": "k1"})
    clash = server.post("/v1/episodic", {**EPISODE, "summary": "something else", "idempotency_key": "k1"})
    assert clash.status == 409 and clash.body["error"]["field"] == "idempotency_key"
    assert len(table_rows(server, "memory_episodic")) == 1


def test_idempotency_keys_are_per_agent(server):
    server.post("/v1/episodic", {**EPISODE, "idempotency_key": "k1"})
    theirs = server.post("/v1/episodic", {**EPISODE, "agent": "sol", "idempotency_key": "k1"})
    assert theirs.status == 201
    assert [r["agent"] for r in table_rows(server, "memory_episodic")] == ["atlas", "sol"]


@pytest.mark.parametrize("path,body", [("/v1/long", LONG), ("/v1/short", SHORT), ("/v1/episodic", EPISODE)])
def test_unknown_agent_is_refused_naming_it_and_writes_nothing(server, path, body):
    reply = server.post(path, {**body, "agent": "mallory"})
    assert reply.status == 422
    assert "mallory" in reply.body["error"]["message"] and reply.body["error"]["field"] == "agent"
    for table in ("memory_longterm", "memory_short", "memory_episodic"):
        assert table_rows(server, table) == []


@pytest.mark.parametrize("path,body", [("/v1/long", LONG), ("/v1/short", SHORT), ("/v1/episodic", EPISODE)])
def test_agent_is_mandatory(server, path, body):
    reply = server.post(path, {k: v for k, v in body.items() if k != "agent"})
    assert reply.status == 400 and reply.body["error"]["field"] == "agent"


BAD_FIELDS = [
    ("/v1/long", LONG, "confidence", 1.5),
    ("/v1/long", LONG, "confidence", -0.1),
    ("/v1/long", LONG, "confidence", "high"),
    ("/v1/long", LONG, "fact", ""),
    ("/v1/long", LONG, "fact", "x" * 8193),
    ("/v1/long", LONG, "fact", 12),
    ("/v1/long", LONG, "topic", "t" * 257),
    ("/v1/long", LONG, "tags", "ops"),
    ("/v1/long", LONG, "tags", [1, 2]),
    ("/v1/long", LONG, "tags", [""]),
    ("/v1/long", LONG, "tags", ["t"] * 33),
    ("/v1/long", LONG, "agent", "no spaces allowed"),
    ("/v1/long", LONG, "agent", 7),
    ("/v1/long", LONG, "colour", "red"),
    ("/v1/short", SHORT, "ttl_s", 0),
    ("/v1/short", SHORT, "ttl_s", -5),
    ("/v1/short", SHORT, "ttl_s", "60"),
    ("/v1/short", SHORT, "ttl_s", True),
    ("/v1/short", SHORT, "ttl_s", 10**9),
    ("/v1/short", SHORT, "key", ""),
    ("/v1/short", SHORT, "value", "v" * 16385),
    ("/v1/short", SHORT, "value", {"nested": True}),
    ("/v1/short", SHORT, "value", "nul\x00byte"),
    ("/v1/episodic", EPISODE, "duration_s", -1),
    ("/v1/episodic", EPISODE, "event_type", ""),
    ("/v1/episodic", EPISODE, "summary", None),
    ("/v1/episodic", EPISODE, "idempotency_key", "k" * 129),
]


@pytest.mark.parametrize("path,body,field,value", BAD_FIELDS)
def test_bad_field_is_rejected_naming_it_and_nothing_changes(server, path, body, field, value):
    assert server.post(path, body).status == 201
    before = {t: table_rows(server, t) for t in ("memory_longterm", "memory_short", "memory_episodic")}
    reply = server.post(path, {**body, field: value})
    assert reply.status == 400, reply.body
    assert reply.body["error"]["field"] == field
    assert field in reply.body["error"]["message"]
    assert {t: table_rows(server, t) for t in before} == before


def test_delete_short_removes_only_the_callers_key(server):
    server.post("/v1/short", SHORT)
    server.post("/v1/short", {**SHORT, "agent": "sol"})
    reply = server.request("DELETE", "/v1/short", query={"agent": "atlas", "key": SHORT["key"]})
    assert reply.status == 200 and reply.body["status"] == "deleted"
    assert [r["agent"] for r in table_rows(server, "memory_short")] == ["sol"]
    missing = server.request("DELETE", "/v1/short", query={"agent": "atlas", "key": SHORT["key"]})
    assert missing.status == 404 and missing.body["error"]["field"] == "key"
    assert [r["agent"] for r in table_rows(server, "memory_short")] == ["sol"]


def test_delete_short_by_unknown_agent_is_refused(server):
    server.post("/v1/short", SHORT)
    reply = server.request("DELETE", "/v1/short", query={"agent": "mallory", "key": SHORT["key"]})
    assert reply.status == 422
    assert len(table_rows(server, "memory_short")) == 1


def test_service_never_writes_the_fleets_registry_or_durable_records(server):
    """Enforced by an authorizer on every serving connection, not only by absent routes."""
    import sqlite3

    conn = server.server.memory.store.checkout()
    try:
        with pytest.raises(sqlite3.DatabaseError, match="not authorized"):
            conn.execute("INSERT INTO agent_registry (agent) VALUES ('sneaky')")
        with pytest.raises(sqlite3.DatabaseError, match="not authorized"):
            conn.execute("UPDATE memory_durable SET value = 'x'")
    finally:
        server.server.memory.store.checkin(conn)
    for method in ("POST", "PUT", "DELETE"):
        assert server.request(method, "/v1/agents", body={"agent": "sneaky"}).status in (404, 405)
    with server.db() as direct:
        assert direct.execute("SELECT count(*) FROM agent_registry WHERE agent = 'sneaky'").fetchone()[0] == 0


# ---- an identical retry changes nothing ----


def test_an_identical_long_retry_is_unchanged_and_changes_nothing(server):
    fact = {"agent": "atlas", "topic": "ops", "fact": "The cluster rotates certificates monthly " * 20, "tags": ["x"]}
    first = server.post("/v1/long", fact)
    with server.db() as conn:
        before = tuple(conn.execute("SELECT * FROM memory_longterm").fetchone())
        events = conn.execute("SELECT count(*) FROM memory_event").fetchone()[0]
    time.sleep(0.01)
    again = server.post("/v1/long", fact)
    assert (first.status, again.status, again.body["status"], again.body["id"]) == (201, 200, "unchanged", 1)
    with server.db() as conn:
        assert tuple(conn.execute("SELECT * FROM memory_longterm").fetchone()) == before  # updated_at too
        assert conn.execute("SELECT count(*) FROM memory_event").fetchone()[0] == events  # no update event
    changed = server.post("/v1/long", {**fact, "tags": ["y"]})
    assert changed.body["status"] == "updated"
