"""The fleet's `calibrate` split (bench/data/fleet): questions and facts that only choose and calibrate the judge's
combination. They enter no fit (neither the features judge's nor the cross-encoder's training) and no scored set,
by construction: each tool that fits or scores reads the split, and a calibrate fact never reaches a fitted or
scored question's candidates. These run without torch and without a service.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import cross_encoder
import judge_conflicts
import judge_data
import judge_eval
import judge_fit

# A small fleet: one trained cluster, one calibration cluster of the fit half, one scored cluster, and one cluster
# of the calibrate split whose candidates (recalled from every fact) mix every role.
ITEMS = {
    **{f"f{i}": {"split": "fit", "domain_topic": "payments"} for i in (1, 2)},
    **{f"f{i}": {"split": "fit", "domain_topic": "mobile"} for i in (3, 4)},
    **{f"f{i}": {"split": "score", "domain_topic": "search"} for i in (5, 6)},
    **{f"f{i}": {"split": "calibrate", "domain_topic": "kiosk"} for i in (7, 8, 9)},
    "q1": {"split": "fit", "domain_topic": "payments", "answers": ["f1"]},
    "q2": {"split": "fit", "domain_topic": "mobile", "answers": ["f3"]},
    "q3": {"split": "score", "domain_topic": "search", "answers": ["f5"]},
    "q4": {"split": "calibrate", "domain_topic": "kiosk", "answers": ["f7"]},
    "q5": {"split": "calibrate", "domain_topic": "kiosk", "answers": []},
}


@pytest.fixture(autouse=True)
def small_fleet(monkeypatch):
    monkeypatch.setattr(cross_encoder, "fleet_items", lambda: ITEMS)
    monkeypatch.setattr(judge_conflicts, "clusters", lambda: {q: x["domain_topic"] for q, x in ITEMS.items()})


def row(row_id: str, label: int) -> dict:
    return {"row_id": row_id, "label": label, "agent": "atlas", "topic": "", "text": f"text of {row_id}"}


def record(qid: str, rows: list[dict], mode: str = "hybrid") -> dict:
    return {
        "mode": mode,
        "domain": "fleet",
        "group": ITEMS[qid]["split"],
        "qid": qid,
        "question": f"question {qid}?",
        "kind": "keyword" if ITEMS[qid]["answers"] else "unanswerable",
        "answerable": bool(ITEMS[qid]["answers"]),
        "n_answers": len(ITEMS[qid]["answers"]),
        "rows": rows,
    }


def records(mode: str = "hybrid") -> list[dict]:
    every = ["f2", "f4", "f6", "f8", "f9"]
    out = []
    for qid in ("q1", "q2", "q3", "q4", "q5"):
        answers = ITEMS[qid]["answers"]
        out.append(record(qid, [row(a, 1) for a in answers] + [row(f, 0) for f in every if f not in answers], mode))
    locomo = [
        {**record("q1", [row(f"c{g}:1", 1), row(f"c{g}:2", 0)], mode), "domain": "locomo", "group": g, "qid": f"c{g}/0"}
        for g in range(5)
    ]
    return out + locomo


CALIBRATE_IDS = {"q4", "q5", "f7", "f8", "f9"}


def ids(recs: list[dict]) -> set[str]:
    return {r["qid"] for r in recs} | {x["row_id"] for r in recs for x in r["rows"]}


def test_the_calibrate_split_calibrates_and_nothing_else():
    assert {cross_encoder.fleet_role(i) for i in ("q4", "q5", "f7", "f8", "f9")} == {"calibrate"}
    assert cross_encoder.fleet_role("q2") == "calibrate"  # the fit half's calibration clusters, as before
    assert cross_encoder.fleet_role("q1") == "train" and cross_encoder.fleet_role("q3") == "fleet"
    roles = cross_encoder.split(records(), held=4, calibrate=3)
    assert {r["qid"] for r in roles["calibrate"] if r["domain"] == "fleet"} == {"q2", "q4", "q5"}
    # Each record keeps only its own role's rows: no calibrate fact is a candidate of a trained or scored question.
    assert not ids(roles["train"] + roles["fleet"]) & CALIBRATE_IDS
    (q4,) = [r for r in roles["calibrate"] if r["qid"] == "q4"]
    assert [x["row_id"] for x in q4["rows"]] == ["f7", "f4", "f8", "f9"]  # its answer, and mobile's row kept
    # The cross-encoder's training pairs come from the training role alone.
    pools = cross_encoder.training_pools(roles["train"], random.Random(0), (5, 5, 5), (2, 2, 1))
    texts = {q for pool in pools for q, _, _ in pool} | {t for pool in pools for _, t, _ in pool}
    assert not {t for t in texts if any(i in t for i in ("q4", "q5", "f7", "f8", "f9"))}


def test_an_unknown_split_has_no_role(monkeypatch):
    monkeypatch.setattr(cross_encoder, "fleet_items", lambda: {"q9": {"split": "draft", "domain_topic": "kiosk"}})
    with pytest.raises(ValueError, match="no role"):
        cross_encoder.fleet_role("q9")


def test_the_features_judge_fits_and_scores_without_the_calibrate_split():
    recs = records() + records("keyword")
    fitted = judge_fit.fitting_records(recs)
    assert {r["qid"] for r in fitted if r["domain"] == "fleet"} == {"q1", "q2"}
    for _, fit, held in judge_eval.folds([r for r in recs if r["mode"] == "hybrid"]):
        assert not {r["qid"] for r in fit + held} & CALIBRATE_IDS
    for _, fit, held in judge_conflicts.cv_folds([r for r in recs if r["mode"] == "hybrid"]):
        assert not {r["qid"] for r in fit + held} & CALIBRATE_IDS


def test_the_fitted_and_scored_questions_never_meet_a_calibrate_fact():
    facts = [{"id": i, "split": x["split"]} for i, x in ITEMS.items() if i.startswith("f")]
    questions = [{"id": i, "split": x["split"]} for i, x in ITEMS.items() if i.startswith("q")]
    (plain, calibrate) = judge_data.memories(facts, questions)
    assert {f["id"] for f in plain[0]} == {"f1", "f2", "f3", "f4", "f5", "f6"}
    assert {q["id"] for q in plain[1]} == {"q1", "q2", "q3"}
    assert {f["id"] for f in calibrate[0]} == {f["id"] for f in facts}  # every fact: the memory a service holds
    assert {q["id"] for q in calibrate[1]} == {"q4", "q5"}
    assert judge_data.memories(facts, questions, {"calibrate"}) == [calibrate]
    assert judge_data.memories(facts, questions, {"fit", "score"}) == [plain]


def test_a_calibrate_cache_keeps_its_base_byte_for_byte(tmp_path):
    base = tmp_path / "base.jsonl"
    base.write_bytes(b'{"qid": "q1", "x": 1.50}\n{"qid": "q3", "x": 2}\n')  # not as json.dumps would write it
    out = tmp_path / "cal.jsonl"
    judge_data.write(out, [record("q4", [row("f7", 1)])], onto=base)
    raw = out.read_bytes()
    assert raw.startswith(base.read_bytes())
    assert [json.loads(line)["qid"] for line in raw.splitlines()] == ["q1", "q3", "q4"]
