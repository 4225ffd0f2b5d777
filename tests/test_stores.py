"""The store contract: what the service answers and keeps must not depend on the database below it.

Every test runs twice through `store_url`: on a fresh SQLite file and on a fresh PostgreSQL database (that
half is marked slow). Each starts the real service on it and talks HTTP, and plays the fleet's other writers
with a direct connection (`fleet_writer`), as the agents beside the service do. SQLite is the reference: a
test states what the SQLite store does, and the PostgreSQL store must do the same.
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import json
import random
import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import (
    WordHashEmbedder,
    direct,
    events_settled,
    fleet_writer,
    snapshot,
    start_server,
    stop_server,
    wait_until,
)

import solos_events
import solos_memory
import solos_rank
import solos_store

STAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")


# ==== Helpers: the service on either store, and a direct connection beside it ====


def is_postgres(url: str) -> bool:
    return solos_store.is_postgres(url)


def database_errors(url: str) -> tuple[type[BaseException], ...]:
    if is_postgres(url):
        import psycopg

        return (psycopg.errors.InsufficientPrivilege,)
    return (sqlite3.DatabaseError,)


@pytest.fixture
def served(store_url: str) -> Iterator[Any]:
    """The service on this test's store, reranker off so keyword ranking is BM25's order alone."""
    running = start_server(store_url, rerank=False)
    yield running
    stop_server(running)


@pytest.fixture
def hybrid(store_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The service on this test's store with the word-hash embedder: both legs rank."""
    pytest.importorskip("numpy")
    embedder = WordHashEmbedder()
    monkeypatch.setattr(solos_memory, "load_embedder", lambda config, threads=1: (embedder, None))
    running = start_server(store_url)
    yield running
    stop_server(running)


def ok(reply: Any, status: int = 200) -> dict:
    assert reply.status == status, reply.body
    return reply.body


def ids(reply: Any) -> list[int]:
    return [row["id"] for row in ok(reply)["results"]]


def texts(reply: Any) -> list[str]:
    return [row["text"] for row in ok(reply)["results"]]


def long_fact(server: Any, agent: str, fact: str, **extra: Any) -> int:
    reply = server.post("/v1/long", {"agent": agent, "fact": fact, **extra})
    return ok(reply, 201)["id"]


def episode(server: Any, agent: str, summary: str, **extra: Any) -> int:
    reply = server.post("/v1/episodic", {"agent": agent, "event_type": "task", "summary": summary, **extra})
    return ok(reply, 201)["id"]


def events(server: Any, agent: str, since: int, settle: bool = True, **query: Any) -> dict:
    """read_events; first (PostgreSQL), until no transaction older than the newest event runs: events are handed
    out only below the oldest running one, and the service's own background writes (the delivery log) may hold
    that back for a moment under load."""
    if settle:
        events_settled(server.db_path)
    return ok(server.get("/v1/events", agent=agent, since=since, **query))


def kinds(answer: dict) -> list[tuple[str, str, int]]:
    return [(e["kind"], e["tier"], e["row_id"]) for e in answer["events"]]


# ==== 1. Writes: the answers, the conflicts, and a refused call changes nothing ====


