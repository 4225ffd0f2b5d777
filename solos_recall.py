"""solos_recall: the recall operation, a pipeline. plan_recall -> rank (gather, fuse, rerank in one read) -> present.

Its plan (RecallPlan) is solos_rank's, so ranking takes it typed; what it knows per tier is one row of the
store's TIER_TABLE; the ranking itself is solos_rank's; the delivery log and corroboration solos_provenance's.
Operations get the service's Memory as `memory` (the store, the embedder and its vector index, the counters).
Imports the store, solos_rank, solos_provenance, the bounds and what operation rows are made of
(solos_operations, solos_validation); never the spine.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any

import solos_bounds
import solos_provenance
import solos_rank
import solos_store
from solos_operations import NULLABLE_STRING, Operation, object_schema, result_schema
from solos_rank import RecallPlan
from solos_store import (
    DEFAULT_TIERS,
    SCOPES,
    TIER_TABLE,
    TIERS,
    BadRequest,
    Store,
    Visibility,
    refuse_foreign_persona,
)
from solos_validation import AGENT_SCHEMA, TAGS_SCHEMA

RANKING_LEGS = {"recency": [], "keyword": ["keyword"], "vector": ["vector"], "hybrid": ["keyword", "vector"]}


def op_recall_memory(memory: Any, args: dict) -> dict:
    """Recall memory across agents and tiers, best match first.

    Every result names its writer (`agent`) and says whether it is `foreign`
    to the caller. With an empty `q` the most recent rows come back. Scope
    `own` reads only the caller's rows, `shared` everyone's, and
    `shared_except_self` everyone else's. Tiers default to long + short;
    `episodic` includes other agents' events only where they opted in (and
    the read is audited); `durable` is the caller's own persona only.
    Ranking fuses BM25 keyword matches with embedding similarity, then a
    learned reranker reorders the best (`reranked`); `score` is in [0, 1] and
    comparable within one response. Each row's `relevance` is the calibrated
    probability that it is relevant to `q`; rows under `min_relevance`
    (default 0: every match) are left out and counted in `below_floor`: an
    empty answer then means nothing relevant, not a failure. `tags` keeps rows
    carrying any of them. `receipt` says, without content, which legs ran and
    how many rows the caller may read were considered. `degraded: true` means
    part of the ranking was unavailable (the embedder missing, failing or far
    behind: keyword-only) and says why. Identical texts are collapsed and
    counted in `suppressed_duplicates`.
    """
    started = time.perf_counter()
    planned = plan_recall(memory, args)
    plan, found, ranked = memory.store.read(lambda conn: rank(memory, planned, conn))
    answer = present(memory, plan, found, ranked)
    memory.activity.recalled(plan.caller, [r["agent"] for r in answer["results"]], time.perf_counter() - started)
    return answer


@dataclass
class Gathered:
    """What one read found: who may see what, the persona, each leg's candidates, and the ranking they allow."""

    seen: Visibility
    persona: list[dict]
    candidates: dict[tuple[str, int], dict]
    similar: dict[tuple[str, int], float]
    ranking: str  # the plan's, or keyword when no row of these tiers has a vector yet
    around: solos_rank.Around = field(default_factory=dict)  # topic neighbours read so far
    reranked: bool = False  # the learned reranker ordered the best rows
    rerank_failure: str | None = None  # why it could not, leaving the first pass's order
    judge: str | None = None  # who set `relevance`: solos_judge's name, "relevance", or None (recency, vector)
    judge_reason: str | None = None  # why not the fitted judge (its file missing, changed, malformed, failing)
    without_vector: int | None = None  # candidates with no vector yet; None: no embedder, or no question
    words_left_out: list[str] = field(default_factory=list)  # left out of the keyword leg for the rows they match


