"""Hardening, round three (issue 31, items 15 and 16): the client and the Hermes provider fail where the
caller can see it, not in a background thread or by trusting any answer."""

from __future__ import annotations

import pytest

import solos_client
from solos_client import Client, record_turn


@pytest.mark.parametrize(
    "wrong",
    [{"duration_s": 1.5}, {"outcome": None}, {"reply": None}],
    ids=["unknown keyword", "outcome None", "reply None"],
)
def test_record_turn_with_a_wrong_argument_fails_at_the_call(server, wrong):
    client = Client(server.url, "sol")
    arguments = {"message": "When do backups run?", "reply": "At 02:00 UTC.", "turn_id": "t-1", **wrong}
    with pytest.raises(TypeError):
        record_turn(client, **arguments)
    assert client.background.counts["queued"] == 0  # nothing handed to the thread to fail there
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_episodic").fetchone()[0] == 0


def test_record_turn_still_queues_and_writes_a_right_one(server):
    client = Client(server.url, "sol")
    assert record_turn(client, "When do backups run?", "At 02:00 UTC.", turn_id="t-2", outcome="answered") == {
        "status": "queued"
    }
    assert client.background.flush(10)
    assert client.background.counts == {"queued": 1, "written": 1, "failed": 0, "dropped": 0}
    again = solos_client.write_turn(client, "When do backups run?", "At 02:00 UTC.", turn_id="t-2", outcome="answered")
    assert again["status"] == "unchanged"  # the same turn, the same key: one row