def test_every_write_answers_its_status_id_and_expiry_alike(served, store_url):
    fact = {"agent": "atlas", "topic": "ops", "fact": "Backups run nightly at 02:00 UTC", "tags": ["ops"]}
    created = served.post("/v1/long", {**fact, "confidence": 0.9})
    assert (created.status, created.body) == (201, {"tier": "long", "agent": "atlas", "id": 1, "status": "created"})
    same = served.post("/v1/long", {**fact, "confidence": 0.9})
    assert (same.status, same.body["status"], same.body["id"]) == (200, "unchanged", 1)
    changed = served.post("/v1/long", {**fact, "confidence": 0.5})
    assert (changed.status, changed.body["status"], changed.body["id"]) == (200, "updated", 1)
    assert ok(served.post("/v1/long", {**fact, "agent": "sol"}), 201)["id"] == 2  # never merged across agents

    short = served.post("/v1/short", {"agent": "atlas", "key": "task", "value": "rotating certs", "ttl_s": 60})
    assert short.status == 201
    assert {k: v for k, v in short.body.items() if k != "expires_at"} == {
        "tier": "short",
        "agent": "atlas",
        "key": "task",
        "id": 1,
        "status": "created",
    }
    assert STAMP.fullmatch(short.body["expires_at"]), short.body
    again = ok(served.post("/v1/short", {"agent": "atlas", "key": "task", "value": "renewing certs"}))
    assert (again["status"], again["id"]) == ("updated", 1) and STAMP.fullmatch(again["expires_at"])
    assert again["expires_at"] > short.body["expires_at"]  # the default TTL (a day) is longer than 60 s
    (row,) = direct(store_url, "SELECT created_at, expires_at FROM memory_short")
    assert STAMP.fullmatch(row["created_at"]) and row["expires_at"] == again["expires_at"]

    keyed = {"agent": "atlas", "event_type": "deploy", "summary": "Deployed v2", "idempotency_key": "deploy-v2"}
    first = served.post("/v1/episodic", {**keyed, "duration_s": 42})
    assert (first.status, first.body) == (201, {"tier": "episodic", "agent": "atlas", "id": 1, "status": "created"})
    retry = served.post("/v1/episodic", {**keyed, "duration_s": 42})
    assert (retry.status, retry.body["status"], retry.body["id"]) == (200, "unchanged", 1)
    assert ok(served.post("/v1/episodic", {**keyed, "agent": "sol"}), 201)["id"] == 2  # keys are per agent

    sharing = served.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True})
    assert (sharing.status, sharing.body["status"]) == (201, "created")
    assert ok(served.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": False}))["status"] == "updated"

    deleted = ok(served.request("DELETE", "/v1/short", query={"agent": "atlas", "key": "task"}))
    assert (deleted["status"], deleted["id"]) == ("deleted", 1)
    assert served.request("DELETE", "/v1/short", query={"agent": "atlas", "key": "task"}).status == 404


def test_a_short_key_written_again_takes_no_id_from_the_next_row(served):
    """PostgreSQL's INSERT ... ON CONFLICT spent an identity value on every rewrite of a key: the next new key got
    id 3 there and 2 on SQLite, so the same writes numbered rows differently on the two stores."""
    first = ok(served.post("/v1/short", {"agent": "atlas", "key": "task", "value": "one"}), 201)["id"]
    assert ok(served.post("/v1/short", {"agent": "atlas", "key": "task", "value": "two"}))["id"] == first
    assert ok(served.post("/v1/short", {"agent": "atlas", "key": "mood", "value": "calm"}), 201)["id"] == first + 1


def test_a_refused_write_changes_nothing(served, store_url):
    keyed = {"agent": "atlas", "event_type": "deploy", "summary": "Deployed v2", "idempotency_key": "k1"}
    ok(served.post("/v1/episodic", keyed), 201)
    ok(served.post("/v1/long", {"agent": "atlas", "fact": "kept fact"}), 201)
    ok(served.post("/v1/short", {"agent": "atlas", "key": "kept", "value": "kept value"}), 201)
    before = snapshot(store_url)

    clash = served.post("/v1/episodic", {**keyed, "summary": "something else"})
    assert (clash.status, clash.body["error"]["code"], clash.body["error"]["field"]) == (
        409,
        "conflict",
        "idempotency_key",
    )
    refusals = [
        ("POST", "/v1/long", {"agent": "mallory", "fact": "intruder"}),
        ("POST", "/v1/short", {"agent": "mallory", "key": "kept", "value": "intruder"}),
        ("POST", "/v1/episodic", {"agent": "mallory", "event_type": "x", "summary": "intruder"}),
        ("PUT", "/v1/sharing", {"agent": "mallory", "episodic": True}),
        ("POST", "/v1/promote", {"agent": "mallory", "ids": [1]}),
    ]
    for method, path, body in refusals:
        reply = served.request(method, path, body=body)
        assert (reply.status, reply.body["error"]["field"]) == (422, "agent"), (path, reply.body)
        assert "mallory" in reply.body["error"]["message"]
    gone = served.request("DELETE", "/v1/short", query={"agent": "mallory", "key": "kept"})
    assert gone.status == 422
    bad = served.post("/v1/long", {"agent": "atlas", "fact": "bad confidence", "confidence": 2})
    assert (bad.status, bad.body["error"]["field"]) == (400, "confidence")
    forbidden = served.request("DELETE", "/v1/memory", query={"agent": "sol", "tier": "long", "id": 1})
    assert forbidden.status == 403
    assert snapshot(store_url) == before


def all_at_once(server: Any, method: str, path: str, bodies: list[dict]) -> list[tuple[int, str, Any]]:
    """Send the requests together (threads released at once); their (status, status word, id), sorted."""
    start, answers = threading.Barrier(len(bodies)), []

    def send(body: dict) -> None:
        start.wait()
        reply = server.request(method, path, body=body)
        answers.append((reply.status, reply.body.get("status"), reply.body.get("id")))

    threads = [threading.Thread(target=send, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(answers, key=str)


def test_the_same_write_sent_at_once_creates_one_row_and_says_so_once(served, store_url):
    """SQLite serializes writers; PostgreSQL's must not race either: one `created` (201), the rest see its row."""
    for n in range(3):
        short = all_at_once(served, "POST", "/v1/short", [{"agent": "atlas", "key": f"k{n}", "value": "v"}] * 6)
        assert [(status, word) for status, word, _ in short] == [(200, "updated")] * 5 + [(201, "created")], short
        assert len({row_id for *_, row_id in short}) == 1
        fact = all_at_once(served, "POST", "/v1/long", [{"agent": "atlas", "fact": f"the same fact {n}"}] * 6)
        assert fact == [(200, "unchanged", n + 1)] * 5 + [(201, "created", n + 1)], fact
        keyed = {"agent": "atlas", "event_type": "t", "summary": "s", "idempotency_key": f"once-{n}"}
        assert all_at_once(served, "POST", "/v1/episodic", [keyed] * 6) == [(200, "unchanged", n + 1)] * 5 + [
            (201, "created", n + 1)
        ]
        sharing = all_at_once(served, "PUT", "/v1/sharing", [{"agent": AGENTS_BY_ROUND[n], "episodic": True}] * 6)
        assert sharing == [(200, "updated", None)] * 5 + [(201, "created", None)], sharing
    counts = direct(
        store_url,
        "SELECT (SELECT count(*) FROM memory_short) AS short, (SELECT count(*) FROM "
        "memory_longterm) AS long, (SELECT count(*) FROM memory_episodic) AS episodic",
    )
    assert counts == [{"short": 3, "long": 3, "episodic": 3}]


AGENTS_BY_ROUND = ("sol", "nova", "hermes")


def waits_for_a_lock(url: str, store: Any) -> bool:
    """Whether one of the service's writes is waiting for a lock another transaction holds: on PostgreSQL a
    backend of this database waits for one; on SQLite the service's writer holds its write lock, which it
    takes only to write (its BEGIN IMMEDIATE waits for the fleet's writer)."""
    if is_postgres(url):
        waiting = (
            "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return direct(url, waiting)[0]["n"] > 0
    return store.write_lock.locked()


def while_held(server: Any, hold: Any, call: Any) -> Any:
    """call()'s reply, made in a thread while a transaction of the fleet's (`hold(conn)` began it) holds its locks,
    committed once the call waits for them (or has answered without waiting): the call meets the transaction under
    way, however long the call takes to reach it."""
    url, answers = str(server.db_path), []
    with fleet_writer(url) as conn:
        hold(conn)
        calling = threading.Thread(target=lambda: answers.append(call()))
        calling.start()
        wait_until(lambda: answers or waits_for_a_lock(url, server.server.memory.store), "the call to meet the hold")
        conn.execute("COMMIT")
        calling.join(10)
    (reply,) = answers
    return reply


def forget_under_way(url: str, table: str, row_id: int) -> Any:
    """A hold for while_held: the row deleted, as a forget deletes it, not yet committed."""

    def hold(conn: Any) -> None:
        conn.execute("BEGIN" if is_postgres(url) else "BEGIN IMMEDIATE")
        conn.execute(f"DELETE FROM {table} WHERE id = ?", (row_id,))

    return hold


def write_long_uncommitted(conn, url: str, agent: str, fact: str) -> None:
    """The service's write of a long fact, on this connection, left uncommitted (its write key held)."""
    if solos_store.is_postgres(url):
        key = solos_store.sha256_text(fact)
        import solos_store_pg

        lock = solos_store_pg.key_lock(agent, "long", key)
        conn.execute("BEGIN")
        conn.execute(
            "SELECT * FROM solos_write_long(?, ?, ?, NULL, ?, NULL, NULL, '[]', NULL, NULL)", (agent, lock, key, fact)
        )
        return
    conn.execute("BEGIN IMMEDIATE")
    row_id = conn.execute(
        "INSERT INTO memory_longterm (agent, fact, tags) VALUES (?, ?, '[]') RETURNING id", (agent, fact)
    ).fetchone()[0]
    conn.execute(
        "INSERT INTO memory_write_key (agent, tier, key, row_id) VALUES (?, 'long', ?, ?)",
        (agent, solos_store.sha256_text(fact), row_id),
    )


def test_a_promotion_racing_a_write_of_the_same_fact_makes_one_row(served, store_url):
    # On PostgreSQL, promote took no write-key lock: it missed the write in flight, inserted its own row, and
    # the write key moved to it. The writer held two rows of one fact; its later updates reached only one.
    fact = "The cache warms up in 90 seconds after a deploy."
    episode_id = episode(served, "atlas", "cache warmed slowly")
    promote = {"agent": "atlas", "ids": [episode_id], "fact": fact}
    writing = functools.partial(write_long_uncommitted, url=store_url, agent="atlas", fact=fact)
    reply = while_held(served, writing, lambda: served.post("/v1/promote", promote))
    rows = direct(store_url, "SELECT id FROM memory_longterm WHERE fact = ?", (fact,))
    assert len(rows) == 1, rows
    assert ok(reply) == {
        "tier": "long",
        "agent": "atlas",
        "id": rows[0]["id"],
        "status": "linked",
        "sources": [episode_id],
    }


def test_an_update_racing_the_forget_of_its_row_is_stored_as_answered(hybrid, store_url):
    # On PostgreSQL a write of a fact found its row, then waited for a forget deleting it: its update met no row,
    # it answered `unchanged` with the forgotten id (its topic stored nowhere), and saved a vector for that id, a
    # row of memory_vector naming nothing. Now it waits for the forget first and stores the fact anew.
    body = {"agent": "atlas", "fact": "The docs site is rebuilt hourly.", "topic": "docs"}
    first = ok(hybrid.post("/v1/long", body), 201)["id"]
    forgetting = forget_under_way(store_url, "memory_longterm", first)
    written = ok(while_held(hybrid, forgetting, lambda: hybrid.post("/v1/long", {**body, "topic": "publishing"})), 201)
    assert written["status"] == "created" and written["id"] != first
    assert direct(store_url, "SELECT id, topic FROM memory_longterm") == [{"id": written["id"], "topic": "publishing"}]
    assert direct(store_url, "SELECT row_id FROM memory_vector") == [{"row_id": written["id"]}]


def test_a_promotion_racing_the_forget_of_its_fact_links_only_a_stored_fact(served, store_url):
    # On PostgreSQL a promotion found the caller's fact while a forget was deleting it: it answered `linked` to
    # the forgotten id and kept a memory_promotion row naming it, which the forget (committed first) could not
    # take away. Now it waits for the forget and stores the fact anew.
    fact = "The VPN certificate renews on the first of the month."
    forgotten = long_fact(served, "atlas", fact)
    episode_id = episode(served, "atlas", "renewed the VPN certificate")
    promote = {"agent": "atlas", "ids": [episode_id], "fact": fact}
    forgetting = forget_under_way(store_url, "memory_longterm", forgotten)
    promoted = ok(while_held(served, forgetting, lambda: served.post("/v1/promote", promote)), 201)
    assert promoted["status"] == "created" and promoted["id"] != forgotten
    assert direct(store_url, "SELECT id FROM memory_longterm") == [{"id": promoted["id"]}]
    assert direct(store_url, "SELECT long_id FROM memory_promotion") == [{"long_id": promoted["id"]}]


def test_a_short_write_racing_the_forget_of_its_key_says_it_created_a_row(served, store_url):
    # On PostgreSQL the write saw the key's row before the forget committed, then made a new row once it had:
    # it answered `updated` (200) with an id the caller never had, as if its earlier row had been rewritten.
    body = {"agent": "atlas", "key": "deploy-lock", "value": "held by atlas"}
    first = ok(served.post("/v1/short", body), 201)["id"]
    forgetting = forget_under_way(store_url, "memory_short", first)
    written = ok(while_held(served, forgetting, lambda: served.post("/v1/short", {**body, "value": "again"})), 201)
    assert written["status"] == "created" and written["id"] != first
    assert direct(store_url, "SELECT id, value FROM memory_short") == [{"id": written["id"], "value": "again"}]


def test_a_keyed_episode_retried_as_it_is_forgotten_leaves_no_vector_behind(hybrid, store_url):
    # On PostgreSQL a retry found the episode by its idempotency key while a forget was deleting it, answered
    # `unchanged` with its id and, the episode having no vector yet, saved one for it: a memory_vector row (the
    # forgotten text's embedding) naming a row that was gone once the forget committed.
    event = {"agent": "atlas", "event_type": "t", "summary": "paged the on-call", "idempotency_key": "page-7"}
    (row,) = direct(
        store_url,
        "INSERT INTO memory_episodic (agent, event_type, summary) VALUES ('atlas', 't', ?) RETURNING id",
        (event["summary"],),
    )  # written without a vector (as by one of the fleet's writers), keyed as the service keys it
    direct(
        store_url,
        "INSERT INTO memory_write_key (agent, tier, key, row_id) VALUES ('atlas', 'episodic', ?, ?)",
        (event["idempotency_key"], row["id"]),
    )
    forgetting = forget_under_way(store_url, "memory_episodic", row["id"])
    written = ok(while_held(hybrid, forgetting, lambda: hybrid.post("/v1/episodic", event)), 201)
    assert written["status"] == "created" and written["id"] != row["id"]
    assert direct(store_url, "SELECT row_id FROM memory_vector WHERE tier = 'episodic'") == [{"row_id": written["id"]}]


@pytest.mark.parametrize("tier", ["episodic", "short"])
def test_a_vector_saved_as_its_row_is_forgotten_is_not_left_behind(served, store_url, tier):
    # On PostgreSQL the background pass saved a vector for a row a forget was deleting: its check that the row
    # still held the embedded text read the row as it was before the forget (not yet committed) and took no lock,
    # so the forget's trigger had no vector to delete and the forgotten text's embedding outlived its row.
    store = served.server.memory.store
    table = solos_store.TIER_TABLE[tier].table
    if tier == "episodic":
        insert = f"INSERT INTO {table} (agent, event_type, summary) VALUES ('atlas', 't', ?) RETURNING id"
    else:
        insert = (
            f"INSERT INTO {table} (agent, key, value, expires_at) VALUES ('atlas', 'k', ?, '2999-01-01') RETURNING id"
        )
    (row,) = direct(store_url, insert, ("paged the on-call",))
    (claimed,) = store.rows_missing_vectors(tier, "test-model", 10)  # the pass read it, and embeds it
    saved: list = []
    with fleet_writer(store_url) as conn:
        forget_under_way(store_url, table, row["id"])(conn)
        embedded = [(claimed, b"\0" * 16)]
        saving = threading.Thread(target=lambda: saved.append(store.save_vectors(tier, "test-model", embedded)))
        saving.start()
        wait_until(lambda: saved or waits_for_a_lock(store_url, store), "the save to meet the forget")
        conn.execute("COMMIT")
        saving.join(10)
    assert [ids for ids, _ in saved] == [[]]
    assert direct(store_url, "SELECT tier, row_id FROM memory_vector") == []


def test_an_idempotency_key_still_holds_once_its_episode_is_archived(served, store_url):
    # A retry looked for the key's episode in the hot table only: once `purge` had archived it, the same event
    # was stored again (`created`, a duplicate) and a different event under the key was taken, not a conflict.
    import solos_lifecycle

    event = {
        "agent": "atlas",
        "event_type": "turn",
        "summary": "asked about the backup window",
        "idempotency_key": "t-1",
    }
    first = ok(served.post("/v1/episodic", event), 201)["id"]
    direct(store_url, "UPDATE memory_episodic SET timestamp = '2020-01-01T00:00:00.000Z' WHERE id = ?", (first,))
    assert solos_lifecycle.archive_episodic(served.server.memory.store, 30) == 1
    assert ok(served.post("/v1/episodic", event)) == {
        "tier": "episodic",
        "agent": "atlas",
        "id": first,
        "status": "unchanged",
    }
    other = served.post("/v1/episodic", {**event, "summary": "asked about something else"})
    assert other.status == 409 and other.body["error"]["field"] == "idempotency_key", other.body
    assert direct(store_url, "SELECT count(*) AS n FROM memory_episodic") == [{"n": 0}]


# ==== 2. Recall: scopes, labels, tiers, tags, expiry, personas, and BM25 ranking ====


def test_recall_applies_scope_sharing_tiers_tags_and_expiry_alike(served, store_url):
    atlas = long_fact(served, "atlas", "atlas knows the gateway port", tags=["net"])
    sol = long_fact(served, "sol", "sol knows the gateway host", tags=["dns"])
    short = ok(served.post("/v1/short", {"agent": "sol", "key": "gw", "value": "gateway rebooting"}), 201)["id"]
    stale = ok(served.post("/v1/short", {"agent": "atlas", "key": "old", "value": "gateway was down"}), 201)["id"]
    mine = episode(served, "sol", "sol restarted the gateway")
    theirs = episode(served, "atlas", "atlas restarted the gateway")
    direct(store_url, "UPDATE memory_short SET expires_at = '2000-01-01T00:00:00.000Z' WHERE id = ?", (stale,))

    def found(**query: Any) -> set[tuple[str, int, str, bool]]:
        reply = ok(served.recall("sol", "gateway", k=20, **query))
        return {(r["tier"], r["id"], r["agent"], r["foreign"]) for r in reply["results"]}

    assert found() == {("long", atlas, "atlas", True), ("long", sol, "sol", False), ("short", short, "sol", False)}
    assert found(scope="own") == {("long", sol, "sol", False), ("short", short, "sol", False)}
    assert found(scope="shared_except_self") == {("long", atlas, "atlas", True)}
    assert found(tiers="long") == {("long", atlas, "atlas", True), ("long", sol, "sol", False)}
    assert found(tiers="episodic") == {("episodic", mine, "sol", False)}  # atlas has not opted in
    assert found(tags="net") == {("long", atlas, "atlas", True)}
    assert found(tags="dns,nothing", tiers="long,short") == {("long", sol, "sol", False)}
    (listed,) = direct(  # the fleet's other writers store tags as a comma list
        store_url,
        "INSERT INTO memory_longterm (agent, fact, tags) VALUES ('nova', 'gateway dns cache', 'net, dns') RETURNING id",
    )
    assert found(tags="dns") == {("long", sol, "sol", False), ("long", listed["id"], "nova", True)}
    recent = ok(served.recall("sol", "", tiers="short", k=10))
    assert [r["id"] for r in recent["results"]] == [short] and recent["ranking"] == "recency"
    assert ok(served.recall("atlas", "", tiers="episodic", scope="own"))["results"][0]["id"] == theirs
    unknown = served.recall("mallory", "gateway")
    assert (unknown.status, unknown.body["error"]["field"]) == (422, "agent")


def test_a_persona_is_recalled_only_by_its_own_agent(served, store_url):
    direct(store_url, "INSERT INTO memory_durable (key, value) VALUES ('persona/sol', 'Sol is the careful planner')")
    direct(store_url, "INSERT INTO memory_durable (key, value) VALUES ('persona/atlas', 'Atlas is a bold planner')")
    direct(store_url, "INSERT INTO memory_durable (key, value) VALUES ('fleet/policy', 'every planner logs')")
    assert ok(served.recall("sol", "planner"))["results"] == []  # never in the default tiers
    for q in ("planner", ""):
        reply = ok(served.recall("sol", q, tiers="durable,long"))
        assert [(r["tier"], r["agent"], r["text"], r["foreign"]) for r in reply["results"]] == [
            ("durable", "sol", "Sol is the careful planner", False)
        ]
    refused = served.recall("sol", "planner", tiers="durable", scope="shared_except_self")
    assert (refused.status, refused.body["error"]["field"]) == (403, "tiers")


def test_a_persona_renamed_by_the_fleet_is_no_event_of_its_former_agent(served, store_url):
    (row,) = direct(store_url, "INSERT INTO memory_durable (key, value) VALUES ('persona/atlas', 'bold') RETURNING id")
    renamed = "UPDATE memory_durable SET key = 'persona/sol', value = 'Sol keeps this' WHERE id = ?"
    direct(store_url, renamed, (row["id"],))
    atlas = ok(served.get("/v1/events", agent="atlas", tiers="durable", since=0))["events"]
    assert "Sol keeps this" not in json.dumps(atlas) and [e["row"] for e in atlas] == [None] * len(atlas)
    sol = ok(served.get("/v1/events", agent="sol", tiers="durable", since=0))["events"]
    assert [(e["kind"], e["row"]["text"]) for e in sol] == [("update", "Sol keeps this")]


# A small designed corpus, written in this order as (agent, topic, fact, tags): ids 1..n. Rows without a topic
# have no neighbours, so BM25 alone orders them; lengths differ, so no two scores tie.
RANKED_LONG = [
    ("atlas", None, "the harbor was quiet today", []),  # 1: "harbor" is in one row of 12
    ("sol", None, "the ferry was quiet", []),  # 2-5: "ferry" in four
    ("atlas", None, "the ferry was late again today", []),
    ("sol", None, "a ferry ticket costs more than a bus", []),
    ("nova", None, "the ferry crossing takes an hour in thick fog", []),
    ("nova", "lighthouse", "the lighthouse keeper retired", []),  # 6
    ("nova", "lighthouse", "he moved inland afterwards", []),  # 7: its context quotes 6
    ("hermes", None, "quartz lamp on the shelf", ["blue"]),  # 8: the word in the fact (weight 1.0)
    ("hermes", None, "glass lamp on the shelf", ["quartz"]),  # 9: the word in a tag (0.5), same length
    ("hermes", None, "the market opens at dawn", []),
    ("atlas", None, "goats graze on the hill", []),
    ("sol", None, "the barn roof was fixed", []),
    ("atlas", None, "kettle descaled", []),  # 13-15: the same words, so the same score: the oldest first
    ("sol", None, "Kettle descaled!", []),
    ("nova", None, "KETTLE, descaled.", []),
]
RANKINGS = [
    # A rare word outranks a common one; among the common word's rows, the shorter ranks higher.
    ("ferry harbor", [1, 2, 3, 4, 5]),
    # A fact's own words outrank its neighbour's context: 7 matches only through 6's text it carries.
    ("lighthouse keeper", [6, 7]),
    # Column weights: the fact's own text (1.0) outranks a tag (0.5).
    ("quartz", [8, 9]),
    ("quartz lamp", [8, 9]),
    # Equal scores: the older row first, as FTS5 returns them (so a cut at k keeps the same rows).
    ("kettle descaled", [13, 14, 15]),
]


def test_keyword_ranking_is_bm25_and_the_same_on_both_stores(served):
    for number, (agent, topic, fact, tags) in enumerate(RANKED_LONG, 1):
        assert long_fact(served, agent, fact, topic=topic, tags=tags) == number
    for question, expected in RANKINGS:
        reply = ok(served.recall("nova", question, tiers="long", k=10))
        assert reply["ranking"] == "keyword", reply
        assert [r["id"] for r in reply["results"]] == expected, (
            question,
            [(r["id"], r["score"]) for r in reply["results"]],
        )
        scores = [r["score"] for r in reply["results"]]
        assert scores == sorted(scores, reverse=True), question
    # The same BM25, not only the same order: the scores between the best and the last (each leg is scaled to
    # [0.01, 1]) are SQLite's, whose FTS5 computes them.
    middle = [r["score"] for r in ok(served.recall("nova", "ferry harbor", tiers="long", k=10))["results"]]
    assert [round(score, 3) for score in middle] == [1.0, 0.18, 0.099, 0.037, 0.01], middle


def test_short_and_episodic_rows_rank_by_their_columns_weights(served):
    short = [("atlas", "compass", "the tent is packed"), ("atlas", "map", "bring the compass"), ("sol", "x", "y")]
    for agent, key, value in short:
        body = {"agent": agent, "key": key, "value": value, "tags": ["compass"] * (key == "x")}
        ok(served.post("/v1/short", body), 201)
    # key and value weigh 1.0, tags 0.5: the tagged row comes last.
    assert ids(served.recall("atlas", "compass", tiers="short", k=10)) == [2, 1, 3]
    for summary, details in (("checked the pump", "valve sealed"), ("sealed the valve", "pump checked")):
        episode(served, "atlas", summary, details=details)
    # summary 1.0 over details 0.7: the row whose summary names the pump wins "pump", and the other wins "valve".
    assert ids(served.recall("atlas", "pump", tiers="episodic", k=10)) == [1, 2]
    assert ids(served.recall("atlas", "valve", tiers="episodic", k=10)) == [2, 1]


WORDS = (
    "ferry harbor storm lighthouse keeper kettle barn goat quartz granite market dawn pump valve certificate backup "
    "gateway timeout cluster replica disk alert deploy rollback migration schema token index cache latency outage "
    "incident review meeting tuesday friday morning evening coffee tea lunch picnic"
).split()


def random_memory(seed: int = 22, rows: int = 60, questions: int = 30) -> tuple[list[tuple], list[str]]:
    """Facts and short rows drawn from a small vocabulary (so words repeat, rows tie and topics thread), and
    questions over the same words."""
    draw = random.Random(seed)
    written = []
    for n in range(rows):
        text = " ".join(draw.choice(WORDS) for _ in range(draw.randint(3, 12))).capitalize() + "."
        topic = draw.choice(["", "ops", "home", "trip", f"day {n // 7}"]) or None
        written.append(
            (draw.choice(("atlas", "sol", "nova", "hermes")), topic, text, draw.sample(WORDS, draw.randint(0, 2)))
        )
    asked = [" ".join(draw.choice(WORDS) for _ in range(draw.randint(1, 4))) for _ in range(questions)]
    return written, asked


def answers(db: str, written: list[tuple], asked: list[str]) -> list[list[tuple]]:
    """The service's answer (reranker on, as it ships) to each question: (tier, id, score, relevance) per row."""
    server = start_server(db)
    try:
        for agent, topic, text, tags in written:
            for path, body in (
                ("/v1/long", {"topic": topic, "fact": text}),
                ("/v1/short", {"key": text[:24], "value": text}),
            ):
                reply = server.post(path, {"agent": agent, "tags": tags, **body})
                assert reply.status in (200, 201), reply.body
        found = []
        for question in asked:
            reply = ok(server.recall("sol", question, k=8))
            found.append(
                [(r["tier"], r["id"], round(r["score"], 4), round(r["relevance"], 4)) for r in reply["results"]]
            )
        return found
    finally:
        stop_server(server)


@pytest.mark.slow
def test_the_same_questions_find_the_same_rows_in_the_same_order_on_both_stores(tmp_path, pg_url):
    written, asked = random_memory()
    on_sqlite, on_postgresql = answers(str(tmp_path / "solos.db"), written, asked), answers(pg_url, written, asked)
    assert sum(len(rows) for rows in on_sqlite) > 100  # the questions find plenty
    differing = [(q, s, p) for q, s, p in zip(asked, on_sqlite, on_postgresql) if s != p]
    assert differing == []


@pytest.mark.slow
def test_postgresql_scores_the_rarest_words_rows_first_and_answers_as_scoring_every_match(pg_url, monkeypatch):
    """PgStore.ranked_rows scores the rows holding a question's rarest words first, and answers from them only
    when no other row can reach their scores (MaxScore): then the answer is the one scoring every match gives."""
    import solos_store_pg

    stop_server(start_server(pg_url))  # the schema, atlas registered
    draw = random.Random(34)
    common = WORDS[:6]  # in most rows: the rows holding only these can never make the top
    with fleet_writer(pg_url) as conn:
        for n in range(400):
            words = draw.sample(common, 3) + draw.sample(WORDS[6:], draw.choice((0, 0, 0, 1, 2)))
            conn.execute(
                "INSERT INTO memory_longterm (agent, topic, fact) VALUES ('atlas', ?, ?)", (f"t{n}", " ".join(words))
            )
    store = solos_store_pg.PgStore(pg_url)
    tier, seen = solos_store.TIER_TABLE["long"], solos_store.Visibility("atlas", "shared", queries=store.queries)
    passes: list[int] = []
    scored = store.scored
    monkeypatch.setattr(store, "scored", lambda conn, *args: passes.append(len(args[3])) or scored(conn, *args))
    try:
        for question in [f"{WORDS[n]} {WORDS[n + 1]} {common[n % 6]} {common[(n + 1) % 6]}" for n in range(6, 40)]:
            match = solos_rank.make_fts_query(solos_rank.query_words(question)) or ""
            monkeypatch.setattr(solos_store_pg, "FIRST_PASS_ROWS", 0)
            monkeypatch.setattr(solos_store_pg, "FIRST_PASS_SHARE", 0.0)
            first = store.read(lambda conn, match=match: store.ranked_rows(conn, tier, seen, match, 5))
            monkeypatch.setattr(solos_store_pg, "FIRST_PASS_ROWS", 10**9)
            every = store.read(lambda conn, match=match: store.ranked_rows(conn, tier, seen, match, 5))
            assert [(r["id"], r["score"]) for r in first] == [(r["id"], r["score"]) for r in every], question
    finally:
        store.close()
    assert passes.count(1) > len(passes) // 4  # the first pass (the rarest word alone) answered often


# Words the fleet writes inside addresses, paths and numbers: FTS5's unicode61 splits them at every punctuation
# mark, so each part is a word of its own.
INNER_WORDS = {
    "dashboards live on grafana.internal": "grafana",
    "page ops@example.org when the disk fills": "example",
    "the runbook is at https://wiki.lab/runbooks/backup": "runbooks",
    "the config is in /etc/nginx/nginx.conf": "nginx",
    "upgraded the cluster to release 2.14.1": "14",
    "the cache hit ratio is 3.75 today": "75",
    "the database listens at 10.0.0.5 only": "10",
    "the db-1 replica lags": "db",
    "backups run at 02:00 nightly": "02",
}


def test_the_words_inside_hosts_addresses_paths_and_numbers_are_found(served):
    for fact in INNER_WORDS:
        long_fact(served, "atlas", fact)
    for fact, word in INNER_WORDS.items():
        assert fact in texts(served.recall("sol", word, k=3)), (word, fact)


# ==== 3. Episodic opt-in and the read audit ====


def test_foreign_episodes_need_the_opt_in_and_every_read_is_audited(served):
    private = episode(served, "atlas", "atlas restarted the payment queue")
    own = episode(served, "sol", "sol restarted the search queue")
    query = {"tiers": "episodic", "k": 10}
    assert ids(served.recall("sol", "restarted queue", **query)) == [own]
    assert ok(served.get("/v1/audit", agent="atlas"))["reads"] == []
    ok(served.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True}), 201)
    shared = ok(served.recall("sol", "restarted queue", **query))["results"]
    assert {(r["id"], r["agent"], r["foreign"]) for r in shared} == {(private, "atlas", True), (own, "sol", False)}
    reads = ok(served.get("/v1/audit", agent="atlas"))["reads"]
    assert [(r["reader"], r["author"], r["row_id"]) for r in reads] == [("sol", "atlas", private)]
    assert STAMP.fullmatch(reads[0]["read_at"])
    assert ok(served.get("/v1/audit", agent="sol"))["reads"] == []  # own reads are not audited
    assert ids(served.recall("sol", "payment", scope="own", **query)) == []
    ok(served.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": False}))
    assert ids(served.recall("sol", "restarted queue", **query)) == [own]
    assert len(ok(served.get("/v1/audit", agent="atlas"))["reads"]) == 1


# ==== 4. The fleet's other writers ====


def test_rows_the_fleet_writes_directly_are_recalled_changed_and_gone_at_once_with_their_events(served, store_url):
    everything = {"tiers": "long,short,episodic"}
    ok(served.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True}), 201)
    cursor = events(served, "atlas", 0, **everything)["next_since"]

    def logged() -> list[tuple[str, str, int]]:
        """The events since the last look, as their writer reads them (a writer gets no notices of its own)."""
        nonlocal cursor
        answer = events(served, "atlas", cursor, **everything)
        cursor = answer["next_since"]
        assert {e["agent"] for e in answer["events"]} <= {"atlas"}
        return kinds(answer)

    (long_row,) = direct(
        store_url,
        "INSERT INTO memory_longterm (agent, topic, fact) VALUES ('atlas', 'd', 'zeppelin doors') RETURNING id",
    )
    (short_row,) = direct(
        store_url,
        "INSERT INTO memory_short (agent, key, value, expires_at) "
        "VALUES ('atlas', 'k', 'zeppelin mooring', '2999-01-01T00:00:00.000Z') RETURNING id",
    )
    (episode_row,) = direct(
        store_url,
        "INSERT INTO memory_episodic (agent, event_type, summary) "
        "VALUES ('atlas', 'e', 'zeppelin landed') RETURNING id",
    )
    rows = {"long": long_row["id"], "short": short_row["id"], "episodic": episode_row["id"]}
    found = ok(served.recall("sol", "zeppelin", k=10, **everything))["results"]
    assert {(r["tier"], r["id"], r["agent"]) for r in found} == {(tier, i, "atlas") for tier, i in rows.items()}
    assert logged() == [("write", tier, i) for tier, i in rows.items()]

    direct(store_url, "UPDATE memory_longterm SET fact = 'airship doors' WHERE id = ?", (rows["long"],))
    direct(store_url, "UPDATE memory_short SET value = 'airship mooring' WHERE id = ?", (rows["short"],))
    direct(store_url, "UPDATE memory_episodic SET summary = 'airship landed' WHERE id = ?", (rows["episodic"],))
    assert ok(served.recall("sol", "zeppelin", **everything))["results"] == []
    assert sorted(texts(served.recall("sol", "airship", k=10, **everything))) == [
        "airship doors",
        "airship landed",
        "airship mooring",
    ]
    assert logged() == [("update", tier, i) for tier, i in rows.items()]

    for table in ("memory_longterm", "memory_short", "memory_episodic"):
        direct(store_url, f"DELETE FROM {table} WHERE agent = 'atlas'")
    assert ok(served.recall("sol", "airship", **everything))["results"] == []
    assert ok(served.recall("sol", "", **everything))["results"] == []
    assert logged() == [("delete", tier, i) for tier, i in rows.items()]


def test_a_reader_of_a_row_the_fleet_rewrites_is_told_before_it_sees_the_update(served, store_url):
    """Each rewrite of a row sol was shown gives sol a notice (superseded), logged in the update's transaction
    just before the update itself, on every tier."""
    everything = {"tiers": "long,short,episodic"}
    ok(served.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True}), 201)
    rows = {
        "long": long_fact(served, "atlas", "the pump is red"),
        "short": ok(served.post("/v1/short", {"agent": "atlas", "key": "k", "value": "the pump hums"}), 201)["id"],
        "episodic": episode(served, "atlas", "the pump was serviced"),
    }
    shown = events(served, "sol", 0, **everything)  # hands sol the three rows
    assert sorted(e["row_id"] for e in shown["events"]) == sorted(rows.values())

    def delivered() -> set[tuple[str, int]]:
        return {(d["tier"], d["row_id"]) for d in ok(served.get("/v1/deliveries", agent="atlas"))["deliveries"]}

    wait_until(lambda: delivered() == set(rows.items()), "sol's deliveries to be logged")
    direct(store_url, "UPDATE memory_longterm SET fact = 'the pump is blue' WHERE id = ?", (rows["long"],))
    direct(store_url, "UPDATE memory_short SET value = 'the pump is silent' WHERE id = ?", (rows["short"],))
    direct(store_url, "UPDATE memory_episodic SET summary = 'the pump was replaced' WHERE id = ?", (rows["episodic"],))
    told = events(served, "sol", shown["next_since"], **everything)["events"]
    assert [(e["kind"], e["tier"]) for e in told] == [
        step for tier in rows for step in (("notice", "notice"), ("update", tier))
    ]
    assert [(e["notice"]["tier"], e["notice"]["row_id"], e["notice"]["kind"]) for e in told[::2]] == [
        (tier, row_id, "superseded") for tier, row_id in rows.items()
    ]
    assert [e["row"]["text"] for e in told[1::2]] == ["the pump is blue", "the pump is silent", "the pump was replaced"]