def plan_recall(memory: Any, args: dict) -> RecallPlan:
    """Check the request against the rules, parse the question, embed it if the embedder may rank."""
    caller, k, scope = args["agent"], args["k"], args["scope"]
    tiers = tuple(dict.fromkeys(args["tiers"] or DEFAULT_TIERS))
    refuse_foreign_persona(tiers, scope)
    searched = [TIER_TABLE[tier] for tier in tiers if tier != "durable"]
    if args["archive"]:
        if "episodic" not in tiers:
            raise BadRequest("archive=true searches archived episodic rows: add episodic to tiers", "archive")
        searched.append(TIER_TABLE[solos_store.ARCHIVE_TIER])
    query = args["q"] or ""
    words = solos_rank.query_words(query)
    match = solos_rank.make_fts_query(words)
    reason = memory.embedder_state()["degraded_reason"]  # what /health says, this very moment
    embedding = None
    if match and args["ranking"] != "keyword" and memory.embedder is not None:
        embedding = memory.start_embedding(query)  # runs beside the keyword leg (gather)
    if match is None:
        ranking = "recency"
    else:
        ranking = "keyword" if embedding is None else ("vector" if args["ranking"] == "vector" else "hybrid")
    depth = max(solos_rank.CANDIDATE_DEPTH, k * 4 + 20)  # room for collapsed duplicates without a second query
    tags = tuple(dict.fromkeys(args["tags"] or ()))
    return RecallPlan(
        caller,
        k,
        scope,
        tiers,
        tuple(searched),
        query,
        words,
        match,
        None,
        ranking,
        reason,
        depth,
        tags,
        args["min_relevance"],
        embedding,
    )


def gather(memory: Any, plan: RecallPlan, conn: sqlite3.Connection) -> tuple[RecallPlan, Gathered]:
    """Every candidate both legs find, in one read snapshot, already filtered by scope, sharing and expiry; and
    the plan with the question's vector (or why there is none)."""
    store, caller = memory.store, plan.caller
    if store.shared_by_copies:  # another copy's (or worker's) forget drops what this one keeps, before it answers
        memory.events.retracted_since(conn)
    Store.require_agent(conn, caller)
    seen = Visibility.read(conn, caller, plan.scope)
    persona = []
    if "durable" in plan.tiers and not plan.tags:  # a persona has no tags
        row = store.persona(conn, caller)
        if row is not None and (plan.match is None or solos_rank.term_overlap(plan.query, row["value"])):
            persona.append(solos_rank.durable_result(row, caller))
    if plan.match is None:
        if plan.query.strip():  # words-free text (only punctuation): nothing can match
            return plan, Gathered(seen, persona, {}, {}, plan.ranking)
        recent = {
            (tier.name, row["id"]): solos_rank.tier_result(tier, row, caller)
            for tier in plan.searched
            for row in store.recent_rows(conn, tier, seen, plan.depth, plan.tags)
        }
        return plan, Gathered(seen, persona, recent, {}, plan.ranking)
    ranking, vectors = plan.ranking, memory.vectors
    names = [tier.name for tier in plan.searched]
    candidates: dict[tuple[str, int], dict] = {}
    around: solos_rank.Around = {}
    left_out: list[str] = []

    def keyword_leg() -> dict[tuple[str, int], dict]:
        return solos_rank.keyword_candidates(store, conn, plan, seen, around, memory.common_words, left_out)

    if ranking == "hybrid":  # while the question is embedded (plan_recall started it)
        candidates = keyword_leg()
    keyword_ran, plan = ranking == "hybrid", plan.with_vector()
    ranking = plan.ranking
    if plan.vector is not None and vectors is not None:
        vectors.refresh(store, conn, names)
        # Rows, none embedded yet: keyword. Only tiers holding no row the caller may read stay hybrid (both legs
        # ran and found nothing); rows the keyword leg missed were out of the vector leg's reach, not absent.
        if not vectors.count(names) and (
            candidates
            or not keyword_ran
            or any(store.recent_rows(conn, tier, seen, 1, plan.tags) for tier in plan.searched)
        ):
            ranking = "keyword"
    if ranking == "keyword" and not keyword_ran:
        candidates = keyword_leg()
    if ranking == "hybrid" and vectors is not None:  # other copies' rows, embedded since the snapshot
        vectors.fill(store, conn, list(candidates))
    similar: dict[tuple[str, int], float] = {}
    if ranking in ("vector", "hybrid") and vectors is not None:
        similar = solos_rank.vector_candidates(vectors, plan.vector, plan.searched, seen, plan.depth)
        for tier in plan.searched:  # rows only the vector leg found, read through the same SQL filters
            missing = [row_id for (name, row_id) in similar if name == tier.name and (name, row_id) not in candidates]
            for row in store.rows_by_id(conn, tier, seen, missing, plan.tags) if missing else ():
                candidates[(tier.name, row["id"])] = {**solos_rank.tier_result(tier, row, caller), "keyword": None}
    found = Gathered(seen, persona, candidates, similar, ranking, around, words_left_out=left_out)
    if vectors is not None:
        found.without_vector = vectors.lacking(list(candidates))
    return plan, found


