"""Faults and abuse, loopback only and bounded: crashes, lock contention, storage errors, hostile input, idle
sockets and the connection cap, expiry.

The crash rounds reuse bench/crash_rounds.py (20 rounds there, 3 here).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import sqlite3
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import (
    BUDGET_MS,
    ROOT,
    answers_stuck,
    raw_exchange,
    skip_or_fail,
    start_server,
    statuses_in,
    stop_server,
    unread_answers,
    wait_until,
)
from hypothesis import HealthCheck, example, given, settings, strategies as st

import pyz_build
import solos_connections
import solos_memory
import solos_store

sys.path.insert(0, str(ROOT / "bench"))
import crash_rounds  # noqa: E402

pytestmark = pytest.mark.slow  # floods, kill -9 rounds, hypothesis on raw HTTP

TRACEBACK_MARKERS = (b"Traceback", b'File "', b"sqlite3.", b"OperationalError", b'.py"', b"solos_memory.py")


# ---- crash safety ----


def test_kill_9_under_load_loses_no_acknowledged_write(tmp_path):
    results, acked = crash_rounds.run_rounds(
        tmp_path / "solos.db", rounds=3, writers=6, seed=11, load_s=(0.3, 0.8), log=lambda line: None
    )
    assert len(results) == 3, "a round found loss or corruption and stopped the run"
    assert len(acked) > 100, f"the load was too light to mean anything: {len(acked)} acknowledged writes"
    for number, result in enumerate(results, 1):
        assert result.integrity == "ok", f"round {number}: integrity after kill -9: {result.integrity}"
        assert not result.problems, f"round {number}: acknowledged writes lost: {result.problems[:5]}"
        assert result.five_xx == 0, f"round {number}: {result.five_xx} 5xx answers under load"


# ---- lock contention (tests/test_busy.py covers one call at a time; this is many at once, both transports) ----


def test_every_call_blocked_by_a_held_lock_is_503_in_bounded_time_then_recovers(make_server):
    server = make_server(busy_timeout_ms=BUDGET_MS)
    assert server.post("/v1/short", {"agent": "sol", "key": "to-delete", "value": "v"}).status == 201
    before = server.get("/v1/stats").body["rejections"].get("busy", 0)
    calls = [
        lambda: server.post("/v1/long", {"agent": "atlas", "fact": "blocked long"}),
        lambda: server.post("/v1/short", {"agent": "atlas", "key": "blocked", "value": "v"}),
        lambda: server.post("/v1/episodic", {"agent": "atlas", "event_type": "t", "summary": "blocked episode"}),
        lambda: server.request("DELETE", "/v1/short", query={"agent": "sol", "key": "to-delete"}),
        lambda: server.request("PUT", "/v1/sharing", body={"agent": "nova", "episodic": True}),
    ] * 3
    holder = sqlite3.connect(server.db_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(len(calls) + 1) as pool:
            futures = [pool.submit(call) for call in calls]
            mcp_future = pool.submit(server.mcp_tool, "write_long", {"agent": "atlas", "fact": "blocked via mcp"})
            health_started = time.monotonic()
            health = server.get("/health")
            health_elapsed = time.monotonic() - health_started
            replies = [future.result() for future in futures]
            mcp_reply = mcp_future.result()
        elapsed = time.monotonic() - started
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert health.status == 200 and health_elapsed < 1.0, f"/health took {health_elapsed:.2f} s during lock contention"
    for reply in replies:
        assert reply.status == 503, f"expected 503 under a held lock, got {reply.status}: {reply.body}"
        assert reply.body["error"]["code"] == "busy" and "locked" in reply.body["error"]["message"]
        assert reply.headers.get("retry-after") == "1"
    assert elapsed < BUDGET_MS / 1000 + 2.0, f"{len(calls)} blocked calls took {elapsed:.2f} s in all"
    result = mcp_reply.body["result"]
    assert result["isError"] is True and result["structuredContent"]["error"]["code"] == "busy"
    busy = server.get("/v1/stats").body["rejections"].get("busy", 0)
    assert busy - before == len(calls) + 1, f"busy counter rose by {busy - before}, expected {len(calls) + 1}"
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm WHERE fact LIKE 'blocked%'").fetchone()[0] == 0
    assert server.post("/v1/long", {"agent": "atlas", "fact": "blocked long"}).status == 201
    assert server.request("DELETE", "/v1/short", query={"agent": "sol", "key": "to-delete"}).status == 200
    assert (
        server.mcp_tool("write_long", {"agent": "atlas", "fact": "blocked via mcp"}).body["result"]["isError"] is False
    )


# ---- bad input: hypothesis on raw HTTP ----


@pytest.fixture(scope="module")
def raw_server(tmp_path_factory):
    running = start_server(tmp_path_factory.mktemp("faults") / "solos.db", busy_timeout_ms=BUDGET_MS)
    assert running.post("/v1/short", {"agent": "atlas", "key": "victim", "value": "v", "ttl_s": 86400}).status == 201
    yield running
    stop_server(running)


PATHS = [
    "/v1/recall",
    "/v1/long",
    "/v1/short",
    "/v1/episodic",
    "/v1/sharing",
    "/v1/audit",
    "/v1/stats",
    "/health",
    "/mcp",
    "/openapi.json",
    "/",
    "/v1/recall?agent=atlas&q=x",
    "/v1/recall?agent=%ff%fe",
    "/v1/recall?k=99999999999999999999999&agent=atlas",
    "//v1/long",
    "/v1/../v1/long",
    "*",
]
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),  # JSON has neither; test_requests checks their refusal
    st.text(max_size=40),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
field_names = st.sampled_from(
    [
        "agent",
        "q",
        "k",
        "tiers",
        "scope",
        "key",
        "value",
        "ttl_s",
        "tags",
        "fact",
        "topic",
        "source",
        "confidence",
        "event_type",
        "summary",
        "details",
        "outcome",
        "duration_s",
        "idempotency_key",
        "episodic",
        "limit",
        "before_id",
        "jsonrpc",
        "method",
        "params",
        "id",
    ]
)
wrong_typed_objects = st.dictionaries(field_names, json_values, max_size=8).map(
    lambda d: {**d, "agent": d.get("agent", "atlas")}
)


def deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


bodies = st.one_of(
    st.binary(max_size=300),
    wrong_typed_objects.map(lambda d: json.dumps(d).encode()),
    st.builds(lambda n: b'{"agent": "atlas", "fact": ' + deep(n) + b"}", st.integers(10, 200_000)),
    st.builds(
        lambda prefix, bad: prefix + bad,
        st.sampled_from([b'{"agent": "atlas", "fact": "', b'{"q": "']),
        st.sampled_from([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]),
    ),
    st.builds(
        lambda n: b'{"agent": "atlas", "fact": "' + b"x" * n + b'"}', st.sampled_from([100, 70_000, 140_000, 600_000])
    ),
    st.just(b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "recall", "arguments": 5}}'),
    st.just(b'[{"jsonrpc": "2.0", "id": 1, "method": "tools/call"}]'),
)
header_tokens = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters=":"), min_size=1, max_size=20
)
header_values = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=60),
    st.sampled_from(
        [
            "-1",
            "1e3",
            "0x10",
            "99999999999999999999",
            " 5",
            "",
            "chunked",
            "application/json; charset=latin-1",
            "\u00e9\u00e9",
        ]
    ),
)


# The right Host (the test fills in the port), so only framing, not the rebinding rule, can stop it.
SMUGGLED_DELETE = b"DELETE /v1/short?agent=atlas&key=victim HTTP/1.1\r\nHost: SMUGGLED\r\nContent-Length: 0\r\n\r\n"


@st.composite
def raw_requests(draw) -> bytes:
    method = draw(
        st.sampled_from(
            ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "BREW", "get", "POST /v1/long", ""]
        )
    )
    path = draw(st.one_of(st.sampled_from(PATHS), st.text(max_size=30).map(lambda t: "/" + t)))
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/9", "HTTP/1.1 extra", ""]))
    body = draw(bodies)
    headers = [("Host", draw(st.sampled_from(["127.0.0.1", "localhost:1", "evil.example", ""])))]
    content_type = draw(st.sampled_from(["application/json", "text/plain", None, "application/json;;", "*/*"]))
    if content_type:
        headers.append(("Content-Type", content_type))
    length = draw(
        st.sampled_from(
            ["exact", "exact", "missing", "more", "less", "garbage", "huge", "twice", "list", "unicode", "te", "same"]
        )
    )
    if length == "exact":
        headers.append(("Content-Length", str(len(body))))
    elif length == "more":
        headers.append(("Content-Length", str(len(body) + draw(st.integers(1, 1000)))))
    elif length == "less":
        headers.append(("Content-Length", str(max(0, len(body) - draw(st.integers(1, 50))))))
    elif length == "garbage":
        headers.append(("Content-Length", draw(header_values)))
    elif length == "huge":
        headers.append(("Content-Length", str(10 ** draw(st.integers(6, 30)))))
    elif length == "twice":
        headers += [("Content-Length", str(len(body))), ("Content-Length", "0")]
    elif length == "same":  # the same value twice is one length, not a conflict
        headers += [("Content-Length", str(len(body))), ("Content-Length", str(len(body)))]
    elif length == "list":
        headers.append(("Content-Length", f"{len(body)}, {draw(st.integers(0, 50))}"))
    elif length == "unicode":  # int() refuses what str.isdigit() accepts
        headers.append(("Content-Length", draw(st.sampled_from(["\u00b2", "1\u00b3", "\u00b9\u00b9", "0\u00bd"]))))
    elif length == "te":
        headers.append(("Transfer-Encoding", draw(st.sampled_from(["gzip", "chunked, gzip", "identity", " chunked"]))))
        if draw(st.booleans()):
            headers.append(("Content-Length", str(len(body))))
    abuse = draw(st.sampled_from(["none", "none", "random", "many", "huge", "folded", "mcp"]))
    if abuse == "random":
        headers += draw(st.lists(st.tuples(header_tokens, header_values), max_size=10))
    elif abuse == "many":
        headers += [(f"X-Many-{i}", "v") for i in range(draw(st.integers(90, 400)))]
    elif abuse == "huge":
        headers.append(("X-Huge", "h" * draw(st.sampled_from([8_000, 66_000, 300_000]))))
    elif abuse == "folded":
        headers.append(("X-Folded", "a\r\n  continued"))
    elif abuse == "mcp":
        headers += [
            ("MCP-Protocol-Version", draw(st.sampled_from(["2025-11-25", "2026-07-28", "1999", ""]))),
            ("Origin", draw(st.sampled_from(["http://evil.example", "null", "http://127.0.0.1"]))),
            ("Mcp-Method", draw(header_values)),
            ("Transfer-Encoding", "chunked"),
        ]
    # Bytes after a body whose framing is broken must never run as a request (finding 8: a POST without
    # Content-Length got 411 and its body then ran). After a well-framed body they are plain pipelining.
    broken = length in ("twice", "list", "unicode", "te") or (length == "missing" and method in ("POST", "PUT"))
    if broken:
        body += SMUGGLED_DELETE
    head = f"{method} {path} {version}".strip() + "\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers)
    encoding = draw(st.sampled_from(["utf-8", "latin-1"]))  # latin-1 puts a bare 0xB2 ('\u00b2') on the wire
    return head.encode(encoding, "surrogatepass" if encoding == "utf-8" else "replace") + b"\r\n" + body


def assert_healthy(server) -> None:
    reply = server.get("/health")
    assert reply.status == 200, f"/health answered {reply.status} after hostile input"


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(request=raw_requests())
@example(  # finding 8 as reported: the 411'd POST's body ran as the next request
    request=b"POST /v1/long HTTP/1.1\r\nHost: SMUGGLED\r\nContent-Type: application/json\r\n\r\n" + SMUGGLED_DELETE
)
@example(  # two Content-Lengths, the first one used
    request=b"POST /v1/long HTTP/1.1\r\nHost: SMUGGLED\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
    b"Content-Length: 0\r\n\r\n{}" + SMUGGLED_DELETE
)
def test_hostile_raw_http_never_gets_a_5xx_or_a_traceback(raw_server, request):
    request = request.replace(b"Host: SMUGGLED", f"Host: 127.0.0.1:{raw_server.port}".encode())
    response = raw_exchange(raw_server.port, request)
    statuses = statuses_in(response)
    # An HTTP major version the server does not speak (HTTP/2.0 on an HTTP/1.1 socket) is 505 per
    # RFC 9110: a statement about the protocol, not a server failure. Every other 5xx is one.
    request_line = request.split(b"\r\n", 1)[0]
    allowed = set()
    if re.search(rb" HTTP/([2-9]|\d\d)", request_line):
        allowed.add(505)
    assert all(status < 500 or status in allowed for status in statuses), (
        f"{statuses} for {request[:300]!r}: {response[:500]!r}"
    )
    for marker in TRACEBACK_MARKERS:
        assert marker not in response, f"{marker!r} leaked in {response[:800]!r}"
    assert_healthy(raw_server)
    with raw_server.db() as conn:
        victim = conn.execute("SELECT count(*) FROM memory_short WHERE key = 'victim'").fetchone()[0]
    assert victim == 1, f"a request smuggled in a body ran: {request[:300]!r}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=wrong_typed_objects, tool=st.sampled_from(sorted(solos_memory.OPERATIONS)))
def test_wrong_types_on_both_transports_are_4xx_or_tool_errors(raw_server, args, tool):
    op = solos_memory.OPERATIONS[tool]
    if op.method in ("GET", "DELETE"):
        query = {name: value if isinstance(value, str) else json.dumps(value) for name, value in args.items()}
        rest = raw_server.request(op.method, op.path, query=query)
    else:
        rest = raw_server.request(op.method, op.path, body=args)
    assert rest.status < 500, f"REST {op.method} {op.path} {args!r}: {rest.status} {rest.raw[:300]!r}"
    mcp = raw_server.mcp_tool(tool, args)
    assert mcp.status == 200 and "result" in mcp.body, f"MCP {tool} {args!r}: {mcp.status} {mcp.raw[:300]!r}"
    for reply in (rest, mcp):
        assert b"Traceback" not in reply.raw and b'File "' not in reply.raw


def test_the_server_is_healthy_after_the_hostile_input(raw_server):
    assert_healthy(raw_server)
    assert raw_server.post("/v1/long", {"agent": "atlas", "fact": "still writable after abuse"}).status in (200, 201)
    assert raw_server.recall("sol", "writable").body["count"] >= 1


# ---- schemathesis against the served OpenAPI document ----


def test_schemathesis_finds_no_server_error(raw_server):
    try:
        import schemathesis
        from schemathesis.checks import not_a_server_error
    except ImportError:
        skip_or_fail("schemathesis is not installed (pip install schemathesis)")
    if raw_server.get("/openapi.json").status != 200:
        pytest.fail("GET /openapi.json does not answer 200: the service must serve its OpenAPI document")
    schema = schemathesis.openapi.from_url(f"{raw_server.url}/openapi.json")
    failures, calls = [], []
    for result in schema.get_all_operations():
        operation = result.ok()

        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def check(case):
            response = case.call(timeout=10)
            calls.append(case.operation.label)
            body = response.content
            if response.status_code >= 500 or b"Traceback" in body:
                failures.append(
                    f"{case.method} {case.formatted_path} {case.query or ''} "
                    f"{case.body if case.body is not None else ''}: {response.status_code} {body[:200]!r}"
                )
            case.validate_response(response, checks=[not_a_server_error])

        check()
    assert not failures, failures[:5]
    assert len(set(calls)) >= len(solos_memory.OPERATIONS), f"schemathesis reached only {sorted(set(calls))}"
    assert_healthy(raw_server)


# ---- resource limits ----


def test_bodies_over_the_cap_are_413_on_rest_and_mcp_without_reading_them(server):
    cap = solos_memory.MAX_BODY_BYTES
    for path in ("/v1/long", "/mcp"):
        started = time.monotonic()
        # A Content-Length over the cap and no body at all: the answer must not wait for the body.
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {cap + 1}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(head)
            response = sock.recv(65536)
        assert statuses_in(response) == [413], f"{path}: {response[:300]!r}"
        assert time.monotonic() - started < 1.0
    assert server.post("/mcp", {"x": "y" * (cap + 10)}).status == 413


def open_idle_sockets(port: int, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        try:
            sockets.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            break
    return sockets


def health_within(server, seconds: float) -> tuple[int | None, float]:
    """One /health on a new connection: (status or None, seconds taken)."""
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=seconds) as sock:
            sock.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
            data = sock.recv(65536)
        statuses = statuses_in(data)
        return (statuses[0] if statuses else None), time.monotonic() - started
    except OSError:
        return None, time.monotonic() - started


def test_idle_and_slowloris_sockets_cannot_starve_health_and_threads_stay_bounded(server):
    baseline = threading.active_count()
    idle = open_idle_sockets(server.port, 200)
    slow = open_idle_sockets(server.port, 20)
    stop = threading.Event()

    def trickle() -> None:
        """Slowloris: a request head one byte a second, never finished."""
        head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100
        for index in range(len(head)):
            for sock in slow:
                try:
                    sock.send(head[index : index + 1])
                except OSError:
                    pass
            if stop.wait(1.0):
                return

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        time.sleep(1.5)  # let the server take them all in
        peak_threads = threading.active_count()
        probes = [health_within(server, 2.0) for _ in range(3)]
        time.sleep(1.0)
        probes += [health_within(server, 2.0) for _ in range(2)]
    finally:
        stop.set()
        trickler.join()
        for sock in idle + slow:
            sock.close()
    assert len(idle) == 200 and len(slow) == 20, "could not open the sockets (listen backlog?)"
    assert peak_threads - baseline <= solos_connections.MAX_CONNECTIONS + 4, (
        f"threads grew from {baseline} to {peak_threads} with {len(idle) + len(slow)} idle sockets"
    )
    starved = [(status, round(took, 2)) for status, took in probes if status != 200 or took > 1.0]
    assert not starved, (
        f"/health starved by {len(idle)} idle + {len(slow)} slowloris sockets: (status, seconds) of the failed "
        f"probes {starved} of {len(probes)}. Idle connections each hold one of MAX_CONNECTIONS="
        f"{solos_connections.MAX_CONNECTIONS} threads for up to {solos_connections.KEEPALIVE_IDLE_S} s "
        "before sending a byte, and a full house answers new connections 503."
    )


def test_a_slow_body_flood_cannot_starve_health(server, monkeypatch):
    """200 connections each promise a 100 kB body and drip one byte a second.

    Each byte used to reset a per-read timeout, so the drippers held every thread for good and /health
    got 503 "too many connections" or hung. Now the body has a deadline and the slowest readers make room.
    """
    monkeypatch.setattr(solos_memory, "BODY_DEADLINE_S", 3)
    head = f"POST /v1/long HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
    head += "Content-Length: 100000\r\n\r\n{"

    def dripper() -> socket.socket | None:
        try:
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=2)
            sock.sendall(head.encode())
            return sock
        except OSError:
            return None

    flood = [dripper() for _ in range(200)]
    stop, cut_off = threading.Event(), [0]

    def drip() -> None:
        """One byte a second on each; a dripper the server cut off reconnects, so the pressure stays at 200."""
        rounds = 0
        while not stop.wait(1.0) and rounds < 15:
            rounds += 1
            for index, sock in enumerate(flood):
                try:
                    if sock is None:
                        raise OSError
                    sock.send(b" ")
                except OSError:
                    cut_off[0] += 1
                    if sock is not None:
                        sock.close()
                    flood[index] = dripper()

    baseline = threading.active_count()
    dripping = threading.Thread(target=drip, daemon=True)
    dripping.start()
    probes, peak_threads = [], 0
    try:
        time.sleep(1.0)
        for _ in range(12):
            probes.append(health_within(server, 2.0))
            peak_threads = max(peak_threads, threading.active_count())
            time.sleep(0.4)
    finally:
        stop.set()
        dripping.join()
        for sock in flood:
            if sock is not None:
                sock.close()
    took_ms = sorted(round(took * 1000, 1) for _, took in probes)
    print(f"/health under the flood: {took_ms} ms; {cut_off[0]} drippers cut off; peak threads {peak_threads}")
    assert all(status == 200 for status, _ in probes), f"/health under 200 slow bodies: {probes}"
    # Within 100 ms each; one probe of twelve may miss by a scheduling hiccup on a loaded 2-core runner
    # (seen once: 103 ms while two benches ran beside the suite), never by the old second-long stall.
    slow = [ms for ms in took_ms if ms > 100]
    assert len(slow) <= 1 and max(took_ms) < 500, f"/health under 200 slow bodies took {took_ms} ms"
    assert cut_off[0] >= 200, f"only {cut_off[0]} drippers were ever cut off: the body deadline did not bite"
    assert peak_threads - baseline <= 2 * solos_connections.MAX_CONNECTIONS + 4
    assert server.post("/v1/long", {"agent": "atlas", "fact": "written after the flood"}).status == 201


def test_a_body_that_misses_its_deadline_is_408_and_the_connection_closes(server, monkeypatch):
    monkeypatch.setattr(solos_memory, "BODY_DEADLINE_S", 1)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(
            f"POST /v1/long HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
            "Content-Length: 50\r\n\r\n{".encode()
        )
        started = time.monotonic()
        for _ in range(6):  # one byte every 0.3 s: each would have reset a per-read timeout
            time.sleep(0.3)
            try:
                sock.send(b" ")
            except OSError:
                break
        response = b""
        try:
            while chunk := sock.recv(65536):
                response += chunk
        except OSError:
            pass
    assert statuses_in(response) == [408] and b"Connection: close" in response, response[:300]
    assert time.monotonic() - started < 3.0


# ---- storage faults: a read-only spell, a full disk ----

RUN_AS_NOBODY = """
import os, sys
sys.path.insert(0, sys.argv[1])
import encodings.idna  # noqa: F401  (bind looks the host name up with it, lazily)
import solos_memory  # everything is imported before the privileges go: nobody cannot read root's python
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
serve = ["serve", "--db", sys.argv[2], "--port", "0", "--model-dir", "off", "--register", "atlas,sol"]
sys.exit(solos_memory.main(serve))
"""


def nobody_folder(tmp_path_factory) -> str:
    import tempfile

    if os.geteuid() != 0:
        pytest.skip("the read-only spell runs the service as 'nobody', which needs root to arrange")
    folder = tempfile.mkdtemp(prefix="solos-readonly-")  # not under pytest's root-only tmp folder
    os.chmod(folder, 0o755)
    os.chown(folder, 65534, 65534)
    # The service's own files, readable by nobody: the checkout may sit in a folder only root can enter.
    app = os.path.join(folder, "app")
    os.mkdir(app, 0o755)
    for name in pyz_build.REQUIRED_FILES:
        os.makedirs(os.path.dirname(os.path.join(app, name)), 0o755, exist_ok=True)
        shutil.copy(ROOT / name, os.path.join(app, name))
        os.chmod(os.path.join(app, name), 0o644)
    return folder


def test_a_read_only_spell_answers_503_and_writes_recover_without_a_restart(tmp_path_factory):
    """Run as an unprivileged user; make the file 444 and its folder 555; write and recall; restore (finding 2)."""
    import urllib.request

    sys.path.insert(0, str(ROOT / "bench"))
    import harness

    folder = nobody_folder(tmp_path_factory)
    db = os.path.join(folder, "solos.db")
    service = harness.Process([sys.executable, "-c", RUN_AS_NOBODY, os.path.join(folder, "app"), db])
    url = f"http://127.0.0.1:{service.port}"

    def call(method: str, path: str, body: dict | None = None) -> tuple[int, dict, dict]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read()), dict(response.headers)
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null"), dict(error.headers)

    try:
        assert call("POST", "/v1/long", {"agent": "atlas", "fact": "before the spell"})[0] == 201
        os.chmod(db, 0o444)
        os.chmod(folder, 0o555)
        try:
            # Many recalls at once open fresh connections, which SQLite opens read-only during the spell.
            with ThreadPoolExecutor(16) as pool:
                recalls = list(pool.map(lambda _: call("GET", "/v1/recall?agent=sol&q=spell"), range(48)))
                writes = list(
                    pool.map(
                        lambda i: call("POST", "/v1/long", {"agent": "atlas", "fact": f"in the spell {i}"}), range(16)
                    )
                )
        finally:
            os.chmod(folder, 0o755)
            os.chmod(db, 0o644)
        assert {status for status, _, _ in recalls} == {200}
        for status, body, headers in writes:
            assert status in (200, 201) or (status == 503 and body["error"]["code"] == "storage_unavailable"), body
            if status == 503:
                assert headers.get("Retry-After") and "read-only" in body["error"]["message"]
        acknowledged = {f"in the spell {i}" for i, (status, _, _) in enumerate(writes) if status in (200, 201)}
        after = [call("POST", "/v1/long", {"agent": "atlas", "fact": f"after the spell {i}"}) for i in range(30)]
        assert [status for status, _, _ in after] == [201] * 30, [body for _, body, _ in after if body][:3]
    finally:
        service.stop()
    conn = sqlite3.connect(db)
    try:
        stored = {row[0] for row in conn.execute("SELECT fact FROM memory_longterm")}
    finally:
        conn.close()
        shutil.rmtree(folder, ignore_errors=True)
    assert acknowledged <= stored and "before the spell" in stored
    assert {f"after the spell {i}" for i in range(30)} <= stored
    assert "Traceback" not in "\n".join(service.tail)


def test_starting_on_a_read_only_database_prints_one_clear_line(tmp_path_factory):
    import subprocess

    folder = nobody_folder(tmp_path_factory)
    db = os.path.join(folder, "solos.db")
    try:
        conn = sqlite3.connect(db)
        conn.execute("CREATE TABLE fleet_thing (id INTEGER)")
        conn.close()
        os.chmod(db, 0o444)
        os.chmod(folder, 0o555)
        started = subprocess.run(
            [sys.executable, "-c", RUN_AS_NOBODY, os.path.join(folder, "app"), db],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        os.chmod(folder, 0o755)
        shutil.rmtree(folder, ignore_errors=True)
    lines = started.stderr.strip().splitlines()
    assert started.returncode == 1 and len(lines) == 1, started.stderr
    assert "cannot start" in lines[0] and "read-only" in lines[0] and "Traceback" not in started.stderr


def test_storage_is_failing_for_a_minute_after_a_storage_failure_and_names_the_last(tmp_path):
    store = solos_store.Store(str(tmp_path / "s.db"))
    assert store.storage_state() == {"state": "ok", "last_failure": None}
    store.storage_failure = ("the disk holding the database is full", time.time() - 5)
    assert store.storage_state()["state"] == "failing"
    store.storage_failure = ("the disk holding the database is full", time.time() - solos_store.STORAGE_FAILING_S - 1)
    later = store.storage_state()
    assert later["state"] == "ok" and later["last_failure"]["reason"] == "the disk holding the database is full"


def test_a_full_disk_loses_no_acknowledged_write_and_recovers_when_space_frees(tmp_path):
    """A 4 MB tmpfs: write until the disk is full, free the space, write again."""
    import subprocess

    mount = tmp_path / "small"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root and CAP_SYS_ADMIN): {mounted.stderr.decode()}")
    server = None
    try:
        server = start_server(mount / "solos.db")
        filler = mount / "filler"
        free = os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize
        filler.write_bytes(b"\0" * max(0, free - 1_000_000))
        acknowledged, refusals = [], []
        for index in range(400):
            fact = f"fact number {index} " + "padding " * 200
            reply = server.post("/v1/long", {"agent": "atlas", "fact": fact})
            if reply.status in (200, 201):
                acknowledged.append(fact)
            else:
                assert reply.status == 503 and reply.body["error"]["code"] == "storage_unavailable", reply.raw
                assert reply.headers["retry-after"] and "full" in reply.body["error"]["message"]
                refusals.append(reply)
                if len(refusals) >= 5:
                    break
        assert refusals, f"the disk never filled: {len(acknowledged)} writes all fit"
        assert server.recall("sol", "fact number").status == 200  # reads carry on while the disk is full
        storage = server.get("/health").body["storage"]  # and /health says writes fail, and why
        assert storage["state"] == "failing" and "full" in storage["last_failure"]["reason"], storage
        assert "solos_memory_storage_failing 1" in server.get("/metrics").raw.decode()
        filler.unlink()
        after = [server.post("/v1/long", {"agent": "atlas", "fact": f"after freeing {i}"}) for i in range(10)]
        assert [reply.status for reply in after] == [201] * 10
        with server.db() as conn:
            stored = {row[0] for row in conn.execute("SELECT fact FROM memory_longterm")}
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        missing = [fact[:20] for fact in acknowledged if fact not in stored]
        assert not missing, f"{len(missing)} acknowledged writes lost: {missing[:3]}"
        assert len(acknowledged) > 10
    finally:
        if server is not None:
            stop_server(server)
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


# ---- expiry ----


def sqlite_now(conn: sqlite3.Connection) -> str:
    return conn.execute("SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now')").fetchone()[0]


def test_expired_short_rows_never_appear_even_around_the_expiry_instant(server):
    written = server.post(
        "/v1/short", {"agent": "atlas", "key": "fleeting", "value": "ephemeral marker value", "ttl_s": 0.4}
    )
    assert written.status == 201
    expires_at = written.body["expires_at"]
    seen_live = seen_after = 0
    queries = [
        lambda: server.recall("atlas", "", tiers="short", scope="own", k=100),
        lambda: server.recall("sol", "ephemeral marker", tiers="short,long"),
        lambda: server.mcp_tool("recall", {"agent": "nova", "q": "ephemeral", "tiers": ["short"]}),
    ]
    with server.db() as conn:
        deadline = time.monotonic() + 5
        after_expiry_polls = 0
        while after_expiry_polls < 60 and time.monotonic() < deadline:
            for query in queries:
                before = sqlite_now(conn)  # the service's SQLite clock reads at or after this
                reply = query()
                body = reply.body["result"]["structuredContent"] if "result" in (reply.body or {}) else reply.body
                assert reply.status == 200, reply.raw[:300]
                keys = [r.get("key") for r in body["results"] if r["tier"] == "short"]
                if before >= expires_at:
                    after_expiry_polls += 1
                    assert "fleeting" not in keys, (
                        f"expired row returned: expires_at {expires_at}, SQLite now was already {before}"
                    )
                    seen_after += 1
                elif "fleeting" in keys:
                    seen_live += 1
    assert seen_live > 0, "the row was never seen before it expired: the test polled too late to mean anything"
    assert seen_after >= 60
    stats = server.get("/v1/stats").body
    assert stats["rows"]["short"] == 0 and stats["rows"]["short_expired"] == 1
    deleted = server.request("DELETE", "/v1/short", query={"agent": "atlas", "key": "fleeting"})
    assert deleted.status == 200 and deleted.body["was_expired"] is True


# ---- at the connection cap, which connection makes room ----


def test_past_the_cap_a_kept_alive_client_keeps_its_connection(make_server, monkeypatch):
    monkeypatch.setattr(solos_connections, "MAX_CONNECTIONS", 8)
    server = make_server()
    kept = []
    for _ in range(4):  # clients that finished a request and keep the connection for their next one
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.request("GET", "/health")
        assert conn.getresponse().read()
        kept.append(conn)
    silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]  # never send a head
    wait_until(lambda: len(server.server.waiting) == 8, "the silent sockets to take the last slots")
    newcomers = []
    for _ in range(4):  # past the cap: each evicts someone
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.request("GET", "/health")
        assert conn.getresponse().status == 200
        newcomers.append(conn)
    try:
        for conn in kept:  # every reuse still works: the silent sockets made room
            conn.request("GET", "/health")
            assert conn.getresponse().status == 200
    finally:
        for conn in kept + newcomers:
            conn.close()
        for sock in silent:
            sock.close()


def test_past_the_cap_a_client_that_reads_no_answer_makes_room(make_server, monkeypatch):
    monkeypatch.setattr(solos_connections, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(solos_connections, "SENDING_GRACE_S", 0.2)
    server = make_server()
    request = b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % server.port  # 80 KB each, no token
    stuck = [unread_answers(server.port, request) for _ in range(4)]  # every slot, each writing an answer
    connections = server.server

    def past_the_grace() -> bool:  # each stuck writing, past the grace a write just begun gets
        with connections.waiting_lock:  # (test_an_answer_just_begun_is_not_evicted)
            now = time.monotonic()
            return sum(since <= now for since, *_ in connections.waiting.values()) == 4

    try:
        answers_stuck(server, 4)
        wait_until(past_the_grace, "every slot's answer stuck past its grace")
        newcomer = server.recall("atlas", "anything")
    finally:
        for sock in stuck:
            sock.close()
    # Before: a connection writing its answer was never evicted, so this was 503 "too many connections are
    # working" for as long as the writes stayed stuck (30 s), and a flood of such clients starved every turn.
    assert newcomer.status == 200, newcomer.body
    assert server.get("/v1/stats").body["load"]["evicted"] >= 1


def test_an_answer_just_begun_is_not_evicted_one_stuck_past_the_grace_is(server, monkeypatch):
    """An answer leaves at once unless its client reads nothing; one just begun may acknowledge a write."""
    connections = server.server
    ours, theirs = socket.socketpair()
    try:
        connections.sending(theirs)
        assert not connections.evict(solos_connections.KEEPALIVE_IDLE_S, solos_connections.SlotHandoff())
        monkeypatch.setattr(solos_connections, "SENDING_GRACE_S", 0.0)
        connections.sending(theirs)
        assert connections.evict(solos_connections.KEEPALIVE_IDLE_S, solos_connections.SlotHandoff())
        assert ours.recv(1) == b""  # shut down: the stuck write fails and its slot is handed on
    finally:
        connections.handoffs.pop(theirs, None)
        ours.close()
        theirs.close()


# ---- storage errors are 503 with Retry-After, and a failed connection is not reused ----


def test_a_storage_failure_is_503_with_retry_after_and_its_connection_is_dropped(server, monkeypatch):
    store = server.server.memory.store
    real_connect = store.connect
    failing = {"on": True}

    def connect_then_fail():
        conn = real_connect()
        if failing["on"]:
            conn.reusable = False  # as a connection opened during a read-only spell is
            conn.execute("PRAGMA query_only = 1")  # every write on it fails with SQLITE_READONLY
        return conn

    store.close()  # empty the pool so the next request opens a connection
    monkeypatch.setattr(store, "connect", connect_then_fail)
    reply = server.post("/v1/long", {"agent": "atlas", "fact": "during the spell"})
    assert reply.status == 503 and reply.body["error"]["code"] == "storage_unavailable", reply.raw
    assert reply.headers["retry-after"] == "5" and "read-only" in reply.body["error"]["message"]
    assert server.recall("sol", "spell").status == 200  # reads still work on such a connection
    failing["on"] = False
    assert server.post("/v1/long", {"agent": "atlas", "fact": "after the spell"}).status == 201
    assert store.pool.qsize() >= 1 and all(conn.reusable for conn in list(store.pool.queue))
    with server.db() as conn:
        assert [row[0] for row in conn.execute("SELECT fact FROM memory_longterm")] == ["after the spell"]


def test_starting_on_a_database_that_cannot_be_opened_is_one_clear_line(tmp_path):
    missing_folder = tmp_path / "no" / "such" / "folder" / "solos.db"
    with pytest.raises(SystemExit) as stopped:
        solos_memory.build_server(solos_memory.Config(db=str(missing_folder), port=0, model_dir="off"))
    message = str(stopped.value)
    assert "cannot start" in message and "\n" not in message and "Traceback" not in message


def test_invalid_utf8_is_read_leniently_by_reads_and_writes_alike(tmp_path):
    store = solos_memory.Store(str(tmp_path / "x.db"))
    try:
        assert store.read(lambda conn: conn.execute("SELECT CAST(X'41ff42' AS TEXT)").fetchone()[0]) == "A\ufffdB"
        assert store.write(lambda conn: conn.execute("SELECT CAST(X'43ff' AS TEXT)").fetchone()[0]) == "C\ufffd"
        assert store.read(lambda conn: conn.execute("SELECT 'plain'").fetchone()[0]) == "plain"
    finally:
        store.close()


def test_sqlite_error_codes_are_named(tmp_path):
    assert sqlite3.SQLITE_READONLY in solos_memory.STORAGE_FAILURES
    assert sqlite3.SQLITE_FULL in solos_memory.STORAGE_FAILURES
