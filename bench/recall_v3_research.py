"""Recall v3 research (issue 13, second round): new reranker inputs and query expansion, judged held-out.

Each idea is measured against the current reranker (solos_rank.ltr_features,
fitted by bench/ltr_research.py) in the same run: the same first pass, the
same top RERANK_DEPTH candidates, the same logistic regression (L2 1.0); an
idea adds feature columns (or changes the keyword leg) and the model is fitted
again. Figures: in-sample (fitted on all five conversations) and LOCO (fitted
on four, ranking the fifth, pooled); the paired difference of the LOCO
figures against the current reranker's LOCO figures, mean +- SE over the 997
questions (mh and od: over their 142 and 44 questions).

    .venv/bin/python bench/recall_v3_research.py [--only ceiling,session,expand,soft,context,vecname,pairwise]

Caches (RECALL_V3_CACHE, default /tmp/recall-v3): the static word table
(21,287 words, 31 MiB) and the contextual turn vectors, embedded on the first
run (about 2 min on 2 cores). Findings: bench/RESULTS-locomo.md, "Recall v2",
"Round two".
"""

from __future__ import annotations

import argparse
import os
import re
import sqlite3
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import ltr_research  # noqa: E402
from locomo import CATEGORIES, DEFAULT_DATA, load_conversations, summarise  # noqa: E402
from locomo_research import (  # noqa: E402
    FTS_TOKENIZER,
    RECIPE_COLUMNS,
    RECIPE_WEIGHTS,
    fts_scores_by,
    linear,
    name_boost,
    normalised,
    ranks_of,
    smooth,
    text_speaker_date,
    vector_scores,
)
from recall_v2_research import HEAD, line, query_rows  # noqa: E402

import solos_embed  # noqa: E402
import solos_rank  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("RECALL_V3_CACHE", "/tmp/recall-v3"))  # the static word table (about 30 MiB)
SESSION_DEPTH = 50  # the keyword leg's candidates per tier in the service (solos_rank.CANDIDATE_DEPTH)

# ==== Evaluation: a feature set fitted in-sample and LOCO, paired against the current reranker ====


def fit_rows(convs, fuseds, data, l2: float = 1.0, fitter=ltr_research.fit, scorer=None):
    """(in-sample rows, LOCO rows, LOCO rows per conversation) of a reranker fitted on data's features
    (`fitter`: the pointwise logistic regression, as the reranker was before this round)."""
    scorer = scorer or ltr_research.rerank
    model = fitter(np.vstack([d[0] for d in data]), np.concatenate([d[1] for d in data]), l2)
    ins = [r for c, f, d in zip(convs, fuseds, data) for r in query_rows(c, scorer(f, d, model))]
    per = []
    for h in range(len(convs)):
        X = np.vstack([d[0] for j, d in enumerate(data) if j != h])
        y = np.concatenate([d[1] for j, d in enumerate(data) if j != h])
        per.append(query_rows(convs[h], scorer(fuseds[h], data[h], fitter(X, y, l2))))
    return ins, [r for p in per for r in p], per


def paired(new: list, old: list) -> str:
    """LOCO new - old: mean +- SE per metric (overall hit@1, hit@5, frac@10, MRR; mh@5, od@5); '*' past 2 SE."""
    out = []
    for metric, cat in (("hit@1", None), ("hit@5", None), ("frac@10", None), ("MRR", None), ("hit@5", 4), ("hit@5", 3)):
        d = np.array([a[1][metric] - b[1][metric] for a, b in zip(new, old) if cat is None or a[0] == cat])
        se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
        name = metric if cat is None else f"{'mh' if cat == 4 else 'od'}@5"
        flag = "*" if abs(d.mean()) > 2 * se else ""
        out.append(f"{name} {d.mean():+.4f}+-{se:.4f}{flag}")
    return "    LOCO diff vs current: " + ", ".join(out)


def report(title: str, convs, fuseds, data, base_loco: list | None, **kw) -> list:
    ins, loco, per = fit_rows(convs, fuseds, data, **kw)
    print(line(f"{title}: in-sample", summarise(ins)))
    print(line(f"{title}: LOCO", summarise(loco)), flush=True)
    if base_loco is not None:
        print(paired(loco, base_loco), flush=True)
    return per


def with_columns(data, extra: list[np.ndarray]):
    return [(np.hstack([X, e]), y, qs, cs) for (X, y, qs, cs), e in zip(data, extra)]


