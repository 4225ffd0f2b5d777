"""The cross-encoder trial's split (bench/cross_encoder.py): what it scores on is what no fit saw.

A model that can learn rows and questions by heart must not meet them again where it is scored. The fleet's
memory holds both halves, so a scored question's candidates held the fitting half's rows (some of them
training answers); LoCoMo's foreign questions are other conversations' own, trained on as answerable. Both
made the trial score a memory, not a judgement (held-out fleet AUROC 0.06). These run without torch.
"""

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import cross_encoder


def row(row_id: str, label: int) -> dict:
    return {"row_id": row_id, "label": label, "agent": "atlas", "topic": "", "text": f"text of {row_id}"}


def record(domain: str, group, qid: str, rows: list[dict], kind: str = "keyword") -> dict:
    return {
        "mode": "hybrid",
        "domain": domain,
        "group": group,
        "qid": qid,
        "question": f"question {qid}?",
        "kind": kind,
        "answerable": any(r["label"] for r in rows),
        "rows": rows,
    }


def fleet_records() -> list[dict]:
    # q001 (payments, trained), q101 (mobile, a calibration cluster), and a scored question; each question's
    # candidates mix rows of every role, as recall over the whole memory returns them.
    scored = next(q for q, x in cross_encoder.fleet_items().items() if q.startswith("q") and x["split"] == "score")
    answer = cross_encoder.fleet_items()[scored]["answers"][0]
    mixed = [row("f002", 0), row("f101", 0), row("f161", 0), row("f320", 0)]
    return [
        record("fleet", "fit", "q001", [row("f001", 1), *mixed]),
        record("fleet", "fit", "q101", [row("f101", 1), row("f001", 0), row("f170", 0)]),
        record("fleet", "score", scored, [row("f001", 0), row(answer, 1), *mixed]),
    ]


def locomo_records() -> list[dict]:
    # Conversation 4 is held out, 3 calibrates, 0-2 train. c0/1 is asked as a foreign question of 4, c1/2 of 3.
    out = []
    for group in range(5):
        out.append(record("locomo", group, f"c{group}/0", [row(f"c{group}:1", 1), row(f"c{group}:2", 0)]))
        out.append(record("locomo", group, f"c{group}/1", [row(f"c{group}:3", 1), row(f"c{group}:4", 0)]))
        out.append(record("locomo", group, f"c{group}/2", [row(f"c{group}:5", 1), row(f"c{group}:6", 0)]))
    out.append(record("locomo", 4, "c0/1", [row("c4:7", 0), row("c4:8", 0)], "foreign"))
    out.append(record("locomo", 3, "c1/2", [row("c3:7", 0), row("c3:8", 0)], "foreign"))
    out.append(record("locomo", 0, "c2/0", [row("c0:7", 0), row("c0:8", 0)], "foreign"))
    return out


def test_a_scored_fleet_question_is_judged_on_rows_no_fit_saw():
    roles = cross_encoder.split(fleet_records(), held=4, calibrate=3)
    assert [len(roles[r]) for r in ("train", "calibrate", "fleet")] == [1, 1, 1]
    for role, records in roles.items():
        for rec in records:
            assert {cross_encoder.fleet_role(r["row_id"]) for r in rec["rows"]} <= {role}, (role, rec["rows"])
    (scored,) = roles["fleet"]
    assert [r["row_id"] for r in scored["rows"] if r["label"]]  # its answer is still there
    assert not {r["row_id"] for r in scored["rows"]} & {r["row_id"] for rec in roles["train"] for r in rec["rows"]}


def test_a_question_asked_in_the_held_out_conversation_is_in_no_fit():
    roles = cross_encoder.split(locomo_records(), held=4, calibrate=3)
    held = {r["qid"] for r in roles["locomo"]}
    assert held == {"c4/0", "c4/1", "c4/2", "c0/1"}  # all of conversation 4, its foreign question too
    fitted = {r["qid"] for role in ("train", "calibrate") for r in roles[role]}
    assert not held & fitted
    assert {r["qid"] for r in roles["calibrate"]} == {"c3/0", "c3/1", "c3/2", "c1/2"}
    assert {(r["group"], r["qid"]) for r in roles["train"]} == {(0, "c0/0"), (0, "c0/2"), (1, "c1/0"), (1, "c1/1")} | {
        (2, "c2/0"),
        (2, "c2/1"),
        (2, "c2/2"),
        (0, "c2/0"),
    }


def test_other_answers_of_the_same_memory_are_its_near_misses():
    records = [r for r in locomo_records() if r["group"] == 0 and r["kind"] != "foreign"]
    pairs = cross_encoder.training_pairs(records, random.Random(0), hard=1, deep=0, others=2)
    as_negative = {(q, t) for q, t, y in pairs if not y}
    # c0:3 answers c0/1 and is a near miss for c0/0 and c0/2; nothing from another conversation comes in.
    assert ("question c0/0?", "atlas: text of c0:3") in as_negative
    assert ("question c0/2?", "atlas: text of c0:3") in as_negative
    assert ("question c0/1?", "atlas: text of c0:3") not in as_negative
    assert all(t.startswith("atlas: text of c0:") for _, t, _ in pairs)
    assert sum(y for _, _, y in pairs) == 3


