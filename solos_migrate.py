"""solos_migrate: copy an SQLite solos.db into PostgreSQL, then prove the copy (the `migrate` command).

    python3 solos_memory.py migrate --from solos.db --to postgresql://USER@HOST/DB

1. --from is opened read-only (`mode=ro`, `query_only`) and read in one transaction: one consistent
   snapshot, even while a service writes to it. Nothing is written to it (like any reader of a WAL file, it
   may leave an empty -wal and a -shm beside it).
2. The schema is created on --to by PgStore(url, admin=True).migrate() (schema_pg.sql, additive), so the
   user needs what the service's first start needs: to own the tables it creates.
3. Table by table (TABLES), each in one PostgreSQL transaction: rows stream in key order, BATCH_ROWS at a
   time (COPY into a temporary table, then INSERT … ON CONFLICT DO NOTHING), with their ids.
   - Triggers: inside that transaction the table's triggers are disabled (ALTER TABLE … DISABLE TRIGGER;
     DDL is transactional, so no other session ever sees them off), but for the keyword index's
     (solos_fts_*), which fills fts, fts_tokens and a fact's context as each row lands, in id order, as
     `reindex` would. So a copied row logs no second event, version, notice or vector_generation bump:
     the source's own events, versions and notices are copied instead. Not `session_replication_role =
     replica`: that needs a superuser, and would turn the keyword index off too.
   - Ids: every identity sequence is set past the largest id the source ever handed out (its rows, its
     AUTOINCREMENT counters, and the tiers' row_id_high marks, which remember forgotten rows' ids), so no
     new row reuses an id a client, an event or a retraction still names.
   - Events keep their ids. PostgreSQL's own event ids are the writing transaction's id shifted left by
     24 bits (schema_pg.sql, solos_log_event), far above any SQLite id (checked: refused otherwise), so
     every event the new store logs sorts after every copied one: a subscriber keeps its `since` cursor
     across the move and misses nothing, and read_events' pruning gap (events_pruned_through) carries over.
   - solos_memory_meta: the settings are copied (the source's value wins), but for SQLite-only keys
     (META_SKIPPED: the id marks, the snapshot chain's anchor, the Qdrant mirror switch) and the target's
     own schema_version.
   - qdrant_outbox is not copied: the Qdrant mirror runs on SQLite only, so nothing would drain it (and a
     forgotten fact's entry holds a NUL, which PostgreSQL's text refuses). Its summary says how many
     entries were left, and how many forgotten private points' deletes wait in qdrant_import (forget_pending:
     copied, but only the mirror sends them); drain the mirror first. qdrant_import (what an import looked at)
     is copied.
4. Verify: per table, the row count and a sha256 over its rows in key order (the columns both schemas
   share; text as text, integers as decimals, floats by repr, blobs as hex, keys ordered bytewise on both
   sides) must be equal on both sides. One JSON line per table on stdout; exit 1 on any difference.

Re-running is safe: a row whose key the target already holds is never written again (nor overwritten, nor
deleted; settings excepted), so a second run copies only what the source gained since, and verifies again.
A target that holds another source's migration (`migrated_from`, recorded by the first run: the source's
`database_id`, or its real path) is refused before anything is copied, and so is one that logged events of
its own (the service ran on it); one
changed otherwise (a row edited by hand) fails verification, naming the tables. Either way: migrate into a
new, empty database.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sqlite3
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import solos_store

BATCH_ROWS = 5000  # rows read from SQLite and sent per COPY: bounded memory, few round trips
LOCK_TIMEOUT_MS = 10_000  # a target table in use (a service on it) stops the copy rather than wait forever
# An event id the target logs is (xid << 24) + its place in the transaction (schema_pg.sql, solos_log_event).
EVENT_ID_SHIFT = 24


@dataclass(frozen=True)
class Table:
    """One table to copy: its primary key (copy and hash order, conflict target) and its id space."""

    name: str
    key: tuple[str, ...]
    tier: str | None = None  # a tier's table: its identity goes past the tier's row_id_high mark too


# In this order: the fleet's tables, the tiers (long facts in id order, so each fact's context is right),
# then what refers to them. No foreign keys: the order only keeps a partial run readable.
TABLES = (
    Table("agent_registry", ("agent",)),
    Table("memory_durable", ("id",)),
    Table("solos_memory_meta", ("key",)),
    Table("memory_longterm", ("id",), "long"),
    Table("memory_episodic", ("id",), "episodic"),
    Table("memory_episodic_archive", ("id",)),
    Table("memory_short", ("id",), "short"),
    Table("memory_vector", ("tier", "row_id")),
    Table("memory_write_key", ("agent", "tier", "key")),
    Table("episodic_sharing", ("agent",)),
    Table("episodic_sharing_span", ("agent", "shared_from")),
    Table("episodic_read_audit", ("id",)),
    Table("memory_event", ("id",)),
    Table("memory_short_late_expiry", ("row_id",)),
    Table("memory_retraction", ("id",)),
    Table("memory_scrub_pending", ("tier",)),
    Table("memory_promotion", ("long_id", "episodic_id")),
    Table("memory_delivery", ("id",)),
    Table("memory_version", ("id",)),
    Table("memory_forgotten_span", ("retraction_id",)),
    Table("memory_forgotten_gap", ("retraction_id", "gap_from")),
    Table("memory_notice", ("id",)),
    Table("memory_job_run", ("id",)),
    Table("memory_activity", ("minute", "kind", "agent", "detail")),
    Table("qdrant_import", ("collection", "point_id", "content_sha256")),
)
NOT_COPIED = {
    "qdrant_outbox": "the Qdrant mirror runs on SQLite only; drain it (serve with --qdrant-url) before migrating: "
    "it alone sends these entries and the deletes of forgotten private points (forget_pending)",
}
# solos_memory_meta keys that mean something only in the SQLite file, and the target's own schema (its version
# and revision, and the hash of the schema_pg.sql that made it).
META_SKIPPED = (
    "schema_version",
    "schema_pg_sha256",
    "schema_pg_revision",
    "snapshot_head",
    "qdrant_mirror",
    solos_store.DATABASE_ID,
    "migrated_from",
)
MIGRATED_FROM = "migrated_from"  # the target's solos_memory_meta key: the source database's identity
META_SKIPPED_PREFIXES = ("row_id_high:",)


class MigrateError(Exception):
    """What stops a migration, in one line."""


# ==== CLI ====


def add_parser(commands: Any) -> None:
    """The `migrate` subcommand, added to the service's CLI."""
    migrate = commands.add_parser(
        "migrate",
        help="copy an SQLite database into PostgreSQL (rows, vectors, events, retractions, audit, settings), "
        "then verify counts and content hashes; safe to re-run; exit 1 on any difference",
    )
    migrate.add_argument(
        "--from",
        dest="source",
        required=True,
        help="the SQLite database to copy; opened read-only, never changed (required)",
    )
    migrate.add_argument(
        "--to",
        dest="target",
        required=True,
        help="the PostgreSQL database, a postgresql:// URL; its schema is created if missing (required)",
    )


