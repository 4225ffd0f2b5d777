"""Recall's calibrated relevance and its floor, fitted and scored on the LoCoMo dev split.

Each conversation gets its own service (REST, as bench/locomo.py loads it). It
is asked its own questions (a row is relevant when it is an evidence turn)
and every other conversation's questions (foreign: none of their evidence is
there, so no row is relevant), with min_relevance=0 and k=20: every reranked
row comes back with its score (the reranker's probability) and its relevance.

The calibration, `relevance = logistic(bias + a x logit(score) + b x
question_coverage)`, is a logistic regression over those rows, foreign
questions weighted to count as much as the own ones (so a question is
answerable or not at even odds). Its figures, at a floor:

- rejection: the share of foreign questions answered with no row at or above it;
- hit@5: the own questions with an evidence turn among the first 5 rows at or above it (the rows under it
  are left out and the list refilled from below, as the service does), beside hit@5 with no floor.

In-sample: fitted on all five conversations. Held out (LOCO): fitted on four, the floor chosen on those four
(the highest whose hit@5 drop is <= 0.01), applied to the fifth.

    .venv/bin/python bench/relevance_fit.py [LOCOMO.json] [--modes hybrid,keyword] [--limit N]

It prints the weights for solos_rank.RELEVANCE_WEIGHTS and the floors; bench/locomo.py prints the same figures
with the weights and floor the service carries.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import tempfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from locomo_data import DEFAULT_DATA, Conversation, agent_names, load_conversations  # noqa: E402
from locomo_service import READER, Service, prepare, write_turns  # noqa: E402

import solos_rank  # noqa: E402

DEPTH = 20  # the reranked head: every row there has the reranker's probability as its score
GOAL_REJECTION, GOAL_DROP = 0.9, 0.01
# Fine where rows of answerable questions sit (relevance of a few thousandths), coarse above.
FLOORS = tuple(sorted({round(x, 4) for x in np.concatenate([np.arange(0, 0.05, 0.0005), np.arange(0.05, 0.5, 0.01)])}))


@dataclass
class Asked:
    """One question put to one conversation's service, and what came back."""

    conversation: int  # whose service answered
    own: bool
    evidence: set[str]
    rows: list[dict]  # source (dia_id), score, relevance, coverage, found, cosine (hybrid); best first
    question: str = ""


def ask_rows(service: Service, question: str, mode: str) -> list[dict]:
    query = urllib.parse.urlencode(
        {"agent": READER, "q": question, "k": DEPTH, "scope": "shared", "tiers": "long", "min_relevance": 0}
        | ({"ranking": "keyword"} if mode == "keyword" else {})
    )
    for _ in range(3):  # a degraded answer (the query's embedding timed out on a busy machine) is asked again
        status, body = service.request("GET", f"/v1/recall?{query}")
        if status != 200:
            raise RuntimeError(f"recall answered {status}: {body}")
        if mode == "keyword" or not body["degraded"]:
            break
    words = solos_rank.query_words(question)
    reading = solos_rank.Question.of(question, words, [r["agent"] for r in body["results"]])
    found = solos_rank.list_coverage(reading, body["results"])
    return [
        {
            "source": r["source"],
            "score": r["score"],
            "relevance": r.get("relevance"),
            "coverage": solos_rank.question_coverage(reading, r["text"], r["agent"]),
            "found": found,
        }
        for r in body["results"]
    ]


def collect(conversations: list[Conversation], mode: str, python: str, serve_args: list[str]) -> list[Asked]:
    """Every conversation's service asked its own and every other conversation's questions."""
    asked = []
    for ci, conv in enumerate(conversations):
        agents = agent_names(conv.speakers + [t.speaker for t in conv.turns])
        with tempfile.TemporaryDirectory(prefix="relevance-") as tmp:
            service = Service(python, Path(tmp) / "solos.db", [*agents.values(), READER], serve_args)
            try:
                write_turns(service, conv.turns, agents)
                prepare(service, mode)
                for cj, other in enumerate(conversations):
                    for q in other.queries:
                        rows = ask_rows(service, q.question, mode)
                        asked.append(Asked(ci, cj == ci, set(q.evidence) if cj == ci else set(), rows, q.question))
            finally:
                service.close()
        print(f"  {mode}: conversation {ci + 1}/{len(conversations)} asked", file=sys.stderr)
    return asked


