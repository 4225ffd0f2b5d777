"""The LoCoMo harness's own arithmetic (bench/locomo_data.py): evidence ids, metrics, reference BM25; and the benches
that read LoCoMo, which lives outside the repository, stop in one line naming it when it is missing."""

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import locomo_data

BENCH = Path(locomo_data.__file__).parent

# Every bench that reads LoCoMo, with the arguments it needs besides --data.
LOCOMO_BENCHES = {
    "locomo.py": [],
    "locomo_shape.py": [],
    "embed.py": [],
    "embed_batch.py": [],
    "ltr_fit.py": [],
    "service_rss.py": ["--base", "."],
    "relevance_fit.py": [],
    "write_recall_ab.py": ["--base", "."],
    "store_compare.py": [],
    "judge_data.py": ["--refresh"],
    "judge_ab.py": ["--base", "."],
    "fusion_levers.py": [],
    "embed_tune.py": [],
}


def test_malformed_evidence_ids_are_normalised_and_unknown_ones_dropped():
    known = {"D8:6", "D9:17", "D11:26", "D30:5"}
    raw = ["D8:6; D9:17", "D:11:26", "D30:05", "D", "D99:1", "D8:6"]
    assert locomo_data.normalise_evidence(raw, known) == ["D8:6", "D9:17", "D11:26", "D30:5"]


def test_metrics_of_one_query():
    ranked = ["D1:1", "D1:2", "D1:3", "D1:4", "D1:5", "D1:6", "D1:7"]
    got = locomo_data.score(ranked, ["D1:2", "D1:7", "D2:1"])
    assert got["hit@1"] == 0.0 and got["hit@5"] == 1.0 and got["hit@10"] == 1.0
    assert got["all@5"] == 0.0 and got["all@10"] == 0.0
    assert got["frac@5"] == pytest.approx(1 / 3) and got["frac@10"] == pytest.approx(2 / 3)
    assert got["MRR"] == 0.5
    assert locomo_data.score([], ["D1:1"])["MRR"] == 0.0


def test_summary_groups_by_category_and_overall():
    one = locomo_data.score(["D1:1"], ["D1:1"])
    none = locomo_data.score(["D1:2"], ["D1:1"])
    summary = locomo_data.summarise([(1, one), (4, none), (4, one)])
    assert summary["multi-hop"]["hit@1"] == 1.0
    assert summary["single-hop"]["hit@1"] == 0.5 and summary["single-hop"]["n"] == 2
    assert summary["overall"]["hit@1"] == pytest.approx(2 / 3)


def test_reference_bm25_prefers_rare_terms_and_short_rows():
    docs = [["the", "cat", "sat"], ["the", "dog", "sat", "on", "the", "cat", "mat", "today"], ["the", "the"]]
    scores = locomo_data.BM25(docs).scores(["cat", "the"])
    assert scores[0] > scores[1] > scores[2] > 0
    assert locomo_data.BM25(docs).scores(["absent"]) == [0.0, 0.0, 0.0]


def test_agent_names_fit_the_registry_pattern():
    for speaker in ("Caroline", "Mary Ann", "Éva", "-x-", "O'Brien"):
        assert locomo_data.AGENT_NAME.match(locomo_data.agent_name(speaker)), speaker


def test_speakers_that_normalise_alike_get_distinct_agents():
    assert locomo_data.agent_name("Éva") == "Eva"
    assert locomo_data.agent_names(["Jo Ann", "Jo_Ann", "Jo Ann"]) == {"Jo Ann": "Jo_Ann", "Jo_Ann": "Jo_Ann-2"}


def test_every_bench_that_reads_locomo_is_checked_for_its_missing_data():
    texts = {path.name: path.read_text() for path in BENCH.glob("*.py")}
    readers = {name for name, text in texts.items() if "load_conversations(" in text and "def main(" in text}
    assert readers == set(LOCOMO_BENCHES)


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(LOCOMO_BENCHES))
def test_a_bench_without_its_data_stops_with_one_line_naming_it(script, tmp_path):
    missing = tmp_path / "locomo-dev.json"
    argv = [sys.executable, str(BENCH / script), *LOCOMO_BENCHES[script], "--data", str(missing)]
    run = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert (run.returncode, run.stdout) == (1, "")
    assert run.stderr.splitlines() == [f"LoCoMo data not found: {missing} (give its path with --data)"]


def test_the_fleets_stage_table_finds_each_answer_at_each_step():
    """bench/fleet_rank.py --stages: an answer's best rank per step, "-" where a step never held it, and the shares
    within 5, within 20 and present."""
    pytest.importorskip("numpy")
    import fleet_rank

    record = {"split": "fit", "kind": "paraphrase", "id": "q1", "question": "Who led it?", "answers": ["f2", "f9"]}
    near = {
        **record,
        "stages": {"cosine": ["f1", "f2"], "keyword": [], "vector": ["f2"], "fused": ["f1"] * 21 + ["f9"]},
    }
    near["stages"]["head"], near["returned"] = near["stages"]["fused"], ["f9", "f2"]
    lost = {**record, "id": "q2", "stages": {name: ["f1"] for name in ("cosine", "keyword", "vector", "fused", "head")}}
    lost["returned"] = ["f1"]
    other = {**near, "split": "score"}
    lines = fleet_rank.stage_table([near, lost, other], "fit")
    assert lines[1].split()[:8] == ["q1", "paraphrase", "2", "-", "1", "22", "22", "1"]
    assert lines[2].split()[:8] == ["q2", "paraphrase", "-", "-", "-", "-", "-", "-"]
    assert lines[3].split() == ["within5", "0.500", "0.000", "0.500", "0.000", "0.000", "0.500"]
    assert lines[4].split() == ["within20", "0.500", "0.000", "0.500", "0.000", "0.000", "0.500"]
    assert lines[5].split() == ["present", "0.500", "0.000", "0.500", "0.500", "0.500", "0.500"]