def run(args: argparse.Namespace) -> int:
    """Run `migrate`: 0 when every table verified, 1 on a difference or an error (one line on stderr)."""
    try:
        return 0 if migrate(args.source, args.target, sys.stdout) else 1
    except (MigrateError, solos_store.StorageUnavailable, solos_store.SchemaMismatch) as error:
        reason = str(error)
    except sqlite3.Error as error:
        reason = f"{args.source}: {error}"
    except Exception as error:  # psycopg's errors, imported lazily
        if type(error).__module__.split(".")[0] != "psycopg":
            raise
        reason = f"{solos_store.shown(args.target)}: {first_line(error)}"
    solos_store.log_event("failed", command="migrate", reason=reason)
    return 1


# ==== The migration ====


def migrate(source: str, target: str, out: Any) -> bool:
    """Copy source into target and verify; print one JSON line per table and a last one; True if all agree."""
    if not solos_store.is_postgres(target):
        shown = target.split("://")[0] + "://…" if "://" in target else repr(target)  # no password in the log
        raise MigrateError(f"--to must be a postgresql:// URL, got {shown}")
    if not os.path.isfile(source):
        raise MigrateError(f"--from {source}: no such SQLite database")
    try:
        import psycopg

        import solos_store_pg
    except ImportError as error:
        raise MigrateError(f"migrate needs psycopg 3 ({error}): {solos_store.PSYCOPG}") from None
    started = time.monotonic()
    src = open_source(source)
    try:
        solos_store_pg.PgStore(target, admin=True).migrate()  # unreachable, or not allowed: one line
        dst = psycopg.connect(target, autocommit=True, connect_timeout=solos_store_pg.CONNECT_TIMEOUT_S)
        try:
            dst.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")
            dst.execute("SET statement_timeout = 0")  # a large table's copy may take minutes
            refuse_another_source(src, dst, source)
            refuse_a_used_target(src, dst)
            copies = [copy_table(src, dst, table) for table in TABLES]
            lines = verify(dst, copies) + [skip_table(src, name, why) for name, why in NOT_COPIED.items()]
        finally:
            dst.close()
    finally:
        src.close()
    differ = [line["table"] for line in lines if not line["ok"]]
    summary = {
        "migrated": not differ,
        "from": os.path.abspath(source),
        "to": solos_store.shown(target),
        "tables": len(copies),
        "rows": sum(copy.rows for copy in copies),
        "copied": sum(copy.copied for copy in copies),
        "differ": differ,
        "seconds": round(time.monotonic() - started, 2),
    }
    out.write("".join(json.dumps(line) + "\n" for line in [*lines, summary]))
    out.flush()
    if differ:
        solos_store.log_event(
            "migrate_differs",
            tables=differ,
            reason="the target holds rows the source does not, or other values under the same keys (written "
            "since, or changed by hand); migrate never overwrites a row: migrate into a new, empty database",
        )
    return not differ


