"""Offline ranking experiments for hybrid recall on LoCoMo (dev split only).

Simulates the service's two legs without the service: the keyword leg is
SQLite FTS5 in memory (tokenize='porter unicode61 remove_diacritics 2',
bm25()), the vector leg is MiniLM through solos_embed with numpy. Each
experiment scores every question of every conversation over all its turns and
prints the overall metrics; findings are in bench/RESULTS-locomo.md.

    .venv/bin/python bench/locomo_research.py [LOCOMO.json] [--only keyword,context,...]

Vectors are cached in .cache/locomo-vectors/ (keyed by model id and text).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from locomo import (
    BM25,
    DEFAULT_DATA,
    METRICS,
    REPO,
    Conversation,
    Turn,
    load_conversations,
    score,
    summarise,
    tokens,
)

import solos_embed
import solos_memory
import solos_rank

CACHE = REPO / ".cache" / "locomo-vectors"
FTS_TOKENIZER = "porter unicode61 remove_diacritics 2"  # schema.sql's
# What the service does is imported from it (solos_rank, the long tier's row of solos_memory.TIER_TABLE):
# the simulation measures the recipe as it serves.
Scores = list[np.ndarray]  # per conversation: (queries, turns) matrix, higher is better, 0 = not a candidate

# ==== Row texts: what gets indexed per turn ====


def speaker_col(conv: Conversation, i: int) -> str:
    return conv.turns[i].speaker


def date_col(conv: Conversation, i: int) -> str:
    return conv.turns[i].date


def tags_col(conv: Conversation, i: int) -> str:
    """The tags column as the service stores bench/locomo.py's tags (a JSON list)."""
    return f'["locomo", "session_{conv.turns[i].session}"]'


def text_raw(conv: Conversation, i: int) -> str:
    return conv.turns[i].text


def text_fact(conv: Conversation, i: int) -> str:
    """What the harness stores: the turn plus its image caption."""
    return conv.turns[i].fact


def text_speaker(conv: Conversation, i: int) -> str:
    return f"{conv.turns[i].speaker}: {conv.turns[i].fact}"


def text_speaker_date(conv: Conversation, i: int) -> str:
    t = conv.turns[i]
    return f"{t.speaker} ({t.date}): {t.fact}"


def neighbours(conv: Conversation, i: int, before: int, after: int) -> list[Turn]:
    """Turns around i in the same session (the service's analogue: same topic, adjacent ids)."""
    turn = conv.turns[i]
    lo, hi = max(0, i - before), min(len(conv.turns), i + after + 1)
    return [t for t in conv.turns[lo:hi] if t.session == turn.session and t is not turn]


def text_context(before: int, after: int) -> Callable[[Conversation, int], str]:
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
    return fts_scores_by(convs, columns, weights or [1.0] * len(columns), lambda q: fts_query(q, stop))


def fts_scores_by(
    convs: list[Conversation],
    columns: list[Callable[[Conversation, int], str]],
    weights: list[float],
    make_query: Callable[[str], str | None],
) -> Scores:
    """-bm25() per turn per question for a question-to-MATCH function, called once per question in order
    (None: no match)."""
    out = []
    names = [f"c{j}" for j in range(len(columns))]
    weight_args = "".join(f", {w}" for w in weights)
    for conv in convs:
        db = sqlite3.connect(":memory:")
        db.execute(f"CREATE VIRTUAL TABLE t USING fts5({', '.join(names)}, tokenize='{FTS_TOKENIZER}')")
        db.executemany(
            f"INSERT INTO t(rowid, {', '.join(names)}) VALUES (?{', ?' * len(names)})",
            [(i, *(col(conv, i) for col in columns)) for i in range(len(conv.turns))],
        )
        matrix = np.zeros((len(conv.queries), len(conv.turns)))
        for qi, q in enumerate(conv.queries):
            match = make_query(q.question)
            for rowid, rank in (
                db.execute(f"SELECT rowid, bm25(t{weight_args}) FROM t WHERE t MATCH ?", (match,)) if match else ()
            ):
                matrix[qi, rowid] = -rank
        out.append(matrix)
        db.close()
    return out


