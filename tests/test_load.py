"""In-flight requests and queueing in /v1/stats and on the status page: counts, no timings."""

from __future__ import annotations

import http.client
import socket
import threading

import pytest
from conftest import Dom, answers_stuck, unread_answers, wait_until

import solos_connections
import solos_memory
from solos_errors import Busy


@pytest.fixture
def held_recalls(monkeypatch):
    """Recalls block inside the operation until released: they hold their admission places."""
    entered, release = threading.Semaphore(0), threading.Event()
    invoke = solos_memory.invoke

    def held_recall(memory, tokens, op, args, headers):
        if op.name == "recall":
            entered.release()
            release.wait(20)
        return invoke(memory, tokens, op, args, headers)

    monkeypatch.setattr(solos_memory, "invoke", held_recall)
    yield entered, release
    release.set()


def test_in_flight_rises_during_a_slow_request_and_falls_after(server, held_recalls):
    entered, release = held_recalls
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
        assert entered.acquire(timeout=10)
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


# ==== Admission: at most N requests run at once, the rest wait in turn (solos_connections.Admission) ====


def test_admission_lets_waiters_in_first_come_first_served():
    admission = solos_connections.Admission(1, queue_most=8, wait_s=30)
    admission.enter()  # the one place, held
    order: list[int] = []

    def wait_in_turn(number: int) -> None:
        with admission.admitted():
            order.append(number)

    threads = []
    for number in range(6):  # each joins the queue before the next starts: arrival order is known
        threads.append(threading.Thread(target=wait_in_turn, args=(number,)))
        threads[-1].start()
        wait_until(lambda n=number: len(admission.queue) == n + 1, f"waiter {number} to queue")
    admission.leave()
    for thread in threads:
        thread.join(10)
    assert order == list(range(6))
    load = admission.load()
    assert load["running"] == 0 and load["queued"] == 0 and load["queued_max"] == 6
    assert load["admitted_after_waiting"] == 6 and load["running_max"] == 1


def test_a_place_freed_goes_to_the_oldest_waiter_never_to_a_newcomer():
    admission = solos_connections.Admission(1, queue_most=8, wait_s=30)
    admission.enter()
    admitted, done = threading.Event(), threading.Event()

    def waiter() -> None:
        with admission.admitted():
            admitted.set()
            done.wait(10)

    thread = threading.Thread(target=waiter)
    thread.start()
    wait_until(lambda: len(admission.queue) == 1, "the waiter to queue")
    admission.leave()
    assert admission.running == 1 and not admission.queue  # handed over, never free for anyone to take
    admission.wait_s = 0.01
    with pytest.raises(Busy) as late:  # the newcomer queues behind the place's new holder, and gives up
        admission.enter()
    done.set()
    thread.join(10)
    assert admitted.is_set() and late.value.reason == "queue_wait" and admission.running == 0


def recall_in_background(server, answers: list) -> threading.Thread:
    def recall() -> None:
        answers.append(server.recall("atlas", "anything").status)

    thread = threading.Thread(target=recall)
    thread.start()
    return thread


@pytest.fixture
def one_place_held(make_server, held_recalls):
    """hold(**bounds): a server with one place for reads, taken by a held recall, and the recalls' statuses
    (filled as they end); `bounds` set the reads' Admission (queue_most, wait_s). Released at the end."""
    entered, release = held_recalls
    answers: list[int] = []
    threads: list[threading.Thread] = []

    def hold(**bounds: float) -> tuple:
        server = make_server(admit=1)
        for name, value in bounds.items():
            setattr(server.server.admission, name, value)
        threads.append(recall_in_background(server, answers))
        assert entered.acquire(timeout=10)
        return server, answers, threads

    yield hold
    release.set()
    for thread in threads:
        thread.join(10)


