"""malloc arenas capped at one per core by `serve` before its first thread (solos_malloc): threads started after
share them instead of growing one each; once per process; a no-op with its reason off glibc.

The setting is the process's, so each case that makes it runs in a child process of its own."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT, call, service

import solos_malloc

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="arenas are glibc's")

THREADS = 8
# Each thread mallocs while all are alive (a thread's first malloc gives it an arena, a new one while under the
# cap), then glibc's malloc_stats prints one "Arena N:" block per arena to stderr.
COUNT_ARENAS = f"""
    import ctypes, threading
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    together = threading.Barrier({THREADS})

    def allocate():
        block = libc.malloc(4096)
        together.wait()
        libc.free(block)

    threads = [threading.Thread(target=allocate) for _ in range({THREADS})]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    libc.malloc_stats()
"""


def child(*parts: str) -> tuple[dict, int]:
    """Run the parts in a fresh interpreter with the project importable: the JSON object they print last, and how
    many arenas glibc's malloc_stats printed."""
    script = f"import sys; sys.path.insert(0, {str(ROOT)!r})\n" + "\n".join(textwrap.dedent(p) for p in parts)
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    arenas = sum(1 for line in ran.stderr.splitlines() if line.startswith("Arena "))
    return json.loads(ran.stdout.strip().splitlines()[-1]), arenas


@glibc_only
def test_threads_after_the_cap_share_the_arenas_instead_of_one_each():
    _, uncapped = child("import json; print(json.dumps({}))", COUNT_ARENAS)
    assert uncapped > THREADS, uncapped  # glibc's default: one per thread (up to 8 a core), the main thread's too
    found, capped = child(
        "import json, solos_malloc",
        "done, reason = solos_malloc.arenas_capped(2)",
        COUNT_ARENAS,
        "print(json.dumps({'done': done, 'reason': reason, 'state': solos_malloc.state()}))",
    )
    assert found == {"done": True, "reason": "at most 2", "state": "at most 2"}, found
    assert 1 <= capped <= 2, capped


@glibc_only
def test_it_runs_once_per_process():
    found, capped = child(
        """
    import json, solos_malloc
    first = solos_malloc.arenas_capped(1)
    solos_malloc.cap = lambda most: (True, f"capped again at {most}")
    second = solos_malloc.arenas_capped(4)
    """,
        COUNT_ARENAS,
        "print(json.dumps({'first': first, 'second': second}))",
    )
    assert found["first"] == found["second"] == [True, "at most 1"], found
    assert capped == 1, capped


def test_off_glibc_it_is_a_no_op_with_its_reason(monkeypatch):
    """Fails before touching the allocator, so it runs here."""
    monkeypatch.setattr(solos_malloc.platform, "libc_ver", lambda: ("", ""))
    done, reason = solos_malloc.cap(2)
    assert done is False and "not glibc" in reason and "M_ARENA_MAX" in reason, reason
    monkeypatch.setattr(solos_malloc, "outcome", (done, reason))
    assert solos_malloc.state() == f"per thread: {reason}"
    monkeypatch.setattr(solos_malloc, "outcome", None)
    assert solos_malloc.state().startswith("per thread: not asked")


@glibc_only
def test_serve_caps_them_at_one_per_core_and_says_so(tmp_path):
    argv = [sys.executable, str(ROOT / "solos_memory.py"), "serve", "--db", str(tmp_path / "m.db"), "--port", "0",
            "--register", "atlas", "--model-dir", "off", "--no-request-log"]  # fmt: skip
    with service(argv) as (port, lines):
        listening = next(json.loads(line) for line in lines if '"listening"' in line)
        assert listening["malloc_arenas"] == f"at most {solos_malloc.cores()}", listening
        status, _ = call(port, "POST", "/v1/long", {"agent": "atlas", "fact": "the shelter opens at nine"})
        assert status == 201
        status, answer = call(port, "GET", "/v1/recall?agent=atlas&q=shelter")
        assert status == 200 and answer["results"][0]["fact"] == "the shelter opens at nine", answer
