"""solos_snapshot: verified snapshots of the database, and a restore that checks before it touches anything.

`snapshot` takes a consistent online copy (VACUUM INTO) with a manifest per
copy: its sha256, row counts, schema, the time, and the previous manifest's
digest (a hash chain); it keeps the last N. `restore` verifies the chain, the
file, the schema and SQLite's integrity before it writes, then re-applies the
retractions recorded after the snapshot, so a forgotten row stays forgotten.

    python3 solos_memory.py snapshot [--dir DIR] [--keep N]
    python3 solos_memory.py restore SNAPSHOT [--db TARGET]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import solos_dataspace
import solos_jobs

SNAPSHOT_KEEP = 7
SNAPSHOT_FORMAT = "solos-memory-snapshot/1"
# The tables whose row counts a manifest records.
COUNTED_TABLES = (
    "agent_registry",
    "memory_durable",
    "memory_longterm",
    "memory_episodic",
    "memory_short",
    "memory_retraction",
    "memory_event",
)

# ==== Snapshots and restore ====


class SnapshotError(RuntimeError):
    """A snapshot or its chain failed a check; the message names the check."""

    def __init__(self, check: str, message: str):
        super().__init__(f"{check} check failed: {message}")
        self.check = check


def file_sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def open_readonly(path: Path) -> sqlite3.Connection:
    """A snapshot file, opened so that nothing (not even a -shm file) is written beside it."""
    conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro&immutable=1", uri=True)
    conn.row_factory = sqlite3.Row
    return conn


def describe_database(conn: sqlite3.Connection) -> dict:
    """What a manifest records about a database: schema version and fingerprint, row counts."""
    version = (
        solos_dataspace.meta_value(conn, "schema_version")
        if solos_dataspace.table_exists(conn, "solos_memory_meta")
        else None
    )
    schema = sorted(
        "|".join(map(str, row))
        for row in conn.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%'"
        )
    )
    return {
        "schema_version": version,
        "schema_sha256": solos_dataspace.sha256_text("\n".join(schema)),
        "row_counts": {
            table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in COUNTED_TABLES
            if solos_dataspace.table_exists(conn, table)
        },
    }


def manifests(folder: Path) -> list[Path]:
    return sorted(folder.glob("solos-*.json"))


def load_manifest(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    try:
        manifest = json.loads(raw)
    except ValueError as error:
        raise SnapshotError("manifest", f"{path.name} is not JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != SNAPSHOT_FORMAT:
        raise SnapshotError("manifest", f"{path.name} is not a {SNAPSHOT_FORMAT} manifest")
    return manifest, raw


def verify_chain(folder: Path) -> list[tuple[Path, dict]]:
    """Every manifest in order: names, sequence numbers, times and each one's digest of the one before."""
    chain: list[tuple[Path, dict]] = []
    previous: tuple[dict, bytes] | None = None
    for path in manifests(folder):
        manifest, raw = load_manifest(path)
        seq = manifest.get("seq")
        if not path.name.startswith(f"solos-{seq:06d}-" if isinstance(seq, int) else "\0"):
            raise SnapshotError(
                "chain", f"{path.name} holds sequence number {seq!r}: manifests were renamed or reordered"
            )
        if previous is not None:
            before, before_raw = previous
            if seq != before["seq"] + 1:
                raise SnapshotError("chain", f"{path.name} follows sequence {before['seq']}: a manifest is missing")
            if manifest.get("previous") != hashlib.sha256(before_raw).hexdigest():
                raise SnapshotError(
                    "chain", f"{path.name} does not carry the digest of {chain[-1][0].name}: a manifest was altered"
                )
            if str(manifest.get("created_at")) <= str(before["created_at"]):
                raise SnapshotError(
                    "chain", f"{path.name} is not newer than {chain[-1][0].name}: the chain is reordered"
                )
        elif seq == 1 and manifest.get("previous") is not None:
            raise SnapshotError("chain", f"{path.name} is the first snapshot but names a previous one")
        chain.append((path, manifest))
        previous = (manifest, raw)
    return chain


