#!/usr/bin/env python3
"""Hybrid recall's two model runs, one at a time against several in one run: ms a question, and the same answers.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/embed_batch.py [--data LOCOMO.json] [--sizes 1,2,4,8,16] [--rounds 5]

What micro-batching concurrent recalls would buy. A recall embeds its question alone (solos_embed.Embedder.embed,
one session run per text) and the cross-encoder reads its own 4 rows in one run (solos_cross_encoder). When
several recalls wait, their questions could go in one run (padded to the longest, with the attention mask, mean
pooling over real tokens only) and so could their cross-encoder pairs. Real LoCoMo questions (200, bench/load.py's
sample), each size's batches taken over the same questions; for the cross-encoder each question with 4 LoCoMo
turns as its rows (as recall's pair_text gives them). Printed per size: wall ms and CPU ms (this thread's) a
question, the gain over size 1, and how far each answer moved from size 1's (1 - cosine of the vectors; logit
difference), median and worst; then why they move (int8 scales are per run): a question 4 times in one run, 4
questions of one token count in one run, and a recall's 4 rows read together against each alone, as recall reads
them today. Sizes run interleaved, round after round, so a shared machine's load falls on each alike; the best
round of each is printed beside the median. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from locomo_data import DEFAULT_DATA, agent_names, load_conversations  # noqa: E402
from locomo_shape import questions  # noqa: E402

import solos_cross_encoder  # noqa: E402
import solos_embed  # noqa: E402

QUESTIONS = 200
ROWS = 4  # the cross-encoder's rows a recall (models/judge/cross-encoder.json)


def batch_embed(embedder: Any) -> Callable[[list[str]], list[bytes]]:
    """A function embedding texts in one session run of `embedder` (solos_embed.Embedder): padded to the longest
    with the attention mask, mean pooling over each text's real tokens only; blobs as Embedder.embed gives them."""
    import numpy as np

    tokenizer, session, inputs = embedder._tokenizer, embedder._session, embedder._inputs

    def embed(texts: list[str]) -> list[bytes]:
        encoded = [tokenizer.encode(text).ids for text in texts]
        ids = np.zeros((len(encoded), max(map(len, encoded))), dtype=np.int64)
        mask = np.zeros_like(ids)
        for i, row in enumerate(encoded):
            ids[i, : len(row)], mask[i, : len(row)] = row, 1
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden = session.run(None, {name: value for name, value in feed.items() if name in inputs})[0]
        vectors = (hidden * mask[:, :, None]).sum(axis=1) / mask.sum(axis=1, keepdims=True).astype(np.float32)
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return [vector.astype("<f4").tobytes() for vector in vectors]

    return embed


def batch_logits(session: Any, recalls: Sequence[tuple[str, Sequence[str]]]) -> list[list[float]]:
    """Each recall's (question, rows) logits from one run of the cross-encoder's `session`
    (solos_cross_encoder.Session): every recall's pairs padded together."""
    import numpy as np

    pairs, sizes = [], []
    for question, rows in recalls:
        asked = session.question(question)
        pairs += [session.pair(asked, row) for row in rows]
        sizes.append(len(rows))
    ids, types, mask = solos_cross_encoder.padded(pairs)
    out = session.session.run(None, {"input_ids": ids, "token_type_ids": types, "attention_mask": mask})[0]
    flat = [float(x) for x in np.asarray(out, dtype=np.float64).reshape(-1)]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [flat[start : start + size] for start, size in zip(starts, sizes)]


