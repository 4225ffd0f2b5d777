"""A learned linear reranker over the fused top candidates (issue 13), trained and scored leave-one-conversation-out.

Each (question, candidate) among the first pass's top DEPTH gets a few cheap
features the service already has at recall time (both legs' scores and ranks,
the neighbours' scores, whether the question names the writer, the row's own
shape: a question? how long? an image?, the date window, query-term coverage).
A logistic regression (numpy, L2) is fitted on four conversations and ranks
the fifth; the printed figures are held-out only (plus an all-five fit for
the weights to port, bench/rank_v2.py LTR_*). Serving it is a dot product per
candidate: pure Python, keyword-only included.

    .venv/bin/python bench/ltr_research.py
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rank_v2  # noqa: E402
from locomo import DEFAULT_DATA, Conversation, load_conversations, summarise  # noqa: E402
from locomo_research import linear, neighbour_scores, normalised, ranks_of, smooth, text_speaker_date  # noqa: E402
from locomo_research import vector_scores  # noqa: E402
from recall_v2_research import HEAD, kw_leg, line, query_rows  # noqa: E402

import solos_embed  # noqa: E402

DEPTH = 30


def row_stem(word: str) -> str:
    return word[:5]


def features(
    conv: Conversation, kw: np.ndarray, vec: np.ndarray | None, fused: np.ndarray, qi: int, cands: np.ndarray
) -> np.ndarray:
    """One row of features per candidate turn of question qi."""
    q = conv.queries[qi].question
    words = [w for w in rank_v2.query_words(q) if w not in rank_v2.STOP_WORDS]
    stems = {row_stem(w) for w in words}
    named = {s for s in conv.speakers if re.search(rf"\b{re.escape(s)}\b", q, re.IGNORECASE)}
    window = rank_v2.date_window(q, 7)
    kwn = normalised(kw[qi : qi + 1], 100, "minmax")[0]
    kw_rank = ranks_of(kw[qi : qi + 1], 100)[0]
    fz_rank = ranks_of(fused[qi : qi + 1], DEPTH)[0]
    prev_k, next_k = (s[0] for s in neighbour_scores(conv, kwn[None, :], [-1, 1]))
    cols = []
    for i in cands:
        t = conv.turns[int(i)]
        toks = {row_stem(w) for w in re.findall(r"\w+", t.fact.lower())}
        cover = len(stems & toks) / max(len(stems), 1)
        day = rank_v2.parse_row_date(t.date) or -1
        f = [
            fused[qi, i],
            1.0 / fz_rank[i],
            kwn[i],
            1.0 / kw_rank[i] if np.isfinite(kw_rank[i]) else 0.0,
            max(prev_k[i], next_k[i]),
            prev_k[i],
            next_k[i],
            float(t.speaker in named),
            float(bool(named) and t.speaker not in named),
            float(t.text.rstrip().endswith("?")),
            float(np.log1p(len(t.text.split()))),
            float(bool(t.caption)),
            float(window is not None and window[0] <= day <= window[1]),
            cover,
        ]
        if vec is not None:
            vn = normalised(vec[qi : qi + 1], 100, "minmax")[0]
            f += [vec[qi, i], vn[i]]
        cols.append(f)
    return np.array(cols)


def build(convs, kws, vecs, fuseds):
    """Per conversation: (X, y, query index, candidate index) over every question's top DEPTH."""
    out = []
    for ci, conv in enumerate(convs):
        X, y, qs, cs = [], [], [], []
        idx = {t.dia_id: i for i, t in enumerate(conv.turns)}
        for qi, q in enumerate(conv.queries):
            order = np.argsort(-fuseds[ci][qi], kind="stable")[:DEPTH]
            order = order[fuseds[ci][qi, order] > 0]
            if not len(order):
                continue
            evidence = {idx[e] for e in q.evidence}
            X.append(features(conv, kws[ci], None if vecs is None else vecs[ci], fuseds[ci], qi, order))
            y += [float(int(i) in evidence) for i in order]
            qs += [qi] * len(order)
            cs += list(order)
        out.append((np.vstack(X), np.array(y), np.array(qs), np.array(cs)))
    return out


def fit(X: np.ndarray, y: np.ndarray, l2: float = 1.0, steps: int = 50) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Logistic regression by Newton steps on standardised features; returns (weights, mean, scale)."""
    mu, sd = X.mean(axis=0), X.std(axis=0)
    sd[sd == 0] = 1
    Z = np.hstack([(X - mu) / sd, np.ones((len(X), 1))])
    w = np.zeros(Z.shape[1])
    reg = l2 * np.eye(Z.shape[1])
    reg[-1, -1] = 0
    for _ in range(steps):
        p = 1 / (1 + np.exp(-Z @ w))
        g = Z.T @ (p - y) + reg @ w
        H = (Z * (p * (1 - p))[:, None]).T @ Z + reg
        step = np.linalg.solve(H, g)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w, mu, sd


def rerank(fused: np.ndarray, data, model) -> np.ndarray:
    """Candidates ordered by the model's score, above every non-candidate (those keep the fused order)."""
    X, _, qs, cs = data
    w, mu, sd = model
    z = np.hstack([(X - mu) / sd, np.ones((len(X), 1))]) @ w
    out = fused * 0.001
    out[qs, cs] = 10 + 1 / (1 + np.exp(-z))
    return out


def run(convs, kws, vecs, fuseds, title: str, l2s=(0.1, 1.0, 10.0)) -> None:
    data = build(convs, kws, vecs, fuseds)
    print(line(f"{title}: first pass", summarise([r for c, m in zip(convs, fuseds) for r in query_rows(c, m)])))
    for l2 in l2s:
        held = []
        for h in range(len(convs)):
            X = np.vstack([d[0] for j, d in enumerate(data) if j != h])
            y = np.concatenate([d[1] for j, d in enumerate(data) if j != h])
            model = fit(X, y, l2)
            held += query_rows(convs[h], rerank(fuseds[h], data[h], model))
        print(line(f"{title}: LTR top {DEPTH}, l2 {l2}, LOCO (held-out)", summarise(held)))
    model = fit(np.vstack([d[0] for d in data]), np.concatenate([d[1] for d in data]), l2s[1])
    ins = [r for c, f, d in zip(convs, fuseds, data) for r in query_rows(c, rerank(f, d, model))]
    print(line(f"{title}: LTR top {DEPTH}, l2 {l2s[1]}, in-sample", summarise(ins)))
    print("    weights (standardised):", np.round(model[0], 3).tolist())
    print("    mean:", np.round(model[1], 4).tolist())
    print("    scale:", np.round(model[2], 4).tolist(), flush=True)


def main() -> int:
    started = time.perf_counter()
    convs = load_conversations(DEFAULT_DATA)
    embedder = solos_embed.load_embedder(None)
    vec = smooth(convs, vector_scores(convs, embedder, text_speaker_date), 0.5, 1)
    kw = kw_leg(convs, rank_v2.STOP_WORDS)
    kw_only = normalised_all = [normalised(m, 100, "minmax") for m in kw]
    hy = linear([kw, vec], [0.7, 0.3], 100, "minmax")
    del normalised_all
    print(HEAD)
    run(convs, kw, None, kw_only, "keyword")
    run(convs, kw, vec, hy, "hybrid")
    print(f"run time {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
