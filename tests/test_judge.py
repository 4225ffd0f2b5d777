"""The judge (solos_judge.py): its file is checked at load, a bad file degrades with a reason, its features
behave and its output is a probability."""

from __future__ import annotations

import hashlib
import json

import pytest

import solos_judge
import solos_status

SHIPPED = solos_judge.load()


def row(text: str, relevance: float = 0.3, cosine: float = 0.5, topic: str = "") -> dict:
    return {"text": text, "topic": topic, "agent": "atlas", "relevance": relevance, "cosine": cosine}


def written(tmp_path, doc: dict) -> tuple[str, str]:
    """A judge file holding `doc`, and its sha256."""
    raw = json.dumps(doc).encode()
    path = tmp_path / "judge.json"
    path.write_bytes(raw)
    return str(path), hashlib.sha256(raw).hexdigest()


def test_the_shipped_file_loads_with_its_hash():
    assert SHIPPED.reason is None
    assert set(SHIPPED.models) == {"hybrid", "keyword"}
    assert SHIPPED.sha256 == solos_judge.JUDGE_SHA256
    assert SHIPPED.name("hybrid").startswith("features-hybrid@")


def test_a_changed_file_is_refused_by_its_hash(tmp_path):
    raw = solos_judge.JUDGE_PATH.read_bytes()
    path = tmp_path / "judge.json"
    path.write_bytes(raw.replace(b'"floor"', b' "floor"', 1))
    judge = solos_judge.load(path)
    assert not judge.models
    assert "sha256" in judge.reason


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "unreadable"),
        (b"{not json", "malformed"),
        (b'{"format": 1, "models": {"hybrid": {"features": ["cosine"], "weights": [0, 1]}}}', "malformed"),
        (b'{"format": 99, "models": {}}', "malformed"),
        (b"\xff\xfe", "malformed"),
    ],
)
def test_a_missing_or_corrupt_file_degrades_with_its_reason(tmp_path, content, expected):
    path = tmp_path / "judge.json"
    if content is not None:
        path.write_bytes(content)
    judge = solos_judge.load(path, sha256=None if content is None else hashlib.sha256(content).hexdigest())
    assert expected in judge.reason
    rows = [row("payments-api serves on port 8443.", relevance=0.2)]
    verdict = judge.judge("What port does payments-api use?", rows, "hybrid")
    assert verdict.name == "relevance"
    assert verdict.probabilities == [0.2]
    assert expected in verdict.reason


def test_a_judge_that_fails_on_its_rows_keeps_relevance(tmp_path):
    verdict = SHIPPED.judge("What port?", [{"text": "port 80", "relevance": 0.4}, {"relevance": "high"}], "hybrid")
    assert verdict.name == "relevance" and verdict.probabilities == [0.4, 0.0]
    assert verdict.reason.startswith("judge failed")


@pytest.mark.parametrize("mode", solos_judge.MODES)
@pytest.mark.parametrize("question", ["what is it?", "and then?", "yes", "Is that so?"])
def test_a_question_without_words_to_judge_by_keeps_the_rows_relevance(mode, question):
    """No content word and no identifier: the fit never saw such a question, and read each row as lacking
    nothing (0.5-0.75 for a row of relevance 0.002). The rows' own relevance stands, and the reason says why."""
    rows = [row("payments-api serves on port 8443.", relevance=0.002), row("It is what it is.", relevance=0.05)]
    verdict = SHIPPED.judge(question, rows, mode)
    assert verdict.name == "relevance" and verdict.probabilities == [0.002, 0.05]
    assert "no words to judge by" in verdict.reason
    assert SHIPPED.judge("What is INC-2207?", rows, mode).name != "relevance"  # an identifier is a word to judge by


def test_an_identifier_the_row_lacks_lowers_the_probability():
    question = "Who was incident commander for INC-2290?"
    answer = row("INC-2290 (2026-05-02): checkout slow for 20 minutes. Incident commander: Priya Raman.")
    near = row("INC-2207 (2026-03-11): card payments double charged. Incident commander: Priya Raman.")
    for mode in solos_judge.MODES:
        p = SHIPPED.judge(question, [answer, near], mode).probabilities
        assert p[0] > p[1], mode


