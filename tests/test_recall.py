"""The read contract: attribution, foreign labels, scopes, tiers, tags, sharing, audited reads, expiry, FTS5 safety,
the relevance floor and the receipt."""

from __future__ import annotations

import json
import threading
import time

import pytest
from conftest import metric_samples, require_embedder, start_server, stop_server

import solos_judge
import solos_memory

RESULT_FIELDS = {"id", "tier", "agent", "ts", "score", "source", "foreign", "text"}


def write_long(server, agent: str, fact: str, **extra) -> dict:
    reply = server.post("/v1/long", {"agent": agent, "fact": fact, **extra})
    assert reply.status in (200, 201), reply.body
    return reply.body


def write_episode(server, agent: str, summary: str, **extra) -> dict:
    reply = server.post("/v1/episodic", {"agent": agent, "event_type": "task", "summary": summary, **extra})
    assert reply.status == 201, reply.body
    return reply.body


def texts(reply) -> list[str]:
    return [r["text"] for r in reply.body["results"]]


def test_every_result_carries_attribution_and_the_foreign_label(server):
    write_long(server, "atlas", "Kubernetes upgrades happen on Tuesdays", topic="infra", source="runbook")
    write_long(server, "sol", "Kubernetes dashboards live on grafana.internal")
    server.post("/v1/short", {"agent": "sol", "key": "k8s", "value": "kubernetes node drain in progress"})
    reply = server.recall("sol", "kubernetes", k=10)
    assert reply.status == 200
    results = reply.body["results"]
    assert len(results) == 3
    for result in results:
        assert RESULT_FIELDS <= set(result)
        assert result["foreign"] == (result["agent"] != "sol")
        assert isinstance(result["score"], float)
    by_text = {r["text"]: r for r in results}
    assert by_text["Kubernetes upgrades happen on Tuesdays"]["agent"] == "atlas"
    assert by_text["Kubernetes upgrades happen on Tuesdays"]["source"] == "runbook"
    assert by_text["kubernetes node drain in progress"]["tier"] == "short"


def test_keyword_recall_ranks_by_bm25_with_stemming(server):
    write_long(server, "atlas", "The release was planned for Friday")
    write_long(server, "atlas", "Lunch menus rotate weekly")
    write_long(server, "atlas", "Planning meetings: the release plan, the release date, the release notes")
    reply = server.recall("sol", "releases planning", k=5)
    assert reply.body["ranking"] == "keyword"
    assert texts(reply)[0].startswith("Planning meetings")
    assert "Lunch menus rotate weekly" not in texts(reply)
    scores = [r["score"] for r in reply.body["results"]]
    assert scores == sorted(scores, reverse=True)


def test_empty_query_returns_most_recent_rows(server):
    for n in range(4):
        write_long(server, "atlas", f"fact number {n}")
    reply = server.recall("sol", "", k=3)
    assert reply.body["ranking"] == "recency"
    assert texts(reply) == ["fact number 3", "fact number 2", "fact number 1"]


def test_scopes(server):
    write_long(server, "atlas", "atlas knows the gateway port")
    write_long(server, "sol", "sol knows the gateway host")
    everyone = {r["agent"] for r in server.recall("sol", "gateway", k=10).body["results"]}
    own = {r["agent"] for r in server.recall("sol", "gateway", scope="own").body["results"]}
    others = {r["agent"] for r in server.recall("sol", "gateway", scope="shared_except_self").body["results"]}
    assert (everyone, own, others) == ({"atlas", "sol"}, {"sol"}, {"atlas"})


def test_filters_apply_before_the_top_k(server):
    """Many better-matching rows from others must not push the caller's own row out of scope=own."""
    for n in range(30):
        write_long(server, "atlas", f"deploy deploy deploy checklist item {n}")
    write_long(server, "sol", "my deploy note")
    own = server.recall("sol", "deploy", k=1, scope="own")
    assert texts(own) == ["my deploy note"]


def test_default_tiers_are_long_and_short(server):
    write_long(server, "atlas", "alpha long")
    server.post("/v1/short", {"agent": "atlas", "key": "a", "value": "alpha short"})
    write_episode(server, "sol", "alpha episode")
    reply = server.recall("sol", "alpha", k=10)
    assert reply.body["tiers"] == ["long", "short"]
    assert {r["tier"] for r in reply.body["results"]} == {"long", "short"}
    only_episodic = server.recall("sol", "alpha", tiers="episodic")
    assert texts(only_episodic) == ["alpha episode"]


