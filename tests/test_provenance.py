"""Who knew what, and when: the delivery log, witnesses, as-of recall, retraction notices."""

from __future__ import annotations

import json
import sqlite3
import sys
import time
import types
import uuid

import pytest
from conftest import ROOT, start_server, stop_server, write_tokens
from hypothesis import HealthCheck, given, settings, strategies as st

import solos_memory
import solos_provenance
import solos_store

sys.path.insert(0, str(ROOT / "bench"))
import near_duplicates  # noqa: E402

AGENTS = ("atlas", "sol", "hermes", "nova")
STEP_S = 0.003  # timestamps are milliseconds: steps further apart than that are ordered by them
PROPERTY = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One service for the property tests; each example works in a namespace of its own (a fresh marker)."""
    running = start_server(tmp_path_factory.mktemp("provenance") / "solos.db")
    yield running
    stop_server(running)


def marker() -> str:
    return "zq" + uuid.uuid4().hex


def step() -> None:
    time.sleep(STEP_S)


def now_stamp() -> str:
    return solos_store.utc_now()


def notices(server, agent: str, **query) -> list[dict]:
    reply = server.get("/v1/notices", agent=agent, **query)
    assert reply.status == 200, reply.body
    return reply.body["notices"]


def as_of(server, **query) -> dict:
    reply = server.get("/v1/recall/as_of", **query)
    assert reply.status == 200, reply.body
    return reply.body


def files_holding(server, text: str) -> int:
    needle = text.encode()
    return sum(
        path.read_bytes().count(needle)
        for path in (server.db_path, server.db_path.with_name(server.db_path.name + "-wal"))
        if path.exists()
    )


# ==== Near-duplicates: the rule's measured precision ====


def test_the_near_duplicate_rule_keeps_its_measured_precision_on_the_labelled_sample():
    pairs = near_duplicates.load(near_duplicates.SAMPLE)
    assert len(pairs) >= 90 and 0.3 < sum(p["same"] for p in pairs) / len(pairs) < 0.7
    shipped = near_duplicates.measure(pairs, solos_provenance.TOKEN_JACCARD)
    assert shipped["precision"] >= 0.95 and shipped["recall"] >= 0.85, shipped
    # the numbers and negation guard is what keeps "02:00" and "03:00" apart at any overlap
    assert solos_provenance.near_duplicate("backup at 02:00 on db-1", "backup at 03:00 on db-1") is None
    assert solos_provenance.near_duplicate("the pump is rated", "the pump is not rated") is None


# ==== The fleet scenario ====


def test_one_writes_one_echoes_one_agrees_independently_and_only_the_reader_is_told_of_the_forget(server):
    word = marker()
    fact = f"The coolant pump {word} is rated for 40 bar at the north plant"
    written = server.post("/v1/long", {"agent": "atlas", "fact": fact}).body["id"]
    step()
    assert [r["id"] for r in server.recall("sol", word).body["results"]] == [written]  # sol reads it ...
    step()
    server.post("/v1/long", {"agent": "sol", "fact": fact.replace("The coolant", "the coolant") + "."})  # ... echoes
    server.post(
        "/v1/long", {"agent": "nova", "fact": f"At the north plant the coolant pump {word} is rated for 40 bar"}
    )
    answer = server.recall("atlas", word, scope="own").body
    (mine,) = answer["results"]
    kinds = {w["agent"]: (w["kind"], w["match"]) for w in mine["witnesses"]}
    assert kinds == {"sol": ("echo", "token_overlap"), "nova": ("independent", "token_overlap")}
    assert mine["single_source"] is False
    assert answer["corroboration"]["vectors"] is False and "word overlap" in answer["corroboration"]["rule"]
    lonely = server.post("/v1/long", {"agent": "hermes", "fact": f"{marker()} stands alone"}).body["id"]
    alone = server.recall("hermes", "stands alone", scope="own").body["results"]
    assert [(r["id"], r["witnesses"], r["single_source"]) for r in alone] == [(lonely, [], True)]

    forgot = server.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": written})
    assert forgot.status == 200 and forgot.body["notified"] == 1
    assert [(n["row_id"], n["writer"], n["kind"]) for n in notices(server, "sol")] == [(written, "atlas", "forgotten")]
    assert notices(server, "nova") == notices(server, "atlas") == notices(server, "hermes") == []


def test_a_kept_cluster_answers_only_while_the_long_facts_and_their_vectors_are_unchanged(server, monkeypatch):
    queried: list[str] = []
    near_candidates = solos_store.Queries.near_candidates

    def counted(self, conn, match, limit):
        queried.append(match)
        return near_candidates(self, conn, match, limit)

    monkeypatch.setattr(solos_store.Queries, "near_candidates", counted)
    word = marker()
    fact = f"The coolant pump {word} is rated for 40 bar at the north plant"
    written = server.post("/v1/long", {"agent": "atlas", "fact": fact}).body["id"]

    def witnesses() -> list[tuple[str, str]]:
        (result,) = server.recall("atlas", word, tiers="long", scope="own").body["results"]
        assert result["id"] == written
        return [(w["agent"], w["match"]) for w in result["witnesses"]]

    assert witnesses() == [] and len(queried) == 1
    assert witnesses() == [] and len(queried) == 1  # nothing changed: the kept cluster, no FTS5 query
    db = sqlite3.connect(server.db_path, isolation_level=None)  # the fleet's own writers, around the service
    db.execute(
        "INSERT INTO memory_longterm (agent, fact) VALUES ('nova', ?)",
        (f"At the north plant the coolant pump {word} is rated for 40 bar",),
    )
    assert witnesses() == [("nova", "token_overlap")] and len(queried) == 2
    assert witnesses() == [("nova", "token_overlap")] and len(queried) == 2
    db.execute("UPDATE memory_longterm SET agent = 'hermes' WHERE agent = 'nova' AND fact LIKE ?", (f"%{word}%",))
    assert witnesses() == [("hermes", "token_overlap")] and len(queried) == 3
    db.execute("UPDATE solos_memory_meta SET value = value + 1 WHERE key = 'vector_generation'")
    assert witnesses() == [("hermes", "token_overlap")] and len(queried) == 4  # vectors may judge it: asked again
    (theirs,) = db.execute("SELECT id FROM memory_longterm WHERE agent = 'hermes' AND fact LIKE ?", (f"%{word}%",))
    db.close()
    forgot = server.request("DELETE", "/v1/memory", query={"agent": "hermes", "tier": "long", "id": theirs[0]})
    assert forgot.status == 200
    assert witnesses() == [] and len(queried) == 5


def test_a_cluster_kept_at_one_version_never_answers_a_recall_at_another(monkeypatch):
    """Two recalls at once over different states of the long facts: neither is answered from the other's."""
    near, seen = solos_provenance.NearDuplicates(), {"version": b"one"}
    monkeypatch.setattr(solos_store.Queries, "near_duplicates_version", lambda self, conn: seen["version"])
    first, second = ({"id": n, "agent": "atlas", "text": f"fact {n}"} for n in (1, 2))
    conn = types.SimpleNamespace(queries=solos_store.SQLITE)  # only its queries are asked

    def near_cluster(conn, result, vectors):
        made = {result["id"]: (result["agent"], seen["version"].decode(), "")}
        if result is first and seen["version"] == b"one":  # meanwhile, a recall after a write keeps `second`
            seen["version"] = b"two"
            assert near.clusters(conn, [second], False) == [{2: ("atlas", "two", "")}]
            seen["version"] = b"one"
        return made

    monkeypatch.setattr(solos_provenance, "near_cluster", near_cluster)
    assert near.clusters(conn, [first, second], False) == [{1: ("atlas", "one", "")}, {2: ("atlas", "one", "")}]
    assert near.clusters(conn, [second], False) == [{2: ("atlas", "one", "")}]  # asked again at one: never two's