def test_a_speaker_named_only_by_the_rows_agent_is_not_missing():
    """LoCoMo's rows are a speaker's turns: the speaker is the row's agent, and the turn's text seldom names them.
    A question naming the speaker is about rows memory holds; one naming a person no row's text or agent holds
    is not."""
    turns = [
        {"text": "I researched adoption agencies last week.", "topic": "8 May 2023", "agent": "Caroline"},
        {"text": "That's great, I'm proud of you!", "topic": "8 May 2023", "agent": "Melanie"},
        {"text": "Pottery class was fun.", "topic": "9 May 2023", "agent": "Anouk_de_Vries"},
    ]
    rows = [dict(t, relevance=0.3, cosine=0.5) for t in turns]
    for mode in solos_judge.MODES:
        asked = solos_judge.features("What did Caroline research?", rows, mode)
        assert asked[0]["ids_nowhere"] == 0.0 and asked[0]["missing_ids"] == 0.0
        assert asked[1]["missing_ids"] == 1.0  # Melanie's turn does not hold Caroline
        assert solos_judge.features("What did Anouk de Vries make?", rows, mode)[2]["missing_ids"] == 0.0
        nobody = solos_judge.features("What did Gina research?", rows, mode)
        assert all(f["ids_nowhere"] == 1.0 and f["missing_ids"] == 1.0 for f in nobody)
        own = SHIPPED.judge("What did Caroline research?", rows, mode).probabilities[0]
        foreign = SHIPPED.judge("What did Gina research?", rows, mode).probabilities[0]
        assert own > foreign, mode


def test_a_when_question_prefers_a_row_with_a_date():
    question = "When does the payments holiday code freeze start?"
    dated = row("The payments holiday code freeze starts on 2026-12-15 and ends after new year.")
    undated = row("The payments holiday code freeze starts after the last release train and ends after new year.")
    features = solos_judge.load(cross=None)
    for mode in solos_judge.MODES:
        # each row judged alone, so neither is read against the other: the features judge's reading of the kind
        # asked (served alone, the cascade skips the model for one row and not the other, so the two
        # probabilities come from different judges)
        with_date = features.judge(question, [dated], mode).probabilities[0]
        without = features.judge(question, [undated], mode).probabilities[0]
        assert with_date > without, mode
        # as served, the two in one recall
        both = SHIPPED.judge(question, [dated, undated], mode).probabilities
        assert both[0] > both[1], mode


def test_what_a_question_asks_for():
    assert solos_judge.asked_kind("When did INC-2207 happen?") == "date"
    assert solos_judge.asked_kind("What port does notify-api listen on?") == "port"
    assert solos_judge.asked_kind("How many payments were double charged?") == "number"
    assert solos_judge.asked_kind("Who commanded INC-2270?") == "person"
    assert solos_judge.asked_kind("What does hx-www do?") == ""
    assert solos_judge.identifiers("Who commanded INC-2270 in Q3?") == {"inc-2270", "q3"}
    # only the question's opening asks: "when" inside a later clause is not a date question
    assert solos_judge.asked_kind("Does Yusuf prefer a call or a message when something breaks?") == ""
    assert solos_judge.asked_kind("Which day does Jonas Berg keep free of meetings?") == "date"


@pytest.mark.parametrize(
    ("text", "kind", "held"),
    [
        ("search-api listens on 8088 behind haproxy", "port", True),
        ("Teleport proxy at tp.hx.internal:3080", "port", True),
        ("Model serving is Triton: HTTP 8000, gRPC 8001", "port", True),
        ("ledger-writer runs on pay-ledger-01 only", "port", False),
        ("Jonas keeps Fridays meeting-free", "date", True),
        ("likes standups at 09:30", "date", True),
        ("INC-2174: emails delayed. IC Elif Kaya.", "person", True),
        ("INC-2324: DNS records pointed at a decommissioned IP", "person", False),
    ],
)
def test_what_a_row_holds(text, kind, held):
    assert solos_judge.holds_kind(text, kind) is held


