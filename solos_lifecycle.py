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

import json
from typing import Any

import solos_bounds

MAX_PROMOTED = 100  # rows per promotion; one fact distilled from more is not one fact
ARCHIVE_BATCH = 500  # rows moved per write transaction, so no write lock is held long
ARCHIVE_TIER = "episodic_archive"  # recall's internal name for the archived rows; results say "episodic"

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
    episode is refused (403); unknown ids are a 404 naming them.
    """
    import solos_memory as core

    caller, ids = args["agent"], args["ids"] or []
    if not ids:
        raise core.BadRequest("ids must name at least one episodic row", "ids")
    store = memory.store

    def work(conn: Any) -> dict:
        store.require_agent(conn, caller)
        found = {
            row["id"]: row
            for row in conn.execute(
                "SELECT id, agent, summary FROM memory_episodic WHERE id IN (SELECT value FROM json_each(?)) "
                "UNION ALL SELECT id, agent, summary FROM memory_episodic_archive "
                "WHERE id IN (SELECT value FROM json_each(?))",
                (json.dumps(ids), json.dumps(ids)),
            )
        }
        missing = [i for i in ids if i not in found]
        if missing:
            raise core.NotFound(f"no episodic rows with ids {', '.join(map(str, missing))}", "ids")
        foreign = [i for i in ids if found[i]["agent"] != caller]
        if foreign:
            raise core.Forbidden(
                f"episodic rows {', '.join(map(str, foreign))} were written by other agents; "
                f"an agent promotes only its own episodes",
                "ids",
            )
        ordered = sorted(ids)
        fact = args["fact"] or "; ".join(found[i]["summary"] for i in ordered)
        source = "promoted:memory_episodic#" + ",".join(map(str, ordered))
        known = store.known_long(conn, caller, fact)
        if known is None:
            outcome = {
                "id": store.insert_long(conn, caller, args["topic"], fact, source, args["confidence"], ["promoted"]),
                "status": "created",
            }
        else:  # the caller already holds this fact: link the episodes to it, leave its topic, source, tags alone
            outcome = {"id": known, "status": "linked"}
        conn.executemany(
            "INSERT OR IGNORE INTO memory_promotion (long_id, episodic_id, agent) VALUES (?, ?, ?)",
            [(outcome["id"], i, caller) for i in ordered],
        )
        return {"tier": "long", "agent": caller, **outcome, "sources": ordered}

    result = store.write(work)
    memory.written("long", result["id"])
    return result


def archive_episodic(store: Any, older_than_days: float) -> int:
    """Move episodic rows older than the age into the archive, batch by batch; return how many moved.

    Archived rows keep their ids; a new episode never takes one (schema.sql's id marks).
    """
    if older_than_days <= 0:
        return 0
    cutoff = f"-{older_than_days} days"
    columns = "id, agent, event_type, summary, details, outcome, duration_s, timestamp"

    def move(conn: Any) -> int:
        ids = [
            row[0]
            for row in conn.execute(
                "SELECT id FROM memory_episodic WHERE timestamp < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?) "
                "ORDER BY id LIMIT ?",
                (cutoff, ARCHIVE_BATCH),
            )
        ]
        chosen = json.dumps(ids)
        conn.execute(
            f"INSERT INTO memory_episodic_archive ({columns}) SELECT {columns} FROM memory_episodic "
            "WHERE id IN (SELECT value FROM json_each(?))",
            (chosen,),
        )
        conn.execute("DELETE FROM memory_episodic WHERE id IN (SELECT value FROM json_each(?))", (chosen,))
        return len(ids)

    total = 0
    while True:
        moved = store.write(move)
        total += moved
        if moved < ARCHIVE_BATCH:
            return total


def lifecycle_counts(conn: Any) -> dict:
    """Archived episodic rows and promotions, for /v1/stats."""
    return {
        "episodic_archived": conn.execute("SELECT count(*) FROM memory_episodic_archive").fetchone()[0],
        "promoted_facts": conn.execute("SELECT count(DISTINCT long_id) FROM memory_promotion").fetchone()[0],
    }
