"""serve --workers N: every property one process holds still holds across its workers, on a real multi-worker
service on loopback (read-your-writes on both legs, forget, gapless SSE resumed on another worker, the
per-agent stream cap, tokens), and the supervisor restarts a dead worker and stops them all on SIGTERM."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from conftest import ROOT, Stream, fleet_writer, require_embedder, service, subscribed, wait_until, write_tokens

import solos_connections
import solos_events
import solos_workers

pytestmark = pytest.mark.slow  # each starts a supervisor and its workers

AGENTS = "atlas,sol,hermes,nova,vega,lyra,orion,rhea"
WORKERS = 2
REACH_PAUSE_S = 0.005  # after a connection another worker took (reach): 400 misses wait 2 s at most


def serve_argv(db: Path, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "solos_memory.py"), "serve", "--db", str(db), "--port", "0",
            "--workers", str(WORKERS), "--register", AGENTS, "--no-request-log", *extra]  # fmt: skip


@pytest.fixture(scope="module", params=["shared", "reuseport"])
def keyword_service(tmp_path_factory, request):
    """Keyword-only, on either way of sharing the port (--worker-socket)."""
    db = tmp_path_factory.mktemp("workers") / "workers.db"
    with service(serve_argv(db, "--model-dir", "off", "--worker-socket", request.param)) as (port, lines):
        yield port, lines


@pytest.fixture(scope="module")
def hybrid_service(tmp_path_factory):
    require_embedder()
    db = tmp_path_factory.mktemp("workers-hybrid") / "workers.db"
    with service(serve_argv(db)) as (port, _):
        yield port, db


class Port:
    """What conftest's Stream needs of a server."""

    def __init__(self, port: int):
        self.port = port


def connect_to(port: int, worker: int, attempts: int = 400) -> http.client.HTTPConnection:
    """A kept-alive connection that the given worker answers (asked over it with /health: it stays there)."""
    conn = reach(port, worker, attempts)
    if conn is None:
        pytest.fail(f"no connection reached worker {worker} in {attempts} tries")
    return conn


def reach(port: int, worker: int, attempts: int) -> http.client.HTTPConnection | None:
    """A connection the worker accepted. On the shared port a worker holding more connections than another
    declines newcomers (solos_workers.Worker.my_turn), so a worker holding a stream is reached only once the
    others hold as many: each miss is kept open until then, and closed after. With SO_REUSEPORT the kernel's
    hash decides; a short pause after each miss leaves a busy worker the core to win one."""
    missed: list[http.client.HTTPConnection] = []
    try:
        for _ in range(attempts):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("GET", "/health")
            response = conn.getresponse()
            health = json.loads(response.read())
            assert response.getheader("X-Memory-Worker") == str(health["worker"])
            if health["worker"] == worker:
                return conn
            missed.append(conn)
            time.sleep(REACH_PAUSE_S)
        return None
    finally:
        for conn in missed:
            conn.close()


def ask(conn: http.client.HTTPConnection, method: str, path: str, body: dict | None = None, **headers: str):
    """One request on a pinned connection: (status, JSON body, the worker that answered)."""
    payload = json.dumps(body).encode() if body is not None else None
    conn.request(
        method, path, body=payload, headers={**headers, **({"Content-Type": "application/json"} if payload else {})}
    )
    response = conn.getresponse()
    return response.status, json.loads(response.read() or b"{}"), int(response.getheader("X-Memory-Worker"))


def on(port: int, worker: int, method: str, path: str, body: dict | None = None, **headers: str):
    conn = connect_to(port, worker)
    try:
        status, answer, answered = ask(conn, method, path, body, **headers)
    finally:
        conn.close()
    assert answered == worker
    return status, answer


def recall_path(agent: str, q: str, **more) -> str:
    return "/v1/recall?" + urlencode({"agent": agent, "q": q, "k": 20, "min_relevance": 0, **more})


def ids(answer: dict) -> list[int]:
    return [row["id"] for row in answer["results"]]


def test_workers_share_the_port_and_health_and_stats_say_which_answered(keyword_service):
    port, lines = keyword_service
    listening = next(json.loads(line) for line in lines if '"listening"' in line)
    assert listening["workers"] == WORKERS
    # set by the supervisor before its first connection, inherited by every worker through the fork
    assert listening["sqlite_memory_statistics"] == "off", listening
    for worker in range(1, WORKERS + 1):
        status, health = on(port, worker, "GET", "/health")
        assert status == 200 and health["workers"] == WORKERS and health["worker"] == worker
        status, stats = on(port, worker, "GET", "/v1/stats")
        assert status == 200 and (stats["workers"], stats["worker"]) == (WORKERS, worker)
    pids = {on(port, worker, "GET", "/health")[1]["worker_pid"] for worker in range(1, WORKERS + 1)}
    assert len(pids) == WORKERS
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= WORKERS:  # SQLite workers with a core each: pinned, one place a core they run on, by default
        share = [sorted(solos_workers.worker_cores(worker, WORKERS, cores)) for worker in range(1, WORKERS + 1)]
        assert (listening["pin_threads"], listening["admit"]) == ("on", len(share[0])), listening
        for worker in range(1, WORKERS + 1):
            stats = on(port, worker, "GET", "/v1/stats")[1]
            assert (stats["pin_threads"], stats["load"]["running_most"]) == ("on", len(share[worker - 1])), stats
            assert stats["connection_threads_on_cores"] == share[worker - 1]


