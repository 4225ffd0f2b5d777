"""The C library's allocator, set once by `serve` before its first thread: at most one malloc arena per core.

glibc gives each new thread an arena of its own, up to eight per core, and the
service runs a thread per connection. Hybrid recall's model runs allocate
their activations with malloc in the request's thread (onnxruntime's arena is
off, solos_embed.session_options), so every connection thread that ever ran a
recall grows an arena of its own to that size and keeps it: a worker serving
64 clients held 275-281 MiB against 186-188 after its warm-up, where one arena
per core kept it at 184-187, and each new connection's first recalls paid the
page faults of growing its arena (docs/load.md, "Memory a connection thread
keeps"). Recalls running at once are few (`--admit`, two per core), so one
arena per core costs them no waiting worth measuring.

The setting is mallopt(M_ARENA_MAX, cores), through ctypes on the process's
own C library. It only bounds the arenas made after it, so `serve` makes it
while its process has one thread; the supervisor's workers inherit it through
the fork. Where the C library is not glibc or refuses, nothing changes and
the `listening` line says why (`malloc_arenas`, from `state`): recall answers
the same, each connection thread keeping its own arena.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

M_ARENA_MAX = -8  # malloc.h

lock = threading.Lock()
outcome: tuple[bool, str] | None = None  # once per process: what the first call did, and why


def cores() -> int:
    """The cores this process may run on (its affinity, not the host's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def arenas_capped(most: int | None = None) -> tuple[bool, str]:
    """At most `most` malloc arenas (default: one per core) for this process, once; (done, reason)."""
    global outcome
    with lock:
        if outcome is None:
            outcome = cap(most or cores())
        return outcome


def state() -> str:
    """What the `listening` line says: `at most N`, or `per thread` and why."""
    if outcome is None:
        return "per thread: not asked (only serve caps them)"
    return outcome[1] if outcome[0] else f"per thread: {outcome[1]}"


def cap(most: int) -> tuple[bool, str]:
    """mallopt(M_ARENA_MAX, most) on the process's C library, unless it is not glibc or says no."""
    library, version = platform.libc_ver()
    if library != "glibc":
        return False, f"the C library is {library or 'not glibc'}: no M_ARENA_MAX to set"
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError) as error:
        return False, f"glibc's mallopt is not reachable through ctypes ({error})"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(M_ARENA_MAX, most) != 1:
        return False, f"glibc {version} refused mallopt(M_ARENA_MAX, {most})"
    return True, f"at most {most}"