def timed(batches: Sequence[Sequence], run: Callable[[Sequence], object]) -> tuple[float, float]:
    """Wall and CPU seconds to run every batch."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for batch in batches:
        run(batch)
    return time.perf_counter() - wall, time.thread_time() - cpu


def chunks(items: Sequence, size: int) -> list[Sequence]:
    return [items[i : i + size] for i in range(0, len(items) - size + 1, size)]


def sweep(
    title: str,
    items: Sequence,
    sizes: list[int],
    rounds: int,
    run: Callable[[Sequence], object],
    disagreement: str,
    apart: dict[int, list[float]],
) -> None:
    """Time every size, interleaved round after round, and print each size's row with its disagreement (`apart`:
    each item's, against size 1)."""
    walls: dict[int, list[float]] = {size: [] for size in sizes}
    cpus: dict[int, list[float]] = {size: [] for size in sizes}
    for size in sizes:  # warm every shape once
        timed(chunks(items, size)[:2], run)
    for _ in range(rounds):
        for size in sizes:
            batches = chunks(items, size)
            wall, cpu = timed(batches, run)
            walls[size].append(1000 * wall / (len(batches) * size))
            cpus[size].append(1000 * cpu / (len(batches) * size))
    print(f"\n{title}")
    print(
        "| batch | wall ms each (median, best) | CPU ms each (median, best) | CPU gain over 1 | "
        + disagreement
        + " (median, worst) |"
    )
    print("| --- | --- | --- | --- | --- |")
    one = statistics.median(cpus[sizes[0]])
    for size in sizes:
        wall, cpu = statistics.median(walls[size]), statistics.median(cpus[size])
        print(
            f"| {size} | {wall:.2f}, {min(walls[size]):.2f} | {cpu:.2f}, {min(cpus[size]):.2f} | {one / cpu:.2f}x "
            f"| {statistics.median(apart[size]):.1e}, {max(apart[size]):.1e} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo JSON (default: %(default)s)")
    parser.add_argument("--sizes", default="1,2,4,8,16", help="questions a run (default: %(default)s)")
    parser.add_argument("--cross-sizes", default="1,2,4,8", help="recalls a cross-encoder run (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved sweeps of every size (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=7, help="question sample seed, as bench/load.py's (default: 7)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    cross_sizes = [int(s) for s in args.cross_sizes.split(",")]
    asked = questions(args.data, QUESTIONS, args.seed)
    load = os.getloadavg()
    print(f"{len(asked)} LoCoMo questions, mean {sum(map(len, asked)) / len(asked):.0f} characters; load {load[0]:.2f}")

    embedder = solos_embed.load_embedder(None, threads=1)
    batcher = batch_embed(embedder)

    def cosine_apart(texts: Sequence[str], size: int) -> list[float]:
        """Each text's 1 - cosine between its vector from runs of `size` texts and its own run's."""
        batched = [blob for batch in chunks(texts, size) for blob in batcher(list(batch))]
        alone = [embedder.embed([text])[0] for text in texts[: len(batched)]]
        together = solos_embed.decode_vectors(batched) * solos_embed.decode_vectors(alone)
        return [float(x) for x in 1.0 - together.sum(axis=1)]

    sweep(
        "Question embedding (batch_embed; batch 1 is one run a question, as recall embeds today)",
        asked,
        sizes,
        args.rounds,
        lambda batch: batcher(list(batch)),
        "1 - cosine to batch 1",
        {size: cosine_apart(asked, size) for size in sizes},
    )
    # Why they differ: both models quantize each activation tensor to int8 with one scale for the whole run
    # (DynamicQuantizeLinear), so a text's numbers depend on the others in its run, padded or not.
    same = [cosine_apart([q] * 4, 4) for q in asked[:20]]
    width: dict[int, list[str]] = {}
    for q in asked:
        width.setdefault(len(embedder._tokenizer.encode(q).ids), []).append(q)
    even = [x for group in width.values() for x in cosine_apart(group, 4)]
    print(
        f"a question 4 times in one run: worst 1 - cosine {max(map(max, same)):.1e}; "
        f"4 questions of the same token count (no padding): median {statistics.median(even):.1e}, worst {max(even):.1e}"
    )

    conversations = load_conversations(args.data)
    turns = [t for c in conversations for t in c.turns]
    agents = agent_names([t.speaker for t in turns])
    pick = random.Random(args.seed)
    recalls = []
    for q in asked:
        rows = [
            solos_cross_encoder.pair_text({"agent": agents[turn.speaker], "topic": turn.date, "text": turn.fact})
            for turn in pick.sample(turns, ROWS)
        ]
        recalls.append((q, rows))
    judge = solos_cross_encoder.load()
    assert judge.meta is not None, judge.reason
    runner = solos_cross_encoder.runner(judge.folder / judge.meta.model, judge.meta.sha256, judge.meta.max_len)
    assert runner.ready(30.0) and runner.session is not None, runner.failure
    session = runner.session
    alone = [session.logits(q, rows) for q, rows in recalls]

    def logits_apart(size: int) -> list[float]:
        got = [x for batch in chunks(recalls, size) for x in batch_logits(session, list(batch))]
        return [abs(a - b) for mine, theirs in zip(got, alone) for a, b in zip(mine, theirs)]

    sweep(
        f"Cross-encoder, {ROWS} rows a recall (batch: recalls a run; 1 is Session.logits, as recall runs it today)",
        recalls,
        cross_sizes,
        args.rounds,
        lambda batch: batch_logits(session, list(batch)),
        "logit difference to batch 1",
        {size: logits_apart(size) for size in cross_sizes},
    )
    each = [abs(a - session.logits(q, [row])[0]) for (q, rows), got in zip(recalls, alone) for row, a in zip(rows, got)]
    print(
        f"today's run of a recall's {ROWS} rows against each row run alone: logit difference median "
        f"{statistics.median(each):.2f}, worst {max(each):.2f} (x a = {judge.meta.a:g} in the judge's logit)"
    )
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