def test_a_full_queue_answers_503_busy_naming_the_reason_and_the_stats_show_the_queue(one_place_held, held_recalls):
    server, answers, threads = one_place_held(queue_most=1)
    threads.append(recall_in_background(server, answers))
    wait_until(lambda: server.get("/v1/stats").body["load"]["queued"] == 1, "the second recall to queue")
    refused = server.recall("atlas", "anything")
    during = server.get("/v1/stats").body["load"]
    page = server.get("/status").raw.decode()
    held_recalls[1].set()
    wait_until(lambda: len(answers) == 2, "both recalls to end")
    assert refused.status == 503 and refused.headers["retry-after"] == "1"
    assert refused.body["error"]["code"] == "busy" and refused.body["error"]["reason"] == "queue_full"
    assert "queue full" in refused.body["error"]["message"]
    assert answers == [200, 200]  # the queued one ran once the place came free: nothing lost
    assert during["running"] == 1 and during["running_most"] == 1 and during["queued"] == 1
    assert during["busy_queue_full"] == 1 and during["queued_max"] == 1
    after = server.get("/v1/stats").body
    assert after["load"]["queued"] == 0 and after["load"]["admitted_after_waiting"] == 1
    assert after["rejections"]["busy"] == 1
    assert "waiting for a place now" in page and "refused: queue full (503)" in page


def test_the_page_does_not_count_a_full_queue_as_a_locked_database(one_place_held):
    """Every 503 busy counted as "busy: database locked (503)" on the page, the admission queue's refusals too:
    an operator sent looking for a writer holding the lock when the service was short of CPU."""
    server, _, _ = one_place_held(queue_most=0)  # full: a read that would queue is refused at once
    assert server.recall("atlas", "anything").body["error"]["reason"] == "queue_full"
    stats = server.get("/v1/stats").body
    assert stats["rejections"]["busy"] == 1 and stats["busy_reasons"] == {"queue_full": 1}
    service = Dom(server.get("/status").raw.decode()).rows("service")
    assert service["busy: database locked (503)"] == ["0"]
    assert service["503 in all"] == ["1"]
    assert Dom(server.get("/status").raw.decode()).rows("load")["refused: queue full (503)"] == ["1 / 0"]


def test_writes_have_a_lane_of_their_own_while_every_read_place_is_taken(one_place_held):
    server, _, _ = one_place_held(queue_most=0)  # full: a read that would queue is refused at once
    assert server.recall("atlas", "anything").status == 503
    written = server.post("/v1/long", {"agent": "atlas", "topic": "lane", "fact": "writes pass"})
    load = server.get("/v1/stats").body["load"]
    assert written.status == 201
    assert load["writes"]["running_most"] == solos_connections.ADMIT_WRITES_PER_PLACE
    assert load["writes"]["running_max"] == 1 and load["writes"]["busy_queue_full"] == 0


def test_mcp_writes_take_the_writes_lane_too_while_every_read_place_is_taken(one_place_held):
    """A write over MCP queued in the reads' lane: behind every recall, out of group commit's batches (24 clients:
    MCP writes p50 120 ms, REST's 47 ms), and refused busy here where the same write over REST passed."""
    server, _, _ = one_place_held(queue_most=0)  # full: a read that would queue is refused at once
    written = server.mcp_tool("write_long", {"agent": "atlas", "topic": "lane", "fact": "writes pass over mcp"})
    recalled = server.mcp_tool("recall", {"agent": "atlas", "q": "anything"})
    load = server.get("/v1/stats").body["load"]
    assert written.status == 200 and written.body["result"]["isError"] is False, written.raw[:300]
    assert written.body["result"]["structuredContent"]["status"] == "created"
    assert recalled.body["error"]["data"]["reason"] == "queue_full"  # reads still wait in theirs
    assert load["writes"]["running_max"] == 1 and load["writes"]["busy_queue_full"] == 0