def plain_bm25_scores(convs: list[Conversation]) -> Scores:
    """The reference: Okapi BM25 on raw text, no stemming (bench/locomo.py's)."""
    out = []
    for conv in convs:
        index = BM25([tokens(t.text) for t in conv.turns])
        out.append(np.array([index.scores(tokens(q.question)) for q in conv.queries]))
    return out


# ==== Vector leg: MiniLM ====


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


def smooth(
    convs: list[Conversation],
    scores: Scores,
    gamma: float,
    window: int = 1,
    how: str = "max",
    before: int | None = None,
    after: int | None = None,
) -> Scores:
    """Recall-time context: score + gamma * (max or sum of) the scores of neighbouring turns in the session.

    Neighbours are the `before` turns preceding and `after` following (both `window` unless given).
    """
    before = window if before is None else before
    after = window if after is None else after
    offsets = [-d for d in range(1, before + 1)] + list(range(1, after + 1))
    out = []
    for conv, m in zip(convs, scores):
        parts = neighbour_scores(conv, m, offsets)
        extra = np.maximum.reduce(parts) if how == "max" else np.add.reduce(parts)
        out.append(m + gamma * extra)
    return out


def ranks_of(matrix: np.ndarray, depth: int) -> np.ndarray:
    """1-based rank of each turn per row among its top `depth` candidates; inf outside or at score 0."""
    order = np.argsort(-matrix, axis=1, kind="stable")[:, :depth]
    ranks = np.full(matrix.shape, np.inf)
    rows = np.arange(matrix.shape[0])[:, None]
    ranks[rows, order] = np.arange(1, order.shape[1] + 1)
    ranks[matrix <= 0] = np.inf
    return ranks


def rrf(legs: list[Scores], weights: list[float], k: float = 60.0, depth: int = 100) -> Scores:
    """Weighted reciprocal rank fusion: sum of w / (k + rank) over each leg's top `depth`."""
    fused = []
    for mats in zip(*legs):
        total = np.zeros_like(mats[0])
        for w, m in zip(weights, mats):
            total += w / (k + ranks_of(m, depth))
        fused.append(total)
    return fused


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


def recency(convs: list[Conversation], scores: Scores, weight: float, half_life: float) -> Scores:
    """Multiply by (1 + weight * 2^(-age/half_life)), age in turns from the newest: the service's recency knob."""
    out = []
    for conv, m in zip(convs, scores):
        age = np.arange(len(conv.turns))[::-1].astype(float)
        out.append(m * (1 + weight * np.power(2.0, -age / half_life)))
    return out


# ==== Evaluation ====


def evaluate(convs: list[Conversation], scores: Scores) -> dict[str, dict[str, float]]:
    rows = []
    for conv, matrix in zip(convs, scores):
        order = np.argsort(-matrix, axis=1, kind="stable")[:, :10]
        for q, idx, row in zip(conv.queries, order, matrix):
            ranked = [conv.turns[i].dia_id for i in idx if row[i] > 0]
            rows.append((q.category, score(ranked, q.evidence)))
    return summarise(rows)


def report(name: str, summary: dict[str, dict[str, float]], detail: bool = False) -> dict[str, float]:
    overall = summary["overall"]
    print(f"{name:<58}" + "".join(f"{overall[m]:>8.3f}" for m in METRICS), flush=True)
    if detail:
        for cat, row in summary.items():
            print(f"    {cat:<54}" + "".join(f"{row[m]:>8.3f}" for m in METRICS))
    return overall


# The recipe's keyword index: the service's columns (topic, fact, tags, agent) plus context.
RECIPE_COLUMNS = [date_col, text_fact, tags_col, speaker_col, text_context(2, 0)]
RECIPE_WEIGHTS = [float(w) for w in solos_memory.TIER_TABLE["long"].bm25_weights.split(",")]
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


