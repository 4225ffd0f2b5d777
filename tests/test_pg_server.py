"""The throwaway PostgreSQL server the store tests run on (tests/pg_server.py): its fresh databases are separate
and empty, a killed or stopped server refuses connections and comes back with its data, it listens on loopback
only, and it never outlives the test run, not even one killed with SIGKILL."""

from __future__ import annotations

import os
import pwd
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, wait_until
from pg_server import SERVER_USER, remove_stale_dirs

try:
    import psycopg
except ImportError:  # pg_cluster skips, or fails under SOLOS_TEST_REQUIRE_ALL=1, before a test body runs
    psycopg = None

pytestmark = pytest.mark.slow  # a PostgreSQL server, a tool outside .venv; a private one takes about a second

USER_RELATIONS = """SELECT count(*) FROM pg_class JOIN pg_namespace ON pg_namespace.oid = relnamespace
                    WHERE nspname NOT IN ('pg_catalog', 'information_schema') AND nspname NOT LIKE 'pg_toast%'"""


def connect(url: str):
    return psycopg.connect(url, autocommit=True, connect_timeout=5)


def refuses_connections(port: int, host: str = "127.0.0.1") -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.settimeout(2)
        return probe.connect_ex((host, port)) != 0


def gone(pid: int) -> bool:
    """No such process, or only its zombie (waiting for init to reap it: it holds no port and no memory)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def this_hosts_outward_address() -> str | None:
    """The address this host would reach the outside from (a UDP connect sends nothing); None when only
    loopback exists."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere real
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def test_fresh_databases_are_distinct_and_empty(pg_cluster):
    first, second = pg_cluster.fresh_database(), pg_cluster.fresh_database()
    assert first != second
    assert first.startswith(f"postgresql://postgres@127.0.0.1:{pg_cluster.port}/")
    with connect(first) as one, connect(second) as other:
        names = {conn.execute("SELECT current_database()").fetchone()[0] for conn in (one, other)}
        assert len(names) == 2 and "postgres" not in names
        for conn in (one, other):
            assert conn.execute(USER_RELATIONS).fetchone()[0] == 0
            assert conn.execute("SHOW server_encoding").fetchone()[0] == "UTF8"
        one.execute("CREATE TABLE only_in_first (note text)")
        assert other.execute("SELECT to_regclass('only_in_first')").fetchone()[0] is None
    for url in (first, second):
        pg_cluster.drop_database(url)


def test_a_dropped_database_is_gone_with_the_connections_left_open(pg_cluster):
    url = pg_cluster.fresh_database()
    left_open = connect(url)
    pg_cluster.drop_database(url)
    with pytest.raises(psycopg.OperationalError):
        left_open.execute("SELECT 1")
    with pytest.raises(psycopg.OperationalError, match="does not exist"):
        connect(url)


def test_store_url_is_a_fresh_sqlite_path_or_a_fresh_postgresql_database(store_url, tmp_path):
    if store_url.startswith("postgresql://"):
        with connect(store_url) as conn:
            assert conn.execute(USER_RELATIONS).fetchone()[0] == 0
            assert conn.execute("SELECT current_database()").fetchone()[0] != "postgres"
    else:
        assert Path(store_url).parent == tmp_path and not Path(store_url).exists()


def test_a_server_that_goes_away_refuses_connections_and_comes_back_with_its_data(pg_private_cluster):
    server = pg_private_cluster
    url = server.fresh_database()
    with connect(url) as conn:
        conn.execute("CREATE TABLE kept (note text)")
    written = []
    for go_away in (server.kill, server.stop):
        port, data_dir = server.port, server.data_dir
        with connect(url) as conn:
            conn.execute("INSERT INTO kept VALUES (%s)", (go_away.__name__,))
        written.append(go_away.__name__)
        survivor = connect(url)
        go_away()
        assert not server.running and refuses_connections(port)
        with pytest.raises(psycopg.OperationalError):
            survivor.execute("SELECT 1")
        survivor.close()
        with pytest.raises(psycopg.OperationalError):
            connect(url)
        server.start()
        assert (server.port, server.data_dir) == (port, data_dir)
        with connect(url) as conn:
            assert [note for (note,) in conn.execute("SELECT note FROM kept ORDER BY note")] == written
    server.close()
    assert not server.running and refuses_connections(port) and not server.dir.exists()


def test_the_server_listens_on_loopback_only(pg_cluster):
    with connect(pg_cluster.url) as conn:
        assert conn.execute("SHOW listen_addresses").fetchone()[0] == "127.0.0.1"
        address, port = conn.execute("SELECT inet_server_addr(), inet_server_port()").fetchone()
        assert (str(address), port) == ("127.0.0.1", pg_cluster.port)
        assert conn.execute("SHOW unix_socket_directories").fetchone()[0] == str(pg_cluster.dir)
    assert 1024 < pg_cluster.port < 65536 and not refuses_connections(pg_cluster.port)
    outward = this_hosts_outward_address()
    if outward:
        assert refuses_connections(pg_cluster.port, outward), f"reachable on {outward}"
    if socket.has_ipv6:
        assert refuses_connections(pg_cluster.port, "::1")


def test_the_server_runs_as_the_postgres_user_when_we_are_root(pg_cluster):
    expected = pwd.getpwnam(SERVER_USER).pw_uid if os.geteuid() == 0 else os.geteuid()
    assert os.stat(f"/proc/{pg_cluster.process.pid}").st_uid == expected
    assert pg_cluster.data_dir.stat().st_uid == expected


def test_a_test_run_killed_with_sigkill_leaves_no_server_behind(pg_cluster):
    """The postmaster dies with the process that started it, even from a thread that has ended since; the
    next run removes the directory, and leaves a live run's alone."""
    run = f"""
import os, signal, sys, threading
sys.path.insert(0, {str(ROOT / "tests")!r})
from pg_server import ThrowawayPostgres
server = ThrowawayPostgres()
server.stop()
restart = threading.Thread(target=server.start)
restart.start()
restart.join()
print(server.process.pid, server.port, server.dir, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    killed = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, timeout=60, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    pid, port, directory = killed.stdout.split()
    wait_until(lambda: gone(int(pid)), "the postmaster to die with its test run", timeout_s=15)
    assert refuses_connections(int(port))
    remove_stale_dirs()
    assert not Path(directory).exists() and pg_cluster.dir.exists()