# ==== 5. The service never writes the fleet's registry or personas ====


def test_the_service_connection_cannot_write_the_registry_or_personas(served, store_url):
    direct(store_url, "INSERT INTO memory_durable (key, value) VALUES ('persona/sol', 'Sol plans')")
    store = served.server.memory.store
    refused = database_errors(store_url)
    attempts = [
        "INSERT INTO agent_registry (agent) VALUES ('sneaky')",
        "UPDATE agent_registry SET role = 'root'",
        "DELETE FROM agent_registry",
        "INSERT INTO memory_durable (key, value) VALUES ('persona/sneaky', 'x')",
        "UPDATE memory_durable SET value = 'rewritten'",
        "DELETE FROM memory_durable",
    ]
    for sql in attempts:
        conn = store.checkout()
        try:
            with pytest.raises(refused):
                conn.execute(sql)
        finally:
            store.checkin(conn)
    assert ok(served.get("/health"))["status"] == "ok"  # the pool still serves
    assert [r["agent"] for r in direct(store_url, "SELECT agent FROM agent_registry ORDER BY agent")] == [
        "atlas",
        "hermes",
        "nova",
        "sol",
    ]
    assert direct(store_url, "SELECT key, value FROM memory_durable") == [{"key": "persona/sol", "value": "Sol plans"}]
    assert texts(served.recall("sol", "plans", tiers="durable")) == ["Sol plans"]


