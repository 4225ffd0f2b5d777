"""solos_snapshot: verified snapshots of the database, a restore that checks before it touches anything, and the files.

`snapshot` takes a consistent online copy (VACUUM INTO) with a manifest per
copy: its sha256, row counts, schema, the time, the database it came from and
the previous manifest's digest (a hash chain); it keeps the last N and anchors
the chain's head in the database itself. `restore` verifies the chain, the
file, the schema and SQLite's integrity before it writes, brings an older
snapshot's schema up to date, re-applies the retractions recorded after the
snapshot (so a forgotten row stays forgotten), says which newer rows it
discards, and checks the result as the service will open it. It refuses while
a service holds the database, unless --force.

The files: the database (so its -wal and -shm), snapshots and manifests are
created 0600, snapshot folders 0700. A running service holds a shared flock
on DB.lock (`hold_database`); a restore takes it exclusively.

    python3 solos_memory.py snapshot [--dir DIR] [--keep N]
    python3 solos_memory.py restore SNAPSHOT [--db TARGET] [--force]
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import solos_jobs
import solos_store

SNAPSHOT_KEEP = 7
COPY_PURGE_BATCH = 10_000  # expired short rows (and versions) a copy drops per statement; the copy is its own
# A restore that cannot read any database of the snapshot's chain (the disk is lost) raises every row-id mark and
# the event sequence by this much: more than a fleet writes between two daily snapshots, far below SQLite's 2**63.
UNKNOWN_IDS_MARGIN = 1_000_000_000
SNAPSHOT_FORMAT = "solos-memory-snapshot/1"
# The tables whose row counts a manifest records.
# Rows counted in each manifest: the fleet's tables, every tier's, and the retractions and events.
COUNTED_TABLES = (
    "agent_registry",
    "memory_durable",
    *(tier.table for tier in solos_store.LIVE_TIERS),
    "memory_retraction",
    "memory_event",
)
# What a snapshot folder may hold; anything else there means the folder is not ours to chmod.
SNAPSHOT_NAME = re.compile(r"\.?solos-\d{6}-\d{8}T\d{6}Z\.(db|json)(\.partial(-journal)?)?")
# SQLite's files beside a database. Left by a database that is gone, SQLite applies them to a new file there.
SIDE_FILES = ("-wal", "-shm", "-journal")
ANCHOR_KEY = "snapshot_head"  # solos_memory_meta: the newest manifest this database has seen written
# What a restore compares to say which rows it discards: per tier, the tables, the writer and the columns
# a writer sets (an embedding filled in later, or a timestamp alone, is no loss).
DISCARD_COLUMNS = {
    "short": (("memory_short",), "agent", "key, value, tags, expires_at"),
    "long": (("memory_longterm",), "agent", "topic, fact, source, confidence, tags"),
    "episodic": (
        ("memory_episodic", "memory_episodic_archive"),  # an episode archived since is not lost
        "agent",
        "event_type, summary, details, outcome, duration_s, timestamp",
    ),
    "durable": (("memory_durable",), "'fleet'", "key, value"),
}

# ==== The database's files: modes, the service's hold ====


class SnapshotError(RuntimeError):
    """A snapshot or its chain failed a check; the message names the check."""

    def __init__(self, check: str, message: str):
        super().__init__(f"{check} check failed: {message}")
        self.check = check


def create_private(path: str | Path) -> bool:
    """Create an empty file only its owner can read (SQLite gives a database's -wal and -shm its mode).

    False if it existed, or could not be made (SQLite then says why it cannot open it).
    """
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError:
        return False
    return True


def lock_path(db: Path) -> Path:
    return db.with_name(db.name + ".lock")


def take_lock(db: Path, exclusive: bool) -> int | None:
    """flock DB.lock without waiting: its descriptor; None when the lock file cannot be opened (read-only folder).

    BlockingIOError when another process holds it the other way. Not a lock
    on the database file itself: closing any descriptor of a file drops every
    POSIX lock the process holds on it, SQLite's own included
    (https://sqlite.org/howtocorrupt.html#posix_close_bug).
    """
    try:
        descriptor = os.open(lock_path(db), os.O_RDONLY | os.O_CREAT, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(descriptor, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise
    return descriptor


def work_path(target: Path) -> Path:
    """Where a restore builds the new database before it replaces the target."""
    return target.with_name(f".{target.name}.restore")


def remove_work(target: Path) -> list[str]:
    """Remove a restore's work copy and its side files (a killed restore's, when no restore holds the lock)."""
    work = work_path(target)
    removed = []
    for path in (work, *(work.with_name(work.name + suffix) for suffix in SIDE_FILES)):
        if path.exists():
            path.unlink()
            removed.append(path.name)
    return removed


@dataclass
class Hold:
    """A running service's shared lock on its database: a restore refuses while one is held."""

    descriptor: int | None
    warnings: list[str] = field(default_factory=list)

    def release(self) -> None:
        if self.descriptor is not None:
            os.close(self.descriptor)
            self.descriptor = None


def hold_database(db: str, tokens_on: bool) -> Hold:
    """For a starting service: the lock (SnapshotError while a restore runs), a killed restore's copy removed.

    Warns when tokens guard the service but the file lets other local users read every agent's memory.
    """
    path = Path(db)
    try:
        descriptor = take_lock(path, exclusive=False)
    except BlockingIOError:
        raise SnapshotError("lock", f"a restore into {path.name} is running: it holds {lock_path(path).name}") from None
    hold = Hold(descriptor)
    if descriptor is not None:
        remove_work(path)  # no restore runs: a copy left is a killed one's, maybe holding forgotten rows
    for file in (path, *(path.with_name(path.name + suffix) for suffix in SIDE_FILES)):
        mode = file.stat().st_mode & 0o777 if tokens_on and file.exists() else 0
        if mode & 0o044:
            hold.warnings.append(
                f"{file} is mode {mode:o}: tokens guard the service, yet any local user can read every agent's "
                f"memory from the file; chmod 600 it"
            )
    return hold


def private_folder(folder: Path) -> list[str]:
    """Create the folder 0700; tighten one that holds nothing but snapshots; say so of one that holds more."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = folder.stat().st_mode & 0o777
    if not mode & 0o077:
        return []
    if all(SNAPSHOT_NAME.fullmatch(entry.name) for entry in folder.iterdir()):
        folder.chmod(0o700)
        return []
    return [f"{folder} is mode {mode:o} and holds more than snapshots, so it is left so: snapshots hold every memory"]


# ==== Manifests and their chain ====


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
        solos_store.SQLITE.meta_value(conn, "schema_version")
        if solos_store.SQLITE.table_exists(conn, "solos_memory_meta")
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
        "schema_sha256": solos_store.sha256_text("\n".join(schema)),
        "row_counts": {
            table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in COUNTED_TABLES
            if solos_store.SQLITE.table_exists(conn, table)
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


@dataclass(frozen=True)
class Link:
    """One manifest of a verified chain, with the sha256 of its bytes (what the next one and the anchor carry)."""

    path: Path
    manifest: dict
    digest: str


def verify_chain(folder: Path) -> list[Link]:
    """Every manifest in order: names, sequence numbers, times and each one's digest of the one before."""
    chain: list[Link] = []
    for path in manifests(folder):
        manifest, raw = load_manifest(path)
        seq = manifest.get("seq")
        if not path.name.startswith(f"solos-{seq:06d}-" if isinstance(seq, int) else "\0"):
            raise SnapshotError(
                "chain", f"{path.name} holds sequence number {seq!r}: manifests were renamed or reordered"
            )
        if manifest.get("file") != path.stem + ".db":  # never a path: ../victim.db would be restored
            raise SnapshotError("manifest", f"{path.name} names the file {manifest.get('file')!r}, not {path.stem}.db")
        if chain:
            before = chain[-1]
            if seq != before.manifest["seq"] + 1:
                raise SnapshotError(
                    "chain", f"{path.name} follows sequence {before.manifest['seq']}: a manifest is missing"
                )
            if manifest.get("previous") != before.digest:
                raise SnapshotError(
                    "chain", f"{path.name} does not carry the digest of {before.path.name}: a manifest was altered"
                )
            if str(manifest.get("created_at")) <= str(before.manifest["created_at"]):
                raise SnapshotError(
                    "chain", f"{path.name} is not newer than {before.path.name}: the chain is reordered"
                )
        elif seq == 1 and manifest.get("previous") is not None:
            raise SnapshotError("chain", f"{path.name} is the first snapshot but names a previous one")
        chain.append(Link(path, manifest, sha256_bytes(raw)))
    return chain


def read_anchor(conn: sqlite3.Connection) -> dict | None:
    """The chain head a database anchored (take_snapshot), or None."""
    if not solos_store.SQLITE.table_exists(conn, "solos_memory_meta"):
        return None
    try:
        anchor = json.loads(solos_store.SQLITE.meta_value(conn, ANCHOR_KEY) or "null")
    except ValueError:
        return None
    return anchor if isinstance(anchor, dict) and isinstance(anchor.get("seq"), int) else None


def anchor_of(manifest: dict, digest: str) -> dict | None:
    """What a database records of its chain's newest manifest; None for a manifest written before anchors."""
    if not manifest.get("chain"):
        return None
    return {"chain": manifest["chain"], "seq": manifest["seq"], "sha256": digest, "at": manifest["created_at"]}


def removed_after(chain: list[Link], anchor: dict | None, where: str) -> str | None:
    """Compare a database's anchor with the folder: a warning when newer manifests were removed, else None.

    Raises when the anchored manifest is there but is not the one anchored
    (rewritten). None also when the anchor is of another chain, or absent.
    """
    head = chain[-1].manifest if chain else {}
    if anchor is None or not head.get("chain") or anchor.get("chain") != head["chain"]:
        return None
    if anchor["seq"] > head["seq"]:
        return (
            f"{where} anchored snapshot {anchor['seq']} of this chain, but the folder ends at {head['seq']}: "
            f"the manifests after it were removed"
        )
    anchored = next((link for link in chain if link.manifest["seq"] == anchor["seq"]), None)
    if anchored is not None and anchored.digest != anchor.get("sha256"):
        raise SnapshotError("chain", f"{anchored.path.name} is not the manifest {where} anchored: it was rewritten")
    return None


# ==== Snapshot ====


def take_snapshot(db: str, folder: Path, keep: int, busy_timeout_ms: int) -> dict:
    """A consistent online copy, its manifest, the chain's head anchored in the database, then rotation.

    One snapshot at a time per folder (a flock on the folder), so what a
    killed one left (`.partial` files) is removed first.
    """
    if keep < 1:
        raise SnapshotError("keep", f"--keep must be at least 1, got {keep}")
    if not os.path.exists(db):
        raise SnapshotError("database", f"no database at {db}")
    warnings = private_folder(folder)  # snapshots hold what the database holds
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SnapshotError("lock", f"another snapshot is being taken in {folder}") from None
        abandoned = [path.name for path in folder.glob(".solos-*.partial*")]  # and VACUUM INTO's -journal
        for name in abandoned:
            (folder / name).unlink()
        existing = manifests(folder)
        previous = load_manifest(existing[-1]) if existing else None
        if previous is not None:
            if (foreign := another_database(previous[0], db)) is not None:
                raise SnapshotError(
                    "folder",
                    f"{folder} holds the snapshots of {foreign}, not of {db}: give "
                    "each database a folder of its own (--dir)",
                )
            link = Link(existing[-1], previous[0], sha256_bytes(previous[1]))
            dropped = removed_after([link], database_anchor(db), db)  # raises if that manifest was rewritten
            warnings += [dropped] if dropped else []
        manifest, raw = write_snapshot(db, folder, previous, busy_timeout_ms)
        warnings += anchor_head(db, anchor_of(manifest, sha256_bytes(raw)), busy_timeout_ms)
        removed = []
        for old in manifests(folder)[:-keep]:  # oldest first; the chain then starts at the oldest kept
            old.with_suffix(".db").unlink(missing_ok=True)  # the name the manifest's own implies, never its field
            old.unlink()
            removed.append(old.name)
    finally:
        os.close(descriptor)
    return {
        "snapshot": str(folder / manifest["file"]),
        "seq": manifest["seq"],
        "sha256": manifest["sha256"],
        "rows": manifest["row_counts"],
        "removed": removed,
        "abandoned_removed": abandoned,
        "warnings": warnings,
    }


def another_database(manifest: dict, db: str) -> str | None:
    """The database a folder's newest manifest was taken of, if not db: its chain, sequence and retractions are
    another's, and rotation would delete that one's snapshots. A database moved since (its anchor names the
    chain) is the same one; a manifest from before `database` was recorded names none."""
    source = manifest.get("database")
    if not source or Path(source) == Path(db).absolute():
        return None
    if os.path.exists(source) and os.path.samefile(source, db):
        return None
    anchor = database_anchor(db)
    if anchor is not None and manifest.get("chain") and anchor.get("chain") == manifest["chain"]:
        return None
    return str(source)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_snapshot(
    db: str, folder: Path, previous: tuple[dict, bytes] | None, busy_timeout_ms: int
) -> tuple[dict, bytes]:
    """VACUUM INTO (one read transaction, no write lock) a 0600 file, then its manifest; (manifest, its bytes)."""
    seq = previous[0]["seq"] + 1 if previous else 1
    name = f"solos-{seq:06d}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    partial = folder / f".{name}.db.partial"
    create_private(partial)  # VACUUM INTO fills an empty file and keeps its mode
    try:
        source = sqlite3.connect(f"{Path(db).absolute().as_uri()}?mode=ro", uri=True, timeout=busy_timeout_ms / 1000)
        try:
            source.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            source.execute("VACUUM INTO ?", (str(partial),))
        finally:
            source.close()
        copy = sqlite3.connect(partial, isolation_level=None)
        try:  # a forget's scrub still queued: the copy's index segments hold its words, merged out here
            if solos_store.SQLITE.table_exists(copy, "memory_scrub_pending"):
                copy.execute("BEGIN")
                drop_expired(copy)  # queues the short tier's scrub when it drops anything
                copy.execute("COMMIT")
                queued = solos_store.SQLITE.queued_scrubs(copy)
                if queued:
                    scrub_copy(copy, list(queued))
        finally:
            copy.close()
        with open(partial, "rb+") as handle:
            os.fsync(handle.fileno())
        snapshot = open_readonly(partial)
        try:
            described = describe_database(snapshot)
            after = previous[0]["last_retraction_id"] if previous else 0
            retractions = solos_store.SQLITE.retractions_after(snapshot, after)
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
            "previous": sha256_bytes(previous[1]) if previous else None,
            "database": str(Path(db).absolute()),  # where a restore asks which later retractions exist
            "chain": (previous[0].get("chain") if previous else None) or secrets.token_hex(8),
        }
        raw = json.dumps(manifest, indent=1, sort_keys=True).encode() + b"\n"
        partial.replace(folder / manifest["file"])
        write_atomically(folder / f"{name}.json", raw)
    finally:
        partial.unlink(missing_ok=True)
    return manifest, raw


