"""Late interaction (MaxSim) over MiniLM's token states as a reranker feature (issue 13), held-out.

The embedder already computes a state per token before it pools them into one
vector. MaxSim (as ColBERT scores) compares them one by one: each question
token's best cosine against the row's tokens, averaged over the question's
content tokens. It sees "religious" ~ "church" where one pooled vector blurs
it. Measured here as an extra reranker feature over the fused top 20, fitted
on four conversations and scored on the fifth (ltr_research's machinery), and
as a leg of its own. The service has the question's token states for free; a
row's would cost a model run per candidate at recall time (or their storage).

    .venv/bin/python bench/maxsim_research.py        # about 1 minute with cached token states
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import ltr_research  # noqa: E402
from locomo import DEFAULT_DATA, load_conversations, summarise  # noqa: E402
from locomo_research import CACHE, linear, normalised, smooth, text_speaker_date, vector_scores  # noqa: E402
from recall_v2_research import HEAD, kw_leg, line, query_rows  # noqa: E402

import solos_embed  # noqa: E402
import solos_rank  # noqa: E402


def token_states(embedder, texts: list[str], content_only: bool) -> list[np.ndarray]:
    """Each text's token states, L2-normalised per token, without [CLS]/[SEP] (and stop words, for questions)."""
    key = hashlib.sha256("\0".join([embedder.model_id, str(content_only), *texts]).encode()).hexdigest()[:24]
    path = CACHE / f"tokens-{key}.npz"
    if path.exists():
        stored = np.load(path)
        return [stored[f"a{i}"] for i in range(len(texts))]
    out = []
    for text in texts:
        encoding = embedder._tokenizer.encode(text)
        ids = np.array([encoding.ids], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        feed = {name: value for name, value in feed.items() if name in embedder._inputs}
        hidden = embedder._session.run(None, feed)[0][0]
        keep = []
        for i, token in enumerate(encoding.tokens):
            if token in ("[CLS]", "[SEP]"):
                continue
            if content_only and (token.lower() in solos_rank.STOP_WORDS or not any(ch.isalnum() for ch in token)):
                continue
            keep.append(i)
        states = hidden[keep or [i for i, t in enumerate(encoding.tokens) if t not in ("[CLS]", "[SEP]")] or [0]]
        out.append((states / np.linalg.norm(states, axis=1, keepdims=True).clip(1e-9)).astype(np.float16))
    CACHE.mkdir(parents=True, exist_ok=True)
    np.savez(path, **{f"a{i}": a for i, a in enumerate(out)})
    return out


def maxsim_matrix(questions: list[np.ndarray], turns: list[np.ndarray]) -> np.ndarray:
    """MaxSim of every question against every turn: mean over question tokens of the best turn token."""
    lengths = [len(t) for t in turns]
    starts = np.cumsum([0, *lengths])
    stacked = np.vstack(turns).astype(np.float32)
    out = np.zeros((len(questions), len(turns)), dtype=np.float32)
    for qi, q in enumerate(questions):
        sims = q.astype(np.float32) @ stacked.T  # (q tokens, all turn tokens)
        best = np.maximum.reduceat(sims, starts[:-1], axis=1)  # per turn: each q token's best
        out[qi] = best.mean(axis=0)
    return out


def augmented(data, convs, maxsim) -> list:
    """ltr_research.build's rows plus MaxSim, its min-max in the head, and the next turn's MaxSim."""
    out = []
    for conv, m, (X, y, qs, cs) in zip(convs, maxsim, data):
        own = m[qs, cs]
        scaled = np.zeros_like(own)
        for q in np.unique(qs):
            at = qs == q
            lo, hi = own[at].min(), own[at].max()
            scaled[at] = (own[at] - lo) / (hi - lo) if hi > lo else 1.0
        sessions = np.array([t.session for t in conv.turns])
        nxt = np.where(
            (cs + 1 < len(conv.turns)) & (sessions[np.minimum(cs + 1, len(conv.turns) - 1)] == sessions[cs]),
            m[qs, np.minimum(cs + 1, len(conv.turns) - 1)],
            0.0,
        )
        out.append((np.hstack([X, np.stack([own, scaled, nxt], axis=1)]), y, qs, cs))
    return out


def paired(a: list, b: list, title: str) -> None:
    for metric in ("hit@5", "frac@10", "MRR"):
        d = np.array([x[1][metric] - y[1][metric] for x, y in zip(a, b)])
        print(f"    {title} {metric}: {d.mean():+.4f} +- {2 * d.std(ddof=1) / np.sqrt(len(d)):.4f} (2 SE)")


def main() -> int:
    started = time.perf_counter()
    convs = load_conversations(DEFAULT_DATA)
    embedder = solos_embed.load_embedder(None)
    maxsim = []
    for conv in convs:
        turns = token_states(embedder, [t.fact for t in conv.turns], content_only=False)
        questions = token_states(embedder, [q.question for q in conv.queries], content_only=True)
        maxsim.append(maxsim_matrix(questions, turns))
    print(f"token states and MaxSim in {time.perf_counter() - started:.0f} s")
    raw = vector_scores(convs, embedder, text_speaker_date)
    vec = smooth(convs, raw, 0.5, 1)
    kw = kw_leg(convs, solos_rank.STOP_WORDS)
    kw_only = [normalised(m, 100, "minmax") for m in kw]
    hy = linear([kw, vec], [0.7, 0.3], 100, "minmax")
    print(HEAD)
    for title, scores in (("MaxSim alone (every turn)", maxsim), ("pooled cosine alone (every turn)", raw)):
        print(line(title, summarise([r for c, m in zip(convs, scores) for r in query_rows(c, m)])))
    ltr_research.DEPTH = solos_rank.RERANK_DEPTH
    for title, vecs, fused in (("keyword", None, kw_only), ("hybrid", vec, hy)):
        data = ltr_research.build(convs, kw, vecs, fused)
        base = ltr_research.held_out(convs, fused, data)
        print(line(f"{title}: reranker today, LOCO", summarise(base)))
        more = augmented(data, convs, maxsim)
        held = ltr_research.held_out(convs, fused, more)
        print(line(f"{title}: + MaxSim features, LOCO", summarise(held)))
        paired(held, base, f"{title} MaxSim - today")
        for weight in (0.2, 0.3):
            legs = linear([kw, vec, maxsim], [0.7 - weight / 2, 0.3 - weight / 2, weight], 100, "minmax")
            if vecs is None:
                legs = linear([kw, maxsim], [1 - weight, weight], 100, "minmax")
            d = ltr_research.build(convs, kw, vecs, legs)
            h = ltr_research.held_out(convs, legs, augmented(d, convs, maxsim))
            print(line(f"{title}: MaxSim as a leg ({weight}) + features, LOCO", summarise(h)))
            paired(h, base, f"{title} MaxSim leg {weight} - today")
    print(f"run time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
