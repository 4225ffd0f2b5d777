"""The service's recall on LoCoMo, simulated offline: both legs, their fusion, and the metrics per question.

The keyword leg is SQLite FTS5 in memory with the service's tokenizer, columns
and bm25 weights (the long tier's), its stop words and FTS5 query
(solos_rank.make_fts_query), the name boost and the neighbour smoothing; the
vector leg is the service's embedder (solos_embed) and numpy. Fusion is
min-max over each leg's top 100, 0.7 keyword + 0.3 vector. Everything the
service does is imported from it, so the simulation measures the recipe as it
serves (through REST, bench/locomo.py gives the same figures to within 0.005).

A library, not a bench: bench/ltr_fit.py fits the reranker on it and
bench/locomo.py prints its cross-validated figures. Vectors are cached in
.cache/locomo-vectors/ (keyed by model id and text). How the recipe was found:
research/README.md.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from locomo_data import REPO, Conversation, Turn, score, summarise

import solos_embed
import solos_rank
import solos_store

CACHE = REPO / ".cache" / "locomo-vectors"
FTS_TOKENIZER = "porter unicode61 remove_diacritics 2"  # schema.sql's
Scores = list[np.ndarray]  # per conversation: (queries, turns) matrix, higher is better, 0 = not a candidate

# ==== Row texts: what gets indexed per turn ====


def speaker_col(conv: Conversation, i: int) -> str:
    return conv.turns[i].speaker


def date_col(conv: Conversation, i: int) -> str:
    return conv.turns[i].date


def tags_col(conv: Conversation, i: int) -> str:
    """The tags column as the service stores bench/locomo.py's tags (a JSON list)."""
    return f'["locomo", "session_{conv.turns[i].session}"]'


def text_fact(conv: Conversation, i: int) -> str:
    """What the harness stores: the turn plus its image caption."""
    return conv.turns[i].fact


def text_speaker_date(conv: Conversation, i: int) -> str:
    """What the service embeds for a long fact: "agent (topic): fact"."""
    t = conv.turns[i]
    return f"{t.speaker} ({t.date}): {t.fact}"


def neighbours(conv: Conversation, i: int, before: int, after: int) -> list[Turn]:
    """Turns around i in the same session (the service's analogue: same topic, adjacent ids)."""
    turn = conv.turns[i]
    lo, hi = max(0, i - before), min(len(conv.turns), i + after + 1)
    return [t for t in conv.turns[lo:hi] if t.session == turn.session and t is not turn]


def text_context(before: int, after: int) -> Callable[[Conversation, int], str]:
    """The context column: the neighbouring turns' "speaker: fact"."""

    def build(conv: Conversation, i: int) -> str:
        return " ".join(f"{t.speaker}: {t.fact}" for t in neighbours(conv, i, before, after))

    return build


# ==== Keyword leg: SQLite FTS5 ====


def fts_query(question: str, stop: bool) -> str:
    """The question as the service's FTS5 query (solos_rank.make_fts_query), with or without its stop words."""
    words = solos_rank.query_words(question)
    return solos_rank.make_fts_query(words, solos_rank.STOP_WORDS if stop else frozenset()) or '"\u2400"'


def fts_scores(
    convs: list[Conversation],
    columns: list[Callable[[Conversation, int], str]],
    weights: list[float] | None = None,
    stop: bool = False,
) -> Scores:
    """-bm25() of every turn for every question (0 where the turn does not match)."""
    out = []
    names = [f"c{j}" for j in range(len(columns))]
    weight_args = "".join(f", {w}" for w in weights or [1.0] * len(columns))
    for conv in convs:
        db = sqlite3.connect(":memory:")
        db.execute(f"CREATE VIRTUAL TABLE t USING fts5({', '.join(names)}, tokenize='{FTS_TOKENIZER}')")
        db.executemany(
            f"INSERT INTO t(rowid, {', '.join(names)}) VALUES (?{', ?' * len(names)})",
            [(i, *(col(conv, i) for col in columns)) for i in range(len(conv.turns))],
        )
        matrix = np.zeros((len(conv.queries), len(conv.turns)))
        for qi, q in enumerate(conv.queries):
            sql = f"SELECT rowid, bm25(t{weight_args}) FROM t WHERE t MATCH ?"
            for rowid, rank in db.execute(sql, (fts_query(q.question, stop),)):
                matrix[qi, rowid] = -rank
        out.append(matrix)
        db.close()
    return out