# ==== Property: independent and echo follow the delivery order ====

STEPS = st.lists(st.tuples(st.sampled_from(["write", "read"]), st.sampled_from(AGENTS)), min_size=2, max_size=9)
VARIANTS = {"atlas": "", "sol": ".", "hermes": "!", "nova": " ;"}  # near-duplicates that recall does not collapse


@PROPERTY
@given(steps=STEPS)
def test_witnesses_are_independent_exactly_when_written_before_any_other_copy_was_delivered(shared, steps):
    word = marker()
    written: dict[str, int] = {}  # agent -> step its copy was written
    first_shown: dict[str, int] = {}  # agent -> first step it was delivered another agent's copy
    for index, (action, agent) in enumerate(steps):
        if action == "write" and agent not in written:
            shared.post("/v1/long", {"agent": agent, "fact": f"the reactor {word} runs hot{VARIANTS[agent]}"})
            written[agent] = index
        elif action == "read":
            got = shared.recall(agent, word, k=10).body["results"]
            assert len(got) == len(written)
            if set(written) - {agent}:
                first_shown.setdefault(agent, index)
        step()
    for result in shared.recall("atlas", word, k=10).body["results"]:
        expected = {
            agent: "independent" if first_shown.get(agent, len(steps)) > at else "echo"
            for agent, at in written.items()
            if agent != result["agent"]
        }
        assert {w["agent"]: w["kind"] for w in result["witnesses"]} == expected
        assert result["single_source"] is (not expected)