def choose(convs, per_config: dict[str, list]) -> list:
    """Pick a config on four conversations' LOCO rows (hit@5 + frac@10 + MRR), score the fifth; pooled."""
    from recall_v2_research import objective

    held, picks = [], []
    for h in range(len(convs)):
        pick = max(per_config, key=lambda k: sum(objective(p) for j, p in enumerate(per_config[k]) if j != h))
        picks.append(pick)
        held += per_config[pick][h]
    print(f"    nested choice picks: {', '.join(picks)}")
    return held


# ==== Where the evidence sits: the ceiling a reranker of the top N has ====


def section_ceiling(convs, hy) -> None:
    """Per category: questions with an evidence turn in the hybrid first pass's top N; evidence turns in its top 20."""
    print("== ceiling: the hybrid first pass's reach (an evidence turn in its top N; evidence share in top 20, 50)")
    groups: dict[str, list] = {}
    for conv, m in zip(convs, hy):
        idx = {t.dia_id: i for i, t in enumerate(conv.turns)}
        ranks = ranks_of(m, len(conv.turns))
        for qi, q in enumerate(conv.queries):
            r = [ranks[qi, idx[e]] for e in q.evidence]
            row = [min(r) <= n for n in (5, 10, 20, 50)] + [np.mean([x <= n for x in r]) for n in (20, 50)] + [len(r)]
            for name in ("overall", CATEGORIES.get(q.category, str(q.category))):
                groups.setdefault(name, []).append(row)
    print(f"    {'':<12}{'n':>5}{'top5':>7}{'top10':>7}{'top20':>7}{'top50':>7}{'ev@20':>8}{'ev@50':>8}{'ev/q':>6}")
    for name, rows in groups.items():
        a = np.array(rows, dtype=float)
        print(
            f"    {name:<12}{len(a):>5}"
            + "".join(f"{x:>7.3f}" for x in a[:, :4].mean(axis=0))
            + f"{a[:, 4].mean():>8.3f}{a[:, 5].mean():>8.3f}{a[:, 6].mean():>6.2f}"
        )


# ==== Idea 1: session-level relevance ====


def session_columns(conv, kw: np.ndarray, fused: np.ndarray, qs, cs, sess_bm25: np.ndarray | None) -> np.ndarray:
    """Per candidate: its session among the keyword leg's top SESSION_DEPTH (sum, best other row, count, 1/rank
    of the session by sum), the same over the fused top SESSION_DEPTH, and (when given) the whole session's
    BM25 (max-normalised over sessions, 1/rank)."""
    sessions = np.array([t.session for t in conv.turns])
    kwn = normalised(kw, 100, "minmax")
    kw_top = ranks_of(kw, SESSION_DEPTH) <= SESSION_DEPTH
    fz_top = ranks_of(fused, SESSION_DEPTH) <= SESSION_DEPTH
    cache: dict[int, tuple] = {}
    cols = []
    for qi, ci in zip(qs, cs):
        if qi not in cache:
            per = []
            for top, score in ((kw_top[qi], kwn[qi]), (fz_top[qi], fused[qi])):
                idx = np.flatnonzero(top)
                sums: dict[int, float] = {}
                for j in idx:
                    sums[sessions[j]] = sums.get(sessions[j], 0.0) + float(score[j])
                order = sorted(sums, key=lambda s: -sums[s])
                per.append((idx, score, sums, {s: r for r, s in enumerate(order, 1)}))
            cache[qi] = per
        s = sessions[ci]
        row = []
        for idx, score, sums, rank in cache[qi]:
            others = [float(score[j]) for j in idx if sessions[j] == s and j != ci]
            row += [sums.get(s, 0.0), max(others, default=0.0), float(len(others)), 1.0 / rank[s] if s in rank else 0.0]
        if sess_bm25 is not None:
            q = sess_bm25[qi]
            top = q.max()
            r = 1 + int((q > q[s]).sum())
            row += [q[s] / top if top > 0 else 0.0, 1.0 / r if q[s] > 0 else 0.0]
        cols.append(row)
    return np.array(cols)


