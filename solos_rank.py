"""solos-memory's ranking, in one place: how recall turns a question into an ordered, labelled list.

In the order a recall meets them: query words and the FTS5 query; the keyword
leg (BM25 per tier, a named writer's boost, topic neighbours); the vector leg
(an in-memory index of the embedder's vectors, masked by scope and sharing);
fusion of the two legs; duplicate collapse; labelling each row with its writer,
tier, source and whether it is foreign. Every weight is a named constant with
the bench result that chose it (bench/RESULTS-locomo.md).

Standard library only, but for numpy in the vector leg (imported when an
embedder is loaded). Imports nothing from the service: the spine hands it rows,
tiers (rows of its TIER_TABLE) and a store it can ask for more rows.
bench/locomo_research.py uses these same functions.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("solos_memory")

# ==== Query words ====

MAX_QUERY_TERMS = 64  # longer questions add noise, not recall; 10 KB of junk stays cheap
# Function and question words: FTS5 ORs every query word, and these add score
# to every short row. Dropping them: LoCoMo hit@5 +0.04 (RESULTS-locomo.md, "Headline").
STOP_WORDS = frozenset(
    """
a an and are as at be been by did do does for from had has have he her his how i in is it its me my of on or
she so that the their them they this to was we were what when where which who whom why will with would you your
""".split()
)


def query_words(text: str) -> list[str]:
    """The distinct lower-cased words of free text, at most MAX_QUERY_TERMS."""
    return list(dict.fromkeys(word.lower() for word in re.findall(r"\w+", text)))[:MAX_QUERY_TERMS]


def make_fts_query(words: list[str]) -> str | None:
    """Quote each word for FTS5 MATCH, OR-ed, stop words dropped unless nothing else is left.

    Quoting makes every user string a literal: FTS5 operators, column filters
    and stray quotes in `q` never reach the query parser.
    """
    kept = [word for word in words if word not in STOP_WORDS] or words
    if not kept:
        return None
    return " OR ".join('"' + word.replace('"', '""') + '"' for word in kept)


def term_overlap(query: str, text: str) -> int:
    """How many distinct query words occur in text (case-insensitive)."""
    words = set(re.findall(r"\w+", text.lower()))
    return len({w for w in re.findall(r"\w+", query.lower())} & words)


# ==== The keyword leg ====

# Per tier and leg; LoCoMo recall is flat from 50 candidates up, latency is not (RESULTS-locomo.md, "Recall v2":
# depth 20-200, held-out hit@5 flat from 30).
CANDIDATE_DEPTH = 50
NAME_BOOST = 1.3  # a question that names a row's writer is about that writer (RESULTS-locomo.md, "name boost")
# A long fact borrows this share of its best topic neighbour's keyword score (LoCoMo frac@10 +0.013).
NEIGHBOUR_KEYWORD_WEIGHT = 0.3

Key = tuple[str, int]  # (tier name, row id)


def keyword_candidates(
    store: Any, conn: Any, tiers: Sequence[Any], caller: str, scope: str, match: str, words: list[str], depth: int
) -> dict[Key, dict]:
    """BM25 per tier after the scope, sharing and expiry filters, x NAME_BOOST for a named writer, then neighbours."""
    candidates = {}
    for tier in tiers:
        for row in store.ranked_rows(conn, tier, caller, scope, match, depth):
            result = tier_result(tier, row, caller)
            result["keyword"] = result["score"] * (NAME_BOOST if row["agent"].lower() in words else 1.0)
            candidates[(tier.name, row["id"])] = result
    threaded = [tier for tier in tiers if tier.threaded]
    for tier in threaded:
        smooth_with_neighbours(store, conn, tier, caller, scope, candidates)
    return candidates


def smooth_with_neighbours(store: Any, conn: Any, tier: Any, caller: str, scope: str, keyword: dict[Key, dict]) -> None:
    """Add to each fact a share of its best-matching topic neighbour's keyword score.

    An answer often sits in the turn after the one that matches the question
    ("What did you do?" / "I went to ..."); the index's context column covers
    the turns before. A neighbour of a match may enter the candidates this way.
    """
    matched = {row_id: result["keyword"] for (name, row_id), result in keyword.items() if name == tier.name}
    if not matched:
        return
    borrowed: dict[int, float] = {}
    for row_id, neighbours in store.topic_neighbours(conn, list(matched)).items():
        for neighbour in neighbours:
            if neighbour is not None:
                borrowed[neighbour] = max(borrowed.get(neighbour, 0.0), matched[row_id])
    entering = [row_id for row_id in borrowed if row_id not in matched]
    for row in store.rows_by_id(conn, tier, caller, scope, entering) if entering else ():
        keyword[(tier.name, row["id"])] = {**tier_result(tier, row, caller), "keyword": 0.0}
    for row_id, share in borrowed.items():
        if (tier.name, row_id) in keyword:
            keyword[(tier.name, row_id)]["keyword"] += NEIGHBOUR_KEYWORD_WEIGHT * share


# ==== The vector leg ====

# A long fact borrows half the best cosine of its topic neighbours (RESULTS-locomo.md, "Recall v2": vector
# smoothing 0.3 / 0.5 / 0.7 gave vector hit@5 .519 / .520 / .509).
NEIGHBOUR_WEIGHT = 0.5


class VectorIndex:
    """The loaded model's vectors per tier, in memory, reloaded when the database's vector generation moves.

    Vectors from any other model are never loaded, so never compared. A
    reload (about 3 ms per 1,000 rows) runs in the background while recall
    keeps using the last snapshot: a just-embedded row joins the vector leg a
    moment later (the keyword leg has it at once), and a deleted row never
    comes back, because candidates are re-read through the SQL filters.
    """

    def __init__(self, model_id: str, tiers: Sequence[str]):
        self.model_id = model_id
        self.tier_names = tuple(tiers)
        self.lock = threading.Lock()
        self.generation: int | None = None
        self.reloading = False
        self.tiers: dict[str, tuple] = {}

    def refresh(self, store: Any, conn: Any, tiers: Sequence[str]) -> None:
        """Make the snapshot current: at once while it holds nothing for these tiers, else in the background."""
        generation = store.vector_generation(conn)
        if generation == self.generation:
            return
        if not self.count(tiers):
            self.load(store, conn, generation)
            return
        with self.lock:
            if self.reloading:
                return
            self.reloading = True
        threading.Thread(target=self.reload, args=(store,), name="vector-reload", daemon=True).start()

    def reload(self, store: Any) -> None:
        try:
            store.read(lambda conn: self.load(store, conn, store.vector_generation(conn)))
        except Exception:  # the next recall tries again; until then the old snapshot serves
            log.exception("vector reload failed")
        finally:
            self.reloading = False

    def load(self, store: Any, conn: Any, generation: int) -> None:
        import numpy as np

        tiers = {}
        for tier in self.tier_names:
            rows = store.load_vectors(conn, tier, self.model_id)
            ids = np.array([row["id"] for row in rows], dtype=np.int64)
            agents = np.array([row["agent"] for row in rows], dtype=object)
            expires = np.array([row["expires_at"] or "" for row in rows], dtype=object)
            matrix = np.frombuffer(b"".join(row["vector"] for row in rows), dtype="<f4")
            matrix = matrix.reshape(len(rows), -1) if rows else np.zeros((0, 1), dtype=np.float32)
            threads = [row["thread"] for row in rows]
            prev = np.array(
                [i - 1 if i and threads[i] and threads[i - 1] == threads[i] else -1 for i in range(len(rows))],
                dtype=np.int64,
            )
            after = np.array(
                [
                    i + 1 if i + 1 < len(rows) and threads[i] and threads[i + 1] == threads[i] else -1
                    for i in range(len(rows))
                ],
                dtype=np.int64,
            )
            tiers[tier] = (ids, agents, expires, matrix, prev, after)
        with self.lock:
            if self.generation is None or generation >= self.generation:
                self.tiers, self.generation = tiers, generation

    def count(self, tiers: Sequence[str]) -> int:
        """Vectors loaded for these tiers."""
        return sum(len(self.tiers[tier][0]) for tier in tiers if tier in self.tiers)

    def search(self, tier: str, query: Any, allowed: Callable[[Any], Any], depth: int) -> dict[int, float]:
        """Top `depth` rows by cosine (plus topic neighbours'), among rows `allowed` keeps and not expired."""
        import numpy as np

        ids, agents, expires, matrix, prev, after = self.tiers.get(tier, (None,) * 6)
        if ids is None or not len(ids):
            return {}
        cosine = matrix @ query
        padded = np.append(cosine, 0.0)  # index -1 (no neighbour) reads 0
        neighbours = np.maximum(padded[prev], padded[after])
        score = cosine + NEIGHBOUR_WEIGHT * np.where((prev >= 0) | (after >= 0), neighbours, 0.0)
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())  # to the second: SQL re-filters candidates
        mask = allowed(agents) & ((expires == "") | (expires > now)).astype(bool)
        candidates = np.flatnonzero(mask)
        if not len(candidates):
            return {}
        top = candidates[np.argsort(-score[candidates], kind="stable")[:depth]]
        return {int(ids[i]): float(score[i]) for i in top}