# ==== Property: notices reach exactly the agents delivered the row ====

READS = st.lists(st.tuples(st.sampled_from(AGENTS), st.integers(0, 2)), max_size=8)


@PROPERTY
@given(reads=READS, gone=st.integers(0, 2), short=st.booleans())
def test_notices_reach_exactly_the_agents_that_were_delivered_the_row(shared, reads, gone, short):
    words = [marker() for _ in range(3)]
    if short:
        ids = [
            shared.post("/v1/short", {"agent": "atlas", "key": w, "value": f"{w} version one"}).body["id"]
            for w in words
        ]
    else:
        ids = [shared.post("/v1/long", {"agent": "atlas", "fact": f"{w} holds"}).body["id"] for w in words]
    readers = set()
    for agent, which in reads:
        got = shared.recall(agent, words[which], tiers="short" if short else "long").body["results"]
        assert [r["id"] for r in got] == [ids[which]]
        if which == gone and agent != "atlas":
            readers.add(agent)
    step()
    if short:  # replaced: the readers of the version it replaced are told, with the row now holding it
        shared.post("/v1/short", {"agent": "atlas", "key": words[gone], "value": f"{words[gone]} version two"})
        kind = "superseded"
    else:
        shared.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": ids[gone]})
        kind = "forgotten"
    tier = "short" if short else "long"
    for agent in AGENTS:
        mine = [n for n in notices(shared, agent) if n["tier"] == tier and n["row_id"] in ids]
        if agent in readers:
            assert [(n["row_id"], n["kind"], n["writer"]) for n in mine] == [(ids[gone], kind, "atlas")]
            assert mine[0]["new_id"] == (ids[gone] if short else None)
        else:
            assert mine == []
        ack = shared.post("/v1/notices/ack", {"agent": agent, "ids": [n["id"] for n in mine] or [1 << 40]})
        assert ack.status == 200 and ack.body["acked"] == len(mine)


# ==== Property: as-of answers equal a replay of the writes up to T ====

ACTIONS = st.lists(
    st.tuples(st.sampled_from(["long", "short", "short_brief", "delete_short", "forget"]), st.integers(0, 3)),
    min_size=1,
    max_size=8,
)


