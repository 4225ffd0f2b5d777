"""What a caller gets: recall's own `relevance`, from this tree's service and another checkout's, side by side.

    .venv/bin/python bench/judge_ab.py --base DIR [--modes hybrid,keyword] [--foreign-per-conversation 60]

DIR is another checkout (e.g. the tree before the judge: `git worktree add /tmp/before 5fe90c1`). Both services
are asked, through REST, exactly what bench/judge_data.py asks (k=20, min_relevance 0), with their judges as
shipped, and each row's `relevance` is read as the service gave it. Each tree is held to its own documented
turn floor (its solos_client.TURN_MIN_RELEVANCE).

- fleet: the `score` half only (160 questions: 112 answerable, 48 unanswerable near misses), which no fit of
  this tree saw;
- LoCoMo: every dev conversation asked its own questions and a seeded sample of the others' (foreign: the
  unanswerable role). The shipped judge and reranker were fitted on these conversations, so this column is in
  sample for both trees; the held-out figures are bench/judge_eval.py's (leave one conversation out).

Figures as bench/judge_eval.py defines them (AUROC: the best answer row's relevance against an unanswerable
question's top row; rejected/kept at the floor; hit@5 and frac@10 in recall's own order; ECE over every row).
Asserts nothing. About 4 minutes on 2 cores with both modes.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from judge_data import fleet_records, locomo_records  # noqa: E402
from judge_eval import Scored, ece, hit_at, relevance_scored, separation  # noqa: E402
from judge_fit import floor_figures  # noqa: E402
from locomo_data import DEFAULT_DATA, REPO, load_conversations  # noqa: E402


def turn_floor(tree: Path) -> float:
    """The tree's documented floor: solos_client.TURN_MIN_RELEVANCE as its source says."""
    found = re.search(r"^TURN_MIN_RELEVANCE = ([0-9.]+)$", (tree / "solos_client.py").read_text(), re.M)
    if found is None:
        raise SystemExit(f"{tree}/solos_client.py has no TURN_MIN_RELEVANCE")
    return float(found.group(1))


def frac_at(scored: Scored, k: int = 10) -> float:
    """The share of each answerable question's answer rows in its first k, averaged."""
    shares = [sum(r["label"] for r in rec["rows"][:k]) / rec["n_answers"] for rec, _ in scored if rec["answerable"]]
    return sum(shares) / max(len(shares), 1)


def figures(scored: Scored, floor: float, fleet: bool) -> dict[str, str]:
    rejected, kept = floor_figures(scored, floor)
    out = {
        "AUROC": f"{separation(scored):.3f}",
        "floor": f"{floor:g}",
        "rejected at floor": f"{rejected:.3f}",
        "kept at floor": f"{kept:.3f}",
        "hit@5": f"{hit_at(scored, reorder=False):.3f}",
        "frac@10": f"{frac_at(scored):.3f}",
        "ECE": f"{ece(scored):.3f}",
    }
    if fleet:
        out["paraphrase hit@5"] = f"{hit_at(scored, kinds={'paraphrase'}, reorder=False):.3f}"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the other checkout (e.g. the tree before the judge)")
    parser.add_argument("--modes", default="hybrid,keyword", help="ranking modes (default: hybrid,keyword)")
    parser.add_argument("--foreign-per-conversation", type=int, default=60, help="foreign LoCoMo questions (60)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"LoCoMo's file (default: {DEFAULT_DATA})")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    conversations = load_conversations(args.data)
    trees = {"before": args.base.resolve(), "this": REPO}
    asked = {}
    for name, tree in trees.items():
        records = [
            # the score half scored; the fit half asked too, in the same memory, as the figures were first taken
            *(r for r in fleet_records(modes, tree, judged=True, splits=("fit", "score")) if r["group"] == "score"),
            *locomo_records(modes, args.foreign_per_conversation, conversations, tree, judged=True),
        ]
        asked[name] = records
    for mode in modes:
        print(f"\n{mode}: fleet score half (held out) | LoCoMo dev, own against foreign (in sample for both trees)")
        columns = {}
        for domain in ("fleet", "locomo"):
            for name, tree in trees.items():
                scored = relevance_scored([r for r in asked[name] if r["mode"] == mode and r["domain"] == domain])
                columns[f"{domain} {name}"] = figures(scored, turn_floor(tree), domain == "fleet")
        print(f"{'':20} " + " ".join(f"{c:>14}" for c in columns))
        for row in columns["fleet this"]:
            print(f"{row:20} " + " ".join(f"{columns[c].get(row, ''):>14}" for c in columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
