"""Average the weights of cross-encoders trained from the same start (a "model soup") and quantize the mean.

    .venv/bin/python bench/cross_encoder_soup.py A-fp32.onnx B-fp32.onnx [...] --export SOUP.onnx
        [--export-fp32 SOUP-fp32.onnx] [--quantize int8-tensor]

The inputs are fp32 ONNX files bench/cross_encoder.py kept with --export-fp32: the same recipe trained with other
--seed values (the data's draws, the batch order and dropout move with the seed; the head's start does not, so
every run starts from the same weights, which averaging needs). The graphs must be the same but for their
weights (same layers, same export); each float initializer of the output is the mean of the inputs' (computed in
float64, rounded once to float32), everything else is the first file's. Then cross_encoder.quantize (the
function the training's --export uses) writes the int8 file the service would load, per tensor by default as the
shipped file is. No randomness: the same inputs give the same bytes (the sha256 is printed). Score the result
with bench/cross_encoder_swap.py SOUP.onnx --dry-run --against the shipped file.

Needs onnx, numpy and onnxruntime (the service's .venv has them); not torch.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cross_encoder import QUANTIZATIONS, quantize  # noqa: E402


def averaged(paths: list[Path]):
    """The first model with each float initializer replaced by the mean over all `paths`' models; SystemExit when
    the graphs differ in more than their weights."""
    import onnx
    from onnx import numpy_helper

    models = [onnx.load(str(p)) for p in paths]

    def skeleton(model) -> bytes:
        graph = onnx.GraphProto()
        graph.CopyFrom(model.graph)
        del graph.initializer[:]
        return graph.SerializeToString(deterministic=True)

    first = models[0]
    shapes = {i.name: (tuple(i.dims), i.data_type) for i in first.graph.initializer}
    for path, model in zip(paths[1:], models[1:]):
        if skeleton(model) != skeleton(first):
            raise SystemExit(f"{path}: its graph is not {paths[0]}'s (other layers, shape or export)")
        if {i.name: (tuple(i.dims), i.data_type) for i in model.graph.initializer} != shapes:
            raise SystemExit(f"{path}: its weights' names or shapes are not {paths[0]}'s")
    tables = [{i.name: numpy_helper.to_array(i) for i in m.graph.initializer} for m in models]
    for i, init in enumerate(first.graph.initializer):
        values = [t[init.name] for t in tables]
        if values[0].dtype.kind == "f":
            mean = np.mean(np.stack([v.astype(np.float64) for v in values]), axis=0).astype(values[0].dtype)
        elif all(np.array_equal(values[0], v) for v in values[1:]):
            continue
        else:
            raise SystemExit(f"{init.name}: a {values[0].dtype} weight that differs between the files")
        first.graph.initializer[i].CopyFrom(numpy_helper.from_array(mean, init.name))
    return first


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", type=Path, nargs="+", help="fp32 ONNX files (bench/cross_encoder.py --export-fp32)")
    parser.add_argument("--export", type=Path, required=True, help="the quantized average's file")
    parser.add_argument("--export-fp32", type=Path, help="keep the fp32 average here too")
    parser.add_argument(
        "--quantize",
        default="int8-tensor",
        help=f"how --export is quantized: {', '.join(QUANTIZATIONS)} (int8-tensor, as shipped)",
    )
    args = parser.parse_args(argv)
    if len(args.models) < 2:
        raise SystemExit("average what? give two fp32 files or more")
    import onnx

    for path in args.models:
        print(f"{path}: sha256 {sha256(path)}")
    soup = averaged(args.models)
    with tempfile.TemporaryDirectory(prefix="xenc-soup-") as tmp:
        fp32 = args.export_fp32 or Path(tmp) / "soup-fp32.onnx"
        fp32.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(soup, str(fp32))
        if args.export_fp32:
            print(f"kept {fp32}: sha256 {sha256(fp32)}")
        print(f"exported {args.export} ({args.quantize}): sha256 {quantize(fp32, args.export, args.quantize)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
