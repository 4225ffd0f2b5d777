"""A model of what the rules say, driven through long random sequences of every operation, on both stores.

A hypothesis state machine writes (short with and without a TTL, long new, rewritten and the same, episodes with
idempotency keys and their retries), shares and stops sharing, promotes, forgets (its own rows, another agent's:
refused), lets short rows expire (the fleet's clock reaching them: a direct write of `expires_at`, the service's
sweep made quick), runs the daily purge (episodes to the archive, expired rows gone), and reads back through
recall (keyword, every scope, tier set, tags, the archive and persona), as-of recall, `read_events` from each
agent's cursor and from the first by scope and writers, notices, the audit and the stats, as four agents holding
tokens (one naming another is refused). A plain Python model (`Model`) holds which rows exist, who wrote them, who may
see them and who was shown them; after each step every answer is held to it: a recalled row exists and is the
caller's to see, labelled with its writer and `foreign`, and every match comes back; a forgotten row never comes
back through any read; statuses and ids are the model's; events are the caller's to see, each once, in order,
and every visible write comes; notices and audited reads are those the deliveries call for. A refused call must
change no row of the tables a write touches (`conftest.snapshot`).

The same sequence runs on SQLite, and on SQLite and PostgreSQL side by side: every answer of the PostgreSQL
store is also compared with SQLite's (statuses, ids, the rows recalled, the events), so a sequence the two
answer differently fails even when neither breaks the model.
"""

from __future__ import annotations

import collections
import datetime
import functools
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    AGENTS,
    RunningServer,
    direct,
    events_settled,
    snapshot,
    start_server,
    stop_server,
    wait_until,
    write_tokens,
)
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

import solos_events
import solos_memory
import solos_store

pytestmark = pytest.mark.slow  # tens of seconds a store: hundreds of requests per sequence

# Steps per sequence, and sequences per run: SQLite's 60 about 16 s on 2 quiet cores (2,800 steps), the 20 run
# on SQLite and PostgreSQL side by side about 28 s (900 steps on each); wider runs (100 and 30, 90 and 120
# side by side) found nothing more. derandomize: the same sequences every run, on every store.
STEPS = 50
SEQUENCES = {"sqlite": 60, "postgresql": 20}


def model_settings(store: str) -> settings:
    return settings(
        max_examples=SEQUENCES[store],
        stateful_step_count=STEPS,
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


WORDS = ("harbor", "ferry", "quartz", "lamp", "cobalt", "market", "nickel", "amber")  # no agent's name, no stem clash
KEYS = ("task", "mood", "plan")
IDEMPOTENCY_KEYS = ("run-1", "run-2", "run-3")
SCOPES = ("own", "shared", "shared_except_self")
TIER_SETS = ("long,short", "long", "short", "episodic", "long,short,episodic", "durable,long", "durable")
EVENT_TIERS = "long,short,episodic,durable"

EXPIRY_AHEAD = datetime.timedelta(milliseconds=100)  # past the sweep under way when the fleet's write commits
BACK_DATED = datetime.timedelta(minutes=5)  # before the sweep's last run: logged from the late list
texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join)
agents = st.sampled_from(AGENTS)
tag_sets = st.sampled_from([(), ("ops",), ("net", "ops")])
picks = st.integers(0, 40)  # an index into the rows the model knows; past them: an id nothing holds


def token_of(agent: str) -> str:
    return f"{agent}-model-token"


# ==== The model: what the rules say must be true ====


@dataclass
class Row:
    tier: str
    id: int
    agent: str
    text: str
    words: frozenset[str]
    extra: dict = field(default_factory=dict)  # short: key; long: fact, confidence; episodic: content, key