def test_a_burst_of_connections_is_spread_evenly_over_the_workers(tmp_path):
    """Kept-alive clients arriving at once (a fleet's burst) land evenly: on the shared socket a worker holding more
    connections than another leaves the newcomer to it. Free-for-all, 4 landed 3 to 1 or 4 to 0 in 4 of 5 tries
    and 64 up to 60 to 4, and the busier worker's clients waited 3x or more as long."""
    with service(serve_argv(tmp_path / "spread.db", "--model-dir", "off")) as (port, _):
        held: list[socket.socket] = []
        for burst in (4, 4, 16, 40):
            opened = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(burst)]
            held += opened
            for sock in opened:
                sock.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            by_worker = {worker: 0 for worker in range(1, WORKERS + 1)}
            for sock in held:
                if sock in opened:
                    by_worker[answered_by(sock)] += 1
            assert max(by_worker.values()) - min(by_worker.values()) <= 1, (burst, by_worker)
        for sock in held:  # every connection is still open, each held by the worker that answered it
            sock.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        counts = [answered_by(sock) for sock in held]
        assert abs(counts.count(1) - counts.count(2)) <= 1, counts
        for sock in held:
            sock.close()


def test_a_stuck_worker_does_not_stop_the_others_taking_connections(tmp_path):
    """A worker that holds the fewest connections but does not accept (stopped here) delays a newcomer by at most
    TURN_WAIT_S: the others take it then."""
    with service(serve_argv(tmp_path / "stuck.db", "--model-dir", "off")) as (port, _):
        stuck = on(port, 1, "GET", "/health")[1]["worker_pid"]
        os.kill(stuck, signal.SIGSTOP)
        try:
            held = []
            started = time.monotonic()
            for _ in range(4):
                sock = socket.create_connection(("127.0.0.1", port), timeout=10)
                sock.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
                assert answered_by(sock) == 2
                held.append(sock)
            assert time.monotonic() - started < 4 * (solos_workers.TURN_WAIT_S + 1)
        finally:
            os.kill(stuck, signal.SIGCONT)
        for sock in held:
            sock.close()


def answered_by(sock: socket.socket) -> int:
    """The worker that answered the one request sent on sock (read whole, so the next is answered next)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    fields = dict(line.split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:])
    length = int(fields["Content-Length"])
    while len(body) < length:
        body += sock.recv(65536)
    return int(fields["X-Memory-Worker"])


def test_a_write_on_one_worker_is_in_the_next_recall_on_every_other(keyword_service):
    port, _ = keyword_service
    for n in range(6):
        writer, reader = 1 + n % WORKERS, 1 + (n + 1) % WORKERS
        word = f"zq{uuid.uuid4().hex[:10]}"
        status, written = on(port, writer, "POST", "/v1/long", {"agent": "atlas", "fact": f"the {word} valve leaks"})
        assert status == 201
        status, found = on(port, reader, "GET", recall_path("sol", word))
        assert status == 200 and ids(found) == [written["id"]], (writer, reader, found)


def test_a_row_handed_over_by_every_worker_is_one_delivery_in_the_hour(keyword_service):
    """Each worker kept only its own deliveries in memory: a reader shown one row by both was logged twice, and
    the author's /v1/deliveries listed the read twice."""
    port, _ = keyword_service
    word = f"zd{uuid.uuid4().hex[:10]}"
    status, written = on(port, 1, "POST", "/v1/long", {"agent": "rhea", "fact": f"the {word} gauge reads low"})
    assert status == 201
    for worker in (1, 2, 1, 2):
        status, found = on(port, worker, "GET", recall_path("vega", word))
        assert status == 200 and ids(found) == [written["id"]], found
    status, listed = on(port, 2, "GET", "/v1/deliveries?" + urlencode({"agent": "rhea", "id": written["id"]}))
    assert status == 200 and [(d["reader"], d["row_id"]) for d in listed["deliveries"]] == [("vega", written["id"])]


def test_the_vector_leg_of_another_worker_sees_a_write_before_it_answers(hybrid_service):
    """The reader's vector index holds a snapshot (loaded by an earlier recall); a row another worker writes
    then must rank in the reader's very next vector-only recall: its index catches up before it searches."""
    port, _ = hybrid_service
    for n in range(4):
        writer, reader = 1 + n % WORKERS, 1 + (n + 1) % WORKERS
        status, _ = on(port, reader, "POST", "/v1/long", {"agent": "nova", "fact": f"warm-up fact {n} about tides"})
        status, warm = on(port, reader, "GET", recall_path("nova", "tides at the harbour", ranking="vector"))
        assert status == 200 and warm["ranking"] == "vector", warm
        fact = f"The orchard's {n}th pear harvest was sold at the village market"
        status, written = on(port, writer, "POST", "/v1/long", {"agent": "vega", "fact": fact})
        assert status == 201
        status, found = on(
            port, reader, "GET", recall_path("nova", "fruit picked and traded in town", ranking="vector")
        )
        assert status == 200 and found["ranking"] == "vector", found
        assert written["id"] in ids(found), (writer, reader, found["results"])


def test_a_forget_on_one_worker_reaches_every_worker_at_once(hybrid_service):
    port, _ = hybrid_service
    word = f"zf{uuid.uuid4().hex[:10]}"
    status, written = on(
        port, 1, "POST", "/v1/long", {"agent": "lyra", "topic": "keys", "fact": f"the {word} code is 4417"}
    )
    assert status == 201
    for worker in range(1, WORKERS + 1):  # every worker has read it: its texts, vector and cluster are kept
        for ranking in ("hybrid", "keyword", "vector"):
            status, found = on(port, worker, "GET", recall_path("orion", f"{word} code", ranking=ranking))
            assert status == 200 and written["id"] in ids(found), (worker, ranking, found)
    status, gone = on(
        port, WORKERS, "DELETE", "/v1/memory?" + urlencode({"agent": "lyra", "tier": "long", "id": written["id"]})
    )
    assert status == 200 and gone["status"] == "forgotten", gone
    for worker in range(1, WORKERS + 1):
        for ranking in ("hybrid", "keyword", "vector"):
            status, found = on(port, worker, "GET", recall_path("orion", f"{word} code", ranking=ranking))
            assert status == 200 and written["id"] not in ids(found), (worker, ranking, found)
            assert all(word not in json.dumps(row) for row in found["results"])
        status, events = on(
            port, worker, "GET", "/v1/events?" + urlencode({"agent": "orion", "since": 0, "limit": 1000})
        )
        about = [e for e in events["events"] if e["row_id"] == written["id"] and e["tier"] == "long"]
        assert [e["kind"] for e in about] == ["forget"], about  # its write shows no row any more, so it is not listed
        assert word not in json.dumps(events)


