"""The SQLite library's process-wide settings, made once by `serve` before its first connection.

SQLite keeps memory statistics by default (SQLITE_DEFAULT_MEMSTATUS=1): every
sqlite3_malloc and sqlite3_free of every connection in the process takes one
process-wide mutex to count them, and an FTS5 query allocates for each
doclist and page it reads. Threads of one process recalling at once on two
cores then meet on that mutex: at 100k rows a keyword recall's SQL cost 24
ms of CPU on one thread and 38-41 ms on four, a fifth of it in the kernel's
futex calls; with the statistics off, 22.5 and 22.8 ms
(bench/sqlite_threads.py; docs/load.md, "One mutex per allocation"). The
service reads none of those statistics, so `serve` turns them off.

The switch is sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0), which SQLite takes
only while the library is shut down, and Python's sqlite3 initialises it at
import: so sqlite3_shutdown, the config, sqlite3_initialize, through ctypes
on the very library the `_sqlite3` module links. Shutting the library down
under an open connection would break it, so nothing is done unless SQLite
holds no memory at all (an open connection always holds some), and only
once per process; `serve` calls it while its process has one thread and no
connection. Wherever the library or a symbol is missing, or the check
fails, it does nothing and says why in the `listening` line
(`sqlite_memory_statistics`, from `state`): recall is the same, only dearer
when threads run it at once.
"""

from __future__ import annotations

import ctypes
import sqlite3
import threading

CONFIG_MEMSTATUS = 9  # SQLITE_CONFIG_MEMSTATUS, sqlite3.h
STATUS_MEMORY_USED = 0  # SQLITE_STATUS_MEMORY_USED

lock = threading.Lock()
outcome: tuple[bool, str] | None = None  # once per process: what the first call did, and why


def library_path() -> str:
    """The `_sqlite3` extension: looked up through it, SQLite's symbols are those of the library it links."""
    import _sqlite3

    return _sqlite3.__file__


def memory_used(lib: ctypes.CDLL) -> int:
    current, highest = ctypes.c_int64(), ctypes.c_int64()
    lib.sqlite3_status64.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    if lib.sqlite3_status64(STATUS_MEMORY_USED, ctypes.byref(current), ctypes.byref(highest), 0) != 0:
        raise RuntimeError("sqlite3_status64 refused SQLITE_STATUS_MEMORY_USED")
    return current.value


def statistics_off(path: str | None = None) -> tuple[bool, str]:
    """Turn SQLite's memory statistics off for this process, before its first connection; (done, reason)."""
    global outcome
    with lock:
        if outcome is None:
            outcome = switch_off(path or library_path())
        return outcome


def state() -> str:
    """What the `listening` line says: `off`, or `on` and why."""
    if outcome is None:
        return "on: not asked (only serve turns them off)"
    return "off" if outcome[0] else f"on: {outcome[1]}"


def switch_off(path: str) -> tuple[bool, str]:
    """The switch itself: the library at `path` shut down, configured and initialised again, unless it says no."""
    if sqlite3.threadsafety == 0:
        return False, "this SQLite is built without mutexes: its statistics take no lock"
    try:
        lib = ctypes.CDLL(path)
        shutdown, config, initialize = lib.sqlite3_shutdown, lib.sqlite3_config, lib.sqlite3_initialize
        lib.sqlite3_libversion.restype = ctypes.c_char_p
        version = lib.sqlite3_libversion().decode()
        if version != sqlite3.sqlite_version:
            return False, f"{path} reaches SQLite {version}, sqlite3 runs {sqlite3.sqlite_version}: left on"
        lib.sqlite3_compileoption_used.argtypes = [ctypes.c_char_p]
        if lib.sqlite3_compileoption_used(b"DEFAULT_MEMSTATUS=0"):  # then nothing counts, and nothing is to do
            return True, "built off (SQLITE_DEFAULT_MEMSTATUS=0)"
        held = memory_used(lib)
    except (OSError, AttributeError, RuntimeError) as error:
        return False, f"SQLite's library is not reachable through {path} ({error}): statistics left on"
    if held:
        return False, f"SQLite already holds {held} bytes (a connection is open): statistics left on"
    shutdown()
    config.argtypes = [ctypes.c_int, ctypes.c_int]
    refused = config(CONFIG_MEMSTATUS, 0)
    if initialize() != 0:  # the next connection tries again, and fails with SQLite's own error if it must
        return False, "sqlite3_initialize failed after sqlite3_config(SQLITE_CONFIG_MEMSTATUS)"
    if refused:
        return False, f"sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0) returned {refused}: statistics left on"
    probe = sqlite3.connect(":memory:")  # with the statistics off, an open connection counts no memory
    try:
        counted = memory_used(lib)
    finally:
        probe.close()
    if counted:
        return False, f"an open connection still counts {counted} bytes: the setting did not take"
    return True, "no process-wide mutex per SQLite allocation"
