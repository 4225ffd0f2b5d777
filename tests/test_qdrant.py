"""The fleet's Qdrant memory: point ids, the canonical writer, import, the mirror and its outbox."""

from __future__ import annotations

import hashlib
import json
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import AGENTS, REQUIRE_ALL, ROOT, drained, forget, points_in, records_in, stop_server, wait_until

import solos_langgraph
import solos_memory
import solos_qdrant
import solos_store
from solos_client import Client
from solos_langgraph import StoreMemoryError, legacy_point_id, point_id, store_memory

PREFIX = "The staging cluster's ingress controller was moved to the new node pool during the Tuesday maintenance"
FACT_A = PREFIX + " window, and its certificates were rotated."
FACT_B = PREFIX + " window, but its certificates still expire in March."


def test_two_facts_sharing_a_100_character_prefix_get_two_ids():
    assert FACT_A[:100] == FACT_B[:100] and FACT_A != FACT_B
    # The node's old scheme gives both the same point: the second overwrote the first.
    assert legacy_point_id("atlas", "infra", FACT_A) == legacy_point_id("atlas", "infra", FACT_B)
    assert point_id("atlas", "long", FACT_A) != point_id("atlas", "long", FACT_B)
    # The id depends on writer and tier too, and on nothing else: it is docs/integrations.md's recipe, so the fleet's
    # other writers derive the same id for the same memory.
    assert point_id("atlas", "long", FACT_A) != point_id("sol", "long", FACT_A)
    assert point_id("atlas", "long", FACT_A) != point_id("atlas", "episodic", FACT_A)
    digest = hashlib.sha256(FACT_A.encode()).hexdigest()
    assert point_id("atlas", "long", FACT_A) == str(uuid.uuid5(uuid.NAMESPACE_URL, f"atlas:long:{digest}"))


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


def test_store_memory_refuses_a_private_memory_rather_than_share_it(server):
    """The node's memory_scope="private" meant its agent's own: a long fact is read by every agent (the import
    leaves such points out for that reason), so the writer refuses it, saying so, and stores nothing."""
    with pytest.raises(StoreMemoryError) as refused:
        store_memory("atlas", "infra", "The vault passphrase is kept in row 7", "private", url=server.url)
    assert refused.value.field == "memory_scope" and "every agent" in str(refused.value)
    assert server.recall("sol", "vault passphrase", k=5).body["results"] == []
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0] == 0


def test_store_memory_names_an_unreachable_service():
    with pytest.raises(StoreMemoryError, match="unreachable"):
        store_memory("atlas", "infra", "a fact", url="http://127.0.0.1:9", timeout=2)


def test_the_writer_module_imports_nothing_of_the_service():
    source = open(solos_langgraph.__file__).read()
    assert "solos_memory" not in source.split('"""', 2)[2]


# ==== Import: the fleet's collection as it is ====

qdrant_client = pytest.importorskip("qdrant_client") if not REQUIRE_ALL else __import__("qdrant_client")
from qdrant_client import QdrantClient, models  # noqa: E402

NEW_SHAPE = [  # what store_memory writes: agent_id, memory_scope, importance_score, content, topic
    ("atlas", "infra", "The backup job runs nightly at 02:00 UTC", "shared", 0.9),
    ("atlas", "infra", FACT_A, "shared", 0.7),
    ("atlas", "infra", FACT_B, "shared", 0.6),  # same legacy id as FACT_A: it overwrites it, as in the fleet
    ("ghost", "ops", "Ghost agents are not in the registry", "shared", 0.5),
]
OLD_SHAPE = [  # older points: agent, topic, content, fid
    ("sol", "weather", "Sol tracks the forecast for the launch window", 17),
    ("sol", "weather", "Shared text written by two agents", 18),
]


def legacy_points() -> list:
    """The collection as the old node left it: both shapes, unattributed points, one unregistered writer."""
    points = {}
    for agent, topic, content, scope, importance in NEW_SHAPE:
        points[legacy_point_id(agent, topic, content)] = {
            "agent_id": agent,
            "topic": topic,
            "content": content[:2000],
            "memory_scope": scope,
            "importance_score": importance,
        }
    for agent, topic, content, fid in OLD_SHAPE:
        points[legacy_point_id(agent, topic, content)] = {
            "agent": agent,
            "topic": topic,
            "content": content,
            "fid": fid,
        }
    points[legacy_point_id("", "misc", "nobody")] = {"topic": "misc", "content": "A fact nobody signed"}
    points[legacy_point_id("", "misc", "empty")] = {"agent_id": "", "topic": "misc", "content": "Empty agent_id"}
    points[legacy_point_id("hermes", "misc", "")] = {"agent": "hermes", "topic": "misc", "content": "  "}
    # Both fields: coalesce(agent, agent_id) labels it hermes.
    points[legacy_point_id("hermes", "mcp", "both")] = {
        "agent": "hermes",
        "agent_id": "nova",
        "topic": "mcp",
        "content": "Hermes connects to /mcp with a bearer token",
    }
    return [models.PointStruct(id=pid, vector=[0.5, 0.5, 0.5, 0.5], payload=p) for pid, p in points.items()]


def seed(path: Path, points: list) -> None:
    client = QdrantClient(path=str(path))
    client.create_collection("long_term", vectors_config=models.VectorParams(size=4, distance=models.Distance.COSINE))
    client.upsert("long_term", points=points)
    client.close()


