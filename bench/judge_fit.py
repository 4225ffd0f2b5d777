"""Fit the judge (solos_judge.py) and write models/judge/judge.json.

Fitted on the fleet domain's `fit` half and all five LoCoMo dev conversations (own and foreign questions),
recall's own candidates from bench/judge_data.py's cache: one logistic regression per mode (hybrid reads the
cosine; keyword, for a service without the embedder, does not) over solos_judge.features, standardised, by
Newton steps with a small L2. The two domains weigh the same in all (the fleet has 362 fitting questions to LoCoMo's
~2,000), so the fleet's near misses are not drowned; within a domain, rows count as they come, so the output
stays calibrated to each domain's mix. Deterministic: no sampling, no random start (seed fixed for any tie).

The floor it writes (`floor`, the value for solos_client.TURN_MIN_RELEVANCE) is chosen on the fitting data: the
highest one under which both domains keep at least KEEP of their answerable questions' answers (KEEP:
0.8; `--floor-without paraphrase`: not counting the fleet's paraphrases), so it rejects as many unanswerable
questions as that allows. It then rewrites solos_judge.JUDGE_SHA256.

    .venv/bin/python bench/judge_fit.py [--out models/judge/judge.json] [--data F] [--floor-without paraphrase]
        [--no-hash-update]

bench/judge_eval.py scores it on what this never saw (the fleet's `score` half, LoCoMo leave-one-out).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from judge_data import CACHE, load  # noqa: E402
from locomo_data import REPO  # noqa: E402

import solos_judge  # noqa: E402

TOP_ROWS = 5
L2 = 1.0  # on standardised features: enough to keep the weights sane where a feature separates a few rows
FLOORS = tuple(
    sorted({round(float(x), 4) for x in np.concatenate([np.arange(0.005, 0.1, 0.005), np.arange(0.1, 0.9, 0.01)])})
)


KEEP = 0.8  # the share of answerable questions that must keep their answer at the floor, in each domain


def rows_of(records: Sequence[dict], mode: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features, labels and weights (each domain weighing the same) of the rows the fit reads: each question's
    first TOP_ROWS in recall's order and its answer rows (the deep negatives are easy and would outvote the
    near misses that decide whether a question gets a row at all)."""
    X, y, domain = [], [], []
    for rec in records:
        if rec["mode"] != mode or not rec["rows"]:
            continue
        for rank, (f, row) in enumerate(zip(solos_judge.features(rec["question"], rec["rows"], mode), rec["rows"])):
            if rank >= TOP_ROWS and not row["label"]:
                continue
            X.append([f[name] for name in solos_judge.FEATURES[mode]])
            y.append(row["label"])
            domain.append(rec["domain"])
    d = np.array(domain)
    w = np.ones(len(d))
    for name in set(domain):
        w[d == name] = len(d) / (2 * (d == name).sum()) if len(set(domain)) == 2 else 1.0
    return np.array(X, dtype=float), np.array(y, dtype=float), w


def fit(records: Sequence[dict], mode: str, l2: float = L2) -> dict:
    """One mode's model as judge.json holds it: features, weights (bias first), means, scales."""
    X, y, sample = rows_of(records, mode)
    means, scales = X.mean(axis=0), X.std(axis=0)
    scales[scales < 1e-9] = 1.0
    Z = np.hstack([np.ones((len(X), 1)), (X - means) / scales])
    w = np.zeros(Z.shape[1])
    penalty = np.full(len(w), l2)
    penalty[0] = 0.0
    for _ in range(100):
        p = 1 / (1 + np.exp(-np.clip(Z @ w, -30, 30)))
        g = Z.T @ (sample * (p - y)) + penalty * w
        H = (Z * (sample * p * (1 - p))[:, None]).T @ Z + np.diag(penalty + 1e-9)
        step = np.linalg.solve(H, g)
        w -= step
        if np.abs(step).max() < 1e-10:
            break
    return {
        "features": list(solos_judge.FEATURES[mode]),
        "weights": [round(float(x), 6) for x in w],
        "means": [round(float(x), 6) for x in means],
        "scales": [round(float(x), 6) for x in scales],
    }


def judge_of(models: dict[str, dict]) -> solos_judge.Judge:
    """A Judge from fitted models, without a file."""
    built = {
        mode: solos_judge.Model(mode, tuple(m["features"]), tuple(m["weights"]), tuple(m["means"]), tuple(m["scales"]))
        for mode, m in models.items()
    }
    return solos_judge.Judge(built, "0" * 64)