# ==== Vector leg: the service's embedder ====


def embed_cached(embedder: solos_embed.Embedder, texts: list[str], cache: Path = CACHE) -> np.ndarray:
    """Vectors of texts, cached on disk (in `cache`) by model id and content."""
    key = hashlib.sha256("\0".join([embedder.model_id, *texts]).encode()).hexdigest()[:24]
    path = cache / f"{key}.npy"
    if path.exists():
        return np.load(path)
    vectors = solos_embed.decode_vectors(embedder.embed(texts), embedder.dim)
    cache.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


def vector_scores(
    convs: list[Conversation],
    embedder: solos_embed.Embedder,
    text: Callable[[Conversation, int], str],
    cache: Path = CACHE,
) -> Scores:
    """Cosine similarity of every turn's vector to every question's."""
    out = []
    for conv in convs:
        docs = embed_cached(embedder, [text(conv, i) for i in range(len(conv.turns))], cache)
        queries = embed_cached(embedder, [q.question for q in conv.queries], cache)
        out.append(queries @ docs.T)
    return out


# ==== Transformations and fusion ====


def name_boost(convs: list[Conversation], scores: Scores, beta: float) -> Scores:
    """Multiply a turn's score by (1 + beta) when the question names its speaker (the agent)."""
    out = []
    for conv, m in zip(convs, scores):
        boost = np.ones_like(m)
        for qi, q in enumerate(conv.queries):
            named = {s for s in conv.speakers if re.search(rf"\b{re.escape(s)}\b", q.question, re.IGNORECASE)}
            for ti, t in enumerate(conv.turns):
                if t.speaker in named:
                    boost[qi, ti] += beta
        out.append(m * boost)
    return out


def neighbour_scores(conv: Conversation, matrix: np.ndarray, offsets: list[int]) -> list[np.ndarray]:
    """For each offset d, the score of turn i+d (same session) aligned at i; 0 where there is none."""
    sessions = np.array([t.session for t in conv.turns])
    n = matrix.shape[1]
    out = []
    for d in offsets:
        shifted = np.zeros_like(matrix)
        lo, hi = max(0, -d), min(n, n - d)
        same = sessions[lo:hi] == sessions[lo + d : hi + d]
        shifted[:, lo:hi] = np.where(same, matrix[:, lo + d : hi + d], 0.0)
        out.append(shifted)
    return out


def smooth(convs: list[Conversation], scores: Scores, gamma: float, window: int = 1) -> Scores:
    """Recall-time context: score + gamma x the best score of the `window` turns either side in the session."""
    offsets = [-d for d in range(1, window + 1)] + list(range(1, window + 1))
    return [m + gamma * np.maximum.reduce(neighbour_scores(conv, m, offsets)) for conv, m in zip(convs, scores)]


def ranks_of(matrix: np.ndarray, depth: int) -> np.ndarray:
    """1-based rank of each turn per row among its top `depth` candidates; inf outside or at score 0."""
    order = np.argsort(-matrix, axis=1, kind="stable")[:, :depth]
    ranks = np.full(matrix.shape, np.inf)
    rows = np.arange(matrix.shape[0])[:, None]
    ranks[rows, order] = np.arange(1, order.shape[1] + 1)
    ranks[matrix <= 0] = np.inf
    return ranks


def normalised(matrix: np.ndarray, depth: int, how: str) -> np.ndarray:
    """Scores of each row's top `depth` scaled to (0, 1] ("max": s / max; "minmax"); 0 elsewhere."""
    ranks = ranks_of(matrix, depth)
    keep = np.isfinite(ranks)
    masked = np.where(keep, matrix, np.nan)
    top = np.nanmax(masked, axis=1, keepdims=True)
    if how == "max":
        out = matrix / np.where(top > 0, top, 1.0)
    else:
        low = np.nanmin(masked, axis=1, keepdims=True)
        out = (matrix - low) / np.where(top > low, top - low, 1.0) * 0.99 + 0.01
    return np.where(keep, out, 0.0)