def session_bm25(convs) -> list[np.ndarray]:
    """-bm25 of each whole session's text (the service's columns, concatenated) per question: (queries, sessions+1)."""
    out = []
    for conv in convs:
        n = max(t.session for t in conv.turns) + 1
        texts = [""] * n
        for t in conv.turns:
            texts[t.session] += f" {t.speaker}: {t.fact}"
        db = sqlite3.connect(":memory:")
        db.execute(f"CREATE VIRTUAL TABLE s USING fts5(body, tokenize='{FTS_TOKENIZER}')")
        db.executemany("INSERT INTO s(rowid, body) VALUES (?, ?)", [(i, x) for i, x in enumerate(texts) if x])
        m = np.zeros((len(conv.queries), n))
        for qi, q in enumerate(conv.queries):
            match = solos_rank.make_fts_query(solos_rank.query_words(q.question))
            for rowid, rank in db.execute("SELECT rowid, bm25(s) FROM s WHERE s MATCH ?", (match,)) if match else ():
                m[qi, rowid] = -rank
        out.append(m)
    return out


def section_session(convs, kw, base) -> None:
    print("== idea 1: session-level relevance as reranker features")
    sb = session_bm25(convs)
    for mode, b in base.items():
        fused, data = b["fused"], b["data"]
        cols = [session_columns(c, k, f, d[2], d[3], s) for c, k, f, d, s in zip(convs, kw, fused, data, sb)]
        subsets = {
            "kw session sum/best/count/rr": slice(0, 4),
            "fused session sum/best/count/rr": slice(4, 8),
            "whole-session BM25 (norm, rr)": slice(8, 10),
            "all ten": slice(0, 10),
        }
        per_config = {"current": b["per"]}
        for name, sl in subsets.items():
            per_config[name] = report(
                f"{mode}: + {name}", convs, fused, with_columns(data, [c[:, sl] for c in cols]), b["loco"]
            )
        for j, name in enumerate(("kw sum", "kw best other", "kw count", "kw session rr")):
            extra = [c[:, j : j + 1] for c in cols]
            report(f"{mode}: + {name} alone", convs, fused, with_columns(data, extra), b["loco"])
        held = choose(convs, per_config)
        print(line(f"{mode}: nested choice among the above", summarise(held)))
        print(paired(held, b["loco"]), flush=True)


# ==== Idea 2: query expansion from static word vectors (MiniLM run on each vocabulary word alone) ====


def word_vocabulary() -> list[str]:
    """MiniLM's wordpiece vocabulary, whole alphabetic words of 3+ letters that are not stop words."""
    import json

    vocab = json.loads((REPO / "models" / "all-MiniLM-L6-v2" / "tokenizer.json").read_text())["model"]["vocab"]
    return sorted(w for w in vocab if re.fullmatch(r"[a-z]{3,}", w) and w not in solos_rank.STOP_WORDS)


def static_vectors(embedder, words: list[str]) -> np.ndarray:
    """Each word embedded alone (cached): a model2vec-style static table, L2-normalised rows."""
    import hashlib

    key = hashlib.sha256("\0".join([embedder.model_id, *words]).encode()).hexdigest()[:16]
    path = CACHE / f"static-words-{key}.npy"
    if path.exists():
        return np.load(path)
    t0 = time.perf_counter()
    table = solos_embed.decode_vectors(embedder.embed(words), embedder.dim)
    print(f"    embedded {len(words)} words alone in {time.perf_counter() - t0:.1f} s")
    CACHE.mkdir(parents=True, exist_ok=True)
    np.save(path, table)
    return table


def thesaurus(words: list[str], table: np.ndarray, top: int, threshold: float) -> dict[str, list[tuple[str, float]]]:
    """word -> up to `top` nearest other words (cosine >= threshold), no shared STEM_LENGTH prefix."""
    out = {}
    stem = solos_rank.STEM_LENGTH
    for lo in range(0, len(words), 2048):
        sims = table[lo : lo + 2048] @ table.T
        best = np.argpartition(-sims, top + 8, axis=1)[:, : top + 8]
        best = np.take_along_axis(best, np.argsort(-np.take_along_axis(sims, best, axis=1), axis=1), axis=1)
        for i, row in enumerate(best, lo):
            near = [
                (words[j], float(sims[i - lo, j]))
                for j in row
                if j != i and sims[i - lo, j] >= threshold and words[j][:stem] != words[i][:stem]
            ][:top]
            if near:
                out[words[i]] = near
    return out


