"""solos_forget: forget that really forgets. The operation, and the scrub that takes the text off the disk.

An agent retracts its own row (`forget`): the row, its index entries, its
vector and the copies its neighbours carry as context go in one transaction
(Queries.erase), with a retraction kept without the text and a scrub
queued. The Scrubber then merges the tier's keyword index (FTS5 deletes only
add tombstones) and checkpoints the WAL to zero, where older page images still
held the text; the queue entry goes only after that, so a crash leaves it for
the next start. solos_snapshot re-applies retractions on restore.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

import solos_bounds
import solos_provenance
import solos_rank
import solos_store
from solos_operations import Operation, object_schema, result_schema
from solos_store import Forbidden, NotFound
from solos_validation import AGENT_SCHEMA

log = logging.getLogger("solos_forget")

MAX_MERGE_STEPS = 10_000
CHECKPOINT_WAIT_MS = 250  # a WAL checkpoint waits this long for readers; past it, the hub retries later
RETRY_CHECKPOINT_S = 5.0

# ==== Schema pieces for the operation's row ====

FORGET_FIELDS = {
    "tier": {
        "type": "string",
        "enum": list(solos_store.TIERS),
        "description": "The row's tier. Durable records are the fleet's, read-only: forgetting one is refused (403).",
    },
    "id": {
        "type": "integer",
        "minimum": 1,
        "maximum": solos_bounds.MAX_ID,
        "description": "The row's id, as recall returned it.",
    },
}
FORGET_OUTPUT = {
    "tier": {"type": "string"},
    "agent": {"type": "string"},
    "id": {"type": "integer"},
    "status": {"type": "string", "enum": ["forgotten"]},
    "content_hash": {"type": "string", "description": "sha256 of what the row said; the text itself is gone."},
    "retraction_id": {"type": "integer"},
    "notified": {"type": "integer", "description": "Agents this forget sent a retraction notice (its readers)."},
    "wal_checkpoint": {
        "type": "string",
        "enum": ["complete", "pending"],
        "description": "complete: the text has left the database file and its WAL; pending: a reader held "
        "the WAL, or the database was busy (the row is forgotten all the same); the service finishes it within "
        "seconds.",
    },
    "mirror": {
        "type": "string",
        "enum": ["none", "pending", "no_mirror_configured"],
        "description": "pending: the Qdrant point's delete is queued for the mirror (same transaction; a long "
        "fact's in its outbox, the point import-qdrant made the row of in qdrant_import; each keeps the "
        "point's id and the text's hash, not the text); no_mirror_configured: queued, but this service runs no "
        "mirror of the point's collection, so the point stays in Qdrant until one runs; none: no point of this row "
        "waits.",
    },
}


# ==== The operation ====


def op_forget_memory(memory: Any, args: dict) -> dict:
    """Forget one of the calling agent's own rows (short, long or episodic) by id: only its author may.

    A row already deleted is found by the versions as-of recall keeps, and those go (a short value's are kept
    only until the daily purge after its expiry); forgetting a short row also erases the versions of the earlier
    rows of its key (deleted, then written again), never a later row's.

    The row, its index entries, vector and the copies neighbours carry as context go in one transaction, then
    the index is merged and the WAL checkpointed so the text leaves the database file. A retraction is kept
    without the text (who, which row, when, a content hash); subscribers get a `forget` event. Forgetting a row
    already forgotten answers the same and runs the scrub again.
    """
    agent, tier, row_id = args["agent"], args["tier"], args["id"]
    if tier == "durable":
        raise Forbidden("durable records are the fleet's and read-only; they cannot be forgotten", "tier")
    queries: solos_store.Queries = memory.store.queries  # SQLite's or PostgreSQL's, as the store is

    def work(conn: sqlite3.Connection) -> dict:
        solos_store.Store.require_agent(conn, agent)
        # A deleted row lives on in its versions (as-of recall): forget finds those. A short value's go at the
        # daily purge after its expiry (Queries.purge_expired_short), and a forget of it is then a 404.
        found = queries.find_row(conn, tier, row_id) or queries.gone_row(conn, tier, row_id)
        if found is not None and found[1]["agent"] != agent:
            if solos_store.Visibility.read(conn, agent, "shared").hides(tier, found[1], live=found[0] != ""):
                found = None  # another agent's row the caller cannot see: answered as no row at all
            else:
                message = f"{tier} row {row_id} was written by another agent; only its author can forget it"
                raise Forbidden(message, "id")
        if found is None:
            earlier = queries.own_retraction(conn, agent, tier, row_id)
            if earlier is None:
                raise NotFound(f"there is no {tier} row with id {row_id}", "id")
            queries.queue_scrub(conn, tier, earlier["retraction_id"])  # a retry finishes what a crash left unscrubbed
            return earlier
        memory.events.note_removal(conn, tier, [row_id])
        erased = queries.erase(conn, tier, row_id)
        notified = queries.notify_forgotten(conn, tier, row_id, erased["retraction_id"])
        return {**erased, "notified": notified}

    memory.deliveries.flush()  # every delivery so far is in the log, so every reader gets its notice
    retraction = memory.store.write(work)
    memory.written()
    solos_rank.drop_kept_texts()
    solos_provenance.drop_kept_texts()
    memory.events.forget_encoded()  # encoded events may quote the forgotten row
    scrubbed = memory.scrubber.scrub(tier, row_id)
    if scrubbed["mirror"] == "pending" and not mirrored_here(memory, tier, row_id):
        scrubbed["mirror"] = "no_mirror_configured"
    return {"tier": tier, "agent": agent, "id": row_id, "status": "forgotten", **retraction, **scrubbed}


OPERATION_ROWS = (
    Operation(
        "forget",
        "DELETE",
        "/v1/memory",
        op_forget_memory,
        object_schema({"agent": AGENT_SCHEMA, **FORGET_FIELDS}, ("agent", "tier", "id")),
        result_schema(FORGET_OUTPUT),
        writes=True,
        idempotent=True,  # a repeat answers the same (and runs the scrub again)
        destructive=True,
        title="Forget one of my rows",
    ),
)


def mirrored_here(memory: Any, tier: str, row_id: int) -> bool:
    """Whether this service's mirror will send the delete that waits: it runs, and deletes only in its own
    collection (a point import-qdrant brought from another waits for a mirror of that one)."""
    if memory.mirror is None:
        return False
    collection = memory.mirror.target.collection
    queries = memory.store.queries
    return bool(memory.store.read(lambda conn: queries.mirror_waiting(conn, [row_id], tier, collection)))


def forgotten_elsewhere(memory: Any) -> None:
    """Another copy of the service (PostgreSQL) forgot a row: drop what this copy keeps that may quote it, as
    op_forget_memory does where the forget ran, and reload the vector index now rather than at the next recall."""
    solos_rank.drop_kept_texts()
    solos_provenance.drop_kept_texts()
    if memory.vectors is not None:
        memory.vectors.reload_soon(memory.store)


# ==== The daily purge ====


def purge(store: solos_store.Store) -> int:
    """The daily job's purge: expired short rows and their values' kept versions (Store.purge_expired), then the
    provenance log's old rows, then the scrub a forget runs, so those values leave the index segments and the WAL
    too. A checkpoint a reader holds up leaves the scrub queued: the service finishes it (Scrubber.finish)."""
    rows = store.purge_expired() + solos_provenance.purge(store)
    Scrubber(store).finish()
    return rows


# ==== The scrub ====


class Scrubber:
    """Takes a forgotten row's text off the disk: index merges, then a TRUNCATE checkpoint; retried until done.

    `finish` runs on the event hub's thread every few seconds: at start (scrubs a dead service left queued),
    while a checkpoint waits for a reader, and for a scrub another process queued (the daily purge's).
    """

    def __init__(self, store: solos_store.Store):
        self.store = store
        self.checkpoint_pending = False
        self.due = True  # until the hub's first round, which finishes any scrub a service that died left queued
        self.retry_s = RETRY_CHECKPOINT_S

    def scrub(self, tier: str, row_id: int) -> dict:
        """After a forget: merge the tier's keyword index into one segment, then cut the WAL to zero.

        FTS5 deletes only add tombstones (3.40 has no secure-delete option), so
        the forgotten words stay in old index segments until a merge rewrites
        them; each merge step is its own short write transaction. Then a
        TRUNCATE checkpoint moves the zeroed pages into the database file and
        empties the WAL, where older page images still held the text.
        """
        queued = {
            t: n for t, n in self.store.read(lambda conn: self.store.queries.queued_scrubs(conn)).items() if t == tier
        }
        # What waits holds only the text's hash (keep_only_hash, forget_imported_point): nothing waits for the mirror.
        mirrored = bool(self.store.read(lambda conn: self.store.queries.mirror_waiting(conn, [row_id], tier)))
        try:
            for fts in solos_store.KEYWORD_INDEX[tier]:
                self.merge(fts)
            done = self.checkpoint()
            if done and queued:
                self.store.write(lambda conn: self.store.queries.scrubs_done(conn, queued))
        except solos_store.ServiceError as error:  # busy, or storage trouble: the forget itself has committed
            # Its answer must say so; the scrub stays queued and the hub finishes it (finish) on a later round.
            log.warning("scrub after a forget postponed: %s", error)
            self.checkpoint_pending, done = True, False
        return {"wal_checkpoint": "complete" if done else "pending", "mirror": "pending" if mirrored else "none"}

    def finish(self) -> None:
        """Finish the scrubs still queued (the service died mid-scrub, or a reader held the WAL): merge, checkpoint.

        Their queue entries go only once the checkpoint has emptied the WAL,
        so a crash at any point leaves them queued for the next start. A busy database leaves them queued too:
        the daily purge's rows are gone by then (its run succeeded), and the hub's round goes on to its events.
        """
        try:
            queued = self.store.read(lambda conn: self.store.queries.queued_scrubs(conn))
            if queued or self.checkpoint_pending:
                for tier in queued:
                    for fts in solos_store.KEYWORD_INDEX[tier]:
                        self.merge(fts)
                if self.checkpoint() and queued:
                    self.store.write(lambda conn: self.store.queries.scrubs_done(conn, queued))
        except solos_store.Busy as error:
            log.warning("queued scrubs postponed: %s", error)
        self.due = False

    def merge(self, fts: str) -> None:
        """Merge one keyword index down to a single segment, a short write transaction per step (the lock left
        free between two: Store.in_chunks)."""
        steps = []

        def step() -> int:
            steps.append(self.store.write(lambda conn: self.store.queries.merge_step(conn, fts)))
            return steps[-1]

        self.store.in_chunks(step, lambda changed: changed >= 2 and len(steps) < MAX_MERGE_STEPS)
        if steps[-1] < 2:
            return
        log.warning("keyword index %s still merging after %d steps; retried on the next forget", fts, MAX_MERGE_STEPS)

    def checkpoint(self) -> bool:
        """TRUNCATE checkpoint on a pooled connection, waiting briefly; remembered for a retry if it did not finish."""
        done = self.store.clear_forgotten(CHECKPOINT_WAIT_MS)
        self.checkpoint_pending = not done
        return done
