"""solos-memory's ranking, in one place: how recall turns a question into an ordered, labelled list.

In the order a recall meets them: query words and the FTS5 query; the keyword
leg (BM25 per tier, a named writer's boost, topic neighbours); the vector leg
(an in-memory index of the embedder's vectors, masked by scope and sharing);
fusion of the two legs; the learned reranker over the fused top rows (their
topic neighbours, the writer and days a question names); duplicate collapse;
labelling each row with its writer, tier, source and whether it is foreign.
Every weight is a named constant with the bench result that chose it
(bench/RESULTS-locomo.md).

Standard library only, but for numpy in the vector leg (imported when an
embedder is loaded). Imports only the store's tier and visibility types (and a marker): solos_recall hands it the
recall's `RecallPlan` (defined here, so ranking takes it typed without importing recall back), rows, tiers
(rows of the store's TIER_TABLE) and a store it can ask for more rows.
The bench's research scripts import these same functions and constants.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

from solos_store import VECTOR_SAVED_AT, Tier, Visibility

log = logging.getLogger("solos_memory")

Result = TypeVar("Result")


class RankStore(Protocol):
    """What ranking reads from a store: solos_store.Store is one; a second backend implements the same.

    `conn` is the store's own connection for the recall's one read snapshot (sqlite3 for solos_store).
    """

    def read(self, work: Callable[[Any], Result]) -> Result: ...

    def ranked_rows(
        self, conn: Any, tier: Tier, seen: Visibility, match: str, limit: int, tags: Sequence[str] = ()
    ) -> list: ...

    def rows_by_id(self, conn: Any, tier: Tier, seen: Visibility, ids: list[int], tags: Sequence[str] = ()) -> list: ...

    def topic_neighbours(self, conn: Any, ids: list[int]) -> dict[int, tuple[int | None, int | None]]: ...

    def indexed_rows(self, conn: Any, tier: Tier) -> int | None: ...

    def matches_up_to(self, conn: Any, tier: Tier, match: str, most: int) -> int: ...

    def vector_generation(self, conn: Any) -> int: ...

    def load_vectors(self, conn: Any, tier: str, model: str) -> Any: ...

    def vectors_by_id(self, conn: Any, tier: str, model: str, ids: list[int]) -> Any: ...

    queries: Any  # solos_store.Queries: the event log's head and events, for VectorIndex.catch_up


# ==== What one recall asks ====


@dataclass(frozen=True)
class RecallPlan:
    """What one recall will do, decided before it reads anything (solos_recall.plan_recall makes it; the legs
    and the reranker read it)."""

    caller: str
    k: int
    scope: str
    tiers: tuple[str, ...]  # as asked, durable included
    searched: tuple[Tier, ...]
    query: str
    words: list[str]
    match: str | None  # the FTS5 query; None: no words to match
    vector: Any  # the question's embedding, or None (until with_vector: what `embedding` brings)
    ranking: str  # recency, keyword, vector or hybrid (until with_vector: if the vector comes)
    reason: str | None  # why ranking is degraded, or None
    depth: int  # candidates per tier and leg
    tags: tuple[str, ...]  # only rows carrying one of these; () for any
    floor: float  # min_relevance
    embedding: Callable[[], tuple[Any, str | None]] | None = None  # the question's vector, on its way

    def with_vector(self) -> RecallPlan:
        """The plan once the question's embedding is in: its vector, or keyword ranking and why not."""
        if self.embedding is None:
            return self
        vector, failure = self.embedding()
        ranking = self.ranking if vector is not None else "keyword"
        return dataclasses.replace(self, vector=vector, ranking=ranking, reason=failure or self.reason, embedding=None)


# ==== Query words ====

MAX_QUERY_TERMS = 64  # longer questions add noise, not recall; 10 KB of junk stays cheap
# Function and question words: FTS5 ORs every query word, and these add score
# to every short row. Dropping them: LoCoMo hit@5 +0.04 (RESULTS-locomo.md, "Headline").
# The second line (question scaffolding, modals, a possessive's "s") is neutral on its own ("Recall v2": stop
# words v2) and is what the reranker's weights were fitted with: its coverage features count the other words.
STOP_WORDS = frozenset(
    """
a an and are as at be been by did do does for from had has have he her his how i in is it its me my of on or
she so that the their them they this to was we were what when where which who whom why will with would you your
s t about also any anything both can could ever if into just kind likely many might much not no other ought should
some something sort still than then there these those type yet based considered mentioned according answer yes
""".split()
)


def query_words(text: str) -> list[str]:
    """The distinct lower-cased words of free text, at most MAX_QUERY_TERMS."""
    return list(dict.fromkeys(word.lower() for word in re.findall(r"\w+", text)))[:MAX_QUERY_TERMS]


def make_fts_query(words: list[str], stop: frozenset[str] = STOP_WORDS) -> str | None:
    """Quote each word for FTS5 MATCH, OR-ed, stop words dropped unless nothing else is left.

    Quoting makes every user string a literal: FTS5 operators, column filters
    and stray quotes in `q` never reach the query parser. (`stop`: the bench
    compares lists.)
    """
    kept = [word for word in words if word not in stop] or words
    if not kept:
        return None
    return " OR ".join(quoted(word) for word in kept)


def quoted(word: str) -> str:
    """One word as an FTS5 string literal."""
    return '"' + word.replace('"', '""') + '"'


# A word in half of a tier's rows or more has no BM25 weight there: FTS5 clamps its IDF (not positive) to 1e-6. Yet
# an OR query naming it scores and sorts every row it matches (chat turns all name their two speakers: 10k rows,
# keyword recall p50 9.7 -> 3.2 ms without them; RESULTS-locomo.md, "Words every row has"). Whether a word is that
# common is checked off the recall path, once per COMMON_WORD_RECHECK_S per tier, reading at most half the index;
# below COMMON_WORDS_MIN_ROWS scoring every row costs less than the check.
COMMON_WORD_RECHECK_S = 300.0
COMMON_WORDS_MIN_ROWS = 1000
COMMON_WORDS_KEPT = 10_000  # words remembered at most; then forgotten all at once
# Matches one tier's OR query may score: each word's rows are read and scored, so 64 words each in a tenth of 100k
# episodes cost 336 ms (45x an ordinary recall's 7.5 ms) though none is common. Past this sum, the most frequent
# words are left out (the rarest always stays), and the receipt names them (bench/heavy_calls.py).
KEYWORD_READ_BUDGET = 100_000


