"""The learned reranker over the fused top rows: its ranking inputs, and that it only ever reorders."""

from __future__ import annotations

import gc
import itertools
import re
import socket
import tracemalloc
import uuid

import pytest
from conftest import AGENTS, start_server, stop_server
from hypothesis import HealthCheck, given, settings, strategies as st

import solos_memory
import solos_rank

NAMES = ("alice", "bob", "carol", "dave", "erin", "frank")
DAYS = ("2024-01-10", "2024-02-14", "2024-04-22", "2024-06-01", "2024-07-19", "2024-03-05")  # 5 March last


def write_long(server, agent: str, fact: str, topic: str = "") -> dict:
    reply = server.post("/v1/long", {"agent": agent, "fact": fact, "topic": topic})
    assert reply.status == 201, reply.body
    return reply.body


def texts(reply) -> list[str]:
    return [r["text"] for r in reply.body["results"]]


@pytest.fixture
def pair(tmp_path):
    """Two services on one database: the reranker on, and off (the first pass's order)."""
    on, off = start_server(tmp_path / "solos.db"), start_server(tmp_path / "solos.db", rerank=False)
    yield on, off
    stop_server(on)
    stop_server(off)


def test_keyword_recall_is_reranked_and_says_so(pair):
    on, off = pair
    write_long(on, "atlas", "The release train leaves on Fridays")
    reply = on.recall("sol", "release train")
    assert (reply.body["ranking"], reply.body["reranked"]) == ("keyword", True)
    assert 0 < reply.body["results"][0]["score"] <= 1
    assert off.recall("sol", "release train").body["reranked"] is False
    assert on.recall("sol", "").body["reranked"] is False  # recency is never reranked


def test_a_question_naming_a_date_prefers_rows_from_that_date(pair):
    """Rows the first pass cannot tell apart; the one whose topic names 5 March 2024 was written last."""
    on, off = pair
    for name, day in zip(NAMES, DAYS):
        write_long(on, "atlas", f"The boiler was serviced by {name}.", topic=f"{day} boiler")
    first_pass = off.recall("sol", "Who serviced the boiler on 5 March 2024?", k=6)
    assert len({r["score"] for r in first_pass.body["results"]}) == 1  # a tie: the date words match every topic
    undated = texts(on.recall("sol", "Who serviced the boiler?", k=6))
    assert undated[-1] == "The boiler was serviced by frank."
    for question in (
        "Who serviced the boiler on 5 March 2024?",
        "Who serviced the boiler on March 5, 2024?",
        "Who serviced the boiler in March 2024?",
    ):
        dated = texts(on.recall("sol", question, k=6))
        assert dated.index("The boiler was serviced by frank.") <= 1, (question, dated)
    assert texts(on.recall("sol", "Who serviced the boiler on 5 March 2019?", k=6)) == undated


def test_a_row_without_a_dated_topic_is_dated_by_when_it_was_written(pair):
    on, off = pair
    for name in NAMES:
        write_long(on, "atlas", f"The boiler was serviced by {name}.")
    with on.db() as conn:  # a fleet writer's rows, written on those days
        for name, day in zip(NAMES, DAYS):
            conn.execute(
                "UPDATE memory_longterm SET updated_at = ? WHERE fact = ?",
                (f"{day}T10:00:00.000Z", f"The boiler was serviced by {name}."),
            )
    assert len({r["score"] for r in off.recall("sol", "boiler serviced 5 March 2024", k=6).body["results"]}) == 1
    assert texts(on.recall("sol", "Who serviced the boiler?", k=6))[-1] == "The boiler was serviced by frank."
    dated = texts(on.recall("sol", "Who serviced the boiler on 5 March 2024?", k=6))
    assert dated.index("The boiler was serviced by frank.") <= 1, dated


def test_a_row_that_only_asks_ranks_below_the_row_that_answers_it(pair):
    on, off = pair
    write_long(on, "sol", "What did you cook for the picnic?", topic="2026-05-01 picnic")
    write_long(on, "atlas", "I cooked lemon risotto with peas for the picnic.", topic="2026-05-01 picnic")
    write_long(on, "hermes", "Lemon sorbet recipe for a summer picnic", topic="desserts")
    write_long(on, "nova", "The picnic tables need new paint.", topic="garden")
    assert texts(off.recall("sol", "picnic cooking"))[0] == "What did you cook for the picnic?"
    assert texts(on.recall("sol", "picnic cooking"))[:2] == [
        "I cooked lemon risotto with peas for the picnic.",
        "What did you cook for the picnic?",
    ]


