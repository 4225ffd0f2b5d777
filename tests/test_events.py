"""Events: GET /v1/events as Server-Sent Events and read_events by id, filtered as recall is (removals too)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import pytest
from conftest import Stream, direct, events_settled, fleet_writer, start_server, stop_server, subscribed, wait_until

import solos_events
import solos_memory
import solos_store
import solos_workers

WAIT_S = 5.0


def read_events(server, transport: str = "rest", **args) -> dict:
    if transport == "rest":
        query = {k: ",".join(v) if isinstance(v, list) else v for k, v in args.items()}
        reply = server.get("/v1/events", **query)
        return {"status": reply.status, **(reply.body or {})}
    result = server.mcp_tool("read_events", args).body["result"]
    return {"status": result["structuredContent"].get("error", {}).get("status", 200), **result["structuredContent"]}


@pytest.mark.slow
def test_a_stream_sees_writes_updates_direct_inserts_forgets_and_expiry_as_they_commit(server, streams):
    stream = subscribed(streams(server, {"agent": "sol", "tiers": "long,short,episodic"}))
    fact = server.post("/v1/long", {"agent": "atlas", "topic": "t", "fact": "the lab door code changed"}).body["id"]
    server.post("/v1/long", {"agent": "atlas", "topic": "t", "fact": "the lab door code changed", "confidence": 0.4})
    with server.db() as conn:  # one of the fleet's other writers, straight into solos.db
        direct = conn.execute(
            "INSERT INTO memory_longterm (agent, topic, fact) "
            "VALUES ('nova', 't', 'written around the service') RETURNING id"
        ).fetchone()[0]
    short = server.post("/v1/short", {"agent": "atlas", "key": "blink", "value": "gone soon", "ttl_s": 1.5}).body["id"]
    # The hub renders a write only while its row exists: let it see them (it may lag on a loaded runner).
    got = stream.events(4, timeout=WAIT_S)
    assert server.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": fact}).status == 200
    got += stream.events(2, timeout=WAIT_S + solos_events.SWEEP_S)
    assert [(e["kind"], e["tier"], e["row_id"], e["agent"]) for e in got] == [
        ("write", "long", fact, "atlas"),
        ("update", "long", fact, "atlas"),
        ("write", "long", direct, "nova"),
        ("write", "short", short, "atlas"),
        ("forget", "long", fact, "atlas"),
        ("notice", "notice", 1, "sol"),  # the stream handed sol the fact: a retraction notice follows
    ]
    assert got[5]["notice"] == {**got[5]["notice"], "tier": "long", "row_id": fact, "kind": "forgotten"}
    assert got[0]["row"]["text"] == "the lab door code changed" and got[0]["foreign"] is True
    assert got[1]["row"]["confidence"] == 0.4 and got[4]["row"] is None
    assert [e["id"] for e in got] == sorted(e["id"] for e in got)
    (expired,) = stream.events(1, timeout=WAIT_S + solos_events.SWEEP_S)
    assert (expired["kind"], expired["tier"], expired["row_id"], expired["row"]) == ("expire", "short", short, None)
    # purge deleting the already-reported row is no second event
    assert server.server.memory.store.purge_expired() == 1
    assert stream.quiet(0.5) == []


@pytest.mark.parametrize("transport", ["rest", "mcp"])
def test_read_events_filters_by_scope_writers_tags_and_words(server, transport):
    server.post("/v1/long", {"agent": "atlas", "fact": "atlas likes green tea", "tags": ["preference"]})
    server.post("/v1/long", {"agent": "sol", "fact": "sol likes black coffee", "tags": ["preference"]})
    server.post("/v1/long", {"agent": "sol", "fact": "sol fixed the coffee machine", "tags": ["ops"]})
    server.post("/v1/short", {"agent": "hermes", "key": "mood", "value": "coffee please"})

    def texts(**args) -> list[str]:
        answer = read_events(server, transport, agent="atlas", since=0, **args)
        assert answer["status"] == 200, answer
        return [e["row"]["text"] for e in answer["events"]]

    assert texts() == [
        "atlas likes green tea",
        "sol likes black coffee",
        "sol fixed the coffee machine",
        "coffee please",
    ]
    assert texts(scope="own") == ["atlas likes green tea"]
    assert texts(scope="shared_except_self", tiers=["long"]) == [
        "sol likes black coffee",
        "sol fixed the coffee machine",
    ]
    assert texts(writers=["hermes"]) == ["coffee please"]
    assert texts(tags=["preference"]) == ["atlas likes green tea", "sol likes black coffee"]
    assert texts(q="coffee machines") == ["sol likes black coffee", "sol fixed the coffee machine", "coffee please"]
    assert texts(q="machine", tags=["ops"]) == ["sol fixed the coffee machine"]
    assert texts(q="!!!") == []
    paged = read_events(server, transport, agent="atlas", since=0, limit=2)
    assert [e["row"]["text"] for e in paged["events"]] == ["atlas likes green tea", "sol likes black coffee"]
    rest = read_events(server, transport, agent="atlas", since=paged["next_since"])
    assert [e["row"]["text"] for e in rest["events"]] == ["sol fixed the coffee machine", "coffee please"]
    assert rest["gap"] is None and rest["retention_s"] == solos_events.EVENT_RETENTION_S


def test_rest_and_mcp_read_events_agree(server):
    server.post("/v1/long", {"agent": "atlas", "fact": "one fact"})
    server.post("/v1/episodic", {"agent": "sol", "event_type": "t", "summary": "an episode"})
    answers = {}
    for args in ({"agent": "atlas", "since": 0}, {"agent": "sol", "tiers": ["episodic"]}, {"agent": "nobody"}):
        rest, mcp = read_events(server, "rest", **args), read_events(server, "mcp", **args)
        assert rest == mcp
        answers[args["agent"]] = rest
    # Agreeing on nothing would agree too: each read found what it should.
    assert "one fact" in [e["row"]["text"] for e in answers["atlas"]["events"]]
    assert [e["row"]["text"] for e in answers["sol"]["events"]] == ["an episode"]
    assert answers["nobody"]["status"] == 422


@pytest.mark.slow
def test_episodic_events_need_the_authors_opt_in_and_every_delivery_is_audited(server, streams):
    stream = subscribed(streams(server, {"agent": "sol", "tiers": "episodic"}))
    server.post("/v1/episodic", {"agent": "atlas", "event_type": "t", "summary": "private episode"})
    mine = server.post("/v1/episodic", {"agent": "sol", "event_type": "t", "summary": "my own episode"}).body["id"]
    (own,) = stream.events(1)
    assert (own["row_id"], own["foreign"]) == (mine, False)
    assert stream.quiet(0.3) == []
    server.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True})
    shared = server.post("/v1/episodic", {"agent": "atlas", "event_type": "t", "summary": "shared episode"}).body["id"]
    (event,) = stream.events(1)
    assert (event["row_id"], event["row"]["text"], event["foreign"]) == (shared, "shared episode", True)
    reads = server.get("/v1/audit", agent="atlas").body["reads"]
    assert [(r["reader"], r["author"], r["row_id"]) for r in reads] == [("sol", "atlas", shared)]
    # The by-id read applies the same rule, and audits too (the private one stays hidden: opt-in is checked now).
    polled = read_events(server, "mcp", agent="sol", tiers=["episodic"], since=0)
    assert [e["row"]["text"] for e in polled["events"] if e["foreign"]] == ["private episode", "shared episode"]
    server.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": False})
    assert [e["foreign"] for e in read_events(server, agent="sol", tiers=["episodic"], since=0)["events"]] == [False]
    assert len(server.get("/v1/audit", agent="atlas").body["reads"]) == 3


def test_a_stream_hands_out_no_unaudited_episode(server, streams):
    server.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True})
    stream = subscribed(streams(server, {"agent": "sol", "tiers": "episodic"}))
    with server.db() as conn:  # the audit table cannot take rows
        conn.execute(
            "CREATE TRIGGER refuse_audit BEFORE INSERT ON episodic_read_audit BEGIN SELECT RAISE(ABORT, 'no'); END"
        )
    server.post("/v1/episodic", {"agent": "atlas", "event_type": "t", "summary": "needs an audit"})
    message = stream.next()
    assert message is not None and message.get("event") == "error", message
    assert stream.closed.wait(WAIT_S)
    assert "needs an audit" not in json.dumps(message)


@pytest.mark.slow
def test_durable_events_reach_only_their_own_agent_and_others_durable_is_403(server, streams):
    mine = subscribed(streams(server, {"agent": "atlas", "tiers": "durable"}))
    with server.db() as conn:
        conn.execute("INSERT INTO memory_durable (key, value) VALUES ('persona/sol', 'sol is careful')")
        conn.execute("INSERT INTO memory_durable (key, value) VALUES ('persona/atlas', 'atlas is bold')")
    (event,) = mine.events(1)
    assert (event["tier"], event["agent"], event["row"]["text"]) == ("durable", "atlas", "atlas is bold")
    assert mine.quiet(0.3) == []
    refused = streams(server, {"agent": "atlas", "tiers": "durable", "scope": "shared_except_self"})
    assert refused.status == 403 and refused.body["error"]["field"] == "tiers"
    for transport in ("rest", "mcp"):
        answer = read_events(server, transport, agent="atlas", tiers=["durable"], scope="shared_except_self")
        assert answer["status"] == 403
    polled = read_events(server, agent="sol", tiers=["durable"], since=0)
    assert [e["row"]["text"] for e in polled["events"]] == ["sol is careful"]


@pytest.mark.slow
def test_scope_applies_to_streams(server, streams):
    own = subscribed(streams(server, {"agent": "sol", "scope": "own"}))
    others = subscribed(streams(server, {"agent": "sol", "scope": "shared_except_self"}))
    server.post("/v1/long", {"agent": "atlas", "fact": "from atlas"})
    server.post("/v1/long", {"agent": "sol", "fact": "from sol"})
    assert [e["row"]["text"] for e in own.events(1)] == ["from sol"]
    assert [e["row"]["text"] for e in others.events(1)] == ["from atlas"]
    assert own.quiet(0.3) == [] and others.quiet(0.1) == []


def test_a_stream_resumes_from_last_event_id_and_says_when_a_gap_was_pruned(server, streams):
    first = subscribed(streams(server, {"agent": "sol", "since": 0}))
    server.post("/v1/long", {"agent": "atlas", "fact": "before the break"})
    (seen,) = first.events(1)
    first.close()
    server.post("/v1/long", {"agent": "atlas", "fact": "missed one"})
    server.post("/v1/long", {"agent": "atlas", "fact": "missed two"})
    again = subscribed(streams(server, {"agent": "sol", "since": 0}, {"Last-Event-ID": str(seen["id"])}))
    assert [e["row"]["text"] for e in again.events(2)] == ["missed one", "missed two"]
    bad = streams(server, {"agent": "sol"}, {"Last-Event-ID": "yesterday"})
    assert bad.status == 400 and bad.body["error"]["field"] == "Last-Event-ID"

    with server.db() as conn:  # age the first two events past the retention window, then let the service prune
        conn.execute("UPDATE memory_event SET ts = '2000-01-01T00:00:00.000Z' WHERE id <= ?", (seen["id"] + 1,))
    assert server.server.memory.events.prune() == 2
    answer = read_events(server, agent="sol", since=0)
    assert answer["gap"]["from"] == 1 and answer["gap"]["through"] == seen["id"] + 1
    assert "pruned" in answer["gap"]["message"] and [e["row"]["text"] for e in answer["events"]] == ["missed two"]
    late = streams(server, {"agent": "sol"}, {"Last-Event-ID": "0"})
    message = late.next(skip_comments=False)
    while "event" not in message:
        message = late.next(skip_comments=False)
    assert message["event"] == "gap" and message["data"]["through"] == seen["id"] + 1
    assert [e["row"]["text"] for e in late.events(1)] == ["missed two"]


def test_heartbeats_carry_the_last_examined_id(server, streams):
    server.server.memory.events.heartbeat_s = 0.2
    stream = subscribed(streams(server, {"agent": "sol", "writers": "hermes"}))
    server.post("/v1/long", {"agent": "atlas", "fact": "filtered out"})
    with server.db() as conn:
        head = conn.execute("SELECT max(id) FROM memory_event").fetchone()[0]
    beats: list[int] = []

    def heartbeat_at_head() -> bool:
        message = stream.next(1.0, skip_comments=False)
        if message is not None and message.get("comment") == "heartbeat":
            beats.append(int(message["id"]))
        return head in beats

    wait_until(heartbeat_at_head, "a heartbeat carrying the id of the write the filter left out", WAIT_S)
    assert beats == sorted(beats) and max(beats) == head, beats


def test_subscribers_are_capped_with_a_503_and_do_not_take_connection_slots(server, streams):
    hub = server.server.memory.events
    hub.max_subscribers = 2
    free = server.server.slots._value
    streams_open = [subscribed(streams(server, {"agent": "sol"})) for _ in range(2)]
    assert server.server.slots._value == free  # each stream gave its connection slot back
    refused = streams(server, {"agent": "sol"})
    assert refused.status == 503 and refused.body["error"]["code"] == "busy"
    assert refused.response.getheader("Retry-After") == "1"
    server.server.evict(0)  # every waiting connection goes; a stream is never waiting, eviction passes it by
    assert server.post("/v1/long", {"agent": "atlas", "fact": "still flowing"}).status == 201
    for stream in streams_open:
        assert [e["row"]["text"] for e in stream.events(1)] == ["still flowing"]
    streams_open[0].close()
    deadline = time.monotonic() + WAIT_S
    while len(hub.subscribers) > 1 and time.monotonic() < deadline:  # writing to it finds the client gone
        server.post(
            "/v1/short", {"agent": "atlas", "key": "nudge", "value": str(time.monotonic())}
        )  # finds the dead socket
        time.sleep(0.05)
    assert subscribed(streams(server, {"agent": "sol"})).status == 200


@pytest.mark.slow
def test_a_slow_consumer_is_dropped_and_writers_never_wait(server, monkeypatch):
    monkeypatch.setattr(solos_events, "SUBSCRIBER_BUFFER", 8)
    hub = server.server.memory.events
    slow = socket.create_connection(("127.0.0.1", server.port))
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.sendall(
        f"GET /v1/events?agent=sol HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    deadline = time.monotonic() + WAIT_S
    while not hub.subscribers and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hub.subscribers
    padding = "x" * 8000
    for n in range(200):  # never read by the slow client
        assert server.post("/v1/long", {"agent": "atlas", "fact": f"fact {n} {padding}"}).status == 201
    while hub.subscribers and time.monotonic() < deadline + WAIT_S:
        time.sleep(0.05)
    assert not hub.subscribers and hub.counters["dropped"] == 1
    slow.settimeout(WAIT_S)  # the service cut the stream: reading ends (or is reset), it does not time out
    with contextlib.suppress(ConnectionResetError):
        while slow.recv(65536):
            pass
    slow.close()


def test_openapi_lists_the_new_routes_with_the_stream(server):
    paths = server.get("/openapi.json").body["paths"]
    assert "delete" in paths["/v1/memory"]
    assert set(paths["/v1/events"]["get"]["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert solos_memory.OPERATIONS["read_events"].path == "/v1/events"


def test_with_tokens_the_token_decides_who_subscribes(make_server, tmp_path, streams):
    import hashlib

    tokens = tmp_path / "tokens"
    tokens.write_text(f"{hashlib.sha256(b'sol-token').hexdigest()} sol\n")
    tokens.chmod(0o600)
    server = make_server("tokens.db", tokens_file=str(tokens))
    anonymous = streams(server, {"agent": "sol"})
    assert anonymous.status == 401
    impostor = streams(server, {"agent": "atlas"}, {"Authorization": "Bearer sol-token"})
    assert impostor.status == 403 and impostor.body["error"]["field"] == "agent"
    stream = subscribed(streams(server, {"scope": "own"}, {"Authorization": "Bearer sol-token"}))
    assert (
        server.post(
            "/v1/short", {"key": "k", "value": "by token"}, headers={"Authorization": "Bearer sol-token"}
        ).status
        == 201
    )
    (event,) = stream.events(1)
    assert (event["agent"], event["foreign"], event["row"]["value"]) == ("sol", False, "by token")


def test_a_stream_ends_when_its_token_is_revoked(token_server, streams):
    """The token decides the caller for as long as a stream lasts, not only when it opens: once the operator
    removes the line, the stream hands out nothing more and ends saying why."""
    server, sol = token_server, {"Authorization": "Bearer sol-token"}
    stream = subscribed(streams(server, {"scope": "shared"}, sol))
    atlas = {"Authorization": "Bearer atlas-token"}
    assert server.post("/v1/long", {"fact": "written while sol may read"}, headers=atlas).status == 201
    assert [e["row"]["text"] for e in stream.events(1)] == ["written while sol may read"]
    tokens = server.server.config.tokens_file
    kept = [line for line in open(tokens).read().splitlines() if not line.endswith(" sol")]
    with open(tokens, "w") as handle:  # sol's token revoked (the file keeps its mode 600)
        handle.write("\n".join(kept) + "\n")
    assert server.request("GET", "/v1/audit", query={"limit": 1}, headers=sol).status == 401
    assert server.post("/v1/long", {"fact": "written after the revocation"}, headers=atlas).status == 201
    message = stream.next(timeout=WAIT_S)
    assert message is not None and message.get("event") == "error", message
    assert "written after the revocation" not in json.dumps(message)
    assert stream.closed.wait(WAIT_S)
    assert stream.quiet(0.2) == []
    server.server.memory.events.heartbeat_s = 0.2  # an idle stream ends at its next heartbeat
    idle = subscribed(streams(server, {"scope": "shared"}, atlas))
    with open(tokens, "w") as handle:
        handle.write("# every token revoked\n")
    message = idle.next(timeout=WAIT_S)
    assert message is not None and message.get("event") == "error", message
    assert idle.closed.wait(WAIT_S)


# ---- each agent's share of streams ----


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


# ---- removals follow the stream filters ----


def forget(server, agent: str, tier: str, row_id: int):
    return server.request("DELETE", "/v1/memory", query={"agent": agent, "tier": tier, "id": row_id})


def changes(stream, count: int, timeout: float = 5.0) -> list[dict]:
    """The next `count` change events of a stream; retraction notices (they reach an agent's stream
    whatever its filter) are left aside."""
    found: list[dict] = []
    while len(found) < count:
        (event,) = stream.events(1, timeout=timeout)
        if event["kind"] != "notice":
            found.append(event)
    return found


def test_removals_reach_only_the_streams_whose_filters_the_row_matched(server):
    tagged = subscribed(Stream(server, {"agent": "nova", "tags": "preference", "tiers": "long,short"}))
    worded = subscribed(Stream(server, {"agent": "nova", "q": "coffee", "tiers": "long,short"}))
    everything = subscribed(Stream(server, {"agent": "nova", "tiers": "long,short"}))
    try:
        liked = server.post("/v1/long", {"agent": "atlas", "fact": "likes green tea", "tags": ["preference"]})
        plain = server.post("/v1/long", {"agent": "atlas", "fact": "the build broke at noon"})
        brewed = server.post("/v1/long", {"agent": "sol", "fact": "sol brews coffee at nine"})
        server.post("/v1/short", {"agent": "sol", "key": "k", "value": "untagged note", "ttl_s": 0.5})
        cup = server.post("/v1/short", {"agent": "sol", "key": "cup", "value": "coffee cup", "tags": ["preference"]})
        assert [e["kind"] for e in changes(tagged, 2)] == ["write", "write"]
        assert [e["kind"] for e in changes(worded, 2)] == ["write", "write"]
        assert len(changes(everything, 5)) == 5
        assert forget(server, "atlas", "long", plain.body["id"]).status == 200
        assert forget(server, "atlas", "long", liked.body["id"]).status == 200
        assert forget(server, "sol", "long", brewed.body["id"]).status == 200
        assert server.request("DELETE", "/v1/short", query={"agent": "sol", "key": "cup"}).status == 200
        removals = [(e["kind"], e["tier"], e["row_id"]) for e in changes(everything, 5, timeout=8)]
        assert sorted(kind for kind, _, _ in removals) == ["delete", "expire", "forget", "forget", "forget"]
        assert [(e["kind"], e["row_id"]) for e in changes(tagged, 2)] == [
            ("forget", liked.body["id"]),
            ("delete", cup.body["id"]),
        ]
        assert [(e["kind"], e["row_id"]) for e in changes(worded, 2)] == [
            ("forget", brewed.body["id"]),
            ("delete", cup.body["id"]),
        ]
        quiet = [m["data"]["kind"] for m in tagged.quiet(0.5) + worded.quiet(0.1)]
        assert set(quiet) <= {"notice"}  # not the untagged forget, nor the expiry
    finally:
        for stream in (tagged, worded, everything):
            stream.close()
    polled = server.get("/v1/events", agent="nova", since=0, tags="preference", tiers="long,short").body
    assert [(e["kind"], e["row_id"]) for e in polled["events"] if e["kind"] != "notice"] == [
        ("forget", liked.body["id"]),
        ("delete", cup.body["id"]),
    ]


def test_a_filtered_stream_hears_of_the_removal_of_a_row_written_before_it_opened(server):
    """A removal reaches a filtered stream if the row matched the filter when the service removed it. The filter
    was registered only when a batch of events first reached the stream: a row written before it opened (its
    client had recalled it) and deleted before any other event came was not matched, and the stream never heard
    of the delete."""
    word = f"zq{time.monotonic_ns()}"
    mug = server.post("/v1/short", {"agent": "sol", "key": word, "value": f"the {word} espresso mug"})
    stream = subscribed(Stream(server, {"agent": "nova", "q": word, "tiers": "short"}))
    try:
        assert server.request("DELETE", "/v1/short", query={"agent": "sol", "key": word}).status == 200
        assert [(e["kind"], e["row_id"]) for e in changes(stream, 1)] == [("delete", mug.body["id"])]
    finally:
        stream.close()


def test_a_sweep_of_10000_rows_matches_the_stream_filters_without_holding_the_write_lock_long(tmp_path):
    """A removal is matched against every filter in the removing transaction, the database's write lock held.
    Each `q` asked FTS5 for the removed ids one by one (`rowid IN` a list): 0.1 s a filter for an expiry sweep
    of 10,000 rows, 25 s under 256 filters (with workers, every worker's), every write of the fleet refused as
    busy meanwhile. What a filter matched is the same either way."""
    running = start_server(tmp_path / "solos.db")
    try:
        hub, store = running.server.memory.events, running.server.memory.store
        keys = [
            hub.content_filter(
                solos_events.Pattern("sol", "shared", ("short",), (), ("ops",) * (n % 2), f"zw{n}", f'"zw{n}"')
            )
            for n in range(20)
        ]
        with fleet_writer(str(tmp_path / "solos.db")) as conn:
            conn.executemany(
                "INSERT INTO memory_short (agent, key, value, tags, expires_at) VALUES (?, ?, ?, ?, ?)",
                [
                    ("sol", f"k{n}", f"the zw{n % 40} note", '["ops"]' if n % 3 else None, "2030-01-01T00:00:00.000Z")
                    for n in range(10_000)
                ],
            )
        ids = [row[0] for row in store.read(lambda conn: conn.execute("SELECT id FROM memory_short").fetchall())]
        started = time.monotonic()
        store.write(lambda conn: hub.note_removal(conn, "short", ids))
        took = time.monotonic() - started
        values = dict(store.read(lambda conn: conn.execute("SELECT id, value FROM memory_short").fetchall()))
        tagged = {row_id for row_id, in store.read(lambda conn: conn.execute(
            "SELECT id FROM memory_short WHERE tags IS NOT NULL").fetchall())}  # fmt: skip
        for n, key in enumerate(keys):
            expected = {i for i in ids if values[i] == f"the zw{n} note" and (n % 2 == 0 or i in tagged)}
            assert {row_id for _, row_id in hub.matched[key]} == expected, n
        assert took < 1.0, took  # was 2 s and more (20 filters), 0.05 s now
    finally:
        stop_server(running)


class CountingEvent(threading.Event):
    """An Event that counts its set() calls: who woke the hub's thread."""

    def __init__(self) -> None:
        super().__init__()
        self.sets = 0

    def set(self) -> None:
        self.sets += 1
        super().set()


def test_a_write_wakes_the_hub_only_while_someone_subscribes(server, streams):
    """With no stream there is nothing a write changes for the hub's thread (its sweeps keep their own clock), and
    waking it put a thread switch in every write's path; with one, the write is on the stream at once."""
    hub = server.server.memory.events
    hub.wakeup = counted = CountingEvent()
    for n in range(3):
        assert server.post("/v1/long", {"agent": "atlas", "fact": f"written to no stream {n}"}).status == 201
    assert counted.sets == 0
    hub.poll_s = 60.0  # only the write's wake can bring it to the stream in time
    stream = subscribed(streams(server, {"agent": "sol", "tiers": "long"}))
    before = counted.sets  # subscribing woke it
    fact = server.post("/v1/long", {"agent": "atlas", "fact": "written to a stream"}).body["id"]
    (seen,) = stream.events(1, timeout=WAIT_S)
    assert seen["row_id"] == fact and counted.sets > before


def test_the_hub_looks_for_other_copies_forgets_every_poll_only_while_it_streams(server, streams):
    """A recall looks for another copy's forget itself before it reads; the hub's own look (a round trip on
    PostgreSQL, once each poll that a write woke) matters to what streams hand out, so without one it looks every
    sweep, and drops the encoded events it kept for streams."""
    hub = server.server.memory.events
    hub.wire[(1, False)] = ({}, b"data: an encoded event\n\n")
    assert hub.forget_check_s() == solos_events.SWEEP_S and hub.wire == {}
    subscribed(streams(server, {"agent": "sol", "tiers": "long"}))
    assert hub.forget_check_s() == hub.poll_s


def stalled_stream(hub, subscriber) -> tuple[list[bytes], threading.Event, threading.Event]:
    """The subscriber's stream, whose socket fills on the send of "first one": what it wrote, the event set when
    it stalls, and the one that lets it go on."""
    written: list[bytes] = []
    stuck, release = threading.Event(), threading.Event()

    def write(data: bytes) -> None:
        written.append(data)
        if b"first one" in data:  # the socket fills on this send: the stream waits here
            stuck.set()
            release.wait(WAIT_S)

    threading.Thread(target=hub.stream, args=(subscriber, None, write, b""), daemon=True).start()
    wait_until(lambda: written, "the stream's head")
    return written, stuck, release


@pytest.mark.parametrize("meanwhile", ["forget", "unshare"])
def test_a_stream_behind_its_queue_never_hands_out_a_row_it_may_no_longer_see(server, meanwhile):
    """A write is shown "as the row is when delivered, skipped if the row is gone by then": a stream stuck on a
    slow socket while its queue fills must not hand out, later, a row forgotten (or an episode its author stopped
    sharing) in the meantime."""
    hub = server.server.memory.events
    subscriber = hub.subscribe(solos_events.Pattern("sol", "shared", ("long", "episodic")), None)
    written, stuck, release = stalled_stream(hub, subscriber)
    assert server.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True}).status == 201
    tier, path = ("long", "/v1/long") if meanwhile == "forget" else ("episodic", "/v1/episodic")
    text = {"long": "fact", "episodic": "summary"}[tier]
    body = {"agent": "atlas", "event_type": "t"} if tier == "episodic" else {"agent": "atlas"}
    server.post(path, {**body, text: "the first one"})
    assert stuck.wait(WAIT_S)
    doomed = server.post(path, {**body, text: "the doomed one"}).body["id"]
    wait_until(lambda: subscriber.queue.qsize() >= 1, "the doomed row queued")
    if meanwhile == "forget":
        query = {"agent": "atlas", "tier": tier, "id": doomed}
        assert server.request("DELETE", "/v1/memory", query=query).status == 200
    else:
        assert server.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": False}).status == 200
    time.sleep(solos_events.RECHECK_AFTER_S + 0.1)
    release.set()
    with server.db() as conn:
        head = conn.execute("SELECT max(id) FROM memory_event").fetchone()[0]
    wait_until(lambda: f"id: {head}\n".encode() in b"".join(written), "the stream past the doomed row")
    subscriber.drop("test over")
    hub.unsubscribe(subscriber)
    assert b"doomed one" not in b"".join(written)