def open_source(path: str) -> sqlite3.Connection:
    """The SQLite file, read-only, in one read transaction held until close: every table from one snapshot.

    Like any reader of a WAL database, it may leave an empty -wal and a -shm file beside it."""
    uri = f"file:{os.path.abspath(path)}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=5)
    conn.execute("PRAGMA query_only = 1")
    conn.execute("BEGIN")
    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # takes the snapshot (and checks the file)
    return conn


@dataclass
class Copied:
    """One table's copy: what verify compares (the source's count and hash) and how to read the target alike."""

    table: Table
    columns: list[str]  # in both schemas: fts, fts_tokens, context and xid are the target's own
    types: dict[str, str]  # the target's column types
    left_behind: list[str]  # the source's columns the target has not
    rows: int = 0
    copied: int = 0
    sha256: str = hashlib.sha256().hexdigest()
    seconds: float = 0.0


def quoted(names: Iterable[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


def target_columns(dst: Any, table: str) -> dict[str, str]:
    """The target table's columns and their types, in the schema's order."""
    rows = dst.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = %s ORDER BY ordinal_position",
        (table,),
    )
    return {name: kind for name, kind in rows}


def meta_copied(key: str) -> bool:
    return key not in META_SKIPPED and not key.startswith(META_SKIPPED_PREFIXES)


def copy_table(src: sqlite3.Connection, dst: Any, table: Table) -> Copied:
    """Copy one table in one target transaction, hashing the source's rows as they go by."""
    started = time.monotonic()
    types = target_columns(dst, table.name)
    present = solos_store.SQLITE.table_exists(src, table.name)  # an older solos.db may lack the newer tables
    have = [row[1] for row in src.execute("SELECT * FROM pragma_table_info(?)", (table.name,))] if present else []
    columns = [name for name in types if name in have]
    done = Copied(table, columns, types, [name for name in have if name not in types])
    if not present:
        return done
    if not set(table.key) <= set(columns):
        raise MigrateError(f"{table.name}: its key {table.key} is not in both schemas")
    digest = hashlib.sha256()
    try:
        with dst.transaction():
            quieted = quiet_triggers(dst, table.name)
            if table.name == "solos_memory_meta":
                done.rows, done.copied = copy_meta(src, dst, digest)
            else:
                if table.name == "memory_event":
                    check_event_ids(src, dst)
                select = f"SELECT {quoted(columns)} FROM {table.name} ORDER BY {quoted(table.key)}"
                done.rows, done.copied = copy_rows(src.execute(select), dst, table, columns, types, digest)
            for name, enable in quieted:
                dst.execute(f'ALTER TABLE {table.name} {enable} "{name}"')
            if "id" in types:
                advance_identity(src, dst, table)
    except sqlite3.OperationalError as error:
        if "Could not decode to UTF-8" not in str(error):
            raise
        raise MigrateError(not_utf8(src, table, columns) or str(error)) from None
    except Exception as error:
        if type(error).__module__.split(".")[0] != "psycopg":
            raise
        raise MigrateError(f"{table.name}: {first_line(error)} (nothing of this table was copied)") from None
    done.sha256, done.seconds = digest.hexdigest(), round(time.monotonic() - started, 2)
    return done


def quiet_triggers(dst: Any, table: str) -> list[tuple[str, str]]:
    """Disable the table's triggers but the keyword index's, for this transaction; how to turn each back on."""
    enable = {"O": "ENABLE TRIGGER", "A": "ENABLE ALWAYS TRIGGER", "R": "ENABLE REPLICA TRIGGER"}
    triggers = dst.execute(
        "SELECT t.tgname, t.tgenabled FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid "
        "WHERE t.tgrelid = %s::regclass AND NOT t.tgisinternal AND t.tgenabled <> 'D' "
        "AND p.proname NOT LIKE 'solos\\_fts\\_%%'",
        (table,),
    ).fetchall()
    for name, _ in triggers:
        dst.execute(f'ALTER TABLE {table} DISABLE TRIGGER "{name}"')
    return [(name, enable[str(mode)]) for name, mode in triggers]


def copy_rows(
    rows: sqlite3.Cursor, dst: Any, table: Table, columns: list[str], types: dict[str, str], digest: Any
) -> tuple[int, int]:
    """Stream rows into a temporary table by COPY, BATCH_ROWS at a time, then into the table in key order;
    rows whose key (or another unique column) is there already are left as they are. (rows read, copied)."""
    names, key = quoted(columns), quoted(table.key)
    same_key = " AND ".join(f's."{name}" = t."{name}"' for name in table.key)
    dst.execute(f"CREATE TEMP TABLE migrate_stage ON COMMIT DROP AS SELECT {names} FROM {table.name} WITH NO DATA")
    read = copied = 0
    while batch := rows.fetchmany(BATCH_ROWS):
        with dst.cursor().copy(f"COPY migrate_stage ({names}) FROM STDIN") as copy:
            for row in batch:
                refuse_unstorable(table, columns, types, row)
                copy.write_row(row)
                digest.update(row_bytes(row))
        copied += dst.execute(  # rows already there skip the insert triggers' work too (a re-run)
            f"INSERT INTO {table.name} ({names}) SELECT {names} FROM migrate_stage s WHERE NOT EXISTS "
            f"(SELECT 1 FROM {table.name} t WHERE {same_key}) ORDER BY {key} ON CONFLICT DO NOTHING"
        ).rowcount
        dst.execute("TRUNCATE migrate_stage")
        read += len(batch)
    return read, copied


def refuse_unstorable(table: Table, columns: list[str], types: dict[str, str], row: Sequence[Any]) -> None:
    """Stop at a value PostgreSQL's column refuses, naming its row and column: a text holding NUL, a BLOB in a
    column that is not bytea, text in a number column (the API refuses each, the fleet's direct writers need not,
    and SQLite keeps them). The COPY's own error names neither, and a BLOB went in as other text."""
    for name, value in zip(columns, row):
        if isinstance(value, str) and "\x00" in value:
            wrong = "holds a NUL character (0x00), which PostgreSQL's text refuses"
        elif isinstance(value, bytes) and types[name] != "bytea":
            wrong = f"is a BLOB, which PostgreSQL's {types[name]} column refuses"
        elif isinstance(value, str) and types[name] in NUMBER_TYPES and not number(value):
            wrong = f"is not a number ({value[:40]!r}), which PostgreSQL's {types[name]} column refuses"
        else:
            continue
        key = ", ".join(f"{part} {row[columns.index(part)]!r}" for part in table.key)
        raise MigrateError(
            f"{table.name} {key}: its {name} {wrong}; nothing of this table was copied. Mend that row in the "
            "SQLite file (or forget the row), then run migrate again"
        )


NUMBER_TYPES = ("bigint", "integer", "smallint", "double precision", "real", "numeric")


def number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def not_utf8(src: sqlite3.Connection, table: Table, columns: list[str]) -> str | None:
    """Which row holds text that is not UTF-8 (a direct writer's bytes, kept by SQLite), named as
    refuse_unstorable names one: PostgreSQL's text refuses it, and sqlite3's error names neither table nor row."""
    src.text_factory = lambda raw: raw.decode("utf-8", "replace")  # a text key may be such bytes itself
    try:
        for name in columns:
            rows = src.execute(
                f'SELECT {quoted(table.key)}, CAST("{name}" AS BLOB) FROM {table.name} '
                f"WHERE typeof(\"{name}\") = 'text' ORDER BY {quoted(table.key)}"
            )
            for *key, raw in rows:
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError:
                    named = ", ".join(f"{part} {value!r}" for part, value in zip(table.key, key))
                    return (
                        f"{table.name} {named}: its {name} is not UTF-8 text, which PostgreSQL's text refuses; "
                        "nothing of this table was copied. Mend that row in the SQLite file (or forget the row), "
                        "then run migrate again"
                    )
    finally:
        src.text_factory = str
    return None


def copy_meta(src: sqlite3.Connection, dst: Any, digest: Any) -> tuple[int, int]:
    """The settings: every key but META_SKIPPED's, the source's value winning (a setting, not a row)."""
    rows = [row for row in src.execute("SELECT key, value FROM solos_memory_meta ORDER BY key") if meta_copied(row[0])]
    copied = 0
    for key, value in rows:
        digest.update(row_bytes((key, value)))
        copied += dst.execute(
            "INSERT INTO solos_memory_meta (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE "
            "SET value = excluded.value WHERE solos_memory_meta.value IS DISTINCT FROM excluded.value",
            (key, value),
        ).rowcount
    return len(rows), copied


def source_identity(src: sqlite3.Connection, path: str) -> str:
    """The source database's identity: the random id its first start made (a copy or backup of the file shares
    it); a file no service of this release has opened yet is known by its real path."""
    row = None
    if solos_store.SQLITE.table_exists(src, "solos_memory_meta"):
        row = src.execute("SELECT value FROM solos_memory_meta WHERE key = ?", (solos_store.DATABASE_ID,)).fetchone()
    return f"database {row[0]}" if row else f"file {os.path.realpath(path)}"


def refuse_another_source(src: sqlite3.Connection, dst: Any, path: str) -> None:
    """Record the source's identity in the target on the first run, and stop before anything is copied when
    the target holds another source's migration: the two would be left mixed."""
    identity = source_identity(src, path)
    with dst.transaction():
        row = dst.execute("SELECT value FROM solos_memory_meta WHERE key = %s FOR UPDATE", (MIGRATED_FROM,)).fetchone()
        if row is None:
            dst.execute("INSERT INTO solos_memory_meta (key, value) VALUES (%s, %s)", (MIGRATED_FROM, identity))
        elif row[0] != identity:
            raise MigrateError(
                f"the target holds a migration from another source ({row[0]}; this is {identity}): nothing was "
                "copied. Migrate into a new, empty database"
            )


def refuse_a_used_target(src: sqlite3.Connection, dst: Any) -> None:
    """Stop before anything is copied when the target logged events of its own (the service or a writer used
    it since): copying then would mix the source's late rows and old settings into a live store."""
    last = 0
    if solos_store.SQLITE.table_exists(src, "memory_event"):
        last = src.execute("SELECT coalesce(max(id), 0) FROM memory_event").fetchone()[0]
    own = dst.execute("SELECT count(*) FROM memory_event WHERE id > %s", (last,)).fetchone()[0]
    if own:
        raise MigrateError(
            f"the target has events of its own ({own} past the source's last): the service or a writer has used "
            "it since, so it is no copy of this file any more; nothing was copied. Migrate into a new, empty database"
        )


def check_event_ids(src: sqlite3.Connection, dst: Any) -> None:
    """Copied events must sort below every event the target will log (this transaction's id and later)."""
    highest = src.execute("SELECT coalesce(max(id), 0) FROM memory_event").fetchone()[0]
    floor = dst.execute("SELECT pg_current_xact_id()::text::bigint << %s", (EVENT_ID_SHIFT,)).fetchone()[0]
    if highest >= floor:
        raise MigrateError(
            f"memory_event: the source's event ids reach {highest}, the target's own start at {floor}: "
            "copied events would sort among new ones; migrate into a PostgreSQL cluster that has run more "
            "transactions, or prune the source's events first"
        )


def advance_identity(src: sqlite3.Connection, dst: Any, table: Table) -> None:
    """Set the table's identity sequence past every id the source handed out, so none is handed out again."""
    sequence = dst.execute("SELECT pg_get_serial_sequence(%s, 'id')", (table.name,)).fetchone()[0]
    if sequence is None:
        return
    spent = [dst.execute(f"SELECT coalesce(max(id), 0) FROM {table.name}").fetchone()[0]]
    if solos_store.SQLITE.table_exists(src, "sqlite_sequence"):  # AUTOINCREMENT's counters: ids of rows since deleted
        counter = src.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (table.name,)).fetchone()
        spent.append(int(counter[0]) if counter else 0)
    if table.tier is not None:
        spent.append(solos_store.SQLITE.row_id_marks(src)[table.tier])
    last, called = dst.execute(f"SELECT last_value, is_called FROM {sequence}").fetchone()
    if max(spent) >= (last + 1 if called else last):
        dst.execute("SELECT setval(%s, %s)", (sequence, max(spent)))