def import_qdrant(server, path: Path, capsys) -> dict:
    capsys.readouterr()
    status = solos_memory.main(["import-qdrant", "--db", str(server.db_path), "--qdrant-path", str(path)])
    assert status == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_import_labels_both_shapes_and_counts_what_it_leaves_out(server, tmp_path, capsys):
    path = tmp_path / "qdrant"
    seed(path, legacy_points())
    # sol already holds the shared text; atlas already wrote the backup fact through the service.
    server.post("/v1/long", {"agent": "atlas", "topic": "infra", "fact": "The backup job runs nightly at 02:00 UTC"})
    server.post("/v1/long", {"agent": "nova", "fact": "Shared text written by two agents"})
    counts = import_qdrant(server, path, capsys)
    assert counts == {
        "points": 9,
        "imported": 4,  # FACT_B, sol's two, hermes's
        "same_fact_already_stored": 1,  # atlas's backup fact: one row, not two
        "left_out:no_agent": 2,
        "left_out:no_text": 1,
        "left_out:unregistered_agent": 1,
    }
    stats = server.get("/v1/stats").body["qdrant"]
    assert stats["configured"] is False
    assert stats["import"] == {
        "imported_points": 5,
        "imported_private": 0,
        "left_out": {"no_agent": 2, "no_text": 1, "unregistered_agent": 1},
    }
    metrics = server.get("/metrics").raw.decode()
    assert 'solos_memory_qdrant_left_out{reason="no_agent"} 2' in metrics

    with server.db() as conn:
        rows = {r["fact"]: r for r in conn.execute("SELECT * FROM memory_longterm")}
    assert set(rows) == {
        "The backup job runs nightly at 02:00 UTC",
        "Shared text written by two agents",
        FACT_B,
        "Sol tracks the forecast for the launch window",
        "Hermes connects to /mcp with a bearer token",
    }
    assert FACT_A not in rows  # the old node's collision lost it before the import
    fact_b = rows[FACT_B]
    assert (fact_b["agent"], fact_b["topic"], fact_b["confidence"]) == ("atlas", "infra", 0.6)
    assert fact_b["source"] == f"qdrant:long_term/{legacy_point_id('atlas', 'infra', FACT_B)}"
    assert json.loads(fact_b["tags"]) == ["qdrant-import", "scope:shared"]

    # Recall: same labels, scores, scopes and dedup as every other row.
    reply = server.recall("sol", "bearer token mcp", k=3).body
    top = reply["results"][0]
    assert (top["agent"], top["foreign"], top["tier"]) == ("hermes", True, "long")
    assert top["source"].startswith("qdrant:long_term/") and 0 < top["score"] <= 1
    own = server.recall("sol", "forecast launch", scope="own").body["results"]
    assert own and {(r["agent"], r["foreign"]) for r in own} == {("sol", False)}
    assert server.recall("sol", "forecast launch", scope="shared_except_self").body["results"] == []
    shared = server.recall("atlas", "shared text written by two agents", k=5).body
    copy = next(r for r in shared["results"] if r["fact"] == "Shared text written by two agents")
    assert shared["suppressed_duplicates"] == 1 and copy["duplicates"] == 1
    assert {copy["agent"], *copy["also_written_by"]} == {"sol", "nova"}
    assert not any(r["agent"] == "ghost" for r in server.recall("atlas", "ghost registry").body["results"])


def test_import_is_idempotent_and_picks_up_a_writer_registered_later(server, tmp_path, capsys):
    path = tmp_path / "qdrant"
    seed(path, legacy_points())
    first = import_qdrant(server, path, capsys)
    again = import_qdrant(server, path, capsys)
    assert again == {
        "points": 9,
        "already_imported": first["imported"],
        "left_out:no_agent": 2,
        "left_out:no_text": 1,
        "left_out:unregistered_agent": 1,
    }
    with server.db() as conn:
        before = conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0]
    assert solos_memory.main(["agents", "add", "ghost", "--db", str(server.db_path)]) == 0
    third = import_qdrant(server, path, capsys)
    assert third["imported"] == 1 and "left_out:unregistered_agent" not in third
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0] == before + 1
    assert server.get("/v1/stats").body["qdrant"]["import"]["left_out"] == {"no_agent": 2, "no_text": 1}
    reply = server.recall("ghost", "ghost registry", k=1).body["results"]
    assert [(r["agent"], r["foreign"], r["fact"]) for r in reply] == [
        ("ghost", False, "Ghost agents are not in the registry")
    ]


def test_import_of_a_missing_collection_fails_with_a_reason(server, tmp_path, capfd):
    assert solos_memory.main(["import-qdrant", "--db", str(server.db_path), "--qdrant-path", str(tmp_path / "q")]) == 1
    assert "no such collection" in capfd.readouterr().err


# ==== Mirror: every long change reaches Qdrant, through a durable outbox ====


@pytest.mark.slow
def test_mirror_sends_every_long_write_update_and_delete(make_server, tmp_path):
    path = tmp_path / "qdrant"
    server = make_server(qdrant=solos_qdrant.Target(path=str(path)))
    for agent, fact in (("atlas", FACT_A), ("atlas", FACT_B), ("sol", "Backups run at 02:00"), ("sol", "Temporary")):
        assert server.post("/v1/long", {"agent": agent, "topic": "infra", "fact": fact}).status == 201
    assert (
        server.post("/v1/long", {"agent": "atlas", "topic": "infra", "fact": FACT_A, "confidence": 0.3}).status == 200
    )
    with server.db() as conn:  # the fleet's other writers change rows directly; the triggers see them too
        conn.execute("UPDATE memory_longterm SET fact = 'Backups run at 03:00' WHERE fact = 'Backups run at 02:00'")
        conn.execute("DELETE FROM memory_longterm WHERE fact = 'Temporary'")
        row_ids = {r["fact"]: r["id"] for r in conn.execute("SELECT id, fact FROM memory_longterm")}
    wait_until(lambda: drained(server), what="the outbox to drain")
    stop_server(server)
    points = points_in(path)
    assert set(points) == {
        point_id("atlas", "long", FACT_A),
        point_id("atlas", "long", FACT_B),  # both facts sharing a 100-character prefix survive
        point_id("sol", "long", "Backups run at 03:00"),
    }
    first = points[point_id("atlas", "long", FACT_A)]
    assert first == {
        "agent": "atlas",
        "agent_id": "atlas",
        "topic": "infra",
        "content": FACT_A,
        "sha256": hashlib.sha256(FACT_A.encode()).hexdigest(),
        "solos_row_id": row_ids[FACT_A],
        "tier": "long",
        "source": None,
        "confidence": 0.3,
        "importance_score": 0.3,
        "memory_scope": "shared",
        "tags": [],
        "updated_at": first["updated_at"],
        "written_by": "solos-memory",
    }


