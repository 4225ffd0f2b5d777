"""solos_store_pg: the same store over PostgreSQL, for a fleet on more than one host (`--db postgresql://…`).

Imported only when the database is a PostgreSQL URL, so the core keeps needing the standard library alone.
PgStore is solos_store.Store with PostgreSQL's connections, transactions and SQL; the module's functions
are the ones solos_store.on(conn) hands a PostgreSQL connection (the rest are solos_store's own, whose SQL
both databases read alike). The schema is schema_pg.sql.

What is not the same, and why:

- Keyword recall is Okapi BM25 computed in SQL from a tsvector per row (FTS5's bm25(), same k1, b and
  column weights), since PostgreSQL's ts_rank ignores how rare a word is.
- Writers do not queue behind one lock: PostgreSQL takes row locks. Writes that must not race (the same long
  fact, the same idempotency key) take a transaction-scoped advisory lock on their key.
- Events are read only below the oldest running transaction (xid8), because ids commit out of order.
- A forget's dead tuples go with a VACUUM of the touched tables, run by a thread of its own; WAL segments
  and base backups keep the text until they are recycled (SECURITY.md).
- Snapshots are pg_dump's (docs/operations.md): `snapshot` and `restore` refuse a PostgreSQL URL.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import psycopg
import psycopg.errors
from psycopg.types.numeric import FloatLoader

import solos_store
from solos_store import (  # noqa: F401  (re-exported: SQL both databases read alike, for on(conn))
    DELIVERY_COLUMNS,
    KEYWORD_INDEX,
    NOTICE_COLUMNS,
    REMOVALS,
    RETRACTABLE,
    TIER_TABLE,
    VERSION_FIELDS,
    VERSIONED,
    Busy,
    Conflict,
    NotFound,
    StorageUnavailable,
    Tier,
    UnknownAgent,
    Visibility,
    content_hash,
    delivered_by,
    lifecycle_counts,
    log_event,
    own_retraction,
    parse_tags,
    purge_deliveries,
    queued_scrubs,
    read_resource,
    retracted_as_of,
    retractions_after,
    scrubs_done,
    set_meta,
    sha256_text,
    sharing_agents,
    utc_now,
)

SERVICE_ROLE = "solos_memory_service"
MIGRATION_LOCK = 8437  # pg_advisory_xact_lock key: copies starting together create the schema one at a time
STATEMENT_TIMEOUT_MS = 30_000
CONNECT_TIMEOUT_S = 5
STATS_TTL_S = 1.0  # how long a tier's row count and mean length (BM25's N and avgdl) are reused
BM25_K1, BM25_B = 1.2, 0.75  # FTS5's
# Per table: the weight of each tsvector class A-D, from the FTS5 column weights (solos_store.TIER_TABLE) as
# schema_pg.sql files the columns; OWN_CLASSES: a row's own text (FTS5's column filter {topic fact tags agent}).
WEIGHTS = {
    "memory_longterm": (1.0, 0.5, 0.3, 0.0),
    "memory_episodic": (1.0, 0.7, 0.5, 0.0),
    "memory_episodic_archive": (1.0, 0.7, 0.5, 0.0),
    "memory_short": (1.0, 0.5, 0.0, 0.0),
}
ALL_CLASSES, OWN_CLASSES, FACT_CLASS = "ABCD", "AB", "A"
QUOTED = re.compile(r'"((?:[^"]|"")*)"')

# SQLSTATEs: retried as a busy database (serialization, deadlock), refused as busy (a lock wait ran out).
RETRIED = ("40001", "40P01")
LOCK_TIMEOUT = "55P03"


class PgRow(tuple):
    """A result row read by position or by column name, and as a dict: what sqlite3.Row gives the callers."""

    names: dict[str, int]

    def __new__(cls, values: Sequence[Any], names: dict[str, int]) -> PgRow:
        row = super().__new__(cls, values)
        row.names = names
        return row

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        return super().__getitem__(self.names[key] if isinstance(key, str) else key)

    def keys(self) -> list[str]:
        return list(self.names)


def pg_rows(cursor: Any) -> Callable[[Sequence[Any]], PgRow]:
    names = {column.name: index for index, column in enumerate(cursor.description or ())}
    return lambda values: PgRow(values, names)


def placeholders(sql: str) -> str:
    """The store's SQL uses sqlite3's `?`; psycopg's is `%s` (a literal % doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


class PgConnection(psycopg.Connection):
    """A psycopg connection that runs the store's `?` SQL and carries this module's queries (solos_store.on)."""

    queries: Any = None  # this module, set below
    reusable = True

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:  # type: ignore[override]
        return super().execute(placeholders(query), params or (), **kwargs)

    def executemany(self, query: str, params_seq: Iterable[Sequence[Any]]) -> Any:
        cursor = self.cursor()
        cursor.executemany(placeholders(query), list(params_seq))
        return cursor

    @property
    def in_transaction(self) -> bool:
        return self.info.transaction_status != psycopg.pq.TransactionStatus.IDLE


# ==== The store ====