def skip_table(src: sqlite3.Connection, name: str, why: str) -> dict:
    """A table left behind, with how many rows it held; the outbox's line also counts the forgotten private points
    whose delete waits in qdrant_import (copied, but sent by the SQLite mirror only: none runs on PostgreSQL)."""
    exists = solos_store.SQLITE.table_exists
    rows = src.execute(f"SELECT count(*) FROM {name}").fetchone()[0] if exists(src, name) else 0
    line = {"table": name, "ok": True, "rows": rows, "copied": 0, "skipped": why}
    if name == "qdrant_outbox":
        pending = "SELECT count(*) FROM qdrant_import WHERE reason = ?"
        waiting = src.execute(pending, (solos_store.FORGET_PENDING,)) if exists(src, "qdrant_import") else None
        line[solos_store.FORGET_PENDING] = waiting.fetchone()[0] if waiting else 0
    return line


# ==== Verify ====


def verify(dst: Any, copies: list[Copied]) -> list[dict]:
    """Count and hash every copied table on the target, in one snapshot: one summary line per table."""
    lines = []
    with dst.transaction():
        dst.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        for done in copies:
            count, digest = target_digest(dst, done)
            line: dict[str, Any] = {"table": done.table.name, "ok": count == done.rows and digest == done.sha256}
            line.update(rows=done.rows, target_rows=count, copied=done.copied, sha256=done.sha256)
            if digest != done.sha256:
                line["target_sha256"] = digest
            if done.left_behind:
                line["left_behind"] = done.left_behind
            lines.append({**line, "seconds": done.seconds})
    return lines


