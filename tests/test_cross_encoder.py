"""The cross-encoder (solos_cross_encoder.py): its two files are checked by their pinned hashes, a missing,
changed or failing model leaves the features judge with the reason (never a 500), it loads once per process,
and in hybrid recall the receipt names it."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import json
import shutil
import threading
import time
from pathlib import Path

import pytest
from conftest import WordHashEmbedder, metric_samples

import solos_cross_encoder
import solos_embed
import solos_judge
import solos_rank

SHIPPED = solos_cross_encoder.load()
QUESTION = "What port does payments-api listen on?"
ANSWER = {"agent": "atlas", "topic": "payments-api", "text": "payments-api serves on port 8443; TLS ends on the pod."}
NEAR = {"agent": "atlas", "topic": "search-api", "text": "search-api listens on 8088 behind haproxy."}
# A row that lacks the service asked about but names no rival one: the features judge is unsure of it (NEAR's
# rival service name makes it sure), so the cascade runs the model.
OTHER = {"agent": "atlas", "topic": "", "text": "The gateway listens on 8088 behind haproxy."}
# Rows the features judge is unsure of (its best probability inside the cascade's band), so the model must run.
UNSURE = [dict(ANSWER, relevance=0.02, cosine=0.5), dict(NEAR, relevance=0.02, cosine=0.5)]


def read(question: str, rows: list[dict]) -> list[dict[str, float]]:
    """The features judge's features of the rows: the evidence the combination reads."""
    return solos_judge.features(question, rows, "hybrid")


def needs_runtime() -> None:
    for module in ("numpy", "onnxruntime", "tokenizers"):
        pytest.importorskip(module)


def copied(tmp_path: Path, model: bytes | None) -> Path:
    """The shipped meta in tmp_path, beside `model` as the model file it names (None: no model file)."""
    meta = tmp_path / solos_cross_encoder.META_PATH.name
    shutil.copyfile(solos_cross_encoder.META_PATH, meta)
    if model is not None:
        (tmp_path / SHIPPED.meta.model).write_bytes(model)
    return meta


def test_the_shipped_files_are_the_pinned_ones():
    assert SHIPPED.reason is None, SHIPPED.reason
    assert SHIPPED.meta_sha256 == solos_cross_encoder.META_SHA256
    model = solos_cross_encoder.META_PATH.parent / SHIPPED.meta.model
    assert hashlib.sha256(model.read_bytes()).hexdigest() == solos_cross_encoder.MODEL_SHA256 == SHIPPED.meta.sha256


def test_one_floor_everywhere():
    """The combination was set to the floor the features judge, the turn helpers and the API's text use."""
    import solos_client

    assert SHIPPED.meta.floor == solos_rank.RELEVANCE_FLOOR == solos_client.TURN_MIN_RELEVANCE


def test_the_combination_was_fitted_with_the_shipped_features_judge():
    """Its weights read the features judge's logit: after bench/judge_fit.py refits judge.json, run
    bench/cross_encoder_swap.py again."""
    combination = json.loads(solos_cross_encoder.META_PATH.read_bytes())["combination"]
    assert combination["features_judge"] == solos_judge.JUDGE_SHA256


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda raw: None, "unreadable"),
        (lambda raw: raw.replace(b'"rows"', b' "rows"', 1), "sha256"),
    ],
)
def test_a_missing_or_changed_meta_leaves_the_features_judge_with_its_reason(tmp_path, change, expected):
    meta = tmp_path / "cross-encoder.json"
    changed = change(solos_cross_encoder.META_PATH.read_bytes())
    if changed is not None:
        meta.write_bytes(changed)
    judge = solos_judge.load(cross=meta)
    assert expected in judge.cross.reason
    features = solos_judge.load(cross=None).judge(QUESTION, [ANSWER, NEAR], "hybrid")
    verdict = judge.judge(QUESTION, [ANSWER, NEAR], "hybrid")
    assert (verdict.name, verdict.probabilities) == (features.name, features.probabilities)
    assert expected in verdict.reason


