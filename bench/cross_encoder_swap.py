"""Ship a cross-encoder: copy bench/cross_encoder.py's int8 file into models/judge/, write its meta, pin both.

    .venv/bin/python bench/cross_encoder_swap.py MODEL.onnx [--trial-meta M.json] [--held-out 4] [--calibrate 3]
        [--dry-run] [--against SHIPPED.onnx] [--save-scores F.json] [--against-scores F.json]

One command for a retrained model (same input format): it copies MODEL into models/judge/ (by its own name),
then sets the combination with the features judge as shipped (models/judge/judge.json, solos_judge.load) on
bench/cross_encoder.py's calibration records, which neither the cross-encoder nor the combination trained
on (the fleet's mobile and office-it clusters, LoCoMo's `--calibrate` conversation; the `--held-out` one is
left out of everything): a logistic over (the cross-encoder's logit, the features judge's logit, 1) for the
first `rows` rows of each question (cross_encoder.fit_combination), then its intercept raised by the least
step of CALIBRATION_STEP under which, at the service's one documented floor (solos_rank.RELEVANCE_FLOOR), the
combination keeps in each domain at least the share of answerable questions' answers that the features judge
keeps there. So the floor means what it means for the features judge ("no more answers lost than the features
judge loses"), and keeps its single number. It writes models/judge/cross-encoder.json, rewrites
solos_cross_encoder.META_SHA256 and MODEL_SHA256, and prints the hashes, the calibration figures, and the
held-out ones beside the features judge's (the fleet's `score` half on its own rows and the `--held-out`
conversation, as bench/cross_encoder.py scores them; the features judge as shipped was fitted on LoCoMo's
conversations, that one too). Run it again after bench/judge_fit.py refits judge.json: the combination reads
that judge.

`--dry-run` scores only (nothing copied, written or pinned). `--against OTHER.onnx` combines another file the
same way and prints, per domain, this file's gain over it held out (AUROC, rejected and kept at the floor, as
served with the band if given) with a paired bootstrap: the same questions drawn with replacement 1,000 times
(seeded), both files scored on each draw, the 5th and 95th percentiles of the gain. A change of the features
judge (solos_judge's code, judge.json, the floor) is another tree's, not another file: `--save-scores F.json`
keeps the combination's held-out probabilities as served, and a run in the tree after it with
`--against-scores F.json` prints the same paired bootstrap over that tree (each at its own floor).

Needs the service's .venv (numpy, onnxruntime, tokenizers) and bench/judge_data.py's cache; not torch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cross_encoder import fit_combination, split  # noqa: E402
from judge_data import CACHE, load  # noqa: E402
from judge_eval import ece, separation  # noqa: E402
from judge_fit import floor_figures  # noqa: E402
from locomo_data import REPO  # noqa: E402

import solos_cross_encoder  # noqa: E402
import solos_judge  # noqa: E402
import solos_rank  # noqa: E402

ROWS = 4  # recall's first rows the cross-encoder reads: the shipped shape, 4 x 28 tokens (bench/README.md)
CALIBRATION_STEP = 0.05  # the intercept's step, in logits
MAX_STEPS = 60
BOOTSTRAP_DRAWS, BOOTSTRAP_SEED = 1000, 33


def combine(beta: tuple, logits: list[float], features: list[float], evidence: list[dict] | None = None) -> list[float]:
    """The combination (solos_cross_encoder.combined: beta (a, b, c), or with the evidence names and weights)
    over the rows the model read, the features judge's for the rest; `evidence` the rows' features."""
    combined = [
        solos_cross_encoder.combined(beta, x, p, evidence[i] if evidence else None)
        for i, (x, p) in enumerate(zip(logits, features))
    ]
    return combined + features[len(logits) :]


def cascaded(
    beta: tuple,
    logits: list[float],
    features: list[float],
    band: tuple[float, float] | None,
    evidence: list[dict] | None = None,
) -> tuple[list[float], bool]:
    """The combination as served with a cascade band (skip_below, skip_above), and whether the model was skipped:
    the features judge's probabilities stand when its best over the rows the model reads lies outside the band
    (solos_cross_encoder.Meta.sure)."""
    if band is not None:
        best = max(features[: len(logits)], default=0.0)
        if best < band[0] or best > band[1]:
            return list(features), True
    return combine(beta, logits, features, evidence), False


def kept(scored: list[tuple[dict, list[float]]], floor: float) -> dict[str, float]:
    return {d: floor_figures([s for s in scored if s[0]["domain"] == d], floor)[1] for d in ("fleet", "locomo")}


def judged(session, features, records: list[dict], rows: int | None) -> tuple[list[list[float]], list[list[float]]]:
    """The features judge's probabilities and the cross-encoder's logits (first `rows` rows; None: all) per
    record."""
    return [features.judge(r["question"], r["rows"], "hybrid").probabilities for r in records], [
        session.logits(r["question"], [solos_cross_encoder.pair_text(x) for x in r["rows"][:rows]]) for r in records
    ]


def evidence_of(records: list[dict], rows: int | None) -> list[list[dict[str, float]]]:
    """The features judge's features (read against every candidate, as served) of each record's first `rows`
    rows: what a combination with evidence reads."""
    return [solos_judge.features(r["question"], r["rows"], "hybrid")[:rows] for r in records]


def parse_evidence(text: str | None) -> tuple[str, ...]:
    names = tuple(n.strip() for n in (text or "").split(",") if n.strip())
    unknown = [n for n in names if not solos_cross_encoder.evidence_known(n)]
    if unknown:
        raise SystemExit(
            f"--evidence {unknown}: not in {sorted(solos_cross_encoder.EVIDENCE)} (each may end *logit or *yes)"
        )
    return names


@dataclass(frozen=True)
class Combination:
    """The combination fitted on the calibration records: a, b, its intercept as raised and as fitted, and the
    share of answers it and the features judge keep there at `floor`, by domain."""

    a: float
    b: float
    c: float
    fitted_c: float
    floor: float
    kept: dict[str, float]
    wanted: dict[str, float]
    evidence: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()

    @property
    def beta(self) -> tuple:
        return (self.a, self.b, self.c, self.evidence, self.weights) if self.evidence else (self.a, self.b, self.c)


def calibrated(
    session, features, roles: dict[str, list[dict]], rows: int, evidence: tuple[str, ...] = ()
) -> Combination:
    """The logistic over (logit, features logit, the `evidence` inputs, 1) on the calibration records, its
    intercept raised by the least CALIBRATION_STEP under which it keeps, at the one floor, the features judge's
    share of answers per domain."""
    calibration = [r for r in roles["calibrate"] if r["rows"]]
    feats, logits = judged(session, features, calibration, rows)
    read = evidence_of(calibration, rows) if evidence else None
    extra = (
        [[solos_cross_encoder.evidence(evidence, x, f) for x, f in zip(xs, fs)] for xs, fs in zip(logits, read)]
        if read
        else None
    )
    heads = [dict(r, rows=r["rows"][:rows]) for r in calibration]
    a, b, *weights, c = (float(x) for x in fit_combination(logits, [f[:rows] for f in feats], heads, extra))
    floor = solos_rank.RELEVANCE_FLOOR
    wanted = kept(list(zip(calibration, feats)), floor)
    for step in range(MAX_STEPS + 1):
        raised = c + step * CALIBRATION_STEP
        found = Combination(a, b, raised, c, floor, {}, wanted, evidence, tuple(weights))
        got = kept(
            [
                (r, combine(found.beta, x, f, read[i] if read else None))
                for i, (r, x, f) in enumerate(zip(calibration, logits, feats))
            ],
            floor,
        )
        if all(got[d] >= wanted[d] for d in wanted):
            return replace(found, kept=got)
    raise SystemExit(f"no intercept up to +{MAX_STEPS * CALIBRATION_STEP} keeps {wanted} at {floor}")


def held_out(
    session,
    features,
    roles: dict[str, list[dict]],
    rows: int,
    combination: Combination,
    band: tuple[float, float] | None = None,
) -> dict[str, dict[str, dict[str, float]]]:
    """By domain (the fleet's score half on its own rows, the held-out conversation) and by judge (the features
    judge; the cross-encoder alone, reading every candidate in one batch, where its quantization shows most; the
    combination, the first `rows` in one batch as served: a dynamically quantized model's logit for a row
    depends a little on the rows beside it, as the activations' range is the batch's): AUROC, the shares
    rejected and kept at the floor, ECE."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for domain in ("fleet", "locomo"):
        held = [r for r in roles[domain] if r["rows"]]
        feats, logits = judged(session, features, held, rows)
        every = judged(session, features, held, None)[1] if rows else logits
        out[domain] = {}
        served = served_scores(combination, logits, feats, band, evidence_of(held, rows))
        for name, scores in (
            ("features judge", feats),
            ("cross-encoder", [[solos_rank.logistic(x) for x in xs] for xs in every]),
            ("combination", [s for s, _ in served]),
        ):
            scored = list(zip(held, scores))
            rejected, keeping = floor_figures(scored, combination.floor)
            out[domain][name] = {
                "questions": len(held),
                "auroc": separation(scored),
                "rejected": rejected,
                "kept": keeping,
                "ece": ece(scored),
                "skipped": sum(skip for _, skip in served) / max(len(served), 1) if name == "combination" else 0.0,
            }
    return out


