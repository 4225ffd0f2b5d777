#!/usr/bin/env python3
"""Where the judge's AUROC is lost, held out, both domains, and what reading more rows would buy.

    .venv/bin/python bench/judge_loss.py [--held-out 4] [--calibrate 3] [--rows 4,6,8] [--data F] [--combination-grid]

On the sets cross_encoder_swap.py scores the shipped combination on (bench/cross_encoder.py's `split`: the
fleet's `score` half on its own half's rows, LoCoMo's held-out conversation with foreign questions as the
unanswerable role), with the shipped files (models/judge/judge.json, the cross-encoder and its meta, cascade
included):

1. Where the answers are. Of the answerable questions: how many have an answer row in the first `rows` rows
   the cross-encoder reads, in rows 5-20, nowhere in the 20. AUROC of the shipped combination overall; on the
   questions whose answer is in the first rows only (what a perfect retriever would leave the judge); the
   ceiling of a perfect judge over the first N rows (an answer row there 1, every other row there 0, rows
   past N keeping the shipped probability), N = 4 (today's rows) and the others asked; and the share of
   the AUROC's lost pairs (an unanswerable question's top row at or above an answerable one's best answer)
   by where the answerable question's answer is.
2. The unanswerable questions whose top row scores high (at or above the floor): by the question's label
   (the fleet: what the near miss changes, read from its wording: an incident's number, a service's port, a
   period, a person, another scope; and whether the top row is the near-miss fact its label names; LoCoMo:
   the foreign question's category in its own conversation) and by where that top row is (a row the model
   read, or one past it the features judge alone scored).
3. Reading more rows only when the cascade runs the model anyway (the band is decided on the features judge's
   best of the first `meta.rows`, as served; then the model reads N rows): AUROC, rejected / kept at the
   floor, ECE, with the shipped combination's coefficients and refitted for N on the calibration records
   (cross_encoder_swap.calibrated); hit@1, hit@5 and MRR in recall's order and with the judge reordering the
   rows it read (the rest below them, in recall's order); and the model's CPU (thread time) a recall that
   runs it.
4. With --combination-grid: the combination's weights (a on the cross-encoder's logit, b on the features
   judge's) over a grid, the intercept and the cascade as shipped: AUROC on the calibration records by domain
   (where a choice would be made) and held out.

Asserts nothing. Needs the service's .venv and bench/judge_data.py's cache; about 2 minutes on a loaded host.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cross_encoder import split  # noqa: E402
from cross_encoder_swap import calibrated, combine, evidence_of  # noqa: E402
from judge_data import CACHE, fleet_data, load  # noqa: E402
from judge_eval import ece, separation  # noqa: E402
from judge_fit import floor_figures  # noqa: E402

import solos_cross_encoder  # noqa: E402
import solos_judge  # noqa: E402
import solos_rank  # noqa: E402

Scored = list[tuple[dict, list[float]]]
BUCKETS = ("first rows", "rows 5-20", "not in 20")
GRID_A = (0.2, 0.39, 0.6, 0.8, 1.0, 1.5)  # --combination-grid: the cross-encoder logit's weight (shipped 0.39)
GRID_B = (0.4, 0.81, 1.2)  # and the features judge logit's (shipped 0.81)


def first_answer(rec: dict) -> int | None:
    return next((i for i, r in enumerate(rec["rows"]) if r["label"]), None)


def bucket(rec: dict, rows: int) -> str:
    at = first_answer(rec)
    return BUCKETS[2] if at is None else BUCKETS[0] if at < rows else BUCKETS[1]


def best_answer(rec: dict, probs: list[float]) -> float:
    return max((p for p, r in zip(probs, rec["rows"]) if r["label"]), default=0.0)


def oracle(scored: Scored, n: int) -> Scored:
    """A perfect judge over the first n rows: an answer row there 1, any other 0; rows past n as they were."""
    return [(rec, [float(r["label"]) for r in rec["rows"][:n]] + probs[n:]) for rec, probs in scored]


def lost_pairs(scored: Scored, rows: int) -> dict[str, float]:
    """The AUROC's lost pairs (an unanswerable top row above an answerable question's best answer, ties half),
    as shares of all pairs, by where the answerable question's first answer is."""
    negatives = [max(p, default=0.0) for rec, p in scored if not rec["answerable"]]
    answerable = [(rec, p) for rec, p in scored if rec["answerable"]]
    out = dict.fromkeys(BUCKETS, 0.0)
    total = len(answerable) * len(negatives)
    for rec, probs in answerable:
        pos = best_answer(rec, probs)
        out[bucket(rec, rows)] += sum(1.0 if n > pos else 0.5 if n == pos else 0.0 for n in negatives)
    return {k: v / max(total, 1) for k, v in out.items()}