def test_a_row_after_a_matching_question_ranks_as_its_answer(pair):
    """The same reply under two topics: after a question that asks what we ask, and after a statement."""
    on, off = pair
    write_long(on, "sol", "Who rotated the deploy keys last night?", topic="deploys")
    write_long(on, "atlas", "Hermes did, right after the outage review.", topic="deploys")
    write_long(on, "sol", "Somebody rotated the deploy keys last night.", topic="ops")
    write_long(on, "atlas", "Hermes did, right after the outage review!", topic="ops")
    for filler in ("Deploy keys live in the vault under ci/deploy.", "Rotate deploy keys every quarter."):
        write_long(on, "nova", filler, topic=filler)
    reranked = texts(on.recall("nova", "who rotated the deploy keys", k=6))
    assert reranked.index("Hermes did, right after the outage review.") < reranked.index(
        "Hermes did, right after the outage review!"
    )
    first_pass = texts(off.recall("nova", "who rotated the deploy keys", k=6))
    assert reranked.index("Hermes did, right after the outage review.") < first_pass.index(
        "Hermes did, right after the outage review."
    )


@pytest.mark.parametrize(
    "topic",
    ["31 February, 2023", "2023-13-45", "0 May, 2023", "99 Smarch, 2024", "2023-02-29", "May 2023", "🚀 3 May, 1899"],
)
@pytest.mark.parametrize(
    "question",
    [
        "what happened on 31 February 2023",
        "what happened on 0 May 2023",
        "what happened on February 30, 2024",
        "what happened in 1899",
        "what happened on 29 February 2023 or 29 February 2024",
        "what happened in Smarch 2023",
        "what happened last week",
    ],
)
def test_odd_dates_never_fail_a_recall(server, topic, question):
    write_long(server, "atlas", "something happened", topic=topic)
    reply = server.recall("sol", question)
    assert reply.status == 200 and reply.body["reranked"] is True
    assert texts(reply) == ["something happened"]


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200) | st.from_regex(r"\d{1,2} [A-Za-z]{3,9},? (19|20)\d\d|(19|20)\d\d-\d\d-\d\d"))
def test_date_parsing_never_raises(text):
    window = solos_rank.date_window(text)
    assert window is None or window[0] <= window[1]
    day = solos_rank.parse_row_date(text)
    assert day is None or day > 0


def test_a_failing_reranker_keeps_the_first_pass_and_says_why(pair, monkeypatch):
    on, off = pair
    for n in range(5):
        write_long(on, "atlas", f"incident {n} on the payment gateway" + " again" * n, topic=f"incident {n}")

    def broken(*args, **kwargs):
        raise ValueError("a row the reranker cannot read")

    monkeypatch.setattr(solos_rank, "head_logits", broken)
    reply = on.recall("sol", "payment gateway incident", k=5)
    assert reply.status == 200
    assert (reply.body["reranked"], reply.body["degraded"]) == (False, True)
    assert "reranker failed (ValueError: a row the reranker cannot read)" in reply.body["degraded_reason"]
    assert "keyword-only" in reply.body["degraded_reason"]  # the embedder's reason stays
    assert reply.headers["x-memory-degraded"] == "true"
    first_pass = off.recall("sol", "payment gateway incident", k=5).body["results"]
    assert reply.body["results"] == first_pass


def test_a_failing_reranker_says_its_rows_passed_the_floor_unjudged(pair, monkeypatch):
    """Its rows have no relevance, so min_relevance let every one through, while the answer said the floor was
    applied with none below it and only that the order was the first pass's: a turn helper's floor was void."""
    on, _ = pair
    for n in range(3):
        write_long(on, "atlas", f"incident {n} on the payment gateway", topic=f"incident {n}")

    def broken(*args, **kwargs):
        raise ValueError("a row the reranker cannot read")

    monkeypatch.setattr(solos_rank, "head_logits", broken)
    reply = on.recall("sol", "payment gateway incident", k=5, min_relevance=0.9)
    assert reply.status == 200 and reply.body["count"] == 3  # the reranker cannot fail a recall
    assert all(r["relevance"] is None for r in reply.body["results"])
    assert "min_relevance 0.9 not applied" in reply.body["degraded_reason"] and reply.body["min_relevance"] == 0
    unfloored = on.recall("sol", "payment gateway incident", k=5).body["degraded_reason"]
    assert "reranker failed" in unfloored and "min_relevance" not in unfloored  # nothing to say without a floor


