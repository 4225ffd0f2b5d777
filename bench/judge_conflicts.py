"""How often the judge's conflict detectors (solos_judge.conflicts) fire, on the data they were designed on.

    .venv/bin/python bench/judge_conflicts.py [--data F] [--examples 3]

Reads bench/judge_data.py's cache, hybrid records only, and ONLY the fleet's `fit` half and LoCoMo: the
fleet's `score` half is never read here (it is what bench/judge_eval.py scores; choosing a detector on it would
be fitting on the scored data). For each conflict family (period, id, name, person, scope) and domain, the
share of rows it fires on:

- answer rows (it should not fire: an answer holds the question's specific, or nothing of its kind);
- the top row of unanswerable questions (fleet: near misses; LoCoMo: foreign questions) — it should fire;
- the other rows in recall's first 5 of answerable questions (neither: they are wrong for other reasons).

With --examples N, the first N answer rows each family fires on (the false alarms to read) and N unanswerable
top rows it fires on.

With --cv, how the choice of conflict features was made without the scored half: the judge refitted as
bench/judge_fit.py fits it (hybrid), for each variant of its feature list, held out two ways that never touch
the fleet's `score` half: the fleet's `fit` half leave one cluster out (fitted on its other clusters and the
five LoCoMo conversations), and LoCoMo leave one conversation out (as bench/judge_eval.py). AUROC of each, and
the fit half's unanswerable questions rejected / answerable kept at each fold's fitted floor. Asserts nothing.

With --cv-fits, the same folds over both batches' clusters (pass the cache recalled against both batches'
facts, judge-data-v2-fdata.jsonl) compare three fits of the shipped feature list, every fit scored on the same
held-out questions: `first` (the fleet's first batch only, judge_fit.py's floor rule), `both` (both batches,
the same rule) and `both-np` (both batches, `--floor-without paraphrase`); each against `first` paired over the
held-out questions (90% of 1,000 draws). The rule for shipping `both-np`, written before these figures were
first printed: against `first`, the fit half's near misses rejected at the folds' floors rise (the change is
above 0), and none of the fit half's AUROC, its answers kept, LoCoMo's AUROC and LoCoMo's answers kept falls
beyond noise (a 90% interval wholly below 0). Also each fold's AUROC change (the folds' spread).

With --kind, the same counts for the kind and attribute detectors (solos_judge.features' `kind_missing`, by the
kind asked, and `attribute_missing` above 0): how often each fires on answer rows (a false alarm) against
unanswerable questions' top rows, per domain; with --examples N, N answer rows each fires on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections import Counter
from collections.abc import Collection, Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from judge_data import CACHE, load  # noqa: E402
from judge_eval import auroc, folds, separation  # noqa: E402
from judge_fit import fit, fitted_floor, floor_figures, judge_of  # noqa: E402

import solos_judge  # noqa: E402

ROLES = ("answer rows", "unanswerable top row", "other top-5 rows")
FLEET_QUESTIONS = Path(__file__).resolve().parent / "data" / "fleet" / "questions.jsonl"
BASE = tuple(n for n in solos_judge.HYBRID_FEATURES if not n.startswith("conflict"))
VARIANTS = {
    "without": BASE,
    "any": (*BASE, "conflict"),
    "families": (*BASE, *solos_judge.CONFLICT_FEATURES),
    "any+person": (*BASE, "conflict", "conflict_person"),
    "families+any": (*BASE, *solos_judge.CONFLICT_FEATURES, "conflict"),
    "grouped": (*BASE, "conflict_period", "conflict_person", "conflict_other"),
    "no-person": (*BASE, *(n for n in solos_judge.CONFLICT_FEATURES if n != "conflict_person")),
}


def row_conflicts(question: str, row: dict) -> set[str]:
    text = solos_judge.row_text(row)
    return solos_judge.conflicts(
        solos_judge.specifics(question, question=True),
        text,
        solos_judge.row_tokens(text),
        str(row.get("agent") or ""),
    )


def clusters() -> dict[str, str]:
    """Each fleet question's cluster (its domain_topic)."""
    with FLEET_QUESTIONS.open() as lines:
        return {q["id"]: q["domain_topic"] for q in map(json.loads, lines)}


