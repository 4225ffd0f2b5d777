"""As-of recall under attack: what it shows to whom (deleted and expired values, episodes only while shared, the
operator's token), what it audits and logs as deliveries, what it costs in bytes, memory and concurrency.

Each test states a weakness found in review as behaviour. The store tests run on both stores (`store_url`); the
others on SQLite, since they exercise the operation rather than the SQL.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import fleet_writer, start_server, stop_server, wait_until, write_tokens

import solos_memory
import solos_provenance
import solos_store

STEP_S = 0.003  # timestamps are milliseconds: steps further apart than that are ordered by them
TOKENS = {"a": "atlas", "s": "sol", "n": "nova", "op": solos_memory.OPERATOR}


def marker() -> str:
    return "zq" + uuid.uuid4().hex


def step() -> None:
    time.sleep(STEP_S)


def direct(url: str, sql: str, params: tuple = ()) -> None:
    """One statement as one of the fleet's writers, committed at once."""
    with fleet_writer(url) as conn:
        conn.execute(sql, params)


class Caller:
    """One agent (or the operator) talking to a service, in loopback or token mode alike."""

    def __init__(self, running: Any, name: str, tokens: bool):
        self.running, self.name, self.tokens = running, name, tokens

    def call(self, method: str, path: str, query: dict | None = None, body: Any = None) -> Any:
        query = dict(query or {})
        headers = {}
        if self.tokens:
            headers["Authorization"] = f"Bearer {next(t for t, a in TOKENS.items() if a == self.name)}"
        elif self.name != solos_memory.OPERATOR:
            if body is not None:
                body = {"agent": self.name, **body}
            else:
                query.setdefault("agent", self.name)
        return self.running.request(method, path, query=query, body=body, headers=headers)

    def as_of(self, **query: Any) -> dict:
        reply = self.call("GET", "/v1/recall/as_of", query=query)
        assert reply.status == 200, reply.body
        return reply.body


@pytest.fixture(params=["loopback", "tokens"])
def fleet(request: pytest.FixtureRequest, store_url: str, tmp_path: Path) -> Iterator[dict[str, Caller]]:
    """The service on this test's store, in loopback trust or with per-agent tokens; a Caller per agent."""
    tokens = request.param == "tokens"
    config: dict[str, Any] = {}
    if tokens:
        write_tokens(tmp_path / "tokens", TOKENS)
        config["tokens_file"] = str(tmp_path / "tokens")
    running = start_server(store_url, **config)
    yield {name: Caller(running, name, tokens) for name in TOKENS.values()}
    stop_server(running)


# ==== 1. Deleted and expired short values ====


def test_a_deleted_short_value_is_shown_to_no_one_else_and_its_author_can_forget_it_and_an_expired_one(
    fleet, store_url
):
    atlas, nova = fleet["atlas"], fleet["nova"]
    word = marker()
    kept = atlas.call("POST", "/v1/short", body={"key": "k1", "value": f"{word} kept"}).body["id"]
    gone = atlas.call("POST", "/v1/short", body={"key": "k2", "value": f"{word} taken back"}).body["id"]
    brief = atlas.call("POST", "/v1/short", body={"key": "k3", "value": f"{word} brief", "ttl_s": 0.3}).body["id"]
    step()
    before = solos_store.utc_now()
    step()
    assert atlas.call("DELETE", "/v1/short", query={"key": "k2"}).status == 200
    time.sleep(0.35)

    tiers = "long,short,episodic"
    seen = {r["id"]: r["text"] for r in nova.as_of(as_of=before, q=word, tiers=tiers)["results"]}
    # What atlas deleted is shown to no one else; what expired counted until its expiry, as recall showed it.
    assert seen == {kept: f"{word} kept", brief: f"{word} brief"}
    own = {r["id"] for r in atlas.as_of(as_of=before, q=word, tiers=tiers)["results"]}
    assert own == {kept, gone, brief}  # its own view still holds what it deleted, until it forgets it
    # Until the purge after its expiry: its TTL bounds how long the value is kept, its versions included.
    assert solos_memory.main(["purge", "--db", store_url]) == 0
    for caller in (nova, atlas):
        assert brief not in {r["id"] for r in caller.as_of(as_of=before, q=word, tiers=tiers)["results"]}
    assert atlas.call("DELETE", "/v1/memory", query={"tier": "short", "id": brief}).status == 404  # nothing left

    reply = atlas.call("DELETE", "/v1/memory", query={"tier": "short", "id": gone})
    assert reply.status == 200, reply.body
    assert nova.call("DELETE", "/v1/memory", query={"tier": "short", "id": kept}).status == 403
    for caller in (atlas, nova):
        answer = caller.as_of(as_of=before, q=word, tiers=tiers)
        assert [r["id"] for r in answer["results"]] == [kept]
        assert {r["row_id"] for r in answer["retracted"]} >= {gone}
        assert "taken back" not in json.dumps(answer) and "brief" not in json.dumps(answer)
    with fleet_writer(store_url) as conn:
        left = conn.execute(
            "SELECT count(*) FROM memory_version WHERE tier = 'short' AND row_id IN (?, ?)", (gone, brief)
        ).fetchone()[0]
    assert left == 0


