"""solos_embed_worker: rows get their vectors. Embedded at write, and in the background whatever a write missed.

The embedder itself (solos_embed) is optional and imported lazily; this module is stdlib (numpy only once a vector
is indexed) and imports only the store and the vector index's module, so the service starts on a bare python3.
`embed_missing` is also the `backfill` command's loop.
"""

from __future__ import annotations

import concurrent.futures
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import solos_rank
import solos_store
from solos_store import EMBEDDED_TIERS, TIER_TABLE, Store, log_event

EMBED_BATCH = 32
SWEEP_INTERVAL_S = 30  # the worker also looks for rows other writers added without vectors
WRITE_EMBED_TIMEOUT_S = 1.0  # a write waits this long for its row's vector (about 5 ms); then the worker has it
HELD_ROW_POLL_S = 0.01  # how often a write whose row another pass holds looks again


def embed_missing(
    store: Store,
    embedder: Any,
    batch: int = EMBED_BATCH,
    progress: Callable[[int], None] | None = None,
    passed_over: dict[tuple[str, int], str] | None = None,
    only: set[tuple[str, int]] | None = None,
) -> int:
    """Embed every row that lacks a vector from this model, batch by batch (each its own short write transaction:
    idempotent and resumable, it only ever picks rows without a vector); return how many. Every row: this
    process's share of them with workers (Store.embed_share); `only`: these (tier, id), whosever share.

    A pass goes through them in id order, once: a row whose vector was not saved (it changed under us, or its text
    cannot be read back as written) is left to the next pass, and never holds up the rows after it. Nor does a row
    the embedder raises on: its batch is embedded row by row, and a row that fails alone is passed over, its
    reason logged and kept in `passed_over` (whose rows are not tried again while they are in it). The pass
    raises when every row of a batch fails alone (the embedder fails, not a row; on PostgreSQL the batch's claims
    are released first, so another copy embeds those rows now), and when it embedded nothing and passed rows over:
    their rows still have no vector because embedding fails. A row passed over keeps its claim until it lapses
    (solos_copies.CLAIM_S): the copies' shared backoff, so no copy retries it at each pass."""
    done, skip, met = 0, passed_over if passed_over is not None else {}, None
    for tier in (tier.name for tier in EMBEDDED_TIERS):
        after, ids = 0, None if only is None else sorted(row_id for named, row_id in only if named == tier)
        if ids == []:
            continue
        while rows := store.rows_missing_vectors(tier, embedder.model_id, batch, ids, after):
            after = rows[-1]["id"]
            met = next((skip[(tier, row["id"])] for row in rows if (tier, row["id"]) in skip), met)
            rows = [row for row in rows if (tier, row["id"]) not in skip]
            try:
                embedded = list(zip(rows, embedder.embed([TIER_TABLE[tier].embedding_text(row) for row in rows])))
            except Exception as error:
                try:
                    embedded = embed_each(tier, rows, embedder, skip, error)
                except Exception:  # the embedder fails, not a row: another copy may take the rows now
                    store.embedding_failed(tier, [row["id"] for row in rows])
                    raise
                met = next((skip[(tier, row["id"])] for row in rows if (tier, row["id"]) in skip), met)
            if not embedded:
                continue
            saved, _ = store.save_vectors(tier, embedder.model_id, embedded)
            done += len(saved)
            if progress:
                progress(done)
    if met is not None and not done:
        raise EmbedFailed(f"{len(skip)} rows passed over; {met}")
    return done


class EmbedFailed(Exception):
    """A pass embedded nothing, and passed over rows the embedder failed on (the last one's reason)."""


def embed_each(tier: str, rows: list, embedder: Any, skip: dict[tuple[str, int], str], error: Exception) -> list[tuple]:
    """After a batch raised: its rows one at a time; (row, vector) for those the embedder takes, the rest passed
    over. The batch's error again when it had several rows and each failed alone."""
    failures: list[tuple[Any, Exception]] = [(rows[0], error)] if len(rows) == 1 else []
    embedded: list[tuple] = []
    for row in rows if len(rows) > 1 else []:
        try:
            embedded.append((row, embedder.embed([TIER_TABLE[tier].embedding_text(row)])[0]))
        except Exception as alone:
            failures.append((row, alone))
    if len(rows) > 1 and not embedded:
        raise error
    for row, reason in failures:
        skip[(tier, row["id"])] = f"{type(reason).__name__}: {reason}"
        log_event("embed_row_failed", tier=tier, row_id=row["id"], reason=skip[(tier, row["id"])])
    return embedded


