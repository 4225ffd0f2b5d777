"""SQLite's memory statistics, off in `serve` before its first connection (solos_sqlite): applied only where no
connection exists, once per process, and a no-op with its reason where the library or a symbol is missing.

The setting is the process's, so each case that may make it runs in a child process of its own."""

from __future__ import annotations

import ctypes.util
import json
import sqlite3
import subprocess
import sys
import textwrap

from conftest import ROOT, call, service

import solos_sqlite


def child(*parts: str) -> dict:
    """Run the parts in a fresh interpreter with the project importable; they print one JSON object last."""
    script = f"import sys; sys.path.insert(0, {str(ROOT)!r})\n" + "\n".join(textwrap.dedent(p) for p in parts)
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout.strip().splitlines()[-1])


COUNTED = """
    import ctypes, json, sqlite3
    import solos_sqlite

    def counted():
        return solos_sqlite.memory_used(ctypes.CDLL(solos_sqlite.library_path()))
"""

FTS_QUERY = """
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(body)")
    conn.executemany("INSERT INTO t VALUES (?)", [(f"row {n} about shelters and planning",) for n in range(500)])
    found = conn.execute("SELECT count(*) FROM t WHERE t MATCH 'shelters'").fetchone()[0]
"""


def test_off_before_the_first_connection_leaves_no_allocation_counted():
    """With the statistics off, an open connection and an FTS5 query count no memory; without, they do."""
    before = child(COUNTED, FTS_QUERY, "print(json.dumps({'found': found, 'counted': counted()}))")
    assert before["found"] == 500 and before["counted"] > 0, before
    after = child(
        COUNTED,
        "done, reason = solos_sqlite.statistics_off()",
        FTS_QUERY,
        "print(json.dumps({'done': done, 'reason': reason, 'found': found, 'counted': counted()}))",
    )
    assert after == {"done": True, "reason": after["reason"], "found": 500, "counted": 0}, after


def test_an_open_connection_leaves_the_library_alone_and_says_so():
    """Shutting SQLite down under a connection would break it: the call refuses, and the connection still works."""
    found = child(
        COUNTED,
        """
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (x)")
    conn.execute("INSERT INTO t VALUES (7)")
    done, reason = solos_sqlite.statistics_off()
    print(json.dumps({"done": done, "reason": reason, "x": conn.execute("SELECT x FROM t").fetchone()[0],
                      "counted": counted()}))
    """,
    )
    assert found["done"] is False and "a connection is open" in found["reason"], found
    assert found["x"] == 7 and found["counted"] > 0, found  # untouched: still counting


def test_it_runs_once_per_process_so_a_later_call_never_shuts_down_a_connection():
    found = child(
        COUNTED,
        """
    first = solos_sqlite.statistics_off()
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (x)")
    conn.execute("INSERT INTO t VALUES (7)")
    touched = []  # counted() reads 0 now whatever is open: only the once-flag keeps SQLite from a shutdown here
    solos_sqlite.switch_off = lambda path: touched.append(path) or (True, "shut down under a connection")
    second = solos_sqlite.statistics_off()
    print(json.dumps({"first": first, "second": second, "touched": touched,
                      "x": conn.execute("SELECT x FROM t").fetchone()[0]}))
    """,
    )
    assert found["first"] == found["second"] and found["first"][0] is True, found
    assert found["touched"] == [] and found["x"] == 7, found


def test_a_missing_library_or_symbol_is_a_no_op_with_its_reason():
    """Fails before touching SQLite, so it runs here: nothing is shut down, nothing cached."""
    done, reason = solos_sqlite.switch_off("/nonexistent/libsqlite3.so")
    assert done is False and "not reachable" in reason and "/nonexistent/libsqlite3.so" in reason, reason
    libc = ctypes.util.find_library("c")
    assert libc
    done, reason = solos_sqlite.switch_off(libc)
    assert done is False and "sqlite3_" in reason and "statistics left on" in reason, reason
    assert solos_sqlite.outcome is None or solos_sqlite.outcome[1] != reason


class BuiltOff:
    """A library as a build with SQLITE_DEFAULT_MEMSTATUS=0 answers; any other call fails the test."""

    def __init__(self, _path: str) -> None:
        self.sqlite3_libversion = lambda: sqlite3.sqlite_version.encode()
        self.sqlite3_compileoption_used = lambda option: option == b"DEFAULT_MEMSTATUS=0"
        self.sqlite3_shutdown = self.sqlite3_config = self.sqlite3_initialize = self.forbidden

    def forbidden(self, *_: object) -> int:
        raise AssertionError("a build whose statistics are off needs no shutdown")


def test_a_build_with_the_statistics_off_is_left_alone_and_said_off(monkeypatch):
    """Such a build counts nothing, so the held-memory check could not see a connection: nothing is shut down."""
    monkeypatch.setattr(solos_sqlite.ctypes, "CDLL", BuiltOff)
    assert solos_sqlite.switch_off("libsqlite3-built-off.so") == (True, "built off (SQLITE_DEFAULT_MEMSTATUS=0)")


def test_serve_turns_them_off_before_its_first_connection_and_still_answers(tmp_path):
    """`off` is only possible where no connection existed yet (the checks above); the listening line says it."""
    argv = [sys.executable, str(ROOT / "solos_memory.py"), "serve", "--db", str(tmp_path / "s.db"), "--port", "0",
            "--register", "atlas", "--model-dir", "off", "--no-request-log"]  # fmt: skip
    with service(argv) as (port, lines):
        listening = next(json.loads(line) for line in lines if '"listening"' in line)
        assert listening["sqlite_memory_statistics"] == "off", listening
        status, _ = call(port, "POST", "/v1/long", {"agent": "atlas", "fact": "the shelter opens at nine"})
        assert status == 201
        status, answer = call(port, "GET", "/v1/recall?agent=atlas&q=shelter")
        assert status == 200 and answer["results"][0]["fact"] == "the shelter opens at nine", answer


def test_the_listening_line_says_why_they_stayed_on():
    found = child(
        """
    import json, sqlite3
    import solos_sqlite
    first = solos_sqlite.state()
    conn = sqlite3.connect(":memory:")
    solos_sqlite.statistics_off()
    print(json.dumps({"first": first, "then": solos_sqlite.state()}))
    """
    )
    assert found["first"].startswith("on: not asked"), found
    assert found["then"].startswith("on: SQLite already holds") and "a connection is open" in found["then"], found