def test_forgetting_an_earlier_row_of_a_key_leaves_the_later_rows_versions(fleet):
    """A key deleted and written again is a new row. Forgetting the old row erased the versions of every row of
    its key, the new one's too: as of a time the new row said something, no one saw it there any more, though
    its author never forgot it. Only the versions of the row and of earlier rows of its key go."""
    atlas, nova = fleet["atlas"], fleet["nova"]
    word = marker()
    old = atlas.call("POST", "/v1/short", body={"key": "k", "value": "the first row"}).body["id"]
    assert atlas.call("DELETE", "/v1/short", query={"key": "k"}).status == 200
    new = atlas.call("POST", "/v1/short", body={"key": "k", "value": f"the second row {word}"}).body["id"]
    assert new != old
    step()
    then = solos_store.utc_now()
    step()
    atlas.call("POST", "/v1/short", body={"key": "k", "value": "the second row, rewritten"})
    shown = [(r["id"], r["text"]) for r in nova.as_of(as_of=then, q=word)["results"]]
    assert shown == [(new, f"the second row {word}")]
    assert atlas.call("DELETE", "/v1/memory", query={"tier": "short", "id": old}).status == 200
    assert [(r["id"], r["text"]) for r in nova.as_of(as_of=then, q=word)["results"]] == shown
    assert atlas.call("DELETE", "/v1/memory", query={"tier": "short", "id": new}).status == 200
    assert nova.as_of(as_of=then, q=word)["results"] == []


def test_a_forgotten_short_row_is_no_retraction_as_of_a_time_it_had_expired_before_its_key_was_rewritten(fleet):
    """A short row lives, expires, and its key is written again (the same row, in place), then forgotten: as of a
    time it counted it is a retraction, as of the time between expiry and rewrite it was not there at all."""
    atlas, nova = fleet["atlas"], fleet["nova"]
    row = atlas.call("POST", "/v1/short", body={"key": "blink", "value": "first life", "ttl_s": 0.2}).body["id"]
    step()
    first = solos_store.utc_now()
    time.sleep(0.3)
    between = solos_store.utc_now()
    step()
    again = atlas.call("POST", "/v1/short", body={"key": "blink", "value": "second life"}).body
    assert again["id"] == row, again
    step()
    second = solos_store.utc_now()
    step()
    assert atlas.call("DELETE", "/v1/memory", query={"tier": "short", "id": row}).status == 200
    for caller in (atlas, nova):
        retracted = {at: [r["row_id"] for r in caller.as_of(as_of=at)["retracted"]] for at in (first, between, second)}
        assert retracted == {first: [row], between: [], second: [row]}, retracted


