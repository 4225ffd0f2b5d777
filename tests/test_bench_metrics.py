"""The judge benches' metrics on tiny inputs computed by hand: AUROC (ties count half), the best answer against an
unanswerable question's top row, rejected / kept at a floor, the floor rule, hit@5, frac@10, ECE, and the
latency percentiles (nearest rank). Questions with no rows and answers recall did not return are scored as the
benches say: an answerable question with no answer row scores 0 and keeps nothing; an unanswerable question with
no rows is rejected at any floor. No service, no cache: bench/judge_eval.py, judge_fit.py, judge_ab.py and
harness.py as imported.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("numpy")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import harness
import judge_ab
import judge_eval
import judge_fit


def question(labels: list[int], answerable: bool | None = None, n_answers: int | None = None, kind: str = "k") -> dict:
    """A record as bench/judge_data.py writes it: rows in recall's order, each labelled."""
    answerable = any(labels) if answerable is None else answerable
    return {
        "answerable": answerable,
        "n_answers": sum(labels) if n_answers is None else n_answers,
        "kind": kind,
        "rows": [{"label": y} for y in labels],
    }


def test_auroc_counts_each_pair_and_a_tie_half():
    # 0.9 beats both; 0.5 ties 0.5 (half) and beats 0.2; 0.1 beats neither: 3.5 of 6 pairs
    assert judge_eval.auroc([0.9, 0.5, 0.1], [0.5, 0.2]) == pytest.approx(3.5 / 6)
    assert judge_eval.auroc([0.3, 0.3], [0.3, 0.3, 0.3]) == 0.5
    assert judge_eval.auroc([1.0], [0.0]) == 1.0 and judge_eval.auroc([0.0], [1.0]) == 0.0
    assert math.isnan(judge_eval.auroc([], [0.1])) and math.isnan(judge_eval.auroc([0.1], []))


def test_separation_reads_the_best_answer_row_against_the_top_unanswerable_row():
    scored = [
        (question([0, 1, 1]), [0.9, 0.4, 0.6]),  # its best answer row 0.6 (not its top row, 0.9, a near miss)
        (question([0, 0]), [0.5, 0.7]),  # unanswerable: its top row 0.7
        (question([0, 0, 0], answerable=True, n_answers=1), [0.8, 0.1, 0.1]),  # the answer not returned: 0
        (question([]), []),  # unanswerable and nothing returned: 0
    ]
    # positives 0.6, 0.0; negatives 0.7, 0.0: 0.6 beats 0.0 (1), ties nothing; 0.0 ties 0.0 (half): 1.5 of 4
    assert judge_eval.separation(scored) == pytest.approx(1.5 / 4)


def test_at_a_floor_rejected_counts_unanswerable_with_nothing_at_or_above_and_kept_an_answer_at_or_above():
    scored = [
        (question([1, 0]), [0.5, 0.9]),  # kept: its answer is at the floor
        (question([0, 1]), [0.9, 0.4]),  # not kept: only a near miss passes
        (question([0, 0], answerable=True, n_answers=1), [0.9, 0.9]),  # not kept: its answer was not returned
        (question([0, 0]), [0.49, 0.1]),  # rejected
        (question([0]), [0.5]),  # not rejected: at the floor passes
        (question([]), []),  # rejected: nothing returned
    ]
    assert judge_fit.floor_figures(scored, 0.5) == pytest.approx((2 / 3, 1 / 3))
    assert judge_fit.floor_figures([], 0.5) == (0.0, 0.0)


def test_the_floor_rule_takes_the_highest_floor_every_domain_keeps_enough_answers_under():
    fleet = [(question([1]), [0.3]), (question([1]), [0.6])]
    locomo = [(question([1]), [0.2]), (question([1]), [0.7]), (question([1]), [0.8])]
    floors = (0.1, 0.25, 0.3, 0.5, 0.65)
    # keep 0.5: the fleet keeps half up to 0.6, LoCoMo two thirds up to 0.7; 0.65 costs the fleet its second answer
    assert judge_fit.choose_floor([fleet, locomo], floors, keep=0.5) == 0.5
    # keep 1.0: every answer must pass, so the floor stays under the lowest answer, 0.2
    assert judge_fit.choose_floor([fleet, locomo], floors, keep=1.0) == 0.1
    # none keeps enough: the lowest floor
    assert judge_fit.choose_floor([[(question([1]), [0.01])]], floors, keep=1.0) == 0.1