@dataclass
class Model:
    rows: dict[tuple[str, int], Row] = field(default_factory=dict)  # live: recall may show them
    expired: dict[tuple[str, int], Row] = field(default_factory=dict)  # short rows past expiry, still stored
    deleted: dict[tuple[str, int], Row] = field(default_factory=dict)  # delete_short: gone, not forgotten
    forgotten: dict[tuple[str, int], Row] = field(default_factory=dict)
    archived: dict[tuple[str, int], Row] = field(default_factory=dict)  # episodes `purge` moved to the archive
    sharing: dict[str, bool] = field(default_factory=dict)
    known_ids: dict[str, set[int]] = field(default_factory=lambda: {"short": set(), "long": set(), "episodic": set()})
    readers: dict[tuple[str, int], set[str]] = field(default_factory=dict)  # agents other than its writer shown it
    notices: dict[str, dict[tuple[str, int], str]] = field(default_factory=dict)  # open: reader -> row -> kind
    audit: dict[str, collections.Counter] = field(default_factory=dict)  # author -> (reader, episode id) reads
    written: list[tuple[str, int]] = field(default_factory=list)  # rows created or changed, in order
    read_up_to: dict[str, int] = field(default_factory=dict)  # how much of `written` each agent's events covered

    def shown(self, reader: str, row: Row) -> None:
        """A row handed to a reader: a delivery (its notices follow), and a foreign episode's audited read."""
        if row.agent == reader or row.tier == "durable":
            return
        self.readers.setdefault((row.tier, row.id), set()).add(reader)
        if row.tier == "episodic":
            self.audit.setdefault(row.agent, collections.Counter())[(reader, row.id)] += 1

    def notify(self, key: tuple[str, int], kind: str) -> None:
        """Every agent shown the row gets one open notice of it, the newest kind."""
        for reader in self.readers.get(key, ()):
            self.notices.setdefault(reader, {})[key] = kind

    def every(self) -> list[Row]:
        """Every row ever written, in a fixed order: the rules pick forget's and promote's targets from it."""
        seen = {**self.rows, **self.expired, **self.deleted, **self.forgotten, **self.archived}
        return [seen[key] for key in sorted(seen)]

    def holder(self, key: tuple[str, int]) -> Row | None:
        found = self.rows.get(key) or self.expired.get(key) or self.deleted.get(key) or self.archived.get(key)
        return found or self.forgotten.get(key)

    def short_of(self, agent: str, key: str) -> Row | None:
        """The stored short row of (agent, key), expired or not."""
        for row in itertools.chain(self.rows.values(), self.expired.values()):
            if row.tier == "short" and row.agent == agent and row.extra["key"] == key:
                return row
        return None

    def long_of(self, agent: str, fact: str) -> Row | None:
        for row in self.rows.values():
            if row.tier == "long" and row.agent == agent and row.text == fact:
                return row
        return None

    def episode_of(self, agent: str, key: str) -> Row | None:
        """The episode an idempotency key names, in the hot table or the archive (the key holds there too)."""
        for row in itertools.chain(self.rows.values(), self.archived.values()):
            if row.tier == "episodic" and row.agent == agent and row.extra.get("key") == key:
                return row
        return None

    def visible(self, caller: str, row: Row, scope: str, tiers: set[str]) -> bool:
        """Recall's rule: tier asked for, scope, the episodic opt-in, a persona only its own agent's."""
        if row.tier not in tiers:
            return False
        if row.tier == "durable":
            return row.agent == caller and scope != "shared_except_self"
        if scope == "own" and row.agent != caller or scope == "shared_except_self" and row.agent == caller:
            return False
        return row.tier != "episodic" or row.agent == caller or self.sharing.get(row.agent, False)

    def forgotten_texts(self) -> set[str]:
        """Texts only forgotten rows held: no read may show them again."""
        kept = (self.rows, self.expired, self.deleted, self.archived)
        live = {row.text for row in itertools.chain.from_iterable(rows.values() for rows in kept)}
        return {row.text for row in self.forgotten.values()} - live

    def new_id(self, tier: str, row_id: int) -> None:
        assert row_id not in self.known_ids[tier], f"{tier} id {row_id} handed out twice"
        assert all(row_id > known for known in self.known_ids[tier]), f"{tier} id {row_id} not past the others"
        self.known_ids[tier].add(row_id)


# ==== One store under test ====


@dataclass
class Side:
    name: str
    url: str
    server: RunningServer
    close: Callable[[], None]
    cursors: dict[str, int] = field(default_factory=dict)
    seen_events: dict[str, set[int]] = field(default_factory=dict)

    def call(self, method: str, path: str, caller: str, body: Any = None, **query: Any) -> Any:
        """One request with the caller's token (the query names the agent, as callers do)."""
        headers = {"Authorization": f"Bearer {token_of(caller)}"}
        query = {k: v for k, v in query.items() if v is not None}
        return self.server.request(method, path, body=body, query=query or None, headers=headers)


def open_sqlite(folder: Path, n: int) -> Side:
    tokens = folder / f"tokens-{n}"
    write_tokens(tokens, {token_of(agent): agent for agent in AGENTS})
    url = str(folder / f"model-{n}.db")
    running = start_server(url, rerank=False, tokens_file=str(tokens))
    return Side("sqlite", url, running, functools.partial(stop_server, running))


def open_postgresql(cluster: Any) -> Side:
    url = cluster.fresh_database()
    store = solos_memory.open_store(solos_memory.Config(db=url), admin=True)
    try:
        for agent in AGENTS:  # PostgreSQL keeps tokens in the database, so every copy agrees
            store.keep_token(solos_store.sha256_text(token_of(agent)), agent)
    finally:
        store.close()
    running = start_server(url, rerank=False)

    def close() -> None:
        stop_server(running)
        cluster.drop_database(url)

    return Side("postgresql", url, running, close)