def add_cosines(conversations: list[Conversation], asked: list[Asked]) -> None:
    """Each row's vector-leg score as the service computes it: the cosine of the question and the row's embedded
    text (writer, topic, text), plus half the better of its topic neighbours' (solos_rank.NEIGHBOUR_WEIGHT)."""
    import solos_embed

    embedder = solos_embed.load_embedder(None)
    per_turn = []
    for conv in conversations:
        agents = agent_names(conv.speakers + [t.speaker for t in conv.turns])
        texts = [f"{agents[t.speaker]} ({t.date or f'session {t.session}'}): {t.fact}" for t in conv.turns]
        vectors = solos_embed.decode_vectors(embedder.embed(texts))
        per_turn.append(({t.dia_id: i for i, t in enumerate(conv.turns)}, vectors, conv.turns))
    questions = sorted({a.question for a in asked})
    question_vectors = dict(zip(questions, solos_embed.decode_vectors(embedder.embed(questions))))
    for a in asked:
        index, vectors, turns = per_turn[a.conversation]
        cosine = vectors @ question_vectors[a.question]
        for row in a.rows:
            i = index[row["source"]]
            around = [j for j in (i - 1, i + 1) if 0 <= j < len(turns) and turns[j].date == turns[i].date]
            best = max((float(cosine[j]) for j in around), default=0.0)
            row["cosine"] = float(cosine[i]) + solos_rank.NEIGHBOUR_WEIGHT * best


def logit(p: float) -> float:
    p = min(max(p, 1e-7), 1 - 1e-7)  # scores come rounded to 6 places
    return math.log(p / (1 - p))


