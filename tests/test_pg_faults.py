"""PostgreSQL faults: a bad URL, a refused connection or a database the service may not set up each
stop the start with one clear line; the database going away while serving gives 503 storage_unavailable with
Retry-After, never an empty success, and the service recovers by itself when the database comes back."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import ROOT, fleet_writer, start_server, stop_server, wait_until
from pg_server import free_loopback_port

pytestmark = pytest.mark.slow

SERVE_S = 20  # a start that does not stop by itself within this fails the test


def start_line(url: str) -> subprocess.CompletedProcess:
    """`serve` on url as an operator runs it: its exit status and what it printed."""
    return subprocess.run(
        [sys.executable, str(ROOT / "solos_memory.py"), "serve", "--db", url, "--port", "0", "--model-dir", "off"],
        capture_output=True,
        text=True,
        timeout=SERVE_S,
        cwd=ROOT,
    )


def one_clear_line(result: subprocess.CompletedProcess, *words: str) -> str:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr  # no traceback
    assert all(word in lines[0] for word in words), lines[0]
    return lines[0]


def test_a_refused_connection_stops_the_start_with_one_line():
    url = f"postgresql://postgres@127.0.0.1:{free_loopback_port()}/solos"
    line = one_clear_line(start_line(url), "cannot start", "cannot be reached", "Connection refused")
    assert url.split("@")[1] in line


def test_a_malformed_url_and_a_missing_database_stop_the_start_with_one_line(pg_cluster):
    one_clear_line(start_line("postgresql://postgres@127.0.0.1:notaport/solos"), "cannot start", "cannot be reached")
    missing = pg_cluster.url_of("no_such_database")
    one_clear_line(start_line(missing), "cannot start", 'database "no_such_database" does not exist')


def test_a_password_in_the_url_never_reaches_the_log():
    url = f"postgresql://solos:s3cret-word@127.0.0.1:{free_loopback_port()}/solos"
    line = one_clear_line(start_line(url), "cannot start")
    assert "s3cret-word" not in line and "solos:***@" in line


def test_a_database_the_user_may_not_set_up_stops_the_start_with_one_line(pg_cluster, pg_url):
    import psycopg

    role = f"visitor_{int(time.time() * 1000) % 10**9}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"REVOKE CREATE ON SCHEMA public FROM PUBLIC; REVOKE CREATE ON SCHEMA public FROM {role}")
    try:
        visitor = pg_url.replace("postgresql://postgres@", f"postgresql://{role}@")
        line = one_clear_line(start_line(visitor), "schema")
        assert "may not create" in line or "could not be applied" in line, line
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"DROP OWNED BY {role}; DROP ROLE {role}")


def test_the_database_going_away_is_503_with_retry_after_then_the_service_recovers(pg_private_cluster):
    url = pg_private_cluster.fresh_database()
    running = start_server(url, busy_timeout_ms=1000)
    try:
        assert running.post("/v1/long", {"agent": "atlas", "fact": "the boiler was serviced in May"}).status == 201
        assert running.recall("sol", "boiler", scope="shared").body["count"] == 1

        pg_private_cluster.kill()
        write = running.post("/v1/long", {"agent": "atlas", "fact": "written while the database is down"})
        recall = running.recall("sol", "boiler", scope="shared")
        for reply in (write, recall):
            assert reply.status == 503, reply.body
            assert reply.body["error"]["code"] == "storage_unavailable"
            assert int(reply.headers["retry-after"]) >= 1
            assert "cannot be reached" in reply.body["error"]["message"]
        storage = running.get("/health").body["storage"]  # /health answers, and says the database fails
        assert storage["state"] == "failing" and "cannot be reached" in storage["last_failure"]["reason"], storage

        pg_private_cluster.start()
        deadline = time.monotonic() + 15
        while (again := running.recall("sol", "boiler", scope="shared")).status != 200:
            assert again.status == 503 and time.monotonic() < deadline, again.body
            time.sleep(0.2)
        assert [r["text"] for r in again.body["results"]] == ["the boiler was serviced in May"]
        assert running.post("/v1/long", {"agent": "atlas", "fact": "written after it came back"}).status == 201
        events = running.get("/v1/events", agent="atlas").body["events"]
        assert [e["row"]["fact"] for e in events if e["kind"] == "write"] == [
            "the boiler was serviced in May",
            "written after it came back",
        ]  # the refused write left nothing behind
        health = running.get("/health")
        assert health.status == 200 and health.body["storage"]["state"] == "failing", health.body  # for a minute
    finally:
        stop_server(running)


def test_a_standby_answering_during_a_failover_is_503_with_retry_after_not_500(pg_private_cluster):
    """The node about to be promoted takes connections before it takes writes: HAProxy routes to it as soon as
    Patroni calls it the leader. A write in that window must be refused as the database being unavailable."""
    import psycopg

    url = pg_private_cluster.fresh_database()
    running = start_server(url, busy_timeout_ms=1000)
    try:
        assert running.post("/v1/long", {"agent": "atlas", "fact": "the boiler was serviced in May"}).status == 201
        pg_private_cluster.stop()
        (pg_private_cluster.data_dir / "standby.signal").touch()  # it starts again as a standby: read-only
        pg_private_cluster.start()

        # The first try may meet a pooled connection the restart cut ("cannot be reached"); the next reach the standby.
        writes = [running.post("/v1/long", {"agent": "atlas", "fact": "written while a standby"}) for _ in range(2)]
        for write in writes:
            assert write.status == 503, write.body
            assert write.body["error"]["code"] == "storage_unavailable"
            assert int(write.headers["retry-after"]) >= 1
        assert "read-only" in writes[-1].body["error"]["message"]
        assert running.recall("sol", "boiler", scope="shared").status == 200  # a standby still answers reads

        with psycopg.connect(pg_private_cluster.url, autocommit=True) as admin:
            assert admin.execute("SELECT pg_promote()").fetchone()[0]
        deadline = time.monotonic() + 15
        after = {"agent": "atlas", "fact": "written after the promotion"}
        while (again := running.post("/v1/long", after)).status != 201:
            assert again.status == 503 and time.monotonic() < deadline, again.body
            time.sleep(0.2)
        events = running.get("/v1/events", agent="atlas").body["events"]
        assert [e["row"]["fact"] for e in events if e["kind"] == "write"] == [
            "the boiler was serviced in May",
            "written after the promotion",
        ]  # the refused write left nothing behind
    finally:
        stop_server(running)


def test_a_statement_past_its_timeout_is_busy_and_keeps_the_pool(pg_url, monkeypatch):
    """statement_timeout cancels the statement (QueryCanceled, an OperationalError): 503 busy, not 'cannot be
    reached', and the pooled connections stay."""
    import solos_store_pg
    from solos_store import Busy

    monkeypatch.setattr(solos_store_pg, "STATEMENT_TIMEOUT_MS", 200)
    store = solos_store_pg.PgStore(pg_url, admin=True)
    store.migrate()
    try:
        store.read(lambda conn: conn.execute("SELECT 1"))
        pooled = store.pool.qsize()
        with pytest.raises(Busy, match="took longer than 200 ms"):
            store.read(lambda conn: conn.execute("SELECT pg_sleep(2)"))
        assert store.pool.qsize() == pooled >= 1
        assert store.read(lambda conn: conn.execute("SELECT 41 + 1").fetchone()[0]) == 42
    finally:
        store.close()