@contextlib.contextmanager
def features_once(hybrid: list[dict]) -> Iterator[None]:
    """solos_judge.features read from one computation per record (with the "any" and "other" conflict columns
    the variants name) while the block runs."""
    computed = {id(r["rows"]): solos_judge.features(r["question"], r["rows"], "hybrid") for r in hybrid}
    for found in computed.values():
        for f in found:  # "any": a conflict of any family
            f["conflict"] = max(f[n] for n in solos_judge.CONFLICT_FEATURES)
            f["conflict_other"] = max(f[f"conflict_{n}"] for n in ("id", "name", "scope"))
    features = solos_judge.features

    def cached(question: str, rows: list[dict], mode: str) -> list[dict[str, float]]:
        found = computed.get(id(rows))
        if found is None:
            return features(question, rows, mode)
        return [{n: f[n] for n in solos_judge.FEATURES[mode]} for f in found]

    solos_judge.features = cached  # type: ignore[assignment]
    try:
        yield
    finally:
        solos_judge.features = features  # type: ignore[assignment]
        solos_judge.FEATURES["hybrid"] = solos_judge.HYBRID_FEATURES


def cv_folds(hybrid: list[dict]) -> list[tuple[str, list[dict], list[dict]]]:
    """(domain, fitting, held out) of each fold: the fit half leave one cluster out (fitted on its other clusters
    and the five LoCoMo conversations), then LoCoMo leave one conversation out (as bench/judge_eval.py)."""
    cluster = clusters()
    fleet_fit = [r for r in hybrid if r["domain"] == "fleet" and r["group"] == "fit"]
    locomo = [r for r in hybrid if r["domain"] == "locomo"]
    fleet_folds = [
        (
            "fleet",
            [r for r in fleet_fit if cluster[r["qid"]] != c] + locomo,
            [r for r in fleet_fit if cluster[r["qid"]] == c],
        )
        for c in sorted({cluster[r["qid"]] for r in fleet_fit})
    ]
    return fleet_folds + [f for f in folds(fleet_fit + locomo) if f[0] == "locomo"]


def held_out_at_floor(
    domain_folds: list[tuple[str, list[dict], list[dict]]], without: Collection[str] = ()
) -> list[tuple[dict, list[float], float]]:
    """Each held-out question with its probabilities and its fold's fitted floor."""
    out = []
    for _, train, held in domain_folds:
        judge = judge_of({"hybrid": fit(train, "hybrid")})
        floor = fitted_floor(judge, train, without)
        out += [(r, judge.judge(r["question"], r["rows"], "hybrid").probabilities, floor) for r in held if r["rows"]]
    return out


def at_floor(scored: list[tuple[dict, list[float], float]]) -> tuple[float, float]:
    """(rejected, kept): each question at its own fold's floor."""
    flags = [floor_figures([(r, p)], f) for r, p, f in scored]
    rejected = [x for (x, _), (r, _, _) in zip(flags, scored) if not r["answerable"]]
    kept = [k for (_, k), (r, _, _) in zip(flags, scored) if r["answerable"]]
    return sum(rejected) / max(len(rejected), 1), sum(kept) / max(len(kept), 1)


def cross_validated(records: list[dict], variants: list[str]) -> None:
    """--cv: each variant's held-out figures on the fit half (leave one cluster out) and LoCoMo (leave one out)."""
    hybrid = [r for r in records if r["mode"] == "hybrid"]
    all_folds = cv_folds(hybrid)
    print(f"\n--cv: fit half leave one cluster out, LoCoMo leave one conversation out ({len(all_folds)} folds)")
    print(f"{'variant':12} {'fit half AUROC':>15} {'rejected / kept':>16} {'LoCoMo AUROC':>13} {'rejected / kept':>16}")
    with features_once(hybrid):
        for variant in variants:
            solos_judge.FEATURES["hybrid"] = VARIANTS[variant]
            cells = []
            for domain in ("fleet", "locomo"):
                scored = held_out_at_floor([f for f in all_folds if f[0] == domain])
                rejected, kept = at_floor(scored)
                cells += [f"{separation([(r, p) for r, p, _ in scored]):.3f}", f"{rejected:.2f} / {kept:.2f}"]
            print(f"{variant:12} {cells[0]:>15} {cells[1]:>16} {cells[2]:>13} {cells[3]:>16}")


SECOND_BATCH = frozenset(
    {
        "catalog",
        "logistics",
        "experiments",
        "partner-api",
        "media",
        "privacy",
        "hr-tools",
        "localization",
        "marketplace",
        "dev-portal",
    }
)  # bench/data/fleet/README.md: the fit half's second batch
FITS = {"first": (False, ()), "both": (True, ()), "both-np": (True, ("paraphrase",))}