def test_a_queued_short_row_that_expires_before_it_is_sent_is_not_sent(server, monkeypatch):
    """A short row read live by the hub and queued, then held up behind a slow send past its expiry, went out
    (only a write queued RECHECK_AFTER_S ago was read again): the subscriber was handed a row recall already
    refused. A queued row whose expiry has come is read again first, and skipped (its `expire` follows)."""
    monkeypatch.setattr(solos_events, "RECHECK_AFTER_S", 5.0)  # any hold-up shorter than the recheck
    hub = server.server.memory.events
    subscriber = hub.subscribe(solos_events.Pattern("sol", "shared", ("short",)), None)
    written, stuck, release = stalled_stream(hub, subscriber)
    server.post("/v1/short", {"agent": "atlas", "key": "a", "value": "the first one"})
    assert stuck.wait(WAIT_S)
    doomed = server.post("/v1/short", {"agent": "atlas", "key": "b", "value": "the doomed one", "ttl_s": 0.5}).body
    wait_until(lambda: subscriber.queue.qsize() >= 1, "the doomed row queued")
    time.sleep(0.6)
    assert doomed["expires_at"] < solos_store.utc_now()
    release.set()
    wait_until(lambda: b'"kind": "expire"' in b"".join(written), "the doomed row's expiry")
    subscriber.drop("test over")
    hub.unsubscribe(subscriber)
    assert b"doomed one" not in b"".join(written)