def test_a_row_holds_the_attributes_it_implies():
    assert {"port", "comma"} <= solos_judge.row_stems("notify-api listens on 8710. IC Bruno Costa.")
    assert "port" not in solos_judge.row_stems("ledger-writer runs on pay-ledger-01 only")


def test_the_off_switch_names_itself(monkeypatch):
    monkeypatch.setenv(solos_judge.OFF_VARIABLE, "off")
    judge = solos_judge.load()
    verdict = judge.judge("What port?", [row("port 80", relevance=0.4)], "hybrid")
    assert (verdict.name, verdict.probabilities) == ("relevance", [0.4])
    assert solos_judge.OFF_VARIABLE in verdict.reason


def test_one_floor_everywhere():
    """The floor the fit chose is the one the turn helpers and the API's documentation use."""
    import solos_client
    import solos_rank

    assert SHIPPED.floor == solos_rank.RELEVANCE_FLOOR == solos_client.TURN_MIN_RELEVANCE


@pytest.mark.parametrize("mode", solos_judge.MODES)
def test_probabilities_stay_in_0_1(mode):
    rows = [
        row("", relevance=0.0, cosine=-1.0),
        row("x " * 500, relevance=1.0, cosine=1.0),
        row("INC-1 Q3 2026-01-01 port 1 Priya Raman", relevance=1e-12, topic="t"),
        {"text": "no relevance, no cosine"},
    ]
    for question in ("", "When? Who? How many? INC-1", "What port does a-b listen on?"):
        verdict = SHIPPED.judge(question, rows, mode)
        assert len(verdict.probabilities) == len(rows)
        assert all(0.0 <= p <= 1.0 for p in verdict.probabilities)
    assert SHIPPED.judge("anything", [], mode).probabilities == []


@pytest.mark.parametrize(("switch", "judge", "cross"), [("off", "off", None), ("features", "ready", "off")])
def test_the_off_switches_show_as_off_not_as_faults(monkeypatch, switch, judge, cross):
    """/health shows the judge's state: turned off by choice is `off`, which the status page lists no problem for."""
    monkeypatch.setenv(solos_judge.OFF_VARIABLE, switch)
    state = solos_judge.load().state()
    assert (state["state"], state["cross_encoder"]) == (judge, cross)
    assert solos_status.problem_list({"judge": state}, {}) == []


def test_rows_the_judge_did_not_read_stay_under_the_lowest_it_gave():
    """A weak question's head seats the vector leg's best rows: the reranker reads 25 rows, the judge the first
    20. Rows 21-25 kept the reranker's relevance, which is not monotone in its order (coverage and cosine weigh
    in), and were scaled by the judge's lowest over the lowest of the 20: above the judged rows, and past 1."""
    import types

    import solos_rank
    import solos_recall

    ranked = [{"text": f"row {n}", "relevance": 0.02, "score": 0.5} for n in range(solos_recall.JUDGE_DEPTH)]
    ranked += [{"text": f"seat {n}", "relevance": 0.6, "score": 0.4} for n in range(3)]
    keys = [("long", n) for n in range(len(ranked))]
    fused = solos_rank.Fused(ranked, keys, {}, {}, {}, len(ranked))
    verdict = solos_judge.Verdict([0.5] * solos_recall.JUDGE_DEPTH, "features-hybrid@test")
    memory = types.SimpleNamespace(judge=types.SimpleNamespace(judge=lambda question, rows, mode: verdict))
    found = types.SimpleNamespace(ranking="hybrid", judge=None, judge_reason=None)
    solos_recall.judge_head(memory, types.SimpleNamespace(query="what port"), found, fused, ranked)
    below = [row["relevance"] for row in ranked[solos_recall.JUDGE_DEPTH :]]
    assert all(0.0 <= p <= 0.5 for p in below), below  # under the judge's lowest: a probability, in order
    assert below == sorted(below, reverse=True) and found.judge == "features-hybrid@test"