def test_a_write_waiting_for_its_synchronous_standby_outlasts_the_statement_timeout(pg_private_cluster, monkeypatch):
    """A COMMIT cancelled while it waits for the synchronous standby reports success for a commit that is not
    replicated. PostgreSQL lifts statement_timeout before it commits, so neither the service's one-statement
    writes (their COMMIT is the statement's own) nor a transaction's COMMIT is cancelled by it: both still wait,
    unanswered, at 5x the timeout, and are acknowledged once the standby (here: the setting going away) allows."""
    import threading

    import psycopg

    import solos_store_pg

    monkeypatch.setattr(solos_store_pg, "STATEMENT_TIMEOUT_MS", 200)
    url = pg_private_cluster.fresh_database()
    admin = solos_store_pg.PgStore(url, admin=True)
    admin.migrate()
    admin.register_agents(["atlas"])
    admin.close()
    store = solos_store_pg.PgStore(url)
    writes = {
        "one statement": lambda: store.upsert_long("atlas", "ops", "the standby flushed this", None, None, []),
        "a transaction": lambda: store.write(
            lambda conn: conn.execute("INSERT INTO solos_memory_meta (key, value) VALUES ('flushed', 'yes')")
        ),
    }
    outcomes: dict[str, object] = {}
    threads = [threading.Thread(target=lambda n=n, w=w: outcomes.setdefault(n, w())) for n, w in writes.items()]

    def standby_named(name: str) -> None:
        with psycopg.connect(pg_private_cluster.url, autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{name}'")
            conn.execute("SELECT pg_reload_conf()")

            def taken() -> bool:
                with psycopg.connect(url) as fresh:
                    return fresh.execute("SHOW synchronous_standby_names").fetchone()[0] == name

            wait_until(taken, "synchronous_standby_names to be reloaded")

    try:
        standby_named("absent_standby")
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        assert outcomes == {} and all(thread.is_alive() for thread in threads)  # waiting, not acknowledged
        standby_named("")
        for thread in threads:
            thread.join(10)
        assert outcomes["one statement"]["status"] == "created"
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0] == 1
            assert conn.execute("SELECT value FROM solos_memory_meta WHERE key = 'flushed'").fetchone() == ("yes",)
    finally:
        standby_named("")
        store.close()


