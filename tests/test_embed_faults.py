"""The embedder's files in a bad state never stop the service: a folder where the built model goes, weights it
cannot read. Each is EmbeddingsUnavailable with the reason (serve then starts keyword-only and says why), never
an OSError out of load_embedder, which serve does not catch (a traceback, no service at all).

No real build: the build child is a stand-in that writes known bytes, whose sha256 stands for MODEL_SHA256.
"""

import hashlib
import os
import subprocess

import pytest

import solos_embed
from solos_embed import EmbeddingsUnavailable

BUILT = b"a built model"


@pytest.fixture
def fake_build(monkeypatch):
    """build_model's child replaced by one that writes BUILT to its output path (its last argument)."""
    monkeypatch.setattr(solos_embed, "MODEL_SHA256", hashlib.sha256(BUILT).hexdigest())

    def run(argv, **kwargs):
        with open(argv[-1], "wb") as out:
            out.write(BUILT)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(solos_embed.subprocess, "run", run)


def test_a_folder_where_the_built_model_goes_falls_to_the_next_folder(fake_build, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    (first / solos_embed.MODEL_FILE).mkdir(parents=True)
    built = solos_embed.build_model(tmp_path / "weights.onnx", [first, second])
    assert built == second / solos_embed.MODEL_FILE and built.read_bytes() == BUILT
    assert sorted(p.name for p in first.iterdir()) == [solos_embed.MODEL_FILE]  # no temp file left behind


def test_a_folder_where_the_only_built_model_goes_is_unavailable_with_its_reason(fake_build, tmp_path):
    (tmp_path / solos_embed.MODEL_FILE).mkdir()
    with pytest.raises(EmbeddingsUnavailable, match="no folder to keep the built model in: .*Is a directory"):
        solos_embed.build_model(tmp_path / "weights.onnx", [tmp_path])


def test_weights_it_cannot_read_are_unavailable_with_the_reason(monkeypatch, tmp_path):
    weights = tmp_path / "model.onnx"
    weights.write_bytes(b"weights")

    def unreadable(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(solos_embed, "sha256_file", unreadable)  # as chmod 000 does to a service that is not root
    with pytest.raises(EmbeddingsUnavailable, match="weights file .*model.onnx unreadable: Permission denied"):
        solos_embed.check_weights(weights)


def test_a_build_cleans_up_the_temp_file_of_a_build_whose_process_died(fake_build, tmp_path):
    """A service stopped (SIGTERM) during its first start's build left `.<model>.<pid>.tmp` (22 MB) in the
    cache for good: the next build removes a dead process's temp file, and leaves a live one's alone."""
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid is free (a reused one only keeps the file until a later build)
    stale = tmp_path / f".{solos_embed.MODEL_FILE}.{dead.pid}.tmp"
    building = tmp_path / f".{solos_embed.MODEL_FILE}.{os.getppid()}.tmp"  # a live process, still writing
    stale.write_bytes(b"half a model")
    building.write_bytes(b"half a model")
    assert solos_embed.build_model(tmp_path / "weights.onnx", [tmp_path]).read_bytes() == BUILT
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([building.name, solos_embed.MODEL_FILE])