# Counterfactual near misses (bench/cross_encoder.py --counterfactual): a specific the question and its answer row
# share, swapped for another value of its kind. Made from the training role alone: a value that only the
# calibration records or the held-out sets hold must never reach a training pair.


def named_row(row_id: str, label: int, agent: str, text: str, topic: str = "") -> dict:
    return {"row_id": row_id, "label": label, "agent": agent, "topic": topic, "text": text}


def test_a_counterfactual_swaps_the_anchor_the_question_and_its_answer_share():
    answer = named_row("c0:1", 1, "atlas", "payments-api serves on port 8443 behind lb-int-1.", "payments-api")
    other = named_row("c0:2", 0, "atlas", "search-api listens on 8088; owner Hana Sato.", "search-api")
    rec = dict(record("locomo", 0, "c0/0", [answer, other]), question="What port does payments-api listen on?")
    pairs = cross_encoder.counterfactual_pairs([rec], random.Random(0), 1, 1)
    assert pairs == [
        (
            "What port does payments-api listen on?",
            "atlas (search-api): search-api serves on port 8443 behind lb-int-1.",
            0.0,
        ),
        (
            "What port does search-api listen on?",
            "atlas (payments-api): payments-api serves on port 8443 behind lb-int-1.",
            0.0,
        ),
    ]
    # The value asked for (the port) is never the one swapped, and a pair with no shared specific gives none.
    plain = dict(rec, question="what port does it listen on?")
    assert cross_encoder.counterfactual_pairs([plain], random.Random(0), 2, 2) == []


def test_kinds_keep_a_swap_within_its_kind():
    kind = cross_encoder.specific_kind
    assert kind("Q3") == kind("q2") == "quarter" and kind("2026") == "year" and kind("8443") == "9999"
    assert kind("INC-2207") == kind("INC-2311") != kind("pay-app-01")
    assert kind("payments-api") == kind("search-api") == "a-a"
    assert kind("Priya") == "Aa" and kind("March") == "month" and kind("Friday") == "weekday"
    assert kind("serves") is None and kind("the") is None
    # A capitalised word opening a sentence is no name to swap in.
    assert cross_encoder.named("Thanks, Melanie! Wow. Caroline went.") == ["Melanie"]


def test_counterfactuals_read_only_the_training_role():
    speakers = {
        0: ("Alma", "Bruno"),
        1: ("Carmen", "Dario"),
        2: ("Elena", "Fabio"),
        3: ("Greta", "Hugo"),
        4: ("Ines", "Jonas"),
    }
    records = []
    for group, (one, two) in speakers.items():
        rows = [
            named_row(f"c{group}:1", 1, one, "I painted a lake at dawn."),
            named_row(f"c{group}:2", 0, two, "Nice one!"),
        ]
        records.append(dict(record("locomo", group, f"c{group}/0", rows), question=f"What did {one} paint?"))
    # A question of conversation 0 asked in the held-out one: held out everywhere, its rows too.
    foreign = [named_row("c4:3", 0, "Ines", "Jonas and Alma met Karl.")]
    records.append(dict(record("locomo", 4, "c0/0", foreign, "foreign"), question="What did Alma paint?"))
    roles = cross_encoder.split(records, held=4, calibrate=3)
    pools = cross_encoder.training_pools(roles["train"], random.Random(0), (1, 0, 0), (2, 2))
    made = [(q, t) for pool in pools for q, t, y in pool if not y and "paint" in q and "lake" in t]
    assert made  # there are counterfactuals, each a swap of a training speaker for another training speaker
    # Conversation 0's question is asked in the held-out one, so conversation 0 is in no fit either.
    unseen = {"Alma", "Bruno", "Greta", "Hugo", "Ines", "Jonas", "Karl"}
    for question, text in made:
        assert not any(name in question or name in text for name in unseen), (question, text)


def test_a_dropped_counterfactual_keeps_the_topic_and_loses_what_is_asked():
    answer = named_row(
        "c0:1", 1, "kepler", "INC-2207 (2026-03-11): payments double charged. IC: Priya Raman.", "INC-2207"
    )
    rec = dict(record("locomo", 0, "c0/0", [answer]), question="Who was incident commander for INC-2207?")
    (pair,) = cross_encoder.counterfactual_pairs([rec], random.Random(0), 0, 0, drop=1)
    assert pair == (
        "Who was incident commander for INC-2207?",
        "kepler (INC-2207): INC-2207 (2026-03-11): payments double charged.",
        0.0,
    )
    # Nothing is made when the question asks for no kind, or every clause holds the kind asked.
    assert cross_encoder.dropped("What happened in INC-2207?", answer, ["INC-2207"]) is None
    one = dict(answer, text="INC-2207 (2026-03-11): payments double charged for 47 minutes")
    assert cross_encoder.dropped("When did INC-2207 happen?", one, ["INC-2207"]) is None
    assert (
        cross_encoder.dropped("When did INC-2207 happen?", answer, ["INC-2207"])
        == "kepler (INC-2207): IC: Priya Raman."
    )
