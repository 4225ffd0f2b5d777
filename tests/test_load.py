"""In-flight requests and queueing in /v1/stats and on the status page: counts, no timings."""

from __future__ import annotations

import http.client
import socket
import threading

from conftest import wait_until

import solos_memory


def test_in_flight_rises_during_a_slow_request_and_falls_after(server, monkeypatch):
    entered, release = threading.Event(), threading.Event()
    invoke = solos_memory.invoke

    def held_recall(memory, tokens, op, args, headers):
        if op.name == "recall":
            entered.set()
            release.wait(10)
        return invoke(memory, tokens, op, args, headers)

    monkeypatch.setattr(solos_memory, "invoke", held_recall)
    idle = socket.create_connection(("127.0.0.1", server.port))  # open, sends nothing: a connection, not in flight
    answers: list[int] = []

    def recall() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", "/v1/recall?agent=atlas&q=anything")
        answers.append(conn.getresponse().status)
        conn.close()

    slow = threading.Thread(target=recall)
    slow.start()
    try:
        assert entered.wait(10)
        during = server.get("/v1/stats").body["load"]
        page = server.get("/status").raw.decode()
    finally:
        release.set()
        slow.join(10)
        idle.close()
    assert answers == [200]

    def settled() -> dict | None:  # a handler leaves flight just after its answer's write, so the client may ask first
        load = server.get("/v1/stats").body["load"]
        return load if load["in_flight"] == 1 else None

    after = wait_until(settled, "the recall's handler to leave flight")
    # The held recall and the stats request asking; the idle socket is open but not in flight.
    assert during["in_flight"] == 2 and during["in_flight_max"] >= 2
    assert during["connections"] >= 3 and during["connections_max"] >= during["connections"]
    assert during["waiting_for_slot"] == 0 and during["refused"] == 0
    # The most at once never goes down (the page's request may overlap the stats request still leaving flight).
    assert after["in_flight_max"] >= during["in_flight_max"]
    assert 'id="load"' in page and "requests in flight now" in page


def test_a_refused_newcomer_is_counted(server):
    ours, theirs = socket.socketpair()
    try:
        server.server.refuse(theirs)
        assert ours.recv(65536).startswith(b"HTTP/1.1 503 ")
    finally:
        ours.close()
    assert server.get("/v1/stats").body["load"]["refused"] == 1