def drop_expired(conn: sqlite3.Connection) -> None:
    """A copy keeps no short value past its expiry, as the daily purge keeps none (Queries.purge_expired_short,
    inside the caller's transaction: the copy is the snapshot's or the restore's own); the short tier's scrub is
    queued for scrub_copy."""
    if solos_store.SQLITE.table_exists(conn, "memory_version"):
        while max(solos_store.SQLITE.purge_expired_short(conn, COPY_PURGE_BATCH)) >= COPY_PURGE_BATCH:
            pass


def scrub_copy(conn: sqlite3.Connection, tiers: list[str]) -> None:
    """Take forgotten text out of a copy, as the live file's scrub does: the tiers' keyword indexes merged into
    one segment (FTS5 deletes leave the words in older ones), its queued scrubs done, then VACUUM."""
    for fts in [name for tier in tiers for name in solos_store.KEYWORD_INDEX[tier]]:
        while solos_store.SQLITE.merge_step(conn, fts) >= 2:
            pass
    solos_store.SQLITE.scrubs_done(conn, solos_store.SQLITE.queued_scrubs(conn))  # merged here, vacuumed next
    conn.execute("VACUUM")


def database_anchor(db: str | Path) -> dict | None:
    """The anchor a database holds, read without writing anything; None if it cannot be read."""
    try:
        conn = sqlite3.connect(f"{Path(db).absolute().as_uri()}?mode=ro", uri=True)
        try:
            return read_anchor(conn)
        finally:
            conn.close()
    except sqlite3.Error:
        return None