def expansions(question: str, near: dict) -> list[tuple[str, float]]:
    """The question's content words' neighbours, best cosine each, the question's own words left out."""
    words = [w for w in solos_rank.query_words(question) if w not in solos_rank.STOP_WORDS]
    own = {w[: solos_rank.STEM_LENGTH] for w in words}
    found: dict[str, float] = {}
    for w in words:
        for n, c in near.get(w, ()):
            if n[: solos_rank.STEM_LENGTH] not in own:
                found[n] = max(found.get(n, 0.0), c)
    return sorted(found.items(), key=lambda item: -item[1])


def raw_fts(convs, make_query) -> list[np.ndarray]:
    return fts_scores_by(convs, RECIPE_COLUMNS, RECIPE_WEIGHTS, make_query)


def keyword_from_raw(convs, raw: list[np.ndarray]) -> list[np.ndarray]:
    """The keyword leg as recall_v2_research.kw_leg builds it from raw -bm25: name boost, then neighbours."""
    return smooth(convs, name_boost(convs, raw, solos_rank.NAME_BOOST - 1), solos_rank.NEIGHBOUR_KEYWORD_WEIGHT, 1)


def expansion_columns(conv, qs, cs, near) -> np.ndarray:
    """Share of the question's content words missing from the row whose neighbour is in it; best such cosine."""
    cache: dict[int, tuple] = {}
    cols = []
    for qi, ci in zip(qs, cs):
        if qi not in cache:
            q = conv.queries[qi].question
            words = [w for w in solos_rank.query_words(q) if w not in solos_rank.STOP_WORDS]
            cache[qi] = [
                (w[: solos_rank.STEM_LENGTH], {n[: solos_rank.STEM_LENGTH]: c for n, c in near.get(w, ())})
                for w in words
            ]
        row = solos_rank.stems(conv.turns[ci].fact)
        hits = [max((c for n, c in ns.items() if n in row), default=0.0) for w, ns in cache[qi] if w not in row]
        cols.append([sum(h > 0 for h in hits) / max(len(cache[qi]), 1), max(hits, default=0.0)])
    return np.array(cols)


def section_expand(convs, embedder, vec, base) -> None:
    print("== idea 2: query expansion from static MiniLM word vectors")
    words = word_vocabulary()
    table = static_vectors(embedder, words)
    print(
        f"    vocabulary {len(words)} words; table {table.nbytes / 2**20:.1f} MiB float32 "
        f"({len(words) * 384 / 2**20:.1f} MiB int8)"
    )
    t0 = time.perf_counter()
    near_all = thesaurus(words, table, 5, 0.5)
    print(f"    thesaurus (top 5, cosine >= 0.5) in {time.perf_counter() - t0:.1f} s; {len(near_all)} entries")
    for w in ("pottery", "hike", "painting", "career", "adopt", "camping", "instrument", "sunset"):
        print(f"      {w}: {[(n, round(c, 2)) for n, c in near_all.get(w, [])]}")
    base_raw = raw_fts(convs, lambda q: solos_rank.make_fts_query(solos_rank.query_words(q)))
    same = all(
        np.allclose(a, b)
        for a, b in zip(keyword_from_raw(convs, base_raw), ltr_research.kw_leg(convs, solos_rank.STOP_WORDS))
    )
    print(f"    keyword leg rebuilt from raw -bm25 matches kw_leg: {same}")
    per_mode: dict[str, dict[str, list]] = {m: {"current": b["per"]} for m, b in base.items()}
    for top, threshold in ((3, 0.6), (3, 0.7), (5, 0.6), (3, 0.8)):
        near = {w: [(n, c) for n, c in ns if c >= threshold][:top] for w, ns in near_all.items()}
        near = {w: ns for w, ns in near.items() if ns}
        ex = [[expansions(q.question, near) for q in c.queries] for c in convs]
        n_ex = [len(e) for c in ex for e in c]
        od = [len(e) for c, conv in zip(ex, convs) for e, q in zip(c, conv.queries) if q.category == 3]
        print(
            f"  top {top}, cosine >= {threshold}: {np.mean(n_ex):.1f} extra words a question (od {np.mean(od):.1f}); "
            f"e.g. {convs[0].queries[0].question!r} -> {[w for w, _ in ex[0][0]][:8]}"
        )
        queries = iter([" OR ".join(f'"{w}"' for w, _ in e) or None for c in ex for e in c])
        t0 = time.perf_counter()
        exp_raw = raw_fts(convs, lambda _q, queries=queries: next(queries))
        print(f"    second FTS pass (all questions, 5 in-memory indexes incl. build): {time.perf_counter() - t0:.1f} s")
        for alpha in (0.1, 0.25, 0.5):
            kw2 = keyword_from_raw(convs, [a + alpha * b for a, b in zip(base_raw, exp_raw)])
            for mode, b in base.items():
                fused = (
                    [normalised(m, 100, "minmax") for m in kw2]
                    if mode == "keyword"
                    else linear([kw2, vec], [solos_rank.KEYWORD_WEIGHT, solos_rank.VECTOR_WEIGHT], 100, "minmax")
                )
                first = summarise([r for c, m in zip(convs, fused) for r in query_rows(c, m)])
                print(line(f"{mode}: first pass, expansion x{alpha} (top {top}, >= {threshold})", first))
                data = ltr_research.build(convs, kw2, b["vecs"], fused)
                per_mode[mode][f"FTS {top}/{threshold}/x{alpha}"] = report(
                    f"{mode}: reranker over it", convs, fused, data, b["loco"]
                )
        for mode, b in base.items():
            cols = [expansion_columns(c, d[2], d[3], near) for c, d in zip(convs, b["data"])]
            per_mode[mode][f"feature {top}/{threshold}"] = report(
                f"{mode}: + expansion share, best cosine (top {top}, >= {threshold})",
                convs,
                b["fused"],
                with_columns(b["data"], cols),
                b["loco"],
            )
    for mode in base:
        held = choose(convs, per_mode[mode])
        print(line(f"{mode}: nested choice among expansion configs", summarise(held)))
        print(paired(held, base[mode]["loco"]), flush=True)