class PgStore(solos_store.Store):
    """The PostgreSQL database: a pool of connections working as the service's role, every query."""

    BEGIN_READ, BEGIN_WRITE = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "BEGIN"

    def __init__(self, url: str, busy_timeout_ms: int = 5000, admin: bool = False):
        super().__init__(url, busy_timeout_ms, admin)
        self.stats: dict[str, tuple[float, int, float]] = {}  # table -> (read at, rows, mean tokens)
        self.vacuum_lock = threading.Lock()
        self.vacuuming: threading.Thread | None = None
        self.vacuum_wanted = False

    def connect(self) -> PgConnection:  # type: ignore[override]
        try:
            conn = PgConnection.connect(self.path, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.OperationalError as error:
            raise StorageUnavailable(unreachable(self.path, error)) from None
        conn.row_factory = pg_rows  # type: ignore[assignment]
        conn.adapters.register_loader("numeric", FloatLoader)  # sums and averages: JSON numbers, as SQLite's are
        conn.execute(f"SET lock_timeout = {int(self.busy_timeout_ms)}")
        conn.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
        conn.execute("SET TIME ZONE 'UTC'")
        if not self.admin:
            conn.execute(f"SET ROLE {SERVICE_ROLE}")  # the fleet's registry and personas: read, never written
        return conn

    def checkin(self, conn: Any) -> None:
        if conn.reusable and not conn.closed and conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:
                conn.reusable = False
        if conn.reusable and not conn.closed and self.pool.qsize() < solos_store.POOL_SIZE:
            self.pool.put(conn)
        else:
            conn.close()

    def run(self, work: Callable[[Any], Any], write: bool) -> Any:
        """Run work in one transaction (reads: one REPEATABLE READ snapshot), retrying serialization failures and
        deadlocks within busy_timeout; a lock wait past it is Busy, an unreachable server StorageUnavailable."""
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        for attempt in range(solos_store.BUSY_RETRIES + 1):
            conn = self.checkout()
            try:
                conn.execute(self.BEGIN_WRITE if write else self.BEGIN_READ)
                result = work(conn)
                conn.execute("COMMIT")
                return result
            except psycopg.OperationalError as error:
                state = getattr(error, "sqlstate", None)
                if state == LOCK_TIMEOUT:
                    raise Busy(f"database is locked: a lock wait passed {self.busy_timeout_ms} ms ({error})") from None
                if state not in RETRIED:
                    conn.reusable = False
                    self.close()  # its pool-mates lost the same server
                    log_event("storage_failure", db=solos_store.shown(self.path), error=str(error))
                    raise StorageUnavailable(unreachable(self.path, error)) from None
                last_error = error
            except psycopg.errors.QueryCanceled as error:
                raise Busy(f"the database took longer than {STATEMENT_TIMEOUT_MS} ms ({error})") from None
            finally:
                self.checkin(conn)
            pause = min(0.05 * 2**attempt, deadline - time.monotonic())
            if pause <= 0:
                break
            time.sleep(pause)
        raise Busy(f"transaction kept conflicting with other writers ({last_error})")

    def checkout(self) -> Any:
        conn: Any = super().checkout()
        if conn.closed or conn.broken:
            conn = self.connect()
        return conn

    # -- schema --

    def migrate(self) -> None:
        """Create what is missing (schema_pg.sql, additive), one copy at a time; say clearly what stops it."""
        schema = read_resource("schema_pg.sql").decode("utf-8")
        try:
            self.create_schema(schema)
        except psycopg.OperationalError as error:
            raise StorageUnavailable(unreachable(self.path, error)) from None
        except psycopg.errors.InsufficientPrivilege as error:
            raise solos_store.SchemaMismatch(
                f"the database user may not create or grant solos-memory's schema ({first_line(error)}); "
                "run the service once as the database's owner, or apply schema_pg.sql as it"
            ) from None
        except psycopg.Error as error:
            raise solos_store.SchemaMismatch(f"schema_pg.sql could not be applied: {first_line(error)}") from None

    def create_schema(self, schema: str) -> None:
        conn = PgConnection.connect(self.path, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK,))
                super(PgConnection, conn).execute(schema)
                conn.execute(
                    "INSERT INTO solos_memory_meta (key, value) VALUES ('schema_version', ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (solos_store.SCHEMA_VERSION,),
                )
                conn.execute(
                    "INSERT INTO solos_memory_meta (key, value) VALUES ('vector_generation', '0'), (?, solos_now()) "
                    "ON CONFLICT DO NOTHING",
                    (solos_store.JOBS_WATCHED_SINCE,),
                )
                superuser = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]
                if not superuser:
                    conn.execute(f"GRANT {SERVICE_ROLE} TO CURRENT_USER")
        finally:
            conn.close()

    def reindex(self) -> None:
        def work(conn: Any) -> None:
            for tier in TIER_TABLE.values():
                conn.execute(f"UPDATE {tier.table} SET fts = NULL")

        self.write(work)

    # -- agents --

    def register_agents(self, names: list[str]) -> list[str]:
        def work(conn: Any) -> list[str]:
            return [
                name
                for name in names
                if conn.execute(
                    "INSERT INTO agent_registry (agent) VALUES (?) ON CONFLICT DO NOTHING", (name,)
                ).rowcount
            ]

        return self.write(work)

    # -- writes --

    def upsert_short(self, agent: str, key: str, value: str, ttl_s: float, tags: list[str]) -> dict:
        def work(conn: Any) -> dict:
            self.require_agent(conn, agent)
            existing = conn.execute("SELECT id FROM memory_short WHERE agent = ? AND key = ?", (agent, key)).fetchone()
            row = conn.execute(
                "INSERT INTO memory_short (agent, key, value, tags, created_at, expires_at) "
                "VALUES (?, ?, ?, ?, solos_now(), solos_at(?::interval)) "
                "ON CONFLICT (agent, key) DO UPDATE SET value = excluded.value, tags = excluded.tags, "
                "    created_at = excluded.created_at, expires_at = excluded.expires_at "
                "RETURNING id, expires_at",
                (agent, key, value, json.dumps(tags), f"{ttl_s:.3f} seconds"),
            ).fetchone()
            return {"id": row["id"], "status": "updated" if existing else "created", "expires_at": row["expires_at"]}

        return self.write(work)

    def put_long(
        self,
        conn: Any,
        agent: str,
        topic: str | None,
        fact: str,
        source: str | None,
        confidence: float | None,
        tags: list[str],
    ) -> dict:
        self.require_agent(conn, agent)
        hold(conn, agent, "long", sha256_text(fact))  # the same fact written twice at once: one row
        known = self.known_long(conn, agent, fact)
        if known is None:
            return {"id": self.insert_long(conn, agent, topic, fact, source, confidence, tags), "status": "created"}
        changed = conn.execute(
            "UPDATE memory_longterm SET topic = ?, source = ?, confidence = ?, tags = ?, updated_at = solos_now() "
            "WHERE id = ? AND (topic, source, confidence, tags) "
            "IS DISTINCT FROM (?::text, ?::text, ?::float8, ?::text)",
            (topic, source, confidence, json.dumps(tags), known, topic, source, confidence, json.dumps(tags)),
        ).rowcount
        return {"id": known, "status": "updated" if changed else "unchanged"}

    def append_episodic(self, agent: str, event: dict, idempotency_key: str | None) -> dict:
        columns = ("event_type", "summary", "details", "outcome", "duration_s")

        def work(conn: Any) -> dict:
            self.require_agent(conn, agent)
            if idempotency_key:
                hold(conn, agent, "episodic", idempotency_key)
                earlier = conn.execute(
                    "SELECT e.* FROM memory_write_key k JOIN memory_episodic e ON e.id = k.row_id "
                    "WHERE k.agent = ? AND k.tier = 'episodic' AND k.key = ? AND e.agent = k.agent",
                    (agent, idempotency_key),
                ).fetchone()
                if earlier:
                    if any(earlier[c] != event[c] for c in columns):
                        raise Conflict(
                            f"idempotency_key {idempotency_key!r} was used for a different event (id {earlier['id']})",
                            "idempotency_key",
                        )
                    return {"id": earlier["id"], "status": "unchanged"}
            row_id = conn.execute(
                "INSERT INTO memory_episodic (agent, event_type, summary, details, outcome, duration_s) "
                "VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
                (agent, *(event[c] for c in columns)),
            ).fetchone()[0]
            if idempotency_key:
                self.remember_key(conn, agent, "episodic", idempotency_key, row_id)
            return {"id": row_id, "status": "created"}

        return self.write(work)

    def delete_short(self, agent: str, key: str, before: Callable[[Any, str, list[int]], None] | None = None) -> dict:
        def work(conn: Any) -> dict:
            self.require_agent(conn, agent)
            found = conn.execute("SELECT id FROM memory_short WHERE agent = ? AND key = ?", (agent, key)).fetchone()
            if before is not None and found is not None:
                before(conn, "short", [found[0]])
            row = conn.execute(
                "DELETE FROM memory_short WHERE agent = ? AND key = ? "
                "RETURNING id, expires_at <= solos_now() AS expired",
                (agent, key),
            ).fetchone()
            if row is None:
                raise NotFound(f"agent {agent!r} has no short-term key {key!r}", "key")
            return {"id": row["id"], "status": "deleted", "was_expired": bool(row["expired"])}

        return self.write(work)

    def set_sharing(self, agent: str, episodic: bool) -> dict:
        def work(conn: Any) -> dict:
            self.require_agent(conn, agent)
            existing = conn.execute("SELECT 1 FROM episodic_sharing WHERE agent = ?", (agent,)).fetchone()
            conn.execute(
                "INSERT INTO episodic_sharing (agent, shared) VALUES (?, ?) ON CONFLICT (agent) DO UPDATE "
                "SET shared = excluded.shared, updated_at = solos_now()",
                (agent, int(episodic)),
            )
            return {"status": "updated" if existing else "created"}

        return self.write(work)

    def purge_expired(self, batch: int = 1000) -> int:
        total = 0
        while True:
            removed = self.write(
                lambda conn: (
                    conn.execute(
                        "DELETE FROM memory_short WHERE id IN (SELECT id FROM memory_short "
                        "WHERE expires_at <= solos_now() LIMIT ?)",
                        (batch,),
                    ).rowcount
                )
            )
            total += removed
            if removed < batch:
                return total

    # -- reads --

    def read_audit(self, author: str, limit: int, before_id: int | None) -> list[dict]:
        def work(conn: Any) -> list[dict]:
            self.require_agent(conn, author)
            rows = conn.execute(
                "SELECT id, reader, author, row_id, read_at FROM episodic_read_audit "
                "WHERE author = ? AND id < ? ORDER BY id DESC LIMIT ?",
                (author, before_id or (1 << 62), limit),
            )
            return [dict(row) for row in rows]

        return self.read(work)

    def counts(self) -> dict:
        def work(conn: Any) -> dict:
            one = lambda sql: conn.execute(sql).fetchone()[0]  # noqa: E731
            return {
                "agents": one("SELECT count(*) FROM agent_registry"),
                "rows": {
                    "short": one("SELECT count(*) FROM memory_short WHERE expires_at > solos_now()"),
                    "short_expired": one("SELECT count(*) FROM memory_short WHERE expires_at <= solos_now()"),
                    "long": one("SELECT count(*) FROM memory_longterm"),
                    "episodic": one("SELECT count(*) FROM memory_episodic"),
                    "durable": one("SELECT count(*) FROM memory_durable"),
                },
                "episodic_sharing_agents": one("SELECT count(*) FROM episodic_sharing WHERE shared = 1"),
                "audit_rows": one("SELECT count(*) FROM episodic_read_audit"),
            }

        return self.read(work)

    def writes_by_hour(self) -> dict[str, list[int]]:
        recent = " UNION ALL ".join(
            f"SELECT agent, {column} AS ts FROM {table} WHERE {column} >= solos_at('-1 day')"
            for table, column in {tier.table: tier.time_column for tier in solos_store.LIVE_TIERS}.items()
        )
        hours_ago = (
            "coalesce(least(23, greatest(0, floor(extract(epoch FROM clock_timestamp() - "
            "solos_parse_time(ts)) / 3600)))::int, 0)"
        )
        sql = f"SELECT agent, {hours_ago}, count(*) FROM ({recent}) recent GROUP BY 1, 2"

        def work(conn: Any) -> dict[str, list[int]]:
            hours: dict[str, list[int]] = {}
            for agent, ago, count in conn.execute(sql):
                hours.setdefault(agent, [0] * 24)[ago] += count
            return hours

        return self.read(work)

    # -- recall's reads --

    @staticmethod
    def visible(tier: Tier, seen: Visibility, tags: Sequence[str] = ()) -> tuple[list[str], list[Any]]:
        where, params = visible_where(seen, tier)
        if tags:
            where.append("solos_tags(t.tags) && ?::text[]" if "tags" in tier.result_columns else "false")
            params.extend([list(tags)] if "tags" in tier.result_columns else [])
        if tier.expires:
            where.append("t.expires_at > solos_now()")
        return where, params

    def rows_by_id(self, conn: Any, tier: Tier, seen: Visibility, ids: list[int], tags: Sequence[str] = ()) -> list:
        where, params = self.visible(tier, seen, tags)
        where.append("t.id = ANY(?::bigint[])")
        sql = f"SELECT {tier.columns}, 0.0 AS score FROM {tier.table} t WHERE {' AND '.join(where)}"
        return conn.execute(sql, (*params, ids)).fetchall()

    def ranked_rows(
        self, conn: Any, tier: Tier, seen: Visibility, match: str, limit: int, tags: Sequence[str] = ()
    ) -> list:
        """The best Okapi BM25 matches the caller may read (FTS5's formula, weights and IDF clamp); `score` is
        the BM25 score, higher is better, as -bm25() is on SQLite."""
        where, params = self.visible(tier, seen, tags)
        text, classes = match_words(match)
        rows, tokens = self.size(conn, tier.table)
        a, b, c, d = WEIGHTS[tier.table]
        sql = (
            "WITH words AS (SELECT DISTINCT lexeme FROM unnest(to_tsvector('solos', ?))), "
            f"terms AS MATERIALIZED (SELECT w.lexeme, (SELECT count(*) FROM {tier.table} x "
            "    WHERE x.fts @@ solos_term(w.lexeme, ?)) AS df FROM words w), "
            "query AS (SELECT string_agg(quote_literal(lexeme) || ':' || ?, ' | ')::tsquery AS q FROM terms), "
            f"m AS MATERIALIZED (SELECT t.id, t.fts, t.fts_tokens FROM {tier.table} t, query "
            f"    WHERE t.fts @@ query.q{''.join(' AND ' + w for w in where)}), "
            "scored AS (SELECT m.id, sum(greatest(ln(greatest((? - terms.df + 0.5) / (terms.df + 0.5), 1e-9)), 1e-6) "
            "    * (tf.weight * (? + 1)) / (tf.weight + ? * (1 - ? + ? * m.fts_tokens / ?))) AS score "
            # Only the question's lexemes of a matching row are weighed, in plain arithmetic: a subquery for every
            # lexeme of every matching row took 0.5 s of one LoCoMo question on 10k rows (bench/store_compare.py).
            "  FROM m CROSS JOIN LATERAL (SELECT u.lexeme, ?::float8 * cardinality(array_positions(u.weights, 'A')) "
            "      + ?::float8 * cardinality(array_positions(u.weights, 'B')) "
            "      + ?::float8 * cardinality(array_positions(u.weights, 'C')) "
            "      + ?::float8 * cardinality(array_positions(u.weights, 'D')) AS weight "
            "    FROM unnest(m.fts) u WHERE u.lexeme = ANY(ARRAY(SELECT lexeme FROM terms))) tf "
            "  JOIN terms ON terms.lexeme = tf.lexeme WHERE tf.weight > 0 GROUP BY m.id) "
            f"SELECT {tier.columns}, s.score FROM scored s JOIN {tier.table} t ON t.id = s.id "
            "ORDER BY s.score DESC, t.id DESC LIMIT ?"
        )
        keep = [w if k in classes else 0.0 for k, w in zip("ABCD", (a, b, c, d))]
        mean = max(tokens, 1e-9)
        args = (text, classes, classes, *params, float(rows), BM25_K1, BM25_K1, BM25_B, BM25_B, mean, *keep, limit)
        return conn.execute(sql, args).fetchall()

    def size(self, conn: Any, table: str) -> tuple[int, float]:
        """A table's rows and mean tokens per row (BM25's N and avgdl), read at most once per STATS_TTL_S."""
        now = time.monotonic()
        known = self.stats.get(table)
        if known is None or now - known[0] > STATS_TTL_S:
            rows, mean = conn.execute(f"SELECT count(*), coalesce(avg(fts_tokens), 0) FROM {table}").fetchone()
            known = self.stats[table] = (now, int(rows), float(mean))
        return known[1], known[2]

    def indexed_rows(self, conn: Any, tier: Tier) -> int | None:
        return self.size(conn, tier.table)[0]

    def matches_at_least(self, conn: Any, tier: Tier, match: str, count: int) -> bool:
        text, classes = match_words(match)
        sql = f"SELECT count(*) FROM (SELECT 1 FROM {tier.table} t WHERE t.fts @@ solos_query(?, ?) LIMIT ?) enough"
        return conn.execute(sql, (text, classes, count)).fetchone()[0] >= count

    def topic_neighbours(self, conn: Any, ids: list[int]) -> dict[int, tuple[int | None, int | None]]:
        rows = conn.execute(
            "SELECT l.id, "
            "  (SELECT max(p.id) FROM memory_longterm p WHERE p.topic = l.topic AND p.id < l.id) AS previous, "
            "  (SELECT min(n.id) FROM memory_longterm n WHERE n.topic = l.topic AND n.id > l.id) AS following "
            "FROM memory_longterm l WHERE l.topic <> '' AND l.id = ANY(?::bigint[])",
            (ids,),
        )
        return {row[0]: (row[1], row[2]) for row in rows}

    # -- vectors --

    def rows_missing_vectors(self, tier: str, model: str, limit: int, ids: list[int] | None = None) -> list:
        table, select = TIER_TABLE[tier].table, TIER_TABLE[tier].columns
        only = "" if ids is None else " AND t.id = ANY(?::bigint[])"
        return self.read(
            lambda conn: conn.execute(
                f"SELECT {select} FROM {table} t LEFT JOIN memory_vector v "
                f"ON v.tier = ? AND v.row_id = t.id AND v.model = ? WHERE v.row_id IS NULL{only} ORDER BY t.id LIMIT ?",
                (tier, model, *(() if ids is None else (ids,)), limit),
            ).fetchall()
        )

    def save_vectors(self, tier: str, model: str, embedded: list[tuple[Any, bytes]]) -> tuple[list[int], int]:
        table, fields = TIER_TABLE[tier].table, TIER_TABLE[tier].embedded
        same_text = " AND ".join(f"{name} IS NOT DISTINCT FROM ?::text" for name in fields)

        def work(conn: Any) -> tuple[list[int], int]:
            saved = []
            for row, vector in embedded:
                current = (row["id"], *(row[name] for name in fields))
                if tier == "long":
                    changed = conn.execute(
                        f"UPDATE memory_longterm SET embedding = ? WHERE id = ? AND {same_text}", (vector, *current)
                    ).rowcount
                    stored = None
                else:
                    stored = vector
                    changed = conn.execute(
                        f"SELECT count(*) FROM {table} WHERE id = ? AND {same_text}", current
                    ).fetchone()[0]
                if changed:
                    conn.execute(
                        "INSERT INTO memory_vector (tier, row_id, model, vector) VALUES (?, ?, ?, ?) "
                        "ON CONFLICT (tier, row_id) DO UPDATE SET model = excluded.model, vector = excluded.vector",
                        (tier, row["id"], model, stored),
                    )
                    saved.append(row["id"])
            return saved, self.vector_generation(conn)

        return self.write(work)

    # -- tokens --

    def token_hashes(self) -> dict[str, str]:
        return self.read(
            lambda conn: {row[0]: row[1] for row in conn.execute("SELECT token_sha256, agent FROM memory_token")}
        )

    def keep_token(self, digest: str, agent: str) -> None:
        self.write(
            lambda conn: conn.execute("INSERT INTO memory_token (token_sha256, agent) VALUES (?, ?)", (digest, agent))
        )

    # -- after a forget --

    def clear_forgotten(self, wait_ms: int) -> bool:
        """VACUUM the tables forgets touched, on a thread of its own (never the request's); True once no scrub
        is queued and none runs, so the scrubber stops asking."""
        with self.vacuum_lock:
            running = self.vacuuming is not None and self.vacuuming.is_alive()
            if running:
                self.vacuum_wanted = True
                return False
        if not self.read(queued_scrubs):
            return True
        with self.vacuum_lock:
            self.vacuum_wanted = True
            self.vacuuming = threading.Thread(target=self.vacuum_forgotten, name="pg-vacuum", daemon=True)
            self.vacuuming.start()
        return False

    def vacuum_forgotten(self) -> None:
        while True:
            with self.vacuum_lock:
                if not self.vacuum_wanted:
                    return
                self.vacuum_wanted = False
            try:
                queued = self.read(queued_scrubs)
                tables = ["memory_event", "memory_version", "memory_write_key", "memory_vector"]
                for tier in queued:
                    tables.extend(RETRACTABLE[tier])
                conn = PgConnection.connect(self.path, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
                try:
                    conn.execute(f"VACUUM {', '.join(sorted(set(tables)))}")
                finally:
                    conn.close()
                self.write(solos_store.query("scrubs_done", done=queued))
                log_event("forgotten_vacuumed", tables=sorted(set(tables)))
            except Exception as error:  # retried on the scrubber's next round
                log_event("vacuum_failed", error=str(error))
                return


def first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def unreachable(url: str, error: BaseException) -> str:
    return (
        f"the PostgreSQL database at {solos_store.shown(url)} cannot be reached ({first_line(error)}); "
        "nothing was changed, retry later"
    )


def hold(conn: Any, agent: str, tier: str, key: str) -> None:
    """Serialize writes of one write key until commit (SQLite's single writer does this by itself)."""
    digest = int.from_bytes(hashlib.sha256(f"{agent}\0{tier}\0{key}".encode()).digest()[:8], "big", signed=True)
    conn.execute("SELECT pg_advisory_xact_lock(?)", (digest,))


def visible_where(seen: Visibility, tier: Tier) -> tuple[list[str], list[Any]]:
    """Visibility.where in PostgreSQL's terms (the sharing agents as an array)."""
    where: list[str] = []
    params: list[Any] = []
    if seen.scope == "own":
        where.append("t.agent = ?")
        params.append(seen.caller)
    elif seen.scope == "shared_except_self":
        where.append("t.agent <> ?")
        params.append(seen.caller)
    if tier.opt_in:
        where.append("(t.agent = ? OR t.agent = ANY(?::text[]))")
        params.extend([seen.caller, sorted(seen.sharing)])
    return where, params


def match_words(match: str) -> tuple[str, str]:
    """An FTS5 query as solos_rank and solos_events build it (quoted words OR-ed, maybe a column filter):
    its words as one text, and the tsvector classes to match (a row's own text, or all of it)."""
    words = " ".join(part.replace('""', '"') for part in QUOTED.findall(match))
    if match.startswith("{fact}"):
        return words, FACT_CLASS
    return words, OWN_CLASSES if match.startswith("{") else ALL_CLASSES


# ==== Forget, events, provenance and lifecycle in PostgreSQL's SQL (solos_store.on) ====


def table_exists(conn: Any, name: str) -> bool:
    return conn.execute("SELECT to_regclass(?) IS NOT NULL", (name,)).fetchone()[0]


def meta_value(conn: Any, key: str) -> str | None:
    row = conn.execute("SELECT value FROM solos_memory_meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def find_row(conn: Any, tier: str, row_id: int) -> tuple[str, Any] | None:
    for table in RETRACTABLE[tier]:
        row = conn.execute(f"SELECT * FROM {table} WHERE id = ?", (row_id,)).fetchone()
        if row is not None:
            return table, row
    return None


def erase(conn: Any, tier: str, row_id: int, forgotten_at: str | None = None) -> dict:
    """solos_store.erase: the row, its write key, its versions and its text in neighbours' context go in the
    caller's transaction; the event says `forget`; VACUUM follows off the request path (PgStore.clear_forgotten)."""
    found = find_row(conn, tier, row_id)
    assert found is not None, "erase is called for a row the caller found"
    table, row = found
    digest = content_hash(tier, row)
    key_hash = sha256_text(row["key"]) if tier == "short" else None
    conn.execute(f"DELETE FROM {table} WHERE id = ?", (row_id,))
    conn.execute(
        "DELETE FROM memory_write_key WHERE agent = ? AND tier = ? AND row_id = ?", (row["agent"], tier, row_id)
    )
    if tier == "long":  # facts whose context quoted it are indexed again without it
        conn.execute(
            "UPDATE memory_longterm SET fts = NULL WHERE topic = ? AND id > ? AND strpos(context, ?) > 0",
            (row["topic"], row_id, f"{row['agent']}: {row['fact']}"),
        )
    logged = conn.execute(
        "UPDATE memory_event SET kind = 'forget' WHERE id = (SELECT max(id) FROM memory_event "
        "WHERE xid = pg_current_xact_id() AND tier = ? AND row_id = ?)",
        (tier, row_id),
    ).rowcount
    if not logged:
        conn.execute("SELECT solos_log_event('forget', ?, ?, ?)", (tier, row_id, row["agent"]))
    retraction = conn.execute(
        "INSERT INTO memory_retraction (agent, tier, row_id, content_hash, key_hash, forgotten_at) "
        "VALUES (?, ?, ?, ?, ?, coalesce(?, solos_now())) RETURNING id",
        (row["agent"], tier, row_id, digest, key_hash, forgotten_at),
    ).fetchone()[0]
    erase_versions(conn, tier, row, retraction)
    queue_scrub(conn, tier, retraction)
    return {"content_hash": digest, "retraction_id": retraction}


def erase_versions(conn: Any, tier: str, row: Any, retraction_id: int) -> None:
    if tier not in VERSIONED:
        return
    born = row[VERSIONED[tier][5]]
    earliest = conn.execute(
        "SELECT min(valid_from) FROM memory_version WHERE tier = ? AND row_id = ?", (tier, row["id"])
    ).fetchone()[0]
    conn.execute(
        "INSERT INTO memory_forgotten_span (retraction_id, tier, row_id, agent, born_at, forgotten_at, lived_until) "
        "SELECT id, tier, row_id, agent, ?, forgotten_at, least(coalesce(?, forgotten_at), forgotten_at) "
        "FROM memory_retraction WHERE id = ? ON CONFLICT (retraction_id) DO UPDATE SET born_at = excluded.born_at, "
        "forgotten_at = excluded.forgotten_at, lived_until = excluded.lived_until",
        (min(born, earliest or born), row["expires_at"] if tier == "short" else None, retraction_id),
    )
    conn.execute("DELETE FROM memory_version WHERE tier = ? AND row_id = ?", (tier, row["id"]))


def queue_scrub(conn: Any, tier: str, retraction_id: int) -> None:
    conn.execute(
        "INSERT INTO memory_scrub_pending (tier, retraction_id) VALUES (?, ?) ON CONFLICT (tier) "
        "DO UPDATE SET retraction_id = greatest(memory_scrub_pending.retraction_id, excluded.retraction_id)",
        (tier, retraction_id),
    )


def merge_step(conn: Any, fts: str) -> int:
    """No segments to merge: a GIN index drops a deleted row's entries at VACUUM (clear_forgotten)."""
    return 0


def mirror_waiting(conn: Any, row_ids: Iterable[int]) -> set[int]:
    return set()  # the Qdrant mirror runs on SQLite only


def notify_forgotten(conn: Any, tier: str, row_id: int, retraction_id: int) -> int:
    return conn.execute(
        "INSERT INTO memory_notice (agent, tier, row_id, writer, kind, at) "
        "SELECT DISTINCT d.reader, r.tier, r.row_id, r.agent, 'forgotten', r.forgotten_at "
        "FROM memory_retraction r JOIN memory_delivery d ON d.tier = r.tier AND d.row_id = r.row_id "
        "WHERE r.id = ? AND d.reader <> r.agent AND r.tier = ? AND r.row_id = ? ON CONFLICT DO NOTHING",
        (retraction_id, tier, row_id),
    ).rowcount


def reapply(conn: Any, retraction: dict) -> bool:
    raise NotImplementedError("restore runs on SQLite; PostgreSQL is restored with pg_restore")


def head_event(conn: Any) -> int:
    return conn.execute(
        "SELECT coalesce(max(id), 0) FROM memory_event WHERE xid < pg_snapshot_xmin(pg_current_snapshot())"
    ).fetchone()[0]


def events_after(conn: Any, after: int, limit: int) -> list:
    """Events after an id, only those below every running transaction: one still running may hold a smaller
    id, and would be skipped for good if a later one were read first."""
    return conn.execute(
        "SELECT id, ts, kind, tier, row_id, agent FROM memory_event WHERE id > ? "
        "AND xid < pg_snapshot_xmin(pg_current_snapshot()) ORDER BY id LIMIT ?",
        (after, limit),
    ).fetchall()


def current_rows(conn: Any, tiers: dict, events: Sequence[Any]) -> dict[tuple[str, int], Any]:
    wanted: dict[str, list[int]] = {}
    for event in events:
        if event["kind"] not in REMOVALS:
            wanted.setdefault(event["tier"], []).append(event["row_id"])
    found = {}
    for tier, ids in wanted.items():
        if tier == "durable":
            sql = "SELECT id, key, value, updated_at FROM memory_durable t WHERE t.id = ANY(?::bigint[])"
        elif tier == "notice":
            sql = f"SELECT {NOTICE_COLUMNS} FROM memory_notice WHERE id = ANY(?::bigint[])"
        else:
            live = " AND t.expires_at > solos_now()" if tiers[tier].expires else ""
            sql = (
                f"SELECT {tiers[tier].columns}, 0.0 AS score FROM {tiers[tier].table} t "
                f"WHERE t.id = ANY(?::bigint[]){live}"
            )
        found.update({(tier, row["id"]): row for row in conn.execute(sql, (ids,))})
    return found


def tags_of(conn: Any, tier: str, ids: list[int]) -> dict[int, set[str]]:
    if "tags" not in TIER_TABLE[tier].result_columns:
        return {}
    found = conn.execute(f"SELECT id, tags FROM {TIER_TABLE[tier].table} WHERE id = ANY(?::bigint[])", (ids,))
    return {row[0]: set(parse_tags(row[1])) for row in found}


def text_matches(conn: Any, match: str, candidates: dict[str, list[int]]) -> set[tuple[str, int]]:
    found: set[tuple[str, int]] = set()
    text, _ = match_words(match)
    for tier, ids in candidates.items():
        table = RETRACTABLE[tier][0]
        classes = OWN_CLASSES if solos_store.OWN_COLUMNS[tier] else ALL_CLASSES
        rows = conn.execute(
            f"SELECT id FROM {table} WHERE fts @@ solos_query(?, ?) AND id = ANY(?::bigint[])", (text, classes, ids)
        )
        found.update((tier, row[0]) for row in rows)
    return found


def sweep_expired(conn: Any, note: Callable[[Any, str, list[int]], None]) -> int:
    now = conn.execute("SELECT solos_now()").fetchone()[0]
    through = meta_value(conn, "events_expired_through")
    added = 0
    if through is not None:
        expiring = conn.execute(
            "SELECT id, agent FROM memory_short WHERE expires_at > ? AND expires_at <= ? ORDER BY expires_at, id",
            (through, now),
        ).fetchall()
        note(conn, "short", [row[0] for row in expiring])
        for row in expiring:
            conn.execute("SELECT solos_log_event('expire', 'short', ?, ?)", (row[0], row[1]))
        added = len(expiring)
    set_meta(conn, "events_expired_through", now)
    return added


def expiry_due(conn: Any) -> bool:
    through = meta_value(conn, "events_expired_through")
    return through is None or (
        conn.execute(
            "SELECT 1 FROM memory_short WHERE expires_at > ? AND expires_at <= solos_now() LIMIT 1", (through,)
        ).fetchone()
        is not None
    )


def prune_step(conn: Any, cutoff: str, batch: int) -> int:
    pruned = conn.execute(
        "DELETE FROM memory_event WHERE id IN (SELECT id FROM memory_event ORDER BY id LIMIT ?) AND ts < ? "
        "RETURNING id",
        (batch, cutoff),
    ).fetchall()
    if pruned:
        through = max(int(meta_value(conn, "events_pruned_through") or 0), max(row[0] for row in pruned))
        set_meta(conn, "events_pruned_through", through)
    return len(pruned)


def record_deliveries(conn: Any, rows: Sequence[tuple[str, str, int, str, str]]) -> int:
    after = conn.execute("SELECT coalesce(max(id), 0) FROM memory_delivery").fetchone()[0]
    conn.executemany(
        "INSERT INTO memory_delivery (reader, tier, row_id, writer, delivered_at) VALUES (?, ?, ?, ?, ?)", rows
    )
    conn.execute(
        "INSERT INTO memory_notice (agent, tier, row_id, writer, kind, new_id, version_id, at) "
        "SELECT DISTINCT d.reader, v.tier, v.row_id, v.agent, 'superseded', v.row_id, v.id, v.valid_to "
        "FROM memory_delivery d JOIN memory_version v ON v.tier = d.tier AND v.row_id = d.row_id "
        "AND v.ended_by = 'update' AND d.delivered_at >= v.valid_from AND d.delivered_at <= v.valid_to "
        "WHERE d.id > ? AND d.reader <> v.agent ON CONFLICT DO NOTHING",
        (after,),
    )
    conn.execute(
        "INSERT INTO memory_notice (agent, tier, row_id, writer, kind, at) "
        "SELECT DISTINCT d.reader, s.tier, s.row_id, s.agent, 'forgotten', s.forgotten_at "
        "FROM memory_delivery d JOIN memory_forgotten_span s ON s.tier = d.tier AND s.row_id = d.row_id "
        "WHERE d.id > ? AND d.reader <> s.agent ON CONFLICT DO NOTHING",
        (after,),
    )
    return len(rows)


def read_deliveries(
    conn: Any, writer: str | None, tier: str | None, row_id: int | None, limit: int, before_id: int
) -> list[dict]:
    rows = conn.execute(
        f"SELECT {DELIVERY_COLUMNS} FROM memory_delivery WHERE id < ? AND (?::text IS NULL OR writer = ?::text) "
        "AND (?::text IS NULL OR tier = ?::text) AND (?::bigint IS NULL OR row_id = ?::bigint) "
        "ORDER BY id DESC LIMIT ?",
        (before_id, writer, writer, tier, tier, row_id, row_id, limit),
    )
    return [dict(row) for row in rows]


def first_delivery(conn: Any, reader: str, tier: str, ids: Sequence[int]) -> str | None:
    return conn.execute(
        "SELECT min(delivered_at) FROM memory_delivery WHERE tier = ? AND reader = ? AND row_id = ANY(?::bigint[])",
        (tier, reader, list(ids)),
    ).fetchone()[0]


def near_candidates(conn: Any, match: str, limit: int) -> list:
    text, classes = match_words("{fact} : (" + match + ")")
    every = "&" if " AND " in match else "|"  # solos_provenance.near_key: all of its words
    # The query in a subquery, made once: psycopg prepares a statement run often, and PostgreSQL's generic plan
    # for a small table scans it, calling solos_query for every row (14 ms a call at 419 rows).
    return conn.execute(
        "SELECT id, agent, fact, created_at, embedding FROM memory_longterm "
        "WHERE fts @@ (SELECT solos_query(?, ?, ?)) LIMIT ?",
        (text, classes, every, limit),
    ).fetchall()


def read_notices(conn: Any, agent: str, after_id: int, limit: int, acked: bool) -> list[dict]:
    rows = conn.execute(
        f"SELECT {NOTICE_COLUMNS} FROM memory_notice WHERE agent = ? AND id > ? AND (? OR acked_at IS NULL) "
        "ORDER BY id LIMIT ?",
        (agent, after_id, bool(acked), limit),
    )
    return [dict(row) for row in rows]


def ack_notices(conn: Any, agent: str, ids: Sequence[int]) -> int:
    return conn.execute(
        "UPDATE memory_notice SET acked_at = solos_now() WHERE agent = ? AND acked_at IS NULL "
        "AND id = ANY(?::bigint[])",
        (agent, list(ids)),
    ).rowcount


def lives_sql(tier: str) -> str:
    tables, label, text, tags, expires, born = VERSIONED[tier]
    since = f"(SELECT max(v.valid_to) FROM memory_version v WHERE v.tier = '{tier}' AND v.row_id = c.id)"
    current = " UNION ALL ".join(
        f"SELECT c.id, c.agent, c.{label}, c.{text}, {'c.' + tags if tags != 'NULL' else 'NULL'}, "
        f"{'c.' + expires if expires != 'NULL' else 'NULL'}, greatest(c.{born}, coalesce({since}, '')), NULL "
        f"FROM {table} c WHERE c.agent <> ''"
        for table in tables
    )
    return f"{current} UNION ALL SELECT {VERSION_FIELDS.replace('id,', 'row_id,', 1)} FROM memory_version v " + (
        f"WHERE v.tier = '{tier}'"
    )


def rows_as_of(conn: Any, tier: str, at: str, seen: Visibility) -> list[dict]:
    where, params = visible_where(seen, TIER_TABLE[tier])
    sql = (
        f"WITH t ({VERSION_FIELDS}) AS ({lives_sql(tier)}) SELECT * FROM t WHERE t.valid_from <= ? "
        "AND (t.valid_to IS NULL OR t.valid_to > ?) AND (t.expires_at IS NULL OR t.expires_at > ?)"
        + "".join(" AND " + w for w in where)
    )
    return [dict(row) for row in conn.execute(sql, (at, at, at, *params))]


def versions_of(conn: Any, tier: str, ids: Sequence[int]) -> list[dict]:
    sql = f"WITH t ({VERSION_FIELDS}) AS ({lives_sql(tier)}) SELECT * FROM t WHERE t.id = ANY(?::bigint[])"
    return [dict(row) for row in conn.execute(sql, (list(ids),))]


def episodes_by_id(conn: Any, ids: list[int]) -> dict[int, Any]:
    rows = conn.execute(
        "SELECT id, agent, summary FROM memory_episodic WHERE id = ANY(?::bigint[]) "
        "UNION ALL SELECT id, agent, summary FROM memory_episodic_archive WHERE id = ANY(?::bigint[])",
        (ids, ids),
    )
    return {row["id"]: row for row in rows}


def link_promotion(conn: Any, long_id: int, episodic_ids: list[int], agent: str) -> None:
    conn.executemany(
        "INSERT INTO memory_promotion (long_id, episodic_id, agent) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
        [(long_id, i, agent) for i in episodic_ids],
    )


def archive_batch(conn: Any, cutoff: str, limit: int) -> int:
    columns = "id, agent, event_type, summary, details, outcome, duration_s, timestamp"
    ids = [
        row[0]
        for row in conn.execute(
            "SELECT id FROM memory_episodic WHERE timestamp < solos_at(?::interval) ORDER BY id LIMIT ?",
            (cutoff, limit),
        )
    ]
    conn.execute(
        f"INSERT INTO memory_episodic_archive ({columns}) SELECT {columns} FROM memory_episodic "
        "WHERE id = ANY(?::bigint[])",
        (ids,),
    )
    conn.execute("DELETE FROM memory_episodic WHERE id = ANY(?::bigint[])", (ids,))
    return len(ids)


def checkpoint_truncate(conn: Any, wait_ms: int) -> bool:
    raise NotImplementedError("PostgreSQL has no WAL to truncate here: PgStore.clear_forgotten vacuums instead")


PgConnection.queries = __import__(__name__)