def linear(legs: list[Scores], weights: list[float], depth: int = 100, how: str = "max") -> Scores:
    """Convex combination of per-leg normalised scores over each leg's top `depth`."""
    return [
        sum((w * normalised(m, depth, how) for w, m in zip(weights, mats)), np.zeros_like(mats[0]))
        for mats in zip(*legs)
    ]


# ==== The recipe the service runs ====

# The long tier's keyword index: the service's columns (topic, fact, tags, agent) plus context, its weights.
RECIPE_COLUMNS = [date_col, text_fact, tags_col, speaker_col, text_context(2, 0)]
RECIPE_WEIGHTS = [float(w) for w in solos_store.TIER_TABLE["long"].bm25_weights.split(",")]
NAME_BETA = solos_rank.NAME_BOOST - 1
KEYWORD_GAMMA = solos_rank.NEIGHBOUR_KEYWORD_WEIGHT
VECTOR_GAMMA = solos_rank.NEIGHBOUR_WEIGHT
FUSION = [solos_rank.KEYWORD_WEIGHT, solos_rank.VECTOR_WEIGHT]


def recipe_keyword(convs: list[Conversation]) -> Scores:
    """Keyword leg: FTS5 over RECIPE_COLUMNS, stop words out, the name boost, neighbour max."""
    kw = fts_scores(convs, RECIPE_COLUMNS, RECIPE_WEIGHTS, stop=True)
    return smooth(convs, name_boost(convs, kw, NAME_BETA), KEYWORD_GAMMA, 1)


def recipe_vector(convs: list[Conversation], embedder: solos_embed.Embedder) -> Scores:
    """Vector leg: cosine to 'agent (topic): fact', plus VECTOR_GAMMA x the better neighbour's."""
    return smooth(convs, vector_scores(convs, embedder, text_speaker_date), VECTOR_GAMMA, 1)


def recipe_hybrid(kw: Scores, vec: Scores) -> Scores:
    """The fused first pass: each leg min-max over its top 100, FUSION weights."""
    return linear([kw, vec], FUSION, 100, "minmax")


def keyword_strength(conv: Conversation, question: str, keyword: np.ndarray) -> float:
    """solos_rank.keyword_strength over one question's keyword scores of the conversation's turns."""
    stems = solos_rank.content_stems(solos_rank.query_words(question))
    best = [int(i) for i in np.argsort(-keyword, kind="stable")[: solos_rank.WEAK_KEYWORD_ROWS] if keyword[i] > 0]
    rows = {i: {"keyword": float(keyword[i]), "text": conv.turns[i].fact, "agent": conv.turns[i].speaker} for i in best}
    return solos_rank.keyword_strength(stems, rows)


# ==== Evaluation ====


def query_rows(conv: Conversation, matrix: np.ndarray) -> list[tuple[int, dict[str, float]]]:
    """(category, metrics) of every question of conv, ranked by its row of matrix (top 10, score > 0)."""
    order = np.argsort(-matrix, axis=1, kind="stable")[:, :10]
    rows = []
    for q, idx, row in zip(conv.queries, order, matrix):
        ranked = [conv.turns[i].dia_id for i in idx if row[i] > 0]
        rows.append((q.category, score(ranked, q.evidence)))
    return rows


def evaluate(convs: list[Conversation], scores: Scores) -> dict[str, dict[str, float]]:
    """The summary (per category and overall) of every conversation ranked by its matrix."""
    return summarise([r for conv, matrix in zip(convs, scores) for r in query_rows(conv, matrix)])


HEAD = f"{'config':<62}{'hit@1':>7}{'hit@5':>7}{'hit@10':>7}{'frac@10':>8}{'MRR':>7}{'mh@5':>7}{'od@5':>7}"


def line(name: str, summary: dict[str, dict[str, float]]) -> str:
    """One row under HEAD: overall hit@1, hit@5, hit@10, frac@10, MRR; multi-hop and open-domain hit@5."""
    o = summary["overall"]
    mh = summary.get("multi-hop", {}).get("hit@5", float("nan"))
    od = summary.get("open-domain", {}).get("hit@5", float("nan"))
    return (
        f"{name:<62}{o['hit@1']:>7.3f}{o['hit@5']:>7.3f}{o['hit@10']:>7.3f}{o['frac@10']:>8.3f}{o['MRR']:>7.3f}"
        f"{mh:>7.3f}{od:>7.3f}"
    )