# ==== Idea 4: soft coverage: each question word's best static-vector cosine to the row's words ====


def soft_columns(conv, qs, cs, index: dict[str, int], table: np.ndarray) -> np.ndarray:
    """Mean (and min) over the question's content words (in the table) of the best cosine to any word of the
    row; the same over the row's previous and next turns (same session)."""

    def vectors(text: str) -> np.ndarray:
        ids = [index[w] for w in dict.fromkeys(re.findall(r"[a-z]+", text.lower())) if w in index]
        return table[ids] if ids else np.zeros((0, table.shape[1]), dtype=table.dtype)

    qcache: dict[int, np.ndarray] = {}
    cols = []
    for qi, ci in zip(qs, cs):
        if qi not in qcache:
            words = [w for w in solos_rank.query_words(conv.queries[qi].question) if w not in solos_rank.STOP_WORDS]
            qcache[qi] = vectors(" ".join(words))
        qv = qcache[qi]
        turn = conv.turns[ci]
        around = " ".join(
            conv.turns[j].fact
            for j in (ci - 1, ci + 1)
            if 0 <= j < len(conv.turns) and conv.turns[j].session == turn.session
        )
        row = []
        for text in (turn.fact, around):
            rv = vectors(text)
            if not len(qv) or not len(rv):
                row += [0.0, 0.0]
                continue
            best = (qv @ rv.T).max(axis=1)
            row += [float(best.mean()), float(best.min())]
        cols.append(row)
    return np.array(cols)


def section_soft(convs, embedder, base) -> None:
    print(
        "== idea 4: soft coverage from static MiniLM word vectors (reranker features; numpy, hybrid-only in practice)"
    )
    words = word_vocabulary()
    table = static_vectors(embedder, words)
    index = {w: i for i, w in enumerate(words)}
    t0 = time.perf_counter()
    cols = {
        mode: [soft_columns(c, d[2], d[3], index, table) for c, d in zip(convs, b["data"])] for mode, b in base.items()
    }
    n = sum(len(d[2]) for b in base.values() for d in b["data"])
    print(
        f"    features for {n} candidates in {time.perf_counter() - t0:.1f} s "
        f"({1000 * (time.perf_counter() - t0) / n * 20:.2f} ms per 20 candidates, numpy)"
    )
    for mode, b in base.items():
        per_config = {"current": b["per"]}
        for name, sl in (
            ("soft coverage mean, min", slice(0, 2)),
            ("+ around", slice(0, 4)),
            ("mean only", slice(0, 1)),
        ):
            per_config[name] = report(
                f"{mode}: + {name}",
                convs,
                b["fused"],
                with_columns(b["data"], [c[:, sl] for c in cols[mode]]),
                b["loco"],
            )
        held = choose(convs, per_config)
        print(line(f"{mode}: nested choice among soft coverage sets", summarise(held)))
        print(paired(held, b["loco"]), flush=True)


