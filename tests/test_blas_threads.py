"""numpy's BLAS on one thread in the service (solos_embed.blas_threads): a spinning pool per process cost the
vector leg 10x its CPU, and N workers' pools fought for the same cores (docs/load.md)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numpy")

ROOT = Path(__file__).resolve().parent.parent

# Runs in a child: its threads and its BLAS's thread count after one product, as "tasks blas".
PROBE = """
import ctypes, os, sys
sys.path.insert(0, {root!r})
{before}
import solos_embed
{call}
import numpy
numpy.ones((4000, 384), dtype="f4") @ numpy.ones(384, dtype="f4")
libraries = [line.split()[-1] for line in open("/proc/self/maps") if "openblas" in line.rsplit("/", 1)[-1].lower()]
library = ctypes.CDLL(libraries[0])
get = next(getattr(library, name) for name in
           ("openblas_get_num_threads", "scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads")
           if hasattr(library, name))
print(len(os.listdir("/proc/self/task")), get())
"""


def probe(before: str = "", call: str = "") -> tuple[int, int]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    }
    script = PROBE.format(root=str(ROOT), before=before, call=call)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    if done.returncode != 0 and "IndexError" in done.stderr:
        pytest.skip("numpy's BLAS here is not OpenBLAS")
    assert done.returncode == 0, done.stderr
    tasks, blas = done.stdout.split()
    return int(tasks), int(blas)


@pytest.fixture(scope="module")
def pooled():
    """What numpy does here left alone: a pool of more than one thread, or nothing for this test to show."""
    if not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2:
        pytest.skip("one core, or no /proc: numpy's BLAS starts no pool to stop")
    tasks, blas = probe()
    if blas < 2:
        pytest.skip(f"numpy's BLAS starts {blas} thread here unasked")
    return tasks, blas


def test_blas_runs_one_thread_when_set_before_numpy_loads(pooled):
    assert probe(call="solos_embed.blas_threads(1)") == (1, 1)
    assert pooled[0] > 1  # the pool's threads, without the call


def test_blas_already_loaded_is_told_directly(pooled):
    tasks, blas = probe(before="import numpy", call="solos_embed.blas_threads(1)")
    assert blas == 1  # its threads exist already, parked; products now run on the caller's alone


def test_the_service_embedder_sets_one_blas_thread_and_backfill_leaves_it(monkeypatch):
    """load_embedder(threads=1), the service's, sets BLAS to one thread before onnxruntime brings numpy in;
    threads=None (backfill, a batch) leaves numpy's own choice."""
    import solos_embed

    calls = []
    monkeypatch.setattr(solos_embed, "blas_threads", calls.append)
    monkeypatch.setattr(solos_embed, "find_built", lambda dirs: None)
    monkeypatch.setattr(solos_embed, "missing_pieces", lambda folder, build=True: "stop here")
    for threads in (1, None):
        with pytest.raises(solos_embed.EmbeddingsUnavailable):
            solos_embed.load_embedder(None, threads=threads)
    assert calls == [1]