@pytest.mark.parametrize("model", [None, b"not a model", b"\x08\x07"], ids=["missing", "corrupt", "short"])
def test_a_missing_or_corrupt_model_is_never_loaded(tmp_path, model):
    """Refused by its hash before onnxruntime sees a byte: the features judge's probabilities, and why."""
    judge = solos_judge.load(cross=copied(tmp_path, model))
    assert judge.cross.reason is None  # the meta is the shipped one; the model is read at its first run
    features = solos_judge.load(cross=None).judge(QUESTION, UNSURE, "hybrid").probabilities
    assert judge.cross.meta.sure(features) is None  # rows the model must read
    verdict = judge.judge(QUESTION, UNSURE, "hybrid")
    assert verdict.name.startswith("features-hybrid@")
    assert verdict.probabilities == features
    assert ("unreadable" if model is None else "sha256") in verdict.reason
    again = judge.judge(QUESTION, UNSURE[:1], "hybrid")  # the failure is kept, not re-read every recall
    assert again.reason == verdict.reason


def test_a_model_that_fails_to_load_is_named_without_its_folder(tmp_path, monkeypatch):
    """onnxruntime names the model's full path when it cannot load it; every recall's receipt carries the reason
    to whichever agent asked, and /health to anyone: machine paths stay out of both (as the embedder's do)."""
    folder = tmp_path / "deep" / "models"
    folder.mkdir(parents=True)
    model = solos_cross_encoder.META_PATH.parent / SHIPPED.meta.model
    judge = solos_judge.load(cross=copied(folder, model.read_bytes()))

    def failing(path, max_len):
        raise RuntimeError(f"Load model from {path} failed: protobuf parsing failed")

    monkeypatch.setattr(solos_cross_encoder, "Session", failing)
    verdict = judge.judge(QUESTION, UNSURE, "hybrid")
    assert "Load model from …/" in verdict.reason and str(tmp_path) not in verdict.reason, verdict.reason


def test_keyword_recall_keeps_the_features_judge_and_says_nothing_of_the_cross_encoder(tmp_path):
    judge = solos_judge.load(cross=copied(tmp_path, None))
    verdict = judge.judge(QUESTION, [ANSWER, NEAR], "keyword")
    assert verdict.name.startswith("features-keyword@") and verdict.reason is None


def test_the_switch_keeps_only_the_features(monkeypatch):
    monkeypatch.setenv(solos_judge.OFF_VARIABLE, "features")
    verdict = solos_judge.load().judge(QUESTION, [ANSWER, NEAR], "hybrid")
    assert verdict.name.startswith("features-hybrid@") and "features" in verdict.reason


def test_the_cross_encoder_tells_the_answer_from_a_near_miss():
    needs_runtime()
    judge = solos_judge.load()
    rows = [dict(NEAR, relevance=0.1, cosine=0.6), dict(ANSWER, relevance=0.1, cosine=0.6)]  # inside the band
    verdict = judge.judge(QUESTION, rows, "hybrid")
    assert verdict.reason is None, verdict.reason
    assert verdict.name == f"cross-encoder@{solos_cross_encoder.MODEL_SHA256[:8]}+{judge.name('hybrid')}"
    features = solos_judge.load(cross=None).judge(QUESTION, rows, "hybrid").probabilities
    assert verdict.probabilities != features  # the combination, not the features judge's alone
    assert verdict.probabilities[1] > verdict.probabilities[0]
    assert all(0.0 <= p <= 1.0 for p in verdict.probabilities)