# ==== Idea 5: contextual vectors: each turn embedded with the turn before it (same session) ====


def text_with_previous(conv, i: int) -> str:
    t = conv.turns[i]
    own = f"{t.speaker} ({t.date}): {t.fact}"
    if i and conv.turns[i - 1].session == t.session:
        p = conv.turns[i - 1]
        return f"{p.speaker}: {p.fact}\n{own}"
    return own


def contextual_scores(convs, embedder) -> list[np.ndarray]:
    """Cosine of each question to each turn embedded with its previous turn (cached under CACHE)."""
    import hashlib

    out = []
    for conv in convs:
        texts = [text_with_previous(conv, i) for i in range(len(conv.turns))]
        key = hashlib.sha256("\0".join([embedder.model_id, *texts]).encode()).hexdigest()[:16]
        path = CACHE / f"context-{key}.npy"
        if path.exists():
            docs = np.load(path)
        else:
            t0 = time.perf_counter()
            docs = solos_embed.decode_vectors(embedder.embed(texts), embedder.dim)
            print(f"    embedded {len(texts)} turns with context in {time.perf_counter() - t0:.0f} s", flush=True)
            CACHE.mkdir(parents=True, exist_ok=True)
            np.save(path, docs)
        queries = solos_embed.decode_vectors(embedder.embed([q.question for q in conv.queries]), embedder.dim)
        out.append(queries @ docs.T)
    return out


def section_context(convs, embedder, kw, base) -> None:
    print("== idea 5: contextual vectors (the turn embedded with the one before it)")
    ctx = contextual_scores(convs, embedder)
    b = base["hybrid"]
    cols = [np.stack([m[d[2], d[3]], normalised(m, 100, "minmax")[d[2], d[3]]], axis=1) for m, d in zip(ctx, b["data"])]
    per_config = {"current": b["per"]}
    per_config["feature"] = report(
        "hybrid: + contextual cosine (raw, min-max)", convs, b["fused"], with_columns(b["data"], cols), b["loco"]
    )
    for gamma in (0.0, 0.5):
        vec2 = smooth(convs, ctx, gamma, 1)
        for wv in (0.3, 0.4):
            fused = linear([kw, vec2], [1 - wv, wv], 100, "minmax")
            print(
                line(
                    f"hybrid: first pass with contextual vectors (smooth {gamma}, weight {wv})",
                    summarise([r for c, m in zip(convs, fused) for r in query_rows(c, m)]),
                )
            )
            data = ltr_research.build(convs, kw, vec2, fused)
            per_config[f"leg {gamma}/{wv}"] = report("hybrid: reranker over it", convs, fused, data, b["loco"])
    held = choose(convs, per_config)
    print(line("hybrid: nested choice among contextual-vector configs", summarise(held)))
    print(paired(held, b["loco"]), flush=True)
    for name, data in (("listwise", b["data"]), ("listwise + contextual cosine", with_columns(b["data"], cols))):
        ins, per = grouped_rows(convs, b["fused"], data, ltr_research.fit_listwise, 1.0)
        print(line(f"hybrid: {name}: in-sample", summarise(ins)))
        print(line(f"hybrid: {name}: LOCO", summarise([r for p in per for r in p])))
        print(paired([r for p in per for r in p], b["loco"]), flush=True)


# ==== Idea 6: the named writer's boost in the vector leg too ====


def section_vector_name(convs, kw, vec, base) -> None:
    print("== idea 6: x(1 + beta) for the named writer's rows in the vector leg (the keyword leg has x1.3)")
    b = base["hybrid"]
    per_config = {"current": b["per"]}
    for beta in (0.1, 0.2, 0.3, 0.5):
        vec2 = name_boost(convs, vec, beta)
        fused = linear([kw, vec2], [solos_rank.KEYWORD_WEIGHT, solos_rank.VECTOR_WEIGHT], 100, "minmax")
        print(
            line(
                f"hybrid: first pass, vector name boost {beta}",
                summarise([r for c, m in zip(convs, fused) for r in query_rows(c, m)]),
            )
        )
        data = ltr_research.build(convs, kw, vec2, fused)
        per_config[f"beta {beta}"] = report("hybrid: reranker over it", convs, fused, data, b["loco"])
    held = choose(convs, per_config)
    print(line("hybrid: nested choice among vector name boosts", summarise(held)))
    print(paired(held, b["loco"]), flush=True)


