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
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
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


# ==== Event streams (SSE) ====

STREAM_WAIT_S = 5.0  # how long a test waits for the next message of a stream


class Stream:
    """One SSE subscription, read on a thread into a queue of messages ({"id", "event", "data", "comment"})."""

    def __init__(self, server, query: dict, headers: dict | None = None):
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
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


def wait_until(condition, what: str = "condition", timeout_s: float = 20.0):
    """Poll condition() until it returns something truthy, and return that; fail naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)
    return result


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
    """A word no other row holds; its tail is what the file scans look for (FTS5 prefix-compresses terms)."""
    return "zq" + uuid.uuid4().hex


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


# ==== PostgreSQL: one throwaway server per run, a fresh database per test (issue 22) ====


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
