"""Fits the learned reranker's weights (solos_rank.LTR_WEIGHTS) on LoCoMo and scores it held out.

Each (question, candidate) among the simulated first pass's top DEPTH
(solos_rank.RERANK_DEPTH) gets the service's own features
(solos_rank.ltr_features: both legs' scores and ranks, the neighbours' scores,
whether the question names the writer, the row's shape, the date window,
query-term coverage). A logistic regression (numpy, L2 1.0; OBJECTIVE) is
fitted on four conversations and ranks the fifth (LOCO); the fit on all five
(hybrid: and the fleet's fit half, bench/fleet_rank.py; FLEET_MODES) gives
the raw weights the service carries (service_weights), printed for solos_rank.LTR_WEIGHTS
and checked through solos_rank.ltr_score. A listwise fit (ListNet, calibrated
after) is printed beside it. Serving it is a dot product per candidate: pure
Python, keyword-only included. bench/locomo.py prints reranker_figures()
beside the service's own figures. Each mode ends with the fleet's score half
(never fitted on): hit@5 per kind, as served and with the weights just fitted.

    .venv/bin/python bench/ltr_fit.py [--data LOCOMO.json]     # about 15 s with cached vectors

The first pass is bench/locomo_simulate.py's simulation of the service; the
embedder is the service's (solos_embed). Figures: bench/RESULTS-locomo.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import fleet_rank
from locomo_data import DEFAULT_DATA, Conversation, load_conversations, summarise
from locomo_simulate import (
    HEAD,
    keyword_strength,
    line,
    neighbour_scores,
    normalised,
    query_rows,
    ranks_of,
    recipe_hybrid,
    recipe_keyword,
    recipe_vector,
)

import solos_embed
import solos_rank

DEPTH = solos_rank.RERANK_DEPTH
# The modes whose weights are fitted on the fleet's fit half too (bench/fleet_rank.py): hybrid only. Keyword-only
# gains nothing there (a paraphrase shares no word to find) and loses 0.006 LoCoMo hit@5 held out.
FLEET_MODES = ("hybrid",)
# The fitting objective of the weights the service carries: "logistic" (a pointwise logistic regression) or
# "listwise" (ListNet, first-pass rank weights held >= 0, then a logistic calibration of its score). Listwise
# lifts held-out hit@1 and MRR by about 0.01 but stays within noise once its variant is chosen held-out, and
# hit@5 / frac@10 do not move (research/README.md): not adopted; run() prints both.
OBJECTIVE = "logistic"


def features(
    conv: Conversation, kw: np.ndarray, vec: np.ndarray | None, fused: np.ndarray, qi: int, cands: np.ndarray
) -> np.ndarray:
    """One row of solos_rank.ltr_features per candidate turn of question qi (the service's view of a turn);
    `cands` in head order (the fused top DEPTH, then any vector seats: solos_rank.with_vector_seats)."""
    q = conv.queries[qi].question
    question = solos_rank.Question.of(q, solos_rank.query_words(q), conv.speakers)
    kwn = normalised(kw[qi : qi + 1], 100, "minmax")[0]
    kw_rank = ranks_of(kw[qi : qi + 1], 100)[0]
    fz_rank = ranks_of(fused[qi : qi + 1], DEPTH)[0]
    fused = fused.copy()
    for at, i in enumerate(cands[DEPTH:], DEPTH + 1):  # a seat: the head's last score, the rank it takes there
        fz_rank[i], fused[qi, i] = at, fused[qi, cands[DEPTH - 1]]
    prev_k, next_k = (s[0] for s in neighbour_scores(conv, kwn[None, :], [-1, 1]))
    vn = None if vec is None else normalised(vec[qi : qi + 1], 100, "minmax")[0]

    def row(j: int) -> dict:
        t = conv.turns[j]
        return solos_rank.ranking_view(t.fact, t.speaker, t.date, None)

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
        if vec is not None:
            first_pass.update(cosine=float(vec[qi, i]), vector=float(vn[i]))
        cols.append(list(solos_rank.ltr_features(question, row(i), prev, nxt, first_pass).values()))
    return np.array(cols)


def build(convs, kws, vecs, fuseds):
    """Per conversation: (X, y, query index, candidate index) over every question's top DEPTH."""
    out = []
    for ci, conv in enumerate(convs):
        X, y, qs, cs = [], [], [], []
        idx = {t.dia_id: i for i, t in enumerate(conv.turns)}
        for qi, q in enumerate(conv.queries):
            order = head(conv, kws[ci], None if vecs is None else vecs[ci], fuseds[ci], qi)
            if not len(order):
                continue
            evidence = {idx[e] for e in q.evidence}
            X.append(features(conv, kws[ci], None if vecs is None else vecs[ci], fuseds[ci], qi, order))
            y += [float(int(i) in evidence) for i in order]
            qs += [qi] * len(order)
            cs += list(order)
        out.append((np.vstack(X), np.array(y), np.array(qs), np.array(cs)))
    return out


def head(conv: Conversation, kw: np.ndarray, vec: np.ndarray | None, fused: np.ndarray, qi: int) -> np.ndarray:
    """The turns the reranker reads for question qi: the fused top DEPTH and, in hybrid, when the keyword leg's
    best turns hardly cover the question, the vector leg's best that fell below (solos_rank.fuse's seats)."""
    ranked = np.argsort(-fused[qi], kind="stable")
    ranked = ranked[fused[qi, ranked] > 0]
    order = ranked[:DEPTH]
    if vec is None or len(ranked) <= DEPTH:
        return order
    if keyword_strength(conv, conv.queries[qi].question, kw[qi]) >= solos_rank.WEAK_KEYWORD_COVERAGE:
        return order
    listed = np.zeros(fused.shape[1], dtype=bool)
    listed[ranked] = True
    best = [int(i) for i in np.argsort(-vec[qi], kind="stable") if listed[i]][: solos_rank.HEAD_VECTOR_ROWS]
    joining = set(best) - set(order.tolist())
    return np.concatenate([order, [i for i in ranked[DEPTH:] if int(i) in joining]]).astype(int)


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


def held_out(convs, fuseds, data, l2: float = 1.0, objective: str | None = None, extra: list = ()) -> list:
    """Leave one conversation out: fit on four (and `extra`, the fleet's fit half), rank the fifth; the five
    held-out parts pooled."""
    held = []
    for h in range(len(convs)):
        model = fit_data([d for j, d in enumerate(data) if j != h] + list(extra), l2, objective)
        held += query_rows(convs[h], rerank(fuseds[h], data[h], model))
    return held


def with_weights(convs, fuseds, data, weights: tuple[float, ...]) -> list:
    """Every conversation ranked by fixed raw weights through solos_rank.ltr_score (the service's scoring)."""
    rows = []
    for c, f, d in zip(convs, fuseds, data):
        out = f * 0.001
        names = solos_rank.feature_names(len(weights) - 1 > len(solos_rank.KEYWORD_FEATURES))
        out[d[2], d[3]] = 10 + np.array([solos_rank.ltr_score(dict(zip(names, x)), weights) for x in d[0]])
        rows += query_rows(c, out)
    return rows


def run(convs, kws, vecs, fuseds, title: str, fleet: list[dict]) -> dict[str, list]:
    """Held-out figures of both objectives, the in-sample fit, its raw weights and the same through ltr_score;
    then the fleet's score half (never fitted on) as served and as these weights rank it."""
    data = build(convs, kws, vecs, fuseds)
    extra = [fleet_rank.as_data(fleet, "fit")] if title in FLEET_MODES else []
    print(line(f"{title}: first pass", summarise([r for c, m in zip(convs, fuseds) for r in query_rows(c, m)])))
    held = {}
    for objective in ("logistic", "listwise"):
        held[objective] = held_out(convs, fuseds, data, 1.0, objective, extra)
        print(line(f"{title}: LTR top {DEPTH}, {objective}, l2 1.0, LOCO (held-out)", summarise(held[objective])))
    model = fit_data(data + extra, 1.0)
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
    for name, score in (("as served", None), ("these weights", fleet_rank.weights_score(rounded))):
        figures = fleet_rank.hits(fleet, "score", score)
        print(f"{title}: fleet score half, {name}: " + " ".join(f"{k} {v:.3f}" for k, v in sorted(figures.items())))
    return held


def service_weights(convs, kw, vec) -> dict[str, tuple[float, ...]]:
    """The raw weights the service carries, per mode, as run() prints them (rounded to 4 places): fitted on
    every LoCoMo conversation and the fleet's fit half. tests/test_rank_weights.py holds LTR_WEIGHTS to them."""
    modes = {"keyword": (None, [normalised(m, 100, "minmax") for m in kw]), "hybrid": (vec, recipe_hybrid(kw, vec))}
    out = {}
    for mode, (vecs, fused) in modes.items():
        data = build(convs, kw, vecs, fused)
        data += [fleet_rank.as_data(fleet_rank.capture(mode), "fit")] if mode in FLEET_MODES else []
        w, mu, sd = fit_data(data, 1.0)
        raw = w[:-1] / sd
        out[mode] = tuple(round(float(x), 4) for x in (w[-1] - np.sum(w[:-1] * mu / sd), *raw))
    return out


def reranker_figures(convs, vec) -> dict[str, dict[str, dict]]:
    """Per mode (keyword; hybrid when vectors are given): the first pass, the service's weights (fitted on all
    five conversations: in-sample) and the held-out figure (LOCO, only with two conversations or more: a model
    fitted on none cannot rank the one left out), simulated as this module does."""
    kw = recipe_keyword(convs)
    modes = {"keyword": (None, [normalised(m, 100, "minmax") for m in kw], solos_rank.LTR_KEYWORD_WEIGHTS)}
    if vec is not None:
        modes["hybrid"] = (vec, recipe_hybrid(kw, vec), solos_rank.LTR_HYBRID_WEIGHTS)
    figures = {}
    for mode, (vecs, fused, weights) in modes.items():
        data = build(convs, kw, vecs, fused)
        extra = [fleet_rank.as_data(fleet_rank.capture(mode), "fit")] if mode in FLEET_MODES else []
        figures[mode] = {
            "first pass": summarise([r for c, m in zip(convs, fused) for r in query_rows(c, m)]),
            "in-sample": summarise(with_weights(convs, fused, data, weights)),
        }
        if len(convs) > 1:
            figures[mode]["LOCO"] = summarise(held_out(convs, fused, data, extra=extra))
    return figures


def paired(title: str, on: list, off: list, metrics: tuple[str, ...]) -> None:
    """Mean +- 2 SE of the per-question difference on - off, for each metric."""
    for metric in metrics:
        d = np.array([a[1][metric] - b[1][metric] for a, b in zip(on, off)])
        print(f"    {title} {metric}: {d.mean():+.4f} +- {2 * d.std(ddof=1) / np.sqrt(len(d)):.4f}")


def latency(convs, kw, vec, fused) -> None:
    """Per-question cost of the pure-Python part at RERANK_DEPTH: features of every candidate, score, sort."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo JSON file (default: %(default)s)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    convs = load_conversations(args.data)
    kw = recipe_keyword(convs)
    vec = recipe_vector(convs, solos_embed.load_embedder(None))
    kw_only = [normalised(m, 100, "minmax") for m in kw]
    hy = recipe_hybrid(kw, vec)
    print(HEAD)
    held = {
        "keyword": run(convs, kw, None, kw_only, "keyword", fleet_rank.capture("keyword")),
        "hybrid": run(convs, kw, vec, hy, "hybrid", fleet_rank.capture("hybrid")),
    }
    print(f"-- paired difference, held-out LTR (top {DEPTH}) - first pass: mean +- 2 SE")
    for mode, first in (("keyword", kw_only), ("hybrid", hy)):
        base = [r for c, m in zip(convs, first) for r in query_rows(c, m)]
        paired(mode, held[mode][OBJECTIVE], base, ("hit@5", "frac@10", "MRR"))
    print(f"-- paired difference of the held-out figures, listwise - logistic (top {DEPTH}): mean +- 2 SE")
    for mode in ("keyword", "hybrid"):
        paired(mode, held[mode]["listwise"], held[mode]["logistic"], ("hit@1", "hit@5", "frac@10", "MRR"))
    latency(convs, kw, vec, hy)
    print(f"run time {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
