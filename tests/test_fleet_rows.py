"""Rows the fleet writes straight into the database that the schema lets through but the API would refuse: each
read skips them or shows them as they are, and the rest of every answer stays whole (no 500, no stalled thread)."""

from __future__ import annotations

import pytest
from conftest import WordHashEmbedder, subscribed, wait_for_vectors

import solos_store

STREAM_WAIT_S = 5.0


def insert_long(server, fact, agent="atlas", topic="t", tags=None) -> int:
    with server.db() as conn:  # one of the fleet's other writers, straight into solos.db
        return conn.execute(
            "INSERT INTO memory_longterm (agent, topic, fact, tags) VALUES (?, ?, ?, ?) RETURNING id",
            (agent, topic, fact, tags),
        ).fetchone()[0]


def test_a_stream_hands_out_a_row_stored_as_invalid_utf8_and_the_writes_after_it(server, streams):
    stream = subscribed(streams(server, {"agent": "sol"}))
    with server.db() as conn:
        odd = conn.execute(
            "INSERT INTO memory_longterm (agent, topic, fact) "
            "VALUES ('atlas', 't', CAST(X'6d61726b657220ff20627974657320eda080' AS TEXT)) RETURNING id"
        ).fetchone()[0]
    after = server.post("/v1/long", {"agent": "atlas", "fact": "written after the odd row"}).body["id"]
    got = stream.events(2, timeout=STREAM_WAIT_S)
    assert [(e["row_id"], e["agent"]) for e in got] == [(odd, "atlas"), (after, "atlas")]
    assert got[0]["row"]["text"].startswith("marker \ufffd bytes")
    assert got[1]["row"]["text"] == "written after the odd row"


@pytest.mark.parametrize(
    "tags,shown",
    [("[" * 5000 + "]" * 5000, None), ("not json", ["not json"]), ('{"a": 1}', None), ("[1, 2]", ["1", "2"])],
    ids=["nested 5000 deep", "not json", "an object", "numbers"],
)
def test_tags_that_are_not_the_services_json_never_fail_a_recall_or_an_events_page(server, tags, shown):
    odd = insert_long(server, "marker fact with odd tags", tags=tags)
    server.post("/v1/long", {"agent": "atlas", "fact": "marker fact written after"})
    for caller in ("sol", "atlas"):
        reply = server.recall(caller, "marker")
        assert reply.status == 200, reply.raw[:300]
        assert sorted(row["text"] for row in reply.body["results"]) == [
            "marker fact with odd tags",
            "marker fact written after",
        ]
        row = next(row for row in reply.body["results"] if row["id"] == odd)
        assert shown is None or row["tags"] == shown
        page = server.get("/v1/events", agent=caller, since=0)
        assert page.status == 200 and [e["row_id"] for e in page.body["events"]][:1] == [odd], page.raw[:300]


@pytest.mark.parametrize(
    "column,value",
    [("fact", b"marker blob fact"), ("agent", b"atlas"), ("topic", b"\xff\xfe"), ("confidence", b"\x01")],
    ids=["fact", "agent", "topic", "confidence"],
)
def test_a_blob_where_text_belongs_is_read_as_text_by_every_read(server, column, value):
    """A number in a TEXT column is stored as text (SQLite's affinity), but a blob stays a blob; one in a REAL
    column reads as no number."""
    row = {"agent": "atlas", "topic": "t", "fact": "marker odd row", "confidence": 0.5} | {column: value}
    with server.db() as conn:
        odd = conn.execute(
            "INSERT INTO memory_longterm (agent, topic, fact, confidence) VALUES (?, ?, ?, ?) RETURNING id",
            (row["agent"], row["topic"], row["fact"], row["confidence"]),
        ).fetchone()[0]
    good = server.post("/v1/long", {"agent": "atlas", "fact": "marker fact written after"}).body["id"]
    for caller in ("sol", "atlas"):
        for q in ("marker", ""):
            reply = server.recall(caller, q, k=10)
            assert reply.status == 200, reply.raw[:300]
            rows = {row["id"]: row for row in reply.body["results"]}
            assert good in rows and all(isinstance(row[f], str) for row in rows.values() for f in ("agent", "text"))
        page = server.get("/v1/events", agent=caller, since=0)
        assert page.status == 200 and good in [e["row_id"] for e in page.body["events"]], page.raw[:300]
        assert all(isinstance(e["agent"], str) for e in page.body["events"])
        past = server.get("/v1/recall/as_of", agent=caller, q="marker", as_of="2099-01-01T00:00:00.000Z")
        assert past.status in (200, 400), past.raw[:300]
    assert odd in rows  # sol's recall in scope shared: shown, as the text its bytes say
    assert rows[odd]["confidence"] == (None if column == "confidence" else 0.5)
    stats = server.get("/v1/stats")
    assert stats.status == 200, stats.raw[:300]
    assert server.get("/").status == 200
    assert server.mcp_tool("recall", {"agent": "sol", "q": "marker"}).body["result"]["isError"] is False