def test_a_removal_of_an_episode_made_while_its_author_did_not_share_reaches_no_one_else(server):
    """Events are filtered at read time; an episode forgotten while private must not turn up, as a bare removal
    naming it, for readers who catch up after its author opted in to sharing."""
    private = server.post("/v1/episodic", {"agent": "atlas", "event_type": "t", "summary": "kept to myself"}).body
    forget = {"agent": "atlas", "tier": "episodic", "id": private["id"]}
    assert server.request("DELETE", "/v1/memory", query=forget).status == 200
    assert server.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True}).status == 201
    shared = server.post("/v1/episodic", {"agent": "atlas", "event_type": "t", "summary": "told to all"}).body
    assert server.request("DELETE", "/v1/memory", query={**forget, "id": shared["id"]}).status == 200
    for transport in ("rest", "mcp"):
        answer = read_events(server, transport, agent="sol", tiers=["episodic"], since=0)
        assert [(e["kind"], e["row_id"]) for e in answer["events"]] == [("forget", shared["id"])], answer["events"]
    own = read_events(server, agent="atlas", tiers=["episodic"], since=0)["events"]
    assert [(e["kind"], e["row_id"]) for e in own if e["kind"] == "forget"] == [
        ("forget", private["id"]),
        ("forget", shared["id"]),
    ]