# ==== Idea 3: other objectives over the same features (pairwise, listwise) and small boosted trees ====


def fit_pairwise(data, l2: float):
    """RankNet, linear: logistic regression on (answer - non-answer) feature differences within a question."""
    diffs = []
    for X, y, qs, _ in data:
        Z = X
        for q in np.unique(qs):
            at = np.flatnonzero(qs == q)
            pos, neg = at[y[at] == 1], at[y[at] == 0]
            if len(pos) and len(neg):
                diffs.append((Z[pos][:, None, :] - Z[neg][None, :, :]).reshape(-1, X.shape[1]))
    D = np.vstack(diffs)
    sd = D.std(axis=0)
    sd[sd == 0] = 1
    Dz = D / sd
    w = np.zeros(D.shape[1])
    for _ in range(50):
        p = 1 / (1 + np.exp(-Dz @ w))  # every pair's label is 1 (the answer above)
        g = Dz.T @ (p - 1) + l2 * w
        H = (Dz * (p * (1 - p))[:, None]).T @ Dz + l2 * np.eye(len(w))
        step = np.linalg.solve(H, g)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return np.append(w, 0.0), np.zeros(D.shape[1]), sd


def fit_trees(data, l2: float, trees: int = 40, depth: int = 3, rate: float = 0.1, bins: int = 16):
    """Gradient-boosted regression trees on the logistic loss (Newton leaves), quantile split points."""
    X = np.vstack([d[0] for d in data])
    y = np.concatenate([d[1] for d in data])
    cuts = [np.unique(np.quantile(X[:, j], np.linspace(0, 1, bins + 1)[1:-1])) for j in range(X.shape[1])]
    f = np.full(len(y), np.log(y.mean() / (1 - y.mean())))
    model = [float(f[0])]
    for _ in range(trees):
        p = 1 / (1 + np.exp(-f))
        g, h = p - y, p * (1 - p)
        nodes = {0: np.arange(len(y))}
        tree = {}
        for level in range(depth):
            for node in [n for n in nodes if n >= 2**level - 1 and n < 2 ** (level + 1) - 1]:
                idx = nodes.pop(node)
                G, Hs = g[idx].sum(), h[idx].sum()
                best = (0.0, None, None)
                for j, cj in enumerate(cuts):
                    xj = X[idx, j]
                    for c in cj:
                        left = xj <= c
                        gl, hl = g[idx][left].sum(), h[idx][left].sum()
                        gain = gl**2 / (hl + l2) + (G - gl) ** 2 / (Hs - hl + l2) - G**2 / (Hs + l2)
                        if gain > best[0] and hl > 1 and Hs - hl > 1:
                            best = (gain, j, float(c))
                if best[1] is None:
                    tree[node] = ("leaf", -rate * G / (Hs + l2))
                    continue
                _, j, c = best
                tree[node] = ("split", j, c)
                left = X[idx, j] <= c
                nodes[2 * node + 1], nodes[2 * node + 2] = idx[left], idx[~left]
        for node, idx in nodes.items():
            tree[node] = ("leaf", -rate * g[idx].sum() / (h[idx].sum() + l2))
        model.append(tree)
        f = f + tree_predict(tree, X)
    return model


def tree_predict(tree: dict, X: np.ndarray) -> np.ndarray:
    out = np.zeros(len(X))
    node = np.zeros(len(X), dtype=int)
    for _ in range(10):
        for n in np.unique(node):
            kind = tree[n]
            at = node == n
            if kind[0] == "leaf":
                continue
            node[at] = np.where(X[at, kind[1]] <= kind[2], 2 * n + 1, 2 * n + 2)
    for n in np.unique(node):
        out[node == n] = tree[n][1]
    return out


def trees_score(fused, data, model):
    X, _, qs, cs = data
    z = model[0] + sum(tree_predict(t, X) for t in model[1:])
    out = fused * 0.001
    out[qs, cs] = 10 + 1 / (1 + np.exp(-z))
    return out