# ==== 6. Forget ====


def test_a_forgotten_row_leaves_both_legs_its_neighbours_context_and_tells_its_readers(hybrid, store_url):
    server = hybrid
    secret = "the vault combination is amber falcon"
    forgotten = long_fact(server, "atlas", secret, topic="vault")
    neighbour = long_fact(server, "sol", "the guard changes at noon", topic="vault")
    long_fact(server, "sol", "keys hang in the office", topic="office")
    start = events(server, "nova", 0)["next_since"]
    # Before: nova is shown it by both legs, and sol's neighbour matches its words through its context.
    both = ok(server.recall("nova", "amber falcon", k=10))
    assert both["results"][0]["id"] == forgotten and both["receipt"]["legs"] == ["keyword", "vector"]
    assert ids(server.recall("nova", secret, ranking="vector", k=1)) == [forgotten]
    assert ids(server.recall("sol", "amber falcon", scope="own", ranking="keyword")) == [neighbour]
    wait_until(lambda: ok(server.get("/v1/deliveries", agent="atlas"))["count"], "nova's delivery to be logged")

    forgot = ok(server.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": forgotten}))
    assert (forgot["status"], forgot["id"], forgot["notified"]) == ("forgotten", forgotten, 1)
    for ranking in ("auto", "keyword", "vector"):
        for agent in ("atlas", "nova", "sol"):
            found = ok(server.recall(agent, "amber falcon", ranking=ranking, k=10))
            assert forgotten not in [r["id"] for r in found["results"]], (ranking, agent)
            assert "falcon" not in str(found["results"])
    assert ids(server.recall("sol", "amber falcon", scope="own", ranking="keyword")) == []  # context re-indexed
    assert ids(server.recall("sol", "guard noon", scope="own", ranking="keyword")) == [neighbour]

    logged = events(server, "nova", start)
    assert ("forget", "long", forgotten) in kinds(logged)
    assert "falcon" not in str(logged)
    (retraction,) = direct(store_url, "SELECT * FROM memory_retraction")
    assert (retraction["agent"], retraction["tier"], retraction["row_id"]) == ("atlas", "long", forgotten)
    assert "falcon" not in str(retraction)
    (vectors,) = direct(
        store_url, "SELECT count(*) AS n FROM memory_vector WHERE tier = 'long' AND row_id = ?", (forgotten,)
    )
    assert vectors["n"] == 0
    # The scrub: SQLite's index merge and WAL checkpoint run before the answer; PostgreSQL's VACUUM runs off the
    # request path, so its answer says pending. Either way it finishes and leaves nothing queued, and forgetting
    # again answers the same retraction.
    assert forgot["wal_checkpoint"] == ("pending" if is_postgres(store_url) else "complete")
    wait_until(lambda: not direct(store_url, "SELECT tier FROM memory_scrub_pending"), "the forget's scrub")
    again = ok(server.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": forgotten}))
    assert (again["retraction_id"], again["content_hash"]) == (forgot["retraction_id"], forgot["content_hash"])
    notices = ok(server.get("/v1/notices", agent="nova"))["notices"]
    assert [(n["tier"], n["row_id"], n["writer"], n["kind"]) for n in notices] == [
        ("long", forgotten, "atlas", "forgotten")
    ]
    assert ok(server.get("/v1/notices", agent="sol"))["notices"] == []  # never shown it


# ==== 7. Events: every write once, in order, under concurrent writers ====

THREADS, WRITES = 8, 50


def test_read_events_pages_every_concurrent_write_exactly_once_in_order(served):
    start = events(served, "atlas", 0)["next_since"]
    written: list[int] = []
    errors: list[Any] = []
    lock = threading.Lock()

    def writer(n: int) -> None:
        for i in range(WRITES):
            reply = served.post("/v1/long", {"agent": "sol", "fact": f"writer {n} fact {i}"})
            if reply.status != 201:
                errors.append(reply.body)
                return
            with lock:
                written.append(reply.body["id"])

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(written) == THREADS * WRITES

    seen: list[dict] = []
    since = start
    deadline = time.monotonic() + 10
    while len(seen) < len(written) and time.monotonic() < deadline:
        page = events(served, "atlas", since, limit=37)
        seen += page["events"]
        since = page["next_since"]
    assert [e["id"] for e in seen] == sorted({e["id"] for e in seen})  # increasing, none twice
    assert sorted(e["row_id"] for e in seen) == sorted(written)
    assert {e["kind"] for e in seen} == {"write"}
    assert events(served, "atlas", since)["events"] == []


def next_data(response: Any) -> dict:
    """The next `data:` message of a Server-Sent Events response, parsed."""
    for raw in iter(response.readline, b""):
        line = raw.decode().rstrip("\n")
        if line.startswith("data: "):
            return json.loads(line[len("data: ") :])
    raise AssertionError("the stream ended")


def test_a_stream_hands_out_the_services_and_the_fleets_writes_as_they_commit(served, store_url):
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    try:
        conn.request("GET", "/v1/events?agent=sol", headers={"Accept": "text/event-stream"})
        response = conn.getresponse()
        assert response.status == 200
        assert response.readline() == b"retry: 2000\n"  # sent once the hub holds the subscription
        written = long_fact(served, "atlas", "streamed from the service")
        first = next_data(response)
        (row,) = direct(
            store_url,
            "INSERT INTO memory_longterm (agent, fact) VALUES ('nova', 'streamed from the fleet') RETURNING id",
        )
        second = next_data(response)
    finally:
        conn.close()
    assert [(e["kind"], e["row_id"], e["agent"], e["row"]["text"]) for e in (first, second)] == [
        ("write", written, "atlas", "streamed from the service"),
        ("write", row["id"], "nova", "streamed from the fleet"),
    ]
    assert first["id"] < second["id"]


def test_read_events_filters_by_scope_writers_tags_and_words_alike(served):
    long_fact(served, "atlas", "atlas likes green tea", tags=["preference"])
    long_fact(served, "sol", "sol likes black coffee", tags=["preference"])
    mine = long_fact(served, "sol", "sol fixed the coffee machine", tags=["ops"])
    ok(served.post("/v1/short", {"agent": "hermes", "key": "mood", "value": "coffee please"}), 201)

    def shown(**query: Any) -> list[str]:
        return [e["row"]["text"] for e in events(served, "atlas", 0, **query)["events"]]

    assert shown() == [
        "atlas likes green tea",
        "sol likes black coffee",
        "sol fixed the coffee machine",
        "coffee please",
    ]
    assert shown(scope="own") == ["atlas likes green tea"]
    assert shown(scope="shared_except_self", tiers="long") == ["sol likes black coffee", "sol fixed the coffee machine"]
    assert shown(writers="hermes") == ["coffee please"]
    assert shown(tags="preference") == ["atlas likes green tea", "sol likes black coffee"]
    assert shown(q="coffee machines") == ["sol likes black coffee", "sol fixed the coffee machine", "coffee please"]
    assert shown(q="machine", tags="ops") == ["sol fixed the coffee machine"]
    # A removal reaches a words filter if its row matched that filter when it was shown written to it (atlas was
    # shown the row, so atlas is also told of the forget by a notice, whatever the filter).
    assert shown(q="machine") == ["sol fixed the coffee machine"]
    assert shown(q="tea") == ["atlas likes green tea"]
    start = events(served, "atlas", 0)["next_since"]
    ok(served.request("DELETE", "/v1/memory", query={"agent": "sol", "tier": "long", "id": mine}))
    assert kinds(events(served, "atlas", start, q="machine")) == [("forget", "long", mine), ("notice", "notice", 1)]
    assert kinds(events(served, "atlas", start, q="tea")) == [("notice", "notice", 1)]


@pytest.mark.slow
def test_an_open_transactions_event_is_not_skipped(pg_url):
    """PostgreSQL: ids commit out of order. A later write must not be handed out before the event of a
    transaction still open, and after its commit both come, in order."""
    server = start_server(pg_url)
    try:
        ok(server.post("/v1/long", {"agent": "atlas", "fact": "before anything"}), 201)
        start = events(server, "nova", 0)["next_since"]
        with fleet_writer(pg_url) as open_tx:
            open_tx.execute("BEGIN")
            (held,) = open_tx.execute(
                "INSERT INTO memory_longterm (agent, fact) VALUES ('sol', ?) RETURNING id", ("a long row " * 500,)
            ).fetchall()
            later = long_fact(server, "atlas", "committed while the other is open")
            assert ids(server.recall("nova", "committed", k=5)) == [later]  # committed: recalled at once
            waiting = events(server, "nova", start, settle=False)
            assert waiting["events"] == [] and waiting["next_since"] == start
            open_tx.execute("COMMIT")
        after = events(server, "nova", start)
        assert [(e["kind"], e["row_id"]) for e in after["events"]] == [("write", held[0]), ("write", later)]
        assert [e["id"] for e in after["events"]] == sorted(e["id"] for e in after["events"])
        assert events(server, "nova", after["next_since"])["events"] == []
    finally:
        stop_server(server)


# ==== 8. Purge, expiry, promotion and the archive ====


def test_purge_removes_expired_rows_once_with_one_expire_event(served, store_url):
    start = events(served, "atlas", 0, tiers="short")["next_since"]
    gone = ok(served.post("/v1/short", {"agent": "atlas", "key": "soon", "value": "gone soon", "ttl_s": 0.2}), 201)
    kept = ok(served.post("/v1/short", {"agent": "atlas", "key": "later", "value": "stays", "ttl_s": 600}), 201)
    wait_until(lambda: ids(served.recall("atlas", "", tiers="short")) == [kept["id"]], "the short row to expire")
    assert solos_memory.main(["purge", "--db", store_url]) == 0
    assert [r["id"] for r in direct(store_url, "SELECT id FROM memory_short")] == [kept["id"]]
    stats = ok(served.get("/v1/stats"))
    assert (stats["rows"]["short"], stats["rows"]["short_expired"]) == (1, 0)
    assert solos_memory.main(["purge", "--db", store_url]) == 0
    # The expired row's write is never handed out (expired rows never are); its expiry is, once, whether the
    # service's sweep or purge's delete logged it.
    delivered = kinds(events(served, "atlas", start, tiers="short"))
    assert delivered == [("write", "short", kept["id"]), ("expire", "short", gone["id"])]
    logged = direct(store_url, "SELECT kind, row_id FROM memory_event WHERE tier = 'short' ORDER BY id")
    assert [(e["kind"], e["row_id"]) for e in logged] == [
        ("write", gone["id"]),
        ("write", kept["id"]),
        ("expire", gone["id"]),
    ]


@pytest.mark.parametrize(
    "spelling", ["%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S.000+00:00", "%Y-%m-%d"]
)
def test_a_short_expiry_the_fleet_spells_otherwise_is_refused_naming_the_column(served, store_url, spelling):
    """expires_at is compared as text: '2026-12-07 09:17:34' (str(datetime)) sorts before every canonical stamp of
    its day, so the row was hidden from recall and purged up to a day early, and an offset put it hours out, with
    no word to anyone. Such a write is refused, naming the column; the canonical spelling and a value that is no
    date, one before yesterday ("expire it") or one from 2100 on ("never") are taken as ever, and an update of
    another column leaves an old row alone."""
    spelt = time.strftime(spelling, time.gmtime(time.time() + 3600))  # an hour from now, as a script spells it
    insert = "INSERT INTO memory_short (agent, key, value, expires_at) VALUES ('atlas', ?, 'kettle', ?) RETURNING id"
    before = direct(store_url, "SELECT count(*) AS n FROM memory_short")[0]["n"]
    refusal = pytest.importorskip("psycopg").errors.CheckViolation if is_postgres(store_url) else sqlite3.IntegrityError
    with pytest.raises(refusal) as refused:
        direct(store_url, insert, ("spelt", spelt))
    assert "memory_short.expires_at must be UTC written as 2026-12-07T09:17:34.000Z" in str(refused.value)
    assert direct(store_url, "SELECT count(*) AS n FROM memory_short")[0]["n"] == before
    kept = direct(store_url, insert, ("kept", "2999-01-01T00:00:00.000Z"))[0]["id"]
    with pytest.raises(refusal):
        direct(store_url, "UPDATE memory_short SET expires_at = ? WHERE id = ?", (spelt, kept))
    assert direct(store_url, "SELECT expires_at FROM memory_short WHERE id = ?", (kept,)) == [
        {"expires_at": "2999-01-01T00:00:00.000Z"}
    ]
    taken = ("2999", "9999-12-31", "2000-01-01T00:00:00Z")  # never, never, long expired
    never = [direct(store_url, insert, (f"never {n}", v))[0]["id"] for n, v in enumerate(taken[:2])]
    direct(store_url, insert, ("expired", taken[2]))
    for n, row_id in enumerate(never):  # distinct texts: recall collapses identical ones
        direct(store_url, "UPDATE memory_short SET value = ? WHERE id = ?", (f"kettle {'on' * (n + 1)}", row_id))
    assert sorted(r["id"] for r in ok(served.recall("atlas", "kettle", tiers="short"))["results"]) == [kept, *never]


def test_short_rows_the_fleet_writes_already_expired_get_one_expire_event_each(served, store_url):
    """The sweep logs the expiries in the window since its last run; a row the fleet writes with, or moves to, an
    expiry before that window (back-dated, or a TTL shortened to the past) is reported once too, so an event reader
    drops what recall no longer returns. A row rewritten to live again, or deleted while live, is not."""
    mark = "SELECT value FROM solos_memory_meta WHERE key = 'events_expired_through'"
    wait_until(lambda: direct(store_url, mark), "the first expiry sweep")
    start = events(served, "atlas", 0, tiers="short")["next_since"]
    past, future = "2000-01-01T00:00:00.000Z", "2999-01-01T00:00:00.000Z"
    insert = "INSERT INTO memory_short (agent, key, value, expires_at) VALUES ('atlas', ?, 'harbour', ?) RETURNING id"
    born_expired = direct(store_url, insert, ("born", past))[0]["id"]
    shortened = direct(store_url, insert, ("shortened", future))[0]["id"]
    direct(store_url, "UPDATE memory_short SET expires_at = ? WHERE id = ?", (past, shortened))
    with fleet_writer(store_url) as conn:  # expired, then given a new TTL before any sweep could see it
        conn.execute("BEGIN")
        revived = conn.execute(insert, ("revived", past)).fetchone()[0]
        conn.execute("UPDATE memory_short SET expires_at = ? WHERE id = ?", (future, revived))
        conn.execute("COMMIT")
    deleted_live = direct(store_url, insert, ("deleted", future))[0]["id"]
    direct(store_url, "DELETE FROM memory_short WHERE id = ?", (deleted_live,))
    purged = direct(store_url, insert, ("purged", past))[0]["id"]  # reported by the sweep or by its delete
    direct(store_url, "DELETE FROM memory_short WHERE id = ?", (purged,))
    expired = {born_expired, shortened, purged}

    def logged() -> dict[int, list[str]]:
        rows = direct(store_url, "SELECT kind, row_id FROM memory_event WHERE tier = 'short' ORDER BY id")
        by_row: dict[int, list[str]] = {}
        for event in rows:
            by_row.setdefault(event["row_id"], []).append(event["kind"])
        return by_row

    wait_until(lambda: all("expire" in logged().get(i, []) for i in expired), "the expiries to be logged")
    time.sleep(3 * solos_events.SWEEP_S)  # later sweeps log nothing more
    assert logged() == {
        born_expired: ["write", "expire"],
        shortened: ["write", "update", "expire"],
        revived: ["write", "update"],
        deleted_live: ["write", "delete"],
        purged: ["write", "expire"],
    }
    assert ids(served.recall("atlas", "harbour", tiers="short")) == [revived]
    removals = [(e["kind"], e["row_id"]) for e in events(served, "atlas", start, tiers="short")["events"]]
    assert sorted(r for r in removals if r[0] == "expire") == sorted(("expire", i) for i in expired)
    assert ("delete", deleted_live) in removals


def test_a_short_write_the_fleet_leaves_open_has_the_sweep_skip_a_round_not_hold_up_writes(served, store_url):
    """PostgreSQL: a short row's write reads the sweep's mark FOR SHARE until it commits; the sweep waits for it
    only MARK_WAIT_MS, so the service's writes never queue behind a sweep waiting on the fleet, and the row the
    open transaction back-dated is reported once it commits."""
    if not is_postgres(store_url):
        pytest.skip("SQLite's writers take turns: an open write holds the whole database")
    import solos_store_pg

    mark = "SELECT value FROM solos_memory_meta WHERE key = 'events_expired_through'"
    wait_until(lambda: direct(store_url, mark), "the first expiry sweep")
    store = served.server.memory.store
    with fleet_writer(store_url) as conn:
        conn.execute("BEGIN")
        (row,) = conn.execute(
            "INSERT INTO memory_short (agent, key, value, expires_at) "
            "VALUES ('atlas', 'open', 'kettle', '2000-01-01T00:00:00.000Z') RETURNING id"
        ).fetchall()
        started = time.monotonic()
        assert store.write(lambda c: store.queries.sweep_expired(c, lambda *_: None)) == 0
        assert time.monotonic() - started < 10 * solos_store_pg.MARK_WAIT_MS / 1000
        ok(served.post("/v1/short", {"agent": "sol", "key": "k", "value": "a write meanwhile"}), 201)
        conn.execute("COMMIT")
    logged = "SELECT kind FROM memory_event WHERE tier = 'short' AND row_id = ? ORDER BY id"
    wait_until(lambda: [e["kind"] for e in direct(store_url, logged, (row["id"],))] == ["write", "expire"], "expire")


def test_promotion_and_the_archive_alike(served, store_url):
    old = [episode(served, "atlas", f"Quarterly failover drill number {n}") for n in range(3)]
    fresh = episode(served, "atlas", "Failover drill planned for next week")
    promoted = served.post("/v1/promote", {"agent": "atlas", "ids": [old[1], old[0]], "topic": "drills"})
    assert (promoted.status, promoted.body["status"], promoted.body["sources"]) == (201, "created", old[:2])
    fact = ok(served.recall("sol", "quarterly failover drill number", tiers="long", k=1))["results"][0]
    assert (fact["id"], fact["agent"], fact["foreign"]) == (promoted.body["id"], "atlas", True)
    assert fact["source"] == f"promoted:memory_episodic#{old[0]},{old[1]}"
    again = served.post("/v1/promote", {"agent": "atlas", "ids": [old[0]], "fact": fact["fact"]})
    assert (again.status, again.body["status"], again.body["id"]) == (200, "linked", promoted.body["id"])
    assert served.post("/v1/promote", {"agent": "sol", "ids": [old[0]]}).status == 404  # atlas does not share
    served.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True})
    assert served.post("/v1/promote", {"agent": "sol", "ids": [old[0]]}).status == 403
    served.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": False})

    start = events(served, "atlas", 0, tiers="episodic")["next_since"]
    for row_id in old:
        direct(store_url, "UPDATE memory_episodic SET timestamp = '2020-01-01T00:00:00.000Z' WHERE id = ?", (row_id,))
    assert solos_memory.main(["purge", "--db", store_url]) == 0
    assert [r["id"] for r in direct(store_url, "SELECT id FROM memory_episodic")] == [fresh]
    assert [r["id"] for r in direct(store_url, "SELECT id FROM memory_episodic_archive ORDER BY id")] == old
    assert ids(served.recall("atlas", "quarterly failover drill", tiers="episodic", k=10)) == [fresh]
    archived = ok(served.recall("atlas", "quarterly failover drill", tiers="episodic", archive="true", k=10))
    assert sorted(r["id"] for r in archived["results"] if r["archived"]) == old
    assert {r["source"] for r in archived["results"] if r["archived"]} == {f"memory_episodic_archive#{i}" for i in old}
    logged = kinds(events(served, "atlas", start, tiers="episodic"))
    assert [entry for entry in logged if entry[0] == "archive"] == [("archive", "episodic", i) for i in old]
    stats = ok(served.get("/v1/stats"))
    assert (stats["episodic_archived"], stats["promoted_facts"], stats["rows"]["episodic"]) == (3, 1, 1)
    # Promotion reaches archived episodes too.
    assert served.post("/v1/promote", {"agent": "atlas", "ids": [old[2]]}).status == 201