def vector_candidates(
    vectors: VectorIndex, query: Any, tiers: Sequence[Any], caller: str, scope: str, sharing: set[str], depth: int
) -> dict[Key, float]:
    """Cosine per tier among rows the scope (and, for opt-in tiers, the authors' sharing) allows."""
    similar = {}
    for tier in tiers:
        allowed = scope_mask(caller, scope, sharing | {caller} if tier.opt_in else None)
        similar.update(
            {(tier.name, row_id): cosine for row_id, cosine in vectors.search(tier.name, query, allowed, depth).items()}
        )
    return similar


def scope_mask(caller: str, scope: str, readable: set[str] | None) -> Callable[[Any], Any]:
    """The vector leg's filter over an array of writers: scope, then (opt-in tiers) who shares."""
    import numpy as np

    def allowed(agents: Any) -> Any:
        mask = np.ones(len(agents), dtype=bool)
        if scope == "own":
            mask &= agents == caller
        elif scope == "shared_except_self":
            mask &= agents != caller
        if readable is not None:
            mask &= np.isin(agents, list(readable))
        return mask.astype(bool)

    return allowed


# ==== Fusion ====

# The vector leg is weaker: it must not drown BM25. Min-max 0.7 / 0.3 (RESULTS-locomo.md, "Headline"; held-out,
# the fitted vector weight is 0.2 or 0.3 in every fold; "Recall v2": RRF and z-score within 0.005).
KEYWORD_WEIGHT, VECTOR_WEIGHT = 0.7, 0.3
LEG_WEIGHTS = {"hybrid": (KEYWORD_WEIGHT, VECTOR_WEIGHT), "keyword": (1.0, 0.0), "vector": (0.0, 1.0)}


