"""Today's `relevance` beside the judge (solos_judge.py), both domains, on data the fit never saw.

- fleet: the judge fitted as bench/judge_fit.py fits it (fleet `fit` half + the five LoCoMo dev
  conversations), scored on the fleet's `score` half (other teams, people, hosts and incidents);
- LoCoMo: leave one conversation out: fitted on the fleet's `fit` half and four conversations (their own
  questions and foreign ones, none of the fifth's questions), scored on the fifth's memory asked its own
  questions and a sample of the others' (foreign: the unanswerable role).

Figures, per domain and mode, from bench/judge_data.py's cached candidates (k=20, min_relevance 0):

- AUROC: the best answer row's probability (0 when recall's 20 missed every answer) against the unanswerable
  (foreign) questions' top row;
- at a floor: `rejected`, the unanswerable questions with no row at or above it; `kept`, the answerable ones
  with an answer row at or above it. Two floors: the one chosen on the fitting data (for today's relevance
  its documented floor; for the judge the floor its fit chose, the one solos_client.TURN_MIN_RELEVANCE would
  carry), and the best single floor on the scored data itself (optimistic: chosen on what it scores);
- hit@5 with no floor, in recall's order and reordered by the judge (fleet: also the paraphrases');
- ECE over every candidate row: 10 equal-width bins, |mean probability - share answering| by rows;
- the judge's cost per row (features and logistic, this interpreter, one thread).

    .venv/bin/python bench/judge_eval.py [--modes hybrid,keyword]

The judge's targets: fleet AUROC >= 0.90, at the floor >= 0.9 rejected and >= 0.8 kept; LoCoMo AUROC >= 0.85;
ECE <= 0.10.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from judge_data import CACHE, load  # noqa: E402
from judge_fit import (  # noqa: E402
    FLOORS,
    choose_floor,
    fit,
    fitted_floor,
    fitting_records,
    floor_figures,
    judge_of,
)

import solos_judge  # noqa: E402
import solos_rank  # noqa: E402

Scored = list[tuple[dict, list[float]]]


def auroc(positives: Sequence[float], negatives: Sequence[float]) -> float:
    """The chance a positive outscores a negative (ties half)."""
    pos, neg = np.asarray(positives), np.sort(np.asarray(negatives))
    if not len(pos) or not len(neg):
        return float("nan")
    below = np.searchsorted(neg, pos, side="left")
    ties = np.searchsorted(neg, pos, side="right") - below
    return float((below + 0.5 * ties).sum() / (len(pos) * len(neg)))


def separation(scored: Scored) -> float:
    positives = [
        max((p for p, r in zip(probs, rec["rows"]) if r["label"]), default=0.0)
        for rec, probs in scored
        if rec["answerable"]
    ]
    negatives = [max(probs, default=0.0) for rec, probs in scored if not rec["answerable"]]
    return auroc(positives, negatives)


def hit_at(scored: Scored, k: int = 5, kinds: set[str] | None = None, reorder: bool = True) -> float:
    hits = asked = 0
    for rec, probs in scored:
        if not rec["answerable"] or (kinds and rec["kind"] not in kinds):
            continue
        order = sorted(range(len(probs)), key=lambda i: -probs[i]) if reorder else range(len(probs))
        asked += 1
        hits += any(rec["rows"][i]["label"] for i in list(order)[:k])
    return hits / max(asked, 1)


def ece(scored: Scored, bins: int = 10) -> float:
    p = np.array([x for _, probs in scored for x in probs])
    y = np.array([r["label"] for rec, _ in scored for r in rec["rows"]])
    which = np.minimum((p * bins).astype(int), bins - 1)
    return float(
        sum(
            abs(p[which == b].mean() - y[which == b].mean()) * (which == b).sum()
            for b in range(bins)
            if (which == b).any()
        )
        / len(p)
    )


def best_floor(scored: Scored) -> float:
    return choose_floor([scored], FLOORS + tuple(np.round(np.arange(0.0005, 0.005, 0.0005), 4)))


def relevance_scored(records: Sequence[dict]) -> Scored:
    return [(rec, [float(r["relevance"] or 0.0) for r in rec["rows"]]) for rec in records]


def folds(mode_records: list[dict]) -> Iterator[tuple[str, list[dict], list[dict]]]:
    """(domain, fitting records, held-out records) of each fold: the fleet's halves, then LoCoMo leave one
    conversation out (the held-out conversation's questions asked elsewhere are in no fit)."""
    fleet_fit = [r for r in mode_records if r["domain"] == "fleet" and r["group"] == "fit"]
    locomo = [r for r in mode_records if r["domain"] == "locomo"]
    yield (
        "fleet",
        fitting_records(mode_records),
        [r for r in mode_records if r["domain"] == "fleet" and r["group"] == "score"],
    )
    for c in sorted({r["group"] for r in locomo}):
        held = [r for r in locomo if r["group"] == c]
        held_ids = {r["qid"].split("/")[0] for r in held if r["kind"] != "foreign"}
        yield (
            "locomo",
            fleet_fit + [r for r in locomo if r["group"] != c and r["qid"].split("/")[0] not in held_ids],
            held,
        )


def fitted(train: list[dict], mode: str, without: Collection[str] = ()) -> tuple[solos_judge.Judge, float]:
    """The judge fitted on `train` and the floor chosen on it, as judge_fit.py chooses (`without`: its
    --floor-without)."""
    judge = judge_of({mode: fit(train, mode)})
    return judge, fitted_floor(judge, train, without, mode)


def held_out(
    records: list[dict], mode: str, without: Collection[str] = ()
) -> tuple[dict[str, Scored], dict[str, list[float]], float]:
    """The judge's probabilities on held-out data per domain, the fitted floors, and the cost per row (s)."""
    scored: dict[str, Scored] = {"fleet": [], "locomo": []}
    floors: dict[str, list[float]] = {"fleet": [], "locomo": []}
    elapsed = rows = 0.0
    for domain, train, held in folds([r for r in records if r["mode"] == mode]):
        judge, floor = fitted(train, mode, without)
        started = time.perf_counter()
        scored[domain] += [(r, judge.judge(r["question"], r["rows"], mode).probabilities) for r in held]
        elapsed += time.perf_counter() - started
        rows += sum(len(r["rows"]) for r in held)
        floors[domain].append(floor)
    return scored, floors, elapsed / max(rows, 1)


def column(scored: Scored, floors: Sequence[float], groups: list[int] | None, paraphrase: bool, reorder: bool) -> dict:
    """One side's figures: AUROC, the fitted floor's rejected/kept (per fold when several), the best floor's,
    hit@5 and ECE."""
    if groups is None:
        rejected, kept = floor_figures(scored, floors[0])
    else:  # each held-out conversation at its own fold's floor
        parts = [
            floor_figures([s for s, g in zip(scored, groups) if g == c], f) for c, f in zip(sorted(set(groups)), floors)
        ]
        rejected, kept = (float(np.mean([p[i] for p in parts])) for i in (0, 1))
    best = best_floor(scored)
    best_rejected, best_kept = floor_figures(scored, best)
    out = {
        "AUROC": separation(scored),
        "floor": f"{np.mean(floors):.3f}" if len(set(floors)) == 1 else f"{min(floors):.3f}-{max(floors):.3f}",
        "rejected at floor": rejected,
        "kept at floor": kept,
        "best floor": f"{best:.4f}",
        "rejected at best": best_rejected,
        "kept at best": best_kept,
        "hit@5": hit_at(scored, reorder=reorder),
        "ECE": ece(scored),
    }
    if paraphrase:
        out["paraphrase hit@5"] = hit_at(scored, kinds={"paraphrase"}, reorder=reorder)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="hybrid,keyword", help="modes to score (default: hybrid,keyword)")
    parser.add_argument("--data", type=Path, default=CACHE, help=f"judge_data.py's cache (default: {CACHE})")
    parser.add_argument(
        "--floor-without", default="", help="judge_fit.py's --floor-without for each fold's floor (default: none)"
    )
    args = parser.parse_args(argv)
    records = load(args.data)
    without = {k.strip() for k in args.floor_without.split(",") if k.strip()}
    for mode in args.modes.split(","):
        scored, floors, per_row = held_out(records, mode, without)
        table: dict[str, dict[str, dict]] = {}
        for domain in ("fleet", "locomo"):
            judged = scored[domain]
            groups = [rec["group"] for rec, _ in judged] if domain == "locomo" else None
            recs = [rec for rec, _ in judged]
            table[domain] = {
                "relevance": column(
                    relevance_scored(recs),
                    [solos_rank.RELEVANCE_FLOOR] * len(floors[domain]),
                    groups,
                    domain == "fleet",
                    False,
                ),
                "judge": column(judged, floors[domain], groups, domain == "fleet", True),
            }
        answerable = {d: sum(r["answerable"] for r, _ in scored[d]) for d in scored}
        print(
            f"\n{mode}: held out (fleet score half: {len(scored['fleet'])} questions, "
            f"{answerable['fleet']} answerable; "
            f"LoCoMo leave-one-out: {len(scored['locomo'])}, {answerable['locomo']} own)"
        )
        names = list(table["fleet"]["relevance"])
        print(f"{'':22} {'fleet today':>12} {'fleet judge':>12} {'LoCoMo today':>13} {'LoCoMo judge':>13}")
        for name in names:
            cells = [table[d][s].get(name, "") for d in ("fleet", "locomo") for s in ("relevance", "judge")]
            print(f"{name:22} " + " ".join(f"{c:>12.3f}" if isinstance(c, float) else f"{c:>12}" for c in cells))
        print(f"judge cost: {per_row * 1e6:.1f} µs per row (features + logistic, one thread)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