def test_reranking_never_reaches_the_network(pair, monkeypatch):
    on, _ = pair
    write_long(on, "sol", "Where is the offsite this year?", topic="offsite")
    write_long(on, "atlas", "Lisbon, in the old tram depot, on 3 June 2026.", topic="offsite")
    attempts = []
    real_connect = socket.socket.connect

    def loopback_only(sock, address):
        if not (isinstance(address, tuple) and address[0] in ("127.0.0.1", "::1")):
            attempts.append(address)
            raise OSError("no network in tests")
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", loopback_only)
    real_getaddrinfo = socket.getaddrinfo

    def resolve_loopback_only(host, *args, **kwargs):
        if host not in ("127.0.0.1", "::1", "localhost"):
            attempts.append(host)
            raise OSError("no name resolution in tests")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve_loopback_only)
    reply = on.recall("nova", "where is the offsite in June 2026")
    assert reply.status == 200 and reply.body["reranked"] is True
    assert attempts == []


# ---- reranking only reorders: the same rows are allowed, the same reads are audited ----

COUNTER = itertools.count()
words = st.sampled_from(["deploy", "keys", "rotated", "outage", "vault", "review", "gateway", "picnic", "2024"])
sentences = st.lists(words, min_size=1, max_size=6).map(" ".join)
endings = st.sampled_from(["", "?", ".", " on 5 March 2024"])


@pytest.fixture(scope="module")
def shared_pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("rerank-props") / "solos.db"
    on, off = start_server(path), start_server(path, rerank=False)
    yield on, off
    stop_server(on)
    stop_server(off)


def audited(server, author: str) -> list[tuple]:
    return sorted((a["reader"], a["row_id"]) for a in server.get("/v1/audit", agent=author, limit=1000).body["reads"])


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_reranking_only_reorders_what_the_rules_allow(shared_pair, data):
    on, off = shared_pair
    n = next(COUNTER)
    agents = [f"r{n}-agent{i}" for i in range(3)]
    solos_memory.register_agents(solos_memory.Config(db=str(on.db_path)), agents)
    tag = "m" + uuid.uuid4().hex[:12]
    topics = [f"{tag} thread {i}" for i in range(2)] + [""]
    for i in range(data.draw(st.integers(1, 10))):  # texts differ (w<i>): no duplicate collapses
        agent, ending = data.draw(st.sampled_from(agents)), data.draw(endings)
        text = f"{data.draw(sentences)} w{i}"
        tier = data.draw(st.sampled_from(["long", "short", "episodic"]))
        if tier == "long":
            on.post(
                "/v1/long",
                {"agent": agent, "fact": f"{tag} {text}{ending}", "topic": data.draw(st.sampled_from(topics))},
            )
        elif tier == "short":
            ttl = data.draw(st.sampled_from([0.001, 600]))
            on.post(
                "/v1/short", {"agent": agent, "key": uuid.uuid4().hex, "value": f"{tag} {text}{ending}", "ttl_s": ttl}
            )
        else:
            on.post("/v1/episodic", {"agent": agent, "event_type": "task", "summary": f"{tag} {text}{ending}"})
    for agent in agents:
        on.request("PUT", "/v1/sharing", body={"agent": agent, "episodic": data.draw(st.booleans())})
    query = {
        "q": f"{tag} {data.draw(sentences)}{data.draw(endings)}",
        "scope": data.draw(st.sampled_from(["own", "shared", "shared_except_self"])),
        "tiers": ",".join(data.draw(st.sets(st.sampled_from(["long", "short", "episodic"]), min_size=1))),
    }
    caller = data.draw(st.sampled_from(agents))
    before = {author: audited(on, author) for author in agents}
    reranked = on.recall(caller, k=100, **query).body
    between = {author: audited(on, author) for author in agents}
    first_pass = off.recall(caller, k=100, **query).body
    after = {author: audited(on, author) for author in agents}
    assert reranked["reranked"] is True and first_pass["reranked"] is False
    rows = sorted((r["tier"], r["id"]) for r in reranked["results"])
    assert rows == sorted((r["tier"], r["id"]) for r in first_pass["results"])
    assert reranked["suppressed_duplicates"] == first_pass["suppressed_duplicates"]
    for author in agents:
        assert len(between[author]) - len(before[author]) == len(after[author]) - len(between[author])
    scores = [r["score"] for r in reranked["results"]]
    assert all(0 <= s <= 1 for s in scores) and scores == sorted(scores, reverse=True)
    k = data.draw(st.integers(1, 5))
    top = on.recall(caller, k=k, **query).body["results"]
    assert {(r["tier"], r["id"]) for r in top} <= set(rows)
    assert len(top) == min(k, len(rows))