def pinned_stream(port: int, worker: int, query: dict, headers: dict | None = None) -> tuple[Stream, int]:
    conn = connect_to(port, worker)
    stream = Stream(Port(port), query, headers, conn=conn)
    return stream, int(stream.response.getheader("X-Memory-Worker"))


def test_a_stream_resumed_on_another_worker_misses_nothing_and_repeats_nothing(keyword_service):
    port, _ = keyword_service
    topic = f"zs{uuid.uuid4().hex[:8]}"
    query = {"agent": "hermes", "writers": "rhea"}
    first, worker = pinned_stream(port, 1, query)
    subscribed(first)
    written: list[int] = []

    def write(numbers: range) -> None:  # each on the worker its number picks
        for n in numbers:
            fact = {"agent": "rhea", "topic": topic, "fact": f"{topic} fact {n}"}
            written.append(on(port, 1 + n % WORKERS, "POST", "/v1/long", fact)[1]["id"])

    write(range(5))
    seen = first.events(5)
    assert [e["row_id"] for e in seen] == written and worker == 1
    first.close()
    write(range(5, 9))  # while no stream is open
    again, worker = pinned_stream(port, 2, query, {"Last-Event-ID": str(seen[-1]["id"])})
    subscribed(again)
    assert worker == 2
    write(range(9, 12))
    resumed = again.events(7)
    assert [e["row_id"] for e in resumed] == written[5:], resumed
    assert [e["id"] for e in resumed] == sorted({e["id"] for e in resumed}) and resumed[0]["id"] > seen[-1]["id"]
    assert again.quiet(0.5) == []
    again.close()


@pytest.mark.parametrize("remover", [1, 2])
def test_a_filtered_stream_resumed_on_another_worker_gets_the_forget_of_a_row_it_was_shown(keyword_service, remover):
    """A stream with `q` is sent a removal only of rows known to match it: shown written to it, or matched while
    the service removed the row (its text gone after). Each worker knew only its own filters and matches, so a
    stream resumed on worker 2 was never sent the forget of a row worker 1 had shown it, forgotten on worker 1
    (nor, its filter registered at its first batch, on worker 2): the client kept the row (only a `notice`,
    which a deleted or expired short row does not get, told it)."""
    port, _ = keyword_service
    word = f"zr{uuid.uuid4().hex[:8]}"
    query = {"agent": "lyra", "writers": "orion", "q": word}
    first, _ = pinned_stream(port, 1, query)
    subscribed(first)
    status, written = on(port, 2, "POST", "/v1/long", {"agent": "orion", "fact": f"the {word} hatch sticks"})
    assert status == 201
    (shown,) = first.events(1)
    assert shown["row_id"] == written["id"] and shown["kind"] == "write"
    first.close()
    again, worker = pinned_stream(port, 2, query, {"Last-Event-ID": str(shown["id"])})
    subscribed(again)
    assert worker == 2
    forget = {"agent": "orion", "tier": "long", "id": written["id"]}
    status, gone = on(port, remover, "DELETE", "/v1/memory?" + urlencode(forget))
    assert status == 200 and gone["status"] == "forgotten", gone
    sent = [(m["data"]["kind"], m["data"]["row_id"]) for m in again.quiet(1.0) if "event" not in m]
    assert ("forget", written["id"]) in sent, sent
    again.close()


def cut(stream: Stream, within_s: float = 5.0) -> bool:
    """Whether the service ended the stream (end of file, or reset) within `within_s`."""
    return stream.closed.wait(within_s)


def test_a_filters_file_cut_short_is_started_afresh_not_left_broken(tmp_path):
    """A worker killed while writing the shared filters file (or a full disk) leaves it cut short. Every later
    read then failed: each removal and each batch of events logged a warning, and no filter registered after
    it reached the file, so no other worker matched its removals against a stream opened since."""
    filters = solos_workers.Filters(str(tmp_path / "filters.json"), 0)
    Path(filters.path).write_text('{"filters": [[["ops"], "pump", ')
    key = (("ops",), "valve", '"valve"')
    filters.register(key)
    filters.matched([(key, "long", 7)])
    assert filters.registered() == [key]
    assert filters.entry(key, ("long", 7)) in filters.matches()
    assert json.loads(Path(filters.path).read_text())["filters"] == {"0": [[["ops"], "valve", '"valve"']]}