def test_the_model_runs_only_when_the_features_judge_is_unsure(tmp_path):
    """The cascade: outside the meta's band (the features judge's best head probability clearly under the floor,
    or clearly an answer) the features judge's probabilities stand, the model is not read (here it is missing),
    and the reason says so; inside it the model runs (here: fails, and says why)."""
    meta = SHIPPED.meta
    assert 0.0 < meta.skip_below < meta.floor < meta.skip_above < 1.0  # a band around the floor
    judge = solos_judge.load(cross=copied(tmp_path, None))
    # another service's port twice, no relevance, no cosine: the features judge is sure nothing answers
    rows = [NEAR, dict(NEAR, topic="notify-api", text="notify-api listens on 8710 behind haproxy.")]
    features = solos_judge.load(cross=None).judge(QUESTION, rows, "hybrid").probabilities
    assert max(features) < meta.skip_below
    for head, expected in (
        (features, f"is {max(features):.3f},"),
        ([0.2, meta.skip_above + 0.01], f"is {meta.skip_above + 0.01:.3f},"),
    ):
        probabilities, reason = judge.cross.combine(QUESTION, rows, head, read(QUESTION, rows))
        assert probabilities == head
        assert reason.startswith("cross-encoder skipped: the features judge's best of the first 2 rows is ")
        assert expected in reason
    probabilities, reason = judge.cross.combine(
        QUESTION, rows, [0.2, meta.skip_above], read(QUESTION, rows)
    )  # the band is closed
    assert reason.startswith("cross-encoder file unreadable")
    probabilities, reason = judge.cross.combine(
        QUESTION, rows, features, read(QUESTION, rows)
    )  # skipped, and the failure named
    assert probabilities == features and reason.startswith("cross-encoder skipped: ")
    assert "it cannot run: cross-encoder file unreadable" in reason
    assert meta.sure([0.2] * meta.rows + [0.99]) is None  # rows past the ones the model reads never gate


@pytest.mark.parametrize("band", [{"skip_below": 0.5, "skip_above": 0.1}, {"skip_below": -0.1, "skip_above": 0.7}])
def test_a_cascade_band_out_of_order_or_range_is_refused(tmp_path, band):
    doc = json.loads(solos_cross_encoder.META_PATH.read_bytes())
    doc["cascade"] = dict(doc["cascade"], **band)
    meta = tmp_path / "cross-encoder.json"
    meta.write_text(json.dumps(doc))
    encoder = solos_cross_encoder.load(meta, sha256=None)
    assert encoder.meta is None and "cascade band" in encoder.reason


def test_the_combination_reads_a_rival_as_evidence_against_a_sure_model():
    """The shipped combination reads the features judge's conflict features beside the two logits: a row holding
    a rival of the question's specific (search-api's port for payments-api's) weighs the model's belief that it
    answers less; the model's doubt, and a row with no rival, are read as before."""
    meta = SHIPPED.meta
    assert "conflict*yes" in meta.evidence
    rival, none = read(QUESTION, [NEAR])[0], read(QUESTION, [ANSWER])[0]
    assert rival["conflict_name"] == 1.0 and not any(v for k, v in none.items() if k.startswith("conflict_"))
    plain = meta.a * 3.0 + meta.b * solos_cross_encoder.logit(0.2) + meta.c
    assert solos_cross_encoder.combined(meta.beta, 3.0, 0.2, none) == pytest.approx(solos_rank.logistic(plain))
    assert solos_cross_encoder.combined(meta.beta, 3.0, 0.2, rival) < solos_cross_encoder.combined(
        meta.beta, 3.0, 0.2, none
    )
    assert solos_cross_encoder.combined(meta.beta, -3.0, 0.2, rival) == pytest.approx(
        solos_cross_encoder.combined(meta.beta, -3.0, 0.2, none)
    )


def test_a_combination_without_its_evidence_leaves_the_features_judge_and_why(tmp_path):
    """A caller that gives no features, or features that lack what the meta reads, gets the features judge's
    probabilities and the reason; the model is not run for nothing (here it is missing: no load failure named)."""
    judge = solos_judge.load(cross=copied(tmp_path, None))
    features = solos_judge.load(cross=None).judge(QUESTION, UNSURE, "hybrid").probabilities
    assert judge.cross.meta.sure(features) is None
    probabilities, reason = judge.cross.combine(QUESTION, UNSURE, features)
    assert probabilities == features and reason.startswith("the cross-encoder's combination reads evidence")
    needs_runtime()
    lacking = [{k: v for k, v in f.items() if not k.startswith("conflict_")} for f in read(QUESTION, UNSURE)]
    probabilities, reason = SHIPPED.combine(QUESTION, UNSURE, features, lacking)
    assert probabilities == features and "conflict_*" in reason and "lacks" in reason