def test_a_forgotten_episode_its_author_never_shared_is_no_retraction_for_anyone_else(fleet):
    """As of a past time another agent's episode shows only if it was current while its author shared; the same
    holds for its retraction: an episode that lived and was forgotten while private is nobody else's business,
    even once its author shares."""
    atlas, nova = fleet["atlas"], fleet["nova"]
    private = atlas.call("POST", "/v1/episodic", body={"event_type": "task", "summary": "kept to myself"}).body["id"]
    step()
    lived = solos_store.utc_now()
    step()
    assert atlas.call("DELETE", "/v1/memory", query={"tier": "episodic", "id": private}).status == 200
    assert atlas.call("PUT", "/v1/sharing", body={"episodic": True}).status == 201
    shared = atlas.call("POST", "/v1/episodic", body={"event_type": "task", "summary": "told to all"}).body["id"]
    step()
    later = solos_store.utc_now()
    step()
    assert atlas.call("DELETE", "/v1/memory", query={"tier": "episodic", "id": shared}).status == 200
    gone = {at: [r["row_id"] for r in nova.as_of(as_of=at, tiers="episodic")["retracted"]] for at in (lived, later)}
    assert gone == {lived: [], later: [shared]}, gone
    own = {at: [r["row_id"] for r in atlas.as_of(as_of=at, tiers="episodic")["retracted"]] for at in (lived, later)}
    assert own == {lived: [private], later: [shared]}, own  # its author's own view keeps both


def test_a_short_rows_gaps_are_the_times_no_version_counted():
    t = [f"2026-01-01T00:00:0{n}.000Z" for n in range(10)]
    # (valid_from, valid_to, expires_at), in any order: lived 0-2, expired until 4, lived 4-6 (a refresh at 5)
    assert solos_store.short_gaps([(t[5], t[8], t[6]), (t[0], t[4], t[2]), (t[4], t[5], t[7])]) == [(t[2], t[4])]
    assert solos_store.short_gaps([(t[0], t[3], t[9]), (t[3], t[5], None)]) == []  # never expired in between
    assert solos_store.short_gaps([]) == []


def test_forgetting_a_short_row_erases_the_versions_of_earlier_rows_of_its_key(server):
    word = marker()
    first = server.post("/v1/short", {"agent": "atlas", "key": "door", "value": f"{word} one"}).body["id"]
    server.request("DELETE", "/v1/short", query={"agent": "atlas", "key": "door"})
    second = server.post("/v1/short", {"agent": "atlas", "key": "door", "value": f"{word} two"}).body["id"]
    assert first != second
    reply = server.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "short", "id": second})
    assert reply.status == 200, reply.body
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_version WHERE text LIKE ?", (f"{word}%",)).fetchone()[0] == 0


# ==== 2. Audit, and episodes only as they were while shared ====


def test_as_of_shows_another_agent_an_episode_only_in_versions_current_while_its_author_shared(fleet, store_url):
    atlas, sol, nova = fleet["atlas"], fleet["sol"], fleet["nova"]
    written = sol.call("POST", "/v1/episodic", body={"event_type": "ops", "summary": "root password is hunter2"})
    row = written.body["id"]
    step()
    secret_then = solos_store.utc_now()
    step()
    direct(store_url, "UPDATE memory_episodic SET summary = ? WHERE id = ?", ("root password redacted", row))
    step()
    assert sol.call("PUT", "/v1/sharing", body={"episodic": True}).status in (200, 201)
    step()
    now = solos_store.utc_now()
    assert nova.as_of(as_of=secret_then, tiers="episodic")["results"] == []
    assert [r["text"] for r in nova.as_of(as_of=now, tiers="episodic")["results"]] == ["root password redacted"]
    assert [r["text"] for r in sol.as_of(as_of=secret_then, tiers="episodic")["results"]] == [
        "root password is hunter2"
    ]  # its author sees its own history
    audit = sol.call("GET", "/v1/audit").body["reads"]
    assert [(a["reader"], a["row_id"]) for a in audit] == [("nova", row)]
    assert atlas.as_of(as_of=now, tiers="episodic", scope="own")["results"] == []


def audit_count(server: Any) -> int:
    with server.db() as conn:
        return conn.execute("SELECT count(*) FROM episodic_read_audit").fetchone()[0]


