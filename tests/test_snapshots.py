"""snapshot and restore: hash-chained manifests, checks before anything is touched, retractions re-applied;
a stale WAL, a running service, file modes, an older release's snapshots, killed runs' leftovers, manifests'
file names, removed manifests, and the ids and event ids a restore hands out next."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from conftest import (
    ROOT,
    Stream,
    checkpoint,
    files_holding,
    forget,
    marker,
    skip_or_fail,
    start_server,
    stop_server,
    subscribed,
    wait_until,
    write_tokens,
)

import solos_memory
import solos_snapshot
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


def test_a_folder_holding_another_databases_snapshots_is_refused_not_rotated(server, make_server, tmp_path, capsys):
    """Two databases in one folder share the default snapshots folder. The second one's snapshot continued the
    first one's chain (its sequence, its last retraction id) and its rotation deleted the first one's files:
    with --keep 2, a.db kept one snapshot of its own after two runs of each."""
    folder = tmp_path / "snapshots"
    server.post("/v1/long", {"agent": "atlas", "fact": "in the first database"})
    first = snapshot(server, folder, keep=2)
    other = make_server("other.db")
    capsys.readouterr()
    command = ["snapshot", "--db", str(other.db_path), "--dir", str(folder), "--keep", "2"]
    assert solos_memory.main(command) == 1
    err = capsys.readouterr().err
    assert str(server.db_path) in err and "--dir" in err, err
    assert sorted(p.name for p in folder.iterdir()) == sorted([first["path"].name, first["file"]])  # untouched
    jobs = other.get("/v1/stats").body["jobs"]["snapshot"]
    assert jobs["state"] == "failed" and str(server.db_path) in jobs["detail"], jobs
    assert snapshot(server, folder, keep=2)["seq"] == 2  # the folder's own database goes on
    moved = tmp_path / "moved.db"  # a database moved to another path keeps its chain: its anchor names it
    with sqlite3.connect(server.db_path) as source, sqlite3.connect(moved) as copy:
        source.backup(copy)
    assert solos_memory.main(["snapshot", "--db", str(moved), "--dir", str(folder), "--keep", "2"]) == 0


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


@pytest.mark.parametrize("tier", ["long", "short", "episodic"])
def test_a_snapshot_taken_while_a_forgets_scrub_waits_holds_none_of_its_text(server, tmp_path, monkeypatch, tier):
    # The forget committed, but its index merge met a busy database (wal_checkpoint: pending): the tier's FTS5
    # segments still held the row's words, and VACUUM INTO copied them into the snapshot, where they stayed
    # for --keep days, beyond the scrub that later cleared the live file.
    import solos_forget

    scrubber = server.server.memory.scrubber
    wait_until(lambda: not scrubber.due and not scrubber.checkpoint_pending, "the hub's first round")
    with server.db() as conn:  # as in a large index, where the segment holding the words is not merged by chance
        for fts in solos_store.FTS_TABLES:
            conn.execute(f"INSERT INTO {fts} ({fts}, rank) VALUES ('automerge', 0)")
    word = marker()
    text = f"met {word} at noon"
    bodies = {"long": {"fact": text}, "short": {"key": "k", "value": text}}
    bodies["episodic"] = {"event_type": "e", "summary": text}
    row_id = server.post(f"/v1/{tier}", {"agent": "atlas", **bodies[tier]}).body["id"]

    def busy(*_):
        raise solos_store.Busy("database is locked")

    monkeypatch.setattr(solos_forget.Scrubber, "merge", busy)
    monkeypatch.setattr(solos_forget.Scrubber, "finish", lambda *_: None)  # the hub's retry comes later
    ok, answer = forget(server, "atlas", tier, row_id)
    assert ok and answer["wal_checkpoint"] == "pending", answer
    checkpoint(server)
    assert files_holding(server, word[-16:])["db"] > 0  # the live file's index still holds the words

    taken = snapshot(server, tmp_path / "snapshots")
    copy = taken["path"].with_suffix(".db")
    assert copy.read_bytes().count(word[-16:].encode()) == 0
    assert taken["sha256"] == hashlib.sha256(copy.read_bytes()).hexdigest()
    with sqlite3.connect(copy) as conn:  # the copy says nothing waits: its indexes are merged
        assert conn.execute("SELECT count(*) FROM memory_scrub_pending").fetchone()[0] == 0
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_no_snapshot_or_restore_holds_a_short_value_past_its_expiry(server, make_server, tmp_path):
    """A secret kept an hour and expired before the day's snapshot, not yet purged: the snapshot copied the row
    and its index words, and kept them --keep days. And a snapshot from while it lived, restored after its
    expiry, brought it back into the live file until the next purge. Both now keep short values to the
    purge's rule (Queries.purge_expired_short), then merge the short index as a forget's scrub does."""
    folder = tmp_path / "snapshots"
    with server.db() as conn:
        conn.execute("INSERT INTO memory_short_fts (memory_short_fts, rank) VALUES ('automerge', 0)")
    expired, lived, live = marker(), marker(), marker()
    assert server.post("/v1/short", {"agent": "sol", "key": "k", "value": f"kept {live}", "ttl_s": 600}).status == 201
    assert server.post("/v1/short", {"agent": "atlas", "key": "a", "value": f"a {lived}", "ttl_s": 2}).status == 201
    old = snapshot(server, folder)  # while `lived` lives: it is in this one, as it should be
    assert old["path"].with_suffix(".db").read_bytes().count(lived[-16:].encode()) > 0
    body = {"agent": "atlas", "key": "b", "value": f"b {expired}", "ttl_s": 0.3}
    assert server.post("/v1/short", body).status == 201
    time.sleep(0.35)
    taken = snapshot(server, folder)
    copy = taken["path"].with_suffix(".db").read_bytes()
    assert copy.count(expired[-16:].encode()) == 0 and copy.count(live[-16:].encode()) > 0

    time.sleep(1.7)  # `lived` expires too; restore the snapshot that holds it into a fresh file
    fresh = tmp_path / "fresh.db"
    assert restore(old["path"], fresh)[0] == 0
    assert fresh.read_bytes().count(lived[-16:].encode()) == 0 and fresh.read_bytes().count(live[-16:].encode()) > 0
    restored = make_server("fresh.db")
    assert [r["text"] for r in restored.recall("sol", live, tiers="short").body["results"]] == [f"kept {live}"]


def test_a_row_the_fleet_rewrote_after_the_snapshot_stays_forgotten_after_a_restore(server, make_server, tmp_path):
    """The retraction's content hash is of the text the row held when it was forgotten; the snapshot holds the
    same row (tier, id, writer, birth) with the text before the fleet rewrote it in place. It is still the row."""
    folder = tmp_path / "snapshots"
    word = marker()
    fact = server.post("/v1/long", {"agent": "atlas", "topic": "t", "fact": f"first plan {word}"}).body["id"]
    server.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True})
    body = {"agent": "atlas", "event_type": "task", "summary": f"first try {word}"}
    episode = server.post("/v1/episodic", body).body["id"]
    old = snapshot(server, folder)
    with server.db() as conn:  # one of the fleet's writers rewrites both rows in place
        conn.execute("UPDATE memory_longterm SET fact = ? WHERE id = ?", (f"second plan {word}", fact))
        conn.execute("UPDATE memory_episodic SET summary = ? WHERE id = ?", (f"second try {word}", episode))
    for tier, row_id in (("long", fact), ("episodic", episode)):
        reply = server.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": tier, "id": row_id})
        assert reply.status == 200, reply.body
    snapshot(server, folder)
    fresh = tmp_path / "fresh.db"
    assert restore(old["path"], fresh)[0] == 0
    restored = make_server("fresh.db")
    assert restored.recall("sol", word, tiers="long,episodic").body["results"] == []
    assert files_holding(restored, word[-16:]) == {"db": 0, "-wal": 0}


# ---- a stale WAL, a running service, file modes, old schemas, killed runs, manifests' names and removals ----

# The release before schema version 2 (memory_scrub_pending): snapshots it took must stay restorable.
PREVIOUS_RELEASE = "0f4a7dc"


def restored(err: str) -> dict:
    """The restore command's log line."""
    return [json.loads(line) for line in err.splitlines() if '"event": "restore"' in line][-1]