def test_an_old_meta_combines_without_evidence_and_an_unknown_one_is_refused(tmp_path):
    """A format-1 meta (no evidence) still reads as the two logits' combination; evidence this code does not
    know, or a weight short, leaves the features judge with the reason."""
    doc = json.loads(solos_cross_encoder.META_PATH.read_bytes())
    old = dict(doc, format=1, combination={k: v for k, v in doc["combination"].items() if k != "evidence"})
    path = tmp_path / "cross-encoder.json"
    path.write_text(json.dumps(old))
    encoder = solos_cross_encoder.load(path, sha256=None)
    assert encoder.reason is None and encoder.meta.evidence == () and len(encoder.meta.beta) == 3
    assert encoder.combine(QUESTION, [], [])[1] is None
    for evidence, expected in (
        ({"names": ["cosine"], "weights": [1.0]}, "cosine"),
        ({"names": ["conflict*yes", "kind_missing"], "weights": [1.0]}, "one weight each"),
        ({"names": ["conflict*yes"], "weights": [float("nan")]}, "not finite"),
    ):
        path.write_text(json.dumps(dict(doc, combination=dict(doc["combination"], evidence=evidence))))
        encoder = solos_cross_encoder.load(path, sha256=None)
        assert encoder.meta is None and expected in encoder.reason and "malformed" in encoder.reason
    path.write_text(json.dumps(dict(doc, format=3)))
    assert "format 3" in solos_cross_encoder.load(path, sha256=None).reason


def test_it_reads_only_the_first_rows_and_any_question():
    needs_runtime()
    rows = [dict(OTHER, text=f"{OTHER['text']} {n}", relevance=0.3) for n in range(SHIPPED.meta.rows + 3)]
    features = solos_judge.load(cross=None).judge(QUESTION, rows, "hybrid").probabilities
    probabilities, reason = SHIPPED.combine(QUESTION, rows, features, read(QUESTION, rows))
    assert reason is None
    assert probabilities[SHIPPED.meta.rows :] == features[SHIPPED.meta.rows :]
    assert probabilities[: SHIPPED.meta.rows] != features[: SHIPPED.meta.rows]
    for question in ("", "port " * 2000, "?"):  # a question longer than the model's room is cut, not refused
        probabilities, reason = SHIPPED.combine(question, rows[:2], features[:2], read(question, rows[:2]))
        assert reason is None and len(probabilities) == 2


