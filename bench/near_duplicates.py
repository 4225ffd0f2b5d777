"""Precision and recall of the near-duplicate rule (solos_provenance.near_duplicate) on a labelled sample.

    .venv/bin/python bench/near_duplicates.py [--sample tests/data/near_duplicates.jsonl]

The sample: pairs of long facts, each labelled same fact or not, written by hand (paraphrases,
reorderings, case and punctuation; and the same topic with another number, negation or subject). Prints the
text rule at several word-overlap thresholds, the shipped one marked, and the rule's misses and false hits.
The vector rule is not measured here: no embedder is reachable in the test environment.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import solos_provenance  # noqa: E402

SAMPLE = Path(__file__).resolve().parent.parent / "tests" / "data" / "near_duplicates.jsonl"


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def measure(pairs: list[dict], threshold: float) -> dict:
    """Precision and recall of the text rule at a word-overlap threshold."""
    kept = solos_provenance.TOKEN_JACCARD
    solos_provenance.TOKEN_JACCARD = threshold
    try:
        said = [solos_provenance.near_duplicate(p["a"], p["b"]) is not None for p in pairs]
    finally:
        solos_provenance.TOKEN_JACCARD = kept
    hits = sum(s and p["same"] for s, p in zip(said, pairs))
    claimed, same = sum(said), sum(p["same"] for p in pairs)
    return {
        "threshold": threshold,
        "precision": hits / claimed if claimed else 1.0,
        "recall": hits / same if same else 1.0,
        "claimed": claimed,
        "false": [p for s, p in zip(said, pairs) if s and not p["same"]],
        "missed": [p for s, p in zip(said, pairs) if not s and p["same"]],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=Path, default=SAMPLE, help=f"labelled pairs (default {SAMPLE})")
    args = parser.parse_args()
    pairs = load(args.sample)
    print(f"{len(pairs)} pairs, {sum(p['same'] for p in pairs)} labelled same fact")
    print("threshold  precision  recall  claimed")
    for threshold in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
        found = measure(pairs, threshold)
        mark = "  <- shipped" if threshold == solos_provenance.TOKEN_JACCARD else ""
        print(f"{threshold:9.1f}  {found['precision']:9.3f}  {found['recall']:6.3f}  {found['claimed']:7d}{mark}")
    shipped = measure(pairs, solos_provenance.TOKEN_JACCARD)
    for label, rows in (("false near-duplicates", shipped["false"]), ("missed", shipped["missed"])):
        print(f"\n{label} at {solos_provenance.TOKEN_JACCARD}:")
        for pair in rows:
            print(f"  [{pair['kind']}] {pair['a']!r} / {pair['b']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