def take_snapshot(db: str, folder: Path, keep: int, busy_timeout_ms: int) -> dict:
    """A consistent online copy (VACUUM INTO: one read transaction, no write lock), its manifest, then rotation."""
    if keep < 1:
        raise SnapshotError("keep", f"--keep must be at least 1, got {keep}")
    if not os.path.exists(db):
        raise SnapshotError("database", f"no database at {db}")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # snapshots hold what the database holds
    existing = manifests(folder)
    previous = load_manifest(existing[-1]) if existing else None
    seq = previous[0]["seq"] + 1 if previous else 1
    name = f"solos-{seq:06d}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    partial = folder / f".{name}.db.partial"
    source = sqlite3.connect(f"{Path(db).absolute().as_uri()}?mode=ro", uri=True, timeout=busy_timeout_ms / 1000)
    try:
        source.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        source.execute("VACUUM INTO ?", (str(partial),))
    finally:
        source.close()
    try:
        with open(partial, "rb+") as handle:
            os.fsync(handle.fileno())
        snapshot = open_readonly(partial)
        try:
            described = describe_database(snapshot)
            after = previous[0]["last_retraction_id"] if previous else 0
            retractions = solos_dataspace.retractions_after(snapshot, after)
        finally:
            snapshot.close()
        manifest = {
            "format": SNAPSHOT_FORMAT,
            "seq": seq,
            "created_at": stamp_ns(time.time_ns()),
            "file": f"{name}.db",
            "sha256": file_sha256(partial),
            "bytes": partial.stat().st_size,
            **described,
            "last_retraction_id": retractions[-1]["id"] if retractions else after,
            "retractions": retractions,
            "previous": hashlib.sha256(previous[1]).hexdigest() if previous else None,
        }
        partial.replace(folder / manifest["file"])
        write_atomically(folder / f"{name}.json", json.dumps(manifest, indent=1, sort_keys=True).encode() + b"\n")
    finally:
        partial.unlink(missing_ok=True)
    removed = []
    for old in manifests(folder)[:-keep]:  # oldest first; the chain then starts at the oldest kept
        old_manifest, _ = load_manifest(old)
        (folder / str(old_manifest.get("file"))).unlink(missing_ok=True)
        old.unlink()
        removed.append(old.name)
    return {
        "snapshot": str(folder / manifest["file"]),
        "seq": seq,
        "sha256": manifest["sha256"],
        "rows": manifest["row_counts"],
        "removed": removed,
    }


def keep_counting(conn: sqlite3.Connection, event_seq: int) -> None:
    """Event ids continue above any the replaced database handed out, so no subscriber's Last-Event-ID goes stale."""
    if not conn.execute(
        "UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = 'memory_event'", (event_seq,)
    ).rowcount:
        conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('memory_event', ?)", (event_seq,))