def test_a_bulk_removal_keeps_every_match_for_the_other_workers_streams(tmp_path, monkeypatch):
    """Removed rows that matched a filter were kept as the newest 2,000 in the shared file: an expiry sweep (or
    a forget of a thread) removing more rows at once than that kept only the last, so a filtered stream on any
    other worker was never told of the rest (one on the removing worker, matched in memory, was)."""
    filters = solos_workers.Filters(str(tmp_path / "filters.json"), 0)
    key = (("ops",), None, None)
    filters.register(key)
    removed = solos_workers.Filters.MATCHES_KEPT * 2 + 500
    filters.matched([(key, "short", row_id) for row_id in range(1, removed + 1)])
    kept = filters.matches()
    assert all(filters.entry(key, ("short", row_id)) in kept for row_id in range(1, removed + 1))
    filters.matched([(key, "short", removed + 1)])  # the next removal keeps them while streams may still ask
    assert filters.entry(key, ("short", 1)) in filters.matches()
    later = time.time() + solos_workers.Filters.MATCHES_FRESH_S + 1
    monkeypatch.setattr(solos_workers.time, "time", lambda: later)
    filters.matched([(key, "short", removed + 2)])  # past that, the file shrinks back to its bound
    kept = filters.matches()
    assert len(kept) == solos_workers.Filters.MATCHES_KEPT and filters.entry(key, ("short", removed + 2)) in kept


def test_a_long_open_streams_filter_is_not_pushed_out_by_other_workers_filters(keyword_service):
    """The shared file kept the newest 256 filters of all workers together, and a worker registered a filter
    only when it first met it: 256 other filters met on another worker (read_events callers' `q`, streams since
    closed) pushed a stream's still open filter out for good, and a row deleted on that worker was never
    announced to the stream, though it matched."""
    port, _ = keyword_service
    word = f"zp{uuid.uuid4().hex[:8]}"
    status, written = on(port, 2, "POST", "/v1/short", {"agent": "orion", "key": word, "value": f"the {word} vent"})
    assert status == 201
    stream, worker = pinned_stream(port, 1, {"agent": "lyra", "writers": "orion", "q": word, "tiers": "short"})
    subscribed(stream)
    assert worker == 1
    for n in range(solos_workers.Filters.FILTERS_KEPT):
        query = {"agent": "lyra", "q": f"{word}x{n}", "since": 0, "tiers": "short"}
        assert on(port, 2, "GET", "/v1/events?" + urlencode(query))[0] == 200
    status, _ = on(port, 2, "DELETE", "/v1/short?" + urlencode({"agent": "orion", "key": word}))
    assert status == 200
    sent = [(m["data"]["kind"], m["data"]["row_id"]) for m in stream.quiet(1.0) if "event" not in m]
    assert ("delete", written["id"]) in sent, sent
    stream.close()


def test_a_removal_after_a_sweep_appends_its_match_and_rewrites_none(tmp_path):
    """Every removal reads the filters (registered) and writes its matches, inside its own transaction. Kept in
    the one file, 10,000 matches of a sweep were read and rewritten at each removal for the next 2 minutes: 170 ms
    a delete, the database's write lock held through it. A match is a line appended; the filters stay small."""
    filters = solos_workers.Filters(str(tmp_path / "filters.json"), 0)
    key = (("ops",), "valve", '"valve"')
    filters.register(key)
    filters.matched([(key, "short", row_id) for row_id in range(10_000)])
    assert os.path.getsize(filters.path) < 1024  # what every removal reads first
    lines = Path(filters.matches_path).read_bytes().splitlines()
    with open(filters.matches_path, "ab") as file:  # a worker killed while appending its line
        file.write(b'[1.5, [["ops"], "val')
    filters.matched([(key, "short", 10_000)])
    after = Path(filters.matches_path).read_bytes().splitlines()
    assert after[: len(lines)] == lines and len(after) == len(lines) + 2  # appended: the torn line, then its own
    assert filters.entry(key, ("short", 10_000)) in filters.matches()


def test_a_dead_workers_filters_are_vacated_with_its_seats(tmp_path):
    """Every removal is matched against every worker's filters: a dead worker's stay no one's to match for."""
    seats = str(tmp_path / "seats")
    key = (("ops",), "valve", '"valve"')
    solos_workers.Seats(seats, 1).filters.register(key)
    solos_workers.Seats(seats, 2).filters.register((("ops",), None, None))
    solos_workers.Seats(seats, 0).vacate(1)
    assert solos_workers.Seats(seats, 0).filters.registered() == [(("ops",), None, None)]


def test_the_per_agent_stream_cap_holds_across_workers(keyword_service):
    """Four streams of one agent, two on each worker: a fifth (on either) replaces the oldest, wherever it is,
    and the service then holds four of that agent's streams in all, not four per worker."""
    port, _ = keyword_service
    cap = solos_events.STREAMS_PER_AGENT
    held = []
    for n in range(cap):
        stream, _ = pinned_stream(port, 1 + n % WORKERS, {"agent": "vega"})
        held.append(subscribed(stream))
        time.sleep(0.02)  # opened in order: the oldest is the first
    newest, _ = pinned_stream(port, WORKERS, {"agent": "vega"})  # the oldest is on worker 1, the newcomer on 2
    subscribed(newest)
    assert cut(held[0]), "the oldest stream, on the other worker, was not replaced"
    assert not any(stream.closed.wait(0.3) for stream in held[1:] + [newest])
    stats = on(port, 1, "GET", "/v1/stats")[1]["event_streams"]
    assert stats["open_all_workers"] == cap, stats
    another, _ = pinned_stream(port, 1, {"agent": "vega"})  # and again, the other way round
    subscribed(another)
    assert cut(held[1])
    assert not any(stream.closed.wait(0.3) for stream in held[2:] + [newest, another])
    for stream in held + [newest, another]:
        stream.close()
    wait_until(lambda: on(port, 2, "GET", "/v1/stats")[1]["event_streams"]["open_all_workers"] == 0, "seats freed")