def test_a_durable_event_never_renders_another_agents_persona_in_its_row(server):
    """An event names persona/<agent> by row id: if that id now holds another agent's persona (the fleet renamed
    the key, or deleted it and its id went to the next persona), the event's agent must not be shown it."""
    with server.db() as conn:
        renamed = conn.execute(
            "INSERT INTO memory_durable (key, value) VALUES ('persona/atlas', 'atlas is bold') RETURNING id"
        ).fetchone()[0]
        conn.execute("UPDATE memory_durable SET key = 'persona/sol', value = 'sol is careful' WHERE id = ?", (renamed,))
        reused = conn.execute(
            "INSERT INTO memory_durable (key, value) VALUES ('persona/atlas', 'atlas again') RETURNING id"
        ).fetchone()[0]
        conn.execute("DELETE FROM memory_durable WHERE id = ?", (reused,))
        nova = conn.execute(
            "INSERT INTO memory_durable (key, value) VALUES ('persona/nova', 'nova keeps secrets') RETURNING id"
        ).fetchone()[0]
    assert nova == reused  # the fleet's table keeps no id marks: SQLite handed the deleted id on
    for transport in ("rest", "mcp"):
        answer = read_events(server, transport, agent="atlas", tiers=["durable"], since=0)
        shown = json.dumps(answer["events"])
        assert "sol is careful" not in shown and "nova keeps secrets" not in shown, answer["events"]
        assert [(e["kind"], e["row"]) for e in answer["events"]] == [("delete", None)]
    sol = read_events(server, agent="sol", tiers=["durable"], since=0)["events"]
    assert [e["row"]["text"] for e in sol] == ["sol is careful"]


