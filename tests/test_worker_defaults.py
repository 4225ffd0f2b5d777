"""serve's --pin-threads and --admit where the operator says nothing: pinned, one place a core, for SQLite workers
with a core each; unchanged for one process, over PostgreSQL and past one worker a core; what the operator says
(flag or environment) wins. Resolved from serve's own command line, as `serve` resolves it."""

from __future__ import annotations

import pytest

import solos_connections
import solos_memory
import solos_workers

PG_URL = "postgresql://solos@127.0.0.1:5432/solos"
OLD_ADMIT = solos_connections.default_admit()  # 2 per core: every process's default before, and still one process's


@pytest.fixture(autouse=True)
def cores(monkeypatch):
    """The cores this process may run on, as serve sees them: 2 unless a test says (set(list))."""
    for name in ("SOLOS_MEMORY_WORKERS", "SOLOS_MEMORY_PIN_THREADS", "SOLOS_MEMORY_ADMIT"):
        monkeypatch.delenv(name, raising=False)
    if not hasattr(solos_workers.os, "sched_setaffinity"):
        pytest.skip("no thread affinity here: never pinned")
    held = [0, 1]
    monkeypatch.setattr(solos_workers, "process_cores", lambda: list(held))
    return held


def resolved(*flags: str, db: str = "fleet.db") -> tuple[bool, list[int]]:
    """(pinned, each worker's --admit) for `serve --db db *flags`; one process: [its --admit]."""
    config = solos_workers.settled(solos_memory.config_from(solos_memory.parse_args(["serve", "--db", db, *flags])))
    if config.workers == 1:
        return bool(config.pin_threads), [solos_workers.places(config)]
    workers = [solos_workers.Worker(index, config.workers, 0, None, "", -1) for index in range(1, config.workers + 1)]
    return bool(config.pin_threads), [solos_workers.places(config, worker) for worker in workers]


def test_sqlite_workers_run_pinned_with_one_place_a_core_by_default(cores):
    assert resolved("--workers", "2") == (True, [1, 1])
    cores[:] = [0, 1, 2, 3]
    assert resolved("--workers", "2") == (True, [2, 2])  # two cores each: a place for each
    assert resolved("--workers", "3") == (True, [2, 1, 1])  # worker 1 runs on cores 0 and 3


def test_workers_auto_runs_pinned_one_a_core(cores):
    assert resolved("--workers", "auto") == (True, [1, 1])
    cores[:] = [0, 1, 2, 3, 4, 5]
    assert resolved("--workers", "auto") == (True, [1] * 6)
    cores[:] = [0]
    assert resolved("--workers", "auto") == (False, [OLD_ADMIT])  # one core: one process, as before


def test_one_process_is_unchanged():
    assert resolved() == (False, [OLD_ADMIT])
    assert resolved("--workers", "1") == (False, [OLD_ADMIT])


def test_postgresql_workers_are_unchanged():
    """A recall over PostgreSQL waits on the network with its place held: one place a core would serialise them."""
    assert resolved("--workers", "2", db=PG_URL) == (False, [OLD_ADMIT, OLD_ADMIT])
    assert resolved("--workers", "2", "--pin-threads", "on", db=PG_URL) == (True, [OLD_ADMIT, OLD_ADMIT])


def test_more_workers_than_cores_are_not_pinned_by_default():
    """Pinned, two workers would share a core: not measured, so the default stays as it was."""
    assert resolved("--workers", "3") == (False, [OLD_ADMIT] * 3)
    assert resolved("--workers", "3", "--pin-threads", "on") == (True, [1, 1, 1])  # said: one core each, shared


def test_what_the_operator_says_wins_flag_or_environment(monkeypatch):
    assert resolved("--workers", "2", "--pin-threads", "off") == (False, [OLD_ADMIT, OLD_ADMIT])
    assert resolved("--workers", "2", "--admit", "4") == (True, [4, 4])  # each setting on its own
    assert resolved("--workers", "2", "--pin-threads", "off", "--admit", "4") == (False, [4, 4])
    assert resolved("--workers", "2", "--admit", "0") == (True, [0, 0])  # 0: no cap, as said
    monkeypatch.setenv("SOLOS_MEMORY_PIN_THREADS", "off")
    assert resolved("--workers", "2") == (False, [OLD_ADMIT, OLD_ADMIT])
    assert resolved("--workers", "2", "--pin-threads", "on") == (True, [1, 1])  # the flag beats the environment
    monkeypatch.delenv("SOLOS_MEMORY_PIN_THREADS")
    monkeypatch.setenv("SOLOS_MEMORY_ADMIT", "3")
    assert resolved("--workers", "2") == (True, [3, 3])
    monkeypatch.setenv("SOLOS_MEMORY_WORKERS", "2")
    monkeypatch.delenv("SOLOS_MEMORY_ADMIT")
    assert resolved() == (True, [1, 1])


def test_a_server_built_without_serve_keeps_the_old_default(server):
    """conftest's servers (and bench/load_profile's) build MemoryServer from a Config directly: one process."""
    assert server.get("/v1/stats").body["load"]["running_most"] == OLD_ADMIT