def test_every_operation_that_returns_rows_audits_a_foreign_episode_it_hands_over(server):
    """The contract: an operation whose answer carries rows (results or events) audits through Visibility."""
    word = marker()
    server.request("PUT", "/v1/sharing", body={"agent": "sol", "episodic": True})
    server.post("/v1/episodic", {"agent": "sol", "event_type": "ops", "summary": f"{word} rotated the keys"})
    step()
    calls = {
        "recall": {"agent": "nova", "q": word, "tiers": "episodic"},
        "read_events": {"agent": "nova", "since": 0, "tiers": "episodic"},
        "recall_as_of": {"agent": "nova", "as_of": solos_store.utc_now(), "tiers": "episodic", "q": word},
    }
    returning = {
        name
        for name, op in solos_memory.OPERATIONS.items()
        if {"results", "events"} & set(op.output_schema.get("properties", {})) and not op.writes
    }
    assert returning == set(calls), "say how to call each operation that returns rows"
    for name, query in calls.items():
        op = solos_memory.OPERATIONS[name]
        before = audit_count(server)
        reply = server.request(op.method, op.path, query=query)
        assert reply.status == 200, (name, reply.body)
        assert audit_count(server) == before + 1, name


# ==== 3. The operator token ====


def test_the_operator_token_gets_a_readers_view_without_unshared_episodes_and_never_an_agents_own(
    make_server, tmp_path
):
    write_tokens(tmp_path / "tokens", TOKENS)
    running = make_server(tokens_file=str(tmp_path / "tokens"))
    atlas, operator = Caller(running, "atlas", True), Caller(running, solos_memory.OPERATOR, True)
    word = marker()
    private = atlas.call("POST", "/v1/episodic", body={"event_type": "note", "summary": f"{word} private"}).body["id"]
    fact = atlas.call("POST", "/v1/long", body={"fact": f"{word} shared fact"}).body["id"]
    assert atlas.call("GET", "/v1/recall", query={"q": word, "tiers": "episodic,long"}).status == 200
    step()
    running.server.memory.deliveries.flush()
    at = solos_store.utc_now()
    reply = operator.call(
        "GET", "/v1/recall/as_of", {"agent": "atlas", "as_of": at, "tiers": "episodic", "scope": "own"}
    )
    assert reply.status == 403 and reply.body["error"]["field"] == "agent"
    assert operator.call("GET", "/v1/stats", {"agent": "atlas"}).status == 403
    own = atlas.as_of(reader="atlas", as_of=at, tiers="episodic,long")
    assert {r["id"] for r in own["results"]} == {private, fact}  # atlas was shown both
    seen = operator.as_of(reader="atlas", as_of=at, tiers="episodic,long")
    assert [r["id"] for r in seen["results"]] == [fact]  # the episode atlas never shared stays atlas's


# ==== 4. Bounded answers, word forms, memory, concurrency ====


def test_as_of_answers_stay_within_the_byte_bound_on_rest_and_mcp(server):
    word = marker()
    for n in range(80):
        server.post("/v1/short", {"agent": "atlas", "key": f"{word}-{n}", "value": word + " " + "\x01" * 16_000})
    at = solos_store.utc_now()
    reply = server.request("GET", "/v1/recall/as_of", query={"agent": "nova", "as_of": at, "q": word, "k": 100})
    assert reply.status == 200 and len(reply.raw) < 1.1 * 2**20, len(reply.raw)
    assert reply.body["truncated"]["left_out"] == 80 - reply.body["count"]
    mcp = server.mcp_tool("recall_as_of", {"agent": "nova", "as_of": at, "q": word, "k": 100})
    assert len(mcp.raw) < 3 * 2**20, len(mcp.raw)


def test_as_of_matches_word_forms_as_recall_does(server):
    server.post("/v1/long", {"agent": "atlas", "topic": "ops", "fact": "Backups run nightly at 02:00"})
    server.post("/v1/short", {"agent": "atlas", "key": "policy", "value": "the deploying policies changed"})
    at = solos_store.utc_now()
    assert server.recall("nova", "backup").body["count"] == 1
    for q, text in (("backup", "Backups run nightly at 02:00"), ("deployed policy", "the deploying policies changed")):
        answer = server.get("/v1/recall/as_of", agent="nova", as_of=at, q=q).body
        assert [r["text"] for r in answer["results"]] == [text], q


