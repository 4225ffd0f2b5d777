"""snapshot and restore: hash-chained manifests, checks before anything is touched, retractions re-applied."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from conftest import Stream, checkpoint, files_holding, marker, subscribed

import solos_memory
import solos_store


def snapshot(server, folder: Path, keep: int = 7) -> dict:
    assert solos_memory.main(["snapshot", "--db", str(server.db_path), "--dir", str(folder), "--keep", str(keep)]) == 0
    path = sorted(folder.glob("solos-*.json"))[-1]
    return {"path": path, **json.loads(path.read_text())}


def restore(manifest: Path, target: Path, capsys=None, *options: str) -> tuple[int, str]:
    status = solos_memory.main(["restore", str(manifest), "--db", str(target), *options])
    return status, capsys.readouterr().err if capsys else ""


def recall_view(server, agent: str, q: str, **query) -> list[tuple]:
    """What recall shows, minus nothing: ids, order, labels, texts and scores."""
    reply = server.recall(agent, q, k=20, **query)
    assert reply.status == 200, reply.body
    return [
        (r["id"], r["tier"], r["agent"], r["foreign"], r["text"], r["score"], r.get("tags"))
        for r in reply.body["results"]
    ]


@pytest.mark.slow
def test_the_dataspace_test_vector(server, make_server, tmp_path):
    """The fleet's dataspace note, through the service's own API and commands."""
    first = server.post(
        "/v1/long", {"agent": "atlas", "topic": "me", "fact": "I take my coffee black", "tags": ["preference"]}
    )
    assert first.status == 201
    by_tag = server.recall("sol", "preference")
    assert [r["id"] for r in by_tag.body["results"]] == [first.body["id"]]

    stream = subscribed(Stream(server, {"agent": "sol", "tags": "preference"}))
    try:
        second = server.post(
            "/v1/long", {"agent": "atlas", "topic": "me", "fact": "I sit by the window", "tags": ["preference"]}
        )
        server.post(
            "/v1/long", {"agent": "atlas", "topic": "work", "fact": "the build takes ten minutes", "tags": ["ops"]}
        )
        woke = stream.events(1)
        assert [(e["kind"], e["row_id"]) for e in woke] == [("write", second.body["id"])]
        assert stream.quiet(0.5) == []  # exactly once
    finally:
        stream.close()

    forgotten = server.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": first.body["id"]})
    assert forgotten.status == 200
    after = server.recall("sol", "preference")
    assert [r["id"] for r in after.body["results"]] == [second.body["id"]]

    queries = [("sol", "preference", {}), ("sol", "", {}), ("atlas", "coffee window build", {"scope": "own"})]
    before = [recall_view(server, agent, q, **query) for agent, q, query in queries]
    manifest = snapshot(server, tmp_path / "snapshots")
    target = tmp_path / "fresh" / "solos.db"
    target.parent.mkdir()
    assert restore(manifest["path"], target)[0] == 0
    restored = make_server("fresh/solos.db")
    assert [recall_view(restored, agent, q, **query) for agent, q, query in queries] == before
    assert "coffee" not in json.dumps(before)


def test_snapshots_are_hash_chained_and_the_last_n_are_kept(server, tmp_path):
    folder = tmp_path / "snapshots"
    server.post("/v1/long", {"agent": "atlas", "fact": "first"})
    one = snapshot(server, folder, keep=2)
    assert one["seq"] == 1 and one["previous"] is None
    assert one["sha256"] == hashlib.sha256((folder / one["file"]).read_bytes()).hexdigest()
    assert one["row_counts"]["memory_longterm"] == 1 and one["schema_version"] == solos_store.SCHEMA_VERSION
    server.post("/v1/long", {"agent": "atlas", "fact": "second"})
    two = snapshot(server, folder, keep=2)
    assert two["previous"] == hashlib.sha256(one["path"].read_bytes()).hexdigest()
    assert two["row_counts"]["memory_longterm"] == 2
    three = snapshot(server, folder, keep=2)
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [two["path"].name, two["file"], three["path"].name, three["file"]]
    )
    with sqlite3.connect(folder / three["file"]) as conn:  # a plain, complete database file
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


@pytest.fixture
def chain(server, tmp_path):
    """Three snapshots, with writes between them; and the target a restore would write."""
    folder = tmp_path / "snapshots"
    manifests = []
    for n in range(3):
        server.post("/v1/long", {"agent": "atlas", "fact": f"fact number {n}"})
        manifests.append(snapshot(server, folder))
    return folder, manifests, tmp_path / "target.db"


def refused(manifest: Path, target: Path, capsys, check: str) -> str:
    before = target.read_bytes() if target.exists() else None
    status, err = restore(manifest, target, capsys)
    assert status == 1
    failure = [json.loads(line) for line in err.splitlines() if '"failed"' in line][-1]
    assert failure["reason"].startswith(f"{check} check failed"), failure
    assert (target.read_bytes() if target.exists() else None) == before  # untouched
    assert not list(target.parent.glob(".*restore*"))
    return failure["reason"]


def test_restore_refuses_a_tampered_file(chain, capsys):
    folder, manifests, target = chain
    data = bytearray((folder / manifests[1]["file"]).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / manifests[1]["file"]).write_bytes(bytes(data))
    assert "sha256" in refused(manifests[1]["path"], target, capsys, "file")
    assert restore(manifests[2]["path"], target, capsys)[0] == 0  # the others are still good


def test_restore_refuses_a_broken_chain(chain, capsys):
    folder, manifests, target = chain
    edited = json.loads(manifests[1]["path"].read_text())
    edited["row_counts"]["memory_longterm"] = 99  # rewritten, so its digest no longer matches the next link
    manifests[1]["path"].write_text(json.dumps(edited, indent=1, sort_keys=True) + "\n")
    assert "altered" in refused(manifests[2]["path"], target, capsys, "chain")
    manifests[1]["path"].unlink()
    assert "missing" in refused(manifests[2]["path"], target, capsys, "chain")


def test_restore_refuses_a_reordered_chain(chain, capsys):
    folder, manifests, target = chain
    one, two = manifests[0]["path"], manifests[1]["path"]
    a, b = one.read_bytes(), two.read_bytes()
    one.write_bytes(b)
    two.write_bytes(a)
    assert "reordered" in refused(manifests[2]["path"], target, capsys, "chain")


def test_restore_refuses_a_snapshot_of_a_newer_schema(server, tmp_path, capsys):
    with server.db() as conn:
        conn.execute("UPDATE solos_memory_meta SET value = '99' WHERE key = 'schema_version'")
    manifest = snapshot(server, tmp_path / "snapshots")
    assert "schema version '99', newer" in refused(manifest["path"], tmp_path / "target.db", capsys, "schema")


@pytest.mark.slow
def test_a_restore_from_before_a_forget_does_not_bring_the_row_back(server, make_server, tmp_path):
    folder = tmp_path / "snapshots"
    word = marker()
    doomed = server.post("/v1/long", {"agent": "atlas", "topic": "t", "fact": f"secret {word}"}).body["id"]
    server.post("/v1/long", {"agent": "atlas", "topic": "t", "fact": "kept after the secret"})
    short = server.post("/v1/short", {"agent": "sol", "key": "pin", "value": f"pin {word}"}).body["id"]
    old = snapshot(server, folder)  # holds the rows
    server.post("/v1/short", {"agent": "sol", "key": "pin", "value": f"changed pin {word}"})  # a new version
    for agent, tier, row_id in (("atlas", "long", doomed), ("sol", "short", short)):
        assert server.request("DELETE", "/v1/memory", query={"agent": agent, "tier": tier, "id": row_id}).status == 200
    later = snapshot(server, folder)  # its manifest carries the two retractions, without text
    assert [(r["tier"], r["row_id"]) for r in later["retractions"]] == [("long", doomed), ("short", short)]
    assert word not in later["path"].read_text()

    # Into a fresh database (the live one is lost): the later manifests' retractions are re-applied.
    fresh = tmp_path / "fresh.db"
    assert restore(old["path"], fresh)[0] == 0
    restored = make_server("fresh.db")
    assert restored.recall("sol", word, tiers="long,short").body["results"] == []
    assert [r["text"] for r in restored.recall("sol", "kept secret").body["results"]] == ["kept after the secret"]
    assert files_holding(restored, word[-16:]) == {"db": 0, "-wal": 0}

    # Over the live database, with no later snapshot: its own retraction table is the source.
    for manifest in folder.glob("solos-000002-*"):
        manifest.unlink()
    shutil.copyfile(server.db_path, tmp_path / "before.db")
    assert restore(old["path"], server.db_path, None, "--force")[0] == 0  # under the running service
    assert server.recall("sol", word, tiers="long,short").body["results"] == []
    checkpoint(server)
    assert files_holding(server, word[-16:]) == {"db": 0, "-wal": 0}
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_retraction").fetchone()[0] == 2
    # Event ids keep increasing across the restore: a subscriber's Last-Event-ID stays meaningful.
    with sqlite3.connect(tmp_path / "before.db") as conn:
        last_before = conn.execute("SELECT max(id) FROM memory_event").fetchone()[0]
    server.post("/v1/long", {"agent": "atlas", "fact": "after the restore"})
    with server.db() as conn:
        assert conn.execute("SELECT max(id) FROM memory_event").fetchone()[0] > last_before