def section_keyword(convs: list[Conversation]) -> None:
    """What to index per row and how to query, one idea at a time."""
    service = fts_scores(convs, [date_col, text_fact, tags_col, speaker_col], [1.0, 1.0, 0.5, 0.5])
    report("service v0: topic, fact, tags, agent @ 1, 1, .5, .5", evaluate(convs, service))
    report("fts5 porter, raw text", evaluate(convs, fts_scores(convs, [text_raw])))
    report("fts5 porter, text+caption", evaluate(convs, fts_scores(convs, [text_fact])))
    report("  stop words dropped from the query", evaluate(convs, fts_scores(convs, [text_fact], stop=True)))
    report("  + speaker column", evaluate(convs, fts_scores(convs, [text_fact, speaker_col], stop=True)))
    report("  + date column", evaluate(convs, fts_scores(convs, [text_fact, date_col], stop=True)))
    both = fts_scores(convs, [text_fact, speaker_col, date_col], stop=True)
    report("  + speaker and date columns", evaluate(convs, both))
    for beta in (0.1, 0.3, 0.5):
        report(f"    + x{1 + beta} when the question names the speaker", evaluate(convs, name_boost(convs, both, beta)))
    for before, after in ((1, 0), (2, 0), (3, 0), (1, 1), (2, 2)):
        for w in (0.2, 0.3, 0.5):
            cols = [text_fact, speaker_col, date_col, text_context(before, after)]
            kw = fts_scores(convs, cols, [1.0, 1.0, 1.0, w], stop=True)
            report(f"fact, speaker, date, stop + context {before} before {after} after, w {w}", evaluate(convs, kw))


def section_context(convs: list[Conversation]) -> None:
    """Context in the index (a column) or at recall time (neighbours' scores)."""
    base = name_boost(convs, fts_scores(convs, [text_fact, speaker_col, date_col], stop=True), 0.3)
    report("fact, speaker, date, stop, name boost", evaluate(convs, base))
    cols = [text_fact, speaker_col, date_col, text_context(2, 0)]
    ctx = name_boost(convs, fts_scores(convs, cols, [1.0, 1.0, 1.0, 0.3], stop=True), 0.3)
    report("  + context column, previous 2, w 0.3", evaluate(convs, ctx))
    for gamma in (0.2, 0.3, 0.5):
        report(f"    + neighbour max 1-1, gamma {gamma}", evaluate(convs, smooth(convs, ctx, gamma, 1)))
    for before, after in ((2, 0), (1, 1), (2, 2)):
        for how in ("max", "sum"):
            for gamma in (0.3, 0.5):
                scores = smooth(convs, base, gamma, how=how, before=before, after=after)
                report(
                    f"  recall time only: {how} of {before} before {after} after, gamma {gamma}",
                    evaluate(convs, scores),
                )
    ctx_table = fts_scores(convs, [text_context(2, 0)], stop=True)
    for lam in (0.2, 0.3, 0.5):
        two = [m + lam * c for m, c in zip(base, ctx_table)]
        report(f"  context in a second FTS table, + {lam} x its score", evaluate(convs, two))


def section_ablation(convs: list[Conversation]) -> None:
    """The recipe's keyword leg with one part removed at a time."""
    report("recipe keyword leg", evaluate(convs, recipe_keyword(convs)))
    for name, drop in (("context", 4), ("agent", 3), ("tags", 2), ("topic (date)", 0)):
        cols = [c for j, c in enumerate(RECIPE_COLUMNS) if j != drop]
        weights = [w for j, w in enumerate(RECIPE_WEIGHTS) if j != drop]
        kw = smooth(convs, name_boost(convs, fts_scores(convs, cols, weights, stop=True), 0.3), 0.3, 1)
        report(f"  without the {name} column", evaluate(convs, kw))
    kw = fts_scores(convs, RECIPE_COLUMNS, RECIPE_WEIGHTS, stop=False)
    report("  without dropping stop words", evaluate(convs, smooth(convs, name_boost(convs, kw, 0.3), 0.3, 1)))
    kw = fts_scores(convs, RECIPE_COLUMNS, RECIPE_WEIGHTS, stop=True)
    report("  without the name boost", evaluate(convs, smooth(convs, kw, 0.3, 1)))
    report("  without neighbour smoothing", evaluate(convs, name_boost(convs, kw, 0.3)))


def section_vector(convs: list[Conversation], embedder: solos_embed.Embedder) -> None:
    """What to embed per row, and neighbours at recall time."""
    for name, text in (
        ("text", text_raw),
        ("text+caption", text_fact),
        ("speaker: text", text_speaker),
        ("speaker (date): text", text_speaker_date),
    ):
        report(f"vector MiniLM, {name}", evaluate(convs, vector_scores(convs, embedder, text)))
    previous = lambda c, i: f"({c.turns[i].date}) " + text_context(1, 0)(c, i) + " " + text_speaker(c, i)
    report("vector MiniLM, (date) previous turn + this one", evaluate(convs, vector_scores(convs, embedder, previous)))
    vec = vector_scores(convs, embedder, text_speaker_date)
    for before, after in ((1, 1), (2, 0), (2, 2)):
        for how in ("max", "sum"):
            for gamma in (0.3, 0.5, 0.7):
                scores = smooth(convs, vec, gamma, how=how, before=before, after=after)
                report(
                    f"  speaker (date): text + {how} of {before} before {after} after, gamma {gamma}",
                    evaluate(convs, scores),
                )