def served_scores(
    combination: Combination,
    logits: list[list[float]],
    feats: list[list[float]],
    band: tuple[float, float] | None,
    evidence: list[list[dict]] | None = None,
) -> list[tuple[list[float], bool]]:
    """Each question's probabilities as served (the combination, the cascade's band if any) and whether the
    model was skipped."""
    return [
        cascaded(combination.beta, x, f, band, evidence[i] if evidence else None)
        for i, (x, f) in enumerate(zip(logits, feats))
    ]


def paired_bootstrap(
    held: list[dict],
    before: list[list[float]],
    after: list[list[float]],
    floor: float,
    draws: int = BOOTSTRAP_DRAWS,
    before_floor: float | None = None,
) -> dict[str, tuple[float, float, float, float]]:
    """The gain of `after` over `before` on the same questions, and how sure: questions drawn with replacement
    `draws` times (seeded), both scorers on each draw. By figure (AUROC, rejected and kept at the floor, `before`
    at `before_floor` when given): (the gain on all questions, its 5th and 95th percentiles over the draws, the
    share of draws above 0)."""
    pick = np.random.default_rng(BOOTSTRAP_SEED)

    def figures(scores: list[list[float]], which, at: float) -> np.ndarray:
        scored = [(held[i], scores[i]) for i in which]
        return np.array([separation(scored), *floor_figures(scored, at)])

    everyone = range(len(held))
    was = floor if before_floor is None else before_floor
    gain = figures(after, everyone, floor) - figures(before, everyone, was)
    drawn = []
    for _ in range(draws):
        which = pick.integers(0, len(held), len(held))
        drawn.append(figures(after, which, floor) - figures(before, which, was))
    spread = np.array(drawn)
    return {
        name: (
            float(gain[i]),
            *(float(x) for x in np.nanpercentile(spread[:, i], [5, 95])),
            float(np.mean(spread[:, i] > 0)),
        )
        for i, name in enumerate(("auroc", "rejected", "kept"))
    }