def design(asked: list[Asked]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows (logit, coverage), labels, and weights (foreign questions as heavy, in all, as the own ones)."""
    own = sum(a.own for a in asked)
    foreign = max(len(asked) - own, 1)
    X, y, w = [], [], []
    for a in asked:
        for r in a.rows:
            X.append((logit(r["score"]), r["coverage"], r["found"], r.get("cosine", 0.0)))
            y.append(float(r["source"] in a.evidence))
            w.append(1.0 if a.own else own / foreign)
    return np.array(X), np.array(y), np.array(w)


def fit(asked: list[Asked], l2: float = 1e-3, steps: int = 100) -> tuple[float, ...]:
    """Weighted logistic regression by Newton steps: (bias, logit, coverage, list coverage weights)."""
    X, y, sample = design(asked)
    Z = np.hstack([np.ones((len(X), 1)), X])
    w = np.zeros(Z.shape[1])
    for _ in range(steps):
        p = 1 / (1 + np.exp(-Z @ w))
        g = Z.T @ (sample * (p - y)) + l2 * w
        H = (Z * (sample * p * (1 - p))[:, None]).T @ Z + l2 * np.eye(len(w))
        step = np.linalg.solve(H, g)
        w -= step
        if np.abs(step).max() < 1e-9:
            break
    return tuple(float(x) for x in w)


def relevance_of(weights: tuple[float, ...], row: dict) -> float:
    return solos_rank.calibrated_relevance(
        weights, logit(row["score"]), row["coverage"], row["found"], row.get("cosine", 0.0)
    )


def figures(asked: list[Asked], weights: tuple[float, ...] | None, floor: float) -> dict[str, float]:
    """Rejection of foreign questions, hit@5 of own ones at the floor and with none (weights None: the service's
    own relevance)."""
    rejected = foreign = hits = hits_plain = own = 0
    for a in asked:
        values = [r["relevance"] if weights is None else relevance_of(weights, r) for r in a.rows]
        kept = [r["source"] for r, v in zip(a.rows, values) if v >= floor]
        if a.own:
            own += 1
            hits += bool(set(kept[:5]) & a.evidence)
            hits_plain += bool({r["source"] for r in a.rows[:5]} & a.evidence)
        else:
            foreign += 1
            rejected += not kept
    return {
        "rejection": rejected / max(foreign, 1),
        "hit@5": hits / max(own, 1),
        "hit@5 no floor": hits_plain / max(own, 1),
        "drop": (hits_plain - hits) / max(own, 1),
    }


def choose_floor(asked: list[Asked], weights: tuple[float, ...] | None) -> float:
    """The highest floor whose hit@5 drop stays within GOAL_DROP."""
    return max(f for f in FLOORS if figures(asked, weights, f)["drop"] <= GOAL_DROP)


def held_out(
    asked: list[Asked], conversations: int, fixed: float | None = None
) -> tuple[dict[str, float], list[tuple]]:
    """LOCO: weights and floor (or the `fixed` floor) from four conversations' services and questions, figures on
    the fifth's service asked its own questions and the others'. Pooled over the folds; each fold's (weights,
    floor)."""
    pooled, folds = [], []
    for held in range(conversations):
        train = [a for a in asked if a.conversation != held]
        weights = fit(train)
        floor = choose_floor(train, weights) if fixed is None else fixed
        folds.append((weights, floor))
        pooled += [(a, weights, floor) for a in asked if a.conversation == held]
    totals = {"rejected": 0, "foreign": 0, "hits": 0, "plain": 0, "own": 0}
    for a, weights, floor in pooled:
        values = [relevance_of(weights, r) for r in a.rows]
        kept = [r["source"] for r, v in zip(a.rows, values) if v >= floor]
        if a.own:
            totals["own"] += 1
            totals["hits"] += bool(set(kept[:5]) & a.evidence)
            totals["plain"] += bool({r["source"] for r in a.rows[:5]} & a.evidence)
        else:
            totals["foreign"] += 1
            totals["rejected"] += not kept
    own = max(totals["own"], 1)
    return {
        "rejection": totals["rejected"] / max(totals["foreign"], 1),
        "hit@5": totals["hits"] / own,
        "hit@5 no floor": totals["plain"] / own,
        "drop": (totals["plain"] - totals["hits"]) / own,
    }, folds


def line(name: str, figure: dict[str, float]) -> str:
    return (
        f"{name:<58} rejection {figure['rejection']:.3f}  hit@5 {figure['hit@5']:.3f} "
        f"(no floor {figure['hit@5 no floor']:.3f}, drop {figure['drop']:+.3f})"
    )


def report(asked: list[Asked], mode: str, floor: float, conversations: int) -> None:
    """bench/locomo.py's block: the service's relevance at its default floor, in-sample and held out."""
    print(line(f"{mode}: service relevance, default floor {floor} (in-sample)", figures(asked, None, floor)))
    if conversations < 2:  # nothing to fit on once the one conversation is held out
        print(f"{mode}: held-out figures (LOCO) need two conversations or more")
        return
    print(
        line(
            f"{mode}: fit without it, default floor, held-out conversation (LOCO)",
            held_out(asked, conversations, floor)[0],
        )
    )
    loco, folds = held_out(asked, conversations)
    print(line(f"{mode}: fit and floor without it, held-out conversation (LOCO)", loco))
    print(f"{mode}: LOCO folds' floors " + ", ".join(f"{f:.3f}" for _, f in folds))
    print(f"goal: rejection >= {GOAL_REJECTION}, hit@5 drop <= {GOAL_DROP}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="LoCoMo JSON file (default: %(default)s)")
    parser.add_argument("--modes", default="hybrid,keyword", help="service modes (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N conversations (default: all)")
    parser.add_argument("--python", default=sys.executable, help="the service's interpreter (default: %(default)s)")
    parser.add_argument(
        "--cache", type=Path, help="keep what the services answered in this folder, and reuse it (default: none)"
    )
    args = parser.parse_args(argv)
    conversations = load_conversations(Path(args.data))[: args.limit or None]
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        serve_args = shlex.split("--model-dir off" if mode == "keyword" else "")
        cached = args.cache / f"{mode}-{len(conversations)}.json" if args.cache else None
        if cached is not None and cached.exists():
            order = [q.question for _ in conversations for other in conversations for q in other.queries]
            asked = [
                Asked(a["conversation"], a["own"], set(a["evidence"]), a["rows"], a.get("question") or asked_q)
                for a, asked_q in zip(json.loads(cached.read_text()), order)
            ]
        else:
            asked = collect(conversations, mode, args.python, serve_args)
            if cached is not None:
                cached.parent.mkdir(parents=True, exist_ok=True)
                cached.write_text(json.dumps([{**vars(a), "evidence": sorted(a.evidence)} for a in asked]))
        if mode != "keyword":
            add_cosines(conversations, asked)
        weights = fit(asked)
        floor = choose_floor(asked, weights)
        print(
            f"{mode}: weights (bias, logit, coverage, list coverage) = (" + ", ".join(f"{w:.4f}" for w in weights) + ")"
        )
        for f in sorted({0.01, 0.02, 0.05, 0.1, 0.2, 0.3, floor}):
            print(line(f"{mode}: in-sample fit, floor {f}", figures(asked, weights, f)))
        loco, folds = held_out(asked, len(conversations))
        print(line(f"{mode}: LOCO", loco))
        print(f"{mode}: in-sample floor (hit@5 drop <= {GOAL_DROP}) {floor}; LOCO folds' floors", [f for _, f in folds])
        print(line(f"{mode}: service's current relevance, floor {floor}", figures(asked, None, floor)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