def persona_rows(url: str) -> list[dict]:
    """Each agent's persona, as the fleet writes them (the service never writes durable records)."""
    return [
        direct(
            url,
            "INSERT INTO memory_durable (key, value) VALUES (?, ?) RETURNING id",
            (f"persona/{agent}", f"{agent} persona {WORDS[i]}"),
        )[0]
        for i, agent in enumerate(AGENTS)
    ]


# ==== The machine ====


class MemoryMachine(RuleBasedStateMachine):
    """Every step runs on each side; the first side is the reference the others' answers are compared with."""

    open_sides: Callable[[], list[Side]]  # set by the test: a fresh database per side for each sequence
    steps: list[int]  # steps run, counted for the report

    def __init__(self) -> None:
        super().__init__()
        self.sides = type(self).open_sides()
        self.model = Model()

    def teardown(self) -> None:
        for side in self.sides:
            side.close()

    @initialize()
    def personas(self) -> None:
        answers = [persona_rows(side.url) for side in self.sides]
        assert all(answer == answers[0] for answer in answers), answers
        for agent, row in zip(AGENTS, answers[0], strict=True):
            text = f"{agent} persona {WORDS[AGENTS.index(agent)]}"
            self.model.rows[("durable", row["id"])] = Row("durable", row["id"], agent, text, frozenset(text.split()))
        for side in self.sides:
            side.cursors = {agent: 0 for agent in AGENTS}
            side.seen_events = {agent: set() for agent in AGENTS}

    # ---- helpers ----

    def each(self, method: str, path: str, caller: str, body: Any = None, **query: Any) -> list[Any]:
        """The call on every side; their statuses must agree."""
        type(self).steps.append(1)
        replies = [side.call(method, path, caller, body, **query) for side in self.sides]
        statuses = [(side.name, reply.status) for side, reply in zip(self.sides, replies, strict=True)]
        assert len({status for _, status in statuses}) == 1, (method, path, body, query, statuses, replies[0].body)
        return replies

    def same(self, what: str, answers: list[Any]) -> None:
        """What each side answered, reduced to what must not depend on the store, is the same."""
        named = [(side.name, answer) for side, answer in zip(self.sides, answers, strict=True)]
        assert all(answer == answers[0] for answer in answers), (what, named)

    def refused(self, status: int, method: str, path: str, caller: str, body: Any = None, **query: Any) -> None:
        """A call the rules refuse: that status on every side, and no row of any write table changed."""
        before = [snapshot(side.url) for side in self.sides]
        replies = self.each(method, path, caller, body, **query)
        assert replies[0].status == status, (method, path, body, query, replies[0].status, replies[0].body)
        for side, reply, earlier in zip(self.sides, replies, before, strict=True):
            assert reply.body["error"]["status"] == status, reply.body
            after = snapshot(side.url)
            changed = {t: (earlier[t], after[t]) for t in after if earlier[t] != after[t]}
            assert not changed, (side.name, method, path, body, query, changed)

    def wrote(self, replies: list[Any], tier: str, expected: str, known: Row | None) -> int:
        """A write's answer on every side: the status the model expects, the row id it knows (or a new one)."""
        bodies = [reply.body for reply in replies]
        for reply in replies:
            assert reply.status == (201 if expected == "created" else 200), reply.body
            assert reply.body["status"] == expected, (expected, reply.body)
            assert reply.body["tier"] == tier
        self.same("write", [(b["status"], b["id"]) for b in bodies])
        row_id = bodies[0]["id"]
        if expected in ("created", "updated"):
            self.model.written.append((tier, row_id))
        if known is not None:
            assert row_id == known.id, (known, bodies[0])
        else:
            self.model.new_id(tier, row_id)
        return row_id

    # ---- writes ----

    @rule(
        agent=agents,
        key=st.sampled_from(KEYS),
        value=texts,
        ttl=st.sampled_from([None, 3600, 86400 * 30]),
        tags=tag_sets,
    )
    def write_short(self, agent: str, key: str, value: str, ttl: int | None, tags: tuple[str, ...]) -> None:
        known = self.model.short_of(agent, key)
        body = {"agent": agent, "key": key, "value": value, "ttl_s": ttl, "tags": list(tags)}
        row_id = self.wrote(
            self.each("POST", "/v1/short", agent, body), "short", "updated" if known else "created", known
        )
        self.model.expired.pop(("short", row_id), None)  # written again: its TTL starts over
        if known is not None and known.text != value:
            self.model.notify(("short", row_id), "superseded")
        extra = {"key": key, "tags": tags}
        self.model.rows[("short", row_id)] = Row("short", row_id, agent, value, frozenset(value.split()), extra)

    @rule(agent=agents, fact=texts, confidence=st.sampled_from([None, 0.5, 0.9]), tags=tag_sets)
    def write_long(self, agent: str, fact: str, confidence: float | None, tags: tuple[str, ...]) -> None:
        known = self.model.long_of(agent, fact)
        extra = {"confidence": confidence, "tags": tags}
        same = known is not None and known.extra == extra
        expected = "created" if known is None else "unchanged" if same else "updated"
        body = {"agent": agent, "fact": fact, "confidence": confidence, "tags": list(tags)}
        row_id = self.wrote(self.each("POST", "/v1/long", agent, body), "long", expected, known)
        self.model.rows[("long", row_id)] = Row("long", row_id, agent, fact, frozenset(fact.split()), extra)

    @rule(
        agent=agents,
        summary=texts,
        outcome=st.sampled_from([None, "ok"]),
        key=st.sampled_from((None,) + IDEMPOTENCY_KEYS),
    )
    def write_episode(self, agent: str, summary: str, outcome: str | None, key: str | None) -> None:
        body = {"agent": agent, "event_type": "task", "summary": summary, "outcome": outcome, "idempotency_key": key}
        content = (summary, outcome)
        known = self.model.episode_of(agent, key) if key else None
        if known is not None and known.extra["content"] != content:
            self.refused(409, "POST", "/v1/episodic", agent, body)
            return
        expected = "unchanged" if known else "created"
        row_id = self.wrote(self.each("POST", "/v1/episodic", agent, body), "episodic", expected, known)
        extra = {"content": content, "key": key}
        self.model.rows[("episodic", row_id)] = Row(
            "episodic", row_id, agent, summary, frozenset(summary.split()), extra
        )

    @rule(agent=agents, key=st.sampled_from(KEYS))
    def delete_short(self, agent: str, key: str) -> None:
        known = self.model.short_of(agent, key)
        if known is None:
            self.refused(404, "DELETE", "/v1/short", agent, agent=agent, key=key)
            return
        replies = self.each("DELETE", "/v1/short", agent, agent=agent, key=key)
        was_expired = ("short", known.id) in self.model.expired
        for reply in replies:
            assert reply.status == 200, reply.body
            assert (reply.body["status"], reply.body["id"], reply.body["was_expired"]) == (
                "deleted",
                known.id,
                was_expired,
            )
        self.model.rows.pop(("short", known.id), None)
        self.model.expired.pop(("short", known.id), None)
        self.model.deleted[("short", known.id)] = known

    @rule(agent=agents, on=st.booleans())
    def set_sharing(self, agent: str, on: bool) -> None:
        expected = "updated" if agent in self.model.sharing else "created"
        replies = self.each("PUT", "/v1/sharing", agent, {"agent": agent, "episodic": on})
        for reply in replies:
            assert reply.body["status"] == expected, reply.body
        self.model.sharing[agent] = on

    @rule(agent=agents, key=st.sampled_from(KEYS), back=st.booleans())
    def expire(self, agent: str, key: str, back: bool) -> None:
        """The clock reaches a short row's expiry: the fleet sets it a moment ahead (the service's sweep logs it
        once the clock passes it), or back-dates it past the sweep's last run (logged by the next sweep)."""
        known = self.model.short_of(agent, key)
        if known is None or ("short", known.id) in self.model.expired:
            return
        type(self).steps.append(1)
        when = datetime.datetime.now(datetime.UTC) + (-BACK_DATED if back else EXPIRY_AHEAD)
        stamp = when.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        logged = "SELECT count(*) AS n FROM memory_event WHERE kind = 'expire' AND tier = 'short' AND row_id = ?"
        before = {side.name: direct(side.url, logged, (known.id,))[0]["n"] for side in self.sides}
        for side in self.sides:
            direct(side.url, "UPDATE memory_short SET expires_at = ? WHERE id = ?", (stamp, known.id))
        for side in self.sides:
            swept = functools.partial(direct, side.url, logged, (known.id,))
            n = before[side.name]
            wait_until(lambda swept=swept, n=n: swept()[0]["n"] > n, f"{side.name}'s expiry sweep", 10)
        del self.model.rows[("short", known.id)]
        self.model.expired[("short", known.id)] = known

    @rule(agent=agents)
    def purge(self, agent: str) -> None:
        """The daily purge, on a later day: an agent's episodes aged past the archive age move to the archive, expired
        short rows go. (On PostgreSQL a job runs once per period whichever copy runs it: its runs are cleared, as a
        day gone by would let it run again.)"""
        type(self).steps.append(1)
        for side in self.sides:
            direct(side.url, "DELETE FROM memory_job_run")
            aged = "UPDATE memory_episodic SET timestamp = '2020-01-01T00:00:00.000Z' WHERE agent = ?"
            direct(side.url, aged, (agent,))
            assert solos_memory.main(["purge", "--db", side.url]) == 0
        for key, row in list(self.model.rows.items()):
            if row.tier == "episodic" and row.agent == agent:
                self.model.archived[key] = self.model.rows.pop(key)
        for key in list(self.model.expired):
            self.model.deleted[key] = self.model.expired.pop(key)

    @rule(agent=agents, picked=st.sets(picks, min_size=1, max_size=3), fact=st.sampled_from([None, "amber lamp"]))
    def promote(self, agent: str, picked: set[int], fact: str | None) -> None:
        every = [row for row in self.model.every() if row.tier == "episodic"]
        ids = sorted({every[p].id if p < len(every) else 900 + p for p in picked})
        rows = [self.model.rows.get(("episodic", i)) or self.model.archived.get(("episodic", i)) for i in ids]
        body = {"agent": agent, "ids": ids, "fact": fact}
        if any(row is None or row.agent != agent and not self.model.sharing.get(row.agent, False) for row in rows):
            self.refused(404, "POST", "/v1/promote", agent, body)  # no such episode, or one the caller cannot see
            return
        if any(row.agent != agent for row in rows if row):
            self.refused(403, "POST", "/v1/promote", agent, body)
            return
        text = fact or "; ".join(row.text for row in rows if row)
        known = self.model.long_of(agent, text)
        replies = self.each("POST", "/v1/promote", agent, body)
        for reply in replies:
            assert reply.body["status"] == ("linked" if known else "created"), reply.body
            assert reply.body["sources"] == ids
        self.same("promote", [(r.body["status"], r.body["id"]) for r in replies])
        row_id = replies[0].body["id"]
        if known:
            assert row_id == known.id
            return
        self.model.new_id("long", row_id)
        self.model.written.append(("long", row_id))
        words = frozenset(text.replace(";", " ").split())
        extra = {"confidence": None, "tags": ("promoted",)}
        self.model.rows[("long", row_id)] = Row("long", row_id, agent, text, words, extra)

    @rule(agent=agents, pick=picks)
    def forget(self, agent: str, pick: int) -> None:
        every = [row for row in self.model.every() if row.tier != "durable"]
        if pick >= len(every):
            self.refused(404, "DELETE", "/v1/memory", agent, agent=agent, tier="long", id=800 + pick)
            return
        row = every[pick]
        key = (row.tier, row.id)
        query = {"agent": agent, "tier": row.tier, "id": row.id}
        if row.agent != agent:
            seen = key in self.model.rows or key in self.model.archived  # not expired, deleted or forgotten
            seen = seen and self.model.visible(agent, row, "shared", {row.tier})
            self.refused(403 if seen else 404, "DELETE", "/v1/memory", agent, **query)
            return
        replies = self.each("DELETE", "/v1/memory", agent, **query)
        for reply in replies:
            assert reply.status == 200, reply.body
            assert (reply.body["status"], reply.body["id"], reply.body["tier"]) == ("forgotten", row.id, row.tier)
        self.same("forget", [(r.body["content_hash"], r.body["retraction_id"]) for r in replies])
        if key not in self.model.forgotten:
            self.model.notify(key, "forgotten")
        for kept in (self.model.rows, self.model.expired, self.model.deleted, self.model.archived):
            kept.pop(key, None)
        self.model.forgotten[key] = row

    @rule(agent=agents, tiers=st.sampled_from(["durable", "durable,long"]))
    def refused_durable(self, agent: str, tiers: str) -> None:
        """Another agent's persona is never asked for, and durable records are never forgotten."""
        self.refused(403, "GET", "/v1/recall", agent, agent=agent, q="persona", tiers=tiers, scope="shared_except_self")
        durable = next(row for row in self.model.rows.values() if row.tier == "durable" and row.agent == agent)
        self.refused(403, "DELETE", "/v1/memory", agent, agent=agent, tier="durable", id=durable.id)

    @rule(agent=agents, other=agents)
    def impersonate(self, agent: str, other: str) -> None:
        """A token speaks for its own agent only: naming another is refused and writes nothing."""
        if agent == other:
            return
        self.refused(403, "POST", "/v1/long", agent, {"agent": other, "fact": "ferry impostor"})
        self.refused(403, "GET", "/v1/recall", agent, agent=other, q="ferry")

    # ---- reads ----

    @rule(
        agent=agents,
        q=st.sampled_from(("",) + WORDS),
        scope=st.sampled_from(SCOPES),
        tiers=st.sampled_from(TIER_SETS),
        tags=st.sampled_from([None, "ops", "net,promoted"]),
        archive=st.booleans(),
    )
    def recall(self, agent: str, q: str, scope: str, tiers: str, tags: str | None, archive: bool) -> None:
        asked = set(tiers.split(","))
        if "durable" in asked and scope == "shared_except_self":
            self.refused(403, "GET", "/v1/recall", agent, agent=agent, q=q, tiers=tiers, scope=scope)
            return
        query = {"q": q, "scope": scope, "tiers": tiers, "k": 100, "tags": tags, "archive": str(archive).lower()}
        if archive and "episodic" not in asked:  # the archive holds episodes only
            self.refused(400, "GET", "/v1/recall", agent, agent=agent, **query)
            return
        replies = self.each("GET", "/v1/recall", agent, agent=agent, **query)
        pool = {**self.model.rows, **(self.model.archived if archive else {})}
        visible = [row for row in pool.values() if self.model.visible(agent, row, scope, asked)]
        if tags:  # only rows carrying one of them
            visible = [row for row in visible if set(tags.split(",")) & set(row.extra.get("tags", ()))]
        for side, reply in zip(self.sides, replies, strict=True):
            assert reply.status == 200, reply.body
            shown = self.check_rows(side, agent, reply.body["results"], scope, asked, pool)
            if tags:
                assert all(set(tags.split(",")) & set(row.extra.get("tags", ())) for row in shown), (side.name, shown)
            texts = {row.text for row in shown}
            for row in visible:  # every match is recalled, or collapsed into a shown row of the same text
                if row.tier != "durable" and (not q or q in row.words):
                    assert (row.tier, row.id) in {(r.tier, r.id) for r in shown} or row.text in texts, (
                        side.name,
                        "missing",
                        row,
                        reply.body["results"],
                    )
        self.same("recall", [[(r["tier"], r["id"]) for r in reply.body["results"]] for reply in replies])
        for result in replies[0].body["results"]:
            self.model.shown(agent, pool[(result["tier"], result["id"])])

    def check_rows(
        self, side: Side, caller: str, results: list[dict], scope: str, tiers: set[str], pool: dict
    ) -> list[Row]:
        """Every recalled row exists in the model (in `pool`: the hot rows, and the archive when asked for), may be
        seen by the caller, and is labelled right."""
        shown = []
        for result in results:
            key = (result["tier"], result["id"])
            assert key not in self.model.forgotten, (side.name, "a forgotten row came back", result)
            row = pool.get(key)
            assert row is not None, (side.name, "a row the model does not hold", result, self.model.holder(key))
            assert result.get("archived", False) == (key in self.model.archived), (side.name, result)
            assert self.model.visible(caller, row, scope, tiers), (side.name, caller, scope, tiers, result)
            assert (result["agent"], result["foreign"]) == (row.agent, row.agent != caller), (side.name, result)
            assert result["text"] == row.text, (side.name, result, row)
            shown.append(row)
        return shown

    @rule(agent=agents, q=st.sampled_from(("",) + WORDS))
    def recall_as_of(self, agent: str, q: str) -> None:
        """As of now: no forgotten row, in any version; what shows is the caller's to see."""
        now = solos_store.utc_now()
        replies = self.each(
            "GET", "/v1/recall/as_of", agent, agent=agent, as_of=now, q=q, k=100, tiers="long,short,episodic"
        )
        for side, reply in zip(self.sides, replies, strict=True):
            assert reply.status == 200, reply.body
            for result in reply.body["results"]:
                key = (result["tier"], result["id"])
                assert key not in self.model.forgotten, (side.name, "as-of shows a forgotten row", result)
                row = self.model.holder(key)
                assert row is not None and row.agent == result["agent"], (side.name, result, row)
                if key in self.model.rows:
                    assert self.model.visible(agent, row, "shared", {"long", "short", "episodic"}), (side.name, result)
            for gone in reply.body["retracted"]:
                assert "text" not in gone, gone
        self.same("as_of", [sorted((r["tier"], r["id"]) for r in reply.body["results"]) for reply in replies])
        for result in replies[0].body["results"]:
            row = self.model.holder((result["tier"], result["id"]))
            assert row is not None
            self.model.shown(agent, row)

    @rule(agent=agents, limit=st.sampled_from([3, 1000]))
    def read_events(self, agent: str, limit: int) -> None:
        """From the caller's cursor to the end: only what it may see, each event once, in order."""
        type(self).steps.append(1)
        answers = []
        due = {  # rows written since the last read, still there and visible: their write (or an update) comes
            key
            for key in self.model.written[self.model.read_up_to.get(agent, 0) :]
            if key in self.model.rows
            and self.model.visible(agent, self.model.rows[key], "shared", set(EVENT_TIERS.split(",")))
        }
        for side in self.sides:
            events_settled(side.url)
            seen, side.cursors[agent] = self.event_pages(
                side, agent, side.cursors[agent], limit=limit, tiers=EVENT_TIERS
            )
            ids = [event["id"] for event in seen]
            assert not set(ids) & side.seen_events[agent], (side.name, "an event handed out again")
            side.seen_events[agent] |= set(ids)
            for event in seen:
                self.check_event(side, agent, event)
            missing = due - {(e["tier"], e["row_id"]) for e in seen if e["kind"] in ("write", "update")}
            assert not missing, (side.name, "writes never handed out", agent, missing, seen)
            answers.append([(e["kind"], e["tier"], e["row_id"], e["agent"]) for e in seen])
            delivered = [self.model.rows[(e["tier"], e["row_id"])] for e in seen if e["row"] is not None]
        self.same("events", answers)
        self.model.read_up_to[agent] = len(self.model.written)
        for row in delivered:
            self.model.shown(agent, row)

    @rule(
        agent=agents,
        scope=st.sampled_from(SCOPES),
        writers=st.sets(agents, max_size=2),
        limit=st.sampled_from([4, 1000]),
    )
    def read_events_filtered(self, agent: str, scope: str, writers: set[str], limit: int) -> None:
        """Every event from the first, by scope and writers: only those, each once, in order, and a write or update
        of every row that is there now and matches."""
        type(self).steps.append(1)
        query = {"scope": scope, "writers": ",".join(sorted(writers)) or None, "limit": limit}
        tiers = set(EVENT_TIERS.split(","))
        if scope == "shared_except_self":  # another agent's persona is never asked for
            tiers.discard("durable")
        answers = []
        for side in self.sides:
            events_settled(side.url)
            seen, _ = self.event_pages(side, agent, 0, tiers=",".join(sorted(tiers)), **query)
            for event in seen:
                self.check_event(side, agent, event)
                if event["kind"] == "notice":
                    continue
                assert event["tier"] in tiers, (side.name, event)
                if event["tier"] != "durable":
                    assert not writers or event["agent"] in writers, (side.name, writers, event)
                    mine = event["agent"] == agent
                    assert (scope, mine) not in (("own", False), ("shared_except_self", True)), (side.name, event)
            due = {
                key
                for key, row in self.model.rows.items()
                if self.model.visible(agent, row, scope, tiers)
                and (row.tier == "durable" or not writers or row.agent in writers)
            }
            missing = due - {(e["tier"], e["row_id"]) for e in seen if e["kind"] in ("write", "update")}
            assert not missing, (side.name, "rows whose writes never came", agent, query, missing)
            answers.append([(e["kind"], e["tier"], e["row_id"], e["agent"]) for e in seen])
            delivered = [self.model.rows[(e["tier"], e["row_id"])] for e in seen if e["row"] is not None]
        self.same("events", answers)
        for row in delivered:
            self.model.shown(agent, row)

    def event_pages(self, side: Side, agent: str, since: int, **query: Any) -> tuple[list[dict], int]:
        """read_events from `since` to the end, page by page: the events (each id once, increasing), the cursor."""
        seen: list[dict] = []
        while True:
            reply = side.call("GET", "/v1/events", agent, agent=agent, since=since, **query)
            assert reply.status == 200, reply.body
            seen += reply.body["events"]
            if reply.body["next_since"] == since:
                break
            assert reply.body["next_since"] > since
            since = reply.body["next_since"]
        ids = [event["id"] for event in seen]
        assert ids == sorted(set(ids)), (side.name, "events out of order or twice", ids)
        return seen, since

    def check_event(self, side: Side, caller: str, event: dict) -> None:
        if event["kind"] == "notice":  # the caller's own retraction notice, of a row it was shown
            notice = event["notice"]
            assert event["agent"] == caller and event["row"] is None, (side.name, event)
            shown_to = self.model.readers.get((notice["tier"], notice["row_id"]), set())
            assert caller in shown_to and notice["kind"] in ("forgotten", "superseded"), (side.name, event)
            return
        key = (event["tier"], event["row_id"])
        assert event["foreign"] == (event["agent"] != caller), (side.name, event)
        row = self.model.holder(key)
        assert row is not None and row.agent == event["agent"], (side.name, "an event of a row never written", event)
        if event["tier"] == "durable":
            assert event["agent"] == caller, (side.name, "another agent's persona", event)
        if event["tier"] == "episodic" and event["agent"] != caller:
            assert self.model.sharing.get(event["agent"]), (side.name, "an episode its author does not share", event)
        if event["kind"] in ("write", "update"):
            assert event["row"] is not None, event
            assert key in self.model.rows, (side.name, "a write event of a row gone", event, self.model.holder(key))
            assert event["row"]["text"] == row.text, (side.name, event, row)
        else:
            assert event.get("row") is None, (side.name, "a removal carries its row", event)

    @rule(agent=agents)
    def stats(self, agent: str) -> None:
        """The stats an agent reads hold no forgotten text."""
        replies = self.each("GET", "/v1/stats", agent)
        gone = self.model.forgotten_texts()
        for side, reply in zip(self.sides, replies, strict=True):
            assert reply.status == 200, reply.body
            raw = reply.raw.decode()
            assert not [text for text in gone if json.dumps(text)[1:-1] in raw], (side.name, gone)

    @rule(agent=agents, ack=st.booleans())
    def read_notices(self, agent: str, ack: bool) -> None:
        """Each agent shown a row it did not write holds one open notice of its newest forget or rewrite."""
        replies = self.each("GET", "/v1/notices", agent, agent=agent, limit=1000)
        expected = self.model.notices.get(agent, {})
        for side, reply in zip(self.sides, replies, strict=True):
            assert reply.status == 200, reply.body
            found = {(n["tier"], n["row_id"]): n["kind"] for n in reply.body["notices"]}
            assert len(found) == len(reply.body["notices"]), (side.name, "two open notices of one row", reply.body)
            assert found == expected, (side.name, agent, found, expected)
            for notice in reply.body["notices"]:
                assert notice["writer"] == self.model.holder((notice["tier"], notice["row_id"])).agent, notice
        if ack and expected:
            for side, reply in zip(self.sides, replies, strict=True):
                ids = [n["id"] for n in reply.body["notices"]]
                acked = side.call("POST", "/v1/notices/ack", agent, {"agent": agent, "ids": ids})
                assert (acked.status, acked.body["acked"]) == (200, len(ids)), acked.body
            self.model.notices[agent] = {}

    @rule(agent=agents)
    def read_audit(self, agent: str) -> None:
        """Every foreign episode handed out was audited first, once per hand-over, to its author alone."""
        replies = self.each("GET", "/v1/audit", agent, agent=agent, limit=1000)
        expected = self.model.audit.get(agent, collections.Counter())
        for side, reply in zip(self.sides, replies, strict=True):
            reads = reply.body["reads"]
            assert all(read["author"] == agent for read in reads), (side.name, reads)
            found = collections.Counter((read["reader"], read["row_id"]) for read in reads)
            assert found == expected, (side.name, agent, found, expected)

    @rule()
    def row_counts(self) -> None:
        """The stats count the rows recall may show, per tier (expired short rows are not, though stored)."""
        replies = self.each("GET", "/v1/stats", AGENTS[0])
        counts = collections.Counter(row.tier for row in self.model.rows.values() if row.tier != "durable")
        for side, reply in zip(self.sides, replies, strict=True):
            rows = reply.body["rows"]
            assert {tier: rows[tier] for tier in ("short", "long", "episodic")} == {
                tier: counts[tier] for tier in ("short", "long", "episodic")
            }, (side.name, rows, counts)

    @invariant()
    def forgotten_stay_gone(self) -> None:
        """No stored row of any write table holds a forgotten row's id."""
        if not self.model.forgotten:
            return
        tables = {"short": "memory_short", "long": "memory_longterm", "episodic": "memory_episodic"}
        for side in self.sides:
            for (tier, row_id), _ in self.model.forgotten.items():
                found = direct(side.url, f"SELECT count(*) AS n FROM {tables[tier]} WHERE id = ?", (row_id,))
                assert found[0]["n"] == 0, (side.name, "a forgotten row is still stored", tier, row_id)


# ==== The tests ====


@pytest.fixture
def quick_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """The expiry sweep every 50 ms instead of every second, so an expiry step waits for it briefly."""
    monkeypatch.setattr(solos_events, "SWEEP_S", 0.05)


def run_machine(store: str, open_sides: Callable[[], list[Side]]) -> list[int]:
    steps: list[int] = []
    machine = type("Machine", (MemoryMachine,), {"open_sides": staticmethod(open_sides), "steps": steps})
    run_state_machine_as_test(machine, settings=model_settings(store))
    print(f"model: {len(steps)} steps")
    return steps


def test_every_operation_keeps_to_the_model_on_the_embedded_store(tmp_path, quick_sweep):
    counter = itertools.count()
    steps = run_machine("sqlite", lambda: [open_sqlite(tmp_path, next(counter))])
    assert len(steps) > SEQUENCES["sqlite"] * 10  # the sequences ran their steps


def test_postgresql_answers_every_sequence_as_sqlite_does(tmp_path, pg_cluster, quick_sweep):
    counter = itertools.count()
    steps = run_machine("postgresql", lambda: [open_sqlite(tmp_path, next(counter)), open_postgresql(pg_cluster)])
    assert len(steps) > SEQUENCES["postgresql"] * 10