def test_tiers_are_validated(server):
    reply = server.recall("sol", "x", tiers="long,memories")
    assert reply.status == 400 and reply.body["error"]["field"] == "tiers"
    assert "memories" in reply.body["error"]["message"]


def add_persona(server, agent: str, text: str) -> None:
    with server.db() as conn:
        conn.execute("INSERT INTO memory_durable (key, value) VALUES (?, ?)", (f"persona/{agent}", text))


def test_durable_is_never_default_and_only_the_callers_own_persona(server):
    add_persona(server, "sol", "Sol is the fleet's careful planner")
    add_persona(server, "atlas", "Atlas is the fleet's planner of infrastructure")
    assert server.recall("sol", "planner").body["results"] == []
    reply = server.recall("sol", "planner", tiers="durable,long")
    assert [(r["tier"], r["agent"], r["text"]) for r in reply.body["results"]] == [
        ("durable", "sol", "Sol is the fleet's careful planner")
    ]
    assert reply.body["results"][0]["foreign"] is False


def test_the_persona_is_never_given_a_relevance_no_judge_set(server):
    """The caller's persona came back with relevance 1.0: a certainty no judge gave, under a receipt naming the
    judge (or none, for an empty q, whose relevance is documented null)."""
    add_persona(server, "sol", "Sol is the fleet's careful planner")
    for q in ("planner", ""):
        reply = server.recall("sol", q, tiers="durable", min_relevance=0.9)
        assert [(r["tier"], r["relevance"]) for r in reply.body["results"]] == [("durable", None)], reply.body
        assert reply.body["below_floor"] == 0  # listed first, whatever the floor, as before


def test_asking_for_other_agents_durable_rows_is_403(server):
    add_persona(server, "atlas", "Atlas persona")
    reply = server.recall("sol", "persona", tiers="durable", scope="shared_except_self")
    assert reply.status == 403 and reply.body["error"]["field"] == "tiers"


def test_foreign_episodic_rows_need_the_authors_opt_in_and_are_audited(server):
    write_episode(server, "atlas", "atlas restarted the payment queue")
    write_episode(server, "sol", "sol restarted the search queue")
    before = server.recall("sol", "restarted queue", tiers="episodic", k=10)
    assert {r["agent"] for r in before.body["results"]} == {"sol"}
    assert server.get("/v1/audit", agent="atlas").body["reads"] == []

    opt_in = server.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True})
    assert opt_in.status == 201 and opt_in.body["episodic"] is True
    after = server.recall("sol", "restarted queue", tiers="episodic", k=10)
    foreign = [r for r in after.body["results"] if r["foreign"]]
    assert [(r["agent"], r["text"]) for r in foreign] == [("atlas", "atlas restarted the payment queue")]

    audit = server.get("/v1/audit", agent="atlas").body
    assert [(a["reader"], a["author"], a["row_id"]) for a in audit["reads"]] == [("sol", "atlas", foreign[0]["id"])]
    assert audit["reads"][0]["read_at"]
    assert server.get("/v1/audit", agent="sol").body["reads"] == []  # own reads are not foreign

    server.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": False})
    again = server.recall("sol", "restarted queue", tiers="episodic", k=10)
    assert {r["agent"] for r in again.body["results"]} == {"sol"}


def test_own_episodic_rows_are_always_readable(server):
    write_episode(server, "atlas", "atlas private event")
    assert texts(server.recall("atlas", "private event", tiers="episodic")) == ["atlas private event"]


@pytest.mark.slow
def test_expired_short_rows_are_never_returned(server):
    server.post("/v1/short", {"agent": "atlas", "key": "soon", "value": "ephemeral marker", "ttl_s": 0.3})
    server.post("/v1/short", {"agent": "atlas", "key": "later", "value": "durable marker", "ttl_s": 600})
    assert len(server.recall("atlas", "marker", tiers="short", k=10).body["results"]) == 2
    time.sleep(0.4)
    assert texts(server.recall("atlas", "marker", tiers="short", k=10)) == ["durable marker"]
    assert texts(server.recall("atlas", "", tiers="short", k=10)) == ["durable marker"]