def question_scores(records: Sequence[dict], score: Callable[[dict], list[float]]) -> list[tuple[dict, list[float]]]:
    return [(rec, score(rec)) for rec in records]


def floor_figures(scored: Sequence[tuple[dict, list[float]]], floor: float) -> tuple[float, float]:
    """(share of unanswerable questions with no row at or above the floor, share of answerable ones keeping an
    answer row at or above it)."""
    rejected = unanswerable = kept = answerable = 0
    for rec, probs in scored:
        if rec["answerable"]:
            answerable += 1
            kept += any(p >= floor and r["label"] for p, r in zip(probs, rec["rows"]))
        else:
            unanswerable += 1
            rejected += all(p < floor for p in probs)
    return rejected / max(unanswerable, 1), kept / max(answerable, 1)


def choose_floor(
    by_domain: Sequence[Sequence[tuple[dict, list[float]]]], floors: Sequence[float] = FLOORS, keep: float = KEEP
) -> float:
    """The highest floor under which every domain still keeps `keep` of its answerable questions' answers: the
    most rejection that costs no more answers than that (a dropped answer is memory lost; a near miss let
    through is a row the agent can weigh). The lowest floor when none keeps that many."""
    keeping = [f for f in floors if all(floor_figures(scored, f)[1] >= keep for scored in by_domain)]
    return max(keeping, default=min(floors))


def fitted_floor(
    judge: solos_judge.Judge, records: Sequence[dict], without: Collection[str] = (), mode: str = "hybrid"
) -> float:
    """The floor the rule chooses for `judge` on its fitting records of `mode`, not counting the answers of the
    question kinds in `without`."""
    return choose_floor(
        [
            [
                (r, judge.judge(r["question"], r["rows"], mode).probabilities)
                for r in records
                if r["mode"] == mode and r["domain"] == d and r["kind"] not in without
            ]
            for d in ("fleet", "locomo")
        ]
    )


def fitting_records(records: Sequence[dict]) -> list[dict]:
    return [r for r in records if r["domain"] == "locomo" or r["group"] == "fit"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=solos_judge.JUDGE_PATH, help="the weights file (default: %(default)s)"
    )
    parser.add_argument("--data", type=Path, default=CACHE, help=f"judge_data.py's cache (default: {CACHE})")
    parser.add_argument(
        "--floor-without",
        default="",
        help="question kinds (comma-separated, e.g. paraphrase) whose answers the floor rule does not count: a "
        "paraphrase's answer that no row shares a word with is retrieval's to find (default: every kind counts)",
    )
    parser.add_argument("--no-hash-update", action="store_true", help="leave solos_judge.JUDGE_SHA256 as it is")
    args = parser.parse_args(argv)
    records = fitting_records(load(args.data))
    models = {mode: fit(records, mode) for mode in solos_judge.MODES}
    judge = judge_of(models)
    floor = fitted_floor(judge, records, {k.strip() for k in args.floor_without.split(",") if k.strip()})
    domains = [
        [
            (r, judge.judge(r["question"], r["rows"], "hybrid").probabilities)
            for r in records
            if r["mode"] == "hybrid" and r["domain"] == d
        ]
        for d in ("fleet", "locomo")
    ]
    doc = {
        "format": solos_judge.JUDGE_FORMAT,
        "fitted_by": "bench/judge_fit.py",
        "fitted_on": "bench/data/fleet split=fit; LoCoMo dev conversations 1-5 (own and foreign questions)",
        "floor": floor,
        "models": models,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    raw = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
    args.out.write_bytes(raw)
    digest = hashlib.sha256(raw).hexdigest()
    for mode, m in models.items():
        print(f"{mode}: " + ", ".join(f"{n} {w:+.3f}" for n, w in zip(["bias", *m["features"]], m["weights"])))
    for name, scored in zip(("fleet", "locomo"), domains):
        rejected, kept = floor_figures(scored, floor)
        print(
            f"floor {floor}: {name} (in-sample) rejects {rejected:.2f} of unanswerable, keeps {kept:.2f} of answerable"
        )
    print(f"{args.out}: sha256 {digest}")
    if not args.no_hash_update:
        source = REPO / "solos_judge.py"
        text = source.read_text()
        updated = re.sub(r'^JUDGE_SHA256 = "[0-9a-f]{64}"$', f'JUDGE_SHA256 = "{digest}"', text, count=1, flags=re.M)
        if updated != text:
            source.write_text(updated)
            print(f"solos_judge.JUDGE_SHA256 set to {digest[:12]}…")
    return 0


if __name__ == "__main__":
    sys.exit(main())