def test_every_registered_agent_can_be_named(server):
    """A writer's name in the question is a ranking input; it never filters."""
    for agent in AGENTS:
        write_long(server, agent, f"{agent} owns the gateway rota")
    reply = server.recall("sol", "who owns the gateway rota, atlas?", k=10)
    assert {r["agent"] for r in reply.body["results"]} == set(AGENTS)


def test_rerank_is_a_serve_setting_flag_over_environment(monkeypatch, capsys):
    def rerank(*argv: str) -> bool:
        return solos_memory.config_from(solos_memory.parse_args(["serve", *argv])).rerank

    assert rerank() is True and rerank("--rerank", "off") is False
    monkeypatch.setenv("SOLOS_MEMORY_RERANK", "off")
    assert rerank() is False and rerank("--rerank", "on") is True
    monkeypatch.setenv("SOLOS_MEMORY_RERANK", "yes")
    with pytest.raises(SystemExit):
        rerank()
    assert "expected on or off, got 'yes'" in capsys.readouterr().err


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.text())
def test_a_text_shape_is_its_words_prefixes_length_and_question_mark(text):
    """The cached shape is what the reranker was fitted on: 5-letter prefixes of \\w+ words, lower-cased."""
    shape = solos_rank.text_shape(text)
    assert shape.stems == {word[: solos_rank.STEM_LENGTH] for word in re.findall(r"\w+", text.lower())}
    assert (shape.words, shape.asks) == (len(text.split()), text.rstrip().endswith("?"))


def test_a_recall_reads_each_rows_topic_neighbours_once(pair, monkeypatch):
    """The keyword leg's neighbour read serves the reranker too: no row's neighbours are asked for twice."""
    on, _ = pair
    for turn in range(12):
        write_long(on, "atlas", f"Turn {turn} about the boiler and its pilot light", topic="2026-05-01 boiler")
    write_long(on, "sol", "The boiler pilot light is out again?", topic="2026-05-02 boiler")
    asked: list[int] = []
    real = solos_memory.Store.topic_neighbours

    def counted(store, conn, ids):
        asked.extend(ids)
        return real(store, conn, ids)

    monkeypatch.setattr(solos_memory.Store, "topic_neighbours", counted)
    reply = on.recall("nova", "boiler pilot light", k=5)
    assert reply.body["reranked"] is True and reply.body["count"] == 5
    assert asked and len(asked) == len(set(asked))