def test_a_token_added_or_removed_holds_on_every_worker_at_the_next_request(tmp_path):
    tokens = tmp_path / "tokens"
    write_tokens(tokens, {"atlas-token": "atlas"})
    with service(serve_argv(tmp_path / "t.db", "--model-dir", "off", "--tokens-file", str(tokens))) as (port, _):
        path = "/v1/audit?limit=1"
        for worker in range(1, WORKERS + 1):
            assert on(port, worker, "GET", path, Authorization="Bearer atlas-token")[0] == 200
            assert on(port, worker, "GET", path, Authorization="Bearer sol-token")[0] == 401
        issued = subprocess.run(
            [sys.executable, str(ROOT / "solos_memory.py"), "token", "sol", "--tokens-file", str(tokens)],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        for worker in range(1, WORKERS + 1):
            status, answer = on(port, worker, "GET", path, Authorization=f"Bearer {issued}")
            assert status == 200 and answer["agent"] == "sol", (worker, answer)
        kept = [line for line in tokens.read_text().splitlines() if not line.endswith(" atlas")]
        tokens.write_text("\n".join(kept) + "\n")  # atlas's token revoked
        for worker in range(1, WORKERS + 1):
            assert on(port, worker, "GET", path, Authorization="Bearer atlas-token")[0] == 401
            assert on(port, worker, "GET", path, Authorization=f"Bearer {issued}")[0] == 200
        tokens.write_text("not a token line\n")  # broken: every request refused, saying why, until fixed
        for worker in range(1, WORKERS + 1):
            status, answer = on(port, worker, "GET", path, Authorization=f"Bearer {issued}")
            assert status == 503 and "tokens file" in answer["error"]["message"], answer


class Supervised:
    """`serve --workers` as a child process of the test, its log drained into `lines` on a thread."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None):
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env
        )
        self.lines: list[str] = []
        self.drained = threading.Event()
        threading.Thread(target=self.drain, daemon=True).start()
        listening = wait_until(lambda: self.logged("listening") or self.drained.is_set(), "listening", 60)
        assert listening is not True, self.lines
        self.port = listening[0]["port"]

    def drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
        self.drained.set()

    def logged(self, event: str) -> list[dict]:
        return [json.loads(line) for line in list(self.lines) if f'"event": "{event}"' in line]

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def test_the_supervisor_restarts_a_dead_worker_and_stops_them_all_on_sigterm(tmp_path):
    supervised = Supervised(serve_argv(tmp_path / "s.db", "--model-dir", "off"))
    proc, port = supervised.proc, supervised.port
    try:
        before = {worker: on(port, worker, "GET", "/health")[1]["worker_pid"] for worker in range(1, WORKERS + 1)}
        os.kill(before[1], signal.SIGKILL)

        def again() -> int | None:
            conn = reach(port, 1, 20)  # until worker 1 is back, worker 2 answers every connection
            if conn is None:
                return None
            with contextlib.closing(conn):
                pid = ask(conn, "GET", "/health")[1]["worker_pid"]
            return pid if pid != before[1] else None

        restarted = wait_until(again, "worker 1 started again")
        assert on(port, 2, "GET", "/health")[1]["worker_pid"] == before[2]  # the other kept serving
        with contextlib.suppress(OSError):
            os.kill(before[1], 0)
            pytest.fail("the dead worker was not reaped")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        supervised.drained.wait(10)
        assert supervised.logged("worker_exited") and supervised.logged("stopped")
        for pid in (restarted, before[2]):
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        supervised.kill()


def test_workers_stop_when_the_supervisor_is_killed(tmp_path):
    """SIGKILL leaves the supervisor no time to stop them: the workers must not keep the port on their own, nor
    leave the seats file's folder behind."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    supervised = Supervised(serve_argv(tmp_path / "k.db", "--model-dir", "off"), {**os.environ, "TMPDIR": str(scratch)})
    proc, port = supervised.proc, supervised.port
    try:
        pids = [on(port, worker, "GET", "/health")[1]["worker_pid"] for worker in range(1, WORKERS + 1)]
        proc.kill()
        proc.wait()

        def gone(pid: int) -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"

        wait_until(lambda: all(gone(pid) for pid in pids), "the workers to end")
        assert list(scratch.iterdir()) == []
    finally:
        supervised.kill()


def test_a_worker_that_cannot_start_stops_the_supervisor_with_a_failure():
    """A worker that dies at every start is not retried for ever: after GIVE_UP_AFTER quick deaths the supervisor
    stops the others and exits 1, so systemd sees a failed service."""
    script = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); import solos_workers;"
        " sys.exit(solos_workers.supervise(2, '127.0.0.1', 0, 'shared', lambda worker: 3))"
    )
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr
    events = [json.loads(line) for line in run.stderr.splitlines() if line.startswith("{")]
    failed = [e for e in events if e["event"] == "workers_failed"]
    assert len(failed) == 1 and "died within" in failed[0]["reason"], events
    deaths, window = solos_workers.GIVE_UP_AFTER
    starts = [e for e in events if e["event"] == "worker_started" and e["worker"] == failed[0]["worker"]]
    assert len(starts) == deaths and time.monotonic() - started < window
    assert events[-1]["event"] == "stopped" and events[-1]["failed"] == failed[0]["reason"]


def test_workers_auto_is_one_per_core_this_process_may_use(monkeypatch):
    import solos_memory

    cores = len(os.sched_getaffinity(0))
    assert solos_memory.parse_args(["serve", "--workers", "auto"]).workers == cores
    assert solos_memory.parse_args(["serve"]).workers == 1
    monkeypatch.setenv("SOLOS_MEMORY_WORKERS", "auto")
    assert solos_memory.parse_args(["serve"]).workers == cores
    assert solos_memory.parse_args(["serve", "--workers", "3"]).workers == 3
    monkeypatch.setenv("SOLOS_MEMORY_WORKERS", "two")
    with pytest.raises(SystemExit):
        solos_memory.parse_args(["serve"])