def facts(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [row[0] for row in conn.execute("SELECT fact FROM memory_longterm ORDER BY id")]
    finally:
        conn.close()


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


@pytest.fixture
def private_umask():
    """The common umask, so a file's mode says what the code asked for."""
    before = os.umask(0o022)
    yield
    os.umask(before)


# ---- a stale WAL beside a missing target; the result is checked as the service will open it ----


def stale_wal_beside(target: Path) -> None:
    """What a deleted database leaves: its -wal, holding frames of another database's pages."""
    conn = sqlite3.connect(target, isolation_level=None)
    conn.execute("PRAGMA journal_mode=wal")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE old_thing (x)")
    conn.executemany("INSERT INTO old_thing VALUES (?)", [("x" * 200,)] * 300)
    shutil.copyfile(target.with_name(target.name + "-wal"), target.with_name("kept-wal"))
    conn.close()
    target.unlink()
    target.with_name("kept-wal").rename(target.with_name(target.name + "-wal"))


def test_a_restore_beside_a_stale_wal_is_refused_and_force_clears_it(server, tmp_path, capsys):
    server.post("/v1/long", {"agent": "atlas", "fact": "the restored fact"})
    manifest = snapshot(server, tmp_path / "snapshots")
    target = tmp_path / "w.db"
    stale_wal_beside(target)
    wal = target.with_name("w.db-wal")
    assert "w.db-wal" in refused(manifest["path"], target, capsys, "target")
    assert wal.exists() and not target.exists()

    status, err = restore(manifest["path"], target, capsys, "--force")
    assert status == 0, err
    assert any("removed w.db-wal" in warning for warning in restored(err)["warnings"])
    assert not wal.exists()
    assert facts(target) == ["the restored fact"]
    running = start_server(target)
    try:
        assert [r["text"] for r in running.recall("sol", "restored").body["results"]] == ["the restored fact"]
    finally:
        stop_server(running)


def test_a_restored_file_that_fails_its_quick_check_is_not_reported_as_restored(server, tmp_path, capsys, monkeypatch):
    """Whatever the checks before it missed, the file as placed is checked before success is reported."""
    for n in range(50):
        server.post("/v1/long", {"agent": "atlas", "topic": "t", "fact": f"fact number {n} " + "x" * 200})
    manifest = snapshot(server, tmp_path / "snapshots")
    target = tmp_path / "damaged.db"
    rename = Path.replace

    def rename_and_damage(self: Path, destination):
        moved = rename(self, destination)
        if self.name.endswith(".restore"):
            with open(destination, "r+b") as handle:  # the table pages after the schema's
                handle.seek(4096 * 3)
                handle.write(b"\xff" * 4096 * 4)
        return moved

    monkeypatch.setattr(Path, "replace", rename_and_damage)
    status, err = restore(manifest["path"], target, capsys)
    failure = [json.loads(line) for line in err.splitlines() if '"failed"' in line]
    assert status == 1 and failure and failure[-1]["reason"].startswith("result check failed"), err


# ---- a running service's database; what a restore discards ----


def test_restore_is_refused_while_a_service_holds_the_database(server, tmp_path, capsys):
    server.post("/v1/long", {"agent": "atlas", "fact": "in the snapshot"})
    manifest = snapshot(server, tmp_path / "snapshots")
    acknowledged = server.post("/v1/long", {"agent": "atlas", "fact": "acknowledged after the snapshot"})
    assert acknowledged.status == 201
    assert "running service" in refused(manifest["path"], server.db_path, capsys, "lock")
    assert "acknowledged after the snapshot" in facts(server.db_path)
    assert server.recall("sol", "acknowledged").body["count"] == 1


def test_a_service_does_not_start_while_a_restore_holds_the_database(tmp_path):
    db = tmp_path / "solos.db"
    descriptor = solos_snapshot.take_lock(db, exclusive=True)  # as restore holds it
    try:
        with pytest.raises(SystemExit, match="a restore into solos.db is running"):
            start_server(db)
    finally:
        os.close(descriptor)
    stop_server(start_server(db))


def test_restore_reports_the_rows_it_discards_per_tier_and_writer(tmp_path, capsys):
    server = start_server(tmp_path / "solos.db")
    try:
        server.request("PUT", "/v1/sharing", body={"agent": "sol", "episodic": True})
        server.post("/v1/long", {"agent": "atlas", "fact": "kept by the snapshot"})
        server.post("/v1/short", {"agent": "sol", "key": "pin", "value": "first"})
        manifest = snapshot(server, tmp_path / "snapshots")
        for n in range(2):
            server.post("/v1/long", {"agent": "atlas", "fact": f"written after the snapshot {n}"})
        server.post("/v1/episodic", {"agent": "sol", "event_type": "e", "summary": "an episode after it"})
        server.post("/v1/short", {"agent": "sol", "key": "pin", "value": "changed after it"})
        server.post("/v1/short", {"agent": "sol", "key": "new", "value": "new after it"})
    finally:
        stop_server(server)
    capsys.readouterr()
    status, err = restore(manifest["path"], tmp_path / "solos.db", capsys)
    assert status == 0, err
    report = restored(err)
    assert report["discarded"] == {"episodic": {"sol": 1}, "long": {"atlas": 2}, "short": {"sol": 2}}
    assert report["discarded_rows"] == 5
    assert facts(tmp_path / "solos.db") == ["kept by the snapshot"]


# ---- file modes ----


def test_the_database_its_wal_snapshots_and_folders_are_private(tmp_path, capsys, private_umask):
    server = start_server(tmp_path / "solos.db")
    try:
        server.post("/v1/long", {"agent": "atlas", "fact": "a private fact"})
        for name in ("solos.db", "solos.db-wal", "solos.db-shm", "solos.db.lock"):
            assert mode(tmp_path / name) == 0o600, name
        folder = tmp_path / "snapshots"
        folder.mkdir(mode=0o755)
        made = snapshot(server, folder)
        assert mode(folder) == 0o700
        assert {mode(made["path"]), mode(folder / made["file"])} == {0o600}
        shared = tmp_path / "shared"
        shared.mkdir(mode=0o755)
        (shared / "notes.txt").write_text("not a snapshot")
        snapshot(server, shared)
        assert mode(shared) == 0o755  # not ours to change; the snapshot said so
        assert any(
            "holds more than snapshots" in w for w in json.loads(capsys.readouterr().err.splitlines()[-1])["warnings"]
        )
    finally:
        stop_server(server)
    fresh = tmp_path / "fresh.db"
    assert restore(made["path"], fresh)[0] == 0
    assert mode(fresh) == 0o600


def test_a_service_with_tokens_warns_when_others_can_read_its_database(tmp_path, capsys):
    db = tmp_path / "solos.db"
    stop_server(start_server(db))
    db.chmod(0o644)
    capsys.readouterr()
    stop_server(start_server(db))
    assert "mode 644" not in capsys.readouterr().err  # without tokens anyone local may read it anyway
    tokens = tmp_path / "tokens"
    write_tokens(tokens, {"atlas-token": "atlas"})
    stop_server(start_server(db, tokens_file=str(tokens)))
    warnings = [json.loads(line) for line in capsys.readouterr().err.splitlines() if '"warning"' in line]
    assert warnings and "mode 644" in warnings[0]["message"] and "chmod 600" in warnings[0]["message"]


# ---- a snapshot an older release took ----

PREVIOUS_RELEASE_SNAPSHOTS = """
import sys
old, db, folder = sys.argv[1:]
sys.path.insert(0, old)
import solos_memory as m
memory = m.Memory(m.open_store(m.Config(db=db, model_dir="off")))
def call(name, **args):
    return m.invoke(memory, None, m.OPERATIONS[name], args, {})
m.register_agents(m.Config(db=db), ["atlas", "sol"])
secret = call("write_long", agent="atlas", topic="t", fact="the old secret")["id"]
call("write_long", agent="atlas", topic="t", fact="the old keeper")
call("write_episodic", agent="sol", event_type="e", summary="an old episode")
assert m.main(["snapshot", "--db", db, "--dir", folder]) == 0
call("forget", agent="atlas", tier="long", id=secret)
assert m.main(["snapshot", "--db", db, "--dir", folder]) == 0
memory.close()
"""


def previous_release(tmp_path: Path) -> Path:
    """The previous release's code, from git."""
    if shutil.which("git") is None:
        skip_or_fail("git is needed to check out the previous release")
    archive = tmp_path / "old.tar"
    made = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "-o", str(archive), PREVIOUS_RELEASE, "--", "*.py", "schema.sql"],
        capture_output=True,
        text=True,
    )
    if made.returncode:
        skip_or_fail(f"the previous release {PREVIOUS_RELEASE} is not in this checkout: {made.stderr.strip()}")
    old = tmp_path / "old"
    with tarfile.open(archive) as tar:
        tar.extractall(old, filter="data")
    return old