def section_fusion(convs: list[Conversation], embedder: solos_embed.Embedder) -> None:
    """Fusing the recipe's legs: RRF vs normalised scores, weights, depth, recency."""
    kw, vec = recipe_keyword(convs), recipe_vector(convs, embedder)
    report("keyword leg", evaluate(convs, kw))
    report("vector leg", evaluate(convs, vec))
    for k in (10, 30, 60):
        for wv in (0.2, 0.35, 0.5, 0.7, 1.0):
            report(f"rrf k={k}, 1 kw + {wv} vec", evaluate(convs, rrf([kw, vec], [1.0, wv], k)))
    for how in ("max", "minmax"):
        for wv in (0.1, 0.2, 0.3, 0.4, 0.5):
            report(
                f"{how}-normalised top 100, {1 - wv:.1f} kw + {wv} vec",
                evaluate(convs, linear([kw, vec], [1 - wv, wv], 100, how)),
            )
    for depth in (10, 20, 50, 100, 200, 100000):
        report(
            f"minmax 0.7/0.3, candidate depth {depth}", evaluate(convs, linear([kw, vec], [0.7, 0.3], depth, "minmax"))
        )
    fused = linear([kw, vec], [0.7, 0.3], 100, "minmax")
    for weight, half_life in ((0.05, 200), (0.1, 200), (0.1, 1000), (0.3, 1000)):
        report(
            f"  x(1 + {weight} * 2^(-age / {half_life} turns))",
            evaluate(convs, recency(convs, fused, weight, half_life)),
        )


def section_recipe(convs: list[Conversation], embedder: solos_embed.Embedder, reference: Scores) -> None:
    """The recommended recipe per category and per conversation, and a leave-one-out check of its weight."""
    kw, vec = recipe_keyword(convs), recipe_vector(convs, embedder)
    hybrid = linear([kw, vec], FUSION, 100, "minmax")
    report("plain BM25 raw text (reference)", evaluate(convs, reference), True)
    report("keyword leg", evaluate(convs, kw), True)
    report("vector leg", evaluate(convs, vec), True)
    report("hybrid: minmax top 100, 0.7 kw + 0.3 vec", evaluate(convs, hybrid), True)
    report("hybrid: rrf k=10, 1.0 kw + 0.5 vec", evaluate(convs, rrf([kw, vec], [1.0, 0.5], 10, 100)), True)
    print("per conversation, hit@5 / frac@10: reference, keyword, vector, hybrid")
    for i, conv in enumerate(convs):
        cells = []
        for leg in (reference, kw, vec, hybrid):
            overall = evaluate([conv], [leg[i]])["overall"]
            cells.append(f"{overall['hit@5']:.3f} / {overall['frac@10']:.3f}")
        print(f"    {conv.sample_id:<10}{len(conv.queries):>5}  " + "   ".join(cells))
    grid = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
    per_conv = {
        wv: [evaluate([c], [f])["overall"] for c, f in zip(convs, linear([kw, vec], [1 - wv, wv], 100, "minmax"))]
        for wv in grid
    }
    sizes = [len(c.queries) for c in convs]
    held_hit = held_frac = 0.0
    for held in range(len(convs)):

        def fit(wv: float, held: int = held) -> float:
            rows = zip(per_conv[wv], sizes)
            return sum((r["hit@5"] + r["frac@10"]) * n for j, (r, n) in enumerate(rows) if j != held)

        best = max(grid, key=fit)
        held_hit += per_conv[best][held]["hit@5"] * sizes[held]
        held_frac += per_conv[best][held]["frac@10"] * sizes[held]
        print(f"    vector weight fitted without {convs[held].sample_id}: {best}")
    total = sum(sizes)
    print(f"leave-one-conversation-out hybrid: hit@5 {held_hit / total:.3f}, frac@10 {held_frac / total:.3f}")


