"""The fleet's Qdrant memory: point ids, the canonical writer, import, the mirror and its outbox."""

from __future__ import annotations

import pytest

import solos_store_memory
from solos_store_memory import StoreMemoryError, legacy_point_id, point_id, store_memory

PREFIX = "The staging cluster's ingress controller was moved to the new node pool during the Tuesday maintenance"
FACT_A = PREFIX + " window, and its certificates were rotated."
FACT_B = PREFIX + " window, but its certificates still expire in March."


def test_two_facts_sharing_a_100_character_prefix_get_two_ids():
    assert FACT_A[:100] == FACT_B[:100] and FACT_A != FACT_B
    # The node's old scheme gives both the same point: the second overwrote the first.
    assert legacy_point_id("atlas", "infra", FACT_A) == legacy_point_id("atlas", "infra", FACT_B)
    assert point_id("atlas", "long", FACT_A) != point_id("atlas", "long", FACT_B)
    # The id depends on writer and tier too, and on nothing else.
    assert point_id("atlas", "long", FACT_A) != point_id("sol", "long", FACT_A)
    assert point_id("atlas", "long", FACT_A) != point_id("atlas", "episodic", FACT_A)
    assert point_id("atlas", "long", FACT_A) == point_id("atlas", "long", FACT_A)


def test_store_memory_writes_through_the_service_and_both_colliding_facts_survive(server):
    first = store_memory("atlas", "infra", FACT_A, "shared", 0.8, url=server.url)
    second = store_memory("atlas", "infra", FACT_B, url=server.url)
    assert (first, second) == (point_id("atlas", "long", FACT_A), point_id("atlas", "long", FACT_B))
    again = store_memory("atlas", "infra", FACT_A, "team", 0.9, url=server.url)
    assert again == first
    with server.db() as conn:
        rows = conn.execute(
            "SELECT agent, topic, fact, source, confidence, tags FROM memory_longterm ORDER BY id"
        ).fetchall()
    assert [tuple(r) for r in rows] == [
        ("atlas", "infra", FACT_A, "store_memory", 0.9, '["scope:team"]'),
        ("atlas", "infra", FACT_B, "store_memory", 0.5, '["scope:shared"]'),
    ]
    recalled = server.recall("sol", "ingress certificates", k=5).body["results"]
    assert sorted(r["fact"] for r in recalled) == sorted([FACT_A, FACT_B])
    assert {(r["agent"], r["foreign"]) for r in recalled} == {("atlas", True)}


def test_store_memory_never_truncates_and_reports_the_service_refusal(server):
    long_text = "x" * 8_193  # over the service's 8,192-character fact limit
    with pytest.raises(StoreMemoryError) as refused:
        store_memory("atlas", "infra", long_text, url=server.url)
    assert (refused.value.status, refused.value.field) == (400, "fact")
    with pytest.raises(StoreMemoryError) as unknown:
        store_memory("mallory", "infra", "a fact", url=server.url)
    assert unknown.value.status == 422 and "mallory" in str(unknown.value)
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0] == 0
    # A 3,000-character fact (the old node kept 2,000) comes back whole.
    whole = "y" * 2_999 + "z"
    store_memory("atlas", "infra", whole, url=server.url)
    with server.db() as conn:
        assert conn.execute("SELECT fact FROM memory_longterm").fetchone()[0] == whole


def test_store_memory_names_an_unreachable_service():
    with pytest.raises(StoreMemoryError, match="unreachable"):
        store_memory("atlas", "infra", "a fact", url="http://127.0.0.1:9", timeout=2)


def test_the_writer_module_imports_nothing_of_the_service():
    source = open(solos_store_memory.__file__).read()
    assert "solos_memory" not in source.split('"""', 2)[2]
