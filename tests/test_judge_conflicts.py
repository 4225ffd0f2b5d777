"""The judge's conflict detectors (solos_judge.conflicts): a row holds a rival of a specific the question names
(another quarter, incident, service, person, scope) and not the question's own. A row that only lacks the
question's specific, holding nothing else of its kind, is no conflict."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import solos_judge


def conflicts(question: str, text: str, agent: str = "atlas") -> set[str]:
    return solos_judge.conflicts(
        solos_judge.specifics(question, question=True), text, solos_judge.row_tokens(text), agent
    )


@pytest.mark.parametrize(
    ("question", "near_miss", "answer", "family"),
    [
        # period: a quarter, a half, a fiscal year, a year, a month (by name or inside an ISO date), a weekday
        (
            "What is the payments cloud budget cap for Q3 2026?",
            "payments budget Q2 2026: cap EUR 48,500, approver Marta Kovacs.",
            "payments budget Q3 2026: cap EUR 51,000, approver Marta Kovacs.",
            "period",
        ),
        (
            "What is the IT hardware budget for H1 2027?",
            "IT hardware H2 2026: EUR 95,000.",
            "IT hardware H1 2027.",
            "period",
        ),
        (
            "What was the tooling budget for FY2025?",
            "Tooling budget FY2026: EUR 64,000.",
            "FY2025 tooling: EUR 60,000.",
            "period",
        ),
        (
            "What is the HR tools budget for 2027?",
            "HR tools budget 2026: EUR 96,000.",
            "HR tools 2027: EUR 99,000.",
            "period",
        ),
        (
            "How many partner API calls were there in August 2026?",
            "Partner API calls: 212M in September 2026, 236M in October 2026.",
            "Partner API calls: 198M in August 2026.",
            "period",
        ),
        (
            "What changed in the March 2026 release?",
            "Release notes 2026-04-02: new checkout flow.",
            "Release notes 2026-03-11: new checkout flow.",
            "period",
        ),
        (
            "Which team deploys on Tuesdays?",
            "The web team deploys on Thursdays.",
            "The web team deploys on Tuesdays.",
            "period",
        ),
        # incident and ticket ids by their shape (inc-9), versions (v9.9), hosts with numbers (pay-app-9)
        (
            "Who was incident commander for INC-2290?",
            "INC-2262 (2026-05-16): origin stampede after a purge. Incident commander: Hana Sato.",
            "INC-2290 (2026-06-19): fraud-scorer timeouts. Incident commander: Hana Sato.",
            "id",
        ),
        ("When does v3.18 ship?", "payments-api is at v3.17 since 2026-11-12.", "v3.18 ships after the freeze.", "id"),
        ("What rack is pay-app-02 in?", "pay-app-01 sits in rack B4.", "pay-app-02 sits in rack B5.", "id"),
        # service and host names sharing a suffix or a prefix
        (
            "What port does payments-api listen on?",
            "search-api listens on 8088 behind haproxy.",
            "payments-api serves on port 8443.",
            "name",
        ),
        ("Where does payments-worker run?", "payments-api runs on pay-app-01.", "payments-worker runs on k8s.", "name"),
        # people: a full name against the row's full names; any name against a speaker (a capitalised agent)
        (
            "Is Rafael Quint off every other Friday?",
            "Ilse Vermeer prefers written proposals and is off every other Friday.",
            "Rafael Quint is off every other Friday.",
            "person",
        ),
        # scope: per-user against per-tenant, staging against prod, internal against external, plans, tiers
        (
            "What is the request limit per user?",
            "api-gateway allows 600 requests per minute per tenant.",
            "api-gateway allows 60 requests per minute per user.",
            "scope",
        ),
        (
            "What version is the staging OpenSearch cluster running?",
            "Production OpenSearch cluster os-prod: version 2.11.",
            "Staging OpenSearch cluster: version 2.13.",
            "scope",
        ),
        (
            "How often are internal search API keys rotated?",
            "External search API keys are rotated every 90 days.",
            "Internal search API keys are rotated every 30 days.",
            "scope",
        ),
        (
            "What is the quota on the basic plan?",
            "Quota: 600 a minute on the standard plan.",
            "Basic plan: 60 a minute.",
            "scope",
        ),
        (
            "What is the gold SLA response time?",
            "Silver SLA: first response within 8 hours.",
            "Gold SLA: 1 hour.",
            "scope",
        ),
    ],
)
def test_a_rival_value_is_a_conflict_and_the_answer_is_not(question, near_miss, answer, family):
    assert family in conflicts(question, near_miss)
    assert conflicts(question, answer) == set()


@pytest.mark.parametrize(
    ("question", "row"),
    [
        # lacks the incident's number, holds no other incident
        (
            "Who was incident commander for INC-2290?",
            "Fraud-scorer timeouts in the June sale; the commander was Hana Sato.",
        ),
        # lacks the quarter, holds no other period
        ("What is the payments cloud budget cap for Q3 2026?", "The payments cloud cap is EUR 51,000 this quarter."),
        # lacks the service's name, names no other service
        ("What port does payments-api listen on?", "The payments API serves on port 8443."),
        # lacks the person's name (a pronoun), names nobody else
        ("Does Priya Raman prefer morning meetings?", "She prefers meetings before 11:00."),
        # lacks the scope word, holds no rival scope
        ("What is the request limit per user?", "api-gateway allows 60 requests a minute for each caller."),
    ],
)
def test_an_answer_that_lacks_the_specific_without_a_rival_is_no_conflict(question, row):
    assert conflicts(question, row) == set()


def test_a_row_holding_both_the_asked_and_a_rival_value_is_no_conflict():
    assert (
        conflicts("What was catalog completeness in September 2026?", "91.4% in September 2026, 93.0% in October 2026.")
        == set()
    )
    assert conflicts("What does INC-2290 have to do with INC-2262?", "INC-2290 repeated INC-2262's cause.") == set()


def test_a_speaker_is_a_person_a_writer_is_not():
    question = "What did Melanie paint last week?"
    # a LoCoMo turn by Caroline that does not name Melanie holds another person: its speaker
    assert conflicts(question, "I painted a sunset by the lake.", agent="Caroline") == {"person"}
    # Melanie's own turn holds her (as its speaker), and a short name matches its long form
    assert conflicts(question, "I painted a sunset by the lake.", agent="Melanie") == set()
    assert conflicts("What did Mel paint last week?", "I painted a sunset.", agent="Melanie") == set()
    # a fleet agent (a bot's lower-case name) is the writer, not a person
    assert conflicts(question, "I painted a sunset by the lake.", agent="mira") == set()


def test_a_question_opening_with_may_names_no_month():
    assert "period:month" not in solos_judge.specifics("May a build job use a long-lived key?", question=True)
    assert solos_judge.specifics("What shipped in May?", question=True)["period:month"] == {"may"}


def test_a_question_with_no_specific_has_no_conflict():
    assert solos_judge.specifics("how do we deploy?", question=True) == {}
    assert conflicts("how do we deploy?", "search-api deploys in Q3 2026 on pay-app-01, per tenant.") == set()


def test_the_conflict_features_are_the_judges():
    features = solos_judge.features(
        "What is the payments cloud budget cap for Q3 2026?",
        [{"text": "Q2 2026 payments cloud cap EUR 48,500", "topic": "payments budget Q2 2026", "agent": "sol"}],
        "hybrid",
    )[0]
    assert {name: features[name] for name in solos_judge.CONFLICT_FEATURES} == {
        "conflict_period": 1.0,
        "conflict_id": 0.0,
        "conflict_name": 0.0,
        "conflict_person": 0.0,
        "conflict_scope": 0.0,
    }
    assert set(solos_judge.CONFLICT_FEATURES) <= set(solos_judge.FEATURES["keyword"])


def test_an_empty_question_has_no_specifics_and_its_rows_still_get_features():
    """An empty or blank question (the cross-encoder reads any question) names nothing: no slot, no conflict."""
    for question in ("", "   "):
        assert solos_judge.specifics(question, question=True) == {}
        rows = [{"agent": "atlas", "topic": "search-api", "text": "search-api listens on 8088."}]
        found = solos_judge.features(question, rows, "hybrid")[0]
        assert not any(found[name] for name in solos_judge.CONFLICT_FEATURES)


def test_the_kind_count_reads_answer_rows_and_unanswerable_top_rows(capsys):
    pytest.importorskip("numpy")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import judge_conflicts

    def record(domain: str, question: str, answerable: bool, rows: list[tuple[str, bool]]) -> dict:
        return {
            "domain": domain,
            "question": question,
            "answerable": answerable,
            "rows": [{"text": text, "agent": "atlas", "relevance": 0.2, "label": label} for text, label in rows],
        }

    judge_conflicts.kind_counts(
        [
            # an answer holding the port, a near miss's top row holding none
            record("fleet", "What port does notify-api listen on?", True, [("notify-api listens on 8710", True)]),
            record("fleet", "What port does ledger-writer listen on?", False, [("runs on pay-01", False)]),
        ]
    )
    out = capsys.readouterr().out
    assert "0.000 (0/1)" in out.split("kind:port", 1)[1].splitlines()[0]
    assert "1.000 (1/1)" in out.split("kind:port", 1)[1].splitlines()[0]
