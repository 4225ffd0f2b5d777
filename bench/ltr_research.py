"""A learned linear reranker over the fused top candidates (issue 13), trained and scored leave-one-conversation-out.

Each (question, candidate) among the first pass's top DEPTH gets a few cheap
features the service already has at recall time (both legs' scores and ranks,
the neighbours' scores, whether the question names the writer, the row's own
shape: a question? how long? an image?, the date window, query-term coverage).
A linear model (numpy, L2; see OBJECTIVE) is fitted on four conversations and ranks
the fifth; the printed figures are held-out only (plus an all-five fit for
the weights the service carries, solos_rank.LTR_WEIGHTS). The features are
the service's own (solos_rank.ltr_features). Serving it is a dot product per
candidate: pure Python, keyword-only included. bench/locomo.py prints
reranker_figures() beside the service's figures.

    .venv/bin/python bench/ltr_research.py [--dynint8] [--variants]

The weights are fitted by OBJECTIVE (the pointwise logistic regression); a
listwise fit (ListNet: a softmax over each question's candidates, calibrated
to a probability after) is printed beside it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import rank_v2  # noqa: E402
from locomo import DEFAULT_DATA, Conversation, load_conversations, summarise  # noqa: E402
from locomo_research import (  # noqa: E402
    linear,
    neighbour_scores,
    normalised,
    ranks_of,
    smooth,
    text_speaker_date,
    vector_scores,  # noqa: E402
)
from recall_v2_research import HEAD, kw_leg, line, query_rows  # noqa: E402

import solos_rank  # noqa: E402

DEPTH = solos_rank.RERANK_DEPTH
EXTRA = False  # rank_v2.EXTRA_FEATURES on top
# The fitting objective of the weights the service carries: "logistic" (a pointwise logistic regression) or
# "listwise" (ListNet, first-pass rank weights held >= 0, then a logistic calibration of its score). Listwise
# lifts held-out hit@1 and MRR by about 0.01 but stays within noise once its variant is chosen held-out, and
# hit@5 / frac@10 do not move (RESULTS-locomo.md, "Recall v2", "Round two"): not adopted; run() prints both.
OBJECTIVE = "logistic"


def features(
    conv: Conversation, kw: np.ndarray, vec: np.ndarray | None, fused: np.ndarray, qi: int, cands: np.ndarray
) -> np.ndarray:
    """One row of solos_rank.ltr_features per candidate turn of question qi (the service's view of a turn)."""
    q = conv.queries[qi].question
    question = solos_rank.Question.of(q, solos_rank.query_words(q), conv.speakers)
    kwn = normalised(kw[qi : qi + 1], 100, "minmax")[0]
    kw_rank = ranks_of(kw[qi : qi + 1], 100)[0]
    fz_rank = ranks_of(fused[qi : qi + 1], DEPTH)[0]
    prev_k, next_k = (s[0] for s in neighbour_scores(conv, kwn[None, :], [-1, 1]))
    vn = None if vec is None else normalised(vec[qi : qi + 1], 100, "minmax")[0]

    def row(j: int) -> dict:
        t = conv.turns[j]
        return solos_rank.ranking_view(t.fact, t.speaker, t.date, None)

    sessions = [conv.turns[int(c)].session for c in cands]
    asks_when = q.lower().startswith("when") or " when " in q.lower()
    cols = []
    for i in (int(c) for c in cands):
        t = conv.turns[i]
        prev = row(i - 1) if i > 0 and conv.turns[i - 1].session == t.session else None
        nxt = row(i + 1) if i + 1 < len(conv.turns) and conv.turns[i + 1].session == t.session else None
        first_pass = {
            "fused": float(fused[qi, i]),
            "fused_rank": float(fz_rank[i]),
            "keyword": float(kwn[i]),
            "keyword_rank": float(kw_rank[i]) if np.isfinite(kw_rank[i]) else None,
            "neighbour_prev": float(prev_k[i]),
            "neighbour_next": float(next_k[i]),
        }
        if EXTRA:
            same = [int(c) for c, sess in zip(cands, sessions) if sess == t.session]
            first_pass.update(
                topic_share=len(same) / len(cands),
                topic_best=max(float(fused[qi, j]) for j in same),
                asks_when=asks_when,
            )
        if vec is not None:
            first_pass.update(cosine=float(vec[qi, i]), vector=float(vn[i]))
        features = solos_rank.ltr_features(question, row(i), prev, nxt, first_pass)
        cols.append(features + (rank_v2.extra_features(t.fact, features, first_pass) if EXTRA else []))
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


MONOTONE = tuple(solos_rank.KEYWORD_FEATURES.index(name) for name in ("fused_rr", "keyword_rr"))


def fit_listwise(
    data, l2: float = 1.0, monotone: tuple[int, ...] = MONOTONE
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ListNet on standardised features: a softmax over each question's candidates against the answers' share
    (the answers split the target evenly), Newton steps with step halving, L2; then a logistic regression of
    the label on the resulting score (two weights) so the model's output is again a probability. The ranking
    is the softmax's; the weights of the `monotone` columns (the first-pass ranks) are kept >= 0. Returns
    (weights with the bias last, mean, scale) as fit does."""
    X = np.vstack([d[0] for d in data])
    y = np.concatenate([d[1] for d in data])
    mu, sd = X.mean(axis=0), X.std(axis=0)
    sd[sd == 0] = 1
    Z = (X - mu) / sd
    groups, at = [], 0
    for Xd, yd, qs, _ in data:
        for q in np.unique(qs):
            idx = np.flatnonzero(qs == q)
            if yd[idx].sum():
                groups.append((at + idx, yd[idx] / yd[idx].sum()))
        at += len(Xd)

    def loss_grad_hess(w: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        loss, g, H = 0.5 * l2 * w @ w, l2 * w, l2 * np.eye(len(w))
        for idx, target in groups:
            Zg = Z[idx]
            s = Zg @ w
            p = np.exp(s - s.max())
            p /= p.sum()
            loss -= target @ np.log(p + 1e-300)
            g = g + Zg.T @ (p - target)
            m = Zg.T @ p
            H = H + Zg.T @ (Zg * p[:, None]) - np.outer(m, m)
        return loss, g, H

    def newton() -> np.ndarray:
        w = np.zeros(Z.shape[1])
        loss, g, H = loss_grad_hess(w)
        for _ in range(50):  # a full Newton step overshoots from 0 here: halve it until the loss falls
            step, size = np.linalg.solve(H, g), 1.0
            new = loss_grad_hess(w - step)
            while new[0] >= loss and size > 1e-4:
                size /= 2
                new = loss_grad_hess(w - size * step)
            if new[0] >= loss:
                break
            w = w - size * step
            done = loss - new[0] < 1e-9 * loss
            loss, g, H = new
            if done:
                break
        return w

    w = newton()
    # A better first-pass rank must never lower a row's score (rows alike in every other input keep the first
    # pass's order): a rank weight that comes out negative is held at 0 and the rest fitted again.
    while (negative := [j for j in monotone if j < len(w) and w[j] < 0]) and np.any(Z[:, negative]):
        Z[:, negative] = 0.0
        w = newton()
    slope, bias = calibrate(Z @ w, y)  # the label ~ logistic(slope x score + bias)
    return np.append(slope * w, bias), mu, sd


def calibrate(score: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(slope, bias) of a logistic regression of y on one score, by Newton steps (unregularised)."""
    A = np.stack([score, np.ones_like(score)], axis=1)
    w = np.zeros(2)
    for _ in range(100):
        p = 1 / (1 + np.exp(-A @ w))
        step = np.linalg.solve((A * (p * (1 - p))[:, None]).T @ A + 1e-9 * np.eye(2), A.T @ (p - y))
        w -= step
        if np.abs(step).max() < 1e-10:
            break
    return float(w[0]), float(w[1])


def fit_data(data, l2: float = 1.0, objective: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The reranker fitted on per-conversation data (build's tuples) with `objective` (default OBJECTIVE)."""
    if (objective or OBJECTIVE) == "listwise":
        return fit_listwise(data, l2)
    return fit(np.vstack([d[0] for d in data]), np.concatenate([d[1] for d in data]), l2)


def rerank(fused: np.ndarray, data, model) -> np.ndarray:
    """Candidates ordered by the model's score, above every non-candidate (those keep the fused order)."""
    X, _, qs, cs = data
    w, mu, sd = model
    z = np.hstack([(X - mu) / sd, np.ones((len(X), 1))]) @ w
    out = fused * 0.001
    out[qs, cs] = 10 + 1 / (1 + np.exp(-z))
    return out


def held_out(convs, fuseds, data, l2: float = 1.0, objective: str | None = None) -> list:
    """Leave one conversation out: fit on four, rank the fifth; the five held-out parts pooled."""
    held = []
    for h in range(len(convs)):
        model = fit_data([d for j, d in enumerate(data) if j != h], l2, objective)
        held += query_rows(convs[h], rerank(fuseds[h], data[h], model))
    return held


def with_weights(convs, fuseds, data, weights: tuple[float, ...]) -> list:
    """Every conversation ranked by fixed raw weights through solos_rank.ltr_score (the service's scoring)."""
    rows = []
    for c, f, d in zip(convs, fuseds, data):
        out = f * 0.001
        out[d[2], d[3]] = 10 + np.array([solos_rank.ltr_score(list(x), weights) for x in d[0]])
        rows += query_rows(c, out)
    return rows


def run(convs, kws, vecs, fuseds, title: str, l2s=(0.1, 1.0, 10.0)) -> list:
    data = build(convs, kws, vecs, fuseds)
    print(line(f"{title}: first pass", summarise([r for c, m in zip(convs, fuseds) for r in query_rows(c, m)])))
    kept = {}
    for objective in ("logistic", "listwise"):
        for l2 in l2s:
            held = held_out(convs, fuseds, data, l2, objective)
            print(line(f"{title}: LTR top {DEPTH}, {objective}, l2 {l2}, LOCO (held-out)", summarise(held)))
            if l2 == 1.0:
                kept[objective] = held
    model = fit_data(data, 1.0)
    ins = [r for c, f, d in zip(convs, fuseds, data) for r in query_rows(c, rerank(f, d, model))]
    print(line(f"{title}: LTR top {DEPTH}, {OBJECTIVE}, l2 1.0, in-sample", summarise(ins)))
    w, mu, sd = model
    raw = w[:-1] / sd
    folded = (float(w[-1] - np.sum(w[:-1] * mu / sd)), *map(float, raw))
    print("    standardised weights:", np.round(w[:-1], 3).tolist())
    print("    raw weights for solos_rank.LTR_WEIGHTS (bias first):", tuple(round(x, 4) for x in folded), flush=True)
    rounded = tuple(round(v, 4) for v in folded)
    print(
        line(f"{title}: the same through solos_rank.ltr_score", summarise(with_weights(convs, fuseds, data, rounded)))
    )
    return kept


def reranker_figures(convs, vec) -> dict[str, dict[str, dict]]:
    """Per mode (keyword; hybrid when vectors are given): the first pass, the service's weights (fitted on all
    five conversations: in-sample) and the held-out figure (LOCO), simulated as this module does."""
    global DEPTH, EXTRA
    DEPTH, EXTRA = solos_rank.RERANK_DEPTH, False
    kw = kw_leg(convs, solos_rank.STOP_WORDS)
    modes = {"keyword": (None, [normalised(m, 100, "minmax") for m in kw], solos_rank.LTR_KEYWORD_WEIGHTS)}
    if vec is not None:
        hy = linear([kw, vec], [solos_rank.KEYWORD_WEIGHT, solos_rank.VECTOR_WEIGHT], 100, "minmax")
        modes["hybrid"] = (vec, hy, solos_rank.LTR_HYBRID_WEIGHTS)
    figures = {}
    for mode, (vecs, fused, weights) in modes.items():
        data = build(convs, kw, vecs, fused)
        figures[mode] = {
            "first pass": summarise([r for c, m in zip(convs, fused) for r in query_rows(c, m)]),
            "in-sample": summarise(with_weights(convs, fused, data, weights)),
            "LOCO": summarise(held_out(convs, fused, data)),
        }
    return figures


def variants(convs, kw, raw, vec, hy) -> None:
    """Also tried (--variants): pairwise feature products (a quadratic model), and vector-neighbour features."""
    global DEPTH
    DEPTH = solos_rank.RERANK_DEPTH

    def quad(X: np.ndarray) -> np.ndarray:
        n = X.shape[1]
        return np.hstack([X] + [(X[:, i] * X[:, j])[:, None] for i in range(n) for j in range(i, n)])

    def held_out(fused, ds, transform, l2) -> dict:
        held = []
        for h in range(len(convs)):
            X = np.vstack([transform(d[0]) for j, d in enumerate(ds) if j != h])
            y = np.concatenate([d[1] for j, d in enumerate(ds) if j != h])
            d = ds[h]
            held += query_rows(convs[h], rerank(fused[h], (transform(d[0]), d[1], d[2], d[3]), fit(X, y, l2)))
        return summarise(held)

    kw_only = [normalised(m, 100, "minmax") for m in kw]
    for title, vecs, fused in (("keyword", None, kw_only), ("hybrid", vec, hy)):
        ds = build(convs, kw, vecs, fused)
        print(line(f"{title}: linear, LOCO", held_out(fused, ds, lambda X: X, 1.0)))
        for l2 in (10.0, 100.0, 1000.0):
            print(line(f"{title}: quadratic, l2 {l2}, LOCO", held_out(fused, ds, quad, l2)), flush=True)
    ds = build(convs, kw, vec, hy)
    aug = []
    for c, r, (X, y, qs, cs) in zip(convs, raw, ds):
        prev_c, next_c = neighbour_scores(c, r, [-1, 1])
        extra = np.stack([r[qs, cs], prev_c[qs, cs], next_c[qs, cs], X[:, 13] * prev_c[qs, cs]], axis=1)
        aug.append((np.hstack([X, extra]), y, qs, cs))
    print(
        line("hybrid: + raw, previous and next cosine, previous asks x its cosine", held_out(hy, aug, lambda X: X, 1.0))
    )


def latency(convs, kw, vec, fused) -> None:
    """Per-question cost of the pure-Python part at RERANK_DEPTH: features of every candidate, score, sort."""
    global DEPTH
    DEPTH = solos_rank.RERANK_DEPTH
    timings = []
    first_pass = {
        "fused": 0.5,
        "fused_rank": 3.0,
        "keyword": 0.4,
        "keyword_rank": 2.0,
        "neighbour_prev": 0.1,
        "neighbour_next": 0.2,
        "cosine": 0.4,
        "vector": 0.5,
    }
    for ci, conv in enumerate(convs):
        for qi, q in enumerate(conv.queries):
            order = np.argsort(-fused[ci][qi], kind="stable")[:DEPTH]
            turns = [conv.turns[int(i)] for i in order]
            t0 = time.perf_counter()
            question = solos_rank.Question.of(q.question, solos_rank.query_words(q.question), conv.speakers)
            rows = [solos_rank.ranking_view(t.fact, t.speaker, t.date, None) for t in turns]
            logits = [
                solos_rank.ltr_score(
                    solos_rank.ltr_features(
                        question, r, rows[j - 1] if j else None, rows[j + 1] if j + 1 < len(rows) else None, first_pass
                    ),
                    solos_rank.LTR_HYBRID_WEIGHTS,
                )
                for j, r in enumerate(rows)
            ]
            sorted(range(len(rows)), key=lambda j: -logits[j])
            timings.append(time.perf_counter() - t0)
    timings.sort()
    n = len(timings)
    print(
        f"pure-Python rerank of the top {DEPTH} (features + score + sort): "
        f"p50 {1000 * timings[n // 2]:.3f} ms, p99 {1000 * timings[int(n * 0.99)]:.3f} ms per question"
    )


def main() -> int:
    started = time.perf_counter()
    convs = load_conversations(DEFAULT_DATA)
    import solos_embed

    embedder = solos_embed.load_embedder(None)
    if "--dynint8" in sys.argv:  # the re-quantized model's vectors (bench/requantize_minilm.py)
        from recall_v2_research import dynint8_scores

        vec = smooth(convs, dynint8_scores(convs), 0.5, 1)
        print("vector leg: MiniLM re-quantized for integer kernels")
    else:
        raw = vector_scores(convs, embedder, text_speaker_date)
        vec = smooth(convs, raw, 0.5, 1)
    kw = kw_leg(convs, solos_rank.STOP_WORDS)
    kw_only = normalised_all = [normalised(m, 100, "minmax") for m in kw]
    hy = linear([kw, vec], [0.7, 0.3], 100, "minmax")
    del normalised_all
    print(HEAD)
    if "--variants" in sys.argv:
        variants(convs, kw, raw, vec, hy)
        return 0
    global DEPTH, EXTRA
    held = {}
    for depth, extra in ((20, False), (30, False), (50, False), (20, True)):
        DEPTH, EXTRA = depth, extra
        print(f"-- rerank depth {depth}{', with EXTRA_FEATURES' if extra else ''}")
        held[depth, extra, "kw"] = run(convs, kw, None, kw_only, "keyword", (0.1, 1.0, 10.0) if depth == 30 else (1.0,))
        held[depth, extra, "hy"] = run(convs, kw, vec, hy, "hybrid", (0.1, 1.0, 10.0) if depth == 30 else (1.0,))
    print("-- paired difference, held-out LTR (depth 20) - first pass: mean +- 2 SE")
    for leg, first in (("kw", kw_only), ("hy", hy)):
        base = [r for c, m in zip(convs, first) for r in query_rows(c, m)]
        for metric in ("hit@5", "frac@10", "MRR"):
            d = np.array([a[1][metric] - b[1][metric] for a, b in zip(held[20, False, leg][OBJECTIVE], base)])
            print(f"    {leg} {metric}: {d.mean():+.4f} +- {2 * d.std(ddof=1) / np.sqrt(len(d)):.4f}")
    print("-- paired difference of the held-out figures, listwise - logistic (depth 20): mean +- 2 SE")
    for leg in ("kw", "hy"):
        on, off = held[20, False, leg]["listwise"], held[20, False, leg]["logistic"]
        for metric in ("hit@1", "hit@5", "frac@10", "MRR"):
            d = np.array([a[1][metric] - b[1][metric] for a, b in zip(on, off)])
            print(f"    {leg} {metric}: {d.mean():+.4f} +- {2 * d.std(ddof=1) / np.sqrt(len(d)):.4f}")
    print("-- paired difference of the held-out figures, EXTRA_FEATURES on - off (depth 20): mean +- 2 SE")
    for leg in ("kw", "hy"):
        on, off = held[20, True, leg][OBJECTIVE], held[20, False, leg][OBJECTIVE]
        for metric in ("hit@5", "frac@10", "MRR"):
            d = np.array([a[1][metric] - b[1][metric] for a, b in zip(on, off)])
            print(f"    {leg} {metric}: {d.mean():+.4f} +- {2 * d.std(ddof=1) / np.sqrt(len(d)):.4f}")
    DEPTH, EXTRA = solos_rank.RERANK_DEPTH, False
    latency(convs, kw, vec, hy)
    print(f"run time {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