# ==== 9. Hybrid recall ====


def test_a_write_is_ranked_by_both_legs_at_once(hybrid):
    server = hybrid
    long_fact(server, "atlas", "orange tabby naps in the sun", topic="pets")
    written = long_fact(server, "sol", "the tabby chased a moth", topic="pets")
    short = ok(server.post("/v1/short", {"agent": "sol", "key": "walk", "value": "walk the tabby"}), 201)["id"]
    reply = ok(server.recall("nova", "tabby moth", k=10))
    assert (reply["ranking"], reply["degraded"]) == ("hybrid", False)
    assert reply["receipt"]["legs"] == ["keyword", "vector"] and reply["receipt"]["without_vector"] == 0
    assert reply["results"][0]["id"] == written
    assert {(r["tier"], r["id"]) for r in reply["results"]} >= {("long", written), ("short", short)}
    vector_only = ok(server.recall("nova", "the tabby chased a moth", ranking="vector", k=1))
    assert [r["id"] for r in vector_only["results"]] == [written] and vector_only["receipt"]["legs"] == ["vector"]


def test_hybrid_relevance_is_the_cross_encoders_and_its_floor_holds_alike(hybrid):
    """The relevance contract with the cross-encoder on: a probability per row, the receipt naming who gave it,
    and a floor between two rows' relevance leaving the lower one out, counted."""
    for module in ("onnxruntime", "tokenizers"):
        pytest.importorskip(module)
    long_fact(hybrid, "atlas", "payments-api serves on port 8443; TLS ends on the pod.", topic="payments-api")
    long_fact(hybrid, "atlas", "search-api listens on 8088 behind haproxy.", topic="search-api")
    question = "What port does payments-api listen on?"
    reply = ok(hybrid.recall("sol", question, tiers="long", k=5))
    assert (reply["ranking"], reply["receipt"]["judge_reason"]) == ("hybrid", None)
    assert reply["receipt"]["judge"].startswith("cross-encoder@")
    relevance = {r["text"].split()[0]: r["relevance"] for r in reply["results"]}
    assert all(0.0 <= p <= 1.0 for p in relevance.values())
    assert relevance["payments-api"] > relevance["search-api"]
    floor = round((relevance["payments-api"] + relevance["search-api"]) / 2, 6)  # REST reads 12 decimals at most
    floored = ok(hybrid.recall("sol", question, tiers="long", k=5, min_relevance=floor))
    assert [r["text"].split()[0] for r in floored["results"]] == ["payments-api"]
    assert floored["below_floor"] == floored["receipt"]["below_floor"] == 1