def served(
    meta, beta: tuple, feats: list[float], logits: list[float], evidence: list[dict] | None = None
) -> tuple[list[float], bool]:
    """The judge as served with the model reading len(logits) rows: the cascade decided on the features judge's
    best of the first meta.rows (solos_cross_encoder.Meta.sure), as today (`evidence`: the rows' features, for a
    combination that reads them)."""
    if meta.sure(feats) is not None:
        return list(feats), True
    return combine(beta, logits, feats, evidence), False


def reordered(rec: dict, probs: list[float], n: int) -> list[int]:
    """Row indices with the first n ordered by the judge (stable), the rest in recall's order."""
    head = sorted(range(min(n, len(probs))), key=lambda i: -probs[i])
    return head + list(range(len(head), len(probs)))


def ranking(scored: Scored, n: int | None) -> dict[str, float]:
    """hit@1, hit@5, MRR of the answerable questions; n: the judge reorders the first n rows (None: recall's)."""
    hit1 = hit5 = rr = asked = 0.0
    for rec, probs in scored:
        if not rec["answerable"]:
            continue
        order = reordered(rec, probs, n) if n else list(range(len(probs)))
        labels = [rec["rows"][i]["label"] for i in order]
        asked += 1
        hit1 += bool(labels[:1] and labels[0])
        hit5 += any(labels[:5])
        at = next((i for i, y in enumerate(labels) if y), None)
        rr += 0.0 if at is None else 1.0 / (at + 1)
    return {"hit@1": hit1 / max(asked, 1), "hit@5": hit5 / max(asked, 1), "MRR": rr / max(asked, 1)}


NEAR_MISSES = (  # what a fleet near miss changes, read from its wording (first match)
    (re.compile(r"\bINC-\d+"), "an incident by its number"),
    (re.compile(r"\bport\b", re.I), "another service's port"),
    (
        re.compile(
            r"\b(?:Q[1-4]|H[12]|January|February|March|April|May|June|July|August|September|October|November"
            r"|December|Black Friday)\b|\b20\d\d\b"
        ),
        "another period (quarter, month, year)",
    ),
    (re.compile(r"\b[A-Z][a-z\u00e0-\u00ff]+ (?:de )?[A-Z][a-z\u00e0-\u00ff]+\b"), "another person's preference"),
)


def near_miss(question: str) -> str:
    return next((label for pattern, label in NEAR_MISSES if pattern.search(question)), "another scope or thing")


def paired_interval(a: Scored, b: Scored, draws: int = 1000, seed: int = 41) -> tuple[float, float]:
    """The 90% interval of AUROC(b) - AUROC(a) over the same questions, a paired bootstrap over questions."""
    pick = random.Random(seed)
    diffs = []
    for _ in range(draws):
        idx = [pick.randrange(len(a)) for _ in range(len(a))]
        diffs.append(separation([b[i] for i in idx]) - separation([a[i] for i in idx]))
    diffs.sort()
    return diffs[int(0.05 * draws)], diffs[int(0.95 * draws) - 1]


def fleet_questions() -> dict[str, dict]:
    return {q["id"]: q for q in fleet_data()[1]}