def test_one_worker_is_the_default_and_nothing_changes(server):
    answer = server.get("/health")
    assert "workers" not in answer.body and "worker" not in answer.body
    assert all(name.lower() != "x-memory-worker" for name in answer.headers)


def test_workers_over_postgresql_share_writes_forgets_and_the_stream_caps(pg_url):
    """On PostgreSQL the workers are copies on one host: the same properties (a read logged once, a filtered
    stream told of another worker's forget), and the caps still the service's."""
    argv = [sys.executable, str(ROOT / "solos_memory.py"), "serve", "--db", pg_url, "--port", "0",
            "--workers", str(WORKERS), "--register", AGENTS, "--no-request-log", "--model-dir", "off"]  # fmt: skip
    with service(argv) as (port, _):
        word = f"zp{uuid.uuid4().hex[:10]}"
        status, written = on(port, 1, "POST", "/v1/long", {"agent": "atlas", "fact": f"the {word} pump hums"})
        assert status == 201
        assert ids(on(port, 2, "GET", recall_path("sol", word))[1]) == [written["id"]]
        assert ids(on(port, 1, "GET", recall_path("sol", word))[1]) == [written["id"]]
        listed = on(port, 1, "GET", "/v1/deliveries?" + urlencode({"agent": "atlas"}))[1]["deliveries"]
        assert [(d["reader"], d["row_id"]) for d in listed] == [("sol", written["id"])]  # once, read on both
        # sol, having recalled the row, follows it on worker 1; worker 2 forgets it: the stream is told
        again, _ = pinned_stream(port, 1, {"agent": "sol", "writers": "atlas", "q": word})
        subscribed(again)
        forget = {"agent": "atlas", "tier": "long", "id": written["id"]}
        assert on(port, 2, "DELETE", "/v1/memory?" + urlencode(forget))[0] == 200
        assert ids(on(port, 1, "GET", recall_path("sol", word))[1]) == []
        sent = [(m["data"]["kind"], m["data"]["row_id"]) for m in again.quiet(1.0) if "event" not in m]
        assert ("forget", written["id"]) in sent, sent
        again.close()
        held = []
        for n in range(solos_events.STREAMS_PER_AGENT):
            stream, _ = pinned_stream(port, 1 + n % WORKERS, {"agent": "nova"})
            held.append(subscribed(stream))
            time.sleep(0.02)
        newest, _ = pinned_stream(port, WORKERS, {"agent": "nova"})
        subscribed(newest)
        assert cut(held[0])
        for stream in held + [newest]:
            stream.close()


def test_the_workers_embed_each_of_the_fleets_direct_writes_once(hybrid_service):
    """Rows the fleet writes straight into the file are embedded by the workers' background passes, each row by
    one worker only (its share of the ids): every vector saved once, so the generation moves once per row."""
    port, db = hybrid_service
    generation = "SELECT value FROM solos_memory_meta WHERE key = 'vector_generation'"
    with fleet_writer(str(db)) as conn:
        before = int(conn.execute(generation).fetchone()[0])
        conn.execute("BEGIN IMMEDIATE")
        ids = [
            conn.execute(
                "INSERT INTO memory_longterm (agent, fact) VALUES ('rhea', ?)", (f"fleet note {n} on gears",)
            ).lastrowid
            for n in range(64)
        ]
        conn.execute("COMMIT")
        vectors = f"SELECT count(*) FROM memory_vector WHERE tier = 'long' AND row_id IN ({','.join(map(str, ids))})"
        wait_until(lambda: conn.execute(vectors).fetchone()[0] == len(ids), "every row embedded", 60)
        time.sleep(1)  # a second pass over a row, if any, lands meanwhile
        assert int(conn.execute(generation).fetchone()[0]) - before == len(ids)
    status, found = on(port, 2, "GET", recall_path("atlas", "gears fleet note", ranking="vector"))
    assert status == 200 and set(ids) & set(ids_of := [row["id"] for row in found["results"]]), ids_of