class CommonWords:
    """Which query words match half of a tier's rows or more, and how many rows the others match, learned in the
    background.

    A word not checked yet counts as rare: the query keeps it, as it always
    did, while one thread of its own checks it (and the tier's size); later
    recalls leave it out, or leave out the most frequent words past
    KEYWORD_READ_BUDGET (`costly`). So no recall waits for a check, nor reads anything.
    """

    SIZE = ""  # stands for the tier's size in `pending` (no query word is empty)

    def __init__(self, store: RankStore) -> None:
        self.store = store
        self.sizes: dict[str, tuple[float, int]] = {}  # fts table -> (checked at, rows in its index)
        self.known: dict[tuple[str, str], tuple[float, bool]] = {}  # (fts table, word) -> (checked at, common)
        self.matched: dict[tuple[str, str], int] = {}  # (fts table, word) -> rows it matched, counted up to half
        self.pending: set[tuple[str, str]] = set()
        self.lock = threading.Lock()
        self.checker = ThreadPoolExecutor(1, "common-words")

    def of(self, tier: Tier, words: Sequence[str]) -> set[str]:
        """The words known to be common in this tier; the size, and unknown or stale words, are queued for a check."""
        now = time.monotonic()
        size = self.sizes.get(tier.fts)
        stale = size is None or now - size[0] > COMMON_WORD_RECHECK_S
        if size is None or size[1] < COMMON_WORDS_MIN_ROWS:
            if stale:  # the words are checked only if the tier turns out large enough
                self.check_later(tier, list(words))
            return set()
        common, unknown = set(), []
        for word in words:
            checked = self.known.get((tier.fts, word))
            if checked is None or now - checked[0] > COMMON_WORD_RECHECK_S:
                unknown.append(word)
            if checked is not None and checked[1]:
                common.add(word)
        if unknown or stale:
            self.check_later(tier, unknown)
        return common

    def costly(self, tier: Tier, words: Sequence[str], common: set[str]) -> list[str]:
        """The words (not common) left out so the rest match KEYWORD_READ_BUDGET rows at most, summed word by word:
        the most frequent first, never the rarest; a word not counted yet counts none."""
        counted = sorted((self.matched.get((tier.fts, word), 0), word) for word in words if word not in common)
        spent, kept = 0, set[str]()
        for count, word in counted:
            spent += count
            if spent > KEYWORD_READ_BUDGET and kept:
                break
            kept.add(word)
        return [word for word in words if word not in common and word not in kept]

    def check_later(self, tier: Tier, words: list[str]) -> None:
        """Queue a check of the tier's size and of those words not queued already."""
        with self.lock:
            new = [word for word in words if (tier.fts, word) not in self.pending]
            if not new and (tier.fts, self.SIZE) in self.pending:
                return
            if len(self.known) > COMMON_WORDS_KEPT:
                self.known.clear()
                self.matched.clear()
            self.pending.update((tier.fts, word) for word in [self.SIZE, *new])
        try:
            self.checker.submit(self.check, tier, new)
        except RuntimeError:  # shut down: the service is stopping
            pass

    def check(self, tier: Tier, words: list[str]) -> None:
        """The tier's size, then (if it is large enough) which of the words match half its rows or more."""

        def counts(conn: Any) -> tuple[int, dict[str, int]]:
            rows = self.store.indexed_rows(conn, tier) or 0
            if rows < COMMON_WORDS_MIN_ROWS:
                return rows, {}
            half = (rows + 1) // 2
            return rows, {word: self.store.matches_up_to(conn, tier, quoted(word), half) for word in words}

        try:
            rows, found = self.store.read(counts)
            now = time.monotonic()
            self.sizes[tier.fts] = (now, rows)
            for word, matched in found.items():
                self.known[(tier.fts, word)] = (now, matched >= (rows + 1) // 2)
                self.matched[(tier.fts, word)] = matched
        except Exception:  # a busy or failing database: the words stay unknown, and are asked again later
            log.warning("checking common words failed; they stay in queries", exc_info=True)
        finally:
            with self.lock:
                self.pending.difference_update((tier.fts, word) for word in [self.SIZE, *words])

    def close(self) -> None:
        self.checker.shutdown(wait=True, cancel_futures=True)


def tier_match(match: str, content: list[str], common: set[str] | list[str]) -> str:
    """The FTS5 query without the words every row has (or too costly to read), unless they are all it asks for
    (`content`: the query's words but stop words)."""
    if not common or not set(content) - set(common):
        return match
    return make_fts_query([word for word in content if word not in common]) or match


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


Around = dict[Key, tuple[Key | None, Key | None]]  # a long fact's previous and next fact of its topic


def keyword_candidates(
    store: RankStore,
    conn: Any,
    plan: RecallPlan,
    seen: Visibility,
    around: Around,
    common: CommonWords,
    left_out: list[str] | None = None,
) -> dict[Key, dict]:
    """BM25 per tier after the scope, sharing and expiry filters, x NAME_BOOST for a named writer, then neighbours.

    The plan gives the tiers searched, the FTS5 query and its words, the depth and the tags. Words in more than
    half of a tier's rows are left out of its query (`common`), and so are the most frequent words past
    KEYWORD_READ_BUDGET matches (added to `left_out`, once each). The topic neighbours read on the way are kept in
    `around` (the reranker reads them too).
    """
    candidates: dict[Key, dict] = {}
    if plan.match is None:  # no words: recency orders this recall, not the keyword leg
        return candidates
    content = [word for word in plan.words if word not in STOP_WORDS]
    for tier in plan.searched:
        known_common = common.of(tier, content)
        costly = common.costly(tier, content, known_common)
        if left_out is not None:
            left_out.extend(word for word in costly if word not in left_out)
        searched = tier_match(plan.match, content, known_common.union(costly))
        for row in store.ranked_rows(conn, tier, seen, searched, plan.depth, plan.tags):
            result = tier_result(tier, row, seen.caller)
            result["keyword"] = result["score"] * (NAME_BOOST if row["agent"].lower() in plan.words else 1.0)
            candidates[(tier.name, row["id"])] = result
    threaded = [tier for tier in plan.searched if tier.threaded]
    for tier in threaded:
        smooth_with_neighbours(store, conn, tier, seen, candidates, around, plan.tags)
    return candidates


def read_neighbours(store: RankStore, conn: Any, tier: Tier, ids: list[int], around: Around) -> None:
    """Each of these rows' previous and next row of its topic, into `around` ((None, None) without a topic)."""
    found = store.topic_neighbours(conn, ids)
    for row_id in ids:
        previous, following = found.get(row_id, (None, None))
        around[(tier.name, row_id)] = (
            None if previous is None else (tier.name, previous),
            None if following is None else (tier.name, following),
        )


def smooth_with_neighbours(
    store: RankStore,
    conn: Any,
    tier: Tier,
    seen: Visibility,
    keyword: dict[Key, dict],
    around: Around,
    tags: Sequence[str] = (),
) -> None:
    """Add to each fact a share of its best-matching topic neighbour's keyword score.

    An answer often sits in the turn after the one that matches the question
    ("What did you do?" / "I went to ..."); the index's context column covers
    the turns before. A neighbour of a match may enter the candidates this way.
    """
    matched = {row_id: result["keyword"] for (name, row_id), result in keyword.items() if name == tier.name}
    if not matched:
        return
    read_neighbours(store, conn, tier, list(matched), around)
    borrowed: dict[int, float] = {}
    for row_id, score in matched.items():
        for neighbour in around[(tier.name, row_id)]:
            if neighbour is not None:
                borrowed[neighbour[1]] = max(borrowed.get(neighbour[1], 0.0), score)
    entering = [row_id for row_id in borrowed if row_id not in matched]
    for row in store.rows_by_id(conn, tier, seen, entering, tags) if entering else ():
        keyword[(tier.name, row["id"])] = {**tier_result(tier, row, seen.caller), "keyword": 0.0}
    for row_id, share in borrowed.items():
        if (tier.name, row_id) in keyword:
            keyword[(tier.name, row_id)]["keyword"] += NEIGHBOUR_KEYWORD_WEIGHT * share


# ==== The vector leg ====

# A long fact borrows half the best cosine of its topic neighbours (RESULTS-locomo.md, "Recall v2": vector
# smoothing 0.3 / 0.5 / 0.7 gave vector hit@5 .519 / .520 / .509).
NEIGHBOUR_WEIGHT = 0.5
# Rows embedded since the last snapshot kept beside it (1.5 KiB each); past this a reload folds them in.
RECENT_VECTORS_KEPT = 4096
CATCH_UP_EVENTS = 1000  # events a copy's vector index reads to catch up (VectorIndex.catch_up); past it, a reload


class VectorIndex:
    """The loaded model's vectors per tier, in memory, reloaded when the database's vector generation moves.

    Vectors from any other model are never loaded, so never compared. A
    reload (about 3 ms per 1,000 rows) runs in the background while recall
    keeps using the last snapshot plus the rows the service embedded since
    (`add`, before its write is acknowledged: read-your-writes); rows the fleet
    writes directly join at the reload after the worker embeds them. A deleted
    row never comes back, because candidates are re-read through the SQL filters.
    Rows other copies of the service embedded (PostgreSQL) join the same way,
    and those a recall's keyword leg found are read at once (`fill`), so they
    rank by both legs before the reload lands. A row embedded since the
    snapshot scores what it will once the reload lands, its topic neighbours'
    share included, and so do its neighbours (`settled`).
    """

    def __init__(self, model_id: str, tiers: Sequence[str]):
        self.model_id = model_id
        self.tier_names = tuple(tiers)
        self.lock = threading.Lock()
        self.generation: int | None = None
        self.latest: int | None = None  # the database's generation as the last refresh read it
        self.reloading = False
        # Per tier: ids, agents, expiries, vectors, each row's previous and next of its topic, its topic, and
        # where each topic's rows sit (start, end): rows are loaded ordered by topic, then id.
        self.tiers: dict[str, tuple] = {}
        self.sorted_ids: dict[str, tuple] = {}  # per tier: (its ids array, those ids sorted, their positions)
        # Rows embedded since the snapshot: tier -> id -> (agent, expires_at or "", vector, generation saved at,
        # topic or None). Each overrides the snapshot's row and is dropped once a snapshot of that generation or
        # later is in.
        self.recent: dict[str, dict[int, tuple[str, str, Any, int, Any]]] = {tier: {} for tier in self.tier_names}
        # Copies (workers) sharing the store: the event log's id up to which the snapshot and `recent` hold what
        # every copy wrote with its vector (catch_up); None until a snapshot is loaded, and for one service alone.
        self.events_seen: int | None = None

    def add(
        self,
        store: RankStore,
        tier: str,
        row_id: int,
        agent: str,
        expires_at: str | None,
        vector: Any,
        generation: int,
        thread: Any = None,
    ) -> None:
        """A row the service just embedded and saved (at `generation`), of topic `thread` in a threaded tier: the
        next search sees it. Unless it is older than what the index holds of that row: two writes of one row report
        in whatever order their threads run, and a snapshot at `generation` or later holds this write or a newer."""
        with self.lock:
            held = self.recent[tier].get(row_id)
            if (held is None or held[3] <= generation) and (self.generation is None or generation > self.generation):
                self.recent[tier][row_id] = (agent, expires_at or "", vector, generation, thread)
            crowded = sum(map(len, self.recent.values())) > RECENT_VECTORS_KEPT
        if crowded:  # writes with no recall between: fold them into a snapshot rather than grow this
            self.reload_soon(store)

    def written(self, store: RankStore, tier: Tier, row: Any, outcome: dict, vector: tuple[str, bytes] | None) -> bool:
        """After a write that embedded its row first (`row`: its fields as the write's arguments name them): the
        vector joins the next search if the write's transaction saved it (Store.keep_vector); False without one."""
        import numpy as np

        generation = outcome.pop(VECTOR_SAVED_AT, None)
        if generation is not None and vector is not None:  # else its unchanged text kept the vector it had
            topic, array = row.get("topic") if tier.threaded else None, np.frombuffer(vector[1], dtype="<f4")
            self.add(store, tier.name, outcome["id"], row["agent"], outcome.get("expires_at"), array, generation, topic)
        return vector is not None

    def refresh(self, store: RankStore, conn: Any, tiers: Sequence[str]) -> None:
        """Make the snapshot current: at once while it holds nothing for these tiers, else in the background."""
        generation = self.latest = store.vector_generation(conn)
        if generation == self.generation:
            return
        if not self.count(tiers):
            self.load(store, conn, generation)
            return
        if getattr(store, "shared_by_copies", False):
            self.catch_up(store, conn)
        self.reload_soon(store)

    def catch_up(self, store: RankStore, conn: Any) -> None:
        """Copies (workers) of the service: the vectors other copies committed with their rows since this index
        last looked join it before this recall searches, so a row another worker acknowledged ranks by both
        legs in the very next recall anywhere (read-your-writes), whichever leg finds it. Which rows: the event
        log's writes and updates after `events_seen` (a copy's write logs its event in the vector's own
        transaction); their vectors by id, in the recall's read. More than CATCH_UP_EVENTS behind, the snapshot
        is loaded now instead. The fleet's direct writes, embedded later, join at the reload as before."""
        import numpy as np

        with self.lock:
            after = self.events_seen
        if after is None:
            return
        events = store.queries.events_after(conn, after, CATCH_UP_EVENTS + 1)
        if len(events) > CATCH_UP_EVENTS:
            self.load(store, conn, store.vector_generation(conn))
            return
        wanted: dict[str, set[int]] = {}
        for event in events:
            if event["tier"] in self.recent and event["kind"] in ("write", "update"):
                wanted.setdefault(event["tier"], set()).add(event["row_id"])
        generation = store.vector_generation(conn)
        for tier, ids in wanted.items():
            for row in store.vectors_by_id(conn, tier, self.model_id, sorted(ids)):
                vector = np.frombuffer(row["vector"], dtype="<f4")
                self.add(store, tier, row["id"], row["agent"], row["expires_at"], vector, generation, row["thread"])
        if events:
            with self.lock:
                self.events_seen = max(self.events_seen or 0, events[-1]["id"])

    def reload_soon(self, store: RankStore) -> None:
        """Reload in the background, unless a reload runs already."""
        with self.lock:
            if self.reloading:
                return
            self.reloading = True
        threading.Thread(target=self.reload, args=(store,), name="vector-reload", daemon=True).start()

    def reload(self, store: RankStore) -> None:
        try:
            store.read(lambda conn: self.load(store, conn, store.vector_generation(conn)))
        except Exception:  # the next recall tries again; until then the old snapshot serves
            log.exception("vector reload failed")
        finally:
            self.reloading = False

    def load(self, store: RankStore, conn: Any, generation: int) -> None:
        import numpy as np

        head = store.queries.head_event(conn) if getattr(store, "shared_by_copies", False) else None
        tiers = {}
        sorted_ids = {}
        for tier in self.tier_names:
            # Row by row into one growing buffer: holding every row (each with its blob) and then joining
            # the blobs kept two copies of the matrix at once (10k rows: the service's peak RSS +27 MiB).
            id_list: list[int] = []
            threads: list[Any] = []
            agent_list, expiry_list, blob = [], [], bytearray()
            runs: dict[Any, tuple[int, int]] = {}  # each topic's rows: (first position, last + 1)
            for row in store.load_vectors(conn, tier, self.model_id):
                thread = row["thread"]
                if thread and threads and threads[-1] == thread:
                    thread = threads[-1]  # one string per topic, not per row
                    runs[thread] = (runs[thread][0], len(id_list) + 1)
                elif thread:
                    runs[thread] = (len(id_list), len(id_list) + 1)
                id_list.append(row["id"])
                agent_list.append(row["agent"])
                expiry_list.append(row["expires_at"] or "")
                threads.append(thread)
                blob += row["vector"]
            count = len(id_list)
            ids = np.array(id_list, dtype=np.int64)
            agents = np.array(agent_list, dtype=object)
            expires = np.array(expiry_list, dtype=object)
            matrix = np.frombuffer(blob, dtype="<f4").reshape(count, -1) if count else np.zeros((0, 1), np.float32)
            prev = np.array(
                [i - 1 if i and threads[i] and threads[i - 1] == threads[i] else -1 for i in range(count)],
                dtype=np.int64,
            )
            after = np.array(
                [i + 1 if i + 1 < count and threads[i] and threads[i + 1] == threads[i] else -1 for i in range(count)],
                dtype=np.int64,
            )
            tiers[tier] = (ids, agents, expires, matrix, prev, after, np.array(threads, dtype=object), runs)
            order = np.argsort(ids, kind="stable")
            sorted_ids[tier] = (ids, ids[order], order)
        with self.lock:
            if self.generation is None or generation >= self.generation:
                self.tiers, self.sorted_ids, self.generation = tiers, sorted_ids, generation
                if head is not None:
                    self.events_seen = max(self.events_seen or 0, head)
                for recent in self.recent.values():
                    for row_id in [i for i, entry in recent.items() if entry[3] <= generation]:
                        del recent[row_id]

    def fill(self, store: RankStore, conn: Any, keys: Sequence[Key]) -> None:
        """Read the vectors of these rows (a recall's keyword candidates) that the snapshot lacks but the database
        holds, in the recall's own read: another copy's write ranks by both legs in this recall, not after the
        reload. One indexed read, only while the snapshot is behind, and only on a store copies share."""
        import numpy as np

        if not getattr(store, "shared_by_copies", False) or self.latest is None or self.latest == self.generation:
            return
        wanted: dict[str, list[int]] = {}
        for tier, row_id in self.missing(keys):
            wanted.setdefault(tier, []).append(row_id)
        for tier, ids in wanted.items():
            for row in store.vectors_by_id(conn, tier, self.model_id, ids):
                vector = np.frombuffer(row["vector"], dtype="<f4")
                self.add(store, tier, row["id"], row["agent"], row["expires_at"], vector, self.latest, row["thread"])

    def count(self, tiers: Sequence[str]) -> int:
        """Vectors loaded for these tiers (a row embedded since the snapshot may count twice: enough for a test
        of none)."""
        loaded = sum(len(self.tiers[tier][0]) for tier in tiers if tier in self.tiers)
        return loaded + sum(len(self.recent.get(tier, ())) for tier in tiers)

    def snapshot(self, tier: str) -> tuple[tuple, dict[int, tuple]]:
        """The tier's snapshot (empty arrays before the first load) and its rows embedded since, read together."""
        import numpy as np

        with self.lock:
            loaded, recent = self.tiers.get(tier), dict(self.recent.get(tier, {}))
        if loaded is None:
            empty = (np.zeros(0, dtype=t) for t in (np.int64, object, object))
            loaded = (*empty, np.zeros((0, 1), np.float32), *(np.zeros(0, np.int64),) * 2, np.zeros(0, object), {})
        return loaded, recent

    def settled(self, tier: str, query: Any, loaded: tuple, recent: dict[int, tuple]) -> dict[int, float]:
        """The score a snapshot holding the rows embedded since would give them, and the other rows of their topics
        (a row's previous and next of its topic, by id, lend it NEIGHBOUR_WEIGHT of the better cosine; a
        re-embedded row's old topic loses it): a fresh row ranks as it will after the reload."""
        import numpy as np

        ids, _, _, matrix, _, _, threads, runs = loaded
        scores: dict[int, float] = {}
        topics: dict[Any, dict[int, Any]] = {}
        for row_id, entry in recent.items():
            if entry[4]:
                topics.setdefault(entry[4], {})[row_id] = entry[2]
            else:
                scores[row_id] = float(entry[2] @ query)
        for at in self.positions(tier, ids, list(recent)).tolist() if len(ids) and recent else ():
            if threads[at]:
                topics.setdefault(threads[at], {})
        for thread, fresh in topics.items():
            start, end = runs.get(thread, (0, 0))
            kept = np.arange(start, end)[~np.isin(ids[start:end], list(recent))]
            members = sorted([*zip(ids[kept].tolist(), matrix[kept]), *fresh.items()], key=lambda m: m[0])
            if not members:
                continue
            cosine = np.stack([vector for _, vector in members]) @ query
            padded = np.concatenate([[0.0], cosine, [0.0]])  # no neighbour reads 0, as in search
            around = np.maximum(padded[:-2], padded[2:]) if len(members) > 1 else np.zeros(1)
            scores.update(zip([row_id for row_id, _ in members], (cosine + NEIGHBOUR_WEIGHT * around).tolist()))
        return scores

    def search(self, tier: str, query: Any, allowed: Callable[[Any, Any], Any], depth: int) -> dict[int, float]:
        """Top `depth` rows by cosine (plus topic neighbours'), among rows `allowed` keeps and not expired."""
        import numpy as np

        loaded, recent = self.snapshot(tier)
        ids, agents, expires, matrix, prev, after = loaded[:6]
        score = np.zeros(0)
        if len(ids):
            cosine = matrix @ query
            padded = np.append(cosine, 0.0)  # index -1 (no neighbour) reads 0
            neighbours = np.maximum(padded[prev], padded[after])
            score = cosine + NEIGHBOUR_WEIGHT * np.where((prev >= 0) | (after >= 0), neighbours, 0.0)
        if recent:  # the snapshot's copy of a re-embedded row is stale: the recent one replaces it
            settled = self.settled(tier, query, loaded, recent)
            keep = ~np.isin(ids, list(recent))
            ids, agents, expires, score = ids[keep], agents[keep], expires[keep], score[keep]
            moved = np.flatnonzero(np.isin(ids, list(settled)))  # rows whose topic a fresh row joined or left
            score[moved] = [settled[row_id] for row_id in ids[moved].tolist()]
            entries = list(recent.values())
            ids = np.concatenate([ids, np.array(list(recent), dtype=np.int64)])
            agents = np.concatenate([agents, np.array([e[0] for e in entries], dtype=object)])
            expires = np.concatenate([expires, np.array([e[1] for e in entries], dtype=object)])
            score = np.concatenate([score, np.array([settled[row_id] for row_id in recent])])
        if not len(ids):
            return {}
        mask = allowed(agents, expires)  # Visibility.mask: scope, sharing and expiry
        candidates = np.flatnonzero(mask)
        if not len(candidates):
            return {}
        order = -score[candidates]
        if len(candidates) > depth:  # only the rows that can make the top (ties at its edge included): no full sort
            edge = np.partition(order, depth - 1)[depth - 1]
            kept = order <= edge
            candidates, order = candidates[kept], order[kept]
        top = candidates[np.argsort(order, kind="stable")[:depth]]
        return {int(ids[i]): float(score[i]) for i in top}

    def similarity(self, query: Any, keys: Sequence[Key]) -> dict[Key, float]:
        """The score search gives these rows (cosine plus the neighbours'), whatever their rank; rows without a
        vector are left out. No filters: the rows come from a leg that applied them."""
        import numpy as np

        scores = {}
        for tier in {name for name, _ in keys}:
            loaded, recent = self.snapshot(tier)
            settled = self.settled(tier, query, loaded, recent) if recent else {}
            wanted = [row_id for name, row_id in keys if name == tier]
            scores.update({(tier, row_id): settled[row_id] for row_id in wanted if row_id in settled})
            ids, _, _, matrix, prev, after = loaded[:6]
            if not len(ids):
                continue
            at = self.positions(tier, ids, [row_id for row_id in wanted if row_id not in settled])
            if not len(at):
                continue
            rows = np.concatenate([at, prev[at], after[at]])
            cosine = dict(zip(rows.tolist(), (matrix[np.maximum(rows, 0)] @ query).tolist()))
            cosine[-1] = 0.0  # no neighbour reads 0, as in search
            for i, before, following in zip(at.tolist(), prev[at].tolist(), after[at].tolist()):
                around = max(cosine[before], cosine[following]) if before >= 0 or following >= 0 else 0.0
                scores[(tier, int(ids[i]))] = cosine[i] + NEIGHBOUR_WEIGHT * around
        return scores

    def lacking(self, keys: Sequence[Key]) -> int:
        """How many of these rows have no vector in the index yet (rows of a tier it does not embed, the archive,
        are not counted)."""
        return len(self.missing(keys))

    def missing(self, keys: Sequence[Key]) -> list[Key]:
        """Those of these rows with no vector in the index yet, of the tiers it embeds."""
        keys = [key for key in keys if key[0] in self.tier_names]
        absent: list[Key] = []
        for tier in {name for name, _ in keys}:
            wanted = [row_id for name, row_id in keys if name == tier]
            with self.lock:
                added = self.recent.get(tier, {})
                rest = [row_id for row_id in wanted if row_id not in added]
            ids = self.tiers.get(tier, (None,))[0]
            held = (
                set(ids[self.positions(tier, ids, rest)].tolist()) if ids is not None and len(ids) and rest else set()
            )
            absent.extend((tier, row_id) for row_id in rest if row_id not in held)
        return absent

    def positions(self, tier: str, ids: Any, wanted: list[int]) -> Any:
        """Where these row ids sit in the tier's snapshot `ids` (those without a vector left out): a binary
        search, since a scan of the ids costs milliseconds from 100k rows."""
        import numpy as np

        snapshot, sorted_ids, order = self.sorted_ids.get(tier, (None, None, None))
        if snapshot is not ids:  # reloaded between the two reads: the next recall has them in step
            return np.flatnonzero(np.isin(ids, wanted))
        wanted_ids = np.array(wanted, dtype=np.int64)
        found = np.minimum(np.searchsorted(sorted_ids, wanted_ids), len(sorted_ids) - 1)
        return order[found[sorted_ids[found] == wanted_ids]]


def vector_candidates(
    vectors: VectorIndex, query: Any, tiers: Sequence[Tier], seen: Visibility, depth: int
) -> dict[Key, float]:
    """Cosine per tier among rows the caller may see (`seen.mask`: scope, expiry and, for opt-in tiers, who shares)."""
    similar = {}
    for tier in tiers:
        found = vectors.search(tier.name, query, functools.partial(seen.mask, tier), depth)
        similar.update({(tier.name, row_id): cosine for row_id, cosine in found.items()})
    return similar


# ==== Fusion ====

# The vector leg is weaker: it must not drown BM25. Min-max 0.7 / 0.3 (RESULTS-locomo.md, "Headline"; held-out,
# the fitted vector weight is 0.2 or 0.3 in every fold; "Recall v2": RRF and z-score within 0.005).
KEYWORD_WEIGHT, VECTOR_WEIGHT = 0.7, 0.3
LEG_WEIGHTS = {"hybrid": (KEYWORD_WEIGHT, VECTOR_WEIGHT), "keyword": (1.0, 0.0), "vector": (0.0, 1.0)}
# A question whose content words the keyword leg's best rows hardly hold is likely a paraphrase: its answer shares no
# word with it, so only the vector leg can find it, and at 0.3 a row matching one incidental word outranks the best
# cosine, below the reranker's head (the fleet's fit half: 8 of 24 paraphrase answers, 4 of them in the vector leg's top
# 4; bench/fleet_rank.py --stages). Such a question's head gets seats for the vector leg's best rows (with_vector_seats;
# RESULTS-locomo.md, "Paraphrases on the fleet"). Swapping the legs' weights instead found as many but cost LoCoMo 0.014
# hit@5 held out (its weak questions still lean on the keyword leg); seats cost it nothing measurable.
WEAK_KEYWORD_ROWS = 3  # the keyword leg's best rows read for their coverage of the question
WEAK_KEYWORD_COVERAGE = 0.35  # under this share of the question's content stems in each of them: weak
HEAD_VECTOR_ROWS = 5  # the vector leg's best rows a weak question's head holds (10: LoCoMo multi-hop -0.007)


def normalise(scores: dict[Any, float]) -> dict[Any, float]:
    """Min-max onto [0.01, 1], so both legs share a scale and a weak match is still above absent."""
    if not scores:
        return {}
    low, high = min(scores.values()), max(scores.values())
    if high == low:
        return {key: 1.0 for key in scores}
    return {key: 0.01 + 0.99 * (value - low) / (high - low) for key, value in scores.items()}


@dataclass
class Fused:
    """The first pass: rows best first (their `score` fused), and what the reranker reads of each leg."""

    rows: list[dict]
    keys: list[Key]  # rows[i]'s (tier name, id)
    keyword: dict[Key, float]  # the keyword leg, normalised over its candidates
    vector: dict[Key, float]  # the vector leg, normalised over its candidates
    similar: dict[Key, float]  # the vector leg as it scored: cosine plus NEIGHBOUR_WEIGHT x the neighbours'
    head: int  # how many rows the reranker reorders: RERANK_DEPTH, plus the vector leg's seats


def keyword_strength(stems: frozenset[str], candidates: dict[Key, dict]) -> float:
    """The best share of the question's content `stems` that one of the keyword leg's WEAK_KEYWORD_ROWS best
    rows accounts for (question_coverage); 1.0 for a question with no content word, 0.0 when nothing matched."""
    if not stems:
        return 1.0
    matched = [r for r in candidates.values() if r["keyword"] is not None]
    best = sorted(matched, key=lambda r: r["keyword"], reverse=True)[:WEAK_KEYWORD_ROWS]
    return max((len(stems & covered_stems(r["text"], r["agent"])) / len(stems) for r in best), default=0.0)


def fuse(
    candidates: dict[Key, dict], similar: dict[Key, float], ranking: str, stems: frozenset[str] = frozenset()
) -> Fused:
    """One score in [0, 1] per row from LEG_WEIGHTS over the two legs, each min-max normalised; best first.

    A row outside a leg's candidates gets 0 from it. In hybrid, when the keyword leg's best rows hardly cover
    the question's content `stems` (keyword_strength under WEAK_KEYWORD_COVERAGE), the reranker's head also
    seats the vector leg's best rows (with_vector_seats); `head` says how many rows it reorders.
    """
    weak = ranking == "hybrid" and keyword_strength(stems, candidates) < WEAK_KEYWORD_COVERAGE
    keyword = normalise({key: r["keyword"] for key, r in candidates.items() if r["keyword"] is not None})
    vector = normalise(similar)
    weights = LEG_WEIGHTS[ranking]
    fused = []
    for key, result in candidates.items():
        result.pop("keyword")
        result["score"] = weights[0] * keyword.get(key, 0.0) + weights[1] * vector.get(key, 0.0)
        if result["score"] > 0:
            fused.append((key, result))
    fused.sort(key=lambda pair: pair[1]["score"], reverse=True)
    head = RERANK_DEPTH
    if weak and len(fused) > RERANK_DEPTH:
        fused, head = with_vector_seats(fused, similar)
    return Fused([r for _, r in fused], [key for key, _ in fused], keyword, vector, similar, head)


def with_vector_seats(fused: list[tuple[Key, dict]], similar: dict[Key, float]) -> tuple[list[tuple[Key, dict]], int]:
    """The fused rows with the vector leg's HEAD_VECTOR_ROWS best that fell below the reranker's head moved up
    to join it, at its last row's score; and the head's new length."""
    listed = {key for key, _ in fused}  # the vector leg's rows that are candidates (a tag filter may drop some)
    best = sorted((key for key in similar if key in listed), key=similar.__getitem__, reverse=True)
    joining = set(best[:HEAD_VECTOR_ROWS]) - {key for key, _ in fused[:RERANK_DEPTH]}
    moved = [pair for pair in fused[RERANK_DEPTH:] if pair[0] in joining]
    cut = fused[RERANK_DEPTH - 1][1]["score"]
    for _, result in moved:
        result["score"] = cut
    rest = [pair for pair in fused[RERANK_DEPTH:] if pair[0] not in joining]
    return fused[:RERANK_DEPTH] + moved + rest, RERANK_DEPTH + len(moved)


# ==== The reranker: a learned linear model over the fused top rows ====

# How many fused rows the reranker reorders; the rest keep their order below them. Held-out hybrid hit@5 is
# the same over the top 20, 30 or 50 (RESULTS-locomo.md, "Recall v2": "reranker over the top 30 / 50"): 20 is cheapest.
RERANK_DEPTH = 20
# An event is often told a few days after it happened: a question's dated window reaches this far past the date
# it names (RESULTS-locomo.md, "Recall v2": "time window boost", +7 days).
DATE_WINDOW_AFTER_DAYS = 7
STEM_LENGTH = 5  # a stemmer's poor cousin for the coverage features: the reranker was fitted with 5-letter prefixes
# The reranker's inputs per candidate and their logistic-regression weights (keyword-only, hybrid), fitted by
# bench/ltr_fit.py (top 20, L2 1.0, on ltr_features below; hybrid on the vectors of the model the service builds, MiniLM
# re-quantized for integer kernels): keyword-only on all five LoCoMo dev conversations, hybrid on those and the fleet's
# `fit` half (bench/data/fleet, read through bench/fleet_rank.py). Held out (fitted on four conversations, ranking the
# fifth) they lift hit@5 and MRR of both modes well past noise (RESULTS-locomo.md, "Recall v2", "learned linear
# reranker" rows; "In the service"). A fact store's rows have no topic thread, so the chat features (neighbours,
# previous row asks) say nothing there and the LoCoMo fit's trust in the keyword leg buried answers only the vector leg
# found: in hybrid, `alone` and the `*_alone` copies give such rows weights of their own, one model serving both. Held
# out, hybrid: LoCoMo LOCO hit@5 0.825, frac@10 0.836 (unchanged); the fleet's score half hit@5 0.804 -> 0.875,
# paraphrase 0.083 -> 0.500 (only 0.67 of those answers reach the fused top 20 at 0.7 / 0.3; 0.5 / 0.5 lifts that to
# 0.83 but costs LoCoMo 0.005-0.008 hit@5: not adopted). Refitted on heads with the vector leg's seats (fuse): LoCoMo
# LOCO 0.824 / 0.836; the fleet's fit half (two folds by cluster) paraphrase hit@5 0.542 -> 0.708, its score half 0.500
# -> 0.542 (0.71 of its answers now reach the head). Keyword-only keeps the LoCoMo fit: the fleet gains nothing there
# (paraphrases share no word to find; 0.786 either way) and costs LoCoMo 0.006 hit@5. The rank features' `_alone` copies
# would add 0.018 fleet hit@5 but outweigh a date the question names among tied rows: left out.
LTR_WEIGHTS: dict[str, tuple[float | None, float]] = {
    "bias": (-7.9995, -8.4014),
    "fused": (1.7835, 3.6989),  # the first pass's score (fusion, or the normalised keyword score alone)
    "fused_rr": (0.7124, 0.8907),  # 1 / its rank in the first pass
    "keyword": (1.7835, 0.4148),  # the keyword leg, min-max over its candidates (0 when absent)
    "keyword_rr": (0.7124, 0.9498),  # 1 / the keyword rank (0 when absent)
    "neighbour_best": (1.6277, 1.7597),  # the better normalised keyword score of the topic's previous and next row
    "neighbour_prev": (-1.4205, -1.6198),
    "neighbour_next": (-0.9538, -1.3009),
    "writer_named": (-0.1547, 0.1023),  # the question names this row's writer
    "other_named": (-0.8258, -0.2561),  # the question names a writer, not this one
    "is_question": (-0.7169, -0.7594),  # the row ends with "?": asking is rarely the answer
    "log_words": (0.5297, 0.6448),  # log(1 + words in the row)
    "in_date_window": (0.5966, 0.6736),  # the row's date falls in the window the question names (date_window)
    "coverage": (1.5528, 0.7898),  # share of the question's content stems in the row
    "prev_is_question": (-0.1207, -0.1423),  # the topic's previous row asks something: this row may answer it
    "answers_match": (2.6565, 2.6184),  # prev_is_question x neighbour_prev: it asks what the question asks
    "coverage_around": (0.6, 0.3954),  # share of the question's content stems in the previous and next rows
    "first_of_topic": (0.1561, -0.0159),  # no previous row in the topic
    "cosine": (None, -0.106),  # the vector leg's score (cosine, neighbour-smoothed) of any row with a vector
    "vector": (None, -0.0223),  # the vector leg, min-max over its candidates (0 when absent)
    "alone": (None, -1.7729),  # no previous and no next row in the topic: a fact store's row, not a chat turn
    "keyword_alone": (None, -7.6201),  # keyword x alone: the legs' weights where no thread speaks for a row
    "fused_alone": (None, 10.6274),
    "coverage_alone": (None, 0.4218),
    "cosine_alone": (None, -1.5878),
    "vector_alone": (None, 1.6712),
}
ALONE_FEATURES = ("keyword", "fused", "coverage", "cosine", "vector")  # hybrid: each also as <name>_alone
# `relevance` = logistic(bias + a x the reranker's logit + b x question_coverage + c x list_coverage + d x the vector
# leg's score), per mode (keyword, hybrid: no vector leg, d = 0). Fitted
# by bench/relevance_fit.py on the LoCoMo dev split: each conversation's own questions (evidence turns relevant) and
# the other conversations' questions (nothing relevant), leave-one-conversation-out figures in RESULTS-locomo.md.
# The floor for rows that go straight into a prompt: the client's turn_context (and so the Hermes prefetch) uses
# it (solos_client.TURN_MIN_RELEVANCE, the same number). `relevance` is the judge's probability (solos_judge);
# the floor is judge.json's, chosen by bench/judge_fit.py on the fitting data as the highest under which both
# domains keep 0.8 of their answers. Held out (bench/judge_eval.py, hybrid): the fleet's scoring half keeps 0.82
# and rejects 0.15 of its near misses; LoCoMo keeps 0.80 and rejects 0.87 of foreign questions. Short of the 0.9
# rejected wanted: a near miss that differs from the answer by a rival period, id, service, person or scope is
# told (solos_judge.conflicts); one that lacks the attribute asked, or names the thing by another word, is not.
# The API's own default is 0 (every match, each labelled with its relevance). Hybrid recall's cross-encoder
# combination is set to this same floor (bench/cross_encoder_swap.py: at it, it keeps the share of answers the
# features judge keeps on calibration data).
RELEVANCE_FLOOR = 0.08
RELEVANCE_WEIGHTS = {
    "keyword": (-4.7487, 0.9448, 1.0038, 4.1019, 0.0),
    "hybrid": (-4.8917, 0.9193, 0.565, 2.6924, 2.4352),
}
KEYWORD_FEATURES = tuple(name for name, (weight, _) in LTR_WEIGHTS.items() if name != "bias" and weight is not None)
VECTOR_FEATURES = ("cosine", "vector", "alone", *(f"{name}_alone" for name in ALONE_FEATURES))
LTR_KEYWORD_WEIGHTS = tuple(weight for weight, _ in LTR_WEIGHTS.values() if weight is not None)  # bias first
LTR_HYBRID_WEIGHTS = tuple(weight for _, weight in LTR_WEIGHTS.values())

MONTHS = {
    name: number
    for number, names in enumerate(
        (
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ),
        start=1,
    )
    for name in names
}
_MONTH = r"(January|February|March|April|May|June|July|August|September|October|November|December)"
# "13 October 2023", "1 February, 2023", "October 13, 2023", "May 23 2023"
_DAY_MONTH_YEAR = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+{_MONTH},?\s+((?:19|20)\d\d)\b")
_MONTH_DAY_YEAR = re.compile(rf"\b{_MONTH}\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+((?:19|20)\d\d)\b")
_MONTH_YEAR = re.compile(rf"\b{_MONTH},?\s+((?:19|20)\d\d)\b")
_YEAR_ONLY = re.compile(r"\b(?:in|during|of|since|by)\s+((?:19|20)\d\d)\b")
# A row's date: LoCoMo's topics ("1:56 pm on 8 May, 2023") or ISO ("2023-05-08", every row's ts).
ROW_DATE = re.compile(r"\b(\d{1,2})\s+([A-Za-z]+),?\s+((?:19|20)\d\d)\b|\b((?:19|20)\d\d)-(\d\d)-(\d\d)")


def _day(year: int, month: int, day: int) -> int | None:
    """The proleptic ordinal of a date, None for one that does not exist (31 February)."""
    try:
        return datetime.date(year, month, day).toordinal()
    except ValueError:
        return None


def _month_span(year: int, month: int) -> tuple[int, int]:
    first = datetime.date(year, month, 1)
    following = datetime.date(year + month // 12, month % 12 + 1, 1)
    return first.toordinal(), following.toordinal() - 1


def parse_row_date(text: str | None) -> int | None:
    """The day (proleptic ordinal) a row's date names, '1:56 pm on 8 May, 2023' or '2023-05-08'; else None."""
    found = ROW_DATE.search(str(text)) if text else None
    if not found:
        return None
    if found.group(4):
        return _day(int(found.group(4)), int(found.group(5)), int(found.group(6)))
    month = MONTHS.get(found.group(2).lower())
    return _day(int(found.group(3)), month, int(found.group(1))) if month else None


def date_window(question: str, after_days: int = DATE_WINDOW_AFTER_DAYS) -> tuple[int, int] | None:
    """The days a question names, widened by after_days, or None.

    A full date gives that day, "July 2023" that month, "in 2023" that year.
    Relative phrases ("last week") have no anchor in the question: None.
    """
    for pattern, order in ((_DAY_MONTH_YEAR, "dmy"), (_MONTH_DAY_YEAR, "mdy")):
        found = pattern.search(question)
        if found:
            parts = dict(zip(order, found.groups()))
            day = _day(int(parts["y"]), MONTHS[parts["m"].lower()], int(parts["d"]))
            if day is not None:
                return day, day + after_days
    found = _MONTH_YEAR.search(question)
    if found:
        low, high = _month_span(int(found.group(2)), MONTHS[found.group(1).lower()])
        return low, high + after_days
    found = _YEAR_ONLY.search(question)
    if found:
        return _month_span(int(found.group(1)), 1)[0], _month_span(int(found.group(1)), 12)[1] + after_days
    return None


WORD_STEM = re.compile(rf"(\w{{1,{STEM_LENGTH}}})\w*")  # a word, captured up to STEM_LENGTH letters
# Distinct texts whose shape and duplicate key recall remembers (about 4 MiB with both): the rows an agent's
# questions meet recur. Only texts up to SHAPED_TEXT_MAX_CHARS are kept (every LoCoMo turn and bench fleet text
# is): a 16 KiB value's shape and key took ~0.36 MiB, and 2,048 of them pinned 730 MiB of the service's memory.
# At most about 45 MiB in all, whatever agents write (2,048 texts of 512 characters, each word distinct).
TEXT_SHAPES_KEPT = 2048
SHAPED_TEXT_MAX_CHARS = 512
# What the reranker and the judge (solos_judge.row_text) read of one row's text: their features are Python over
# every token, and 20 short values of 16k characters full of ids took 150 ms of CPU, 40x an ordinary recall (4,096
# characters: 54 ms). The first 2,048 characters, about 300 words: a LoCoMo turn or a fleet fact is far shorter,
# and the cross-encoder reads 256 tokens.
RANKED_TEXT_CHARS = 2048


def stems(text: str) -> frozenset[str]:
    """The words' STEM_LENGTH-letter prefixes, lower-cased: enough to count coverage."""
    return frozenset(WORD_STEM.findall(text.lower()))


class TextShape(NamedTuple):
    """What the reranker reads of a text itself."""

    stems: frozenset[str]
    words: int  # whitespace-separated
    asks: bool  # ends with "?"


def text_shape(text: str) -> TextShape:
    """A text's stems, length and question mark, worked out once per distinct short text; of a long one, its
    first RANKED_TEXT_CHARS characters."""
    if len(text) <= SHAPED_TEXT_MAX_CHARS:
        return kept_text_shape(text)
    return TextShape(stems(text[:RANKED_TEXT_CHARS]), len(text.split()), text.rstrip().endswith("?"))


def shape_of(text: str) -> TextShape:
    return TextShape(stems(text), len(text.split()), text.rstrip().endswith("?"))


kept_text_shape = functools.lru_cache(maxsize=TEXT_SHAPES_KEPT)(shape_of)


@dataclass(frozen=True)
class Question:
    """What the reranker reads from the question: its content stems, the writers it names, the days it names."""

    stems: frozenset[str]
    named: frozenset[str]  # lower-cased writers' names
    window: tuple[int, int] | None

    @classmethod
    def of(cls, text: str, words: list[str], writers: Sequence[str]) -> Question:
        """The question's reading; `writers` are the candidates' (a name counts when it is a query word)."""
        named = {writer.lower() for writer in writers} & set(words)
        return cls(content_stems(words), frozenset(named), date_window(text))


def content_stems(words: Sequence[str]) -> frozenset[str]:
    """A question's query words but stop words, as the STEM_LENGTH-letter stems coverage counts."""
    return frozenset(word[:STEM_LENGTH] for word in words if word not in STOP_WORDS)


def ltr_features(
    question: Question, row: dict, previous: dict | None, following: dict | None, first_pass: dict
) -> dict[str, float]:
    """The reranker's inputs for one candidate by name, in KEYWORD_FEATURES (+ VECTOR_FEATURES when given) order.

    row, previous and following are ranking_view()s ("agent", "date": a day
    ordinal or None, and text_shape's "stems", "words", "asks"); first_pass
    carries fused, fused_rank, keyword, keyword_rank (None when absent),
    neighbour_prev, neighbour_next and, in hybrid mode, cosine and vector.
    """
    words = row["stems"]
    around = set().union(*(r["stems"] for r in (previous, following) if r is not None))
    wanted = max(len(question.stems), 1)
    window, day = question.window, row["date"]
    prev_asks = float(previous is not None and previous["asks"])
    prev_k, next_k = first_pass["neighbour_prev"], first_pass["neighbour_next"]
    named = row["agent"].lower() in question.named
    features = {
        "fused": first_pass["fused"],
        "fused_rr": 1.0 / first_pass["fused_rank"],
        "keyword": first_pass["keyword"],
        "keyword_rr": 1.0 / first_pass["keyword_rank"] if first_pass["keyword_rank"] else 0.0,
        "neighbour_best": max(prev_k, next_k),
        "neighbour_prev": prev_k,
        "neighbour_next": next_k,
        "writer_named": float(named),
        "other_named": float(bool(question.named) and not named),
        "is_question": float(row["asks"]),
        "log_words": math.log1p(row["words"]),
        "in_date_window": float(window is not None and day is not None and window[0] <= day <= window[1]),
        "coverage": len(question.stems & words) / wanted,
        "prev_is_question": prev_asks,
        "answers_match": prev_asks * prev_k,
        "coverage_around": len(question.stems & around) / wanted,
        "first_of_topic": float(previous is None),
    }
    if "cosine" in first_pass:
        features.update(cosine=first_pass["cosine"], vector=first_pass["vector"])
        alone = float(previous is None and following is None)  # a fact store's row: no topic thread around it
        features["alone"] = alone
        features.update({f"{name}_alone": features[name] * alone for name in ALONE_FEATURES})
    return features


def feature_names(hybrid: bool) -> tuple[str, ...]:
    """The reranker's features in weight order: the keyword mode's, plus the vector leg's in hybrid."""
    return KEYWORD_FEATURES + (VECTOR_FEATURES if hybrid else ())


def ltr_score(features: Mapping[str, float], weights: tuple[float, ...]) -> float:
    """The model's logit: weights[0] + the sum of weights[1:] x features (raw, unstandardised weights).

    Weights pair with features by name: the features must be exactly feature_names() of the weights' mode, in
    that order, or this raises (a positional zip would drop or shift some without a word).
    """
    names = feature_names(len(weights) - 1 > len(KEYWORD_FEATURES))
    if tuple(features) != names or len(weights) != len(names) + 1:
        raise ValueError(f"reranker features {list(features)} do not match its {len(weights) - 1} weights {names}")
    return weights[0] + sum(weight * value for weight, value in zip(weights[1:], features.values()))


def logistic(logit: float) -> float:
    return 1.0 / (1.0 + math.exp(-logit)) if logit >= 0 else math.exp(logit) / (1.0 + math.exp(logit))


def rerank(
    store: RankStore,
    conn: Any,
    plan: RecallPlan,
    seen: Visibility,
    fused: Fused,
    vectors: VectorIndex | None,
    around: Around,
    reorder: bool = True,
) -> tuple[list[dict], str | None]:
    """The first RERANK_DEPTH fused rows reordered by the reranker, and None; or, if it fails, the first pass
    as it was and why.

    `plan` is the recall's (searched tiers, caller, query, words, the query's
    vector), `seen` its solos_store.Visibility; `around` holds the topic neighbours already read (more join it);
    `vectors` is given for hybrid ranking, whose weights read the
    vector leg's score (of rows it did not rank too). A reranked row's
    `score` becomes the model's probability that it answers; rows below keep
    their order, scaled under the lowest reranked score, so scores fall down
    the list and stay in [0, 1]. Every row also gets its `relevance`
    (`calibrated_relevance`); with reorder False (`--rerank off`) only that,
    the first pass's order and scores stay. Storage errors propagate (the
    store retries or answers 503); any other failure leaves the first pass's
    order and scores, and no relevance, so the reranker cannot fail a recall.
    """
    depth = fused.head
    head = fused.rows[:depth]
    if not head:
        return fused.rows, None
    rows = dict(zip(fused.keys, fused.rows))
    topic_context(store, conn, plan.searched, seen, fused.keys[:depth], rows, around)
    try:
        similar = None
        if vectors is not None:  # the vector leg's score of every head row with a vector, ranked by that leg or not
            missing = [key for key in fused.keys[:depth] if key not in fused.similar]
            fused.similar.update(vectors.similarity(plan.vector, missing) if missing else {})  # the judge reads it too
            similar = fused.similar
        question = Question.of(plan.query, plan.words, [result["agent"] for result in fused.rows])
        logits = head_logits(question, fused, rows, around, similar)
        weights = RELEVANCE_WEIGHTS["keyword" if similar is None else "hybrid"]
        found = list_coverage(question, head)
        relevance = [
            calibrated_relevance(
                weights,
                logit,
                question_coverage(question, r["text"], r["agent"]),
                found,
                0.0 if similar is None else similar.get(key, 0.0),
            )
            for r, logit, key in zip(head, logits, fused.keys)
        ]
    except Exception as error:  # a bug or odd data in one row must not fail the recall: keep the first pass
        log.exception("rerank failed; the first pass's order stands")
        return fused.rows, f"first-pass order: the reranker failed ({type(error).__name__}: {error})"
    cut = head[-1]["score"]
    for result, value in zip(head, relevance):
        result["relevance"] = value
    lowest = min(relevance)
    for result in fused.rows[depth:]:  # below every reranked row, as their scores are
        result["relevance"] = lowest * result["score"] / cut
    if not reorder:
        return fused.rows, None
    for result, logit in zip(head, logits):
        result["score"] = logistic(logit)
    floor = min(result["score"] for result in head)
    for result in fused.rows[depth:]:
        result["score"] = floor * result["score"] / cut
    order = sorted(range(len(head)), key=lambda i: -logits[i])  # stable: ties keep the first pass's order
    return [head[i] for i in order] + fused.rows[depth:], None


def covered_stems(text: Any, agent: str) -> frozenset[str]:
    """What a row can account for of a question: its text's stems and its writer's name."""
    return text_shape(str(text or "")).stems | {agent.lower()[:STEM_LENGTH]}


def question_coverage(question: Question, text: Any, agent: str) -> float:
    """The share of the question's content stems a row accounts for."""
    return len(question.stems & covered_stems(text, agent)) / len(question.stems) if question.stems else 0.0


def list_coverage(question: Question, rows: Sequence[dict]) -> float:
    """The share of the question's content stems any of these rows accounts for: a question about something the
    memory never mentions leaves its words unaccounted for, whatever ranks first."""
    if not question.stems:
        return 0.0
    found = set().union(*(covered_stems(row["text"], row["agent"]) for row in rows))
    return len(question.stems & found) / len(question.stems)


def calibrated_relevance(
    weights: tuple[float, ...], logit: float, coverage: float, found: float, cosine: float = 0.0
) -> float:
    """The probability that a row is relevant: a logistic calibration (RELEVANCE_WEIGHTS) of the reranker's logit,
    the row's coverage of the question, the reranked rows' coverage of it together and (hybrid) the vector leg's
    score of the row, which speaks for a paraphrase that shares no word with the question."""
    return logistic(weights[0] + weights[1] * logit + weights[2] * coverage + weights[3] * found + weights[4] * cosine)


def topic_context(
    store: RankStore, conn: Any, tiers: Sequence[Tier], seen: Visibility, keys: list[Key], rows: dict, around: Around
) -> None:
    """The previous and next fact of each long fact's topic, into `around` if the keyword leg did not read them;
    those not among `rows` (the candidates) join it.

    Those are read in the recall's snapshot as ranking inputs only, never
    returned, so with scope shared whatever the caller's scope: scope picks
    what comes back, and every agent may read the long tier.
    """
    for tier in tiers:
        if not tier.threaded:
            continue
        unknown = [row_id for name, row_id in keys if name == tier.name and (name, row_id) not in around]
        if unknown:
            read_neighbours(store, conn, tier, unknown, around)
        head = [around[key] for key in keys if key[0] == tier.name]
        unread = sorted({key[1] for pair in head for key in pair if key and key not in rows})
        for row in store.rows_by_id(conn, tier, seen.widened(), unread) if unread else ():
            rows[(tier.name, row["id"])] = {
                "text": row[tier.text_column],
                "agent": row["agent"],
                "topic": row["topic"],
                "ts": row["ts"],
            }


def head_logits(
    question: Question,
    fused: Fused,
    rows: dict[Key, dict],
    around: Around,
    similar: dict[Key, float] | None,
) -> list[float]:
    """The reranker's logit for each of the first RERANK_DEPTH fused rows (`rows`: any row by key; `similar`: the
    vector leg's score of the head rows with a vector, None for keyword-only weights)."""
    depth = fused.head
    keys, head = fused.keys[:depth], fused.rows[:depth]
    by_keyword = sorted(fused.keyword, key=fused.keyword.__getitem__, reverse=True)
    keyword_rank = {key: rank for rank, key in enumerate(by_keyword, 1)}
    weights = LTR_KEYWORD_WEIGHTS if similar is None else LTR_HYBRID_WEIGHTS
    views: dict[Key, dict] = {}
    dated = question.window is not None  # a row's date counts only against days the question names

    def view(key: Key) -> dict:
        if key not in views:
            row = rows[key]
            topic, ts = (row.get("topic"), row["ts"]) if dated else (None, None)
            views[key] = ranking_view(row["text"], row["agent"], topic, ts)
        return views[key]

    logits = []
    for rank, key in enumerate(keys, 1):
        before, after = around.get(key, (None, None))
        previous = view(before) if before in rows else None
        following = view(after) if after in rows else None
        first_pass = {
            "fused": head[rank - 1]["score"],
            "fused_rank": rank,
            "keyword": fused.keyword.get(key, 0.0),
            "keyword_rank": keyword_rank.get(key),
            "neighbour_prev": fused.keyword.get(before, 0.0) if before and previous else 0.0,
            "neighbour_next": fused.keyword.get(after, 0.0) if after and following else 0.0,
        }
        if similar is not None:
            first_pass.update(cosine=similar.get(key, 0.0), vector=fused.vector.get(key, 0.0))
        logits.append(ltr_score(ltr_features(question, view(key), previous, following, first_pass), weights))
    return logits


def ranking_view(text: Any, agent: str, topic: Any, ts: Any) -> dict:
    """A row as the reranker sees it; its date is the topic's if that names one (LoCoMo's), else when written."""
    shape = text_shape(str(text or ""))
    date = parse_row_date(topic) or parse_row_date(ts)
    return {"agent": agent, "date": date, "stems": shape.stems, "words": shape.words, "asks": shape.asks}


# ==== Presenting: labels, duplicates ====


def tier_result(tier: Tier, row: Any, caller: str) -> dict:
    """One recalled row, labelled with tier, writer, time, score, source and foreign."""
    row_id, agent = row["id"], row["agent"]
    result = {
        "id": row_id,
        "tier": tier.label,
        "agent": agent,
        "ts": row["ts"],
        "score": row["score"],
        "foreign": agent != caller,
        "source": None,
        "text": row[tier.text_column],
    }
    for column in tier.result_columns:  # tags: parsed by present()
        result[column] = row[column]
    result["source"] = result["source"] or f"{tier.table}#{row_id}"  # a long fact may name its own
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


def duplicate_key(text: str) -> str:
    """Texts that differ only in case and spacing are one text (worked out once per distinct short text)."""
    return kept_duplicate_key(text) if len(text) <= SHAPED_TEXT_MAX_CHARS else fold_spacing_and_case(text)


def fold_spacing_and_case(text: str) -> str:
    return " ".join(text.split()).casefold()


kept_duplicate_key = functools.lru_cache(maxsize=TEXT_SHAPES_KEPT)(fold_spacing_and_case)


def drop_kept_texts() -> None:
    """Forget every text recall keeps: a forgotten or deleted row's text must not stay in the service's memory."""
    kept_text_shape.cache_clear()
    kept_duplicate_key.cache_clear()


def collapse_duplicates(ranked: list[dict], k: int) -> tuple[list[dict], list[dict]]:
    """Keep the best-ranked copy of each identical text; return the kept and the collapsed copies.

    A collapsed copy still shows in its kept twin's `duplicates` and `also_written_by`.
    """
    kept: dict[str, dict] = {}
    collapsed = []
    for result in ranked:
        text = duplicate_key(str(result["text"]))
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