def test_rows_written_directly_by_other_writers_are_seen_on_the_next_request(server):
    with server.db() as conn:
        conn.execute(
            "INSERT INTO memory_longterm (agent, topic, fact) VALUES ('atlas', 'direct', 'zeppelin hangar doors')"
        )
    hit = server.recall("sol", "zeppelin")
    assert texts(hit) == ["zeppelin hangar doors"] and hit.body["results"][0]["agent"] == "atlas"
    with server.db() as conn:
        conn.execute("UPDATE memory_longterm SET fact = 'airship hangar doors' WHERE topic = 'direct'")
    assert server.recall("sol", "zeppelin").body["results"] == []
    assert texts(server.recall("sol", "airship")) == ["airship hangar doors"]
    with server.db() as conn:
        conn.execute("DELETE FROM memory_longterm WHERE topic = 'direct'")
    assert server.recall("sol", "airship").body["results"] == []
    assert server.recall("sol", "").body["results"] == []


def test_identical_texts_are_collapsed_and_counted(server):
    write_long(server, "atlas", "The VPN endpoint is vpn.example.org", topic="a")
    write_long(server, "sol", "The VPN endpoint is vpn.example.org", topic="b")
    with server.db() as conn:  # the fleet's data holds literal duplicates from one agent too
        conn.execute(
            "INSERT INTO memory_longterm (agent, fact) VALUES ('atlas', 'The VPN endpoint is vpn.example.org')"
        )
    write_long(server, "atlas", "The VPN uses WireGuard")
    reply = server.recall("nova", "VPN endpoint", k=5)
    assert sorted(texts(reply)) == ["The VPN endpoint is vpn.example.org", "The VPN uses WireGuard"]
    assert reply.body["suppressed_duplicates"] == 2
    kept = next(r for r in reply.body["results"] if r["text"].endswith("example.org"))
    assert kept["duplicates"] == 2
    stats = server.get("/v1/stats").body
    assert stats["duplicates_suppressed"] == 2


def test_duplicates_do_not_shrink_the_result_below_k(server):
    for agent in ("atlas", "sol", "hermes", "nova"):
        write_long(server, agent, "the same shared fact about printers")
    for n in range(3):
        write_long(server, "atlas", f"a different printer fact {n}")
    reply = server.recall("sol", "printer fact", k=4)
    assert len(reply.body["results"]) == 4
    assert len(set(texts(reply))) == 4


@pytest.mark.parametrize("transport", ["rest", "mcp"])
def test_a_foreign_episode_revealed_only_as_a_duplicate_is_audited(server, transport):
    assert server.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True}).status == 201
    text = "deployed the canary to the west fleet"
    atlas_row = server.post("/v1/episodic", {"agent": "atlas", "event_type": "deploy", "summary": text}).body["id"]
    server.post("/v1/episodic", {"agent": "sol", "event_type": "deploy", "summary": text})
    # Naming sol in the question ranks sol's copy first; atlas's row then shows only as also_written_by.
    query = {"agent": "sol", "q": "sol canary west fleet", "tiers": "episodic"}
    if transport == "rest":
        body = server.get("/v1/recall", **query).body
    else:
        body = server.mcp_tool("recall", {**query, "tiers": ["episodic"]}).body["result"]["structuredContent"]
    assert body["count"] == 1 and body["suppressed_duplicates"] == 1
    shown = body["results"][0]
    assert shown["agent"] == "sol" and shown["also_written_by"] == ["atlas"]
    reads = server.get("/v1/audit", agent="atlas").body["reads"]
    assert [(r["reader"], r["row_id"]) for r in reads] == [("sol", atlas_row)]


@pytest.mark.parametrize(
    "q",
    [
        '"unbalanced quote',
        "NEAR(a b)",
        "a AND OR NOT b",
        "col:value",
        "*",
        "^start",
        "a -b",
        "(((",
        "'; DROP TABLE memory_longterm; --",
        "ünïcödé façade",
        "日本語のテキスト",
        "emoji 🚀 rocket",
        "\x01\x02",
        "  ",
        "-",
        "x" * 10_000,
        "word " * 2_000,
        "\"\" '' `` {} [] <> \\",
    ],
)
def test_any_query_text_works(server, q):
    write_long(server, "atlas", "façade repair and rocket launch")
    reply = server.recall("sol", q, k=3)
    assert reply.status == 200, reply.body
    assert reply.body["degraded"] is True
    assert reply.headers["x-memory-degraded"] == "true"