@pytest.mark.slow
def test_outbox_keeps_200_writes_through_an_outage_and_delivers_each_once(make_server, tmp_path):
    path = tmp_path / "qdrant"
    holder = QdrantClient(path=str(path))  # local mode allows one client per folder: Qdrant is "down"
    holder.create_collection("long_term", vectors_config={})
    server = make_server(qdrant=solos_qdrant.Target(path=str(path)))
    facts = [f"Outage fact number {i} about service {i % 7}" for i in range(200)]
    statuses = [server.post("/v1/long", {"agent": AGENTS[i % 4], "fact": f}).status for i, f in enumerate(facts)]
    assert statuses == [201] * 200  # every write acknowledged while Qdrant is unreachable
    status = wait_until(lambda: (s := server.get("/v1/stats").body["qdrant"])["last_error"] and s, what="an error")
    assert status["backlog"] == 200 and "already accessed" in status["last_error"]
    assert status["consecutive_failures"] >= 1
    metrics = server.get("/metrics").raw.decode()
    assert "solos_memory_qdrant_outbox_backlog 200" in metrics and "solos_memory_qdrant_mirror_failing 1" in metrics
    holder.close()  # Qdrant is back
    server.server.memory.mirror.wake.set()  # rather than wait out the backoff
    wait_until(lambda: drained(server), what="the backlog to drain")
    assert server.get("/v1/stats").body["qdrant"]["consecutive_failures"] == 0
    stop_server(server)
    points = points_in(path)
    assert len(points) == 200
    assert set(points) == {point_id(AGENTS[i % 4], "long", f) for i, f in enumerate(facts)}
    assert sorted(p["content"] for p in points.values()) == sorted(facts)


sys.path.insert(0, str(ROOT / "bench"))
import harness  # noqa: E402


def running_service(db: Path, *extra: str) -> harness.Process:
    """The service as a subprocess (python3 solos_memory.py serve), so it can be killed."""
    return harness.start_service(db, register="atlas", extra=list(extra))


def outbox_size(db: Path) -> int:
    conn = sqlite3.connect(db, timeout=5)
    try:
        return conn.execute("SELECT count(*) FROM qdrant_outbox").fetchone()[0]
    finally:
        conn.close()


@pytest.mark.slow
def test_kill_9_mid_drain_loses_nothing(tmp_path):
    """Queue 2,000 facts with the mirror on but unconfigured, start one that drains, kill -9 it midway, restart."""
    db, path, total = tmp_path / "solos.db", tmp_path / "qdrant", 2000
    holder = QdrantClient(path=str(path))
    holder.create_collection("long_term", vectors_config={})
    holder.close()
    with running_service(db, "--qdrant-path", str(path)):  # switches the outbox on
        pass
    with running_service(db) as offline:  # no target: the triggers still queue every change
        client = harness.Client(offline.port)
        for i in range(total):
            status, _ = client.json("POST", "/v1/long", {"agent": "atlas", "fact": f"Queued fact {i}"})
            assert status == 201
        client.close()
    assert outbox_size(db) == total
    draining = running_service(db, "--qdrant-path", str(path))
    with draining:
        remaining = wait_until(lambda: (n := outbox_size(db)) < total and n, timeout_s=60, what="the drain to start")
        draining.kill()  # SIGKILL: no shutdown code runs
    assert 0 < remaining < total, "the drain finished before the kill; nothing was tested"
    print("killed with", remaining, "of", total, "queued")
    assert outbox_size(db) > 0
    with running_service(db, "--qdrant-path", str(path)):
        wait_until(lambda: outbox_size(db) == 0, timeout_s=60, what="the restarted drain")
    points = points_in(path)
    assert len(points) == total
    assert set(points) == {point_id("atlas", "long", f"Queued fact {i}") for i in range(total)}


@pytest.mark.slow
def test_mirroring_imported_facts_replaces_their_legacy_points_and_leaves_the_rest(make_server, tmp_path, capsys):
    path = tmp_path / "qdrant"
    seed(path, legacy_points())
    plain = make_server()
    import_qdrant(plain, path, capsys)
    with plain.db() as conn:
        facts = [(r["agent"], r["fact"]) for r in conn.execute("SELECT agent, fact FROM memory_longterm")]
    stop_server(plain)
    before = points_in(path)
    # The collection has 4-dim vectors and this service no embedder: the mirror must say so, not send.
    mirrored = make_server(qdrant=solos_qdrant.Target(path=str(path)))
    status = wait_until(lambda: (s := mirrored.get("/v1/stats").body["qdrant"])["rows_waiting_for_retry"] and s)
    assert "4-dim vectors" in status["last_error"] and status["backlog"] == len(facts)
    stop_server(mirrored)
    assert points_in(path) == before
    # A vectorless collection takes them: each imported point is replaced by its canonical one.
    client = QdrantClient(path=str(path))
    client.delete_collection("long_term")
    client.create_collection("long_term", vectors_config={})
    client.upsert(
        "long_term", points=[models.PointStruct(id=p.id, vector={}, payload=p.payload) for p in legacy_points()]
    )
    client.close()
    with sqlite3.connect(tmp_path / "solos.db") as conn:
        conn.execute("UPDATE qdrant_outbox SET next_try_at = ''")  # due now, not in a minute
    mirrored = make_server(qdrant=solos_qdrant.Target(path=str(path)))
    wait_until(lambda: drained(mirrored), what="the outbox to drain")
    stop_server(mirrored)
    after = points_in(path)
    left_alone = {pid for pid, p in before.items() if solos_qdrant.attribute(p)[0] in (None, "ghost")}
    left_alone |= {pid for pid, p in before.items() if solos_qdrant.attribute(p)[1] is None}
    assert set(after) == left_alone | {point_id(agent, "long", fact) for agent, fact in facts}
    assert all(after[pid] == before[pid] for pid in left_alone)
    assert len(after) == len(left_alone) + len(facts) == 4 + 5