def one_tree_python(tree: dict, x: list[float]) -> float:
    n = 0
    while tree[n][0] == "split":
        n = 2 * n + 1 if x[tree[n][1]] <= tree[n][2] else 2 * n + 2
    return tree[n][1]


def grouped_rows(convs, fuseds, data, fitter, l2, scorer=ltr_research.rerank):
    """fit_rows for fitters that read whole per-conversation data (query groups)."""
    model = fitter(data, l2)
    ins = [r for c, f, d in zip(convs, fuseds, data) for r in query_rows(c, scorer(f, d, model))]
    per = []
    for h in range(len(convs)):
        per.append(
            query_rows(convs[h], scorer(fuseds[h], data[h], fitter([d for j, d in enumerate(data) if j != h], l2)))
        )
    return ins, per


def section_pairwise(convs, base) -> None:
    print("== idea 3: pairwise and listwise objectives, boosted trees (same features)")
    for mode, b in base.items():
        per_config = {"current": b["per"]}
        for name, fitter, l2s, scorer in (
            ("pairwise (RankNet, linear)", fit_pairwise, (1.0, 10.0, 100.0), ltr_research.rerank),
            ("listwise (ListNet, linear)", ltr_research.fit_listwise, (1.0, 10.0), ltr_research.rerank),
            ("boosted trees 40 x depth 3", fit_trees, (1.0, 10.0), trees_score),
        ):
            for l2 in l2s:
                t0 = time.perf_counter()
                ins, per = grouped_rows(convs, b["fused"], b["data"], fitter, l2, scorer)
                loco = [r for p in per for r in p]
                print(line(f"{mode}: {name}, l2 {l2}: in-sample", summarise(ins)))
                print(line(f"{mode}: {name}, l2 {l2}: LOCO", summarise(loco)))
                print(paired(loco, b["loco"]) + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
                per_config[f"{name} l2 {l2}"] = per
        held = choose(convs, per_config)
        print(line(f"{mode}: nested choice among objectives", summarise(held)))
        print(paired(held, b["loco"]), flush=True)
    model = fit_trees(base["hybrid"]["data"], 1.0)
    rows = [list(map(float, x)) for x in base["hybrid"]["data"][0][0][:2000]]
    t0 = time.perf_counter()
    for x in rows:
        model[0] + sum(one_tree_python(t, x) for t in model[1:])
    print(
        f"    pure-Python scoring of 40 trees: {1000 * (time.perf_counter() - t0) / len(rows) * 20:.3f} ms "
        "per 20 candidates"
    )


# ==== Main ====


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="ceiling,session,expand,soft,context,vecname,pairwise")
    args = parser.parse_args(argv)
    only = args.only.split(",")
    started = time.perf_counter()
    convs = load_conversations(DEFAULT_DATA)
    embedder = solos_embed.load_embedder(None)
    vec = smooth(convs, vector_scores(convs, embedder, text_speaker_date), solos_rank.NEIGHBOUR_WEIGHT, 1)
    kw = ltr_research.kw_leg(convs, solos_rank.STOP_WORDS)
    kw_only = [normalised(m, 100, "minmax") for m in kw]
    hy = linear([kw, vec], [solos_rank.KEYWORD_WEIGHT, solos_rank.VECTOR_WEIGHT], 100, "minmax")
    print(HEAD)
    base = {}
    for mode, vecs, fused in (("keyword", None, kw_only), ("hybrid", vec, hy)):
        ltr_research.DEPTH = solos_rank.RERANK_DEPTH
        data = ltr_research.build(convs, kw, vecs, fused)
        print(line(f"{mode}: first pass", summarise([r for c, m in zip(convs, fused) for r in query_rows(c, m)])))
        per = report(f"{mode}: current reranker", convs, fused, data, None)
        base[mode] = {"fused": fused, "vecs": vecs, "data": data, "per": per, "loco": [r for p in per for r in p]}
    print(f"(set-up {time.perf_counter() - started:.0f} s)", flush=True)
    if "ceiling" in only:
        section_ceiling(convs, hy)
    if "session" in only:
        section_session(convs, kw, base)
    if "expand" in only:
        section_expand(convs, embedder, vec, base)
    if "soft" in only:
        section_soft(convs, embedder, base)
    if "context" in only:
        section_context(convs, embedder, kw, base)
    if "vecname" in only:
        section_vector_name(convs, kw, vec, base)
    if "pairwise" in only:
        section_pairwise(convs, base)
    print(f"run time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