@pytest.mark.slow
def test_a_snapshot_the_previous_release_took_restores_into_the_current_schema(tmp_path, capsys):
    old = previous_release(tmp_path)
    db, folder = tmp_path / "old.db", tmp_path / "snapshots"
    made = subprocess.run(
        [sys.executable, "-c", PREVIOUS_RELEASE_SNAPSHOTS, str(old), str(db), str(folder)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    first = sorted(folder.glob("solos-*.json"))[0]
    assert json.loads(first.read_text())["schema_version"] == "1"
    target = tmp_path / "restored.db"
    status, err = restore(first, target, capsys)
    assert status == 0, err
    assert restored(err)["rows_forgotten_again"] == 1  # the old manifest's later retraction
    assert facts(target) == ["the old keeper"]
    with sqlite3.connect(target) as conn:
        assert conn.execute("SELECT value FROM solos_memory_meta WHERE key = 'schema_version'").fetchone()[0] == (
            solos_store.SCHEMA_VERSION
        )
        assert conn.execute("SELECT count(*) FROM memory_scrub_pending").fetchone()[0] == 0  # the new table
    running = start_server(target)
    try:
        assert [r["text"] for r in running.recall("sol", "old keeper secret").body["results"]] == ["the old keeper"]
        assert running.recall("sol", "episode", tiers="episodic").body["count"] == 1
    finally:
        stop_server(running)


def test_the_next_release_restores_this_releases_snapshots(server, tmp_path, capsys, monkeypatch):
    """A service whose schema grew since the snapshot (as every release's may) brings the copy up to date."""
    doomed = server.post("/v1/long", {"agent": "atlas", "fact": "forgotten after the snapshot"}).body["id"]
    server.post("/v1/long", {"agent": "atlas", "fact": "still here"})
    folder = tmp_path / "snapshots"
    taken = snapshot(server, folder)
    assert forget(server, "atlas", "long", doomed)[0]
    snapshot(server, folder)
    schema = solos_store.read_resource("schema.sql") + b"\nCREATE TABLE IF NOT EXISTS next_release (x TEXT);\n"
    monkeypatch.setattr(solos_store, "read_resource", lambda name: schema)
    monkeypatch.setattr(solos_store, "SCHEMA_VERSION", str(int(solos_store.SCHEMA_VERSION) + 1))
    target = tmp_path / "next.db"
    status, err = restore(taken["path"], target, capsys)
    assert status == 0, err
    assert facts(target) == ["still here"]
    with sqlite3.connect(target) as conn:
        assert conn.execute("SELECT value FROM solos_memory_meta WHERE key = 'schema_version'").fetchone()[0] == (
            solos_store.SCHEMA_VERSION
        )
        assert conn.execute("SELECT count(*) FROM next_release").fetchone()[0] == 0


# ---- what killed snapshots and restores leave ----


def kill_midway(command: list[str], started, timeout_s: float = 60.0) -> None:
    """Run a command and SIGKILL it as soon as `started()` finds its work file."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    deadline = time.monotonic() + timeout_s
    try:
        while not started():
            assert process.poll() is None, f"{command[2]} finished before it could be killed"
            assert time.monotonic() < deadline, f"{command[2]} never started its work file"
            time.sleep(0.002)
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL


def large_database(db: Path) -> None:
    """A database whose copy takes long enough to be killed mid-way: 40 MB the fleet wrote."""
    server = start_server(db)
    try:
        server.post("/v1/long", {"agent": "atlas", "fact": "a small fact"})
        with server.db() as conn:
            conn.execute("CREATE TABLE fleet_blobs (b BLOB)")
            conn.execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 40) "
                "INSERT INTO fleet_blobs SELECT randomblob(1048576) FROM n"
            )
    finally:
        stop_server(server)


def cli(command: str, *args: str) -> list[str]:
    return [sys.executable, str(ROOT / "solos_memory.py"), command, *args]


@pytest.mark.slow
def test_a_killed_snapshots_partial_file_is_removed_by_the_next_one(tmp_path):
    db, folder = tmp_path / "solos.db", tmp_path / "snapshots"
    large_database(db)
    take = cli("snapshot", "--db", str(db), "--dir", str(folder))
    kill_midway(take, lambda: [p for p in folder.glob(".solos-*.db.partial") if p.stat().st_size > 4 << 20])
    assert list(folder.glob(".solos-*.partial")), "the killed snapshot left its partial file"
    done = subprocess.run(take, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []

    (folder / ".solos-000009-20260101T000000Z.db.partial").write_bytes(b"a snapshot under way")
    held = os.open(folder, os.O_RDONLY)  # a snapshot under way holds the folder: its partial file is its own
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        busy = subprocess.run(take, capture_output=True, text=True, timeout=120)
        assert busy.returncode == 1 and "another snapshot is being taken" in busy.stderr
        assert list(folder.glob(".solos-*.partial"))
    finally:
        os.close(held)


@pytest.mark.slow
def test_a_killed_restores_copy_is_removed_when_the_service_starts(tmp_path):
    db, folder = tmp_path / "solos.db", tmp_path / "snapshots"
    large_database(db)
    assert subprocess.run(cli("snapshot", "--db", str(db), "--dir", str(folder)), timeout=120).returncode == 0
    work = tmp_path / ".solos.db.restore"
    manifest = sorted(folder.glob("solos-*.json"))[-1]
    kill_midway(cli("restore", str(manifest), "--db", str(db)), lambda: work.exists() and work.stat().st_size > 4 << 20)
    assert work.exists(), "the killed restore left its copy"
    stop_server(start_server(db))
    assert not [p.name for p in tmp_path.iterdir() if ".restore" in p.name]


# ---- a manifest's file field ----


def test_a_manifest_names_only_its_own_file(server, tmp_path, capsys):
    folder = tmp_path / "snapshots"
    server.post("/v1/long", {"agent": "atlas", "fact": "the real data"})
    first = snapshot(server, folder)
    second = snapshot(server, folder)
    victim = tmp_path / "victim.db"  # a database outside the folder, made to pass every other check
    shutil.copyfile(folder / first["file"], victim)
    original = second["path"].read_text()
    edited = json.loads(original)
    edited.update(file="../victim.db", sha256=hashlib.sha256(victim.read_bytes()).hexdigest())
    edited.update({k: first[k] for k in ("row_counts", "schema_sha256", "bytes")})
    second["path"].write_text(json.dumps(edited, indent=1, sort_keys=True) + "\n")  # the newest: no link after it
    assert "'../victim.db'" in refused(second["path"], tmp_path / "target.db", capsys, "manifest")
    second["path"].write_text(original)

    notes = tmp_path / "operator-notes.txt"
    notes.write_text("keep me")
    edited = json.loads(first["path"].read_text())
    edited["file"] = "../operator-notes.txt"
    first["path"].write_text(json.dumps(edited))
    snapshot(server, folder, keep=1)  # rotation removes the older snapshots: their own files, never the field's
    assert notes.read_text() == "keep me" and victim.exists()
    assert not (folder / first["file"]).exists() and not first["path"].exists()


# ---- removed manifests; the chain's head anchored in the live database ----


def forgotten_between_two_snapshots(server, folder: Path) -> tuple[str, dict, dict]:
    """A secret in the first snapshot, forgotten before the second, whose manifest the database anchors."""
    word = marker()
    secret = server.post("/v1/long", {"agent": "atlas", "fact": f"the secret {word}"}).body["id"]
    server.post("/v1/long", {"agent": "atlas", "fact": "the keeper"})
    old = snapshot(server, folder)
    assert forget(server, "atlas", "long", secret)[0]
    return word, old, snapshot(server, folder)


def test_removed_newest_manifests_are_noticed_and_a_forgotten_row_stays_forgotten(server, tmp_path, capsys):
    folder = tmp_path / "snapshots"
    word, old, newest = forgotten_between_two_snapshots(server, folder)
    newest["path"].unlink()
    (folder / newest["file"]).unlink()
    status, err = restore(old["path"], tmp_path / "b.db", capsys)
    assert status == 0, err
    assert any("the manifests after it were removed" in w for w in restored(err)["warnings"])
    assert facts(tmp_path / "b.db") == ["the keeper"]  # the live database's own retraction, re-applied

    stop_server(server)
    server.db_path.rename(tmp_path / "elsewhere.db")  # and the live database gone: nothing can tell what came later
    status, err = restore(old["path"], tmp_path / "c.db", capsys)
    assert status == 0, err
    warning, ids = restored(err)["warnings"]
    assert f"later retractions are known only up to snapshot {old['seq']}" in warning and "comes back" in warning
    assert "ids and event cursors from after the snapshot are stale" in ids  # and raised
    assert facts(tmp_path / "c.db") == [f"the secret {word}", "the keeper"]

    (tmp_path / "elsewhere.db").rename(server.db_path)
    assert solos_memory.main(["snapshot", "--db", str(server.db_path), "--dir", str(folder)]) == 0
    taken = [json.loads(line) for line in capsys.readouterr().err.splitlines() if '"event": "snapshot"' in line]
    assert any("the manifests after it were removed" in w for w in taken[-1]["warnings"])


def test_a_rewritten_newest_manifest_is_refused_by_the_anchor(server, tmp_path, capsys):
    """The newest manifest has no successor to carry its digest; the database's anchor does."""
    folder = tmp_path / "snapshots"
    _, old, newest = forgotten_between_two_snapshots(server, folder)
    rewritten = json.loads(newest["path"].read_text())
    rewritten["retractions"] = []  # so that a restore of the older snapshot would bring the secret back
    newest["path"].write_text(json.dumps(rewritten, indent=1, sort_keys=True) + "\n")
    assert "rewritten" in refused(old["path"], tmp_path / "a.db", capsys, "chain")
    assert solos_memory.main(["snapshot", "--db", str(server.db_path), "--dir", str(folder)]) == 1  # not chained on


# ---- a restore into a missing target never hands out an id or event id twice ----


def written_after_a_snapshot(server, folder: Path) -> tuple[Path, int, int]:
    """Fact 1, a snapshot, then fact 2 (a client keeps its id) and an episode: (manifest, fact 2's id, last event)."""
    assert server.post("/v1/long", {"agent": "atlas", "fact": "fact one, in the snapshot"}).status == 201
    assert solos_memory.main(["snapshot", "--db", str(server.db_path), "--dir", str(folder)]) == 0
    kept = server.post("/v1/long", {"agent": "atlas", "fact": "fact two, written after it"}).body["id"]
    assert server.post("/v1/episodic", {"agent": "atlas", "event_type": "note", "summary": "an episode"}).status == 201
    head = server.get("/v1/events", agent="atlas", since=0).body["next_since"]
    return sorted(folder.glob("solos-*.json"))[-1], kept, head


def after_the_restore(db: Path, kept: int, head: int) -> int:
    """atlas's next fact, a client's forget of its old id, and a subscriber resuming at its cursor; the new id."""
    running = start_server(db)
    try:
        new = running.post("/v1/long", {"agent": "atlas", "fact": "fact three, after the restore"}).body["id"]
        assert new > kept  # never the id a client still holds for fact two
        query = {"agent": "atlas", "tier": "long", "id": kept}
        assert running.request("DELETE", "/v1/memory", query=query).status == 404  # not the new fact
        assert [r["text"] for r in running.recall("atlas", "restore").body["results"]] == [
            "fact three, after the restore"
        ]
        resumed = running.get("/v1/events", agent="atlas", since=head).body["events"]
        assert [(e["kind"], e["row_id"]) for e in resumed] == [("write", new)]  # the resumed cursor sees it
        return new
    finally:
        stop_server(running)


def test_a_restore_beside_the_live_database_carries_its_marks_and_says_so(server, tmp_path, capsys):
    manifest, kept, head = written_after_a_snapshot(server, tmp_path / "snapshots")
    capsys.readouterr()
    beside = tmp_path / "beside.db"
    assert solos_memory.main(["restore", str(manifest), "--db", str(beside)]) == 0
    report = restored(capsys.readouterr().err)
    assert report["ids_from"] == str(server.db_path)
    assert any("beside" in w and str(server.db_path) in w and "a running service" in w for w in report["warnings"]), (
        report["warnings"]
    )
    assert after_the_restore(beside, kept, head) == kept + 1  # carried exactly: no jump


def test_a_restore_after_the_database_is_lost_raises_the_marks_and_says_ids_are_stale(tmp_path, capsys):
    db = tmp_path / "solos.db"
    server = start_server(db)
    try:
        manifest, kept, head = written_after_a_snapshot(server, tmp_path / "snapshots")
    finally:
        stop_server(server)
    lost = tmp_path / "lost"
    lost.mkdir()
    for file in tmp_path.glob("solos.db*"):
        file.rename(lost / file.name)  # the disk is gone
    capsys.readouterr()
    assert solos_memory.main(["restore", str(manifest), "--db", str(db)]) == 0
    report = restored(capsys.readouterr().err)
    assert report["ids_from"] is None
    stale = [w for w in report["warnings"] if "stale" in w]
    assert stale and "ids" in stale[0] and "cursors" in stale[0] and str(db) in stale[0], report["warnings"]
    assert after_the_restore(db, kept, head) > kept + solos_snapshot.UNKNOWN_IDS_MARGIN // 2
