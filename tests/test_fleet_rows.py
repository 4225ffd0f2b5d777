"""Rows the fleet writes straight into the database that the schema lets through but the API would refuse: each
read skips them or shows them as they are, and the rest of every answer stays whole (no 500, no stalled thread)."""

from __future__ import annotations

from conftest import subscribed

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