@PROPERTY
@given(actions=ACTIONS)
def test_as_of_answers_equal_a_replay_of_the_writes_up_to_each_moment(shared, actions):
    word = marker()
    state: dict[tuple[str, int], tuple[str, str | None]] = {}  # (tier, id) -> (text, expires_at)
    snapshots: list[tuple[str, dict]] = []
    forgotten_at: dict[tuple[str, int], str] = {}
    deleted: set[tuple[str, int]] = set()
    for index, (action, slot) in enumerate(actions):
        text = f"{word} step {index} slot {slot}"
        if action == "long":
            row = shared.post("/v1/long", {"agent": "sol", "fact": text}).body
            state[("long", row["id"])] = (text, None)
        elif action in ("short", "short_brief"):
            ttl = 0.05 if action == "short_brief" else 600
            row = shared.post("/v1/short", {"agent": "sol", "key": f"{word}-{slot}", "value": text, "ttl_s": ttl}).body
            state[("short", row["id"])] = (text, row["expires_at"])
        elif action == "delete_short":
            reply = shared.request("DELETE", "/v1/short", query={"agent": "sol", "key": f"{word}-{slot}"})
            if reply.status == 200 and not reply.body["was_expired"]:  # taken back: shown to others as of no time
                deleted.add(("short", reply.body["id"]))
            state = {
                key: value for key, value in state.items() if reply.status != 200 or key != ("short", reply.body["id"])
            }
        elif state:
            key = sorted(state)[slot % len(state)]
            reply = shared.request("DELETE", "/v1/memory", query={"agent": "sol", "tier": key[0], "id": key[1]})
            assert reply.status == 200, reply.body
            forgotten_at[key] = now_stamp()
            state.pop(key)
        step()
        snapshots.append((now_stamp(), dict(state)))
        step()
    time.sleep(0.06)  # the brief short rows expire: as of the moments above they still counted
    for at, held in snapshots:
        answer = as_of(shared, agent="atlas", as_of=at, q=word, k=100)
        # forgotten rows never come back: one forgotten later shows only as a retraction, without its text
        alive = {
            key: text
            for key, (text, expires) in held.items()
            if (expires is None or expires > at) and key not in forgotten_at and key not in deleted
        }
        assert {(r["tier"], r["id"]): r["text"] for r in answer["results"]} == alive
        gone = {(r["tier"], r["row_id"]) for r in answer["retracted"]} & set(forgotten_at)
        assert gone == {
            key
            for key, when in forgotten_at.items()
            if when > at and key in held and (held[key][1] is None or held[key][1] > at)
        }


def test_as_of_shows_the_version_valid_then_and_what_one_reader_had_been_shown(server):
    word = marker()
    row = server.post("/v1/short", {"agent": "atlas", "key": word, "value": f"{word} first"}).body["id"]
    step()
    server.recall("sol", word, tiers="short")
    step()
    before = now_stamp()
    step()
    server.post("/v1/short", {"agent": "atlas", "key": word, "value": f"{word} second"})
    step()
    after = now_stamp()
    then = as_of(server, agent="nova", as_of=before, q=word)
    assert [(r["id"], r["text"]) for r in then["results"]] == [(row, f"{word} first")]
    assert [r["text"] for r in as_of(server, agent="nova", as_of=after, q=word)["results"]] == [f"{word} second"]
    shown = as_of(server, agent="sol", reader="sol", as_of=after)  # sol saw only the first version
    assert [(r["id"], r["text"]) for r in shown["results"]] == [(row, f"{word} first")]
    assert as_of(server, agent="nova", reader="nova", as_of=after)["results"] == []
    refused = server.get("/v1/recall/as_of", agent="nova", reader="sol", as_of=after)
    assert refused.status == 403 and refused.body["error"]["field"] == "reader"
    for bad in ("yesterday", "2026-13-01", "2026-01-01T00:00:00"):
        reply = server.get("/v1/recall/as_of", agent="nova", as_of=bad)
        assert reply.status == 400 and reply.body["error"]["field"] == "as_of"


# ==== No text of a forgotten row anywhere ====