def test_a_pair_is_assembled_as_the_training_tokenizer_encodes_it():
    """The question read once, each row alone and cut to the room (at a space first when long): the same ids and
    token types as one `encode(question, row)` of the tokenizer the model was trained with (truncation
    only_second, the question cut to half the room first)."""
    needs_runtime()
    from tokenizers import Tokenizer

    for max_len in (20, SHIPPED.meta.max_len):
        session = solos_cross_encoder.Session(str(solos_cross_encoder.META_PATH.parent / SHIPPED.meta.model), max_len)
        reference, plain = (Tokenizer.from_file(str(solos_cross_encoder.TOKENIZER_PATH)) for _ in range(2))
        reference.no_padding()
        reference.enable_truncation(max_len, strategy="only_second")
        plain.no_padding()
        plain.no_truncation()
        room, text = max_len * solos_embed.CHARS_PER_TOKEN, solos_cross_encoder.pair_text(ANSWER)
        rows = [
            text,
            "",
            "port",
            text + " more words" * 100,  # cut at a space, the room full before the cut
            "x" * (room - 3) + " tail" + " end" * 50,  # one long word: cut, but the cut row fits, so read whole
            "8443" * 200,  # no space to cut at
            "port " + "漢字é " * 200,
            "a " * (room // 2 - 1) + "abcdefghijklmnopqrstuvw " * 10,  # the cut ends inside words of many tokens
        ]
        questions = [QUESTION, "", "?", "port " * 2000, "INC-2207's commander, and who paged them at 03:14?" * 3]
        for question in questions:
            asked = session.question(question)
            offsets = plain.encode(question, add_special_tokens=False).offsets  # over half the room: cut after it
            kept = question if len(offsets) <= max_len // 2 else question[: offsets[max_len // 2 - 1][1]]
            for row in rows:
                expected = reference.encode(kept, row)
                pair = session.pair(asked, row)
                assert (pair.ids, pair.type_ids) == (expected.ids, expected.type_ids), (max_len, question, row)


def test_the_model_loads_once_per_process(tmp_path):
    needs_runtime()
    meta = copied(tmp_path, (solos_cross_encoder.META_PATH.parent / SHIPPED.meta.model).read_bytes())
    first, second = solos_cross_encoder.load(meta), solos_cross_encoder.load(meta)
    assert first.combine(QUESTION, [ANSWER], [0.5], read(QUESTION, [ANSWER]))[1] is None
    assert second.combine(QUESTION, [ANSWER], [0.5], read(QUESTION, [ANSWER]))[1] is None
    runner = solos_cross_encoder.runner(meta.parent / SHIPPED.meta.model, SHIPPED.meta.sha256, SHIPPED.meta.max_len)
    session = runner.session
    assert session is not None
    assert first.combine(QUESTION, [NEAR], [0.5], read(QUESTION, [NEAR]))[1] is None and runner.session is session


def test_a_forked_process_loads_its_own(monkeypatch):
    """A worker forked from a process that ran the model gets a runner (thread, session) of its own."""
    args = (solos_cross_encoder.META_PATH.parent / SHIPPED.meta.model, SHIPPED.meta.sha256, SHIPPED.meta.max_len)
    parent = solos_cross_encoder.runner(*args)
    assert solos_cross_encoder.runner(*args) is parent
    monkeypatch.setattr(solos_cross_encoder.os, "getpid", lambda: -1)
    child = solos_cross_encoder.runner(*args)
    assert child is not parent and child.session is None


def test_a_recall_that_comes_while_the_model_loads_waits_for_it_at_most_its_time(tmp_path):
    needs_runtime()
    meta = copied(tmp_path, (solos_cross_encoder.META_PATH.parent / SHIPPED.meta.model).read_bytes())
    slow = solos_cross_encoder.load(meta)
    slow.timeout_s = 0.0  # the first run loads the model too: it cannot be done at once
    probabilities, reason = slow.combine(QUESTION, [ANSWER, NEAR], [0.4, 0.3], read(QUESTION, [ANSWER, NEAR]))
    assert probabilities == [0.4, 0.3] and "took over 0 s (loading the model)" in reason
    slow.timeout_s = 60.0
    assert (
        slow.combine(QUESTION, [ANSWER], [0.4], read(QUESTION, [ANSWER]))[1] is None
    )  # the load it started is the one the next run uses


def test_concurrent_first_recalls_load_the_model_once_and_all_get_the_cross_encoder(tmp_path, monkeypatch):
    needs_runtime()
    loads = []

    class Counted(solos_cross_encoder.Session):
        def __init__(self, *args, **kwargs):
            loads.append(threading.current_thread().name)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(solos_cross_encoder, "Session", Counted)
    meta = copied(tmp_path, (solos_cross_encoder.META_PATH.parent / SHIPPED.meta.model).read_bytes())
    encoders = [solos_cross_encoder.load(meta) for _ in range(8)]
    for encoder in encoders:
        encoder.timeout_s = 60.0
    start = threading.Barrier(len(encoders))

    def recall(encoder):
        start.wait()
        return encoder.combine(QUESTION, [ANSWER, NEAR], [0.4, 0.3], read(QUESTION, [ANSWER, NEAR]))

    with concurrent.futures.ThreadPoolExecutor(len(encoders)) as pool:
        answers = list(pool.map(recall, encoders))
    assert [reason for _, reason in answers] == [None] * len(encoders)
    assert len({tuple(p) for p, _ in answers}) == 1 and answers[0][0] != [0.4, 0.3]
    assert loads == ["cross-encoder-load"]


def test_a_run_past_its_deadline_is_stopped_and_leaves_the_features_judge():
    """A real onnxruntime run far longer than its deadline (512 rows, seconds of CPU): the watchdog sets its
    RunOptions' terminate, onnxruntime fails it, and the features judge's probabilities stand, with the reason."""
    needs_runtime()
    assert (
        SHIPPED.combine(QUESTION, [ANSWER], [0.4], read(QUESTION, [ANSWER]))[1] is None
    )  # loaded: this run's time is the run's alone
    many = dataclasses.replace(SHIPPED, meta=dataclasses.replace(SHIPPED.meta, rows=512), timeout_s=0.05)
    rows = [dict(NEAR, text=f"{NEAR['text']} {n} " + "words " * 30) for n in range(512)]
    features = [0.3] * len(rows)
    probabilities, reason = many.combine(QUESTION, rows, features, read(QUESTION, rows))
    assert reason == "cross-encoder took over 0.05 s (stopped)"
    assert probabilities == features
    assert (
        SHIPPED.combine(QUESTION, [ANSWER], [0.4], read(QUESTION, [ANSWER]))[1] is None
    )  # nothing is left stuck: the next run runs


def test_the_watchdog_stops_only_what_is_overdue_and_never_what_was_withdrawn():
    from types import SimpleNamespace

    watchdog = solos_cross_encoder.Watchdog()
    later, sooner, returned = (SimpleNamespace(terminate=False) for _ in range(3))
    now = time.monotonic()
    late = watchdog.watch(later, now + 30)
    watchdog.watch(sooner, now + 0.05)  # sooner than the thread's wait: it is woken for it
    done = watchdog.watch(returned, now + 0.05)
    watchdog.withdraw(done)
    deadline = time.monotonic() + 10
    while not sooner.terminate:
        assert time.monotonic() < deadline, "the overdue run was not stopped"
        time.sleep(0.01)
    watchdog.withdraw(late)
    time.sleep(0.1)
    assert (later.terminate, returned.terminate) == (False, False)
    assert all(entry[2] is None for entry in watchdog.heap)  # withdrawn, dropped when the thread next wakes


# ==== Through the service ====


LOAD = solos_judge.load
DEFAULT = solos_cross_encoder.META_PATH


def served_with(embedded_server, monkeypatch, meta: Path | None = DEFAULT, name: str = "hybrid.db"):
    """A hybrid service whose judge reads the cross-encoder meta `meta` (None: the features judge alone)."""
    monkeypatch.setattr(solos_judge, "load", functools.partial(LOAD, cross=meta))  # Memory loads it at start
    server = embedded_server(WordHashEmbedder(), name)
    for fact in (ANSWER, NEAR):
        reply = server.post("/v1/long", {"agent": fact["agent"], "topic": fact["topic"], "fact": fact["text"]})
        assert reply.status == 201, reply.body
    return server


def hybrid_recall(server) -> dict:
    deadline = time.monotonic() + 10
    while (reply := server.recall("sol", QUESTION, tiers="long", k=5)).body.get("ranking") != "hybrid":
        assert time.monotonic() < deadline, reply.body
        time.sleep(0.05)
    assert reply.status == 200, reply.body
    return reply.body


def test_hybrid_recall_names_the_cross_encoder(embedded_server, monkeypatch):
    needs_runtime()
    body = hybrid_recall(served_with(embedded_server, monkeypatch))
    receipt = body["receipt"]
    assert receipt["judge"].startswith(f"cross-encoder@{solos_cross_encoder.MODEL_SHA256[:8]}+features-hybrid@")
    assert receipt["judge_reason"] is None and body["degraded"] is False
    relevance = {r["text"]: r["relevance"] for r in body["results"]}
    assert all(0.0 <= p <= 1.0 for p in relevance.values())
    assert relevance[ANSWER["text"]] > relevance[NEAR["text"]]


@pytest.mark.parametrize("model", [None, b"corrupt"], ids=["missing", "corrupt"])
def test_hybrid_recall_without_its_model_answers_with_the_features_judge_and_why(
    embedded_server, monkeypatch, tmp_path, model
):
    server = served_with(embedded_server, monkeypatch, copied(tmp_path, model))
    body = hybrid_recall(server)
    receipt = body["receipt"]
    assert receipt["judge"].startswith("features-hybrid@")
    assert ("unreadable" if model is None else "sha256") in receipt["judge_reason"]
    for surface in (server.get("/health"), server.get("/v1/stats")):  # the operator is told too, not only receipts
        judge = surface.body["judge"]
        assert (judge["state"], judge["cross_encoder"]) == ("ready", "unavailable"), judge
        assert judge["cross_encoder_reason"] in receipt["judge_reason"]
    assert metric_samples(server, "solos_memory_cross_encoder_unavailable") == {"": 1.0}
    assert len(body["results"]) == 2 and all(0.0 < r["relevance"] <= 1.0 for r in body["results"])
    features = hybrid_recall(served_with(embedded_server, monkeypatch, None, "features.db"))  # the same, no model
    assert (features["receipt"]["judge"], features["receipt"]["judge_reason"]) == (receipt["judge"], None)
    assert [(r["text"], r["relevance"]) for r in body["results"]] == [
        (r["text"], r["relevance"]) for r in features["results"]
    ]


def test_a_model_whose_runs_keep_failing_is_told_to_the_operator(embedded_server, monkeypatch, tmp_path):
    """Each recall's receipt says its run fell back; when most recent runs do, /health, /metrics and the status
    page say `failing` too (a host where every run overruns would otherwise look `ready`), and a run that
    works again clears it."""
    needs_runtime()
    model_path = solos_cross_encoder.META_PATH.parent / SHIPPED.meta.model
    server = served_with(embedded_server, monkeypatch, copied(tmp_path, model_path.read_bytes()))
    assert hybrid_recall(server)["receipt"]["judge_reason"] is None  # loaded, one run that ran
    model = solos_cross_encoder.runner(tmp_path / SHIPPED.meta.model, SHIPPED.meta.sha256, SHIPPED.meta.max_len)
    working = model.session.logits

    def broken(*args):
        raise RuntimeError("bad allocation")

    monkeypatch.setattr(model.session, "logits", broken)
    for _ in range(solos_cross_encoder.FAILING_RUNS):
        assert server.get("/health").body["judge"]["cross_encoder"] == "ready"  # not yet most of its runs
        receipt = hybrid_recall(server)["receipt"]
        assert receipt["judge"].startswith("features-hybrid@")
        assert receipt["judge_reason"] == "cross-encoder failed: RuntimeError: bad allocation"
    judge = server.get("/health").body["judge"]
    assert judge["cross_encoder"] == "failing", judge
    assert judge["cross_encoder_reason"].startswith("3 of its last 4 runs fell back to the features judge")
    assert judge["cross_encoder_runs"] == {"ran": 1, "timeout": 0, "failed": 3, "loading": 0}
    assert metric_samples(server, "solos_memory_cross_encoder_failing") == {"": 1.0}
    assert metric_samples(server, "solos_memory_cross_encoder_runs_total")['{outcome="failed"}'] == 3.0
    assert "cross-encoder failing: 3 of its last 4 runs" in server.get("/status").raw.decode()
    monkeypatch.setattr(model.session, "logits", working)
    for _ in range(2):
        assert hybrid_recall(server)["receipt"]["judge_reason"] is None
    assert server.get("/health").body["judge"]["cross_encoder"] == "failing"  # 3 of 6: still half
    hybrid_recall(server)
    assert server.get("/health").body["judge"]["cross_encoder"] == "ready"  # 3 of 7
    assert metric_samples(server, "solos_memory_cross_encoder_failing") == {"": 0.0}


def test_health_shows_a_load_failure_without_machine_paths(embedded_server, monkeypatch, tmp_path):
    """onnxruntime names the model's full path when it cannot load it; /health answers anyone who can reach it."""
    meta = copied(tmp_path, b"corrupt")
    server = served_with(embedded_server, monkeypatch, meta)
    model = solos_cross_encoder.runner(tmp_path / SHIPPED.meta.model, SHIPPED.meta.sha256, SHIPPED.meta.max_len)
    model.failure = f"cross-encoder failed to load: RuntimeError: Load model from {tmp_path}/model.onnx failed"
    model.loaded.set()
    shown = server.get("/health").body["judge"]["cross_encoder_reason"]
    assert shown.endswith("Load model from …/model.onnx failed") and str(tmp_path) not in shown, shown
    operator = server.get("/v1/stats").body["judge"]["cross_encoder_reason"]  # the operator's view keeps paths
    assert str(tmp_path) in operator and str(tmp_path) not in server.get("/v1/stats", agent="sol").raw.decode()


def test_concurrent_hybrid_recalls_all_get_the_cross_encoder(embedded_server, monkeypatch):
    """Each run is its recall's own, in the request's thread: eight at once share the session, none degrades."""
    needs_runtime()
    server = served_with(embedded_server, monkeypatch)
    first = hybrid_recall(server)  # the model loaded (its first recall may wait for the load)
    start = threading.Barrier(8)

    def recall(_):
        start.wait()
        return server.recall("sol", QUESTION, tiers="long", k=5)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(recall, range(8)))
    assert [r.status for r in replies] == [200] * 8
    assert {(r.body["receipt"]["judge"], r.body["receipt"]["judge_reason"]) for r in replies} == {
        (first["receipt"]["judge"], None)
    }
    assert first["receipt"]["judge"].startswith("cross-encoder@")
    assert all(r.body["results"] == first["results"] for r in replies)