def rank(memory: Any, plan: RecallPlan, conn: sqlite3.Connection) -> tuple[RecallPlan, Gathered, list[dict]]:
    """Gather, fuse, rerank: in one read snapshot, since the reranker reads the best rows' topic neighbours."""
    plan, found = gather(memory, plan, conn)
    if found.ranking == "recency":
        return plan, found, sorted(found.candidates.values(), key=lambda r: r["ts"] or "", reverse=True)
    fused = solos_rank.fuse(found.candidates, found.similar, found.ranking, solos_rank.content_stems(plan.words))
    if found.ranking == "vector":  # vector alone is for comparing the legs: no reranker, no relevance
        return plan, found, fused.rows
    vectors = memory.vectors if found.ranking == "hybrid" else None
    ranked, found.rerank_failure = solos_rank.rerank(
        memory.store, conn, plan, found.seen, fused, vectors, found.around, memory.rerank
    )
    found.reranked = memory.rerank and found.rerank_failure is None
    judge_head(memory, plan, found, fused, ranked)
    return plan, found, ranked


# The judge reads the reranked head: the rows it was fitted on (bench/judge_data.py asks k=20, the reranker's
# depth), so its IDF over the candidates means what it meant in the fit. About 40-50 µs a row (bench/judge_eval.py).
JUDGE_DEPTH = solos_rank.RERANK_DEPTH


def judge_head(memory: Any, plan: RecallPlan, found: Gathered, fused: solos_rank.Fused, ranked: list[dict]) -> None:
    """`relevance` of the first JUDGE_DEPTH rows becomes the judge's probability that the row answers the question
    (solos_judge; hybrid reads the vector leg's score and the cross-encoder over the first rows, keyword-only the
    features-only fit); rows below are scaled under the lowest. With no judge loaded the reranker's calibrated
    relevance stands; the receipt says why, and why not the cross-encoder when hybrid recall could not use it."""
    head = ranked[:JUDGE_DEPTH]
    if not head or any(r.get("relevance") is None for r in head):  # the reranker failed: no relevance to judge
        return
    key_of = {id(row): key for key, row in zip(fused.keys, fused.rows)}
    rows = [
        {
            "text": r["text"],
            "topic": r.get("topic") or "",
            "agent": r.get("agent") or "",  # the cross-encoder reads the row as the embedder does: agent (topic): text
            "relevance": r["relevance"],
            "cosine": fused.similar.get(key_of.get(id(r)), 0.0),  # type: ignore[arg-type]
        }
        for r in head
    ]
    verdict = memory.judge.judge(plan.query, rows, found.ranking)
    found.judge, found.judge_reason = verdict.name, verdict.reason
    if verdict.name == "relevance":  # no judge: the reranker's relevance stands (a cross-encoder's failure is not)
        return
    # Rows below keep their ratios, under the lowest the judge gave: the reranker's relevance of the vector leg's
    # seats past the judge's depth (solos_rank.with_vector_seats) may pass the head's lowest, so the scale is
    # the larger of the two.
    below = [r for r in ranked[JUDGE_DEPTH:] if r.get("relevance") is not None]
    lowest = min(verdict.probabilities)
    cut = max([r["relevance"] for r in below] + [min(r["relevance"] for r in head)])
    for row, p in zip(head, verdict.probabilities):
        row["relevance"] = p
    for row in below:
        row["relevance"] = lowest * row["relevance"] / cut if cut > 0 else 0.0


