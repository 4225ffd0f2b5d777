"""bench/judge_loss.py's decomposition: where an answer sits, a perfect judge's ceiling, the lost pairs.

The bench says where the judge's AUROC is lost; these hold its arithmetic on questions whose answer is known:
the lost pairs add up to 1 - AUROC and fall where the answers are, a perfect judge over the rows an answer is in
separates completely, and the judge's reordering only moves the rows it read.
"""

import sys
from pathlib import Path

import pytest

pytest.importorskip("numpy")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import judge_loss
from judge_eval import separation


def question(labels: list[int]) -> dict:
    return {
        "answerable": any(labels),
        "domain": "fleet",
        "rows": [{"label": y, "row_id": f"f{i}"} for i, y in enumerate(labels)],
    }


def scored() -> list[tuple[dict, list[float]]]:
    return [
        (question([1, 0, 0, 0, 0, 0]), [0.9, 0.2, 0.1, 0.1, 0.1, 0.1]),  # answer first, judged well
        (question([0, 1, 0, 0, 0, 0]), [0.5, 0.3, 0.1, 0.1, 0.1, 0.1]),  # answer in the head, judged under a near miss
        (question([0, 0, 0, 0, 0, 1]), [0.2, 0.1, 0.1, 0.1, 0.1, 0.05]),  # answer past the head
        (question([0, 0, 0, 0, 0, 0]), [0.4, 0.1, 0.1, 0.1, 0.1, 0.1]),  # unanswerable, near miss on top
        (question([0, 0, 0, 0, 0, 0]), [0.1, 0.1, 0.1, 0.1, 0.1, 0.6]),  # unanswerable, its top row past the head
    ]


def test_an_answer_is_placed_in_the_head_past_it_or_nowhere():
    assert judge_loss.bucket(question([0, 0, 1, 0, 0]), 4) == "first rows"
    assert judge_loss.bucket(question([0, 0, 0, 0, 1]), 4) == "rows 5-20"
    assert judge_loss.bucket(question([0, 0, 0, 0, 0]), 4) == "not in 20"


def test_lost_pairs_add_up_to_what_the_auroc_loses_and_fall_where_the_answers_are():
    data = scored()
    lost = judge_loss.lost_pairs(data, 4)
    assert sum(lost.values()) == pytest.approx(1 - separation(data))
    # the first answer outscores both unanswerable top rows (0.4, 0.6); the second (0.3) and the third (0.05)
    # lose to both: 4 of the 6 pairs, 2 by an answer in the head and 2 by one past it
    assert lost == pytest.approx({"first rows": 2 / 6, "rows 5-20": 2 / 6, "not in 20": 0.0})


def test_a_perfect_judge_over_the_head_separates_only_what_the_head_holds():
    data = scored()
    head = judge_loss.oracle(data, 4)
    assert [p[:4] for _, p in head][:2] == [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]
    assert [p[4:] for _, p in head] == [p[4:] for _, p in data]  # rows past the head as they were
    # the unanswerable question's 0.6 past the head still beats the answer past the head
    assert separation(head) < 1.0
    assert separation(judge_loss.oracle(data, 6)) == 1.0


def test_the_judge_reorders_only_the_rows_it_read():
    rec, probs = question([0, 0, 1, 0, 0, 0]), [0.1, 0.2, 0.9, 0.3, 0.95, 0.0]
    assert judge_loss.reordered(rec, probs, 4) == [2, 3, 1, 0, 4, 5]
    figures = judge_loss.ranking([(rec, probs)], 4)
    assert figures["hit@1"] == 1.0 and figures["hit@5"] == 1.0
    assert judge_loss.ranking([(rec, probs)], None)["hit@1"] == 0.0