def test_a_mirror_without_qdrant_client_stops_startup(tmp_path):
    """python3 -S: no site-packages, so no qdrant-client; the service must say so rather than queue forever."""
    run = subprocess.run(
        [
            sys.executable,
            "-S",
            str(ROOT / "solos_memory.py"),
            "serve",
            "--db",
            str(tmp_path / "s.db"),
            "--port",
            "0",
            "--model-dir",
            "off",
            "--qdrant-path",
            str(tmp_path / "q"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0 and "need qdrant-client" in run.stderr


# ==== Ids in their own type, the API's rules, private points, verify ====

UUID_NEW = "6f1c2a0e-1d3b-4c55-9e0f-2a7b8c9d0e11"
UUID_OLD = "0b9e4d2c-7a61-4f38-8c2d-5e6f7a8b9c0d"
ID_FIXTURE = {  # integer and UUID ids, each in both payload shapes, plus a point nobody signed
    1001: {
        "agent_id": "atlas",
        "topic": "infra",
        "content": "Integer-id fact in the new shape",
        "memory_scope": "shared",
    },
    1002: {"agent": "sol", "topic": "weather", "content": "Integer-id fact in the old shape", "fid": 3},
    UUID_NEW: {"agent_id": "sol", "topic": "ops", "content": "UUID-id fact in the new shape", "importance_score": 0.4},
    UUID_OLD: {"agent": "atlas", "topic": "ops", "content": "UUID-id fact in the old shape"},
    7: {"topic": "misc", "content": "A fact nobody signed"},
}


def seed_vectorless(path: Path, points: dict) -> None:
    client = QdrantClient(path=str(path))
    client.create_collection("long_term", vectors_config={})
    if points:
        client.upsert("long_term", points=[models.PointStruct(id=k, vector={}, payload=v) for k, v in points.items()])
    client.close()


def run_cli(capsys, *argv: str) -> tuple[int, dict]:
    capsys.readouterr()
    status = solos_memory.main(list(argv))
    return status, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def raw_ids(path: Path) -> set:
    client = QdrantClient(path=str(path))
    try:
        return {r.id for r in client.scroll("long_term", limit=10_000)[0]}
    finally:
        client.close()


@pytest.mark.slow
def test_integer_and_uuid_ids_through_import_mirror_forget_and_verify(make_server, tmp_path, capsys):
    path, db = tmp_path / "qdrant", tmp_path / "solos.db"
    seed_vectorless(path, ID_FIXTURE)
    plain = make_server()
    counts = import_qdrant(plain, path, capsys)
    assert (counts["imported"], counts["left_out:no_agent"]) == (4, 1)
    with plain.db() as conn:
        facts = {r["fact"]: (r["id"], r["agent"]) for r in conn.execute("SELECT id, agent, fact FROM memory_longterm")}
    stop_server(plain)
    target = ("--db", str(db), "--qdrant-path", str(path))
    # Before any mirror: each row has its one imported point; the unsigned point is not the service's.
    status, report = run_cli(capsys, "qdrant-verify", *target)
    assert status == 0 and report["points_per_row"] == {"0": 0, "1": 4} and report["unmanaged_points"] == 1

    mirrored = make_server(qdrant=solos_qdrant.Target(path=str(path)))
    wait_until(lambda: drained(mirrored), what="the imported rows to be mirrored")
    stop_server(mirrored)
    canonical = {point_id(agent, "long", fact) for fact, (_, agent) in facts.items()}
    # Each legacy point, integer or UUID, is replaced by its canonical one: 1001 and 1002 are gone too.
    assert raw_ids(path) == canonical | {7}
    status, report = run_cli(capsys, "qdrant-verify", *target)
    assert status == 0 and report["points_per_row"] == {"0": 0, "1": 4}, report
    assert (report["strays"], report["missing"], report["matches"]) == (0, 0, True)

    mirrored = make_server(qdrant=solos_qdrant.Target(path=str(path)))
    row, agent = facts["Integer-id fact in the new shape"]
    gone = mirrored.request("DELETE", f"/v1/memory?agent={agent}&tier=long&id={row}")
    assert gone.status == 200 and gone.body["mirror"] == "pending", gone.body
    wait_until(lambda: drained(mirrored), what="the forget's delete")
    stop_server(mirrored)
    assert raw_ids(path) == canonical - {point_id(agent, "long", "Integer-id fact in the new shape")} | {7}
    assert "Integer-id fact in the new shape" not in json.dumps(list(points_in(path).values()))
    status, report = run_cli(capsys, "qdrant-verify", *target)
    assert status == 0 and report["rows"] == 3

    # A difference of each kind: a point the service wrote for no row, and a row without its point.
    client = QdrantClient(path=str(path))
    client.upsert("long_term", points=[models.PointStruct(id=99, vector={}, payload={"written_by": "solos-memory"})])
    lost = facts["UUID-id fact in the old shape"]
    client.delete("long_term", models.PointIdsList(points=[point_id("atlas", "long", "UUID-id fact in the old shape")]))
    client.close()
    status, report = run_cli(capsys, "qdrant-verify", *target)
    assert status == 1 and (report["strays"], report["missing"]) == (1, 1), report
    assert report["examples"]["stray_points"] == ["99"] and report["examples"]["missing_rows"] == [lost[0]]


@pytest.mark.slow
def test_ids_qdrant_would_refuse_are_counted_and_never_block_the_outbox(make_server, tmp_path):
    path = tmp_path / "qdrant"
    seed_vectorless(path, {})
    server = make_server()
    row = server.post("/v1/long", {"agent": "atlas", "fact": "A fact two bad legacy ids point at"}).body["id"]
    digest = hashlib.sha256(b"A fact two bad legacy ids point at").hexdigest()
    with server.db() as conn:  # what a broken or hand-edited import table holds
        for bad in ("not-a-point-id", str(2**64)):
            conn.execute(
                "INSERT INTO qdrant_import (collection, point_id, content_sha256, row_id) "
                "VALUES ('long_term', ?, ?, ?)",
                (bad, digest, row),
            )
    stop_server(server)
    mirrored = make_server(qdrant=solos_qdrant.Target(path=str(path)))
    wait_until(lambda: drained(mirrored), what="the outbox to drain")
    status = mirrored.get("/v1/stats").body["qdrant"]
    assert status["refused_point_ids"] == 2 and status["backlog"] == 0
    stop_server(mirrored)
    assert raw_ids(path) == {point_id("atlas", "long", "A fact two bad legacy ids point at")}


HOSTILE = {  # each breaks a rule POST /v1/long enforces; none may reach the table
    11: {"agent_id": "atlas", "content": "x" * 9_000},
    12: {"agent_id": "atlas", "content": "a fact with a NUL \x00 inside"},
    13: {"agent_id": "atlas", "topic": "t" * 100_000, "content": "A fact with a huge topic"},
    14: {"agent_id": "atlas", "content": "A fact with a hostile scope tag", "memory_scope": "s\x00" * 2_500},
    15: {"agent_id": "atlas", "content": "a lone surrogate \ud800 here"},
    16: {"agent_id": "atlas", "content": "A point claiming the service wrote it", "written_by": "solos-memory"},
    17: {
        "agent_id": "sol",
        "topic": "diary",
        "content": "Sol's private note about the launch",
        "memory_scope": "private",
    },
    18: {"agent_id": "atlas", "topic": "diary", "content": "Atlas's private note", "memory_scope": "private"},
    19: {"agent_id": "atlas", "content": "The one well-formed fact"},
}


def test_import_applies_the_apis_rules_and_counts_every_skipped_point(server, tmp_path, capsys):
    path = tmp_path / "qdrant"
    seed_vectorless(path, HOSTILE)
    counts = import_qdrant(server, path, capsys)
    assert counts == {
        "points": 9,
        "imported": 1,
        "left_out:invalid_fact": 3,
        "left_out:invalid_topic": 1,
        "left_out:invalid_tags": 1,
        "left_out:written_by_service": 1,
        "left_out:private": 2,
    }
    with server.db() as conn:
        assert [r[0] for r in conn.execute("SELECT fact FROM memory_longterm")] == ["The one well-formed fact"]
    left_out = {"invalid_fact": 3, "invalid_topic": 1, "invalid_tags": 1, "written_by_service": 1, "private": 2}
    assert server.get("/v1/stats").body["qdrant"]["import"]["left_out"] == left_out
    metrics = server.get("/metrics").raw.decode()
    for reason, count in left_out.items():
        assert f'solos_memory_qdrant_left_out{{reason="{reason}"}} {count}' in metrics
    # Every client recall still works: no row past the API's limits is in the table.
    assert Client(server.url, "sol").recall("fact", k=20)["count"] == 1

    # Opt in: private points become their agent's own episodes, unless the agent shares its episodes.
    assert server.request("PUT", "/v1/sharing", {"agent": "atlas", "episodic": True}).status in (200, 201)
    capsys.readouterr()
    argv = ["import-qdrant", "--db", str(server.db_path), "--qdrant-path", str(path), "--import-private"]
    assert solos_memory.main(argv) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["imported_private"] == 1 and again["left_out:private_agent_shares_episodic"] == 1
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0] == 1
        episodes = [dict(r) for r in conn.execute("SELECT agent, event_type, details FROM memory_episodic")]
    assert episodes == [{"agent": "sol", "event_type": "qdrant_private_memory", "details": HOSTILE[17]["content"]}]
    own = server.recall("sol", "private note launch", tiers="episodic", scope="own").body["results"]
    assert [r["agent"] for r in own] == ["sol"]
    assert server.recall("atlas", "private note launch", tiers="episodic,long", k=10).body["count"] == 0
    stats = server.get("/v1/stats").body["qdrant"]["import"]
    assert stats["imported_private"] == 1 and stats["left_out"]["private_agent_shares_episodic"] == 1


@pytest.mark.slow
def test_forget_without_a_running_mirror_says_so_and_the_text_leaves_the_outbox(make_server, tmp_path):
    """The outbox is on (a mirror ran once) but this service runs none."""
    path = tmp_path / "qdrant"
    seed_vectorless(path, {})
    stop_server(make_server(qdrant=solos_qdrant.Target(path=str(path))))  # switches the outbox on
    server = make_server()
    secret = "the outbox secret is heliotrope-7731"
    row = server.post("/v1/long", {"agent": "atlas", "fact": secret}).body["id"]
    gone = server.request("DELETE", f"/v1/memory?agent=atlas&tier=long&id={row}")
    assert gone.status == 200 and gone.body["mirror"] == "no_mirror_configured", gone.body
    assert gone.body["wal_checkpoint"] == "complete"
    with server.db() as conn:
        outbox = [dict(r) for r in conn.execute("SELECT action, agent, fact FROM qdrant_outbox")]
    assert [e["action"] for e in outbox] == ["upsert", "delete"]
    assert not any(secret in (e["fact"] or "") for e in outbox)
    stop_server(server)
    for suffix in ("", "-wal"):
        file = Path(str(tmp_path / "solos.db") + suffix)
        assert not file.exists() or b"heliotrope-7731" not in file.read_bytes()
    # A mirror started later still deletes the point (it never existed here: the delete is a no-op that drains).
    mirrored = make_server(qdrant=solos_qdrant.Target(path=str(path)))
    wait_until(lambda: drained(mirrored), what="the queued delete")
    stop_server(mirrored)
    assert raw_ids(path) == set()


class RecordingListener:
    """A loopback 'proxy' that records every request reaching it and answers 502."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.seen: list[bytes] = []
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    self.seen.append(conn.recv(65536))
                    conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass


@pytest.fixture
def proxy(monkeypatch):
    """http_proxy and friends point at a recording listener, with no no_proxy exception."""
    listener = RecordingListener()
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, listener.url)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    yield listener
    listener.listener.close()


def test_loopback_calls_never_go_through_a_proxy(server, proxy):
    assert store_memory("atlas", "infra", "Written past a proxy", url=server.url, token="s3cret") == point_id(
        "atlas", "long", "Written past a proxy"
    )
    assert Client(server.url, "sol", token=None).recall("proxy")["count"] == 1
    assert proxy.seen == []


@pytest.mark.slow
def test_a_loopback_qdrant_is_reached_directly(proxy):
    qdrant = RecordingListener()  # stands in for Qdrant: whatever reaches it is recorded
    client = solos_qdrant.connect(solos_qdrant.Target(url=qdrant.url))
    try:
        with pytest.raises(Exception):  # noqa: B017 - the stand-in answers 502; only where the request went matters
            client.collection_exists("long_term")
    finally:
        client.close()
        qdrant.listener.close()
    assert proxy.seen == [] and qdrant.seen and qdrant.seen[0].startswith(b"GET /collections/long_term/exists")


# ==== Faults: stale vectors, ids across collections, a failing embedder ====


def vectors_in(path: Path) -> dict[str, list[float]]:
    return {str(r.id): r.vector for r in records_in(path, with_vectors=True)}


def test_a_fact_rewritten_by_a_fleet_writer_is_mirrored_with_its_new_texts_vector(embedded_server, tmp_path):
    from conftest import WordHashEmbedder

    path, embedder = tmp_path / "qdrant", WordHashEmbedder()
    server = embedded_server(embedder, qdrant=solos_qdrant.Target(path=str(path)))
    old, new = "The build farm runs on ARM runners", "The build farm moved to x86 spot instances"
    row = server.post("/v1/long", {"agent": "atlas", "fact": old}).body["id"]
    wait_until(lambda: drained(server), what="the first point")
    with server.db() as conn:  # a fleet writer rewrites the fact; the row's embedding column still holds old's
        conn.execute("UPDATE memory_longterm SET fact = ? WHERE id = ?", (new, row))
    wait_until(lambda: drained(server), what="the rewrite")
    stop_server(server)
    vector = vectors_in(path)[point_id("atlas", "long", new)]
    wanted = embedder.vector(solos_store.labelled_text("atlas", None, new))
    assert max(abs(a - b) for a, b in zip(vector, wanted)) < 1e-5, "the point carries the old text's vector"


def test_an_id_imported_from_another_collection_never_deletes_a_point_of_this_one(make_server, tmp_path, capsys):
    path = tmp_path / "qdrant"
    seed_vectorless(path, {5: {"agent_id": "ghost", "content": "A point the service never took in"}})
    client = QdrantClient(path=str(path))
    client.create_collection("archive", vectors_config={})
    client.upsert(
        "archive",
        points=[models.PointStruct(id=5, vector={}, payload={"agent_id": "atlas", "content": "An archived fact"})],
    )
    client.close()
    plain = make_server()
    capsys.readouterr()
    argv = ["import-qdrant", "--db", str(plain.db_path), "--qdrant-path", str(path)]
    assert solos_memory.main([*argv, "--qdrant-collection", "archive"]) == 0
    assert solos_memory.main(argv) == 0  # point 5 of long_term: left out (unregistered writer)
    stop_server(plain)
    mirrored = make_server(qdrant=solos_qdrant.Target(path=str(path)))
    wait_until(lambda: drained(mirrored), what="the archived fact's point")
    stop_server(mirrored)
    assert raw_ids(path) == {5, point_id("atlas", "long", "An archived fact")}
    status, report = run_cli(capsys, "qdrant-verify", "--db", str(plain.db_path), "--qdrant-path", str(path))
    assert status == 0 and (report["unmanaged_points"], report["rows_with_several_points"]) == (1, 0), report


def test_a_row_the_embedder_cannot_take_never_holds_up_a_forgets_delete(embedded_server, tmp_path):
    from conftest import PoisonRowEmbedder

    path = tmp_path / "qdrant"
    server = embedded_server(PoisonRowEmbedder(), qdrant=solos_qdrant.Target(path=str(path)))
    secret = "The canary deploy key is rotated every Friday"
    row = server.post("/v1/long", {"agent": "atlas", "fact": secret}).body["id"]
    wait_until(lambda: drained(server), what="the fact's point")
    with server.db() as conn:  # a fleet writer's row without a vector, which the mirror must embed to send
        conn.execute("INSERT INTO memory_longterm (agent, fact) VALUES ('sol', 'a poison row')")
    assert forget(server, "atlas", "long", row)[1]["mirror"] == "pending"
    status = wait_until(
        lambda: (s := server.get("/v1/stats").body["qdrant"])["backlog"] == 1 and s, what="the forget's delete"
    )
    assert status["rows_waiting_for_retry"] == 1 and "cannot take this text" in status["last_error"]
    stop_server(server)
    assert point_id("atlas", "long", secret) not in points_in(path)


def test_a_private_scope_in_any_case_is_never_shared(server, tmp_path, capsys):
    """`Private`, ` PRIVATE ` are the node's private memory too: neither the writer nor the import shares them."""
    for scope in ("Private", " PRIVATE "):
        with pytest.raises(StoreMemoryError) as refused:
            store_memory("atlas", "diary", f"Atlas's {scope.strip()} note on the vault", scope, url=server.url)
        assert refused.value.field == "memory_scope"
    path = tmp_path / "qdrant"
    seed_vectorless(
        path,
        {
            21: {"agent_id": "sol", "content": "Sol's note kept Private", "memory_scope": "Private"},
            22: {"agent": "sol", "content": "Sol's note kept PRIVATE", "memory_scope": " PRIVATE "},
        },
    )
    assert import_qdrant(server, path, capsys) == {"points": 2, "left_out:private": 2}
    assert server.recall("atlas", "note vault private", k=5).body["results"] == []
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0] == 0


def test_import_never_brings_back_a_fact_its_writer_forgot(server, tmp_path, capsys):
    secret = "The staging database password is swordfish-2291"
    row = server.post("/v1/long", {"agent": "atlas", "fact": secret}).body["id"]
    assert forget(server, "atlas", "long", row)[0]
    path = tmp_path / "qdrant"  # the old node's copy of the same fact, still in the collection
    seed_vectorless(path, {31: {"agent_id": "atlas", "content": secret}, 32: {"agent_id": "sol", "content": secret}})
    counts = import_qdrant(server, path, capsys)
    assert counts == {"points": 2, "imported": 1, "left_out:forgotten": 1}
    with server.db() as conn:  # sol's own copy of the words is sol's fact: atlas's forget was not about it
        assert [tuple(r) for r in conn.execute("SELECT agent, fact FROM memory_longterm")] == [("sol", secret)]
    assert import_qdrant(server, path, capsys) == {"points": 2, "already_imported": 1, "left_out:forgotten": 1}


@pytest.mark.parametrize("command", ["import-qdrant", "qdrant-verify"])
def test_an_unreachable_qdrant_server_fails_the_command_with_a_reason(server, command, capfd):
    from conftest import dead_url

    argv = [command, "--db", str(server.db_path), "--qdrant-url", dead_url()]
    assert solos_memory.main(argv) == 1
    err = capfd.readouterr().err
    assert "Traceback" not in err and '"event": "failed"' in err and "Connection refused" in err, err


@pytest.mark.parametrize(
    "behaviour",
    [("garbage", b"SSH-2.0-OpenSSH_9.2\r\n"), ("http", 200, b"<html>captive portal</html>"), ("http", 200, b"{}")],
)
def test_store_memory_names_an_answer_that_is_not_the_services(behaviour):
    """The node catches StoreMemoryError; anything else it would crash on, or take as stored."""
    from conftest import FaultServer

    fault = FaultServer(behaviour)
    try:
        with pytest.raises(StoreMemoryError, match="not the service's"):
            store_memory("atlas", "infra", "a fact", url=fault.url, timeout=2)
    finally:
        fault.close()


def test_a_new_client_asks_qdrant_nothing_and_warns_nothing(capfd):
    """qdrant-client asks a new server its version in a thread of its own: against a hung server that request held
    a connection for its timeout, and an answer without a version printed a multi-line UserWarning into the
    service's JSON-line log. The service makes its clients without that check."""
    import warnings

    from conftest import FaultServer

    fault = FaultServer(("hang",))
    fault.behaviours.put(("http", 200, b"{}"))  # the first connection gets an answer without a version
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            solos_qdrant.connect(solos_qdrant.Target(url=fault.url)).close()
            deadline = time.monotonic() + 1.0  # the check's thread connects within milliseconds when it runs
            while time.monotonic() < deadline and fault.behaviours.qsize() and not caught:
                time.sleep(0.02)
        assert fault.behaviours.qsize() == 1, "the client connected to Qdrant before it was asked anything"
        assert [str(w.message) for w in caught] == []
        assert "UserWarning" not in capfd.readouterr().err
    finally:
        fault.close()


# ==== A forgotten private episode takes its Qdrant point with it ====

PRIVATE_POINTS = {
    41: {
        "agent_id": "sol",
        "topic": "diary",
        "content": "Sol's vault passphrase is marigold-5512",
        "memory_scope": "private",
    },
    42: {"agent_id": "sol", "content": "Sol keeps a second note on the launch", "memory_scope": "private"},
}


def import_private(server, path: Path, capsys) -> dict:
    status, counts = run_cli(
        capsys, "import-qdrant", "--db", str(server.db_path), "--qdrant-path", str(path), "--import-private"
    )
    assert status == 0
    return counts


def episode_of(server, point: int) -> int:
    with server.db() as conn:
        return conn.execute(
            "SELECT id FROM memory_episodic WHERE details = ?", (PRIVATE_POINTS[point]["content"],)
        ).fetchone()[0]


@pytest.mark.slow
def test_forgetting_an_imported_private_episode_deletes_its_point_through_an_outage(make_server, tmp_path, capsys):
    path = tmp_path / "qdrant"
    seed_vectorless(path, PRIVATE_POINTS)
    server = make_server()
    assert import_private(server, path, capsys)["imported_private"] == 2
    stop_server(server)
    holder = QdrantClient(path=str(path))  # local mode admits one client: Qdrant is "down" for the mirror
    server = make_server(qdrant=solos_qdrant.Target(path=str(path)))
    ok, receipt = forget(server, "sol", "episodic", episode_of(server, 41))
    assert ok and receipt["mirror"] == "pending", receipt
    status = wait_until(
        lambda: (s := server.get("/v1/stats").body["qdrant"])["consecutive_failures"] and s, what="a failed drain"
    )
    assert status["backlog"] == 1  # the point's delete waits, and says so
    with server.db() as conn:  # what waits for Qdrant is the point's id and the text's hash, never the text
        for table in ("qdrant_import", "qdrant_outbox"):
            assert not [r for r in conn.execute(f"SELECT * FROM {table}") if "marigold" in repr(tuple(r))]
    holder.close()
    wait_until(lambda: drained(server), what="the private point's delete")
    stop_server(server)
    assert set(points_in(path)) == {"42"}
    # The import run again brings nothing back, and the other episode is still its agent's.
    server = make_server()
    counts = import_private(server, path, capsys)
    assert counts == {"points": 1, "already_imported": 1}, counts
    assert episode_of(server, 42)


@pytest.mark.slow
def test_a_forget_without_a_mirror_queues_the_private_points_delete_for_the_next(make_server, tmp_path, capsys):
    path = tmp_path / "qdrant"
    seed_vectorless(path, PRIVATE_POINTS)
    server = make_server()
    import_private(server, path, capsys)
    ok, receipt = forget(server, "sol", "episodic", episode_of(server, 42))
    assert ok and receipt["mirror"] == "no_mirror_configured", receipt
    assert server.get("/v1/stats").body["qdrant"]["backlog"] == 1
    status, report = run_cli(capsys, "qdrant-verify", "--db", str(server.db_path), "--qdrant-path", str(path))
    assert status == 1 and (report["strays"], report["outbox_backlog"]) == (1, 1), report
    stop_server(server)
    mirrored = make_server(qdrant=solos_qdrant.Target(path=str(path)))
    wait_until(lambda: drained(mirrored), what="the queued delete")
    stop_server(mirrored)
    assert set(points_in(path)) == {"41"}
    # The node writes the same private note again: the import never brings back what its agent forgot.
    client = QdrantClient(path=str(path))
    client.upsert("long_term", points=[models.PointStruct(id=42, vector={}, payload=PRIVATE_POINTS[42])])
    client.close()
    server = make_server()
    assert import_private(server, path, capsys) == {"points": 2, "already_imported": 1, "left_out:forgotten": 1}


@pytest.mark.slow
def test_private_episodes_imported_before_the_link_are_found_by_the_import_run_again(make_server, tmp_path, capsys):
    """An import before the link was kept recorded no episode for its points. Run again, it finds each: a live
    episode is linked (a later forget deletes its point); a forgotten one has its point's delete queued."""
    path = tmp_path / "qdrant"
    seed_vectorless(path, PRIVATE_POINTS)
    server = make_server()
    import_private(server, path, capsys)
    with server.db() as conn:  # as the earlier import left them
        conn.execute("UPDATE qdrant_import SET row_id = NULL WHERE reason = 'imported_private'")
    ok, receipt = forget(server, "sol", "episodic", episode_of(server, 41))
    assert ok and receipt["mirror"] == "none"  # nothing links it to its point yet
    kept = episode_of(server, 42)
    counts = import_private(server, path, capsys)
    assert counts == {"points": 2, "linked_private": 1, "forget_queued": 1}, counts
    assert import_private(server, path, capsys) == {"points": 2, "already_imported": 2}
    ok, receipt = forget(server, "sol", "episodic", kept)
    assert ok and receipt["mirror"] == "no_mirror_configured", receipt
    stop_server(server)
    mirrored = make_server(qdrant=solos_qdrant.Target(path=str(path)))
    wait_until(lambda: drained(mirrored), what="both deletes")
    stop_server(mirrored)
    assert points_in(path) == {}


@pytest.mark.slow
def test_a_forgotten_imported_fact_queues_its_points_delete_where_no_mirror_ever_ran(make_server, tmp_path, capsys):
    """The outbox triggers were never switched on: the forget still queues the delete of the point the fact came
    from (its id and the text's hash), says no mirror runs, and a mirror started later sends it."""
    secret = "The old node's backup key is periwinkle-4417"
    path = tmp_path / "qdrant"
    seed_vectorless(path, {51: {"agent_id": "atlas", "content": secret}, 52: {"agent_id": "atlas", "content": FACT_A}})
    server = make_server()
    assert import_qdrant(server, path, capsys) == {"points": 2, "imported": 2}
    with server.db() as conn:
        row = conn.execute("SELECT id FROM memory_longterm WHERE fact = ?", (secret,)).fetchone()[0]
        assert conn.execute("SELECT value FROM solos_memory_meta WHERE key = 'qdrant_mirror'").fetchone() is None
    ok, receipt = forget(server, "atlas", "long", row)
    assert ok and receipt["mirror"] == "no_mirror_configured", receipt
    with server.db() as conn:
        queued = [tuple(r) for r in conn.execute("SELECT point_id, content_sha256, reason FROM qdrant_import")]
    assert ("51", hashlib.sha256(secret.encode()).hexdigest(), "forget_pending") in queued
    assert "periwinkle" not in repr(queued)
    assert server.get("/v1/stats").body["qdrant"]["backlog"] == 1
    status, report = run_cli(capsys, "qdrant-verify", "--db", str(server.db_path), "--qdrant-path", str(path))
    assert status == 1 and (report["strays"], report["outbox_backlog"]) == (1, 1), report
    assert report["examples"]["stray_points"] == ["51"]
    # Run again before any mirror: the point still there is not brought back.
    assert import_qdrant(server, path, capsys) == {"points": 2, "already_imported": 2}
    stop_server(server)
    mirrored = make_server(qdrant=solos_qdrant.Target(path=str(path)))
    wait_until(lambda: drained(mirrored), what="the queued delete")
    stop_server(mirrored)
    assert secret not in json.dumps(list(points_in(path).values()))
    assert 51 not in raw_ids(path)
    # The old node writes the same fact again: the import never brings back what its writer forgot.
    client = QdrantClient(path=str(path))
    client.upsert(
        "long_term", points=[models.PointStruct(id=51, vector={}, payload={"agent_id": "atlas", "content": secret})]
    )
    client.close()
    server = make_server()
    counts = import_qdrant(server, path, capsys)
    assert counts["left_out:forgotten"] == 1, counts
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm WHERE fact = ?", (secret,)).fetchone()[0] == 0


def test_an_import_batch_finds_a_writers_forgets_by_index_not_by_reading_every_retraction(tmp_path):
    """Each point an import takes in asks whether its writer forgot those words (memory_retraction, kept for
    ever), inside the batch's write transaction: with no index that read every retraction once per point, so
    a page of 256 points held SQLite's write lock for a whole scan of the forgets, 256 times. Counted here in
    SQLite's steps: 20,000 retractions, 100 points (facts, and private points brought in as episodes)."""
    store = solos_store.Store(str(tmp_path / "solos.db"))
    store.migrate()
    with sqlite3.connect(tmp_path / "solos.db") as conn:  # the fleet's registry, and a long history of forgets
        conn.execute("INSERT INTO agent_registry (agent) VALUES ('atlas')")
        conn.executemany(
            "INSERT INTO memory_retraction (agent, tier, row_id, content_hash) VALUES (?, ?, ?, ?)",
            [("nova", ("long", "episodic")[n % 2], n, f"{n:064x}") for n in range(20_000)],
        )
    points = [(str(n), {"agent_id": "atlas", "content": f"Fact number {n} about the gate"}) for n in range(50)]
    points += [
        (str(n), {"agent_id": "atlas", "content": f"Private note {n}", "memory_scope": "private"})
        for n in range(50, 100)
    ]
    steps = [0]

    def batch(conn):
        conn.set_progress_handler(lambda: steps.__setitem__(0, steps[0] + 1) or 0, 100)
        try:
            return solos_qdrant.import_batch(conn, "c", points, solos_memory.validate_for, private=True)
        finally:
            conn.set_progress_handler(None, 0)

    counts = store.write(batch)
    store.close()
    assert counts == {"imported": 50, "imported_private": 50}, counts
    assert steps[0] * 100 < 200_000, steps[0] * 100  # every retraction read per point: about 20 million


@pytest.mark.slow
def test_a_forgotten_point_of_another_collection_is_not_said_to_be_sent_by_this_mirror(make_server, tmp_path, capsys):
    """A mirror deletes only in its own collection: a private point imported from another is queued for a mirror
    of that one, so the forget must not answer `pending` nor this mirror's backlog count it for ever."""
    path = tmp_path / "qdrant"
    seed_vectorless(path, {})
    client = QdrantClient(path=str(path))
    client.create_collection("diaries", vectors_config={})
    client.upsert("diaries", points=[models.PointStruct(id=k, vector={}, payload=v) for k, v in PRIVATE_POINTS.items()])
    client.close()
    server = make_server()
    status, counts = run_cli(
        capsys, "import-qdrant", "--db", str(server.db_path), "--qdrant-path", str(path),
        "--qdrant-collection", "diaries", "--import-private",
    )  # fmt: skip
    assert status == 0 and counts["imported_private"] == 2, counts
    stop_server(server)
    mirrored = make_server(qdrant=solos_qdrant.Target(path=str(path)))  # mirrors long_term
    ok, receipt = forget(mirrored, "sol", "episodic", episode_of(mirrored, 41))
    assert ok and receipt["mirror"] == "no_mirror_configured", receipt
    qdrant = mirrored.get("/v1/stats").body["qdrant"]
    assert (qdrant["backlog"], qdrant["deletes_for_other_collections"]) == (0, 1), qdrant
    stop_server(mirrored)
    diaries = make_server(qdrant=solos_qdrant.Target(path=str(path), collection="diaries"))
    wait_until(lambda: drained(diaries), what="the delete, by a mirror of its collection")
    stop_server(diaries)
    client = QdrantClient(path=str(path))
    assert {str(r.id) for r in client.scroll("diaries", limit=10)[0]} == {"42"}
    client.close()