def test_no_text_of_a_forgotten_row_stays_in_any_version_notice_as_of_answer_or_log(server):
    words = [marker() for _ in range(5)]
    short = server.post("/v1/short", {"agent": "atlas", "key": "door", "value": f"code {words[0]}"}).body["id"]
    long_id = server.post("/v1/long", {"agent": "atlas", "topic": "plant", "fact": f"pump {words[1]}"}).body["id"]
    server.recall("sol", words[0], tiers="short")
    server.recall("sol", words[1])
    step()
    moments = [now_stamp()]
    server.post("/v1/short", {"agent": "atlas", "key": "door", "value": f"code {words[2]}"})
    with server.db() as conn:  # one of the fleet's writers edits the fact in place: a version is kept
        conn.execute("UPDATE memory_longterm SET fact = ? WHERE id = ?", (f"pump {words[3]}", long_id))
    server.recall("sol", words[2], tiers="short")
    step()
    moments.append(now_stamp())
    with server.db() as conn:
        assert (
            conn.execute("SELECT count(*) FROM memory_version WHERE row_id IN (?, ?)", (short, long_id)).fetchone()[0]
            >= 2
        )
    for tier, row_id in (("short", short), ("long", long_id)):
        reply = server.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": tier, "id": row_id})
        assert reply.status == 200 and reply.body["wal_checkpoint"] == "complete", reply.body
    answers = [json.dumps(as_of(server, agent="sol", as_of=at, tiers="short,long")) for at in moments]
    answers += [json.dumps(as_of(server, agent="sol", reader="sol", as_of=at)) for at in moments]
    answers += [json.dumps(notices(server, "sol", include_acked="true"))]
    answers += [json.dumps(server.get("/v1/deliveries", agent="atlas").body)]
    for word in words[:4]:
        assert all(word not in answer for answer in answers)
        assert files_holding(server, word[2:]) == 0, word
    retracted = json.loads(answers[0])["retracted"]
    assert {(r["tier"], r["row_id"]) for r in retracted} == {("short", short), ("long", long_id)}
    kinds = sorted((n["tier"], n["kind"]) for n in json.loads(answers[-2]))
    # one open notice per (agent, row): the forget's replaced the superseded one
    assert kinds == [("long", "forgotten"), ("short", "forgotten")]


# ==== Notices on the event stream, REST and MCP ====


def test_a_notice_reaches_its_agent_through_read_events_whatever_the_filter_and_over_mcp(server):
    word = marker()
    row = server.post("/v1/long", {"agent": "atlas", "fact": f"{word} valve"}).body["id"]
    events = server.get("/v1/events", agent="sol", since=0, tiers="long").body
    assert [e["row_id"] for e in events["events"]] == [row]
    server.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": row})
    since = events["next_since"]
    narrow = server.get("/v1/events", agent="sol", since=since, tiers="episodic", q="unrelated", scope="own").body
    (notice,) = narrow["events"]
    assert notice["kind"] == "notice" and notice["row"] is None
    assert (notice["notice"]["row_id"], notice["notice"]["kind"]) == (row, "forgotten")
    assert server.get("/v1/events", agent="nova", since=since, tiers="long").body["events"] == [
        e
        for e in server.get("/v1/events", agent="nova", since=since, tiers="long").body["events"]
        if e["kind"] == "forget"
    ]
    read = server.mcp_tool("read_notices", {"agent": "sol"}).body["result"]["structuredContent"]
    assert [n["id"] for n in read["notices"]] == [notice["notice"]["id"]]
    acked = server.mcp_tool("ack_notices", {"agent": "sol", "ids": [notice["notice"]["id"]]})
    assert acked.body["result"]["structuredContent"]["acked"] == 1
    assert notices(server, "sol") == []
    assert len(notices(server, "sol", include_acked="true")) == 1


# ==== Who may read the delivery log ====