def test_a_tokens_file_the_service_cannot_use_stops_the_supervisor_before_any_worker(tmp_path):
    tokens = tmp_path / "tokens"
    write_tokens(tokens, {"atlas-token": "atlas"})
    tokens.chmod(0o644)
    run = subprocess.run(
        serve_argv(tmp_path / "b.db", "--model-dir", "off", "--tokens-file", str(tokens)),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode != 0 and "chmod 600" in run.stderr, run.stderr
    assert '"worker_started"' not in run.stderr


def cores_of(pid: int, tid: int) -> set[int]:
    return os.sched_getaffinity(tid) if tid else os.sched_getaffinity(pid)


def test_worker_cores_split_the_process_cores_and_share_them_round_when_fewer():
    assert [solos_workers.worker_cores(i, 2, [0, 1]) for i in (1, 2)] == [{0}, {1}]
    assert [solos_workers.worker_cores(i, 2, [0, 1, 2, 3]) for i in (1, 2)] == [{0, 2}, {1, 3}]
    assert [solos_workers.worker_cores(i, 3, [4, 7]) for i in (1, 2, 3)] == [{4}, {7}, {4}]


def test_pinned_connection_threads_leave_the_question_embedding_thread_every_core():
    """--pin-threads: a connection's thread runs on its worker's core, and the embedding thread it hands the
    question to still has the process's cores (it would inherit the connection thread's, started from it)."""
    import concurrent.futures
    import types

    everything = os.sched_getaffinity(0)
    if len(everything) < 2:
        pytest.skip("pinning needs two cores")
    pool = concurrent.futures.ThreadPoolExecutor(1, "embed-query")
    server = types.SimpleNamespace(memory=types.SimpleNamespace(query_pool=pool), on_connection_thread=None)
    worker = solos_workers.Worker(2, 2, 0, None, "", -1)
    cores = solos_workers.pin_connection_threads(server, worker)
    assert cores == solos_workers.worker_cores(2, 2, sorted(everything))
    seen: dict[str, set[int]] = {}

    def connection() -> None:
        server.on_connection_thread()
        seen["connection"] = os.sched_getaffinity(0)
        seen["embedding"] = pool.submit(os.sched_getaffinity, 0).result()

    thread = threading.Thread(target=connection)
    thread.start()
    thread.join()
    pool.shutdown()
    assert seen == {"connection": cores, "embedding": everything}
    assert os.sched_getaffinity(0) == everything  # the caller's thread is left as it was


@pytest.mark.parametrize("pin", [True, False])
def test_pin_threads_puts_each_workers_connection_threads_on_its_own_core(tmp_path, pin):
    everything = os.sched_getaffinity(0)
    if len(everything) < 2:
        pytest.skip("pinning needs two cores")
    extra = ["--model-dir", "off", "--pin-threads", "on" if pin else "off"]
    with service(serve_argv(tmp_path / "pin.db", *extra)) as (port, lines):
        kept = [connect_to(port, worker) for worker in range(1, WORKERS + 1)]  # each thread alive while held
        try:
            pinned: dict[int, set[int]] = {}
            for worker, conn in enumerate(kept, start=1):
                pid = ask(conn, "GET", "/health")[1]["worker_pid"]
                threads = {int(tid): cores_of(pid, int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}
                assert threads[pid] == everything  # the worker's main thread keeps every core
                narrowed = [cores for cores in threads.values() if cores != everything]
                if pin:
                    assert narrowed and all(cores == narrowed[0] for cores in narrowed), threads
                    pinned[worker] = narrowed[0]
                else:
                    assert narrowed == [], threads
        finally:
            for conn in kept:
                conn.close()
    said = [json.loads(line) for line in lines if '"worker_listening"' in line]
    if pin:
        assert pinned == {w: solos_workers.worker_cores(w, WORKERS, sorted(everything)) for w in pinned}
        assert pinned[1] != pinned[2]
        assert {w["worker"]: set(w["connection_threads_on_cores"]) for w in said} == pinned
        assert {w["admit"] for w in said} == {len(pinned[1])}  # one place a core it runs on
    else:  # said off: each worker keeps the process default's places
        assert {(w["pin_threads"], w["admit"]) for w in said} == {("off", solos_connections.default_admit())}


def test_pin_threads_without_workers_is_refused(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "solos_memory.py"),
            "serve",
            "--db",
            str(tmp_path / "one.db"),
            "--port",
            "0",
            "--model-dir",
            "off",
            "--pin-threads",
            "on",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=60,
        check=False,  # fmt: skip
    )
    assert done.returncode != 0 and "--pin-threads on needs --workers 2 or more" in done.stderr


def write_on(port: int, worker: int, fact: str, answers: dict) -> threading.Thread:
    """A write sent over a connection the worker holds, answered (or not) into answers[worker], on a thread."""
    conn = connect_to(port, worker)

    def write() -> None:
        try:
            answers[worker] = ask(conn, "POST", "/v1/long", {"agent": "atlas", "fact": fact})
        except (OSError, http.client.HTTPException) as error:
            answers[worker] = repr(error)
        finally:
            conn.close()

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("how", ["SIGTERM to the supervisor", "SIGTERM to the group", "Ctrl-C", "SIGKILL"])
def test_a_stop_answers_the_writes_in_flight_on_every_worker(tmp_path, how):
    """systemd's stop (SIGTERM to the supervisor, or with KillMode=control-group to every process at once),
    Ctrl-C in a terminal (SIGINT to the whole process group) and the supervisor killed outright (each worker gets
    SIGTERM as it dies) while each worker has a write in flight: every worker finishes and answers its write
    before it ends, as one process does."""
    db = tmp_path / "stop.db"
    supervised = Supervised(serve_argv(db, "--model-dir", "off"))
    proc, port = supervised.proc, supervised.port
    locker = sqlite3.connect(db, isolation_level=None)
    try:
        locker.execute("BEGIN IMMEDIATE")  # the fleet's writer holds the lock: each worker's write waits for it
        answers: dict[int, Any] = {}
        writers = [write_on(port, w, f"fact {w} written as the service stops", answers) for w in (1, 2)]
        for worker in (1, 2):
            wait_until(lambda w=worker: on(port, w, "GET", "/v1/stats")[1]["load"]["in_flight"] >= 2, "in flight")
        if how == "SIGTERM to the supervisor":
            proc.send_signal(signal.SIGTERM)
        elif how == "SIGKILL":
            proc.kill()
        else:
            os.killpg(proc.pid, signal.SIGTERM if how == "SIGTERM to the group" else signal.SIGINT)
        time.sleep(0.5)
        locker.execute("COMMIT")
        for writer in writers:
            writer.join(30)
        assert proc.wait(timeout=30) == (-9 if how == "SIGKILL" else 0)
        statuses = {w: answer[0] if isinstance(answer, tuple) else answer for w, answer in answers.items()}
        assert statuses == {1: 201, 2: 201}, answers
        facts = sorted(row[0] for row in sqlite3.connect(db).execute("SELECT fact FROM memory_longterm"))
        assert facts == [f"fact {w} written as the service stops" for w in (1, 2)]
        supervised.drained.wait(10)
        stopped = [e for e in supervised.logged("stopped") if "worker" in e]
        assert sorted(e["worker"] for e in stopped) == [1, 2] and all(e["unanswered"] == 0 for e in stopped), stopped
        assert not [line for line in supervised.lines if "Traceback" in line or "worker_failed" in line]
    finally:
        locker.close()
        supervised.kill()


STUCK_S = 2.0  # the test's bound for a worker that does not beat (solos_workers.STUCK_S), short to keep it quick


def with_stuck_bound(argv: list[str], stuck_s: float = STUCK_S, stop_wait_s: float = 20.0) -> list[str]:
    """serve_argv's command, run with solos_workers.STUCK_S and STOP_WAIT_S set to the test's bounds."""
    script = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); import solos_workers, solos_memory;"
        f" solos_workers.STUCK_S = {stuck_s}; solos_workers.STOP_WAIT_S = {stop_wait_s};"
        " sys.exit(solos_memory.main(sys.argv[1:]))"
    )
    return [sys.executable, "-c", script, *argv[2:]]