def compare(
    other: Path,
    max_len: int,
    session,
    features,
    roles: dict[str, list[dict]],
    rows: int,
    combination: Combination,
    band: tuple[float, float] | None,
) -> None:
    """Prints, by domain, the gain of this file's served combination over `other`'s (calibrated the same way, on
    the same held-out questions, the same band) with its paired bootstrap."""
    before_session = solos_cross_encoder.Session(other.read_bytes(), max_len)
    before = calibrated(before_session, features, roles, rows, combination.evidence)
    was = served_held_out(before_session, features, roles, rows, before, band)
    for domain, (held, after) in served_held_out(session, features, roles, rows, combination, band).items():
        print_gain(other.name, domain, paired_bootstrap(held, was[domain][1], after, combination.floor))


def print_gain(other: str, domain: str, gains: dict[str, tuple[float, float, float, float]]) -> None:
    for name, (gain, lo, hi, above) in gains.items():
        print(
            f"against {other}, {domain}, {name:8}: {gain:+.3f} (90% of {BOOTSTRAP_DRAWS} paired draws "
            f"{lo:+.3f} .. {hi:+.3f}; above 0 in {above:.2f})"
        )


def served_held_out(
    session, features, roles: dict[str, list[dict]], rows: int, combination: Combination, band
) -> dict[str, tuple[list[dict], list[list[float]]]]:
    """By domain: the held-out records and the combination's probabilities as served."""
    out = {}
    for domain in ("fleet", "locomo"):
        held = [r for r in roles[domain] if r["rows"]]
        feats, logits = judged(session, features, held, rows)
        read = evidence_of(held, rows) if combination.evidence else None
        out[domain] = (held, [s for s, _ in served_scores(combination, logits, feats, band, read)])
    return out