@pytest.mark.slow
def test_what_recall_keeps_of_the_texts_it_met_stays_small_however_long_they_are(server):
    """The per-text caches hold short texts only: a writer of 16 KiB values must not pin the service's memory.

    Each such value's shape kept ~0.36 MiB: at TEXT_SHAPES_KEPT of them, 730 MiB of RSS stayed after the recalls.
    """

    def word(n: int) -> str:  # distinct in its first five letters, so one stem each
        return "".join("abcdefghijklmnopqrstuvwxyz"[n // 26**place % 26] for place in range(4))

    for i in range(60):  # distinct words up to the longest value a write takes
        value = f"group{i // 20} " + " ".join(word(i * 4000 + j) for j in range(3300))
        assert server.post("/v1/short", {"agent": "atlas", "key": f"k{i}", "value": value[:16_384]}).status == 201
    server.recall("sol", "group2", tiers="short", k=20)  # what a first recall sets up, before measuring
    tracemalloc.start()
    try:
        for group in (0, 1):
            reply = server.recall("sol", f"group{group}", tiers="short", k=20)
            assert (reply.body["count"], reply.body["reranked"]) == (20, True)
        del reply  # 0.6 MiB of texts on this side
        gc.collect()
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept < 2**20, f"{kept / 2**20:.1f} MiB kept after recalling 40 long values"


def test_a_rewritten_value_is_ranked_by_its_new_text(make_server):
    """Whatever recall remembers per text, a short row upserted in place (same id) is ranked as if written anew."""
    rewritten, fresh = make_server("rewritten.db"), make_server("fresh.db")
    pad = {"agent": "atlas", "key": "pad", "value": "unrelated"}
    assert fresh.post("/v1/short", pad).status == 201  # so the two databases' rows have different ids
    for server in (rewritten, fresh):
        assert server.post("/v1/short", {"agent": "atlas", "key": "other", "value": "boiler pilot light"}).status == 201
    question = {"agent": "atlas", "key": "pilot", "value": "Is the boiler pilot light out again?"}
    assert rewritten.post("/v1/short", question).status == 201

    def recall(server) -> dict[str, tuple[int, float]]:
        reply = server.recall("sol", "boiler pilot light", tiers="short", k=2)
        return {r["text"]: (r["id"], r["score"]) for r in reply.body["results"]}

    first = recall(rewritten)
    statement = {**question, "value": "The boiler pilot light is out again, all of it."}
    for server in (rewritten, fresh):
        assert server.post("/v1/short", statement).status in (200, 201)
    assert fresh.request("DELETE", "/v1/short", query={"agent": "atlas", "key": "pad"}).status == 200
    after, anew = recall(rewritten), recall(fresh)
    assert after[statement["value"]][0] == first[question["value"]][0]  # the same row, rewritten
    assert after[statement["value"]][0] != anew[statement["value"]][0]
    assert [(text, score) for text, (_, score) in after.items()] == [(t, score) for t, (_, score) in anew.items()]


def candidate(text: str, keyword: float | None) -> dict:
    return {"text": text, "agent": "atlas", "keyword": keyword}


QUESTION_STEMS = solos_rank.content_stems(
    solos_rank.query_words("Who led the response when customers were billed twice?")
)


def test_keyword_strength_is_the_best_coverage_among_the_keyword_legs_first_rows():
    assert QUESTION_STEMS == {"led", "respo", "custo", "bille", "twice"}
    rows = {
        ("long", 1): candidate("our response playbook", 3.0),  # 1 of 5
        ("long", 2): candidate("customers billed twice in March", 2.0),  # 3 of 5
        ("long", 3): candidate("a response", 1.0),
        ("long", 4): candidate("he led the response: customers billed twice", 0.5),  # 5 of 5, but fourth
        ("long", 5): candidate("led by nobody", None),  # only the vector leg found it
    }
    assert solos_rank.keyword_strength(QUESTION_STEMS, rows) == pytest.approx(3 / 5)
    del rows[("long", 2)]
    assert solos_rank.keyword_strength(QUESTION_STEMS, rows) == pytest.approx(1.0)  # now among the first three
    assert solos_rank.keyword_strength(QUESTION_STEMS, {("long", 5): candidate("led", None)}) == 0.0
    assert solos_rank.keyword_strength(frozenset(), rows) == 1.0  # no content word: nothing to judge by


def weak_candidates() -> tuple[dict, dict]:
    """30 rows matching one incidental word, and 5 only the vector leg found, its best 3 among them."""
    rows = {("long", n): candidate(f"response step {n}", 1.0) for n in range(30)}  # each fused at 0.7 or more
    rows |= {("long", 100 + n): candidate(f"paraphrase {n}", None) for n in range(5)}
    similar = {key: 0.3 for key in list(rows)[:30]} | {("long", 100 + n): 0.9 - n / 10 for n in range(5)}
    return rows, similar


def test_a_weak_question_seats_the_vector_legs_best_in_the_rerankers_head():
    rows, similar = weak_candidates()
    fused = solos_rank.fuse(rows, similar, "hybrid", QUESTION_STEMS)
    depth = solos_rank.RERANK_DEPTH
    seated = {("long", 100 + n) for n in range(solos_rank.HEAD_VECTOR_ROWS)}
    assert fused.head == depth + len(seated)
    assert set(fused.keys[depth : fused.head]) == seated  # the vector leg's best, none of which fusion ranked in
    assert [r["score"] for r in fused.rows[depth : fused.head]] == [fused.rows[depth - 1]["score"]] * len(seated)
    scores = [r["score"] for r in fused.rows]
    assert scores == sorted(scores, reverse=True)  # below the head, fusion's order as it was
    assert len(fused.rows) == len(rows)


@pytest.mark.parametrize(
    "ranking, stems",
    [("hybrid", solos_rank.content_stems(["response", "step"])), ("keyword", QUESTION_STEMS)],
)
def test_a_question_the_keyword_leg_covers_or_keyword_ranking_seats_nothing(ranking, stems):
    rows, similar = weak_candidates()
    fused = solos_rank.fuse(rows, similar if ranking == "hybrid" else {}, ranking, stems)
    assert fused.head == solos_rank.RERANK_DEPTH
    assert not {("long", 100 + n) for n in range(5)} & set(fused.keys[: fused.head])