def test_unicode_words_match_without_diacritics(server):
    write_long(server, "atlas", "façade repair scheduled")
    assert texts(server.recall("sol", "facade")) == ["façade repair scheduled"]


def mcp_payload(reply) -> tuple[bool, dict]:
    result = reply.body["result"]
    return result.get("isError", False), json.loads(result["content"][0]["text"])


def test_recall_filters_by_tags_on_rest_and_mcp(server):
    server.post("/v1/long", {"agent": "atlas", "fact": "Prefers dark mode in every editor", "tags": ["preference"]})
    server.post("/v1/long", {"agent": "sol", "fact": "Editor preference survey closes Friday", "tags": ["survey"]})
    server.post(
        "/v1/short", {"agent": "sol", "key": "theme", "value": "dark mode editor", "tags": ["preference", "ui"]}
    )
    server.post("/v1/episodic", {"agent": "sol", "event_type": "task", "summary": "editor preference changed"})
    with server.db() as conn:  # another writer of the fleet stores tags as a comma list
        conn.execute(
            "INSERT INTO memory_longterm (agent, fact, tags) VALUES ('atlas', 'editor font', 'ui, preference')"
        )
    rest = server.recall("nova", "editor", tags="preference", tiers="long,short,episodic", min_relevance=0)
    assert rest.status == 200
    assert {r["text"] for r in rest.body["results"]} == {
        "Prefers dark mode in every editor",
        "dark mode editor",
        "editor font",
    }
    newest = server.recall("nova", "", tags="preference,ui", tiers="long,short", k=10)
    assert [r["text"] for r in newest.body["results"]] == [
        "editor font",
        "dark mode editor",
        "Prefers dark mode in every editor",
    ]
    own = server.recall("sol", "editor", tags="preference", scope="own", tiers="long,short", min_relevance=0)
    assert [r["text"] for r in own.body["results"]] == ["dark mode editor"]
    error, payload = mcp_payload(
        server.mcp_tool("recall", {"agent": "nova", "q": "editor", "tags": ["survey"], "min_relevance": 0})
    )
    assert not error and [r["text"] for r in payload["results"]] == ["Editor preference survey closes Friday"]
    bad = server.recall("nova", "editor", tags="x" * 65)
    assert bad.status == 400 and bad.body["error"]["field"] == "tags"


@pytest.fixture(scope="module")
def model_server(tmp_path_factory):
    """A service with the real embedder (MiniLM), holding the docs' A2A example and a burst of unrelated facts."""
    require_embedder()
    running = start_server(tmp_path_factory.mktemp("floor") / "solos.db", model_dir=None)
    running.post("/v1/long", {"agent": "atlas", "topic": "ops", "fact": "The backup job runs nightly at 02:00 UTC"})
    for n in range(40):
        running.post("/v1/long", {"agent": "sol", "fact": f"burst fact {n} about rotating certificates"})
    yield running
    stop_server(running)


def test_the_readme_examples_inject_no_unrelated_rows(model_server):
    import solos_client
    from solos_client import Client, turn_context

    client = Client(model_server.url, "nova")
    context = turn_context(client, "When does the backup job run?")
    assert context.splitlines()[1:] == ["- [atlas, foreign; long] The backup job runs nightly at 02:00 UTC"]
    assert turn_context(client, "who owns the kubernetes cluster") == ""
    floor = solos_client.TURN_MIN_RELEVANCE
    assert floor == solos_memory.solos_rank.RELEVANCE_FLOOR > 0
    honest = model_server.recall("nova", "who owns the kubernetes cluster", min_relevance=floor).body
    assert (honest["count"], honest["ranking"], honest["degraded"]) == (0, "hybrid", False)
    assert honest["below_floor"] == 5 == honest["receipt"]["below_floor"]
    everything = model_server.recall("nova", "who owns the kubernetes cluster").body  # the API keeps every match
    assert everything["count"] == 5 and everything["below_floor"] == 0 and everything["min_relevance"] == 0
    assert all(0 <= r["relevance"] < floor for r in everything["results"])