def target_digest(dst: Any, done: Copied) -> tuple[int, str]:
    """The target's rows of a table hashed as the source's were: same columns, same encoding, same order
    (text keys bytewise, as SQLite's BINARY collation orders them)."""
    name = done.table.name
    if not done.columns:
        return dst.execute(f"SELECT count(*) FROM {name}").fetchone()[0], digest_rows([])
    order = ", ".join(f'"{key}" COLLATE "C"' if done.types[key] == "text" else f'"{key}"' for key in done.table.key)
    cursor = dst.cursor(name=f"verify_{name}")  # server-side: BATCH_ROWS at a time
    cursor.itersize = BATCH_ROWS
    cursor.execute(f"SELECT {quoted(done.columns)} FROM {name} ORDER BY {order}")
    rows: Iterable[Sequence[Any]] = cursor
    if name == "solos_memory_meta":
        rows = (row for row in cursor if meta_copied(row[0]))
    digest, count = hashlib.sha256(), 0
    for row in rows:
        digest.update(row_bytes(row))
        count += 1
    cursor.close()
    return count, digest.hexdigest()


def digest_rows(rows: Iterable[Sequence[Any]]) -> str:
    digest = hashlib.sha256()
    for row in rows:
        digest.update(row_bytes(row))
    return digest.hexdigest()


def row_bytes(row: Sequence[Any]) -> bytes:
    """One row, normalised alike from either database: each value tagged with its kind, text length-prefixed."""
    return ("\x1f".join(cell(value) for value in row) + "\x1e").encode("utf-8", "surrogatepass")


def cell(value: Any) -> str:
    if value is None:
        return "n"
    if isinstance(value, bool):  # never from these schemas; kept apart from integers all the same
        return f"t{int(value)}"
    if isinstance(value, int):
        return f"i{value}"
    if isinstance(value, float):
        return f"f{value!r}"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"x{bytes(value).hex()}"
    text = str(value)
    return f"s{len(text)}:{text}"


def first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