def test_mcp_protocol_methods_are_answered_while_every_place_is_taken(one_place_held):
    """initialize, ping and tools/list touch no database: queued with the recalls, a burst refused them, and Hermes
    (its keepalive is a ping; it reconnects on a failed one, and parks the server, its tools gone, after 5 failed
    reconnects) dropped the connection of every agent for the length of the burst."""
    server, _, _ = one_place_held(queue_most=0)  # full: a read that would queue is refused at once
    headers = {"MCP-Protocol-Version": "2025-11-25"}
    initialize = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "hermes", "version": "0"}}
    answers = {
        method: server.post("/mcp", {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, headers=headers)
        for method, params in [("initialize", initialize), ("ping", {}), ("tools/list", {})]
    }
    recalled = server.mcp_tool("recall", {"agent": "atlas", "q": "anything"})
    for method, answer in answers.items():
        assert answer.status == 200 and "result" in answer.body, (method, answer.raw[:300])
    assert recalled.body["error"]["data"]["reason"] == "queue_full"  # a tool call still waits its turn


def test_a_request_that_waits_past_the_bound_gets_503_busy_not_a_stall(one_place_held):
    server, _, _ = one_place_held(wait_s=0.05)  # the place is held throughout: the wait must run out
    refused = server.recall("atlas", "anything")
    assert refused.status == 503 and refused.headers["retry-after"] == "1"
    assert refused.body["error"]["reason"] == "queue_wait"
    assert server.get("/v1/stats").body["load"]["busy_queue_wait"] == 1


def test_health_metrics_the_page_stats_and_streams_pass_while_every_place_is_taken(one_place_held):
    server, _, _ = one_place_held(queue_most=0)
    assert server.recall("atlas", "anything").status == 503  # the cap is full
    passed = {path: server.get(path).status for path in ("/health", "/metrics", "/status", "/v1/stats")}
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as stream:
        stream.sendall(
            b"GET /v1/events?agent=atlas HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAccept: text/event-stream\r\n\r\n"
            % server.port
        )
        head = stream.recv(4096)
    assert passed == dict.fromkeys(passed, 200)
    assert head.startswith(b"HTTP/1.1 200 ") and b"text/event-stream" in head


def test_admit_zero_runs_every_request_at_once():
    admission = solos_connections.Admission(0)
    with admission.admitted(), admission.admitted():
        assert admission.load()["running"] == 0


def test_a_client_that_reads_no_answer_holds_no_place_another_needs(make_server):
    server = make_server(admit=1)
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'  # about 29 KB of answer each, and not exempt
    request = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n" % server.port
    stuck = unread_answers(server.port, request + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    try:
        answers_stuck(server, 1)  # not still answering (each answer holds the place while it is made)
        recalled = server.recall("atlas", "anything")
        load = server.get("/v1/stats").body["load"]
    finally:
        stuck.close()
    # Before: the stuck write kept the one place for up to 30 s, and this recall was 503 busy after 2 s.
    assert recalled.status == 200, recalled.body
    assert load["running"] == 0 and load["busy_queue_wait"] == 0


@pytest.mark.parametrize("tool", ["recall", "write_long"])
def test_an_mcp_call_from_a_rebound_name_is_403_however_busy(one_place_held, tool):
    """SECURITY.md: every route answers 403 to a rebound Host, and REST does before any queue. /mcp took its
    admission place first: with the places taken a rebound page was told busy (503, or 200 with a JSON-RPC error
    in the handshake era), and a rebound writing call held a place of the writes' lane until its 403."""
    server, _, _ = one_place_held(queue_most=0)  # full: a read that would queue is refused at once
    writes = server.server.write_admission
    writes.queue_most = 0
    arguments = {"recall": {"agent": "atlas", "q": "x"}, "write_long": {"agent": "atlas", "fact": "rebound"}}[tool]
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    headers = {"Host": f"evil.example:{server.port}", "MCP-Protocol-Version": "2025-11-25"}
    for _ in range(writes.most):  # every place of the writes' lane taken too
        writes.enter()
    try:
        reply = server.post("/mcp", message, headers=headers)
    finally:
        for _ in range(writes.most):
            writes.leave()
    assert reply.status == 403 and "DNS rebinding" in reply.raw.decode(), (reply.status, reply.raw[:300])