@pytest.mark.parametrize("mode", ["shared", "reuseport"])
def test_a_worker_that_hangs_is_replaced_and_newcomers_are_not_left_waiting(tmp_path, mode):
    """A worker that hangs (SIGSTOP here) accepted nothing and nobody noticed: with SO_REUSEPORT the kernel kept
    handing it about half the new connections, which waited for ever; on the shared socket every newcomer waited
    TURN_WAIT_S behind it for as long as it hung. The supervisor sees it stop beating, logs `worker_stuck`,
    kills it and starts another; no newcomer waits past that bound (one queued on the hung worker's own socket
    is reset, never answered late or left hanging)."""
    argv = with_stuck_bound(serve_argv(tmp_path / "hang.db", "--model-dir", "off", "--worker-socket", mode))
    supervised = Supervised(argv)
    port = supervised.port
    stuck = on(port, 1, "GET", "/health")[1]["worker_pid"]
    other = on(port, 2, "GET", "/health")[1]["worker_pid"]
    try:
        os.kill(stuck, signal.SIGSTOP)
        outcomes = []
        for _ in range(16):
            started = time.monotonic()
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=STUCK_S + 10)
                with contextlib.closing(sock):
                    sock.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
                    outcomes.append((answered_by(sock), time.monotonic() - started))
            except (ConnectionResetError, ConnectionAbortedError) as error:
                outcomes.append((repr(error), time.monotonic() - started))
            except TimeoutError:
                outcomes.append(("hung", time.monotonic() - started))
        assert all(waited < STUCK_S + 3 for _, waited in outcomes), outcomes
        assert "hung" not in [outcome for outcome, _ in outcomes], outcomes
        found = wait_until(lambda: supervised.logged("worker_stuck"), "a worker_stuck line", 10)
        assert [(e["worker"], e["pid"]) for e in found] == [(1, stuck)], found  # the one that hung, only
        wait_until(lambda: [e for e in supervised.logged("worker_exited") if e["pid"] == stuck], "it reaped")
        assert on(port, 1, "GET", "/health")[1]["worker_pid"] != stuck  # started again
        assert on(port, 2, "GET", "/health")[1]["worker_pid"] == other
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stuck, signal.SIGCONT)
        supervised.kill()


def test_systemd_status_says_when_a_worker_is_down_and_when_all_serve_again(tmp_path):
    """`systemctl status` shows the unit's STATUS=: it said "2 workers" from READY=1 on, while a worker was dead,
    starting again or killed as stuck. It now says how many serve and which is starting again, until all do."""
    notify_path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(notify_path))
        notify.settimeout(30)
        env = {**os.environ, "NOTIFY_SOCKET": str(notify_path)}
        supervised = Supervised(serve_argv(tmp_path / "n.db", "--model-dir", "off"), env)
        port = supervised.port
        try:
            assert notify.recv(4096).decode().startswith("READY=1\n")
            os.kill(on(port, 1, "GET", "/health")[1]["worker_pid"], signal.SIGKILL)
            status = f"STATUS=listening on 127.0.0.1:{port}, {WORKERS} workers"
            assert notify.recv(4096).decode() == f"{status}; 1 serving, worker 1 starting again"
            assert notify.recv(4096).decode() == status
        finally:
            supervised.kill()


def test_ctrl_c_while_the_workers_start_stops_them_without_a_failure_line():
    """Ctrl-C (SIGINT to the group) while the workers are still starting (loading a model, say): the service
    stops, exit 0, with no `worker_failed` line blaming a KeyboardInterrupt."""
    script = (
        f"import sys, time; sys.path.insert(0, {str(ROOT)!r}); import solos_workers;"
        " sys.exit(solos_workers.supervise(2, '127.0.0.1', 0, 'shared', lambda worker: time.sleep(60) or 0))"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stderr is not None
        started = 0
        while started < 2:
            started += '"event": "worker_started"' in proc.stderr.readline()
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        lines = proc.stderr.read().splitlines()
        assert not [line for line in lines if "worker_failed" in line or "Traceback" in line], lines
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_stop_that_kills_a_worker_says_so(tmp_path):
    """A worker that does not stop within STOP_WAIT_S of SIGTERM (hung) is killed: the stop ended in time, exit 0,
    but the log only said `stopped`, as if every worker had finished its requests. It now names the worker."""
    argv = with_stuck_bound(serve_argv(tmp_path / "kill.db", "--model-dir", "off"), stuck_s=60, stop_wait_s=1)
    supervised = Supervised(argv)
    hung = on(supervised.port, 1, "GET", "/health")[1]["worker_pid"]
    try:
        os.kill(hung, signal.SIGSTOP)
        supervised.proc.send_signal(signal.SIGTERM)
        assert supervised.proc.wait(timeout=30) == 0
        supervised.drained.wait(10)
        stopped = [e for e in supervised.logged("stopped") if "workers" in e]
        assert stopped and stopped[-1]["killed"] == [1], supervised.lines
        with pytest.raises(ProcessLookupError):
            os.kill(hung, 0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(hung, signal.SIGCONT)
        supervised.kill()