def per_question(scored: list[tuple[dict, list[float], float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Answerable or not, the question's score for AUROC (best answer row; top row when unanswerable), and
    whether it holds at its fold's floor (kept; rejected when unanswerable)."""
    answerable = np.array([r["answerable"] for r, _, _ in scored])
    score = np.array(
        [
            max((x for x, row in zip(p, r["rows"]) if row["label"]), default=0.0) if r["answerable"] else max(p)
            for r, p, _ in scored
        ]
    )
    holds = np.array([floor_figures([(r, p)], f)[0 if not r["answerable"] else 1] for r, p, f in scored])
    return answerable, score, holds


def figures(answerable: np.ndarray, score: np.ndarray, holds: np.ndarray) -> np.ndarray:
    """AUROC, rejected, kept."""
    return np.array([auroc(score[answerable], score[~answerable]), holds[~answerable].mean(), holds[answerable].mean()])


def fits_compared(records: list[dict], draws: int = 1000) -> None:
    """--cv-fits: the three fits held out on the same questions, each paired against `first`."""
    hybrid = [r for r in records if r["mode"] == "hybrid"]
    cluster = clusters()
    second = {id(r) for r in hybrid if r["domain"] == "fleet" and cluster[r["qid"]] in SECOND_BATCH}
    all_folds = cv_folds(hybrid)
    rng = np.random.default_rng(0)
    print(f"\n--cv-fits: {len(all_folds)} folds; change against `first`, 90% of {draws} paired question draws")
    print(f"{'fit':8} {'domain':7} {'floors':>12} {'AUROC':>30} {'rejected':>30} {'kept':>30}")
    with features_once(hybrid):
        for domain in ("fleet", "locomo"):
            domain_folds = [f for f in all_folds if f[0] == domain]
            scored = {}
            for name, (with_second, without) in FITS.items():
                kept_folds = [
                    (d, [r for r in train if with_second or id(r) not in second], held)
                    for d, train, held in domain_folds
                ]
                scored[name] = held_out_at_floor(kept_folds, without)
            whole = {name: per_question(here) for name, here in scored.items()}
            parts = {domain: np.ones(len(scored["first"]), dtype=bool)}
            if domain == "fleet":  # the fit half's two batches' clusters, each held out
                parts["batch 2"] = np.array([id(r) in second for r, _, _ in scored["first"]])
                parts["batch 1"] = ~parts["batch 2"]
            for part, mask in parts.items():
                arrays = {name: tuple(a[mask] for a in found) for name, found in whole.items()}
                n = int(mask.sum())
                picks = [rng.integers(0, n, n) for _ in range(draws)]
                base = figures(*arrays["first"])
                for name, here in scored.items():
                    floors = sorted({f for (_, _, f), m in zip(here, mask) if m})
                    value = figures(*arrays[name])
                    cells = [f"{v:.3f}" for v in value]
                    if name != "first":
                        deltas = np.array(
                            [
                                figures(*(a[pick] for a in arrays[name])) - figures(*(a[pick] for a in arrays["first"]))
                                for pick in picks
                            ]
                        )
                        low, high = np.percentile(deltas, [5, 95], axis=0)
                        cells = [
                            f"{v:.3f} ({v - b:+.3f}: {lo:+.3f}..{hi:+.3f})"
                            for v, b, lo, hi in zip(value, base, low, high)
                        ]
                    span = f"{floors[0]:.3f}-{floors[-1]:.3f}"
                    print(f"{name:8} {part:7} {span:>12} {cells[0]:>30} {cells[1]:>30} {cells[2]:>30}")
            fold_of = [cluster[r["qid"]] if domain == "fleet" else r["group"] for r, _, _ in scored["first"]]
            for name in ("both", "both-np"):
                changes = sorted(
                    figures(*(a[np.array(fold_of) == f] for a in whole[name]))[0]
                    - figures(*(a[np.array(fold_of) == f] for a in whole["first"]))[0]
                    for f in set(fold_of)
                )
                print(
                    f"{name:8} {domain:7} each fold's AUROC change against `first`: {changes[0]:+.3f} .. "
                    f"{changes[-1]:+.3f}, {sum(c > 0 for c in changes)} up, {sum(c < 0 for c in changes)} down"
                    f" of {len(changes)}"
                )


def kind_counts(records: list[dict], examples: int = 0) -> None:
    """Print how often kind_missing (by the kind asked) and attribute_missing fire on answer rows and on
    unanswerable questions' top rows, per domain (see the docstring's --kind)."""
    for domain in ("fleet", "locomo"):
        fired: dict[str, Counter] = {role: Counter() for role in ROLES[:2]}
        seen: dict[str, Counter] = {role: Counter() for role in ROLES[:2]}
        shown: dict[str, list[str]] = {}
        for rec in (r for r in records if r["domain"] == domain):
            kind = solos_judge.asked_kind(rec["question"]) or "none"
            read = solos_judge.features(rec["question"], rec["rows"], "hybrid")
            for rank, (row, f) in enumerate(zip(rec["rows"], read)):
                role = ROLES[0] if row["label"] else ROLES[1] if not rec["answerable"] and rank == 0 else ""
                if not role:
                    continue
                read_by = ((f"kind:{kind}", f["kind_missing"] > 0), ("attribute", f["attribute_missing"] > 0))
                for detector, fires in read_by:
                    if detector == "kind:none":
                        continue
                    seen[role][detector] += 1
                    if fires:
                        fired[role][detector] += 1
                        lines = shown.setdefault(detector, [])
                        if role == ROLES[0] and len(lines) < examples:
                            text = solos_judge.row_text(row)[:110]
                            lines.append(f"{rec['question']}  <-  {row.get('agent')}: {text}")
        print(f"\n{domain}: share of rows the detector fires on (of rows whose question it reads)")
        print(f"{'detector':14} " + " ".join(f"{role:>26}" for role in ROLES[:2]))
        for detector in sorted(set(seen[ROLES[0]]) | set(seen[ROLES[1]])):
            counts = [(fired[role][detector], seen[role][detector]) for role in ROLES[:2]]
            cells = [f"{hit / max(n, 1):.3f} ({hit}/{n})" for hit, n in counts]
            print(f"{detector:14} " + " ".join(f"{c:>26}" for c in cells))
        for detector, lines in shown.items():
            for line in lines:
                print(f"  [{detector}, answer row] {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=CACHE, help=f"judge_data.py's cache (default: {CACHE})")
    parser.add_argument("--examples", type=int, default=0, help="print this many rows per family and role")
    parser.add_argument(
        "--cv", nargs="?", const=",".join(VARIANTS), help=f"variants to cross-validate ({', '.join(VARIANTS)})"
    )
    parser.add_argument("--cv-fits", action="store_true", help="first batch / both / both with --floor-without")
    parser.add_argument("--kind", action="store_true", help="count the kind and attribute detectors instead")
    args = parser.parse_args(argv)
    records = [
        r
        for r in load(args.data)
        if r["mode"] == "hybrid" and r["rows"] and (r["domain"] == "locomo" or r["group"] == "fit")
    ]
    if args.kind:
        kind_counts(records, args.examples)
        return 0
    for domain in ("fleet", "locomo"):
        fired: dict[str, Counter] = {role: Counter() for role in ROLES}
        seen: Counter = Counter()
        examples: dict[tuple[str, str], list[str]] = {}
        for rec in (r for r in records if r["domain"] == domain):
            for rank, row in enumerate(rec["rows"]):
                if row["label"]:
                    role = ROLES[0]
                elif not rec["answerable"] and rank == 0:
                    role = ROLES[1]
                elif rec["answerable"] and rank < 5:
                    role = ROLES[2]
                else:
                    continue
                seen[role] += 1
                found = row_conflicts(rec["question"], row)
                for family in found | ({"any"} if found else set()):
                    fired[role][family] += 1
                    shown = examples.setdefault((family, role), [])
                    if len(shown) < args.examples and role != ROLES[2]:
                        shown.append(f"{rec['question']}  <-  {row.get('agent')}: {solos_judge.row_text(row)[:110]}")
        read = "fit half" if domain == "fleet" else "all five conversations"
        print(f"\n{domain} ({read}): share of rows a family fires on")
        print(f"{'family':8} " + " ".join(f"{role:>22}" for role in ROLES))
        for family in (*solos_judge.CONFLICT_FAMILIES, "any"):
            cells = [f"{fired[role][family] / max(seen[role], 1):.3f} ({fired[role][family]})" for role in ROLES]
            print(f"{family:8} " + " ".join(f"{c:>22}" for c in cells))
        print(f"{'rows':8} " + " ".join(f"{seen[role]:>22}" for role in ROLES))
        for (family, role), shown in examples.items():
            for line in shown:
                print(f"  [{family}, {role}] {line}")
    if args.cv:
        cross_validated(records, args.cv.split(","))
    if args.cv_fits:
        fits_compared(records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