class CuttingProxy:
    """A loopback TCP proxy in front of PostgreSQL that, once armed, lets the next statement naming `marker` run and
    commit, then closes that connection before its answer (ReadyForQuery: committed) reaches the service."""

    READY_IDLE = b"Z\x00\x00\x00\x05I"  # ReadyForQuery, idle: the statement's implicit transaction has committed

    def __init__(self, port: int, marker: bytes):
        self.port, self.marker, self.armed, self.cut = port, marker, False, threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url_port = self.listener.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.port))
            marked = threading.Event()
            threading.Thread(target=self.pipe, args=(client, server, marked, True), daemon=True).start()
            threading.Thread(target=self.pipe, args=(server, client, marked, False), daemon=True).start()

    def pipe(self, source: socket.socket, sink: socket.socket, marked: threading.Event, upstream: bool) -> None:
        held = b""
        try:
            while data := source.recv(65536):
                if upstream and self.armed and self.marker in data:
                    self.armed = False
                    marked.set()
                if not upstream and marked.is_set():
                    held += data
                    if held.endswith(self.READY_IDLE):  # committed: the answer never arrives
                        self.cut.set()
                        break
                    continue
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def close(self) -> None:
        self.listener.close()


def test_a_write_whose_commit_answer_is_lost_is_not_said_to_have_changed_nothing(pg_cluster, pg_url):
    # The connection dropped after PostgreSQL committed the write and before its answer came back. The service
    # answered 503 "nothing was changed, retry later", and the episode was stored: an agent that retried stored
    # it twice. The answer must not claim what the service cannot know.
    proxy = CuttingProxy(pg_cluster.port, b"solos_write_episodic")
    url = pg_url.replace(f":{pg_cluster.port}/", f":{proxy.url_port}/")
    running = start_server(url, busy_timeout_ms=1000)
    try:
        proxy.armed = True
        reply = running.post("/v1/episodic", {"agent": "atlas", "event_type": "t", "summary": "cut after commit"})
        assert proxy.cut.is_set()
        with fleet_writer(pg_url) as conn:
            stored = conn.execute("SELECT count(*) FROM memory_episodic WHERE summary = 'cut after commit'").fetchone()
        assert stored[0] == 1  # PostgreSQL committed it
        assert reply.status == 503, reply.body
        assert reply.body["error"]["code"] == "storage_unavailable"
        message = reply.body["error"]["message"]
        assert "nothing was changed" not in message and "may have been stored" in message, message
        assert running.post("/v1/long", {"agent": "atlas", "fact": "the pool recovers"}).status == 201
    finally:
        stop_server(running)
        proxy.close()


def test_a_pooled_connection_the_server_ended_is_not_handed_to_the_next_call(pg_url):
    # After a restart or failover (or pg_terminate_backend), every idle pooled connection is dead. The next call
    # took one and answered 503 "cannot be reached" with the database up, and a write said it "may have been
    # stored" when the server had ended the connection before it was sent.
    import psycopg

    import solos_store_pg

    store = solos_store_pg.PgStore(pg_url, admin=True)
    store.migrate()
    store.register_agents(["atlas"])
    try:
        pids = store.read(lambda conn: [conn.info.backend_pid])
        assert store.pool.qsize() == 1
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pids[0],))
            gone = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
            wait_until(lambda: admin.execute(gone, (pids[0],)).fetchone()[0] == 0, "the backend to end")
        assert store.read(lambda conn: conn.execute("SELECT 41 + 1").fetchone()[0]) == 42
        pids.append(store.read(lambda conn: conn.info.backend_pid))
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pids[-1],))
            wait_until(lambda: admin.execute(gone, (pids[-1],)).fetchone()[0] == 0, "the backend to end")
        assert store.upsert_long("atlas", None, "written after the cut", None, None, [])["status"] == "created"
    finally:
        store.close()