@pytest.mark.parametrize("resume", ["9" * 40, str(2**63), "\u00b2", "\u00b9\u00b2"])
def test_a_last_event_id_no_event_could_have_is_a_400_naming_the_header(server, streams, resume):
    """Superscript digits pass str.isdigit and numbers past 64 bits pass the header's own check: the 400 then
    named `since`, a parameter the reconnecting client never sent."""
    refused = streams(server, {"agent": "sol"}, {"Last-Event-ID": resume})
    assert refused.status == 400 and refused.body["error"]["field"] == "Last-Event-ID", refused.body


@pytest.fixture
def served(store_url: str):
    running = start_server(store_url, rerank=False)
    yield running
    stop_server(running)


def test_a_cursor_past_every_event_this_store_logged_is_a_gap_not_silence(served, store_url, streams):
    """A since (or Last-Event-ID) this store never handed out: another store's, or one kept from before a restore.
    Read from it, nothing ever came and nothing said why; now a gap says so and reading goes on from the head."""
    server = served
    server.post("/v1/long", {"agent": "sol", "fact": "so the store has an event"})
    events_settled(store_url)
    (head,) = direct(store_url, "SELECT max(id) AS head FROM memory_event")
    head = head["head"]
    ahead = head + (1 << 40)  # e.g. a PostgreSQL store's id (its transaction's id << 24), far above a SQLite one
    answer = read_events(server, agent="sol", since=ahead)
    assert answer["gap"] is not None and "never" in answer["gap"]["message"], answer
    assert answer["next_since"] == head and answer["events"] == []
    stream = streams(server, {"agent": "sol"}, {"Last-Event-ID": str(ahead)})
    message = stream.next(skip_comments=False)
    while message is not None and "event" not in message:
        message = stream.next(skip_comments=False)
    assert message is not None and message["event"] == "gap" and message["data"]["through"] == ahead, message
    server.post("/v1/long", {"agent": "atlas", "fact": "after the cursor came"})
    assert [e["row"]["text"] for e in stream.events(1)] == ["after the cursor came"]
    later = read_events(server, agent="sol", since=answer["next_since"])
    assert [e["row"]["text"] for e in later["events"]] == ["after the cursor came"] and later["gap"] is None
    # An id the store holds is never past it, however it came (events copied from a database whose transaction
    # ids ran higher than this one's): a cursor just below it reads it, without a gap.
    kept = later["next_since"] + (1 << 44)
    direct(
        store_url,
        "INSERT INTO memory_event (id, kind, tier, row_id, agent) VALUES (?, 'update', 'long', ?, 'atlas')",
        (kept, later["events"][0]["row_id"]),
    )
    events_settled(store_url)
    copied = read_events(server, agent="sol", since=kept - 1)
    assert copied["gap"] is None and [e["id"] for e in copied["events"]] == [kept], copied