def present(memory: Any, plan: RecallPlan, found: Gathered, ranked: list[dict]) -> dict:
    """Collapse duplicates, cut to k after the relevance floor, audit foreign episodes, count; the response."""
    # The caller's own persona (shown when it shares a word with the question) has no relevance: no judge read it.
    # The floor applies where rows were judged: not to recency or vector ranking, nor after the reranker failed.
    floor = plan.floor if found.ranking in ("keyword", "hybrid") and found.rerank_failure is None else 0.0
    results, collapsed = solos_rank.collapse_duplicates(found.persona + ranked, plan.k)
    below = [r for r in results if r.get("relevance") is not None and r["relevance"] < floor]
    if below:  # the top k as it would be with no floor, less the rows under it, refilled from those above it
        passing = [r for r in found.persona + ranked if r.get("relevance") is None or r["relevance"] >= floor]
        results, collapsed = solos_rank.collapse_duplicates(passing, plan.k)
    results, truncated = solos_bounds.cut(results)  # left out, not handed over: neither audited nor counted as read
    for result in results:  # presentation work, only for the rows returned
        result["score"] = round(result["score"], 6)
        result["relevance"] = None if result.get("relevance") is None else round(result["relevance"], 6)
        if "tags" in result:
            result["tags"] = solos_store.parse_tags(result["tags"])
    # A collapsed copy is revealed too (its twin's duplicates, also_written_by): its read is audited as well.
    found.seen.audit(memory.store, [(r["tier"], r["agent"], r["id"]) for r in results + collapsed])
    corroboration = solos_provenance.witnessed(memory, plan.caller, results, collapsed)  # and the delivery log
    memory.stats.record_recall(results, len(collapsed))
    unjudged = found.rerank_failure and plan.floor > 0  # no row has a relevance: every one passed the floor
    void = f"min_relevance {plan.floor:g} not applied (no relevance without the reranker)" if unjudged else None
    reason = "; ".join(why for why in (plan.reason, found.rerank_failure, void) if why) or None
    return {
        "agent": plan.caller,
        "q": plan.query,
        "k": plan.k,
        "scope": plan.scope,
        "tiers": list(plan.tiers),
        "count": len(results),
        "results": results,
        "suppressed_duplicates": len(collapsed),
        "min_relevance": floor,
        "below_floor": len(below),
        "degraded": reason is not None,
        "degraded_reason": reason,
        "ranking": found.ranking,
        "reranked": found.reranked,
        "truncated": truncated,
        "corroboration": corroboration,
        "receipt": {
            "legs": RANKING_LEGS[found.ranking],
            "considered": len(found.persona) + len(found.candidates),
            "below_floor": len(below),
            "without_vector": found.without_vector,
            "judge": found.judge,
            "judge_reason": found.judge_reason,
            "words_left_out": found.words_left_out,
        },
    }


# ==== The operation's row ====