def test_relevance_is_a_probability_and_the_floor_is_a_choice(server):
    for n in range(12):
        server.post("/v1/long", {"agent": "atlas", "fact": f"cluster note {n}: nodes drained for the upgrade"})
    server.post("/v1/long", {"agent": "atlas", "fact": "The kubernetes cluster is owned by the platform team"})
    found = server.recall("nova", "who owns the kubernetes cluster", k=20, min_relevance=0).body
    assert found["count"] == 13 and found["ranking"] == "keyword"
    relevance = [r["relevance"] for r in found["results"]]
    assert all(0 <= value <= 1 for value in relevance)
    assert found["results"][0]["text"] == "The kubernetes cluster is owned by the platform team"
    assert relevance[0] == max(relevance) > relevance[1]
    cut = (relevance[0] + relevance[1]) / 2
    kept = server.recall("nova", "who owns the kubernetes cluster", k=20, min_relevance=cut).body
    assert kept["count"] == 1 and kept["below_floor"] == 12 and kept["receipt"]["below_floor"] == 12
    unjudged = server.recall("nova", "", min_relevance=0.99).body  # no question, nothing to judge by
    assert unjudged["count"] == 5 and unjudged["min_relevance"] == 0  # the floor it applied, not the one asked
    assert server.recall("nova", "cluster", min_relevance=1.5).status == 400


def test_the_receipt_never_counts_rows_the_caller_may_not_read(server):
    server.post("/v1/episodic", {"agent": "atlas", "event_type": "task", "summary": "private migration notes"})
    server.post("/v1/episodic", {"agent": "atlas", "event_type": "task", "summary": "private migration plan"})
    server.post("/v1/long", {"agent": "sol", "fact": "the migration is on Tuesday"})
    query = {"tiers": "long,episodic", "min_relevance": 0}
    theirs = server.recall("nova", "migration", **query).body
    counts = {"legs": ["keyword"], "considered": 1, "below_floor": 0, "without_vector": None}
    assert {key: theirs["receipt"][key] for key in counts} == counts
    own = server.recall("atlas", "migration", **query).body
    assert own["receipt"]["considered"] == 3
    error, payload = mcp_payload(server.mcp_tool("recall", {"agent": "nova", "q": "migration", "tiers": ["episodic"]}))
    assert not error and payload["count"] == 0 and payload["receipt"]["considered"] == 0


def test_recall_caller_must_be_registered(server):
    reply = server.recall("mallory", "x")
    assert reply.status == 422 and "mallory" in reply.body["error"]["message"]


@pytest.mark.parametrize("k", ["0", "101", "-1", "5x", "", "1.5"])
def test_k_must_be_1_to_100(server, k):
    reply = server.request("GET", f"/v1/recall?agent=sol&k={k}")
    assert reply.status == 400 and reply.body["error"]["field"] == "k"


def test_keyword_recall_says_it_is_degraded(server):
    reply = server.recall("sol", "anything")
    assert reply.body["degraded"] is True and "keyword" in reply.body["degraded_reason"]
    assert reply.headers["x-memory-degraded"] == "true"
    health = server.get("/health")
    assert health.status == 200 and health.body["degraded"] is True


def test_stats_expose_counts_hits_and_rejections(server):
    write_long(server, "atlas", "stats fact")
    server.post("/v1/short", {"agent": "atlas", "key": "gone", "value": "v", "ttl_s": 0.01})
    time.sleep(0.05)
    server.recall("sol", "stats")
    server.recall("sol", "nothing matches this")
    server.recall("mallory", "x")
    stats = server.get("/v1/stats").body
    assert stats["rows"]["long"] == 1 and stats["rows"]["short"] == 0 and stats["rows"]["short_expired"] == 1
    assert stats["recall_hits"] == {"long": 1}
    assert stats["recall_empty"] == 1
    assert stats["rejections"] == {"unknown_agent": 1}
    assert stats["recent_rejections"][0]["agent"] == "mallory"
    assert stats["degraded"] is True


def test_the_fact_after_a_match_in_the_same_topic_is_recalled_too(server):
    """Conversation memory: the answer often follows the matching line under the same topic."""
    write_long(server, "sol", "What did you cook for the picnic?", topic="2026-05-01 picnic")
    write_long(server, "atlas", "Lemon risotto with peas.", topic="2026-05-01 picnic")
    write_long(server, "atlas", "Lemon sorbet recipe", topic="desserts")
    reply = server.recall("nova", "picnic", k=5)
    assert texts(reply)[:2] == ["What did you cook for the picnic?", "Lemon risotto with peas."]
    assert "Lemon sorbet recipe" not in texts(reply)
    scoped = server.recall("atlas", "picnic", scope="own", k=5)
    assert texts(scoped) == ["Lemon risotto with peas."]  # entering through a neighbour still obeys scope