def normalise(scores: dict[Any, float]) -> dict[Any, float]:
    """Min-max onto [0.01, 1], so both legs share a scale and a weak match is still above absent."""
    if not scores:
        return {}
    low, high = min(scores.values()), max(scores.values())
    if high == low:
        return {key: 1.0 for key in scores}
    return {key: 0.01 + 0.99 * (value - low) / (high - low) for key, value in scores.items()}


def fuse(candidates: dict[Key, dict], similar: dict[Key, float], ranking: str) -> list[dict]:
    """One score in [0, 1] per row from LEG_WEIGHTS over the two legs, each min-max normalised; best first.

    A row outside a leg's candidates gets 0 from it.
    """
    keyword = normalise({key: r["keyword"] for key, r in candidates.items() if r["keyword"] is not None})
    vector = normalise(similar)
    weights = LEG_WEIGHTS[ranking]
    fused = []
    for key, result in candidates.items():
        result.pop("keyword")
        result["score"] = weights[0] * keyword.get(key, 0.0) + weights[1] * vector.get(key, 0.0)
        if result["score"] > 0:
            fused.append(result)
    fused.sort(key=lambda r: r["score"], reverse=True)
    return fused


# ==== Presenting: labels, duplicates ====


def tier_result(tier: Any, row: Any, caller: str) -> dict:
    """One recalled row, labelled with tier, writer, time, score, source and foreign."""
    result = {
        "id": row["id"],
        "tier": tier.label,
        "agent": row["agent"],
        "ts": row["ts"],
        "score": row["score"],
        "foreign": row["agent"] != caller,
        "source": f"{tier.table}#{row['id']}",
        "text": row[tier.text_column],
    }
    result.update({column: row[column] for column in tier.result_columns})  # tags: parsed by present()
    result["source"] = result["source"] or f"{tier.table}#{row['id']}"  # a long fact may name its own
    if tier.opt_in:
        result["archived"] = tier.archived
    return result


def durable_result(row: Any, caller: str) -> dict:
    """The caller's persona record; listed first, since it is the caller's identity."""
    return {
        "id": row["id"],
        "tier": "durable",
        "agent": caller,
        "ts": row["updated_at"],
        "score": 1.0,
        "foreign": False,
        "source": f"memory_durable/{row['key']}",
        "text": row["value"],
        "key": row["key"],
        "value": row["value"],
    }


def parse_tags(raw: Any) -> list[str]:
    """Tags as stored: a JSON array from this service, maybe a comma list from other writers."""
    if not raw:
        return []
    try:
        tags = json.loads(raw)
    except (TypeError, ValueError):
        return [part.strip() for part in str(raw).split(",") if part.strip()]
    return [str(tag) for tag in tags] if isinstance(tags, list) else [str(tags)]


def collapse_duplicates(ranked: list[dict], k: int) -> tuple[list[dict], list[dict]]:
    """Keep the best-ranked copy of each identical text; return the kept and the collapsed copies.

    A collapsed copy still shows in its kept twin's `duplicates` and `also_written_by`.
    """
    kept: dict[str, dict] = {}
    collapsed = []
    for result in ranked:
        text = " ".join(str(result["text"]).split()).casefold()
        if text in kept:
            first = kept[text]
            first["duplicates"] = first.get("duplicates", 0) + 1
            if result["agent"] not in first.setdefault("also_written_by", []) and result["agent"] != first["agent"]:
                first["also_written_by"].append(result["agent"])
            collapsed.append(result)
        elif len(kept) < k:
            kept[text] = result
    for result in kept.values():
        if not result.get("also_written_by"):
            result.pop("also_written_by", None)
    return list(kept.values()), collapsed
