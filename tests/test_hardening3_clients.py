"""Hardening, round three (issue 31, items 15 and 16): the client and the Hermes provider fail where the
caller can see it, not in a background thread or by trusting any answer."""

from __future__ import annotations

import pytest
from conftest import FaultServer

import solos_client
import solos_memory
from solos_client import Client, Unavailable, record_turn


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


# Answers a write could meet from something that is not the service: a proxy, another service on the port.
FOREIGN_ANSWERS = [
    b'{"status": "ok"}',
    b'{"status": "created"}',
    b'{"status": "created", "id": 7, "tier": "long", "agent": "sol"}',
    b'{"status": "created", "id": true, "tier": "episodic", "agent": "sol"}',
]


@pytest.mark.parametrize("answer", FOREIGN_ANSWERS, ids=["ok", "no id", "wrong tier", "id true"])
def test_a_write_is_done_only_on_the_services_own_answer(answer):
    impostor = FaultServer(("http", 200, answer))
    try:
        with pytest.raises(Unavailable, match="not the service's answer"):
            Client(impostor.url, "sol").event("hermes_transcript", "part 1/1", idempotency_key="archive-1")
    finally:
        impostor.close()


def test_the_services_own_write_answers_are_accepted(server):
    client = Client(server.url, "sol")
    assert client.event("deploy", "Deployed the gateway", idempotency_key="gw-1")["status"] == "created"
    assert client.event("deploy", "Deployed the gateway", idempotency_key="gw-1")["status"] == "unchanged"
    fact = client.remember("The gateway runs on port 8443")
    assert fact["status"] == "created"
    assert client.forget("long", fact["id"])["status"] == "forgotten"


def test_the_write_answers_the_client_takes_are_the_services(server):
    for operation, (tier, statuses) in solos_client.WRITE_ANSWERS.items():
        output = solos_memory.OPERATIONS[operation].output_schema["properties"]
        assert statuses <= set(output["status"]["enum"]), operation
        assert tier is None or tier in output["tier"]["enum"], operation