def test_an_author_sees_who_read_its_rows_the_operator_everything_and_no_one_else_anything(make_server, tmp_path):
    tokens = tmp_path / "tokens"
    write_tokens(tokens, {"a": "atlas", "s": "sol", "n": "nova", "op": solos_memory.OPERATOR})
    server = make_server("tokens.db", tokens_file=str(tokens))
    bearer = {name: {"Authorization": f"Bearer {name}"} for name in ("a", "s", "n", "op")}
    word = marker()
    row = server.request("POST", "/v1/long", body={"fact": f"{word} gauge"}, headers=bearer["a"]).body["id"]
    server.request("GET", "/v1/recall", query={"q": word}, headers=bearer["s"])
    step()

    def deliveries(who: str, **query) -> tuple[int, list]:
        reply = server.request("GET", "/v1/deliveries", query=query, headers=bearer[who])
        return reply.status, [(d["reader"], d["row_id"]) for d in (reply.body or {}).get("deliveries", [])]

    assert deliveries("a") == (200, [("sol", row)])
    assert deliveries("s") == (200, [])  # sol read it, but did not write it
    assert deliveries("n", agent="atlas")[0] == 403  # an agent's token never opens another's view
    assert deliveries("op") == (200, [("sol", row)])
    at = now_stamp()
    asked = server.request("GET", "/v1/recall/as_of", query={"reader": "sol", "as_of": at}, headers=bearer["op"])
    assert asked.status == 200 and [r["id"] for r in asked.body["results"]] == [row]
    refused = server.request("GET", "/v1/recall/as_of", query={"reader": "sol", "as_of": at}, headers=bearer["n"])
    assert refused.status == 403


# ==== The writer thread, its full buffer, and the daily purge ====


def test_a_failed_write_before_the_answer_is_buffered_and_retried_and_none_is_lost(tmp_path, monkeypatch):
    store = solos_store.Store(str(tmp_path / "solos.db"))
    store.migrate()
    log = solos_provenance.DeliveryLog(store, capacity=2, flush_s=3600)  # the thread never gets to it
    write = store.write

    def busy(work):
        raise solos_store.Busy("database is locked: held by the fleet")

    try:
        monkeypatch.setattr(store, "write", busy)
        log.record("sol", [("long", n, "atlas", "fact") for n in range(1, 4)] + [("durable", 9, "sol", "persona")])
        assert (log.stats()["deferred"], log.stats()["dropped"], len(log.pending())) == (2, 1, 2)
        monkeypatch.setattr(store, "write", write)
        assert log.flush() == 2
    finally:
        log.close()
    with sqlite3.connect(tmp_path / "solos.db") as conn:
        assert [r[0] for r in conn.execute("SELECT row_id FROM memory_delivery ORDER BY row_id")] == [1, 2]


def test_the_daily_purge_drops_deliveries_past_ninety_days_and_records_its_run(server):
    server.post("/v1/long", {"agent": "atlas", "fact": "kept a while"})
    server.recall("sol", "kept")
    server.server.memory.deliveries.flush()
    with server.db() as conn:
        conn.execute(
            "INSERT INTO memory_delivery (reader, tier, row_id, writer, delivered_at) "
            "VALUES ('nova', 'long', 1, 'atlas', strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-91 days'))"
        )
    assert solos_memory.main(["purge", "--db", str(server.db_path)]) == 0
    with server.db() as conn:
        assert [r[0] for r in conn.execute("SELECT reader FROM memory_delivery")] == ["sol"]
        run = conn.execute("SELECT result, rows FROM memory_job_run WHERE job = 'purge'").fetchone()
        assert tuple(run) == ("ok", 1)


# ==== The client and the Hermes provider surface them ====


def test_the_client_turns_open_notices_into_prompt_lines_once_and_acknowledges_them(server):
    import solos_client

    word = marker()
    row = server.post("/v1/long", {"agent": "atlas", "fact": f"{word} the old door code"}).body["id"]
    client = solos_client.Client(server.url, "sol")
    assert solos_client.turn_context(client, word)  # sol is shown the row
    server.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": row})
    text = solos_client.retraction_context(client)
    assert text.startswith("Facts you relied on were retracted")
    assert f"long row {row} by atlas: forgotten" in text and word not in text
    assert client.background.flush(5)  # the acknowledgement is queued, off the turn's path
    assert solos_client.retraction_context(client) == ""  # acknowledged: injected once
    dead = solos_client.Client("http://127.0.0.1:9", "sol", best_effort=True)
    assert solos_client.retraction_context(dead) == ""
