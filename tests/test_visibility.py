"""One Visibility, three forms: the SQL `where`, the numpy `mask` and `allows` agree row for row, expiry
included."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import solos_store
from solos_store import TIER_TABLE, Visibility

AGENTS = ("atlas", "sol", "nova", "mira", "kai")
TIERS = [tier for tier in TIER_TABLE.values() if not tier.archived] + [TIER_TABLE[solos_store.ARCHIVE_TIER]]


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """A migrated database; each example writes its rows and sharing inside a transaction it rolls back."""
    path = tmp_path_factory.mktemp("visibility") / "solos.db"
    store = solos_store.Store(str(path), admin=True)
    store.migrate()
    store.register_agents(list(AGENTS))
    conn = sqlite3.connect(path, isolation_level=None, factory=solos_store.PooledConnection)
    conn.row_factory = sqlite3.Row
    conn.queries = solos_store.SQLITE
    yield conn
    conn.close()


PAST, FUTURE = "2000-01-01T00:00:00.000Z", "2999-01-01T00:00:00.000Z"  # an expiry gone by, one to come


def insert(conn: sqlite3.Connection, tier: solos_store.Tier, agent: str, n: int, expired: bool = False) -> None:
    if tier.name == "long":
        conn.execute("INSERT INTO memory_longterm (agent, fact) VALUES (?, ?)", (agent, f"fact {n}"))
    elif tier.name == "short":
        conn.execute(
            "INSERT INTO memory_short (agent, key, value, expires_at) VALUES (?, ?, 'v', ?)",
            (agent, f"key {n}", PAST if expired else FUTURE),
        )
    else:
        conn.execute(
            f"INSERT INTO {tier.table} (id, agent, event_type, summary, timestamp) "
            "VALUES (?, ?, 'task', 's', '2026-01-01T00:00:00.000Z')",
            (100_000 + n, agent),
        )


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(
    writers=st.lists(st.tuples(st.sampled_from(AGENTS), st.booleans()), min_size=1, max_size=12),
    sharing=st.dictionaries(st.sampled_from(AGENTS), st.booleans(), max_size=len(AGENTS)),
    caller=st.sampled_from(AGENTS),
    scope=st.sampled_from(solos_store.SCOPES),
    tier=st.sampled_from(TIERS),
)
def test_where_mask_and_allows_agree_row_for_row(db, writers, sharing, caller, scope, tier):
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("DELETE FROM episodic_sharing")
        db.executemany(
            "INSERT INTO episodic_sharing (agent, shared) VALUES (?, ?)", [(a, int(s)) for a, s in sharing.items()]
        )
        db.execute(f"DELETE FROM {tier.table}")
        for n, (agent, expired) in enumerate(writers):
            insert(db, tier, agent, n, expired)
        seen = Visibility.read(db, caller, scope)
        where, params = seen.where(tier)
        sql = f"SELECT t.id, t.agent FROM {tier.table} t {'WHERE ' + ' AND '.join(where) if where else ''}"
        by_sql = {row["id"] for row in db.execute(sql, params)}
        expiry = "expires_at" if tier.expires else "NULL"
        rows = db.execute(f"SELECT id, agent, {expiry} AS expires_at FROM {tier.table} ORDER BY id").fetchall()
        agents = np.array([row["agent"] for row in rows], dtype=object)
        expires = np.array([row["expires_at"] or "" for row in rows], dtype=object)
        by_mask = {row["id"] for row, kept in zip(rows, seen.mask(tier, agents, expires)) if kept}
        by_row = {row["id"] for row in rows if seen.allows(tier.name, row["agent"], row["expires_at"])}
        assert by_sql == by_mask == by_row
        opted_in = {agent for agent, shared in sharing.items() if shared}
        for row in rows:  # and each is the rule itself
            visible = row["id"] in by_row
            foreign = row["agent"] != caller
            expected = (
                {"own": not foreign, "shared": True, "shared_except_self": foreign}[scope]
                and (not tier.opt_in or not foreign or row["agent"] in opted_in)
                and row["expires_at"] != PAST
            )
            assert visible == expected, (scope, tier.name, row["agent"], caller, opted_in)
    finally:
        db.execute("ROLLBACK")


def test_a_persona_is_its_own_agents_alone():
    for scope in solos_store.SCOPES:
        seen = Visibility("atlas", scope)
        assert seen.allows("durable", "atlas") and not seen.allows("durable", "sol")
    with pytest.raises(solos_store.Forbidden):
        solos_store.refuse_foreign_persona(("long", "durable"), "shared_except_self")
