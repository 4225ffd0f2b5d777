"""How memory moves between tiers: promotion (episodic -> long) and the episodic archive.

Promotion makes one long fact from episodic rows its caller wrote; the fact
records its sources (memory_promotion, and `source`). It is one-way: nothing
turns a long fact back into events, and nothing here touches durable memory.

Archive: `purge` moves episodic rows older than --archive-after-days (30) from
memory_episodic to memory_episodic_archive, keeping their ids. They leave the
hot table, its keyword index and the vector index, and come back in recall
only when asked (`tiers=episodic&archive=true`), keyword-ranked, under the same
sharing and audit rules. Standard library only; the service imports this module.
"""

from __future__ import annotations

from typing import Any

import solos_bounds
import solos_store
from solos_operations import Operation, object_schema, result_schema
from solos_store import BadRequest, Forbidden, NotFound
from solos_validation import AGENT_SCHEMA

MAX_PROMOTED = 100  # rows per promotion; one fact distilled from more is not one fact
ARCHIVE_BATCH = 500  # rows moved per write transaction, so no write lock is held long

PROMOTE_INPUT_PROPERTIES = {
    "ids": {
        "type": "array",
        "items": {"type": "integer", "minimum": 1, "maximum": solos_bounds.MAX_ID},
        "maxItems": MAX_PROMOTED,
        "uniqueItems": True,
        "description": "The caller's episodic row ids to distil into one long fact (1-100).",
    },
    "fact": {
        "type": "string",
        "pattern": "^[^\\u0000]*$",
        "minLength": 1,
        "maxLength": 8_192,
        "description": "The fact, one statement (default: the events' summaries joined with '; ').",
    },
    "topic": {"type": "string", "pattern": "^[^\\u0000]*$", "maxLength": 256, "description": "What it is about."},
    "confidence": {"type": "number", "minimum": 0, "maximum": 1, "description": "How sure, 0-1."},
}
PROMOTE_OUTPUT_PROPERTIES = {
    "tier": {"type": "string", "enum": ["long"]},
    "agent": {"type": "string"},
    "id": {"type": "integer", "description": "The long fact's id."},
    "status": {
        "type": "string",
        "enum": ["created", "linked"],
        "description": "linked: the caller already held this fact; its episodes now point to it, unchanged.",
    },
    "sources": {"type": "array", "items": {"type": "integer"}, "description": "The episodic ids it came from."},
}


def op_promote_memory(memory: Any, args: dict) -> dict:
    """Promote episodic rows the caller wrote into one long-term fact that records its sources.

    Name the rows by `ids`; give `fact` (else the events' summaries are
    joined). A new fact's `source` lists the episodes; a fact the caller
    already holds is linked to them as it is (`linked`: its topic, source,
    confidence and tags are not rewritten). One-way: the
    episodes stay as they are, nothing becomes episodic again. Another agent's
    shared episode is refused (403); unknown ids, and episodes the caller cannot
    see, are a 404 naming them.
    """
    caller, ids = args["agent"], args["ids"] or []
    if not ids:
        raise BadRequest("ids must name at least one episodic row", "ids")
    store: solos_store.Store = memory.store

    def work(conn: Any) -> dict:
        store.require_agent(conn, caller)
        found = store.queries.episodes_by_id(conn, ids)
        seen = solos_store.Visibility.read(conn, caller, "shared")
        found = {i: row for i, row in found.items() if row["agent"] == caller or not seen.hides("episodic", row)}
        missing = [i for i in ids if i not in found]
        if missing:
            raise NotFound(f"no episodic rows with ids {', '.join(map(str, missing))}", "ids")
        foreign = [i for i in ids if found[i]["agent"] != caller]
        if foreign:
            raise Forbidden(
                f"episodic rows {', '.join(map(str, foreign))} were written by other agents; "
                f"an agent promotes only its own episodes",
                "ids",
            )
        ordered = sorted(ids)
        fact = args["fact"] or "; ".join(found[i]["summary"] for i in ordered)
        source = "promoted:memory_episodic#" + ",".join(map(str, ordered))
        store.hold_key(conn, caller, "long", solos_store.sha256_text(fact))  # a write of this fact in flight: after it
        known = store.known_long(conn, caller, fact)
        outcome: dict[str, Any]
        if known is None:
            outcome = {
                "id": store.insert_long(conn, caller, args["topic"], fact, source, args["confidence"], ["promoted"]),
                "status": "created",
            }
        else:  # the caller already holds this fact: link the episodes to it, leave its topic, source, tags alone
            outcome = {"id": known, "status": "linked"}
        store.queries.link_promotion(conn, outcome["id"], ordered, caller)
        return {"tier": "long", "agent": caller, **outcome, "sources": ordered}

    result = store.write(work)
    memory.written("long", result["id"])
    return result


OPERATION_ROWS = (
    Operation(
        "promote",
        "POST",
        "/v1/promote",
        op_promote_memory,
        object_schema({"agent": AGENT_SCHEMA, **PROMOTE_INPUT_PROPERTIES}, ("agent", "ids")),
        result_schema(PROMOTE_OUTPUT_PROPERTIES),
        writes=True,
        idempotent=True,
        title="Promote episodes to a long-term fact",
    ),
)


def archive_episodic(store: solos_store.Store, older_than_days: float) -> int:
    """Move episodic rows older than the age into the archive, batch by batch; return how many moved.

    Archived rows keep their ids; a new episode never takes one (schema.sql's id marks).
    """
    if older_than_days <= 0:
        return 0
    cutoff = f"-{older_than_days} days"

    def move(conn: Any) -> int:
        return store.queries.archive_batch(conn, cutoff, ARCHIVE_BATCH)

    return store.in_chunks(lambda: store.write(move), lambda moved: moved >= ARCHIVE_BATCH)