def test_a_hybrid_write_commits_its_row_and_vector_together(store_url, monkeypatch):
    """A write's text is embedded before its transaction, which saves the vector with the row: the fleet never reads
    a row the service wrote without its vector (it could, between the row's commit and the vector's), and an
    identical retry saves nothing again."""
    pytest.importorskip("numpy")
    embedder = WordHashEmbedder(delay_s=0.2)  # a slow model: the gap between the two commits was this wide
    monkeypatch.setattr(solos_memory, "load_embedder", lambda config, threads=1: (embedder, None))
    server = start_server(store_url)
    generation = "SELECT value FROM solos_memory_meta WHERE key = 'vector_generation'"
    try:
        writes = {
            "long": ("/v1/long", {"agent": "atlas", "topic": "t", "fact": "row and vector at once"}, "memory_longterm"),
            "short": ("/v1/short", {"agent": "atlas", "key": "k", "value": "row and vector"}, "memory_short"),
            "episodic": (
                "/v1/episodic",
                {"agent": "atlas", "event_type": "e", "summary": "row, vector"},
                "memory_episodic",
            ),
        }
        replies: dict[str, Any] = {}
        for tier, (path, body, table) in writes.items():
            writing = threading.Thread(
                target=lambda *call: replies.update({call[0]: server.post(*call)}), args=(path, body)
            )
            writing.start()
            seen: list[dict] = []
            while writing.is_alive():
                seen += direct(
                    store_url,
                    f"SELECT t.id, v.model FROM {table} t LEFT JOIN memory_vector v ON v.tier = ? AND v.row_id = t.id",
                    (tier,),
                )
            writing.join()
            assert replies[path].status == 201, replies[path].body
            assert [row for row in seen if row["model"] != embedder.model_id] == []
            assert [
                row["model"]
                for row in direct(
                    store_url,
                    f"SELECT v.model FROM {table} t JOIN memory_vector v ON v.tier = ? AND v.row_id = t.id",
                    (tier,),
                )
            ] == [embedder.model_id]
        before = direct(store_url, generation)
        path, body, _ = writes["long"]
        assert ok(server.post(path, body))["status"] == "unchanged"
        assert direct(store_url, generation) == before
    finally:
        stop_server(server)