def test_a_stream_that_fails_to_start_gives_its_worker_seat_back(server, streams, tmp_path, monkeypatch):
    """--workers: a stream takes its seat in the shared file, then reads the head of the log if it is the worker's
    first. A read that failed there (a busy or lost database) answered 503 and left the seat taken for the
    worker's life: each such failure took one of the 32 for good."""
    hub = server.server.memory.events
    hub.seats = solos_workers.Seats(str(tmp_path / "seats"), 0)
    queries, real = server.server.memory.store.queries, server.server.memory.store.queries.head_event

    def lost(conn):
        raise solos_store.Busy("the database is busy (a test)")

    monkeypatch.setattr(queries, "head_event", lost)
    assert streams(server, {"agent": "sol"}).status == 503
    monkeypatch.setattr(queries, "head_event", real)
    assert hub.seats.count() == {"open_all_workers": 0}
    subscribed(streams(server, {"agent": "sol"}))
    assert hub.seats.count() == {"open_all_workers": 1}


def test_a_removal_never_fails_for_the_filters_file_the_workers_share(server, streams, tmp_path):
    """--workers: a removal is matched against every worker's stream filters, read from a file beside the seats,
    in the removal's own transaction (solos_workers.Filters). A file cut short (a worker killed while writing
    it) must fail neither the delete nor the stream, which still hears of its own match."""
    hub = server.server.memory.events
    hub.seats = solos_workers.Seats(str(tmp_path / "seats"), 0)
    (tmp_path / "filters.json").write_text('{"filters": [[["ops"], "pump", ')
    word = f"zq{time.monotonic_ns()}"
    stream = subscribed(streams(server, {"agent": "nova", "q": word, "tiers": "short"}))
    mug = server.post("/v1/short", {"agent": "sol", "key": word, "value": f"the {word} espresso mug"})
    assert mug.status == 201 and [e["kind"] for e in changes(stream, 1)] == ["write"]
    assert server.request("DELETE", "/v1/short", query={"agent": "sol", "key": word}).status == 200
    assert [(e["kind"], e["row_id"]) for e in changes(stream, 1)] == [("delete", mug.body["id"])]