def test_hit_at_5_in_recall_order_or_the_judges_over_answerable_questions_only():
    late = question([0, 0, 0, 0, 0, 1])  # its answer sixth in recall's order, first in the judge's
    probs = [0.1, 0.1, 0.1, 0.1, 0.1, 0.9]
    scored = [
        (late, probs),
        (question([1, 0], kind="paraphrase"), [0.2, 0.1]),
        (question([0, 0]), [0.9, 0.9]),  # unanswerable: not asked
        (question([], answerable=True, n_answers=1), []),  # answerable, nothing returned: a miss
    ]
    assert judge_eval.hit_at(scored, reorder=False) == pytest.approx(1 / 3)
    assert judge_eval.hit_at(scored, reorder=True) == pytest.approx(2 / 3)
    assert judge_eval.hit_at(scored, kinds={"paraphrase"}, reorder=False) == 1.0
    # ties in the judge's order keep recall's: the answer fifth of six equal rows stays in the first five
    assert judge_eval.hit_at([(question([0, 0, 0, 0, 1, 0]), [0.5] * 6)], reorder=True) == 1.0


def test_frac_at_10_is_each_questions_share_of_its_answers_in_its_first_10():
    scored = [
        (question([1] + [0] * 10 + [1]), [0.0] * 12),  # 2 answers, one in the first 10: 0.5
        (question([0, 1, 0], n_answers=3), [0.0] * 3),  # 3 answers, 2 not returned: 1/3
        (question([0, 0]), [0.0, 0.0]),  # unanswerable: not counted
    ]
    assert judge_ab.frac_at(scored) == pytest.approx((0.5 + 1 / 3) / 2)
    assert judge_ab.frac_at([]) == 0.0


def test_ece_weighs_each_bins_gap_by_its_rows():
    scored = [
        (question([0, 1]), [0.05, 0.15]),  # bins 0 and 1: gaps 0.05 and 0.85
        (question([1, 1]), [0.95, 1.0]),  # bin 9 (1.0 included): mean 0.975 against 1, gap 0.025, two rows
    ]
    assert judge_eval.ece(scored) == pytest.approx((0.05 + 0.85 + 2 * 0.025) / 4)
    assert judge_eval.ece([(question([1, 0]), [1.0, 0.0])]) == 0.0


@pytest.mark.parametrize(
    ("n", "q", "rank"),
    [(5, 0.50, 3), (9, 0.50, 5), (4, 0.50, 2), (30, 0.95, 29), (10, 0.95, 10), (400, 0.95, 380), (1, 0.99, 1)],
)
def test_percentiles_are_nearest_rank(n, q, rank):
    """The value at rank ceil(q * n) of the sorted samples: at least q of them are at or under it."""
    samples = [i / 1000 for i in range(n, 0, -1)]  # 1 ms .. n ms, in reverse
    got = harness.percentiles(samples)[{0.5: "p50", 0.95: "p95", 0.99: "p99"}[q]]
    assert got == pytest.approx(rank)


class FakeClient:
    """A kept-alive client stand-in: logs each recall's query and answers with `ranking` (or the next of them)."""

    def __init__(self, name: str, log: list[tuple[str, str]], rankings: list[str] | None = None):
        self.name, self.log, self.rankings = name, log, rankings

    def json(self, method: str, path: str, query: dict) -> tuple[int, dict]:
        self.log.append((self.name, query["q"]))
        return 200, {"ranking": self.rankings.pop(0) if self.rankings else "hybrid"}


def test_the_ab_interleaves_each_query_and_alternates_who_goes_first():
    """Each query goes to both trees back to back, the first of the pair alternating: a tree always second runs
    beside the other's work after its answer (the delivery log, the counters), so a fixed order is a bias."""
    import recall_ab

    log: list[tuple[str, str]] = []
    clients = {"base": FakeClient("base", log), "this": FakeClient("this", log)}
    queries = [f"q{i}" for i in range(30)]
    samples = recall_ab.alternate_recalls(clients, queries, "long", "shared")
    assert [len(s) for s in samples.values()] == [30, 30]
    timed = log[-60:]
    pairs = [timed[i : i + 2] for i in range(0, 60, 2)]
    assert all({name for name, _ in pair} == {"base", "this"} and pair[0][1] == pair[1][1] for pair in pairs)
    firsts = [pair[0][0] for pair in pairs]
    assert firsts.count("base") == firsts.count("this") == 15


def test_the_ab_refuses_a_run_where_any_answer_ranked_otherwise():
    """A hybrid A/B whose tree answered one query keyword-only (its embedding timed out) timed a cheaper recall:
    every answer must rank alike, not only the last."""
    import recall_ab

    log: list[tuple[str, str]] = []
    answers = ["hybrid"] * 10 + ["hybrid", "keyword"] + ["hybrid"] * 8  # 10 to warm up, then 10 timed
    clients = {"base": FakeClient("base", log), "this": FakeClient("this", log, answers)}
    with pytest.raises(AssertionError, match="keyword"):
        recall_ab.alternate_recalls(clients, [f"q{i}" for i in range(10)], "long", "shared")
