#!/usr/bin/env python3
"""Fusion's levers for the fleet's paraphrases beside LoCoMo: vector seats, the weak-question test, the cosine's weight.

    .venv/bin/python bench/fusion_levers.py [--variants seats=5,seats=10,...] [--no-locomo] [--every-fact]

A paraphrase shares no content word with its answer, so only the vector leg finds it; fusion (0.7 keyword +
0.3 vector, min-max) puts a row that matches one incidental word above the best cosine, and a weak question's
head gets seats for the vector leg's best HEAD_VECTOR_ROWS rows (solos_rank.with_vector_seats). Each variant
patches solos_rank's constants in this process (and bench/locomo_simulate.FUSION for the weight) and measures:

- the fleet: the first batch's 320 facts in a scratch service in this process (bench/fleet_rank.py's capture,
  through REST, the judge as shipped, recall's own order): hit@5 overall and on the paraphrases of the `fit`
  half (the one to choose a variant on; the reranker was fitted on it) and of the `score` half (no fit saw
  it: held out), and where each half's paraphrase answers sit (the cosine over every fact, the vector leg's
  candidates, the reranker's head, the rows returned). With --every-fact the memory holds both batches' 520
  facts, as served and as bench/judge_data.py asks (the fit half's questions then both batches': the second
  batch's no ranking fit saw);
- LoCoMo: bench/ltr_fit.py's simulation of the service on the dev split: the first pass, the service's weights
  (in sample) and the reranker refitted leave one conversation out (held out): hit@5 and frac@10, whose floor
  is today's 0.827 / 0.832 (bench/locomo.py through REST).

Variants: `seats=N` (HEAD_VECTOR_ROWS), `weak=X` (WEAK_KEYWORD_COVERAGE), `vector=W` (the hybrid weights
1-W / W), `refit` (the reranker's hybrid weights fitted again, as bench/ltr_fit.py fits them, on LoCoMo and the
fleet's fit half of the memory asked: with --every-fact both batches'; the fleet's hit@5 then reranks each
captured head with them, the stage shares stay the service's); joined by `+` to combine. Asserts nothing.
About a minute a variant.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import fleet_rank  # noqa: E402
import locomo_simulate  # noqa: E402
from locomo_data import DEFAULT_DATA, load_conversations  # noqa: E402

import solos_embed  # noqa: E402
import solos_rank  # noqa: E402

DEFAULT_VARIANTS = "shipped,seats=10,seats=20,weak=0.5,weak=0.5+seats=10,vector=0.4"


def patched(variant: str) -> dict[str, object]:
    """The solos_rank constants a variant sets, by name."""
    out: dict[str, object] = {}
    for part in variant.split("+"):
        if part in ("shipped", "refit"):
            continue
        name, _, value = part.partition("=")
        if name == "seats":
            out["HEAD_VECTOR_ROWS"] = int(value)
        elif name == "weak":
            out["WEAK_KEYWORD_COVERAGE"] = float(value)
        elif name == "vector":
            out["LEG_WEIGHTS"] = {**solos_rank.LEG_WEIGHTS, "hybrid": (1 - float(value), float(value))}
        else:
            raise SystemExit(f"unknown variant part {part!r}")
    return out


class Patch:
    """solos_rank's constants (and the simulation's fusion weights) set for one variant, restored after."""

    def __init__(self, values: dict[str, object]) -> None:
        self.values, self.saved = values, {}
        self.fusion = list(locomo_simulate.FUSION)

    def __enter__(self) -> Patch:
        for name, value in self.values.items():
            self.saved[name] = getattr(solos_rank, name)
            setattr(solos_rank, name, value)
        if "LEG_WEIGHTS" in self.values:
            locomo_simulate.FUSION[:] = list(solos_rank.LEG_WEIGHTS["hybrid"])
        return self

    def __exit__(self, *exc) -> None:
        for name, value in self.saved.items():
            setattr(solos_rank, name, value)
        locomo_simulate.FUSION[:] = self.fusion


def raw_weights(model) -> tuple[float, ...]:
    """A fitted reranker (bench/ltr_fit.fit_data's) as the raw weights solos_rank carries, bias first, rounded as
    ltr_fit.py prints them."""
    w, mu, sd = model
    return tuple(round(float(x), 4) for x in (w[-1] - (w[:-1] * mu / sd).sum(), *(w[:-1] / sd)))


def paraphrase_places(records: list[dict], split: str) -> str:
    """Where the split's paraphrase answers are: within 5 / within 20 / anywhere, per stage."""
    places = []
    for stage in ("cosine", "vector", "head", "returned"):
        ranks = []
        for r in records:
            if r["split"] != split or r["kind"] != "paraphrase":
                continue
            found = r["returned"] if stage == "returned" else r.get("stages", {}).get(stage, [])
            at = [i for i, fact in enumerate(found, 1) if fact in r["answers"]]
            ranks.append(min(at) if at else None)
        n = max(len(ranks), 1)
        present = [x for x in ranks if x is not None]
        shares = [sum(x <= 5 for x in present) / n, sum(x <= 20 for x in present) / n, len(present) / n]
        places.append(f"{stage} " + "/".join(f"{x:.2f}" for x in shares))
    return ", ".join(places)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma-separated (default: {DEFAULT_VARIANTS})")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"LoCoMo's file (default: {DEFAULT_DATA})")
    parser.add_argument("--no-locomo", action="store_true", help="the fleet only")
    parser.add_argument(
        "--every-fact",
        action="store_true",
        help="the fleet's memory of both batches (520 facts, as served and as bench/judge_data.py asks), not the "
        "ranking's first batch (320); the fit half's questions then include the second batch's",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import ltr_fit  # noqa: PLC0415  (numpy, the embedder: only when run)

    convs = [] if args.no_locomo else load_conversations(args.data)
    kw = locomo_simulate.recipe_keyword(convs) if convs else []
    vec = locomo_simulate.recipe_vector(convs, solos_embed.load_embedder(None)) if convs else None
    print(
        "variant | fleet fit half hit@5, paraphrase hit@5 (to choose on) | score half's (held out) | paraphrase "
        "answers within 5/20/any by stage, fit half | score half | LoCoMo hybrid hit@5 / frac@10: first pass, "
        "service weights (in sample), LOCO (held out)"
    )
    for variant in args.variants.split(","):
        refit = "refit" in variant.split("+")
        if refit and vec is None:
            raise SystemExit(f"{variant}: a refit needs LoCoMo (drop --no-locomo)")
        with Patch(patched(variant)):
            records = fleet_rank.capture("hybrid", cosine=True, every=args.every_fact)
            weights, locomo = solos_rank.LTR_HYBRID_WEIGHTS, ""
            if vec is not None:
                fused = locomo_simulate.recipe_hybrid(kw, vec)
                data = ltr_fit.build(convs, kw, vec, fused)
                extra = [fleet_rank.as_data(records, "fit")]
                if refit:
                    weights = raw_weights(ltr_fit.fit_data(data + extra, 1.0))
                first = locomo_simulate.summarise(
                    [r for c, m in zip(convs, fused) for r in locomo_simulate.query_rows(c, m)]
                )
                served = locomo_simulate.summarise(ltr_fit.with_weights(convs, fused, data, weights))
                held = locomo_simulate.summarise(ltr_fit.held_out(convs, fused, data, extra=extra))
                locomo = " | " + ", ".join(
                    f"{s['overall']['hit@5']:.3f} / {s['overall']['frac@10']:.3f}" for s in (first, served, held)
                )
            score = fleet_rank.weights_score(weights) if refit else None
            figures = fleet_rank.hits(records, "score", score)
            fitting = fleet_rank.hits(records, "fit", score)
        print(
            f"{variant:24} | {fitting['all']:.3f}, {fitting.get('paraphrase', 0.0):.3f} | "
            f"{figures['all']:.3f}, {figures.get('paraphrase', 0.0):.3f} | "
            f"{paraphrase_places(records, 'fit')} | {paraphrase_places(records, 'score')}{locomo}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