def test_a_filtered_streams_removals_read_the_workers_matches_once_a_batch(server, streams, tmp_path, monkeypatch):
    """--workers: a removal this worker has no match for is looked up among every worker's (the filters file),
    read once for a batch of events, not once per removal and stream: 1,000 short rows expiring together under
    10 filtered streams read it 10,000 times on the hub's one thread."""
    hub = server.server.memory.events
    hub.seats = solos_workers.Seats(str(tmp_path / "seats"), 0)
    reads: list[int] = []
    real = hub.seats.filters.looked
    monkeypatch.setattr(hub.seats.filters, "looked", lambda work: reads.append(1) or real(work))
    word = f"zq{time.monotonic_ns()}"
    filtered = [subscribed(streams(server, {"agent": "nova", "q": f"{word}{n}", "tiers": "short"})) for n in range(3)]
    everything = subscribed(streams(server, {"agent": "nova", "tiers": "short"}))
    reads.clear()  # each filter was registered in the file as its stream opened
    keys = [f"{word}-{n}" for n in range(30)]
    for key in keys:
        assert server.post("/v1/short", {"agent": "sol", "key": key, "value": "an unrelated note"}).status == 201
    changes(everything, len(keys))
    with server.db() as conn:  # deleted in one commit, as a sweep or the fleet may: one batch of removals
        conn.execute(f"DELETE FROM memory_short WHERE key IN ({','.join('?' * len(keys))})", keys)
    assert [e["kind"] for e in changes(everything, len(keys))] == ["delete"] * len(keys)
    assert all(stream.quiet(0.2) == [] for stream in filtered)
    assert 1 <= len(reads) <= 3, len(reads)  # a batch or two; was one per removal and stream (90)