class EmbedWorker(threading.Thread):
    """Embeds rows at write (read-your-writes) and, in the background, whatever that missed.

    A write's text is embedded before its transaction, which saves row and vector (bench/write_recall_ab.py), on
    a pool of one thread with a timeout: a write never fails because of the embedder; one it could not embed in
    time waits for the background pass, which also embeds the rows the fleet writes straight into the database."""

    def __init__(self, store: Store, embedder: Any):
        super().__init__(name="embed-worker", daemon=True)
        self.store, self.embedder = store, embedder
        self.wake = threading.Event()
        self.halted = threading.Event()  # set by stop(): cuts a pause short
        self.wake.set()  # rows from before this start are embedded at once, not after the first sweep interval
        self.stopped = False
        self.last_error: str | None = None
        # Rows without a vector, each once: those the last count found (at start and each sweep: the fleet's
        # direct writes) less those embedded since, and the service's own rows its write could not embed.
        self.lock = threading.Lock()
        self.counted = store.count_missing_vectors(embedder.model_id)
        self.queued: set[tuple[str, int]] = set()
        self.folded: set[tuple[str, int]] = set()  # queued rows already in `counted`: queued again, not twice
        self.passed_over: dict[tuple[str, int], str] = {}  # rows the embedder failed on alone: tried at each sweep
        self.pool = concurrent.futures.ThreadPoolExecutor(1, "embed-write")
        self.stuck: concurrent.futures.Future | None = None

    @property
    def backlog(self) -> int:
        return self.counted + len(self.queued)

    def queue(self, key: tuple[str, int]) -> None:
        """A row the write could not embed: count it (once), and embed it soon."""
        with self.lock:
            if key not in self.folded:
                self.queued.add(key)
            self.wake.set()

    def in_time(self, failed: Any, work: Callable, *args: Any) -> Any:
        """work(*args) on the write pool within WRITE_EMBED_TIMEOUT_S, else `failed` (at once while one still runs)."""
        if self.stuck is not None and not self.stuck.done():
            return failed
        future = self.pool.submit(work, *args)
        try:
            return future.result(timeout=WRITE_EMBED_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            self.stuck = future
        except Exception as error:  # a broken embedder or a busy database: the background pass retries
            log_event("embed_failed", reason=f"{type(error).__name__}: {error}")
        return failed

    def embed_first(self, tier: str, row: Mapping) -> solos_store.Embedded | None:
        """The vector of a row about to be written (named as the write's arguments), for its transaction to save."""
        blobs = self.in_time(None, self.embedder.embed, [TIER_TABLE[tier].embedding_text(row)])
        return (self.embedder.model_id, blobs[0]) if blobs else None

    def embed_written(self, tier: str, row_id: int, index: solos_rank.VectorIndex | None) -> None:
        """Embed a row just written (a promotion's fact) and index it, or leave it to the background pass."""
        for lacking in self.in_time([row_id], self.embed_rows, tier, [row_id], index, WRITE_EMBED_TIMEOUT_S * 0.9):
            self.queue((tier, lacking))

    def embed_rows(
        self, tier: str, ids: list[int], index: solos_rank.VectorIndex | None, wait_s: float = 0.0
    ) -> list[int]:
        """Embed these rows if they lack a vector, save and index the vectors; the ids still without one. A row another
        pass holds (PostgreSQL: another copy's, or the background pass) is waited for up to wait_s, and claimed."""
        import numpy as np

        deadline, wanted = time.monotonic() + wait_s, list(ids)
        while True:
            rows = self.store.rows_missing_vectors(tier, self.embedder.model_id, len(wanted), wanted)
            if rows:
                blobs = self.embedder.embed([TIER_TABLE[tier].embedding_text(row) for row in rows])
                saved, generation = self.store.save_vectors(tier, self.embedder.model_id, list(zip(rows, blobs)))
                for row, blob in zip(rows, blobs):
                    if index is not None and row["id"] in saved:
                        expires, thread = (dict(row).get(name) for name in ("expires_at", "topic"))
                        vector = np.frombuffer(blob, dtype="<f4")
                        index.add(self.store, tier, row["id"], row["agent"], expires, vector, generation, thread)
            taken = {row["id"] for row in rows}
            wanted = [row_id for row_id in wanted if row_id not in taken]
            if wanted:  # unchanged text keeps its vector; a row held elsewhere has none yet
                wanted = self.store.lacking_vectors(tier, self.embedder.model_id, wanted)
            if not wanted or time.monotonic() >= deadline:
                return wanted
            time.sleep(HELD_ROW_POLL_S)

    def run(self) -> None:
        while not self.stopped:
            woken = self.wake.wait(SWEEP_INTERVAL_S)
            if woken and not self.stopped:
                time.sleep(0.05)  # let a burst of writes arrive, to embed them as one batch
            if self.stopped:  # stop() wakes it: a stopped service writes nothing more
                return
            self.wake.clear()
            try:
                self.catch_up(recount=not woken)
                # Rows the embedder failed on stay without a vector: the state says so, not `ready`.
                failed_on = list(self.passed_over.values())
                self.last_error = f"{len(failed_on)} rows passed over; {failed_on[-1]}" if failed_on else None
            except Exception as error:  # a broken embedder or a busy database: rows wait for the next sweep
                self.last_error = f"{type(error).__name__}: {error}"
                log_event("embed_failed", reason=self.last_error)
                self.halted.wait(1)

    def catch_up(self, recount: bool) -> None:
        """Embed every row without a vector, counting the backlog down; a timed sweep counts it afresh."""
        if recount:
            missing = self.store.count_missing_vectors(self.embedder.model_id)
            with self.lock:  # the count includes the queued rows
                self.counted, self.queued, self.folded = missing, set(), set()
            self.passed_over = {}  # a timed sweep tries them again
            own: set[tuple[str, int]] = set()
        else:
            with self.lock:
                own = self.queued
                self.counted, self.folded = self.counted + len(self.queued), self.folded | self.queued
                self.queued = set()
        try:
            if own and self.store.embed_share is not None:
                # Workers: the pass below embeds this worker's share of the ids, but the rows its own writes could
                # not embed are its own, whatever their ids: the worker whose share one is finds it at its timed
                # sweep, up to SWEEP_INTERVAL_S later, and this one had counted it off its backlog meanwhile.
                embed_missing(self.store, self.embedder, EMBED_BATCH, self.counting(), self.passed_over, own)
        finally:  # rows the embedder fails on alone among its own do not hold up its share
            embed_missing(self.store, self.embedder, progress=self.counting(), passed_over=self.passed_over)
        with self.lock:
            if not self.queued:  # nothing was queued meanwhile: nothing is left but the rows passed over
                self.counted, self.folded = len(self.passed_over), set()

    def counting(self) -> Callable[[int], None]:
        """A pass's progress (rows embedded so far in it), counted off the backlog."""
        counted = [0]

        def progress(done: int) -> None:
            with self.lock:
                self.counted, counted[0] = max(0, self.counted - (done - counted[0])), done

        return progress

    def stop(self) -> None:
        """Stop and wait for a sweep in progress, so nothing writes after the service has closed."""
        self.stopped = True
        self.halted.set()
        self.wake.set()
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout=10)


def backfill(store: Store, loaded: tuple[Any, str | None], batch: int) -> int:
    """The `backfill` command: embed rows without a vector, with a progress line and a final count; exit 1
    without an embedder (`loaded`: the embedder, or None and why)."""
    embedder, reason = loaded
    if embedder is None:
        log_event("failed", command="backfill", reason=reason)
        return 1
    todo = store.count_missing_vectors(embedder.model_id)
    started = time.monotonic()

    def progress(done: int) -> None:
        rate = done / max(time.monotonic() - started, 1e-9)
        sys.stderr.write(f"\rbackfill: {done}/{todo} rows embedded ({rate:.0f}/s)")
        sys.stderr.flush()

    try:
        done = embed_missing(store, embedder, batch, progress)
    except EmbedFailed as error:  # rows the embedder fails on, and nothing else left to embed
        sys.stderr.write("\n")
        log_event("failed", command="backfill", reason=f"embedding failed: {error}")
        return 1
    sys.stderr.write("\n")
    log_event(
        "backfilled",
        rows=done,
        missing_before=todo,
        model=embedder.model_id,
        seconds=round(time.monotonic() - started, 1),
        vectors=store.count_vectors(embedder.model_id),
    )
    return 0