# ==== 10. Stats, /metrics, the status page; as-of, deliveries and notices ====


def test_stats_metrics_and_the_status_page_count_alike(served):
    long_fact(served, "atlas", "stats fact one")
    long_fact(served, "sol", "stats fact two")
    ok(served.post("/v1/short", {"agent": "atlas", "key": "k", "value": "stats short"}), 201)
    episode(served, "sol", "stats episode")
    ok(served.request("PUT", "/v1/sharing", body={"agent": "sol", "episodic": True}), 201)
    assert len(ids(served.recall("atlas", "stats", tiers="long,short,episodic", k=10))) == 4
    served.recall("mallory", "stats")
    stats = ok(served.get("/v1/stats"))
    assert stats["rows"] == {"short": 1, "short_expired": 0, "long": 2, "episodic": 1, "durable": 0}
    assert stats["recall_hits"] == {"long": 2, "short": 1, "episodic": 1}
    assert stats["rejections"] == {"unknown_agent": 1} and stats["episodic_sharing_agents"] == 1
    assert stats["audit_rows"] == 1 and stats["agents"] == 4
    metrics = served.get("/metrics").raw.decode()
    for tier, count in (("short", 1), ("long", 2), ("episodic", 1)):
        assert f'solos_memory_rows{{tier="{tier}"}} {count}\n' in metrics
    page = served.get("/")
    assert page.status == 200
    tiers = re.search(r'<table id="tiers">.*?</table>', page.raw.decode(), re.S)
    assert tiers is not None
    cells = dict(re.findall(r"<tr><td[^>]*>(\w+)</td><td[^>]*>(\d+)</td>", tiers.group(0)))
    assert cells == {"short": "1", "long": "2", "episodic": "1", "durable": "0"}, tiers.group(0)