def test_a_stream_catching_up_is_sent_the_row_as_it_is_now_not_as_another_stream_was(server, streams):
    """Encoded events were kept by (id, foreign) for every stream: one catching up after the fleet rewrote the
    row (a secret taken out) rendered it as it is now, logged that as delivered, and was sent the bytes encoded
    for a live stream before the rewrite: the old text, which recall no longer returns."""
    live = subscribed(streams(server, {"agent": "sol"}))
    fact = server.post("/v1/long", {"agent": "atlas", "topic": "t", "fact": "the door code is 4711"}).body["id"]
    (written,) = live.events(1)
    assert written["row"]["text"] == "the door code is 4711"
    with server.db() as conn:
        conn.execute("UPDATE memory_longterm SET fact = 'the door code is (taken out)' WHERE id = ?", (fact,))
    assert [e["row"]["text"] for e in changes(live, 1)] == ["the door code is (taken out)"]  # rendered, encoded
    late = subscribed(streams(server, {"agent": "nova"}, {"Last-Event-ID": str(written["id"] - 1)}))
    shown = [(e["kind"], e["row"]["text"]) for e in changes(late, 2)]
    assert shown == [("write", "the door code is (taken out)"), ("update", "the door code is (taken out)")], shown


def test_events_pruned_while_a_stream_catches_up_are_a_gap_not_skipped(server, streams, monkeypatch):
    """A stream resuming near the week's edge catches up in batches; events the hourly prune removed between two
    batches were passed over without a word (the gap was looked for once, at the start)."""
    hub = server.server.memory.events
    ids = [server.post("/v1/long", {"agent": "atlas", "fact": f"fact {n}"}).body["id"] for n in range(6)]
    with server.db() as conn:
        logged = [row[0] for row in conn.execute("SELECT id FROM memory_event WHERE tier = 'long' ORDER BY id")]
    assert len(logged) == len(ids) == 6
    real, batches = hub.collect, []

    def two_at_a_time(conn, pattern, since, limit=solos_events.BATCH):
        if batches == [1]:  # after the first batch: the prune takes the next two events
            with server.db() as aged:
                aged.execute("UPDATE memory_event SET ts = '2000-01-01T00:00:00.000Z' WHERE id <= ?", (logged[3],))
            assert hub.prune() == 4
        batches.append(1)
        return real(conn, pattern, since, 2)

    monkeypatch.setattr(hub, "collect", two_at_a_time)
    stream = subscribed(streams(server, {"agent": "sol", "tiers": "long"}, {"Last-Event-ID": "0"}))
    seen = []
    while len([m for m in seen if "event" not in m]) < 4:
        message = stream.next()
        assert message is not None, seen
        seen.append(message)
    gap = [("gap", m["data"]["from"], m["data"]["through"]) for m in seen if "event" in m]
    shown = [m["data"]["row"]["text"] if "event" not in m else gap.pop(0) for m in seen]
    assert shown == ["fact 0", "fact 1", ("gap", logged[1] + 1, logged[3]), "fact 4", "fact 5"], shown
