"""Quantize a kept fp32 cross-encoder each way and score every file held out at the served shape, side by side.

    .venv/bin/python bench/cross_encoder_quant.py FP32.onnx [--out DIR] [--only int8,qdq] [--rows 4] [--max-len 28]

The question it answers: how much of the fp32 model's accuracy does each quantization keep, and at what cost?
FP32.onnx is what `bench/cross_encoder.py --export-fp32` kept. Each of cross_encoder.QUANTIZATIONS is written
into --out (by cross_encoder.quantize, the function the training's --export uses, so a file here is byte for
byte the one a training with `--quantize HOW` exports) and then, per file, as bench/cross_encoder_swap.py would
ship it (solos_cross_encoder.Session, the service's truncation and one onnxruntime thread):

- the combination with the features judge as shipped, fitted on the calibration records and its intercept
  raised to the one floor (cross_encoder_swap.calibrated), scored held out (the fleet's score half on its own
  rows, the `--held-out` LoCoMo conversation; cross_encoder_swap.held_out): AUROC, rejected / kept at the
  floor; and the cross-encoder alone over every candidate (where quantization shows most);
- its size and its cost per row at --rows x --max-len: the thread's CPU time of Session.logits (tokenizing
  included) over the held-out questions' first rows, the files taken in turn in each of --rounds rounds so a
  change of load falls on all of them; the median round.

Static QDQ reads --calibration training pairs (cross_encoder.calibration_pairs of the split's `train` role:
the fleet's fit half without the calibration clusters, LoCoMo's training conversations), never a scored one.
Needs the service's .venv (numpy, onnx, onnxruntime, tokenizers) and judge_data.py's cache; not torch.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cross_encoder import QUANTIZATIONS, calibration_pairs, load_tokenizer, quantize, split  # noqa: E402
from cross_encoder_swap import ROWS, calibrated, held_out  # noqa: E402
from judge_data import CACHE, load  # noqa: E402

import solos_cross_encoder  # noqa: E402
import solos_judge  # noqa: E402


def cost_per_row(sessions: dict[str, solos_cross_encoder.Session], records: list[dict], rows: int, rounds: int):
    """Per file, the median over rounds of the thread's CPU ms per row (and wall ms), files in turn each round."""
    calls = [(r["question"], [solos_cross_encoder.pair_text(x) for x in r["rows"][:rows]]) for r in records]
    n = sum(len(c[1]) for c in calls)
    cpu: dict[str, list[float]] = {name: [] for name in sessions}
    wall: dict[str, list[float]] = {name: [] for name in sessions}
    for session in sessions.values():
        session.logits(*calls[0])
    for _ in range(rounds):
        for name, session in sessions.items():
            started, thread = time.perf_counter(), time.thread_time()
            for question, texts in calls:
                session.logits(question, texts)
            cpu[name].append((time.thread_time() - thread) / n * 1e3)
            wall[name].append((time.perf_counter() - started) / n * 1e3)
    return {name: (statistics.median(cpu[name]), statistics.median(wall[name])) for name in sessions}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fp32", type=Path, help="the fp32 ONNX file bench/cross_encoder.py --export-fp32 kept")
    parser.add_argument("--out", type=Path, help="write the quantized files here (default: beside FP32)")
    parser.add_argument("--only", help=f"comma-separated quantizations (default: all of {', '.join(QUANTIZATIONS)})")
    parser.add_argument("--also", type=Path, nargs="*", default=[], help="score these ready files beside them")
    parser.add_argument("--rows", type=int, default=ROWS, help=f"rows the cross-encoder reads (default: {ROWS})")
    parser.add_argument("--max-len", type=int, default=28, help="tokens per pair, the row cut (default: 28)")
    parser.add_argument("--held-out", type=int, default=4, help="the LoCoMo conversation no fit sees (default: 4)")
    parser.add_argument("--calibrate", type=int, default=3, help="the conversation the combination fits on (3)")
    parser.add_argument("--calibration", type=int, default=512, help="training pairs qdq's ranges read (512)")
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds, files in turn (default: 5)")
    parser.add_argument("--data", type=Path, default=CACHE, help=f"judge_data.py's cache (default: {CACHE})")
    args = parser.parse_args(argv)
    hows = args.only.split(",") if args.only else list(QUANTIZATIONS)
    out = args.out or args.fp32.parent
    stem = args.fp32.stem.removesuffix("-fp32")
    roles = split(load(args.data), args.held_out, args.calibrate)
    tokenizer = load_tokenizer(args.max_len)
    files: dict[str, Path] = {}
    for how in hows:
        target = out / f"{stem}-{how}.onnx"
        started = time.perf_counter()
        sha = quantize(args.fp32, target, how, tokenizer, calibration_pairs(roles["train"], args.calibration))
        print(f"{how:18} {target}: sha256 {sha} ({time.perf_counter() - started:.1f} s)", flush=True)
        files[how] = target
    for path in args.also:
        files[path.name] = path
    features = solos_judge.load(cross=None)
    if features.reason is not None:
        raise SystemExit(f"the features judge did not load: {features.reason}")
    sessions = {name: solos_cross_encoder.Session(path.read_bytes(), args.max_len) for name, path in files.items()}
    figures = {}
    for name, session in sessions.items():
        combination = calibrated(session, features, roles, args.rows)
        figures[name] = (combination, held_out(session, features, roles, args.rows, combination))
        fleet, locomo = (figures[name][1][d] for d in ("fleet", "locomo"))
        print(
            f"{name:18} combination fleet {fleet['combination']['auroc']:.3f} LoCoMo "
            f"{locomo['combination']['auroc']:.3f}; cross-encoder alone fleet {fleet['cross-encoder']['auroc']:.3f} "
            f"LoCoMo {locomo['cross-encoder']['auroc']:.3f}",
            flush=True,
        )
    scored = [r for d in ("fleet", "locomo") for r in roles[d] if r["rows"]]
    costs = cost_per_row(sessions, scored, args.rows, args.rounds)
    features_auroc = {d: next(iter(figures.values()))[1][d]["features judge"]["auroc"] for d in ("fleet", "locomo")}
    print(
        f"\nheld out at {args.rows} x {args.max_len} (fleet score half / LoCoMo conversation {args.held_out}); "
        f"features judge alone: fleet {features_auroc['fleet']:.3f}, LoCoMo {features_auroc['locomo']:.3f}; CPU "
        f"per row: thread time of Session.logits, {args.rows} rows a call, median of {args.rounds} rounds"
    )
    print(
        "| file | MB | ms/row CPU (wall) | cross-encoder alone fleet / LoCoMo | combination fleet / LoCoMo | "
        "fleet rejected / kept | LoCoMo rejected / kept | a, b, c |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, (combination, by_domain) in figures.items():
        fleet, locomo = by_domain["fleet"], by_domain["locomo"]
        cpu, wall = costs[name]
        print(
            f"| {name} | {files[name].stat().st_size / 2**20:.1f} | {cpu:.2f} ({wall:.2f}) | "
            f"{fleet['cross-encoder']['auroc']:.3f} / {locomo['cross-encoder']['auroc']:.3f} | "
            f"{fleet['combination']['auroc']:.3f} / {locomo['combination']['auroc']:.3f} | "
            f"{fleet['combination']['rejected']:.3f} / {fleet['combination']['kept']:.3f} | "
            f"{locomo['combination']['rejected']:.3f} / {locomo['combination']['kept']:.3f} | "
            f"{combination.a:.3f}, {combination.b:.3f}, {combination.c:.3f} |"
        )
    print("sha256: " + ", ".join(f"{n} {hashlib.sha256(p.read_bytes()).hexdigest()[:12]}" for n, p in files.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