def stamp_ns(ns: int) -> str:
    """UTC with nanoseconds: two snapshots within a millisecond still order by time."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + f".{ns % 10**9:09d}Z"


def write_atomically(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.partial")
    with open(partial, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    partial.replace(path)


def verify_snapshot(named: Path, schema_version: str) -> tuple[Path, dict, list[dict]]:
    """All checks, before anything is touched: chain, file hash, schema, integrity, row counts.

    Returns the snapshot file, its manifest and the retractions recorded in
    the manifests after it (the snapshot's own are already in the file).
    """
    manifest_path = named if named.suffix == ".json" else named.with_suffix(".json")
    if not manifest_path.is_file():
        raise SnapshotError("manifest", f"no manifest {manifest_path.name} beside the snapshot")
    chain = verify_chain(manifest_path.parent)
    position = next((i for i, (path, _) in enumerate(chain) if path.name == manifest_path.name), None)
    if position is None:
        raise SnapshotError("chain", f"{manifest_path.name} is not part of the chain in {manifest_path.parent}")
    manifest = chain[position][1]
    snapshot = manifest_path.parent / str(manifest["file"])
    if not snapshot.is_file():
        raise SnapshotError("file", f"{snapshot.name} is missing")
    if file_sha256(snapshot) != manifest["sha256"]:
        raise SnapshotError("file", f"{snapshot.name} does not match its manifest's sha256: the file was altered")
    if manifest.get("schema_version") != schema_version:
        raise SnapshotError(
            "schema",
            f"the snapshot has schema version {manifest.get('schema_version')!r}; this service's is {schema_version!r}",
        )
    conn = open_readonly(snapshot)
    try:
        described = describe_database(conn)
        verdict = conn.execute("PRAGMA quick_check").fetchone()[0]
    except sqlite3.DatabaseError as error:
        raise SnapshotError("integrity", f"{snapshot.name} is not a readable database ({error})") from None
    finally:
        conn.close()
    if described["schema_version"] != schema_version or described["schema_sha256"] != manifest.get("schema_sha256"):
        raise SnapshotError("schema", f"{snapshot.name}'s schema is not the one its manifest records")
    if verdict != "ok":
        raise SnapshotError("integrity", f"quick_check of {snapshot.name}: {verdict}")
    if described["row_counts"] != manifest.get("row_counts"):
        raise SnapshotError("integrity", f"{snapshot.name}'s row counts differ from its manifest's")
    later = [r for _, later_manifest in chain[position + 1 :] for r in later_manifest.get("retractions", [])]
    return snapshot, manifest, later


def restore_snapshot(named: Path, target: Path, schema_version: str, busy_timeout_ms: int) -> dict:
    """Verify, rebuild the store in a private copy with later retractions re-applied, then put it in place.

    Retractions come from the manifests after the snapshot and from the
    target database, if it exists. The copy is scrubbed (secure delete, index
    merges, VACUUM) before it replaces anything, so neither the target nor
    its WAL ever holds a forgotten row again. An existing target is
    overwritten through SQLite's backup API (one transaction; safe beside
    other connections), a new one by a rename. Event ids keep increasing.
    """
    snapshot, manifest, retractions = verify_snapshot(named, schema_version)
    event_seq, id_marks = 0, {}
    if target.exists():
        current = sqlite3.connect(target, timeout=busy_timeout_ms / 1000)
        current.row_factory = sqlite3.Row
        try:
            retractions += solos_dataspace.retractions_after(current, 0)
            id_marks = solos_dataspace.row_id_marks(current)
            if solos_dataspace.table_exists(current, "sqlite_sequence"):
                row = current.execute("SELECT seq FROM sqlite_sequence WHERE name = 'memory_event'").fetchone()
                event_seq = row[0] if row else 0
        finally:
            current.close()
    work = target.with_name(f".{target.name}.restore")
    shutil.copyfile(snapshot, work)
    try:
        conn = sqlite3.connect(work, isolation_level=None)
        conn.row_factory = sqlite3.Row
        try:
            conn.execute("BEGIN IMMEDIATE")
            erased = sum(solos_dataspace.reapply(conn, retraction) for retraction in retractions)
            keep_counting(conn, event_seq)
            solos_dataspace.mark_row_ids(conn, id_marks)  # ids the replaced database handed out stay spent
            conn.execute("COMMIT")
            for fts in [name for names in solos_dataspace.KEYWORD_INDEX.values() for name in names]:
                while solos_dataspace.merge_step(conn, fts) >= 2:
                    pass
            conn.execute("VACUUM")
            if target.exists():
                live = sqlite3.connect(target, timeout=busy_timeout_ms / 1000)
                try:
                    live.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
                    conn.backup(live)
                    live.execute("PRAGMA journal_mode=wal")
                    solos_dataspace.checkpoint_truncate(live, busy_timeout_ms)
                finally:
                    live.close()
        finally:
            conn.close()
        if not target.exists():
            work.replace(target)
    finally:
        work.unlink(missing_ok=True)
    return {
        "snapshot": str(snapshot),
        "seq": manifest["seq"],
        "target": str(target),
        "checks": "passed",
        "retractions_known": len(retractions),
        "rows_forgotten_again": erased,
    }


# ==== CLI: snapshot and restore ====


def add_commands(commands: Any, add_database_options: Callable[[argparse.ArgumentParser, str], None]) -> None:
    """The snapshot and restore subcommands, added to the service's CLI (with its --db and --busy-timeout-ms)."""
    snapshot = commands.add_parser("snapshot", help="take a verified online snapshot of --db; keep the last --keep")
    add_database_options(snapshot, "the database to snapshot; it must exist (default: %(default)s)")
    snapshot.add_argument("--dir", default=None, help="snapshot folder (default: 'snapshots' beside the database)")
    snapshot.add_argument(
        "--keep", type=int, default=SNAPSHOT_KEEP, help="snapshots to keep, oldest removed first (default: %(default)s)"
    )
    restore = commands.add_parser(
        "restore", help="verify a snapshot and its chain, then restore it into --db, re-applying later retractions"
    )
    add_database_options(
        restore, "the database to restore into, touched only once every check passed (default: %(default)s)"
    )
    restore.add_argument("snapshot", help="the snapshot's .db file or its .json manifest")


def run_command(args: argparse.Namespace, schema_version: str) -> dict:
    """Run `snapshot` or `restore`; what it did, for the log line. SnapshotError names a failed check."""
    if args.command == "snapshot":
        folder = Path(args.dir) if args.dir else Path(args.db).absolute().parent / "snapshots"
        return solos_jobs.recorded(
            args.db,
            "snapshot",
            lambda: take_snapshot(args.db, folder, args.keep, args.busy_timeout_ms),
            lambda done: sum(done["rows"].values()),
        )
    return restore_snapshot(Path(args.snapshot), Path(args.db), schema_version, args.busy_timeout_ms)


COMMANDS = ("snapshot", "restore")