def anchor_head(db: str, anchor: dict | None, busy_timeout_ms: int) -> list[str]:
    """Record the chain's newest manifest in the database, so a restore notices newer manifests removed."""
    if anchor is None:
        return []
    try:
        conn = sqlite3.connect(db, isolation_level=None, timeout=busy_timeout_ms / 1000)
        try:
            if not solos_store.SQLITE.table_exists(conn, "solos_memory_meta"):
                return [f"{db} has no solos_memory_meta table (never served): the chain's head is not anchored"]
            conn.execute("BEGIN IMMEDIATE")
            solos_store.SQLITE.set_meta(conn, ANCHOR_KEY, json.dumps(anchor, sort_keys=True))
            conn.execute("COMMIT")
        finally:
            conn.close()
    except sqlite3.Error as error:
        return [f"the chain's head is not anchored in {db}: {error}"]
    return []


def stamp_ns(ns: int) -> str:
    """UTC with nanoseconds: two snapshots within a millisecond still order by time."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + f".{ns % 10**9:09d}Z"


def write_atomically(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.partial")
    with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    partial.replace(path)


# ==== Restore ====


def schema_number(version: Any) -> int | None:
    """A schema version as a number: 0 before the service recorded one; None for one it cannot read."""
    if version is None:
        return 0
    return int(version) if isinstance(version, str) and version.isdigit() else None


@dataclass
class Verified:
    """A snapshot that passed every check: its file, manifest, the chain it is in, and the retractions after it."""

    snapshot: Path
    manifest: dict
    chain: list[Link]
    later: list[dict]


def verify_snapshot(named: Path, schema_version: str) -> Verified:
    """All checks, before anything is touched: chain, file hash, schema, integrity, row counts.

    The snapshot is verified as it was written (its own schema against its
    manifest's); an older schema is brought up to date afterwards, in the
    copy. Only a schema newer than this service's is refused. The
    retractions after it come from the manifests after it (its own are
    already in the file).
    """
    manifest_path = named if named.suffix == ".json" else named.with_suffix(".json")
    if not manifest_path.is_file():
        raise SnapshotError("manifest", f"no manifest {manifest_path.name} beside the snapshot")
    chain = verify_chain(manifest_path.parent)
    position = next((i for i, link in enumerate(chain) if link.path.name == manifest_path.name), None)
    if position is None:
        raise SnapshotError("chain", f"{manifest_path.name} is not part of the chain in {manifest_path.parent}")
    manifest = chain[position].manifest
    snapshot = manifest_path.with_suffix(".db")
    if not snapshot.is_file():
        raise SnapshotError("file", f"{snapshot.name} is missing")
    if file_sha256(snapshot) != manifest["sha256"]:
        raise SnapshotError("file", f"{snapshot.name} does not match its manifest's sha256: the file was altered")
    version = schema_number(manifest.get("schema_version"))
    if version is None or version > int(schema_version):
        raise SnapshotError(
            "schema",
            f"the snapshot has schema version {manifest.get('schema_version')!r}, newer than this service's "
            f"{schema_version!r}: restore it with the release that took it",
        )
    conn = open_readonly(snapshot)
    try:
        described = describe_database(conn)
        verdict = conn.execute("PRAGMA quick_check").fetchone()[0]
    except sqlite3.DatabaseError as error:
        raise SnapshotError("integrity", f"{snapshot.name} is not a readable database ({error})") from None
    finally:
        conn.close()
    if (described["schema_version"], described["schema_sha256"]) != (
        manifest.get("schema_version"),
        manifest.get("schema_sha256"),
    ):
        raise SnapshotError("schema", f"{snapshot.name}'s schema is not the one its manifest records")
    if verdict != "ok":
        raise SnapshotError("integrity", f"quick_check of {snapshot.name}: {verdict}")
    if described["row_counts"] != manifest.get("row_counts"):
        raise SnapshotError("integrity", f"{snapshot.name}'s row counts differ from its manifest's")
    later = [r for link in chain[position + 1 :] for r in link.manifest.get("retractions", [])]
    return Verified(snapshot, manifest, chain, later)


def restore_snapshot(
    named: Path, target: Path, schema_version: str, busy_timeout_ms: int, migrate: Callable[[Path], None], force: bool
) -> dict:
    """Verify, then rebuild the store in a private copy and put it in place; refused while a service holds target.

    `migrate` brings the copy's schema up to this service's (the service's
    own additive migration). --force restores under a running service:
    whatever it writes meanwhile is lost.
    """
    verified = verify_snapshot(named, schema_version)
    warnings = []
    try:
        descriptor = take_lock(target, exclusive=True)
    except BlockingIOError:
        if not force:
            raise SnapshotError(
                "lock",
                f"a running service holds {target.name} ({lock_path(target).name}): stop it first, or pass "
                f"--force to restore under it (what it writes during the restore is lost)",
            ) from None
        descriptor = None
        warnings.append("--force: a service holds the database; rows it wrote during the restore are lost")
    try:
        return rebuild(verified, target, busy_timeout_ms, migrate, force, warnings)
    finally:
        if descriptor is not None:
            os.close(descriptor)


def rebuild(
    verified: Verified, target: Path, busy_timeout_ms: int, migrate: Callable[[Path], None], force: bool, warnings: list
) -> dict:
    """restore_snapshot's work, under the lock: what the live database says, the copy, the swap, the check.

    The copy is scrubbed (secure delete, index merges, VACUUM) before it
    replaces anything, so neither the target nor its WAL ever holds a
    forgotten row again. An existing target is overwritten through SQLite's
    backup API (one transaction; safe beside other connections), a new one by
    a rename. The result is opened as the service will open it and checked.
    """
    existed = target.exists()
    abandoned = remove_work(target)  # a killed restore's: no other restore holds the lock
    if not existed:
        stale = [path for path in side_files(target) if path.exists()]
        if stale and not force:
            raise SnapshotError(
                "target",
                f"{target.name} is missing but {', '.join(p.name for p in stale)} are beside it: left by a database "
                f"that is gone, SQLite would apply them to the restored file; remove them, or pass --force",
            )
        for path in stale:
            path.unlink()
            warnings.append(f"removed {path.name}, left by a database that is gone")
    retractions, carried = later_retractions(verified, target, existed, busy_timeout_ms, warnings)
    work = work_path(target)
    create_private(work)
    try:
        shutil.copyfile(verified.snapshot, work)
        migrate(work)  # an older snapshot's schema brought up to date, as the service does with an older database
        conn = sqlite3.connect(work, isolation_level=None)
        conn.row_factory = sqlite3.Row
        try:
            conn.execute("BEGIN IMMEDIATE")
            erased = sum(solos_store.SQLITE.reapply(conn, retraction) for retraction in retractions)
            drop_expired(conn)  # a snapshot from while a value lived, restored after its expiry
            carry_forward(conn, carried, anchor_of(verified.chain[-1].manifest, verified.chain[-1].digest))
            conn.execute("COMMIT")
            scrub_copy(conn, list(solos_store.KEYWORD_INDEX))
            if conn.execute("PRAGMA journal_mode=delete").fetchone()[0] != "delete":  # all of it in the one file
                raise SnapshotError("copy", f"{work.name} could not leave WAL mode")
            schema = describe_database(conn)["schema_sha256"]
            discarded = discarded_rows(conn, target) if existed else {}
            if existed:
                live = sqlite3.connect(target, timeout=busy_timeout_ms / 1000)
                try:
                    live.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
                    conn.backup(live)
                    live.execute("PRAGMA journal_mode=wal")
                    solos_store.SQLITE.checkpoint_truncate(live, busy_timeout_ms)
                finally:
                    live.close()
        finally:
            conn.close()
        if not existed:
            work.replace(target)
    finally:
        remove_work(target)
    check_result(target, schema, busy_timeout_ms)
    return {
        "snapshot": str(verified.snapshot),
        "seq": verified.manifest["seq"],
        "target": str(target),
        "checks": "passed",
        "schema_version_restored": verified.manifest.get("schema_version"),
        "retractions_known": len(retractions),
        "ids_from": carried["from"],  # the database whose ids and events restore carried on; None: raised
        "rows_forgotten_again": erased,
        "discarded_rows": sum(n for writers in discarded.values() for n in writers.values()),
        "discarded": discarded,
        "abandoned_removed": abandoned,
        "warnings": warnings,
    }


def side_files(db: Path) -> list[Path]:
    return [db.with_name(db.name + suffix) for suffix in SIDE_FILES]


def later_retractions(
    verified: Verified, target: Path, existed: bool, busy_timeout_ms: int, warnings: list
) -> tuple[list[dict], dict]:
    """The retractions recorded after the snapshot, and what the restored copy carries forward (carry_forward).

    Retractions: from the manifests after it, and from the live database:
    the target if it exists, and the database the snapshots came from when it
    anchored this chain (a manifest removed since then cannot hide a
    retraction). Id marks and the event sequence: the largest any of them
    handed out. When none of them can tell (the source is lost and the target
    is new, or not of this chain), the warnings say from when on retractions
    are unknown, and the marks are raised by UNKNOWN_IDS_MARGIN, since
    clients' ids and cursors from after the snapshot are stale.
    """
    head = verified.chain[-1]
    retractions, carried = list(verified.later), {"id_marks": {}, "event_seq": 0, "anchor": None, "from": None}
    chained = False  # whether a database read anchors this chain, so knows every id and retraction since
    if existed:  # the database being replaced knows every retraction it made, whatever the folder lost
        conn = sqlite3.connect(target, timeout=busy_timeout_ms / 1000)
        conn.row_factory = sqlite3.Row
        try:
            dropped = removed_after(verified.chain, read_anchor(conn), str(target))
            warnings += [f"{dropped}; its own retractions are re-applied"] if dropped else []
            retractions += solos_store.SQLITE.retractions_after(conn, 0)
            chained = carry_from(carried, conn, target, head)
        finally:
            conn.close()
    source = Path(str(verified.manifest.get("database") or ""))
    reason = "the manifests do not name the database they came from"
    if source.name and not source.exists():
        reason = f"the database they came from ({source}) is not here"
    elif existed and source.name and source.absolute() == target.absolute():
        reason = f"{target} does not anchor this chain"
    elif source.name:
        try:
            conn = sqlite3.connect(f"{source.absolute().as_uri()}?mode=ro", uri=True, timeout=busy_timeout_ms / 1000)
            conn.row_factory = sqlite3.Row
            try:
                anchor = read_anchor(conn)
                dropped = removed_after(verified.chain, anchor, str(source))
                if anchor is not None and anchor.get("chain") == head.manifest.get("chain"):
                    warnings += [f"{dropped}; {source}'s own retractions are re-applied"] if dropped else []
                    retractions += solos_store.SQLITE.retractions_after(conn, 0)
                reason = f"{source} does not anchor this chain"
                chained = carry_from(carried, conn, source, head) or chained
            finally:
                conn.close()
            warnings.append(beside_the_source(source, target))
        except sqlite3.Error as error:
            reason = f"{source} cannot be read ({error})"
    if chained or (existed and not head.manifest.get("chain")):  # a manifest from before anchors: as it was
        return retractions, carried
    if not existed:
        warnings.append(
            f"later retractions are known only up to snapshot {head.manifest['seq']} "
            f"({head.manifest['created_at']}): {reason}, so a row forgotten after that comes back"
        )
    carried["from"], carried["raise_by"] = None, UNKNOWN_IDS_MARGIN
    warnings.append(
        f"no database that knows the ids handed out after snapshot {head.manifest['seq']} could be read ({reason}): "
        f"{target}'s row ids and event ids were raised by {UNKNOWN_IDS_MARGIN:,}, so none is handed out twice, "
        f"but clients' ids and event cursors from after the snapshot are stale: ids kept since then name nothing "
        f"(or a row restored under it), and subscribers should recall to catch up, then resume from the new events"
    )
    return retractions, carried


def carry_from(carried: dict, conn: sqlite3.Connection, database: Path, head: Link) -> bool:
    """Raise what a restore carries forward to what one live database handed out; whether it anchors head's chain."""
    state = carried_state(conn)
    marks = carried["id_marks"]
    for tier, mark in state["id_marks"].items():
        marks[tier] = max(marks.get(tier, 0), mark)
    if state["event_seq"] >= carried["event_seq"]:
        carried["from"] = str(database)
    carried["event_seq"] = max(carried["event_seq"], state["event_seq"])
    before, anchor = carried["anchor"], state["anchor"]
    if anchor and (not before or (anchor.get("chain") == before.get("chain") and anchor["seq"] > before["seq"])):
        carried["anchor"] = anchor
    return bool(anchor and head.manifest.get("chain") and anchor.get("chain") == head.manifest["chain"])


def beside_the_source(source: Path, target: Path) -> str:
    """The warning for a restore into a second database beside the one the snapshots came from."""
    serving = ""
    try:
        descriptor = take_lock(source, exclusive=True) if lock_path(source).exists() else None  # no stray lock file
    except BlockingIOError:
        descriptor, serving = None, "a running service holds it, and "
    if descriptor is not None:
        os.close(descriptor)
    return (
        f"restored beside {source}, the database the snapshots came from: {serving}its agents, writers and "
        f"subscribers go on there, not in {target}; ids and events are carried from it as of now, so the two "
        f"databases hand out the same ids from here on: point everything at one of them"
    )


def discarded_rows(conn: sqlite3.Connection, target: Path) -> dict[str, dict[str, int]]:
    """Rows of the target that the restored copy lacks or holds otherwise (written or changed since), per tier, writer.

    Expired short rows are not counted: they were going anyway.
    """
    conn.execute("ATTACH DATABASE ? AS replaced", (str(target),))
    try:
        found: dict[str, dict[str, int]] = {}
        for tier in DISCARD_COLUMNS:
            before, after = tier_rows(conn, "replaced", tier), tier_rows(conn, "main", tier)
            if not before:  # the target never had the tier's table
                continue
            counts = conn.execute(
                f"SELECT writer, count(*) FROM ({before} EXCEPT {after}) GROUP BY writer ORDER BY writer"
            ).fetchall()
            if counts:
                found[tier] = {str(writer): n for writer, n in counts}
        return found
    finally:
        conn.execute("DETACH DATABASE replaced")


def tier_rows(conn: sqlite3.Connection, schema: str, tier: str) -> str:
    """A SELECT of a tier's rows in one attached database as discarded_rows compares them ('' if it has none)."""
    tables, writer, columns = DISCARD_COLUMNS[tier]
    live = " WHERE expires_at > strftime('%Y-%m-%dT%H:%M:%fZ', 'now')" if tier == "short" else ""
    return " UNION ALL ".join(
        f"SELECT id, {writer} AS writer, {columns} FROM {schema}.{table}{live}"
        for table in tables
        if conn.execute(f"SELECT 1 FROM {schema}.sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
    )


def check_result(target: Path, schema: str, busy_timeout_ms: int) -> None:
    """Open the restored database as the service will (WAL and all) and check it before reporting success."""
    conn = sqlite3.connect(target, timeout=busy_timeout_ms / 1000)
    try:
        verdict = conn.execute("PRAGMA quick_check").fetchone()[0]
        same = describe_database(conn)["schema_sha256"] == schema
    except sqlite3.DatabaseError as error:
        verdict, same = str(error), True
    finally:
        conn.close()
    if verdict != "ok":
        raise SnapshotError("result", f"quick_check of the restored {target.name}: {verdict}")
    if not same:
        raise SnapshotError("result", f"the restored {target.name} does not hold the schema that was restored")


def carried_state(conn: sqlite3.Connection) -> dict:
    """What the replaced database hands on to the restored one (carry_forward writes it)."""
    row = (
        conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'memory_event'").fetchone()
        if solos_store.SQLITE.table_exists(conn, "sqlite_sequence")
        else None
    )
    return {
        "event_seq": row[0] if row else 0,
        "anchor": read_anchor(conn),
        "id_marks": solos_store.SQLITE.row_id_marks(conn),
    }


def carry_forward(conn: sqlite3.Connection, carried: dict, head: dict | None) -> None:
    """Write into the restored copy what must outlive the database it replaces.

    Event ids keep counting above any the replaced database handed out, so
    no subscriber's Last-Event-ID goes stale. The chain's anchor is the
    folder's head, or the replaced database's if newer (so removed manifests
    stay noticed). Row ids the replaced database handed out stay spent: the
    id marks never go back (schema.sql, "Row ids: never reused").
    """
    margin = carried.get("raise_by", 0)  # nothing could say which ids were handed out after the snapshot
    if margin:
        own = carried_state(conn)
        carried["id_marks"] = {tier: mark + margin for tier, mark in own["id_marks"].items()}
        carried["event_seq"] = max(own["event_seq"], solos_store.SQLITE.head_event(conn)) + margin
    solos_store.SQLITE.mark_row_ids(conn, carried.get("id_marks"))
    event_seq = carried.get("event_seq", 0)
    if not conn.execute(
        "UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = 'memory_event'", (event_seq,)
    ).rowcount:
        conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('memory_event', ?)", (event_seq,))
    before = carried.get("anchor")
    if head is None or (before and before.get("chain") == head["chain"] and before["seq"] > head["seq"]):
        head = before
    if head:
        solos_store.SQLITE.set_meta(conn, ANCHOR_KEY, json.dumps(head, sort_keys=True))


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
    restore.add_argument(
        "--force",
        action="store_true",
        help="restore even while a service holds --db (its writes meanwhile are lost), and remove a missing "
        "database's leftover -wal/-shm/-journal (default: refuse both)",
    )


def run_command(args: argparse.Namespace, schema_version: str, migrate: Callable[[Path], None]) -> dict:
    """Run `snapshot` or `restore`; what it did, for the log line. SnapshotError names a failed check."""
    if args.command == "snapshot":
        folder = Path(args.dir) if args.dir else Path(args.db).absolute().parent / "snapshots"
        return solos_jobs.recorded(
            args.db,
            "snapshot",
            lambda: take_snapshot(args.db, folder, args.keep, args.busy_timeout_ms),
            lambda done: sum(done["rows"].values()),
        )
    return restore_snapshot(
        Path(args.snapshot), Path(args.db), schema_version, args.busy_timeout_ms, migrate, args.force
    )


COMMANDS = ("snapshot", "restore")
