"""Where the embedder's memory goes (issue 13): peak RSS per loading recipe, each in a fresh process.

Each configuration runs in its own subprocess: import, load MiniLM (the pinned
int8 weights and the carried tokenizer), embed LoCoMo turns the way the
service's background worker does (sorted, batches of 8, calls of 32 texts),
then answer single-question embeddings the way recall does. It prints VmRSS
after each step, the peak (VmHWM), write throughput and the per-query p50/p99.

    .venv/bin/python bench/embed_rss.py [--turns 400] [--queries 200] [--only NAME,...]

Configurations: `fastembed` is the loader solos_embed had before issue 13
(fastembed, threads as given, batches of 8); `solos_embed` is its loader now; `fe-*` change what
fastembed exposes (threads, enable_cpu_mem_arena); `ort-*` skip fastembed and
drive onnxruntime + tokenizers directly (mean pooling + L2, the same vectors),
which is where enable_mem_pattern and the thread pools can be set; `import-*`
are the floors of importing alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
CONFIGS = {
    "import-numpy": {"kind": "import", "modules": ["numpy"]},
    "import-ort+tokenizers": {"kind": "import", "modules": ["numpy", "onnxruntime", "tokenizers"]},
    "import-fastembed": {"kind": "import", "modules": ["numpy", "fastembed"]},
    "fastembed": {"kind": "fastembed", "kwargs": {}},
    "solos_embed": {"kind": "solos_embed"},
    "solos_embed-t1": {"kind": "solos_embed", "threads": 1},
    "fe-threads1": {"kind": "fastembed", "kwargs": {"threads": 1}},
    "fe-noarena": {"kind": "fastembed", "kwargs": {"enable_cpu_mem_arena": False}},
    "fe-noarena-threads1": {"kind": "fastembed", "kwargs": {"enable_cpu_mem_arena": False, "threads": 1}},
    "ort-default": {"kind": "ort", "arena": True, "pattern": True, "threads": 0},
    "ort-noarena": {"kind": "ort", "arena": False, "pattern": True, "threads": 0},
    "ort-noarena-nopattern": {"kind": "ort", "arena": False, "pattern": False, "threads": 0},
    "ort-noarena-nopattern-t1": {"kind": "ort", "arena": False, "pattern": False, "threads": 1},
    "ort-noarena-t1": {"kind": "ort", "arena": False, "pattern": True, "threads": 1},
    "ort-noarena-t2-seq": {"kind": "ort", "arena": False, "pattern": True, "threads": 2},
    "ort-noarena-nopattern-noprepack": {
        "kind": "ort",
        "arena": False,
        "pattern": False,
        "threads": 0,
        "prepack": False,
    },
    "ort-noarena-nopattern-basic": {"kind": "ort", "arena": False, "pattern": False, "threads": 0, "opt": "basic"},
    "ort-noarena-nopattern-extended": {
        "kind": "ort",
        "arena": False,
        "pattern": False,
        "threads": 0,
        "opt": "extended",
    },
    "ort-noarena-nopattern-noopt": {"kind": "ort", "arena": False, "pattern": False, "threads": 0, "opt": "disable"},
    "ort-lean": {"kind": "ort", "arena": False, "pattern": False, "threads": 0, "opt": "basic", "prepack": False},
    # The same weights re-quantized for integer kernels (bench/requantize_minilm.py): nothing to fold to fp32.
    "ort-dynint8": {"kind": "ort", "arena": True, "pattern": True, "threads": 0, "weights": "dynint8"},
    "ort-dynint8-noarena-nopattern": {
        "kind": "ort",
        "arena": False,
        "pattern": False,
        "threads": 0,
        "weights": "dynint8",
    },
    "ort-dynint8-noarena-nopattern-t1": {
        "kind": "ort",
        "arena": False,
        "pattern": False,
        "threads": 1,
        "weights": "dynint8",
    },
    "ort-dynint8-noarena-nopattern-t1-b2": {
        "kind": "ort",
        "arena": False,
        "pattern": False,
        "threads": 1,
        "weights": "dynint8",
        "batch": 2,
    },
    "ort-dynint8-noarena-nopattern-t1-b1": {
        "kind": "ort",
        "arena": False,
        "pattern": False,
        "threads": 1,
        "weights": "dynint8",
        "batch": 1,
    },
    "ort-dynint8-noarena-nopattern-b1": {
        "kind": "ort",
        "arena": False,
        "pattern": False,
        "threads": 0,
        "weights": "dynint8",
        "batch": 1,
    },
}
DYNINT8 = os.environ.get("MINILM_DYNINT8", "/tmp/minilm-dynint8.onnx")


def rss_mib() -> tuple[float, float]:
    """(VmRSS, VmHWM) of this process in MiB."""
    fields = {}
    for row in Path("/proc/self/status").read_text().splitlines():
        if row.startswith(("VmRSS", "VmHWM")):
            name, value = row.split(":")
            fields[name] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


class OrtEmbedder:
    """MiniLM through onnxruntime and tokenizers alone: mean pooling over the mask, then L2."""

    def __init__(
        self, weights: str, tokenizer_dir: str, arena: bool, pattern: bool, threads: int, opt: str, prepack: bool
    ) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        so = ort.SessionOptions()
        so.graph_optimization_level = {
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        }[opt]
        if not prepack:
            so.add_session_config_entry("session.disable_prepacking", "1")
        so.enable_cpu_mem_arena = arena
        so.enable_mem_pattern = pattern
        if threads:
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
            so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(weights, sess_options=so, providers=["CPUExecutionProvider"])
        self.tokenizer = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
        self.tokenizer.enable_truncation(256)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")

    def embed(self, texts: list[str], batch_size: int = 8):
        import numpy as np

        out = []
        for start in range(0, len(texts), batch_size):
            encoded = self.tokenizer.encode_batch(texts[start : start + batch_size])
            ids = np.array([e.ids for e in encoded], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
            hidden = self.session.run(
                None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            )[0]
            summed = (hidden * mask[:, :, None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1)
            out.append(summed / np.linalg.norm(summed, axis=1, keepdims=True))
        return np.vstack(out)


def child(name: str, turns: int, queries: int) -> dict:
    """Run one configuration in this process and return its measurements."""
    cfg = CONFIGS[name]
    steps = {"start": rss_mib()[0]}
    if cfg["kind"] == "import":
        for module in cfg["modules"]:
            __import__(module)
        steps["imported"] = rss_mib()[0]
        return {"name": name, "steps": steps, "peak": rss_mib()[1]}
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(BENCH))
    import numpy as np
    from locomo import DEFAULT_DATA, load_conversations

    import solos_embed

    convs = load_conversations(DEFAULT_DATA)
    texts = [f"{t.speaker} ({t.date}): {t.fact}" for c in convs for t in c.turns][:turns]
    questions = [q.question for c in convs for q in c.queries][:queries]
    steps["data"] = rss_mib()[0]
    t0 = time.perf_counter()
    if cfg["kind"] == "fastembed":
        import fastembed  # noqa: F401

        steps["imported"] = rss_mib()[0]
        import tempfile

        from fastembed import TextEmbedding

        folder = tempfile.mkdtemp(prefix="rss-")
        os.symlink(solos_embed.default_weights_path().resolve(), os.path.join(folder, "model.onnx"))
        for fname, content in solos_embed.read_tokenizer_files(solos_embed.CARRIED_MODEL_DIR).items():
            Path(folder, fname).write_bytes(content)
        model = TextEmbedding(
            solos_embed.MODEL_NAME, cache_dir=folder, specific_model_path=folder, local_files_only=True, **cfg["kwargs"]
        )

        def embed(batch: list[str]):
            order = sorted(range(len(batch)), key=lambda i: len(batch[i]))
            rows = np.empty((len(batch), solos_embed.DIM), dtype=np.float32)
            rows[order] = np.asarray(list(model.embed([batch[i] for i in order], batch_size=8)))
            return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    elif cfg["kind"] == "solos_embed":
        steps["imported"] = rss_mib()[0]
        current = solos_embed.load_embedder(None, threads=cfg.get("threads"))

        def embed(batch: list[str]):
            return solos_embed.decode_vectors(current.embed(batch))

    else:
        import onnxruntime  # noqa: F401
        import tokenizers  # noqa: F401

        steps["imported"] = rss_mib()[0]
        weights = DYNINT8 if cfg.get("weights") == "dynint8" else str(solos_embed.default_weights_path())
        ort_model = OrtEmbedder(
            weights,
            solos_embed.CARRIED_MODEL_DIR,
            cfg["arena"],
            cfg["pattern"],
            cfg["threads"],
            cfg.get("opt", "all"),
            cfg.get("prepack", True),
        )

        def embed(batch: list[str]):
            order = sorted(range(len(batch)), key=lambda i: len(batch[i]))
            rows = np.empty((len(batch), 384), dtype=np.float32)
            rows[order] = ort_model.embed([batch[i] for i in order], cfg.get("batch", 8))
            return rows

    load_s = time.perf_counter() - t0
    steps["loaded"] = rss_mib()[0]
    t0 = time.perf_counter()
    vectors = [embed(texts[i : i + 32]) for i in range(0, len(texts), 32)]
    write_rate = len(texts) / (time.perf_counter() - t0)
    steps["written"] = rss_mib()[0]
    lat = []
    for q in questions:
        t1 = time.perf_counter()
        embed([q])
        lat.append(time.perf_counter() - t1)
    lat.sort()
    steps["queried"] = rss_mib()[0]
    reference = None
    if name != "fastembed":  # agreement with today's vectors on the first 32 turns
        reference = Path(os.environ.get("RSS_REFERENCE", "/nonexistent"))
    agree = None
    if reference and reference.exists():
        ref = np.load(reference)
        agree = float(np.min(np.sum(ref * vectors[0][: len(ref)], axis=1)))
    elif name == "fastembed" and os.environ.get("RSS_REFERENCE"):
        np.save(os.environ["RSS_REFERENCE"], vectors[0])
    return {
        "name": name,
        "steps": steps,
        "peak": rss_mib()[1],
        "load_s": load_s,
        "write_per_s": write_rate,
        "query_p50_ms": 1000 * lat[len(lat) // 2],
        "query_p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
        "min_cosine_vs_fastembed": agree,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=400, help="turns embedded as writes (default: %(default)s)")
    parser.add_argument("--queries", type=int, default=200, help="single questions embedded (default: %(default)s)")
    parser.add_argument("--only", default="", help="comma-separated configurations (default: all)")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.turns, args.queries)))
        return 0
    names = [n for n in args.only.split(",") if n] or list(CONFIGS)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RSS_REFERENCE": "/tmp/embed_rss_reference.npy"}
    if "fastembed" in names:
        names.remove("fastembed")
        names.insert(0, "fastembed")
    print(
        f"{'configuration':<28}{'import':>8}{'loaded':>8}{'written':>9}{'queried':>9}{'peak':>7}"
        f"{'load s':>8}{'write/s':>9}{'q p50':>7}{'q p99':>7}{'cos':>8}   (MiB, ms)"
    )
    for name in names:
        done = subprocess.run(
            [sys.executable, __file__, "--child", name, "--turns", str(args.turns), "--queries", str(args.queries)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            print(f"{name:<28} failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        s = r["steps"]
        if "loaded" not in s:
            print(f"{name:<28}{s['imported']:>8.0f}{'':>8}{'':>9}{'':>9}{r['peak']:>7.0f}")
            continue
        cos = "" if r["min_cosine_vs_fastembed"] is None else f"{r['min_cosine_vs_fastembed']:.5f}"
        print(
            f"{name:<28}{s['imported']:>8.0f}{s['loaded']:>8.0f}{s['written']:>9.0f}{s['queried']:>9.0f}{r['peak']:>7.0f}"
            f"{r['load_s']:>8.2f}{r['write_per_s']:>9.0f}{r['query_p50_ms']:>7.1f}{r['query_p99_ms']:>7.1f}{cos:>8}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