def test_a_blob_fact_gets_its_vector_once_from_the_text_its_bytes_spell(embedded_server):
    embedder = WordHashEmbedder()
    server = embedded_server(embedder)
    odd = insert_long(server, b"marker blob fact")
    server.server.memory.worker.wake.set()
    wait_for_vectors(server, 1)
    with server.db() as conn:
        stored = conn.execute("SELECT embedding FROM memory_longterm WHERE id = ?", (odd,)).fetchone()[0]
    assert stored == embedder.vector("atlas (t): marker blob fact").astype("<f4").tobytes()


def test_an_opt_in_whose_writer_is_a_blob_shares_nothing_and_fails_no_recall(server):
    atlas = server.post("/v1/episodic", {"agent": "atlas", "event_type": "e", "summary": "marker private"}).body
    own = server.post("/v1/episodic", {"agent": "sol", "event_type": "e", "summary": "marker own"}).body
    with server.db() as conn:
        conn.execute("INSERT INTO episodic_sharing (agent, shared) VALUES (?, 1)", (b"atlas",))
    for archive in ("false", "true"):
        reply = server.recall("sol", "marker", tiers="episodic", archive=archive)
        assert reply.status == 200, reply.raw[:300]
        assert [row["id"] for row in reply.body["results"]] == [own["id"]]
    past = server.get("/v1/recall/as_of", agent="sol", q="marker", tiers="episodic", as_of=solos_store.utc_now())
    assert past.status == 200 and atlas["id"] not in [row["id"] for row in past.body["results"]], past.raw[:300]
    page = server.get("/v1/events", agent="sol", since=0, tiers="episodic")
    assert page.status == 200 and [e["row_id"] for e in page.body["events"]] == [own["id"]], page.raw[:300]


def test_text_that_is_not_utf8_is_logged_for_the_operator_once_per_connection_not_per_read(server, capsys):
    with server.db() as conn:
        conn.execute(
            "INSERT INTO memory_longterm (agent, topic, fact) VALUES ('atlas', 't', CAST(X'6d61726b657220ff' AS TEXT))"
        )
    said = []
    for _ in range(3):
        for _ in range(10):
            assert server.recall("sol", "marker").status == 200
        said.append([line for line in capsys.readouterr().err.splitlines() if '"text_not_utf8"' in line])
    assert said[0] and said[1:] == [[], []], said
    assert all('"column": "fact"' in line and "\\ufffd" not in line for line in said[0])


def test_a_persona_whose_value_is_a_blob_is_read_as_its_text(server):
    with server.db() as conn:
        conn.execute("INSERT INTO memory_durable (key, value) VALUES ('persona/atlas', ?)", (b"marker persona",))
    reply = server.recall("atlas", "marker", tiers="durable")
    assert reply.status == 200, reply.raw[:300]
    assert [row["text"] for row in reply.body["results"]] == ["marker persona"]
    page = server.get("/v1/events", agent="atlas", since=0, tiers="durable")
    assert page.status == 200 and [e["row"]["text"] for e in page.body["events"]] == ["marker persona"], page.raw