def test_writes_per_agent_count_writes_not_the_rows_left(served, store_url):
    kept = long_fact(served, "atlas", "the ferry leaves at nine")
    forgotten = long_fact(served, "atlas", "the ferry is late today")
    ok(served.post("/v1/short", {"agent": "atlas", "key": "plan", "value": "catch the ferry"}), 201)
    ok(served.post("/v1/short", {"agent": "atlas", "key": "plan", "value": "catch the next ferry"}))  # a change
    assert ok(served.post("/v1/long", {"agent": "atlas", "fact": "the ferry leaves at nine"}))["id"] == kept
    ok(served.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": forgotten}))
    (sols,) = direct(store_url, "INSERT INTO memory_longterm (agent, fact) VALUES ('sol', 'pier 4') RETURNING id")
    direct(store_url, "DELETE FROM memory_longterm WHERE id = ?", (sols["id"],))  # the fleet's own delete
    activity = ok(served.get("/v1/stats"))["activity"]
    # atlas: two facts (one forgotten since), the short row and its change; the identical retry is no write
    assert activity["hour"]["writes"] == activity["day"]["writes"] == {"atlas": 4, "sol": 1}
    assert activity["hours"][-1]["writes"] == 5


def test_as_of_deliveries_and_notices_answer_alike(served):
    fact = long_fact(served, "atlas", "the north gate code is 4411")
    ok(served.post("/v1/short", {"agent": "atlas", "key": "shift", "value": "night shift on gate"}), 201)
    time.sleep(0.005)  # timestamps are milliseconds
    before = solos_store.utc_now()
    time.sleep(0.005)
    assert len(ids(served.recall("sol", "gate", k=10))) == 2  # sol is shown both
    wait_until(lambda: ok(served.get("/v1/deliveries", agent="atlas"))["count"] == 2, "sol's deliveries")
    deliveries = ok(served.get("/v1/deliveries", agent="atlas"))["deliveries"]
    assert {(d["reader"], d["tier"], d["writer"]) for d in deliveries} == {
        ("sol", "long", "atlas"),
        ("sol", "short", "atlas"),
    }
    assert ok(served.get("/v1/deliveries", agent="sol"))["deliveries"] == []  # sol wrote nothing that was read

    updated = ok(served.post("/v1/short", {"agent": "atlas", "key": "shift", "value": "day shift on gate"}))
    time.sleep(0.005)
    ok(served.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": fact}))
    then = ok(served.get("/v1/recall/as_of", agent="sol", as_of=before, q="gate"))
    assert sorted(r["text"] for r in then["results"]) == ["night shift on gate"]  # the forgotten fact never returns
    assert [(r["tier"], r["row_id"]) for r in then["retracted"]] == [("long", fact)]
    now = ok(served.get("/v1/recall/as_of", agent="sol", as_of=solos_store.utc_now(), q="gate"))
    assert [r["text"] for r in now["results"]] == ["day shift on gate"]
    shown = ok(served.get("/v1/recall/as_of", agent="sol", reader="sol", as_of=solos_store.utc_now()))
    # recall showed sol the night shift; as-of's answers are deliveries too, the day shift among them
    assert sorted(r["text"] for r in shown["results"]) == ["day shift on gate", "night shift on gate"]

    def sol_notices() -> list[tuple]:
        found = ok(served.get("/v1/notices", agent="sol"))["notices"]
        return sorted((n["tier"], n["row_id"], n["kind"]) for n in found)

    expected = [("long", fact, "forgotten"), ("short", updated["id"], "superseded")]
    wait_until(lambda: sol_notices() == expected, "sol's two notices")
    opened = ok(served.get("/v1/notices", agent="sol"))["notices"]
    acked = ok(served.post("/v1/notices/ack", {"agent": "sol", "ids": [n["id"] for n in opened]}))
    assert acked["acked"] == 2 and ok(served.get("/v1/notices", agent="sol"))["notices"] == []
    assert ok(served.get("/v1/notices", agent="atlas"))["notices"] == []


def test_readers_notices_are_numbered_in_the_order_they_were_shown_the_row(served):
    """Two readers shown a row, hermes first: PostgreSQL numbered their notices in its DISTINCT's order (atlas's
    first), SQLite in the order of delivery, so the same calls gave each reader another notice id."""
    ok(served.post("/v1/short", {"agent": "nova", "key": "plan", "value": "quartz"}), 201)
    for reader in ("hermes", "atlas"):
        assert [e["row_id"] for e in events(served, reader, 0)["events"]] == [1]
    ok(served.post("/v1/short", {"agent": "nova", "key": "plan", "value": "market"}))
    superseded = {r: ok(served.get("/v1/notices", agent=r))["notices"][0]["id"] for r in ("hermes", "atlas")}
    assert superseded == {"hermes": 1, "atlas": 2}
    for reader in ("hermes", "atlas"):
        ok(served.post("/v1/notices/ack", {"agent": reader, "ids": [superseded[reader]]}))
    assert ok(served.request("DELETE", "/v1/memory", query={"agent": "nova", "tier": "short", "id": 1}))
    forgotten = {r: ok(served.get("/v1/notices", agent=r))["notices"][0]["id"] for r in ("hermes", "atlas")}
    assert forgotten == {"hermes": 3, "atlas": 4}


def test_witnesses_name_the_other_holders_of_a_fact_alike(served):
    fact = "The coolant pump zq7 is rated for 40 bar at the north plant"
    written = long_fact(served, "atlas", fact)
    time.sleep(0.005)
    assert ids(served.recall("sol", "coolant pump zq7")) == [written]  # sol reads it, then echoes it
    wait_until(lambda: ok(served.get("/v1/deliveries", agent="atlas"))["count"], "sol's delivery")
    time.sleep(0.005)
    long_fact(served, "sol", fact.replace("The coolant", "the coolant") + ".")
    long_fact(served, "nova", "At the north plant the coolant pump zq7 is rated for 40 bar")
    (mine,) = ok(served.recall("atlas", "coolant pump zq7", scope="own"))["results"]
    witnesses = {w["agent"]: (w["kind"], w["match"]) for w in mine["witnesses"]}
    assert witnesses == {"sol": ("echo", "token_overlap"), "nova": ("independent", "token_overlap")}
    assert mine["single_source"] is False


# ==== 11. PostgreSQL only: tokens in the database, and the commands that are SQLite's ====


@pytest.mark.slow
def test_tokens_live_in_the_database_and_every_copy_agrees(pg_url, capsys):
    assert solos_memory.main(["token", "atlas", "--db", pg_url]) == 0
    token = capsys.readouterr().out.strip()
    assert re.fullmatch(r"[A-Za-z0-9_-]{40,}", token), token
    copies = [start_server(pg_url), start_server(pg_url)]
    try:
        for copy in copies:
            assert copy.get("/v1/recall", agent="atlas", q="x").status == 401
            wrong = copy.request("GET", "/v1/recall?q=x", headers={"Authorization": "Bearer not-the-token"})
            assert wrong.status == 401
            mine = copy.request("GET", "/v1/recall?q=x", headers={"Authorization": f"Bearer {token}"})
            assert (mine.status, mine.body["agent"]) == (200, "atlas")
        written = copies[0].request(
            "POST", "/v1/long", body={"fact": "written by token"}, headers={"Authorization": f"Bearer {token}"}
        )
        assert (written.status, written.body["agent"]) == (201, "atlas")
        impostor = copies[1].request(
            "POST", "/v1/long", body={"agent": "sol", "fact": "x"}, headers={"Authorization": f"Bearer {token}"}
        )
        assert impostor.status == 403
    finally:
        for copy in copies:
            stop_server(copy)
    hashes = direct(pg_url, "SELECT agent, token_sha256 FROM memory_token")
    assert [h["agent"] for h in hashes] == ["atlas"] and token not in str(hashes)


def test_a_token_issued_while_copies_run_holds_on_every_copy_soon(pg_url, capsys, monkeypatch):
    """A copy started with no token in the database trusts loopback callers; once a token is issued, every copy
    requires tokens within StoredTokens.REREAD_S, and takes the new one; a token revoked goes within it too."""
    import solos_tokens

    monkeypatch.setattr(solos_tokens.StoredTokens, "REREAD_S", 0.2)
    copies = [start_server(pg_url), start_server(pg_url)]
    try:
        assert all(copy.get("/v1/recall", agent="atlas", q="x").status == 200 for copy in copies)
        assert solos_memory.main(["token", "atlas", "--db", pg_url]) == 0
        token = capsys.readouterr().out.strip()
        time.sleep(0.3)
        for copy in copies:
            assert copy.get("/v1/recall", agent="atlas", q="x").status == 401
            mine = copy.request("GET", "/v1/recall?q=x", headers={"Authorization": f"Bearer {token}"})
            assert (mine.status, mine.body["agent"]) == (200, "atlas")
            assert copy.get("/health").body["auth"] == "tokens"
        # Revoked (its row deleted, as the owner does): refused on every copy within the same interval.
        assert solos_memory.main(["token", "atlas", "--db", pg_url]) == 0
        kept = capsys.readouterr().out.strip()
        time.sleep(0.3)
        direct(pg_url, "DELETE FROM memory_token WHERE token_sha256 = ?", (hashlib.sha256(token.encode()).hexdigest(),))
        time.sleep(0.3)
        for copy in copies:
            revoked = copy.request("GET", "/v1/recall?q=x", headers={"Authorization": f"Bearer {token}"})
            assert revoked.status == 401, revoked.body
            mine = copy.request("GET", "/v1/recall?q=x", headers={"Authorization": f"Bearer {kept}"})
            assert (mine.status, mine.body["agent"]) == (200, "atlas")
    finally:
        for copy in copies:
            stop_server(copy)


@pytest.mark.parametrize(
    "command",
    [["snapshot"], ["restore", "/nonexistent/snapshot.db"], ["import-qdrant", "--qdrant-path", "/nonexistent"]],
)
def test_snapshot_restore_and_the_qdrant_import_refuse_a_postgresql_url_in_one_line(command):
    """They refuse before connecting: no server is needed to be told so."""
    with pytest.raises(SystemExit) as refused:
        solos_memory.main([*command, "--db", "postgresql://solos@127.0.0.1:1/nowhere"])
    message = str(refused.value.code)
    assert message.startswith(f"{command[0]} works on SQLite only") and "pg_dump" in message, message
    assert "\n" not in message


def test_a_read_alone_on_postgresql_is_no_transaction_and_sees_each_commit(pg_url):
    """read_alone skips BEGIN and COMMIT (two round trips of a thread's look every 0.1 s): each statement is its
    own snapshot, so a commit between two of them is seen by the second, as read's one snapshot would not."""
    import psycopg

    import solos_store_pg

    store = solos_store_pg.PgStore(pg_url, admin=True)
    store.migrate()
    idle, in_transaction = psycopg.pq.TransactionStatus.IDLE, psycopg.pq.TransactionStatus.INTRANS

    def around_a_commit(conn: Any) -> tuple[Any, int, int]:
        status = conn.info.transaction_status
        before = conn.execute("SELECT count(*) FROM agent_registry").fetchone()[0]
        with psycopg.connect(pg_url, autocommit=True) as other:
            other.execute("INSERT INTO agent_registry (agent) VALUES (%s)", (f"agent-{time.monotonic_ns()}",))
        return status, before, conn.execute("SELECT count(*) FROM agent_registry").fetchone()[0]

    try:
        status, before, after = store.read_alone(around_a_commit)
        assert status == idle and after == before + 1
        status, before, after = store.read(around_a_commit)
        assert status == in_transaction and after == before
    finally:
        store.close()


def test_forgetting_an_episode_imported_from_a_private_point_queues_the_points_delete(served, store_url):
    """On PostgreSQL too (a database migrated from SQLite keeps what import-qdrant recorded): the forget queues the
    point's delete and its receipt says no mirror will send it here."""
    episode = ok(served.post("/v1/episodic", {"agent": "sol", "event_type": "note", "summary": "a private note"}), 201)
    with fleet_writer(store_url) as conn:
        conn.execute(
            "INSERT INTO qdrant_import (collection, point_id, content_sha256, row_id, reason) "
            "VALUES ('long_term', '41', 'ab12', ?, 'imported_private')",
            (episode["id"],),
        )
    receipt = ok(
        served.request("DELETE", "/v1/memory", query={"agent": "sol", "tier": "episodic", "id": episode["id"]})
    )
    assert receipt["mirror"] == "no_mirror_configured", receipt
    with fleet_writer(store_url) as conn:
        assert [tuple(r) for r in conn.execute("SELECT point_id, reason FROM qdrant_import")] == [
            ("41", "forget_pending")
        ]
    assert served.get("/v1/stats").body["qdrant"]["backlog"] == 1


def test_forgetting_a_fact_imported_from_qdrant_queues_its_points_delete(served, store_url):
    """No mirror ever ran (no outbox triggers; on PostgreSQL never any): the forget still queues the delete of the
    point the fact came from, and says no mirror sends it. A queued episode's entry of the same id is not the fact's."""
    fact = "the old node's backup key is periwinkle-4417"
    row = ok(served.post("/v1/long", {"agent": "atlas", "fact": fact}), 201)["id"]
    plain = ok(served.post("/v1/long", {"agent": "atlas", "fact": "a fact of the service's own"}), 201)["id"]
    with fleet_writer(store_url) as conn:  # as import-qdrant recorded them: a fact, and a forgotten episode's point
        conn.execute(
            "INSERT INTO qdrant_import (collection, point_id, content_sha256, row_id, reason) VALUES "
            "('long_term', '51', ?, ?, NULL), ('long_term', '61', 'cd34', ?, 'forget_pending')",
            (hashlib.sha256(fact.encode()).hexdigest(), row, plain),
        )
    receipt = ok(served.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": row}))
    assert receipt["mirror"] == "no_mirror_configured", receipt
    receipt = ok(served.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": plain}))
    assert receipt["mirror"] == "none", receipt
    with fleet_writer(store_url) as conn:
        queued = [tuple(r) for r in conn.execute("SELECT point_id, reason FROM qdrant_import ORDER BY point_id")]
    assert queued == [("51", "forget_pending"), ("61", "forget_pending")]
    assert served.get("/v1/stats").body["qdrant"]["backlog"] == 2
    # The writer keeps the same words in another row (a fleet writer's duplicate): the point stays, as that row's.
    with fleet_writer(store_url) as conn:
        first = conn.execute("INSERT INTO memory_longterm (agent, fact) VALUES ('nova', 'twice') RETURNING id")
        first = first.fetchone()[0]
        twin = conn.execute("INSERT INTO memory_longterm (agent, fact) VALUES ('nova', 'twice') RETURNING id")
        twin = twin.fetchone()[0]
        conn.execute(
            "INSERT INTO qdrant_import (collection, point_id, content_sha256, row_id, reason) "
            "VALUES ('long_term', '71', ?, ?, NULL)",
            (hashlib.sha256(b"twice").hexdigest(), first),
        )
    receipt = ok(served.request("DELETE", "/v1/memory", query={"agent": "nova", "tier": "long", "id": first}))
    assert receipt["mirror"] == "none", receipt
    with fleet_writer(store_url) as conn:
        kept = conn.execute("SELECT row_id, reason FROM qdrant_import WHERE point_id = '71'").fetchone()
    assert tuple(kept) == (twin, None)