def save_scores(path: Path, served: dict[str, tuple[list[dict], list[list[float]]]], floor: float) -> None:
    doc = {
        "floor": floor,
        "domains": {d: [[r["qid"], r["question"], p] for r, p in zip(*pair)] for d, pair in served.items()},
    }
    path.write_text(json.dumps(doc) + "\n")


def against_scores(path: Path, served: dict[str, tuple[list[dict], list[list[float]]]], floor: float) -> None:
    """The gain of this tree's served combination over the one `--save-scores` kept (another tree's), paired
    over the same held-out questions, each at its own floor."""
    doc = json.loads(path.read_text())
    for domain, (held, after) in served.items():
        saved = doc["domains"][domain]
        if [(q, text) for q, text, _ in saved] != [(r["qid"], r["question"]) for r in held]:
            raise SystemExit(f"{path}: its {domain} questions are not this run's (another cache or split?)")
        before = [p for _, _, p in saved]
        print_gain(path.name, domain, paired_bootstrap(held, before, after, floor, before_floor=doc["floor"]))


CV_SEEDS = 5


def compare_evidence(session, features, roles: dict[str, list[dict]], rows: int, variants: list[tuple[str, ...]]):
    """Evidence variants compared on the calibration records alone, where a choice may be made: each fitted on
    half the calibration questions and scored (AUROC, the model always run) on the other half, both ways, for
    CV_SEEDS seeded halvings; prints the mean AUROC per domain and each halving's."""
    calibration = [r for r in roles["calibrate"] if r["rows"]]
    feats, logits = judged(session, features, calibration, rows)
    read = evidence_of(calibration, rows)
    for names in variants:
        found: dict[str, list[float]] = {"fleet": [], "locomo": []}
        for seed in range(CV_SEEDS):
            half = [hashlib.sha256(f"{r['qid']}/{seed}".encode()).digest()[0] % 2 for r in calibration]
            scores: list[list[float]] = [[] for _ in calibration]
            for k in (0, 1):
                fit = [i for i in range(len(calibration)) if half[i] != k]
                extra = [[solos_cross_encoder.evidence(names, x, f) for x, f in zip(logits[i], read[i])] for i in fit]
                a, b, *weights, c = fit_combination(
                    [logits[i] for i in fit],
                    [feats[i][:rows] for i in fit],
                    [dict(calibration[i], rows=calibration[i]["rows"][:rows]) for i in fit],
                    extra if names else None,
                )
                beta = (a, b, c, names, tuple(weights)) if names else (a, b, c)
                for i in range(len(calibration)):
                    if half[i] == k:
                        scores[i] = combine(beta, logits[i], feats[i], read[i])
            for d in found:
                found[d].append(separation([(r, p) for r, p in zip(calibration, scores) if r["domain"] == d]))
        print(
            f"calibration, half fitted half scored x {CV_SEEDS}: {','.join(names) or 'no evidence':60} "
            + ", ".join(f"{d} {np.mean(v):.3f} ({' '.join(f'{x:.3f}' for x in v)})" for d, v in found.items())
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="the int8 ONNX file bench/cross_encoder.py --export wrote")
    parser.add_argument("--trial-meta", type=Path, help="its --meta file (read for max_len and fitted_by)")
    parser.add_argument("--rows", type=int, default=ROWS, help=f"rows the cross-encoder reads (default: {ROWS})")
    parser.add_argument("--max-len", type=int, help="tokens per pair, the row cut (default: the trial's, else 96)")
    parser.add_argument("--held-out", type=int, default=4, help="the LoCoMo conversation no fit sees (default: 4)")
    parser.add_argument("--calibrate", type=int, default=3, help="the conversation the combination fits on (3)")
    parser.add_argument("--data", type=Path, default=CACHE, help=f"judge_data.py's cache (default: {CACHE})")
    parser.add_argument(
        "--cascade",
        help="LO,HI: run the model only when the features judge's best head probability is within [LO, HI] "
        "(bench/cross_encoder_cascade.py chooses it on the calibration records; default: always run)",
    )
    parser.add_argument(
        "--evidence",
        help="the features judge's features the combination reads beside the two logits, comma-separated "
        f"({', '.join(sorted(solos_cross_encoder.EVIDENCE))}; 'conflict' is any conflict_*; NAME*logit: times the "
        "cross-encoder's logit, NAME*yes: times its positive part); default none",
    )
    parser.add_argument(
        "--compare-evidence",
        help="VARIANT;VARIANT;...: compare --evidence variants on the calibration records only (half fitted, half "
        "scored, seeded) and exit; an empty variant is none",
    )
    parser.add_argument("--no-hash-update", action="store_true", help="leave solos_cross_encoder's pins as they are")
    parser.add_argument(
        "--dry-run", action="store_true", help="score only: copy nothing, write no meta, leave the pins as they are"
    )
    parser.add_argument(
        "--against",
        type=Path,
        help="another model file (the shipped one), combined the same way: the paired bootstrap of the gain over it",
    )
    parser.add_argument("--save-scores", type=Path, help="keep the held-out served probabilities (JSON)")
    parser.add_argument(
        "--against-scores",
        type=Path,
        help="another tree's --save-scores file: the paired bootstrap of this tree's gain over it",
    )
    args = parser.parse_args(argv)
    trial = json.loads(args.trial_meta.read_text()) if args.trial_meta else {}
    max_len = args.max_len or int(trial.get("input", {}).get("max_len", 96))
    raw = args.model.read_bytes()
    model_sha = hashlib.sha256(raw).hexdigest()
    target = solos_cross_encoder.META_PATH.parent / args.model.name
    if args.model.resolve() != target.resolve() and not args.dry_run:
        shutil.copyfile(args.model, target)
    session = solos_cross_encoder.Session(raw, max_len)
    features = solos_judge.load(cross=None)
    if features.reason is not None:
        raise SystemExit(f"the features judge did not load: {features.reason}")

    roles = split(load(args.data), args.held_out, args.calibrate)
    if args.compare_evidence is not None:
        variants = [parse_evidence(v) for v in args.compare_evidence.split(";")]
        compare_evidence(session, features, roles, args.rows, variants)
        return 0
    fitted = calibrated(session, features, roles, args.rows, parse_evidence(args.evidence))
    print(
        f"combination on {sum(bool(r['rows']) for r in roles['calibrate'])} calibration questions: {fitted.a:.4f} x "
        f"logit + {fitted.b:.4f} x features logit + "
        + "".join(f"{w:.4f} x {n} + " for n, w in zip(fitted.evidence, fitted.weights))
        + f"{fitted.fitted_c:.4f}, intercept raised "
        f"{fitted.c - fitted.fitted_c:+.2f} so that at the floor {fitted.floor} it keeps "
        + ", ".join(f"{d} {fitted.kept[d]:.3f} (features judge {fitted.wanted[d]:.3f})" for d in fitted.wanted)
    )
    band = tuple(float(x) for x in args.cascade.split(",")) if args.cascade else None
    if band is not None and (len(band) != 2 or not 0.0 <= band[0] <= band[1] <= 1.0):
        raise SystemExit(f"--cascade {args.cascade}: want LO,HI with 0 <= LO <= HI <= 1")
    for domain, judges in held_out(session, features, roles, args.rows, fitted, band).items():  # type: ignore[arg-type]
        for name, x in judges.items():
            print(
                f"held out, {domain} ({x['questions']} questions), {name:14}: AUROC {x['auroc']:.3f}, at "
                f"{fitted.floor} rejected {x['rejected']:.3f} kept {x['kept']:.3f}, ECE {x['ece']:.3f}"
                + (f", model skipped {x['skipped']:.3f}" if band and name == "combination" else "")
            )
    if args.against:
        compare(args.against, max_len, session, features, roles, args.rows, fitted, band)
    if args.save_scores or args.against_scores:
        served = served_held_out(session, features, roles, args.rows, fitted, band)
        if args.save_scores:
            save_scores(args.save_scores, served, fitted.floor)
        if args.against_scores:
            against_scores(args.against_scores, served, fitted.floor)
    if args.dry_run:
        return 0
    meta = {
        "format": solos_cross_encoder.META_FORMAT,
        "model": args.model.name,
        "sha256": model_sha,
        "trained_by": trial.get("fitted_by"),
        "combined_by": "bench/cross_encoder_swap.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "input": {
            "pair": "question, then the row as '{agent} ({topic}): {text}' ('{agent}: {text}' with no topic)",
            "tokenizer": "models/all-MiniLM-L6-v2/tokenizer.json, truncation only_second",
            "max_len": max_len,
            "names": list(solos_cross_encoder.INPUT_NAMES),
            "output": "logit, one per row",
        },
        "rows": args.rows,
        "combination": {
            "p": "sigmoid(a * cross-encoder logit + b * logit(features judge probability) + c)",
            "a": round(fitted.a, 6),
            "b": round(fitted.b, 6),
            "c": round(fitted.c, 6),
            "fitted_c": round(fitted.fitted_c, 6),
            "floor": fitted.floor,
            "features_judge": features.sha256,
        },
    }
    if fitted.evidence:
        meta["combination"]["evidence"] = {
            "read": "the features judge's features of the row (solos_judge.FEATURES; 'conflict': any conflict_*), "
            "NAME*logit times the cross-encoder's logit, NAME*yes times its positive part, each times its weight, "
            "added to the logit above",
            "names": list(fitted.evidence),
            "weights": [round(w, 6) for w in fitted.weights],
        }
    if band is not None:
        meta["cascade"] = {
            "run": "the model, only when the features judge's best probability over the first rows is within "
            "[skip_below, skip_above]; else the features judge's probabilities stand",
            "skip_below": band[0],
            "skip_above": band[1],
        }
    meta_raw = (json.dumps(meta, indent=1) + "\n").encode()
    solos_cross_encoder.META_PATH.write_bytes(meta_raw)
    meta_sha = hashlib.sha256(meta_raw).hexdigest()
    print(f"{target}: sha256 {model_sha}\n{solos_cross_encoder.META_PATH}: sha256 {meta_sha}")
    if not args.no_hash_update:
        source = REPO / "solos_cross_encoder.py"
        text = source.read_text()
        for name, digest in (("META_SHA256", meta_sha), ("MODEL_SHA256", model_sha)):
            text = re.sub(rf'^{name} = "[0-9a-f]{{64}}"$', f'{name} = "{digest}"', text, count=1, flags=re.M)
        source.write_text(text)
        print("solos_cross_encoder.META_SHA256 and MODEL_SHA256 set; commit both files (git add models/judge)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
