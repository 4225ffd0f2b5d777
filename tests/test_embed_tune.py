"""The embedder fine-tuning bench's pairs (bench/embed_tune.py): it trains on nothing it is scored on.

Its held-out figures mean something only if no `score` or `calibrate` question or fact, and no turn or question
of the held-out LoCoMo conversation, is ever a training pair; and the scored memories are the ones
bench/judge_data.py asks. These run without torch.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import embed_tune
import judge_data
from locomo_data import Conversation, Query, Turn


def conversation(n: int) -> Conversation:
    turns = [Turn(f"D1:{i}", f"Speaker{n}{i % 2}", f"conversation {n} turn {i}", "", 1, "1 May 2023") for i in range(4)]
    queries = [Query(f"conversation {n} question {i}?", 4, [f"D1:{i}"]) for i in range(2)]
    return Conversation(f"conv-{n}", [f"Speaker{n}0", f"Speaker{n}1"], turns, queries)


def test_training_pairs_never_take_a_scored_or_calibration_item():
    facts, questions = judge_data.fleet_data()
    conversations = [conversation(n) for n in range(3)]
    fleet, locomo = embed_tune.training_examples(facts, questions, conversations, held_out=1)

    fitting_questions = {q["question"] for q in questions if q["split"] == "fit" and q["answers"]}
    held_questions = {q["question"] for q in questions if q["split"] != "fit"}
    fitting_texts = {embed_tune.fleet_text(f) for f in facts if f["split"] == "fit"}
    held_texts = {embed_tune.fleet_text(f) for f in facts if f["split"] != "fit"}
    assert {x.question for x in fleet} == fitting_questions
    assert not {x.question for x in fleet} & held_questions
    trained = {t for x in fleet for t in x.answers + x.others}
    assert trained <= fitting_texts and not trained & held_texts
    # A hard negative is another fact of the question's own cluster, never one of its answers.
    clusters = {embed_tune.fleet_text(f): f["domain_topic"] for f in facts}
    by_question = {q["question"]: q for q in questions}
    for x in fleet:
        assert x.others and not set(x.others) & set(x.answers)
        assert {clusters[t] for t in x.others} == {by_question[x.question]["domain_topic"]}

    held = embed_tune.turn_texts(conversations[1])
    assert {x.question for x in locomo} == {q.question for c in (0, 2) for q in conversations[c].queries}
    assert not {t for x in locomo for t in x.answers + x.others} & set(held.values())
    first = embed_tune.turn_texts(conversations[0])
    example = next(x for x in locomo if x.question == "conversation 0 question 1?")
    assert example.answers == [first["D1:1"]] and first["D1:1"] not in example.others


def test_scored_memories_are_the_ones_judge_data_asks():
    facts, questions = judge_data.fleet_data()
    asked = {
        split: [embed_tune.fleet_text(f) for f in held]
        for held, qs in judge_data.memories(facts, questions)
        for split in {q["split"] for q in qs}
    }
    for split in ("score", "fit", "calibrate"):
        memory = embed_tune.fleet_memory(split, facts, questions, split)
        assert memory.rows == asked[split]
        answerable = [q for q in questions if q["split"] == split and q["answers"]]
        assert [q for q, _, _ in memory.questions] == [q["question"] for q in answerable]
        for (_, answers, _), q in zip(memory.questions, answerable):
            wanted = {embed_tune.fleet_text(f) for f in facts if f["id"] in q["answers"]}
            assert {memory.rows[i] for i in answers} == wanted