# The recipe's index as the service could declare it: a self-contained FTS5 table (so a
# delete needs only the rowid) whose context column a trigger fills from the two previous
# rows of the same topic.
RECIPE_SQL = """
CREATE TABLE memory_longterm (id INTEGER PRIMARY KEY, agent TEXT, topic TEXT, fact TEXT, source TEXT, tags TEXT);
CREATE INDEX memory_longterm_topic ON memory_longterm (topic, id);
CREATE VIRTUAL TABLE memory_longterm_fts USING fts5 (
    topic, fact, tags, agent, context, tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER memory_longterm_fts_ai AFTER INSERT ON memory_longterm BEGIN
    INSERT INTO memory_longterm_fts (rowid, topic, fact, tags, agent, context)
    VALUES (new.id, new.topic, new.fact, new.tags, new.agent, (
        SELECT coalesce(group_concat(agent || ': ' || fact, ' '), '') FROM (
            SELECT agent, fact FROM memory_longterm
            WHERE topic IS new.topic AND id < new.id ORDER BY id DESC LIMIT 2)));
END;
CREATE TRIGGER memory_longterm_fts_ad AFTER DELETE ON memory_longterm BEGIN
    DELETE FROM memory_longterm_fts WHERE rowid = old.id;
END;
"""


def section_sql(convs: list[Conversation]) -> None:
    """The recipe's keyword index built by RECIPE_SQL's trigger, queried as the service would."""
    out = []
    for conv in convs:
        db = sqlite3.connect(":memory:")
        db.executescript(RECIPE_SQL)
        db.executemany(
            "INSERT INTO memory_longterm (agent, topic, fact, source, tags) VALUES (?, ?, ?, ?, ?)",
            [(t.speaker, t.date, t.fact, t.dia_id, tags_col(conv, i)) for i, t in enumerate(conv.turns)],
        )
        ids = {t.dia_id: i for i, t in enumerate(conv.turns)}
        weights = ", ".join(str(w) for w in RECIPE_WEIGHTS)
        matrix = np.zeros((len(conv.queries), len(conv.turns)))
        for qi, q in enumerate(conv.queries):
            sql = (
                f"SELECT m.source, -bm25(memory_longterm_fts, {weights}) FROM memory_longterm_fts "
                "JOIN memory_longterm m ON m.id = memory_longterm_fts.rowid WHERE memory_longterm_fts MATCH ?"
            )
            for source, rank in db.execute(sql, (fts_query(q.question, stop=True),)):
                matrix[qi, ids[source]] = rank
        out.append(matrix)
        db.close()
    report("RECIPE_SQL trigger index + name boost", evaluate(convs, name_boost(convs, out, 0.3)))
    kw = fts_scores(convs, RECIPE_COLUMNS, RECIPE_WEIGHTS, stop=True)
    report("the same, simulated (should be equal)", evaluate(convs, name_boost(convs, kw, 0.3)))


SECTIONS = ("keyword", "context", "ablation", "vector", "fusion", "recipe", "sql")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", nargs="?", default=str(DEFAULT_DATA), help="LoCoMo JSON (default: %(default)s)")
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections (default: %(default)s)")
    args = parser.parse_args(argv)
    convs = load_conversations(Path(args.data))
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    started = time.perf_counter()
    print(
        f"{'config (overall, ' + str(sum(len(c.queries) for c in convs)) + ' questions)':<58}"
        + "".join(f"{m:>8}" for m in METRICS)
    )
    reference = plain_bm25_scores(convs)
    report("plain BM25 raw text (reference)", evaluate(convs, reference))
    for name in chosen:
        print(f"-- {name}")
        if name == "keyword":
            section_keyword(convs)
        elif name == "context":
            section_context(convs)
        elif name == "ablation":
            section_ablation(convs)
        elif name == "vector":
            section_vector(convs, solos_embed.load_embedder(None))
        elif name == "fusion":
            section_fusion(convs, solos_embed.load_embedder(None))
        elif name == "recipe":
            section_recipe(convs, solos_embed.load_embedder(None), reference)
        elif name == "sql":
            section_sql(convs)
        else:
            parser.error(f"unknown section {name!r}; choose from {', '.join(SECTIONS)}")
    print(f"run time {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
