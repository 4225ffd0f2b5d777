"""The cross-encoder: a small model that reads a question and a recalled row together.

The features judge (solos_judge) reads words, identifiers and the cosine; a bi-encoder's cosine cannot tell a
service's port from another service's. This model reads the pair (the question, then the row as the service
embeds it) through the embedder's lower four MiniLM layers, fine-tuned by bench/cross_encoder.py, and gives one
logit per row. In hybrid recall (the embedder is up, so onnxruntime, tokenizers and numpy import) it reads
recall's first `rows` rows after fusion and rerank, in one batched run, and the judge's probability for those
rows becomes a logistic over its logit and the features judge's:

    p = sigmoid(a * cross-encoder logit + b * logit(features judge probability) + c + evidence)

where `evidence` (a format-2 meta's, EVIDENCE) reads the features judge's own explicit features of the row,
each times its weight: the shipped one reads conflict*yes, whether the row holds a rival of the question's
specific (solos_judge.conflicts) times the model's logit where positive, so a model sure of a near miss
cannot outvote the rival the features judge sees (bench/README.md, "e. The combination reads the evidence").

A cascade: the model runs only when the features judge is unsure, its best probability over those rows inside
the meta's band (`cascade`: skip_below, skip_above; bench/cross_encoder_cascade.py chose it on calibration
records); outside it the features judge's probabilities stand, and the reason says the model was skipped.

Everything model-specific (the model file's name and sha256, the input format, `rows`, a/b/c and the evidence,
the floor the combination was set to, the cascade's band) is in a small meta file, models/judge/cross-encoder.json,
whose own sha256 is META_SHA256; the model's sha256 is MODEL_SHA256 and is checked on the very bytes
onnxruntime loads. A file with another hash is never loaded. A retrained model is swapped in by
bench/cross_encoder_swap.py (two files, two hashes).

Lazy and once per process: `load()` reads only the meta (no onnxruntime); the first hybrid recall starts the
model's load (read, checked, loaded) in a thread of its own, once however many recalls ask at the same time, and
waits for it up to its deadline; every later recall reuses that session. A run is the recall's own, in the
request's thread (one onnxruntime thread as the embedder runs, so concurrent recalls do not share a pool), with
RunOptions of its own: the process's one watchdog thread sets its `terminate` at the deadline and the run
fails before its next node. Nothing here raises into a recall: a missing, changed or malformed file, a package
that does not import, a run that fails or takes over RUN_TIMEOUT_S (the load included), each gives the features
judge's probabilities back with the reason, which the receipt's `judge_reason` shows.

Stdlib at import (the .pyz starts on a bare python3); imports solos_embed lazily, for its session settings.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import math
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import solos_store
from solos_rank import logistic

HERE = Path(__file__).resolve().parent
META_PATH = HERE / "models" / "judge" / "cross-encoder.json"
# The sha256 of META_PATH and of the model file it names, as bench/cross_encoder_swap.py wrote them (it rewrites
# these two lines).
META_SHA256 = "35feac8be67f35deb9982158d1b829b68fbed926eed9fa73e616c9a75b2b6530"
MODEL_SHA256 = "c5d7a4e41c59c407507d98583a6e1ed50a7003a50b7e15843c6be33f4aa70df4"
# Format 2 adds the combination's evidence (format 1: none, still read).
META_FORMAT = 2
META_FORMATS = (1, 2)
TOKENIZER_PATH = HERE / "models" / "all-MiniLM-L6-v2" / "tokenizer.json"
INPUT_NAMES = ("input_ids", "token_type_ids", "attention_mask")
# Four rows of 28 tokens take about 5-7 ms of one core; past this the run is stopped and the recall keeps the
# features judge and says so (a loaded host, or the first recalls waiting for the model's load, ~0.5 s).
RUN_TIMEOUT_S = 1.0
# The model is `failing` (health, /metrics, the status page) while at least half of its last RECENT_RUNS runs, and
# at least FAILING_RUNS, fell back to the features judge: each recall's receipt says so, the operator must too.
RECENT_RUNS, FAILING_RUNS = 20, 3
# A row is tokenized up to solos_embed.CHARS_PER_TOKEN characters per token of room (then whole if that was not
# enough): the tokenizer reads a row whole before it truncates, and at 20-28 tokens a pair that was a fifth of the
# judge's time.


def read_shipped(path: Path) -> bytes:
    """A file's bytes, also from inside the .pyz (this module's loader reads its own archive)."""
    loader = globals().get("__loader__")
    if loader is not None and hasattr(loader, "get_data"):
        return loader.get_data(str(path))
    return path.read_bytes()


def read_pinned(path: Path, sha256: str | None, what: str) -> tuple[bytes | None, str, str | None]:
    """A shipped file's bytes and sha256, or None and why not: unreadable, or not the pinned hash (None: any)."""
    try:
        raw = read_shipped(path)
    except OSError as error:
        return None, "", f"{what} unreadable: {path.name}: {error.strerror or error}"
    digest = hashlib.sha256(raw).hexdigest()
    if sha256 is not None and digest != sha256:
        return None, digest, f"{what} {path.name} sha256 {digest[:12]}… is not the expected {sha256[:12]}…"
    return raw, digest, None