def high_kinds(scored: Scored, rows: int, floor: float, own_kind: dict[str, str]) -> tuple[Counter, Counter, int]:
    """Unanswerable questions whose top row is at or above the floor: counted by label and by where the top
    row is; and how many unanswerable questions there are."""
    labels: Counter = Counter()
    where: Counter = Counter()
    questions = fleet_questions()
    unanswerable = 0
    for rec, probs in scored:
        if rec["answerable"]:
            continue
        unanswerable += 1
        top = max(range(len(probs)), key=probs.__getitem__, default=None)
        if top is None or probs[top] < floor:
            continue
        if rec["domain"] == "fleet":
            q = questions.get(rec["qid"], {})
            near = "top row: its near-miss fact" if rec["rows"][top]["row_id"] == q.get("near_miss") else "another row"
            labels[f"{near_miss(rec['question'])}; {near}"] += 1
        else:
            labels[own_kind.get(rec["qid"], "?")] += 1
        where["a row the model read" if top < rows else "a row past them (features judge)"] += 1
    return labels, where, unanswerable


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held-out", type=int, default=4, help="the LoCoMo conversation no fit sees (default: 4)")
    parser.add_argument("--calibrate", type=int, default=3, help="the conversation the combination fits on (3)")
    parser.add_argument("--rows", default="4,6,8", help="rows the model reads when it runs (default: 4,6,8)")
    parser.add_argument("--data", type=Path, default=CACHE, help=f"judge_data.py's cache (default: {CACHE})")
    parser.add_argument(
        "--combination-grid", action="store_true", help="also AUROC over a grid of the combination's a and b"
    )
    args = parser.parse_args(argv)
    meta = solos_cross_encoder.Meta.parse(solos_cross_encoder.META_PATH.read_bytes())
    session = solos_cross_encoder.Session(str(solos_cross_encoder.META_PATH.parent / meta.model), meta.max_len)
    features = solos_judge.load(cross=None)
    shipped, floor, head = meta.beta, solos_rank.RELEVANCE_FLOOR, meta.rows
    records = load(args.data)
    roles = split(records, args.held_out, args.calibrate)
    own_kind = {r["qid"]: r["kind"] for r in records if r["domain"] == "locomo" and r["kind"] != "foreign"}
    widths = [int(x) for x in args.rows.split(",")]
    print(
        f"shipped: {meta.model} at {head} x {meta.max_len}, cascade {meta.skip_below}-{meta.skip_above}, floor {floor}"
    )
    sets = {role: [r for r in roles[role] if r["rows"]] for role in ("calibrate", "fleet", "locomo")}
    feats = {
        role: [features.judge(r["question"], r["rows"], "hybrid").probabilities for r in recs]
        for role, recs in sets.items()
    }
    read = {role: evidence_of(recs, None) if meta.evidence else [None] * len(recs) for role, recs in sets.items()}
    logits: dict[tuple[str, int], list[list[float]]] = {}
    cpu: dict[int, list[float]] = {n: [] for n in widths}
    for n in widths:
        for role, recs in sets.items():
            out = []
            for r in recs:
                texts = [solos_cross_encoder.pair_text(x) for x in r["rows"][:n]]
                started = time.thread_time()
                out.append(session.logits(r["question"], texts))
                cpu[n].append(time.thread_time() - started)
            logits[role, n] = out
    judged: dict[tuple[str, str], Scored] = {}
    skipped: dict[tuple[str, str], float] = {}
    variants: dict[str, tuple] = {"features judge alone": (None, 0)}
    for n in widths:
        variants[f"model reads {n}" + (" (shipped)" if n == head else ", shipped a/b/c")] = (shipped, n)
        if n != head:
            fitted = calibrated(session, features, roles, n, meta.evidence)
            variants[f"model reads {n}, a/b/c refitted"] = (fitted.beta, n)
    for name, (beta, n) in variants.items():
        for role in ("fleet", "locomo"):
            out, skips = [], 0
            for r, f, x, e in zip(
                sets[role], feats[role], logits[role, n] if n else [[]] * len(sets[role]), read[role]
            ):
                probs, skip = (list(f), True) if beta is None else served(meta, beta, f, x, e)
                out.append((r, probs))
                skips += skip
            judged[name, role] = out
            skipped[name, role] = skips / max(len(out), 1)

    shipped_name = next(k for k in variants if k.endswith("(shipped)"))
    for role, title in (("fleet", "fleet score half, own rows"), ("locomo", f"LoCoMo conversation {args.held_out}")):
        scored = judged[shipped_name, role]
        answerable = [rec for rec, _ in scored if rec["answerable"]]
        where = Counter(bucket(rec, head) for rec in answerable)
        print(f"\n== {title}: {len(scored)} questions, {len(answerable)} answerable ==")
        print(
            f"answer in the first {head} rows {where[BUCKETS[0]]}, in rows {head + 1}-20 {where[BUCKETS[1]]}, "
            f"not in 20 {where[BUCKETS[2]]}"
        )
        kinds = sorted({r["kind"] for r in answerable})
        print(
            "  by kind (first rows / 5-20 / not in 20): "
            + ", ".join(
                f"{k} "
                + "/".join(str(sum(bucket(r, head) == b for r in answerable if r["kind"] == k)) for b in BUCKETS)
                for k in kinds
            )
        )
        in_head = [(rec, p) for rec, p in scored if not rec["answerable"] or bucket(rec, head) == BUCKETS[0]]
        print(
            f"AUROC, shipped: {separation(scored):.3f}; answerable questions with an answer in the first {head} "
            f"only: {separation(in_head):.3f}"
        )
        print(
            "ceiling, a perfect judge over the first N rows (the rest as shipped): "
            + ", ".join(f"N={n} {separation(oracle(scored, n)):.3f}" for n in sorted({head, *widths, 20}))
        )
        lost = lost_pairs(scored, head)
        print(
            f"lost pairs (1 - AUROC = {sum(lost.values()):.3f}) by the answerable question's answer: "
            + ", ".join(f"{b} {v:.3f}" for b, v in lost.items())
        )
        labels, at, unanswerable = high_kinds(scored, head, floor, own_kind)
        print(
            f"unanswerable with a top row at or above {floor}: {sum(labels.values())} of {unanswerable}; where: "
            + ", ".join(f"{k} {v}" for k, v in at.most_common())
        )
        for label, count in labels.most_common():
            print(f"  {count:3}  {label}")
    print("\n== the model reading more rows when the cascade runs it (held out) ==")
    print(
        f"{'':40} {'AUROC':>6} {'rej':>6} {'kept':>6} {'ECE':>6} {'skip':>6} | order: hit@1 hit@5 MRR (recall's -> "
        "judge's) | AUROC - shipped's, 90% (paired bootstrap)"
    )
    for role in ("fleet", "locomo"):
        print(f"{role}:")
        for name, (_, n) in variants.items():
            scored = judged[name, role]
            rejected, kept = floor_figures(scored, floor)
            mine, theirs = ranking(scored, None), ranking(scored, n or None)
            order = " ".join(f"{mine[k]:.3f}->{theirs[k]:.3f}" for k in ("hit@1", "hit@5", "MRR"))
            lo, hi = paired_interval(judged[shipped_name, role], scored) if name != shipped_name else (0.0, 0.0)
            print(
                f"  {name:38} {separation(scored):6.3f} {rejected:6.3f} {kept:6.3f} {ece(scored):6.3f} "
                f"{skipped[name, role]:6.3f} | {order if n else ' ' * 41} | {lo:+.3f} .. {hi:+.3f}"
            )
    print(
        "model CPU a run (thread time, median over every set's questions): "
        + ", ".join(f"{n} rows {sorted(v)[len(v) // 2] * 1e3:.2f} ms" for n, v in cpu.items())
    )
    if args.combination_grid:
        print(f"\n== the combination's weights over the shipped {head} rows, cascade and intercept as shipped ==")
        print("   a     b | calibration fleet, LoCoMo | held out fleet, LoCoMo")
        for a in GRID_A:
            for b in GRID_B:
                cells = []
                for role, domains in (
                    ("calibrate", ("fleet", "locomo")),
                    ("fleet", ("fleet",)),
                    ("locomo", ("locomo",)),
                ):
                    for d in domains:
                        cells.append(
                            separation(
                                [
                                    (r, served(meta, (a, b, *shipped[2:]), f, x, e)[0])
                                    for r, f, x, e in zip(sets[role], feats[role], logits[role, head], read[role])
                                    if r["domain"] == d
                                ]
                            )
                        )
                mark = " (shipped)" if (a, b) == (round(meta.a, 2), round(meta.b, 2)) else ""
                print(f"{a:5.2f} {b:5.2f} | {cells[0]:.3f} {cells[1]:.3f} | {cells[2]:.3f} {cells[3]:.3f}{mark}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