def test_an_as_of_call_stems_each_distinct_word_once_not_once_a_row(server, monkeypatch):
    """Words in q keep rows holding one in any form: every row holding a word that begins like one was read word by
    word in Python, its words stemmed each time; 64 frequent words over 11k rows took 770 ms of CPU (100x an
    ordinary recall). A call stems each distinct word it meets once."""
    word = marker()
    with server.db() as conn:
        conn.executemany(
            "INSERT INTO memory_short (agent, key, value, expires_at) "
            "VALUES ('atlas', ?, ?, '2999-01-01T00:00:00.000Z')",
            [(f"{word}-{n}", f"{word} backups gateway tickets rolled {n % 7} backed") for n in range(300)],
        )
    at = solos_store.utc_now()
    stemmed: list[str] = []
    real = solos_provenance.word_stem
    monkeypatch.setattr(solos_provenance, "word_stem", lambda w: stemmed.append(w) or real(w))
    reply = server.get("/v1/recall/as_of", agent="nova", as_of=at, q="backup tickets gateways rolling", tiers="short")
    assert reply.status == 200 and reply.body["count"] == 10
    assert {r["text"].split()[0] for r in reply.body["results"]} == {word}
    assert len(stemmed) == len(set(stemmed)) < 4 + 7 + 310  # the question's words, the rows' and their keys', once


def test_an_as_of_call_holds_k_rows_not_the_tier(server):
    word = marker()
    with server.db() as conn:  # 300 rows of 15 KB: 4.5 MB of text
        conn.executemany(
            "INSERT INTO memory_short (agent, key, value, expires_at) "
            "VALUES ('atlas', ?, ?, '2999-01-01T00:00:00.000Z')",
            [(f"{word}-{n}", f"{word} {n} " + "x" * 15_000) for n in range(300)],
        )
    at = solos_store.utc_now()
    tracemalloc.start()
    try:
        reply = server.get("/v1/recall/as_of", agent="nova", as_of=at, q=word, k=5, tiers="short")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reply.status == 200 and reply.body["count"] == 5
    assert peak < 1.5e6, peak  # the whole tier would be 4.5 MB of text, twice over as rows and dicts


def test_as_of_calls_past_the_cap_wait_then_get_503_with_retry_after(server, monkeypatch):
    monkeypatch.setattr(solos_provenance, "AS_OF_WAIT_S", 0.05)
    taken = [solos_provenance.AS_OF_SLOTS.acquire(timeout=1) for _ in range(solos_provenance.AS_OF_CALLS)]
    try:
        assert all(taken)
        reply = server.get("/v1/recall/as_of", agent="nova", as_of=solos_store.utc_now())
        assert reply.status == 503 and reply.headers.get("retry-after") == "1", reply.body
    finally:
        for _ in taken:
            solos_provenance.AS_OF_SLOTS.release()
    assert server.get("/v1/recall/as_of", agent="nova", as_of=solos_store.utc_now()).status == 200