def logit(p: float) -> float:
    p = min(max(float(p), 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


# The explicit evidence the combination may read beside the two logits (a format-2 meta's `evidence`): a features
# judge's feature by name (solos_judge.FEATURES), "conflict" (any of its conflict_* features), each alone or
# "*logit", times the cross-encoder's logit, or "*yes", times its logit where positive (so that a model sure of
# an answer weighs less where the evidence says no).
EVIDENCE = frozenset(
    ("kind_missing", "attribute_missing", "attribute_nowhere", "ids_nowhere", "missing_ids", "missing_idf", "conflict")
)
TIMES = {"*logit": lambda x: x, "*yes": lambda x: max(x, 0.0)}


def evidence_parts(name: str) -> tuple[str, Any]:
    """An evidence name's feature and what its value is multiplied by (None: nothing)."""
    for suffix, times in TIMES.items():
        if name.endswith(suffix):
            return name.removesuffix(suffix), times
    return name, None


def evidence_known(name: str) -> bool:
    return evidence_parts(name)[0] in EVIDENCE


def evidence(names: Sequence[str], x: float, row: Mapping[str, float]) -> list[float]:
    """The evidence inputs `names` for a row whose cross-encoder logit is `x` and whose features judge's features
    are `row` (KeyError when it lacks one)."""
    out = []
    for name in names:
        base, times = evidence_parts(name)
        if base == "conflict":
            found = [float(v) for k, v in row.items() if k.startswith("conflict_")]
            if not found:
                raise KeyError("conflict_*")
            value = max(found)
        else:
            value = float(row[base])
        out.append(value * times(x) if times else value)
    return out


def combined(beta: Sequence[Any], x: float, p: float, row: Mapping[str, float] | None = None) -> float:
    """The combination's probability for a row: beta (a, b, c) or (a, b, c, evidence names, their weights), the
    row's cross-encoder logit `x`, its features judge probability `p` and (with evidence) features `row`."""
    a, b, c, *terms = beta
    z = a * x + b * logit(p) + c
    if terms and terms[0]:
        z += sum(w * v for w, v in zip(terms[1], evidence(terms[0], x, row or {})))
    return logistic(z)


def pair_text(row: Mapping) -> str:
    """The row as the model was trained to read it: as the service embeds it, `agent (topic): text`."""
    return solos_store.labelled_text(row.get("agent") or "", row.get("topic") or "", row.get("text") or "")


@dataclass(frozen=True)
class Meta:
    """What models/judge/cross-encoder.json holds: the model file, its input, how many rows it reads, and the
    combination with the features judge."""

    model: str
    sha256: str
    max_len: int
    rows: int
    a: float
    b: float
    c: float
    floor: float
    # The cascade: the model runs only when the features judge's best probability over the first `rows` rows
    # lies in [skip_below, skip_above]; outside it the features judge is sure and its probabilities stand.
    # (0, 1): always run (a meta without a cascade).
    skip_below: float = 0.0
    skip_above: float = 1.0
    # The explicit evidence the combination reads beside the two logits (EVIDENCE names), one weight each.
    evidence: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()

    @property
    def beta(self) -> tuple[Any, ...]:
        """The combination's coefficients as combined() reads them."""
        return (self.a, self.b, self.c, self.evidence, self.weights) if self.evidence else (self.a, self.b, self.c)

    def sure(self, features: Sequence[float]) -> float | None:
        """The features judge's best probability over the head when it lies outside the cascade's band (the
        model need not run), else None."""
        best = max(features[: self.rows], default=0.0)
        return best if best < self.skip_below or best > self.skip_above else None

    @staticmethod
    def parse(raw: bytes) -> Meta:
        doc = json.loads(raw)
        if doc.get("format") not in META_FORMATS:
            raise ValueError(f"format {doc.get('format')!r}, expected one of {list(META_FORMATS)}")
        names = tuple(doc["input"]["names"])
        if names != INPUT_NAMES:
            raise ValueError(f"inputs {list(names)} are not this code's {list(INPUT_NAMES)}")
        combination = doc["combination"]
        a, b, c, floor = (float(combination[key]) for key in ("a", "b", "c", "floor"))
        meta = Meta(
            str(doc["model"]), str(doc["sha256"]), int(doc["input"]["max_len"]), int(doc["rows"]), a, b, c, floor
        )
        cascade = doc.get("cascade")
        if cascade is not None:
            meta = replace(meta, skip_below=float(cascade["skip_below"]), skip_above=float(cascade["skip_above"]))
            if not 0.0 <= meta.skip_below <= meta.skip_above <= 1.0:
                raise ValueError(f"cascade band {meta.skip_below}-{meta.skip_above} is not within 0-1")
        terms = combination.get("evidence") if doc["format"] >= 2 else None
        if terms is not None:
            names, weights = tuple(str(n) for n in terms["names"]), tuple(float(w) for w in terms["weights"])
            unknown = [n for n in names if not evidence_known(n)]
            if unknown or len(names) != len(weights):
                raise ValueError(f"evidence {list(names)} ({len(weights)} weights): {unknown or 'one weight each'}")
            meta = replace(meta, evidence=names, weights=weights)
        if "/" in meta.model or meta.model.startswith("."):
            raise ValueError(f"model {meta.model!r} is not a file name beside the meta")
        if not 8 <= meta.max_len <= 512 or not 1 <= meta.rows <= 100:
            raise ValueError(f"max_len {meta.max_len} or rows {meta.rows} out of range")
        if not all(math.isfinite(x) for x in (meta.a, meta.b, meta.c, meta.floor, *meta.weights)):
            raise ValueError("combination not finite")
        return meta


class Pair(NamedTuple):
    """One pair's token ids and token types, as a tokenizer's Encoding has them (padded reads either)."""

    ids: list[int]
    type_ids: list[int]


def padded(encoded: Sequence[Any]) -> tuple[Any, Any, Any]:
    """Encoded pairs as the model's inputs (numpy int64 ids, token types, mask), zero-padded to the longest."""
    import numpy as np

    width = max(len(e.ids) for e in encoded)
    ids = np.zeros((len(encoded), width), dtype=np.int64)
    types, mask = ids.copy(), ids.copy()
    for i, e in enumerate(encoded):
        n = len(e.ids)
        ids[i, :n], types[i, :n], mask[i, :n] = e.ids, e.type_ids, 1
    return ids, types, mask


class Session:
    """The loaded model and tokenizers, shared by every judge of this process that names the same file."""

    def __init__(self, model: bytes | str, max_len: int) -> None:
        import numpy  # noqa: F401  (the run needs it: fail here, at load, with the reason)
        import onnxruntime as ort
        from tokenizers import Tokenizer

        import solos_embed  # the embedder's session settings: one thread, no arena kept past a run

        # Each text tokenized alone, untruncated: a pair is assembled as the training's tokenizer (truncation
        # only_second) encodes it, [CLS] question [SEP] row [SEP] with the row cut to the room left (`pair`).
        self.words = Tokenizer.from_str(read_shipped(TOKENIZER_PATH).decode("utf-8"))
        self.words.no_padding()
        self.words.no_truncation()
        cls, sep = self.words.token_to_id("[CLS]"), self.words.token_to_id("[SEP]")
        if cls is None or sep is None:
            raise ValueError("the tokenizer has no [CLS] or [SEP]")
        self.cls: int = cls
        self.sep: int = sep
        self.max_len = max_len
        options = solos_embed.session_options(1)
        self.session = ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
        # A run's own options: the watchdog sets its `terminate` at the run's deadline. One per run, never reused:
        # a set flag fails every later run at its start until cleared, and a flip that lands as a run returns
        # must not stop the next one (0.4 us to make).
        self.run_options = ort.RunOptions

    def question(self, question: str) -> list[int]:
        """The question's tokens, at most half the room: only_second cannot fit a pair whose question fills it."""
        encoded = self.words.encode(question, add_special_tokens=False)
        if len(encoded.ids) > self.max_len // 2:  # cut where its last kept token ends, and read again
            encoded = self.words.encode(question[: encoded.offsets[self.max_len // 2 - 1][1]], add_special_tokens=False)
        return encoded.ids

    def pair(self, question: Sequence[int], row: str) -> Pair:
        """The pair as `encode(question, row)` with truncation only_second gives it: the question read once for
        all rows, the row's tokens cut to the room left. The truncating tokenizer also builds every overflowing
        window of the row (24 for a 30-word row at 28 tokens: 0.27 ms a pair, against 0.09 here). A row longer than
        the room can use is cut at a space first (its words before the cut tokenize the same), and read whole if
        the cut does not fill the room."""
        import solos_embed  # loaded already (Session's settings)

        room = self.max_len - len(question) - 3
        head = solos_embed.text_head(row, self.max_len)
        tokens = self.words.encode(head, add_special_tokens=False).ids if head is not None else []
        if head is None or len(tokens) < room:
            tokens = self.words.encode(row, add_special_tokens=False).ids
        first = len(question) + 2
        ids = [self.cls, *question, self.sep, *tokens[:room], self.sep]
        return Pair(ids, [0] * first + [1] * (len(ids) - first))

    def logits(self, question: str, rows: Sequence[str], options: Any = None) -> list[float]:
        """One logit per row: the pairs padded to the longest, in one run (with `options`: onnxruntime's
        RunOptions, whose `terminate` stops it)."""
        import numpy as np

        asked = self.question(question)
        ids, types, mask = padded([self.pair(asked, row) for row in rows])
        feeds = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
        out = self.session.run(None, feeds, options)[0]
        return [float(x) for x in np.asarray(out, dtype=np.float64).reshape(-1)]


class Watchdog:
    """The process's one thread that stops runs past their deadline. A run registers its onnxruntime RunOptions
    with its deadline (a heap, the earliest first) and withdraws it when it returns; at a deadline the thread sets
    that RunOptions' `terminate`, and onnxruntime fails the run before its next node (within ~10 ms of the flip on
    this model). Withdrawn under the same lock the flip takes, so a run that has returned is never flipped."""

    def __init__(self) -> None:
        self.due = threading.Condition()
        self.heap: list[list[Any]] = []  # [deadline, number, RunOptions or None once withdrawn]
        self.numbers = itertools.count()
        self.thread: threading.Thread | None = None

    def watch(self, options: Any, deadline: float) -> list[Any]:
        """Stop the run that uses `options` at `deadline` (time.monotonic()) unless it is withdrawn first."""
        entry = [deadline, next(self.numbers), options]
        with self.due:
            if self.thread is None:
                self.thread = threading.Thread(target=self.stop_overdue, name="cross-encoder-watchdog", daemon=True)
                self.thread.start()
            heapq.heappush(self.heap, entry)
            if self.heap[0] is entry:  # sooner than the thread's wait: wake it
                self.due.notify()
        return entry

    def withdraw(self, entry: list[Any]) -> None:
        """The run returned: never flip it. Its entry stays in the heap until the thread next wakes, so the thread
        keeps sleeping towards it and the next run's later deadline need not wake it: a wake a run, which then
        wants the GIL (the runner's time outside the session's: 0.45 ms a recall at load 7, 0.07 at load 2; 0.03
        this way at load 2, bench/recall_phases.py)."""
        with self.due:
            entry[2] = None

    def drop_withdrawn(self) -> None:
        while self.heap and self.heap[0][2] is None:
            heapq.heappop(self.heap)

    def stop_overdue(self) -> None:
        with self.due:
            while True:
                self.drop_withdrawn()
                wait = self.heap[0][0] - time.monotonic() if self.heap else None
                if wait is None or wait > 0:
                    self.due.wait(wait)
                    continue
                heapq.heappop(self.heap)[2].terminate = True


class Runner:
    """One model file's session, loaded once in a thread of its own at the first run (the first recalls wait for
    it up to their deadline); then each run is the request's own, in its thread, stopped by the watchdog at its
    deadline."""

    def __init__(self, path: Path, sha256: str, max_len: int) -> None:
        self.path, self.sha256, self.max_len = path, sha256, max_len
        self.session: Session | None = None
        self.failure: str | None = None  # why the model did not load: kept, so it is not re-read every recall
        self.loaded = threading.Event()
        self.loader: threading.Thread | None = None
        self.loader_lock = threading.Lock()
        self.outcomes: Counter[str] = Counter()  # runs by outcome: ran, timeout, failed, loading (waited for the load)
        self.recent: deque[str | None] = deque(maxlen=RECENT_RUNS)  # each loaded run's fault, None if it ran
        self.outcome_lock = threading.Lock()

    def record(self, outcome: str, fault: str | None = None) -> str | None:
        """Count a run's outcome (the model's load waited for is no fault of the model's); `fault` back."""
        with self.outcome_lock:
            self.outcomes[outcome] += 1
            if outcome != "loading":
                self.recent.append(fault)
        return fault

    def failing(self) -> str | None:
        """Why the model counts as failing (most of its recent runs fell back), or None."""
        with self.outcome_lock:
            faults = [fault for fault in self.recent if fault is not None]
            seen = len(self.recent)
        if len(faults) < FAILING_RUNS or 2 * len(faults) < seen:
            return None
        return f"{len(faults)} of its last {seen} runs fell back to the features judge; the last: {faults[-1]}"

    def load(self) -> None:
        """Read, check and load the model (in the loader thread); `session` or `failure` is set, then `loaded`."""
        try:
            raw, _, self.failure = read_pinned(self.path, self.sha256, "cross-encoder file")
            if raw is None:
                return
            import solos_embed  # its tokenizer, pinned there: a changed one changes every pair the model reads

            pinned = solos_embed.TOKENIZER_SHA256[TOKENIZER_PATH.name]
            self.failure = read_pinned(TOKENIZER_PATH, pinned, "cross-encoder tokenizer")[2]
            if self.failure is not None:
                return
            # A file onnxruntime reads itself, once its hash is checked (as solos_embed loads its built model):
            # from bytes it kept about 20 MiB more resident. Bytes only from inside the .pyz.
            model: bytes | str = str(self.path) if self.path.is_file() else raw
            del raw
            self.session = Session(model, self.max_len)
        except ImportError as error:
            self.failure = f"cross-encoder needs onnxruntime, tokenizers and numpy: {error}"
        except Exception as error:  # onnxruntime and tokenizers raise their own types
            # onnxruntime names the file by its full path: every recall's receipt carries this, to any agent.
            said = str(error).replace(str(self.path.parent) + os.sep, "…/")
            self.failure = f"cross-encoder failed to load: {type(error).__name__}: {said}"
        finally:
            self.loaded.set()

    def ready(self, timeout_s: float) -> bool:
        """Whether the load is done, waiting up to `timeout_s` for it; the first caller starts it, once."""
        if not self.loaded.is_set():
            with self.loader_lock:
                if self.loader is None:
                    self.loader = threading.Thread(target=self.load, name="cross-encoder-load", daemon=True)
                    self.loader.start()
        return self.loaded.wait(max(timeout_s, 0.0))

    def logits(self, question: str, rows: Sequence[str], timeout_s: float) -> tuple[list[float] | None, str | None]:
        """The rows' logits, or None and why not, within `timeout_s` (the model's load included). Never raises."""
        deadline = time.monotonic() + timeout_s
        if not self.ready(timeout_s):
            return None, self.record("loading", f"cross-encoder took over {timeout_s:g} s (loading the model)")
        session = self.session
        if session is None:
            return None, self.failure
        try:
            options = session.run_options()
        except Exception as error:
            return None, self.record("failed", f"cross-encoder failed: {type(error).__name__}: {error}")
        guard = watchdog()
        stop = guard.watch(options, deadline)
        try:
            logits = session.logits(question, rows, options)
        except Exception as error:
            if options.terminate:
                return None, self.record("timeout", f"cross-encoder took over {timeout_s:g} s (stopped)")
            return None, self.record("failed", f"cross-encoder failed: {type(error).__name__}: {error}")
        finally:
            guard.withdraw(stop)
        self.record("ran")
        return logits, None


_RUNNERS: dict[tuple[int, Path, str], Runner] = {}
_RUNNERS_LOCK = threading.Lock()


def runner(path: Path, sha256: str, max_len: int) -> Runner:
    """The process's one runner for this file and hash (by process id: a forked worker's inherited runner has
    no thread, and an onnxruntime session is not to be shared across a fork)."""
    key = (os.getpid(), path, sha256)
    with _RUNNERS_LOCK:
        if key not in _RUNNERS:
            _RUNNERS[key] = Runner(path, sha256, max_len)
        return _RUNNERS[key]


_WATCHDOGS: dict[int, Watchdog] = {}


def watchdog() -> Watchdog:
    """The process's watchdog (by process id: a forked worker's inherited one has no thread)."""
    pid = os.getpid()
    with _RUNNERS_LOCK:
        if pid not in _WATCHDOGS:
            _WATCHDOGS[pid] = Watchdog()
        return _WATCHDOGS[pid]


@dataclass
class CrossEncoder:
    """A loaded meta (the model itself loads at its first run), or why there is none."""

    meta: Meta | None = None
    meta_sha256: str = ""
    folder: Path = META_PATH.parent
    reason: str | None = None
    timeout_s: float = RUN_TIMEOUT_S
    turned_off: bool = False  # by SOLOS_MEMORY_JUDGE=features, not for a fault

    @property
    def name(self) -> str:
        return f"cross-encoder@{self.meta.sha256[:8]}" if self.meta else "cross-encoder"

    def state(self) -> tuple[str, str | None]:
        """`ready` (its model loaded), `not_loaded` (it loads at the first hybrid recall that needs it), `off`
        (turned off), `unavailable` (its meta refused, or its model failed to load) or `failing` (loaded, but most
        of its recent runs failed or overran: Runner.failing), and why. Loads nothing."""
        if self.meta is None:
            return "off" if self.turned_off else "unavailable", self.reason
        model = self.model_runner()
        if not model.loaded.is_set():
            return "not_loaded", None
        if model.session is None:
            return "unavailable", model.failure
        failing = model.failing()
        return ("failing", failing) if failing else ("ready", None)

    def runs(self) -> dict[str, int]:
        """This process's model runs by outcome (ran, timeout, failed, loading); empty without a meta."""
        if self.meta is None:
            return {}
        model = self.model_runner()
        with model.outcome_lock:
            return {outcome: model.outcomes[outcome] for outcome in ("ran", "timeout", "failed", "loading")}

    def model_runner(self) -> Runner:
        assert self.meta is not None
        return runner(self.folder / self.meta.model, self.meta.sha256, self.meta.max_len)

    def combine(
        self,
        question: str,
        rows: Sequence[Mapping],
        features: Sequence[float],
        evidence: Sequence[Mapping[str, float]] | None = None,
    ) -> tuple[list[float], str | None]:
        """The first `rows` rows' probability from the combination, the others' the features judge's; or the
        features judge's alone and why. `evidence`: the features judge's features per row, which a meta with
        evidence reads. Never raises."""
        if self.meta is None:
            return list(features), self.reason
        meta = self.meta
        head = [pair_text(row) for row in rows[: meta.rows]]
        if not head:
            return list(features), None
        model = self.model_runner()
        best = meta.sure(features)
        if best is not None:
            # The model's load starts anyway (not waited for): the next recall that needs it does not wait for
            # it, and a model that cannot load is named here too, once its load has failed.
            model.ready(0.0)
            failed = model.loaded.is_set() and model.session is None
            return list(features), (
                f"cross-encoder skipped: the features judge's best of the first {len(head)} rows is {best:.3f}, "
                f"outside {meta.skip_below:g}-{meta.skip_above:g}"
                + (f"; it cannot run: {model.failure}" if failed else "")
            )
        if meta.evidence and (evidence is None or len(evidence) < len(head)):
            return list(features), "the cross-encoder's combination reads evidence the features judge did not give"
        logits, reason = model.logits(question, head, self.timeout_s)
        if logits is None or len(logits) != len(head):
            return list(features), reason or f"cross-encoder gave {len(logits or ())} logits for {len(head)} rows"
        try:
            head_probabilities = [
                combined(meta.beta, x, p, evidence[i] if evidence else None)
                for i, (x, p) in enumerate(zip(logits, features))
            ]
        except KeyError as error:
            return list(features), f"the cross-encoder's combination reads {error}, which the features judge lacks"
        return head_probabilities + list(features[len(head) :]), None


def load(
    path: Path | str = META_PATH, sha256: str | None = META_SHA256, model_sha256: str = MODEL_SHA256
) -> CrossEncoder:
    """The cross-encoder whose meta is `path` (checked against `sha256`; None: not checked), naming a model whose
    sha256 must be `model_sha256`. Reads no model and imports no package; never raises."""
    path = Path(path)
    raw, digest, reason = read_pinned(path, sha256, "cross-encoder meta")
    if raw is None:
        return CrossEncoder(reason=reason)
    try:
        meta = Meta.parse(raw)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        return CrossEncoder(reason=f"cross-encoder meta {path.name} malformed: {error}")
    if meta.sha256 != model_sha256:
        return CrossEncoder(
            reason=f"cross-encoder meta names model sha256 {meta.sha256[:12]}…, not {model_sha256[:12]}…"
        )
    return CrossEncoder(meta, digest, path.parent)