def test_a_stopped_run_is_still_a_200_with_the_features_judge_and_why(embedded_server, monkeypatch):
    """A run past its deadline through the service (the judge's 20 rows, a 1 ms deadline): stopped, and the
    recall answers with the features judge's relevance and `judge_reason`, as without the model."""
    needs_runtime()

    def hurried(*args, **kwargs):
        judge = LOAD(*args, **kwargs)
        judge.cross = dataclasses.replace(
            judge.cross, meta=dataclasses.replace(judge.cross.meta, rows=20), timeout_s=0.001
        )
        return judge

    assert (
        SHIPPED.combine(QUESTION, [ANSWER], [0.4], read(QUESTION, [ANSWER]))[1] is None
    )  # loaded: the deadline is the run's alone
    monkeypatch.setattr(solos_judge, "load", hurried)
    server = embedded_server(WordHashEmbedder(), "hurried.db")
    for n in range(20):
        text = f"{OTHER['text']} Replica {n} of the gateway keeps its port, " + "with more words " * 6
        assert server.post("/v1/long", {"agent": "atlas", "topic": f"search-{n}", "fact": text}).status == 201
    deadline = time.monotonic() + 10
    while (reply := server.recall("sol", QUESTION, tiers="long", k=20)).body.get("ranking") != "hybrid":
        assert time.monotonic() < deadline, reply.body
        time.sleep(0.05)
    assert reply.status == 200 and len(reply.body["results"]) == 20
    receipt = reply.body["receipt"]
    assert receipt["judge"].startswith("features-hybrid@")
    assert receipt["judge_reason"] == "cross-encoder took over 0.001 s (stopped)"
    assert all(0.0 < r["relevance"] <= 1.0 for r in reply.body["results"])


def test_a_changed_tokenizer_is_never_loaded(tmp_path, monkeypatch):
    """The cross-encoder's model and meta are sha-pinned, its tokenizer was not: a changed tokenizer.json changed
    every pair the model read. It is refused as a changed model is: the features judge's probabilities, and why."""
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_bytes(b" " + solos_cross_encoder.TOKENIZER_PATH.read_bytes())
    monkeypatch.setattr(solos_cross_encoder, "TOKENIZER_PATH", tokenizer)
    model = solos_cross_encoder.META_PATH.parent / SHIPPED.meta.model
    judge = solos_judge.load(cross=copied(tmp_path, model.read_bytes()))
    verdict = judge.judge(QUESTION, UNSURE, "hybrid")
    assert verdict.name.startswith("features-hybrid@")
    assert "tokenizer tokenizer.json sha256" in verdict.reason and "is not the expected" in verdict.reason, verdict