RECALLED_ROW = result_schema(
    {
        "id": {"type": "integer"},
        "tier": {"type": "string", "enum": list(TIERS)},
        "agent": {"type": "string", "description": "Who wrote it."},
        "ts": NULLABLE_STRING,
        "score": {"type": "number", "description": "Higher is better; comparable within one response."},
        "source": {"type": "string"},
        "foreign": {"type": "boolean", "description": "true when another agent wrote it."},
        "text": {"type": "string"},
        "relevance": {
            "type": ["number", "null"],
            "description": "The probability (0-1) that the row is relevant to q, calibrated on a dev set; null "
            "without words to judge by (empty q), with ranking=vector, when the reranker failed (degraded_reason "
            "says so), and for the caller's own persona (durable, never judged).",
        },
    }
)
RECALL_OUTPUT = result_schema(
    {
        "agent": {"type": "string"},
        "count": {"type": "integer"},
        "results": {"type": "array", "items": RECALLED_ROW},
        "suppressed_duplicates": {"type": "integer", "description": "Identical texts collapsed out of the results."},
        "min_relevance": {
            "type": "number",
            "description": "The floor this recall applied: 0 where no row was judged (empty q, ranking=vector, a "
            "failed reranker), whatever was asked.",
        },
        "below_floor": {
            "type": "integer",
            "description": "Rows of the top k left out for a relevance under the floor: with count 0, an honest "
            "'nothing relevant', not a failure.",
        },
        "receipt": {
            "type": "object",
            "description": "What this recall did, without content: legs run, visible rows considered, rows below "
            "the floor, and matches with no vector yet (null without an embedder or without words in q). Counts "
            "only rows the caller may read.",
            "properties": {
                "legs": {"type": "array", "items": {"type": "string", "enum": ["keyword", "vector"]}},
                "considered": {"type": "integer"},
                "below_floor": {"type": "integer"},
                "without_vector": {"type": ["integer", "null"]},
                "judge": {
                    "type": ["string", "null"],
                    "description": "Who set relevance: the judge (cross-encoder@…+features-hybrid@… in hybrid "
                    "recall, features-hybrid@… when the cross-encoder could not run, features-keyword@…), or "
                    "'relevance' (the reranker's calibration); judge_reason says why not the cross-encoder or why "
                    "not the judge; null for recency.",
                },
                "judge_reason": {"type": ["string", "null"]},
                "words_left_out": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Words of q the keyword leg left out: together they matched more rows than one "
                    "recall scores (the most frequent go first, the rarest stays); [] when none was.",
                },
            },
        },
        "degraded": {"type": "boolean", "description": "true: a leg or the reranker was unavailable (see the reason)."},
        "degraded_reason": NULLABLE_STRING,
        "ranking": {"type": "string"},
        "reranked": {"type": "boolean", "description": "true: the learned reranker ordered the best rows."},
        "truncated": {
            "type": ["object", "null"],
            "description": "Set when the next results were left out to keep the answer under max_bytes of JSON.",
        },
    }
)

OPERATION_ROWS = (
    Operation(
        "recall",
        "GET",
        "/v1/recall",
        op_recall_memory,
        object_schema(
            {
                "agent": AGENT_SCHEMA,
                "q": {
                    "type": "string",
                    "maxLength": 10_000,
                    "default": "",
                    "description": "What to look for, in plain words; empty returns the most recent rows.",
                },
                "k": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 100,
                    "default": 5,
                    "description": "How many results, 1-100.",
                },
                "scope": {
                    "type": "string",
                    "enum": list(SCOPES),
                    "default": "shared",
                    "description": "own: the caller's rows; shared: everyone's; shared_except_self: everyone else's.",
                },
                "ranking": {
                    "type": "string",
                    "enum": ["auto", "hybrid", "keyword", "vector"],
                    "default": "auto",
                    "description": "auto or hybrid: both legs when the embedder is loaded, else keyword "
                    "(degraded_reason says why); keyword or vector: one leg only (for comparison).",
                },
                "tiers": {
                    "type": "array",
                    "items": {"type": "string", "enum": list(TIERS)},
                    "maxItems": 4,
                    "uniqueItems": True,
                    "default": list(DEFAULT_TIERS),
                    "description": "Tiers to search (REST: comma-separated). Default long,short.",
                },
                "archive": {
                    "type": "boolean",
                    "default": False,
                    "description": "Also search archived episodic rows (needs episodic in tiers; keyword-ranked).",
                },
                "tags": {
                    **TAGS_SCHEMA,
                    "description": "Only rows carrying any of these tags (REST: comma-separated); rows of tiers "
                    "without tags (episodic, durable) never match. With an empty q: the newest such rows.",
                },
                "min_relevance": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": 1,
                    # 0 by default: the calibration is fitted on chat turns and rejects only 0.16 of foreign
                    # questions at the floor that keeps hit@5 (RESULTS-locomo.md, "Honest recall"), and misses
                    # paraphrases; dropping rows for every caller of the fleet needs better evidence than that.
                    # What goes straight into a prompt (turn_context, the Hermes prefetch) uses the floor.
                    "default": 0.0,
                    "description": "Leave out rows less likely than this to be relevant (see relevance); default 0: "
                    f"every match. The client's turn helpers use {solos_rank.RELEVANCE_FLOOR}. Not applied to an "
                    "empty q or ranking=vector (the answer's min_relevance is then 0).",
                },
            }
        ),
        RECALL_OUTPUT,
        writes=False,
        idempotent=True,
        title="Recall memory",
    ),
)