def queries_asked(monkeypatch) -> list[str]:
    """The FTS5 queries the keyword leg asks from now on, in order (Store.ranked_rows recorded)."""
    asked: list[str] = []
    real = solos_memory.Store.ranked_rows

    def recording(store, conn, tier, seen, match, limit, tags=()):
        asked.append(match)
        return real(store, conn, tier, seen, match, limit, tags)

    monkeypatch.setattr(solos_memory.Store, "ranked_rows", recording)
    return asked


@pytest.mark.slow
def test_a_word_every_row_has_is_left_out_of_the_query_and_the_ranking_stands(make_server, monkeypatch):
    """A word in half the rows or more has no BM25 weight (FTS5 clamps its IDF), but matching it scores every row:
    the query leaves it out, and the rows the other words find come back in the same order."""
    import solos_rank

    monkeypatch.setattr(solos_rank, "COMMON_WORDS_MIN_ROWS", 10)
    pruned, full = make_server("a.db", rerank=False), make_server("b.db", rerank=False)
    for server in (pruned, full):
        for n in range(24):
            extra = " the boiler" + " pilot light" * (n // 5) + " went out" if n % 5 == 0 else ""  # scores differ
            write_long(server, "atlas", f"Melanie said turn {n} of the diary{extra}", topic=f"day {n}")
    asked = queries_asked(monkeypatch)
    question = "what did Melanie say about the boiler"
    first = pruned.recall("sol", question, k=10, tiers="long")
    assert asked == ['"melanie" OR "say" OR "boiler"']  # not known yet: asked as always, checked in the background
    pruned.server.memory.common_words.checker.submit(lambda: None).result()  # the check is done
    asked.clear()
    got = pruned.recall("sol", question, k=10, tiers="long")
    assert asked == ['"say" OR "boiler"']
    assert texts(got) == [text for text in texts(first) if "boiler" in text]
    monkeypatch.setattr(solos_rank, "COMMON_WORDS_MIN_ROWS", 10**9)  # the other service: every word asked
    asked.clear()
    want = full.recall("sol", question, k=10, tiers="long")
    assert asked == ['"melanie" OR "say" OR "boiler"']
    boiler = [r["text"] for r in want.body["results"] if "boiler" in r["text"]]
    assert texts(got) == boiler
    assert len(boiler) == 5 and len({r["score"] for r in got.body["results"]}) == 5


def test_a_question_whose_words_match_too_many_rows_reads_a_bounded_share_and_says_so(make_server, monkeypatch):
    """The keyword leg reads every row each OR-ed word matches: 64 words each in a tenth of 100k episodes scored
    over 600k matches (336 ms, 45x an ordinary recall) though none is common. Once the words' counts are known, a
    tier's query keeps the rarest words within KEYWORD_READ_BUDGET matches (the rarest always), and the receipt
    names the words left out."""
    import solos_rank

    monkeypatch.setattr(solos_rank, "COMMON_WORDS_MIN_ROWS", 10)
    monkeypatch.setattr(solos_rank, "KEYWORD_READ_BUDGET", 12)
    server = make_server(rerank=False)
    for n in range(24):  # alpha in 10 rows, beta in 8, gamma in 2: none in half of them
        words = ["alpha"] * (n < 10) + ["beta"] * (10 <= n < 18) + ["gamma"] * (n in (0, 10))
        write_long(server, "atlas", f"entry {n} " + " ".join(words))
    asked = queries_asked(monkeypatch)
    checker, counting = server.server.memory.common_words.checker, threading.Event()
    checker.submit(counting.wait, 30)  # the count the recall queues comes after it, not (under load) during it
    first = server.recall("sol", "alpha beta gamma", k=30, tiers="long")
    assert asked == ['"alpha" OR "beta" OR "gamma"']  # not known yet: asked whole, counted in the background
    assert first.body["receipt"]["words_left_out"] == []
    counting.set()
    checker.submit(lambda: None).result()
    asked.clear()
    cut = server.recall("sol", "alpha beta gamma", k=30, tiers="long")
    assert asked == ['"beta" OR "gamma"']  # 8 + 2 matches fit the 12; alpha's 10 more would not
    assert cut.body["receipt"]["words_left_out"] == ["alpha"]
    assert cut.body["count"] == 9 and all("alpha" not in t or "gamma" in t for t in texts(cut))
    monkeypatch.setattr(solos_rank, "KEYWORD_READ_BUDGET", 1)
    asked.clear()
    rarest = server.recall("sol", "alpha beta gamma", k=30, tiers="long")
    assert asked == ['"gamma"']  # past the budget alone, the rarest word is still asked
    assert rarest.body["receipt"]["words_left_out"] == ["alpha", "beta"]
    assert rarest.body["count"] == 2


def test_the_reranker_and_judge_read_a_bounded_share_of_each_long_row(server, monkeypatch):
    """The reranker's and the judge's features are Python over every token of the rows they read: 20 short values
    of 16k characters, full of ids and names, took 148 ms of CPU (40x an ordinary recall here). Each reads a row's
    first RANKED_TEXT_CHARS characters; the answer still carries the whole row."""
    import solos_judge
    import solos_rank

    read: list[int] = []
    for module, name in ((solos_judge, "row_tokens"), (solos_rank, "stems")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda text, real=real: read.append(len(text)) or real(text))
    value = " ".join(f"INC-{n} Ilse Vermeer pay-app-{n % 97} Q{n % 4 + 1} staging" for n in range(500))[:16_370]
    for n in range(25):
        reply = server.post("/v1/short", {"agent": "atlas", "key": f"k{n}", "value": f"kestrel {n} {value}"})
        assert reply.status == 201, reply.body
    got = server.recall("sol", "What did Ilse say about INC-2207 on pay-app-01 in Q3 staging kestrel?", k=5)
    assert got.status == 200 and got.body["count"] == 5
    assert all(len(r["text"]) > 16_000 for r in got.body["results"])  # the answer: whole rows
    assert len(read) >= 40 and max(read) <= solos_rank.RANKED_TEXT_CHARS < 16_000


def test_a_question_of_only_common_words_still_asks_for_them(make_server, monkeypatch):
    import solos_rank

    monkeypatch.setattr(solos_rank, "COMMON_WORDS_MIN_ROWS", 10)
    server = make_server()
    for n in range(12):
        write_long(server, "atlas", f"Melanie wrote diary entry {n}")
    assert server.recall("sol", "Melanie diary", k=5).body["count"] == 5
    server.server.memory.common_words.checker.submit(lambda: None).result()
    known = server.server.memory.common_words.known
    assert {word for (_, word), (_, common) in known.items() if common} == {"melanie", "diary"}
    assert server.recall("sol", "Melanie diary", k=5).body["count"] == 5


@pytest.mark.slow
@pytest.mark.parametrize("rows", [3, 130, 20_000])
def test_the_index_row_count_is_read_from_fts5_without_a_scan(server, rows):
    """Store.indexed_rows reads FTS5's own record (a varint: one, two and three bytes here), kept on deletes."""
    import solos_memory

    with server.db() as conn:
        facts = [(f"f{n}",) for n in range(rows)]
        conn.executemany("INSERT INTO memory_longterm (agent, topic, fact) VALUES ('atlas', '', ?)", facts)
        conn.execute("DELETE FROM memory_longterm WHERE id = (SELECT min(id) FROM memory_longterm)")
    store = server.server.memory.store
    counted = store.read(lambda conn: store.indexed_rows(conn, solos_memory.TIER_TABLE["long"]))
    assert counted == rows - 1


# ==== The judge sets relevance ====


def test_relevance_is_the_judges_and_the_receipt_names_it(server):
    write_long(server, "atlas", "payments-api serves on port 8443; TLS ends on the pod.")
    write_long(server, "atlas", "search-api listens on 8088 behind haproxy.")
    reply = server.recall("sol", "What port does payments-api listen on?", tiers="long", k=5)
    receipt = reply.body["receipt"]
    assert receipt["judge"] == solos_judge.load().name("keyword") and receipt["judge_reason"] is None
    assert receipt["judge"].startswith("features-keyword@")
    assert all(0.0 <= r["relevance"] <= 1.0 for r in reply.body["results"])
    assert reply.body["results"][0]["text"].startswith("payments-api")
    assert server.recall("sol", "", tiers="long").body["receipt"]["judge"] is None  # recency: nothing judged


def test_a_question_of_only_stop_words_keeps_the_rerankers_relevance(server):
    """A turn's "what is it?" holds no word the judge reads: its fit read every row as lacking nothing and gave
    it 0.09 in keyword recall (0.5-0.75 in hybrid), over the turn floor, against the reranker's 0.002; a chat's
    every short reply brought unrelated memory into the prompt."""
    import solos_client

    write_long(server, "atlas", "It was the one that we had before, and it is what it is.")
    write_long(server, "atlas", "payments-api serves on port 8443.")
    reply = server.recall("sol", "what is it?", tiers="long", k=5)
    assert reply.status == 200 and reply.body["results"]
    receipt = reply.body["receipt"]
    assert receipt["judge"] == "relevance" and "no words to judge by" in receipt["judge_reason"]
    assert all(0.0 <= r["relevance"] < solos_client.TURN_MIN_RELEVANCE for r in reply.body["results"])


@pytest.mark.parametrize("content", [None, b"{not json", b'{"format": 1, "models": {}, "floor": 0.1}'])
def test_a_missing_or_corrupt_judge_file_degrades_to_relevance_with_its_reason(
    make_server, monkeypatch, tmp_path, content
):
    path = tmp_path / "judge.json"
    if content is not None:
        path.write_bytes(content)
    monkeypatch.setattr(solos_judge, "JUDGE_PATH", path)  # Memory loads it once, at start
    served = make_server()
    write_long(served, "atlas", "payments-api serves on port 8443.")
    reply = served.recall("sol", "What port does payments-api listen on?", tiers="long")
    assert reply.status == 200
    receipt = reply.body["receipt"]
    assert receipt["judge"] == "relevance" and receipt["judge_reason"]
    assert ("unreadable" if content is None else "sha256") in receipt["judge_reason"]
    assert 0.0 < reply.body["results"][0]["relevance"] <= 1.0


def test_health_and_stats_say_when_recall_cannot_use_the_judge(make_server, monkeypatch, tmp_path):
    """A missing judge file turned every recall's relevance into the reranker's calibration while /health,
    /v1/stats and the status page said nothing of it: only a reader of each receipt could tell."""
    monkeypatch.setattr(solos_judge, "JUDGE_PATH", tmp_path / "judge.json")  # missing
    served = make_server()
    write_long(served, "atlas", "payments-api serves on port 8443.")
    receipt = served.recall("sol", "What port does payments-api listen on?", tiers="long").body["receipt"]
    for surface in (served.get("/health"), served.get("/v1/stats"), served.get("/v1/stats", agent="sol")):
        judge = surface.body["judge"]
        assert judge["state"] == "unavailable" and judge["reason"] == receipt["judge_reason"], judge
    assert "judge file unreadable" in served.get("/status").raw.decode()
    assert metric_samples(served, "solos_memory_judge_unavailable") == {"": 1.0}


def test_health_and_stats_say_the_judge_is_ready(server):
    for surface in (server.get("/health"), server.get("/v1/stats")):
        judge = surface.body["judge"]
        assert (judge["state"], judge["reason"]) == ("ready", None), judge
        assert judge["name"] == f"features@{solos_judge.JUDGE_SHA256[:8]}"
    assert metric_samples(server, "solos_memory_judge_unavailable") == {"": 0.0}


def test_a_floor_is_read_as_a_program_prints_it(server):
    """A client sends str(float): 17 significant digits, or an exponent for a small value."""
    server.post("/v1/long", {"agent": "atlas", "fact": "The kubernetes cluster is owned by the platform team"})
    for printed in ("0.42358799999999996", "1e-05", "2.5E-3", "0"):
        reply = server.get("/v1/recall", agent="nova", q="kubernetes cluster", min_relevance=printed)
        assert reply.status == 200, (printed, reply.body)
        assert reply.body["min_relevance"] == float(printed)
    for wrong in ("0.1.2", "1e", "abc", "1" * 21):
        reply = server.get("/v1/recall", agent="nova", q="kubernetes cluster", min_relevance=wrong)
        assert reply.status == 400 and "min_relevance" in reply.body["error"]["message"], (wrong, reply.body)
