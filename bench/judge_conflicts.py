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
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from judge_data import CACHE, load  # noqa: E402
from judge_eval import folds, separation  # noqa: E402
from judge_fit import choose_floor, fit, floor_figures, judge_of  # noqa: E402

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


def cross_validated(records: list[dict], variants: list[str]) -> None:
    """--cv: each variant's held-out figures on the fit half (leave one cluster out) and LoCoMo (leave one out)."""
    cluster = {}
    with FLEET_QUESTIONS.open() as lines:
        for line in lines:
            q = json.loads(line)
            cluster[q["id"]] = q["domain_topic"]
    hybrid = [r for r in records if r["mode"] == "hybrid"]
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
    locomo_folds = [f for f in folds(fleet_fit + locomo) if f[0] == "locomo"]
    print(f"\n--cv: fit half leave one cluster out ({len(fleet_folds)} clusters), LoCoMo leave one conversation out")
    print(f"{'variant':12} {'fit half AUROC':>15} {'rejected / kept':>16} {'LoCoMo AUROC':>13} {'rejected / kept':>16}")
    try:
        for variant in variants:
            solos_judge.FEATURES["hybrid"] = VARIANTS[variant]
            cells = []
            for domain_folds in (fleet_folds, locomo_folds):
                scored, at_floor = [], []
                for _, train, held in domain_folds:
                    judge = judge_of({"hybrid": fit(train, "hybrid")})
                    by_domain = [
                        [
                            (r, judge.judge(r["question"], r["rows"], "hybrid").probabilities)
                            for r in train
                            if r["domain"] == d
                        ]
                        for d in ("fleet", "locomo")
                    ]
                    floor = choose_floor(by_domain)
                    here = [
                        (r, judge.judge(r["question"], r["rows"], "hybrid").probabilities) for r in held if r["rows"]
                    ]
                    scored += here
                    at_floor.append((len(here), floor_figures(here, floor)))
                total = sum(n for n, _ in at_floor)
                rejected, kept = (sum(n * f[i] for n, f in at_floor) / total for i in (0, 1))
                cells += [f"{separation(scored):.3f}", f"{rejected:.2f} / {kept:.2f}"]
            print(f"{variant:12} {cells[0]:>15} {cells[1]:>16} {cells[2]:>13} {cells[3]:>16}")
    finally:
        solos_judge.features = features  # type: ignore[assignment]
        solos_judge.FEATURES["hybrid"] = solos_judge.HYBRID_FEATURES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=CACHE, help=f"judge_data.py's cache (default: {CACHE})")
    parser.add_argument("--examples", type=int, default=0, help="print this many rows per family and role")
    parser.add_argument(
        "--cv", nargs="?", const=",".join(VARIANTS), help=f"variants to cross-validate ({', '.join(VARIANTS)})"
    )
    args = parser.parse_args(argv)
    records = [
        r
        for r in load(args.data)
        if r["mode"] == "hybrid" and r["rows"] and (r["domain"] == "locomo" or r["group"] == "fit")
    ]
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
