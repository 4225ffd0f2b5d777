"""PostgreSQL: the event cursor and idle transactions. Events are read below the oldest
running transaction, so one session idle in transaction holding an xid stopped every event of every copy for as
long as it lived. Now a transaction of another database is never waited for, one of this database at most
solos_store_pg.EVENT_WAIT_S (a gap tells readers what it may leave behind), and /health and stats show the
cursor stalled while it waits."""

from __future__ import annotations

import pytest
from conftest import start_server, stop_server, subscribed, wait_until

import solos_store_pg

pytestmark = pytest.mark.slow

psycopg = pytest.importorskip("psycopg")

READER = {"agent": "sol", "tiers": "long"}


def idle_in_transaction(url: str, fact: str | None = None) -> tuple[psycopg.Connection, int]:
    """A session that takes an xid (logging a fleet write of `fact` if given) and stays idle in transaction."""
    conn = psycopg.connect(url)
    if fact is not None:
        conn.execute("INSERT INTO memory_longterm (agent, fact) VALUES ('atlas', %s)", (fact,))
    return conn, int(conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0])


def events_since(running, since: int = 0) -> dict:
    reply = running.get("/v1/events", since=since, **READER)
    assert reply.status == 200, reply.body
    return reply.body


def facts(answer: dict) -> list[str]:
    return [event["row"]["text"] for event in answer["events"] if event.get("row")]


def with_facts(answer: dict) -> dict | None:
    return answer if facts(answer) else None


@pytest.fixture
def service(pg_url):
    running = start_server(pg_url)
    yield running
    stop_server(running)


def test_an_idle_transaction_in_another_database_holds_no_event(pg_cluster, pg_url, service, streams, monkeypatch):
    monkeypatch.setattr(solos_store_pg, "EVENT_WAIT_S", 3600.0)  # only the other database's rule can let it pass
    stream = subscribed(streams(service, READER))
    idle, _ = idle_in_transaction(pg_cluster.fresh_database())
    try:
        assert service.post("/v1/long", {"agent": "atlas", "fact": "written beside an idle session"}).status == 201
        answer = wait_until(lambda: facts(events_since(service)), "the write's event", timeout_s=10)
        assert answer == ["written beside an idle session"]
        assert stream.event(timeout=10)["row"]["text"] == "written beside an idle session"
        assert service.get("/health").body["event_cursor"] == "ok"
    finally:
        idle.close()


def test_an_idle_transaction_here_stalls_the_cursor_visibly_then_is_passed_with_a_gap(
    pg_url, service, streams, monkeypatch
):
    monkeypatch.setattr(solos_store_pg, "EVENT_WAIT_S", 6.0)
    monkeypatch.setattr(solos_store_pg, "HELD_SHOWN_S", 0.2)
    stream = subscribed(streams(service, READER))
    idle, xid = idle_in_transaction(pg_url, fact="written by a fleet session left open")
    try:
        assert service.post("/v1/long", {"agent": "atlas", "fact": "written while the session idles"}).status == 201
        # Held: nothing read past the idle session, and /health and stats say so.
        wait_until(lambda: service.get("/health").body["event_cursor"] == "stalled", "a stalled cursor in /health")
        held = service.get("/v1/stats").body["event_streams"]["cursor"]
        assert held["state"] in ("stalled", "skipping"), held
        assert facts(events_since(service)) == [] or held["state"] == "skipping"

        # Past the bound: the write arrives, with a gap naming the transaction and the ids it may still log.
        answer = wait_until(lambda: with_facts(events_since(service)), "the bound", timeout_s=30)
        assert facts(answer) == ["written while the session idles"]
        gap = answer["gap"]
        assert gap is not None and [one["xid"] for one in gap["not_waited_for"]] == [xid], gap
        assert gap["from"] <= answer["next_since"] and "recall to catch up" in gap["message"]
        live = [stream.next(timeout=10), stream.next(timeout=10)]
        assert live[0]["event"] == "gap" and live[0]["data"]["not_waited_for"][0]["xid"] == xid, live
        assert live[1]["data"]["row"]["text"] == "written while the session idles", live
        cursor = service.get("/v1/stats").body["event_streams"]["cursor"]
        assert cursor["state"] == "skipping" and cursor["not_waited_for"][0]["xid"] == xid, cursor
        assert cursor["not_waited_for"][0]["pid"] == idle.info.backend_pid and cursor["not_waited_for_total"] == 1
        assert service.get("/health").body["event_cursor"] == "skipping"

        # The session commits at last: its event lands inside the gap, read from any since before it.
        idle.commit()
        late = wait_until(
            lambda: [e for e in events_since(service)["events"] if e["row"]["text"].startswith("written by a fleet")],
            "the late event",
        )
        assert gap["from"] <= late[0]["id"] <= gap["through"] and late[0]["id"] < answer["next_since"]
        wait_until(lambda: service.get("/health").body["event_cursor"] == "ok", "the cursor back to ok")
    finally:
        idle.close()
