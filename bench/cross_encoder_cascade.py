#!/usr/bin/env python3
"""A cascade for the judge, held out: skip the cross-encoder when the features judge is already sure.

    .venv/bin/python bench/cross_encoder_cascade.py [--held-out 4] [--calibrate 3] [--tolerance 0.005]

The shipped combination (models/judge/cross-encoder.json: the cross-encoder over recall's first `rows` rows,
combined with the features judge) costs one model run a recall. A cascade runs the model only when the
features judge's probability for the head (its highest over the first `rows` rows, what decides whether any
row passes the floor; recall's first row alone measured worse on the fleet) lies inside a band around the floor;
outside it (clearly nothing, or clearly an answer) the features judge's probabilities stand for every row.

The band is chosen on the calibration records only (those cross_encoder_swap.py fits the combination on,
neither model trained on them): the widest skip (most questions skipped) under which the calibration AUROC of
each domain stays within --tolerance of the full combination's there. Then the held-out sets (the fleet's score
half on its own rows, the held-out LoCoMo conversation) are scored with that band: AUROC, rejected / kept at
the floor, the share of questions that skipped the model. The grid of bands on the held-out sets is printed
too, as the trade, not as a choice. Asserts nothing.

Needs the service's .venv (numpy, onnxruntime, tokenizers) and bench/judge_data.py's cache; not torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cross_encoder import split  # noqa: E402
from cross_encoder_swap import cascaded, evidence_of, judged  # noqa: E402
from judge_data import CACHE, load  # noqa: E402
from judge_eval import ece, separation  # noqa: E402
from judge_fit import floor_figures  # noqa: E402

import solos_cross_encoder  # noqa: E402
import solos_judge  # noqa: E402
import solos_rank  # noqa: E402

LOWS = (0.0, 0.005, 0.01, 0.02, 0.03, 0.05)
HIGHS = (1.01, 0.99, 0.98, 0.95, 0.9, 0.8, 0.7, 0.5)


def served(
    records: list[dict],
    feats: list[list[float]],
    logits: list[list[float]],
    beta: tuple,
    band: tuple,
    evidence: list[list[dict]] | None = None,
) -> tuple[list[tuple[dict, list[float]]], float]:
    """Each record's probabilities under the cascade with `band` (lo, hi), and the share that skipped the model
    (`evidence`: the rows' features, for a combination that reads them)."""
    scored, skipped = [], 0
    for i, (r, f, x) in enumerate(zip(records, feats, logits)):
        probabilities, skip = cascaded(beta, x, f, band, evidence[i] if evidence else None)
        scored.append((r, probabilities))
        skipped += skip
    return scored, skipped / max(len(records), 1)


def figures(scored: list[tuple[dict, list[float]]], floor: float) -> dict[str, float]:
    rejected, kept = floor_figures(scored, floor)
    return {"auroc": separation(scored), "rejected": rejected, "kept": kept, "ece": ece(scored)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held-out", type=int, default=4, help="the LoCoMo conversation no fit sees (default: 4)")
    parser.add_argument("--calibrate", type=int, default=3, help="the conversation the combination fits on (3)")
    parser.add_argument("--data", type=Path, default=CACHE, help=f"judge_data.py's cache (default: {CACHE})")
    parser.add_argument("--tolerance", type=float, default=0.005, help="calibration AUROC given up, per domain")
    args = parser.parse_args(argv)
    meta_doc = json.loads(solos_cross_encoder.META_PATH.read_text())
    meta = solos_cross_encoder.Meta.parse(solos_cross_encoder.META_PATH.read_bytes())
    session = solos_cross_encoder.Session(str(solos_cross_encoder.META_PATH.parent / meta.model), meta.max_len)
    features = solos_judge.load(cross=None)
    beta, rows, floor = meta.beta, meta.rows, solos_rank.RELEVANCE_FLOOR
    print(f"shipped {meta_doc['model']} at {rows} x {meta.max_len}, combination {beta}, floor {floor}")
    roles = split(load(args.data), args.held_out, args.calibrate)
    sets = {}
    for role in ("calibrate", "fleet", "locomo"):
        records = [r for r in roles[role] if r["rows"]]
        feats, logits = judged(session, features, records, rows)
        sets[role] = (records, feats, logits, evidence_of(records, rows) if meta.evidence else None)

    def by_domain(role: str, band: tuple) -> dict[str, tuple[dict, float]]:
        records, feats, logits, read = sets[role]
        out = {}
        domains = ("fleet", "locomo") if role == "calibrate" else (role,)
        for d in domains:
            picked = [i for i, r in enumerate(records) if r["domain"] == d]
            scored, skip = served(
                [records[i] for i in picked],
                [feats[i] for i in picked],
                [logits[i] for i in picked],
                beta,
                band,
                [read[i] for i in picked] if read else None,
            )
            out[d] = (figures(scored, floor), skip)
        return out

    full = (-1.0, 2.0)  # nothing skipped: the shipped combination
    never = (2.0, 2.0)  # everything skipped: the features judge alone
    base_cal = by_domain("calibrate", full)
    best, best_skip = full, 0.0
    for lo in LOWS:
        for hi in HIGHS:
            if hi <= lo:
                continue
            cal = by_domain("calibrate", (lo, hi))
            if all(cal[d][0]["auroc"] >= base_cal[d][0]["auroc"] - args.tolerance for d in cal):
                skip = sum(s for _, s in cal.values()) / len(cal)
                if skip > best_skip:
                    best, best_skip = (lo, hi), skip
    print(
        "calibration, full combination: "
        + ", ".join(f"{d} AUROC {f['auroc']:.3f}" for d, (f, _) in base_cal.items())
        + f"; chosen band {best} skips {best_skip:.3f} there"
    )
    for label, band in (("features judge alone", never), ("combination (shipped)", full), (f"cascade {best}", best)):
        for role in ("fleet", "locomo"):
            f, skip = by_domain(role, band)[role]
            print(
                f"held out, {role:6} {label:28}: AUROC {f['auroc']:.3f}, rejected {f['rejected']:.3f} "
                f"kept {f['kept']:.3f} at {floor}, ECE {f['ece']:.3f}, model skipped {skip:.3f}"
            )
    print("held-out grid (the trade, not a choice): lo hi | fleet AUROC skip | LoCoMo AUROC skip")
    for lo in LOWS:
        for hi in HIGHS:
            if hi <= lo:
                continue
            fl, lc = by_domain("fleet", (lo, hi))["fleet"], by_domain("locomo", (lo, hi))["locomo"]
            print(f"  {lo:5.3f} {hi:4.2f} | {fl[0]['auroc']:.3f} {fl[1]:.3f} | {lc[0]['auroc']:.3f} {lc[1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