def test_parallel_as_of_calls_all_answer_or_say_busy(server):
    server.post("/v1/long", {"agent": "atlas", "fact": "valve four is open"})
    at = solos_store.utc_now()
    statuses: list[int] = []

    def call() -> None:
        statuses.append(server.get("/v1/recall/as_of", agent="nova", as_of=at, q="valve").status)

    threads = [threading.Thread(target=call) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(statuses) <= {200, 503} and 200 in statuses


# ==== 5. As-of reads are deliveries ====


def test_what_as_of_hands_an_agent_is_a_delivery_so_it_echoes_and_is_told_of_the_forget(server):
    word = marker()
    row = server.post("/v1/long", {"agent": "atlas", "fact": f"{word} the pump runs at 40 psi"}).body["id"]
    at = solos_store.utc_now()
    answer = server.get("/v1/recall/as_of", agent="sol", as_of=at, q=word).body
    assert [r["id"] for r in answer["results"]] == [row]
    readers = server.get("/v1/deliveries", agent="atlas").body["deliveries"]
    assert [(d["reader"], d["row_id"]) for d in readers] == [("sol", row)]
    server.post("/v1/long", {"agent": "sol", "fact": f"{word} the pump runs at 40 psi."})
    recalled = server.recall("nova", word).body["results"]
    witness = next(w for r in recalled if r["id"] == row for w in r["witnesses"])
    assert (witness["agent"], witness["kind"]) == ("sol", "echo")
    server.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": row})
    wait_until(lambda: server.get("/v1/notices", agent="sol").body["count"] == 1)


def test_what_a_reader_was_shown_costs_work_in_step_with_a_rows_versions_not_their_square(server, monkeypatch):
    """A fact rewritten V times, its reader shown each version: `reader` compared every delivery with every version
    of the row, and the SQL asked of every version whether its row was deleted by looking through all the row's
    versions: 1,000 versions answered in 0.3 s, 4,000 in 10 s (a slot and a read transaction held throughout).
    Counted here as SQLite's steps and the lines Python runs in solos_provenance: four times the versions, about
    four times the work (it was sixteen)."""
    start = int(time.time()) - 3600

    def stamp(ms: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(start + ms / 1000)) + f".{int(ms) % 1000:03d}Z"

    def rewritten(reader: str, versions: int, offset: float) -> int:
        with server.db() as conn:
            fact = conn.execute(
                "INSERT INTO memory_longterm (agent, topic, fact, created_at) VALUES ('atlas', 'status', ?, ?) "
                "RETURNING id",
                (f"{reader} status now", stamp(offset)),
            ).fetchone()[0]
            edges = [stamp(offset + 100 * n) for n in range(versions + 1)]
            conn.executemany(
                "INSERT INTO memory_version (tier, row_id, agent, label, text, valid_from, valid_to, ended_by) "
                "VALUES ('long', ?, 'atlas', 'status', ?, ?, ?, 'update')",
                [(fact, f"{reader} status {n}", edges[n], edges[n + 1]) for n in range(versions)],
            )
            conn.executemany(
                "INSERT INTO memory_delivery (reader, tier, row_id, writer, delivered_at) VALUES (?, 'long', ?, "
                "'atlas', ?)",
                [(reader, fact, stamp(offset + 100 * n + 50)) for n in range(versions)],
            )
        return fact

    versions = {"sol": 60, "nova": 240}
    rewritten("sol", versions["sol"], 0)
    rewritten("nova", versions["nova"], 60_000)
    at = solos_store.utc_now()
    store = server.server.memory.store
    read = store.read

    def counted(work, *args, **kwargs):
        def steps(conn):
            conn.set_progress_handler(lambda: tally.__setitem__("sql", tally["sql"] + 1) or 0, 10)
            try:
                return work(conn)
            finally:
                conn.set_progress_handler(None, 0)

        return read(steps, *args, **kwargs)

    def lines(frame, event, arg):
        if frame.f_code.co_filename == solos_provenance.__file__:
            tally["python"] += event == "line"
            return lines
        return None

    work: dict[str, dict[str, int]] = {}
    monkeypatch.setattr(store, "read", counted)
    for reader in ("sol", "nova"):
        tally = {"sql": 0, "python": 0}
        sys.settrace(lines)
        try:
            answer = solos_provenance.op_recall_as_of(
                server.server.memory,
                {"agent": reader, "reader": reader, "as_of": at, "tiers": None, "q": "", "k": 10, "scope": "shared"},
            )
        finally:
            sys.settrace(None)
        newest = versions[reader] - 1  # shown every replaced version, never the current one
        texts = [r["text"] for r in answer["results"]]
        assert texts == [f"{reader} status {n}" for n in range(newest, newest - 10, -1)], texts
        work[reader] = dict(tally)
    ratios = {name: work["nova"][name] / work["sol"][name] for name in ("sql", "python")}
    assert max(ratios.values()) < 8, (ratios, work)  # 4x the versions: linear is about 4, quadratic 16
