-- solos-memory schema for PostgreSQL (solos_store_pg.py): the same tables and meaning as schema.sql.
-- Additive only: CREATE … IF NOT EXISTS, or a CREATE guarded by a check (functions and triggers are
-- CREATE OR REPLACE: code, not data). Run at every start inside one transaction, under an advisory lock
-- so copies starting together do not race. Timestamps stay UTC ISO 8601 text with milliseconds, as in
-- SQLite, so both stores compare and answer them alike.
--
-- What differs from SQLite, and why:
--   * ids come from identity sequences, which never hand out an id twice: schema.sql's id marks have no
--     counterpart here.
--   * the keyword index is a tsvector column per table (GIN-indexed) with each column's BM25 weight as a
--     tsvector weight class, and the row's token count; solos_store_pg computes Okapi BM25 from them.
--   * memory_event carries the writing transaction's id (xid8): ids commit out of order, so readers take
--     events only below the oldest running transaction (solos_store_pg.events_after).
--   * the service connects as itself but works as role solos_memory_service, which may read and never
--     write agent_registry and memory_durable (SQLite's authorizer does that there), nor memory_token.

-- Now, or now shifted ('+3.000 seconds', '-30 days'), as the text SQLite's strftime('%Y-%m-%dT%H:%M:%fZ') gives.
CREATE OR REPLACE FUNCTION solos_at(shift interval) RETURNS text LANGUAGE sql VOLATILE AS
$$ SELECT to_char((clock_timestamp() + shift) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') $$;
CREATE OR REPLACE FUNCTION solos_now() RETURNS text LANGUAGE sql VOLATILE AS $$ SELECT solos_at(interval '0') $$;

-- Tags as stored: a JSON array from this service, or a comma list from the fleet's other writers.
CREATE OR REPLACE FUNCTION solos_tags(raw text) RETURNS text[] LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF raw IS NULL OR raw = '' THEN
        RETURN '{}';
    END IF;
    BEGIN
        RETURN ARRAY(SELECT json_array_elements_text(raw::json));
    EXCEPTION WHEN others THEN
        RETURN string_to_array(replace(raw, ', ', ','), ',');
    END;
END $$;

-- Porter-style stemming without stop words, diacritics removed (unaccent, from postgresql-contrib, where the
-- user may create it): FTS5's 'porter unicode61 remove_diacritics 2'. Recall drops its own stop words.
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_ts_dict WHERE dictname = 'solos_stem') THEN
        CREATE TEXT SEARCH DICTIONARY solos_stem (TEMPLATE = snowball, LANGUAGE = english);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_ts_config WHERE cfgname = 'solos') THEN
        BEGIN
            CREATE EXTENSION IF NOT EXISTS unaccent;
        EXCEPTION WHEN others THEN
            RAISE NOTICE 'unaccent unavailable (%): words keep their diacritics', SQLERRM;
        END;
        CREATE TEXT SEARCH CONFIGURATION solos (COPY = simple);
        IF EXISTS (SELECT 1 FROM pg_ts_dict WHERE dictname = 'unaccent') THEN
            ALTER TEXT SEARCH CONFIGURATION solos ALTER MAPPING FOR asciiword, word, hword_part, hword_asciipart,
                asciihword, hword WITH unaccent, solos_stem;
        ELSE
            ALTER TEXT SEARCH CONFIGURATION solos ALTER MAPPING FOR asciiword, word, hword_part, hword_asciipart,
                asciihword, hword WITH solos_stem;
        END IF;
    END IF;
END $$;

-- A text as the keyword index sees it. FTS5's unicode61 splits at every punctuation mark, so "grafana.internal",
-- "ops@example.org", "/etc/nginx/nginx.conf", "2.14.1" and "10.0.0.5" are words; PostgreSQL's parser keeps each
-- whole (a host, an email, a file path, a version), and a question naming one of its words found nothing.
CREATE OR REPLACE FUNCTION solos_tsvector(doc text) RETURNS tsvector LANGUAGE sql IMMUTABLE AS
$$ SELECT to_tsvector('solos', regexp_replace(doc, '[[:punct:]]+', ' ', 'g')) $$;

-- A timestamp as the store writes it; NULL for text another writer left that is not one.
CREATE OR REPLACE FUNCTION solos_parse_time(stamp text) RETURNS timestamptz LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN stamp::timestamptz;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;

-- Keyword queries: one stem, or the stems of some words OR-ed, matched in the given weight classes ('AB':
-- a row's own text). Stems go in as they are (the ::tsquery input), never through a parser again.
CREATE OR REPLACE FUNCTION solos_term(stem text, classes text) RETURNS tsquery LANGUAGE sql IMMUTABLE AS
$$ SELECT (quote_literal(stem) || ':' || classes)::tsquery $$;
CREATE OR REPLACE FUNCTION solos_query(words text, classes text, joined_by text DEFAULT '|') RETURNS tsquery
LANGUAGE sql STABLE AS $$
    SELECT string_agg(quote_literal(lexeme) || ':' || classes, ' ' || joined_by || ' ')::tsquery
    FROM unnest(solos_tsvector(words))
$$;

-- ==== Fleet tables ====

CREATE TABLE IF NOT EXISTS agent_registry (
    agent       TEXT PRIMARY KEY,
    role        TEXT,
    created_at  TEXT NOT NULL DEFAULT solos_now()
);

CREATE TABLE IF NOT EXISTS memory_durable (
    id          BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    key         TEXT NOT NULL UNIQUE,
    value       TEXT NOT NULL,
    updated_at  TEXT NOT NULL DEFAULT solos_now()
);

CREATE TABLE IF NOT EXISTS memory_longterm (
    id          BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    agent       TEXT NOT NULL,
    topic       TEXT,
    fact        TEXT NOT NULL,
    source      TEXT,
    confidence  DOUBLE PRECISION,
    tags        TEXT,
    embedding   BYTEA,
    created_at  TEXT NOT NULL DEFAULT solos_now(),
    updated_at  TEXT NOT NULL DEFAULT solos_now(),
    context     TEXT NOT NULL DEFAULT '',   -- the two facts before it in its topic (keyword index only)
    fts         TSVECTOR,                   -- A: topic, fact; B: tags, agent; C: context
    fts_tokens  INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE IF NOT EXISTS memory_episodic (
    id          BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    agent       TEXT NOT NULL,
    event_type  TEXT NOT NULL,
    summary     TEXT NOT NULL,
    details     TEXT,
    outcome     TEXT,
    duration_s  DOUBLE PRECISION,
    timestamp   TEXT NOT NULL DEFAULT solos_now(),
    fts         TSVECTOR,                   -- A: summary; B: details, outcome; C: event_type, agent
    fts_tokens  INTEGER NOT NULL DEFAULT 0
);

CREATE INDEX IF NOT EXISTS memory_longterm_agent_updated ON memory_longterm (agent, updated_at);
CREATE INDEX IF NOT EXISTS memory_longterm_updated ON memory_longterm (updated_at);
CREATE INDEX IF NOT EXISTS memory_longterm_topic ON memory_longterm (topic, id);
CREATE INDEX IF NOT EXISTS memory_longterm_fts ON memory_longterm USING gin (fts);
CREATE INDEX IF NOT EXISTS memory_episodic_agent_time ON memory_episodic (agent, timestamp);
CREATE INDEX IF NOT EXISTS memory_episodic_time ON memory_episodic (timestamp);
CREATE INDEX IF NOT EXISTS memory_episodic_fts ON memory_episodic USING gin (fts);

-- ==== Service tables ====

CREATE TABLE IF NOT EXISTS solos_memory_meta (
    key    TEXT PRIMARY KEY,
    value  TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS memory_short (
    id          BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    agent       TEXT NOT NULL,
    key         TEXT NOT NULL,
    value       TEXT NOT NULL,
    tags        TEXT,
    created_at  TEXT NOT NULL DEFAULT solos_now(),
    expires_at  TEXT NOT NULL,
    fts         TSVECTOR,                   -- A: key, value; B: tags, agent
    fts_tokens  INTEGER NOT NULL DEFAULT 0,
    UNIQUE (agent, key)
);
CREATE INDEX IF NOT EXISTS memory_short_agent_expiry ON memory_short (agent, expires_at);
CREATE INDEX IF NOT EXISTS memory_short_expiry ON memory_short (expires_at);
CREATE INDEX IF NOT EXISTS memory_short_fts ON memory_short USING gin (fts);

CREATE TABLE IF NOT EXISTS memory_write_key (
    agent   TEXT NOT NULL,
    tier    TEXT NOT NULL,
    key     TEXT NOT NULL,
    row_id  BIGINT NOT NULL,
    PRIMARY KEY (agent, tier, key)
);

CREATE TABLE IF NOT EXISTS episodic_sharing (
    agent       TEXT PRIMARY KEY,
    shared      INTEGER NOT NULL CHECK (shared IN (0, 1)),
    updated_at  TEXT NOT NULL DEFAULT solos_now()
);

CREATE TABLE IF NOT EXISTS episodic_read_audit (
    id       BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    reader   TEXT NOT NULL,
    author   TEXT NOT NULL,
    row_id   BIGINT NOT NULL,
    read_at  TEXT NOT NULL DEFAULT solos_now()
);
CREATE INDEX IF NOT EXISTS episodic_read_audit_author ON episodic_read_audit (author, id);

-- Bearer tokens live here, so every copy of the service agrees (SQLite: a tokens file).
CREATE TABLE IF NOT EXISTS memory_token (
    token_sha256  TEXT PRIMARY KEY,
    agent         TEXT NOT NULL,
    created_at    TEXT NOT NULL DEFAULT solos_now()
);

CREATE TABLE IF NOT EXISTS memory_vector (
    tier    TEXT NOT NULL,
    row_id  BIGINT NOT NULL,
    model   TEXT NOT NULL,
    vector  BYTEA,
    PRIMARY KEY (tier, row_id)
);

-- Rows a copy of the service is embedding now, so no other copy embeds them too (solos_copies.CLAIM_SQL);
-- released once the vectors are saved, and void past `until`, so a copy that died mid-batch holds nothing.
CREATE TABLE IF NOT EXISTS memory_embed_claim (
    tier        TEXT NOT NULL,
    row_id      BIGINT NOT NULL,
    claimed_by  TEXT NOT NULL,
    until       TEXT NOT NULL,
    PRIMARY KEY (tier, row_id)
);

-- The Qdrant import and mirror run on SQLite only (solos_qdrant.py); their tables are here so stats read alike.
CREATE TABLE IF NOT EXISTS qdrant_import (
    collection      TEXT NOT NULL,
    point_id        TEXT NOT NULL,
    content_sha256  TEXT NOT NULL,
    row_id          BIGINT,
    reason          TEXT,
    seen_at         TEXT NOT NULL DEFAULT solos_now(),
    PRIMARY KEY (collection, point_id, content_sha256)
);
CREATE TABLE IF NOT EXISTS qdrant_outbox (
    id           BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    action       TEXT NOT NULL CHECK (action IN ('upsert', 'delete')),
    row_id       BIGINT NOT NULL,
    agent        TEXT,
    fact         TEXT,
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT,
    next_try_at  TEXT NOT NULL DEFAULT solos_now(),
    created_at   TEXT NOT NULL DEFAULT solos_now()
);

CREATE TABLE IF NOT EXISTS memory_promotion (
    long_id      BIGINT NOT NULL,
    episodic_id  BIGINT NOT NULL,
    agent        TEXT NOT NULL,
    promoted_at  TEXT NOT NULL DEFAULT solos_now(),
    PRIMARY KEY (long_id, episodic_id)
);

CREATE TABLE IF NOT EXISTS memory_episodic_archive (
    id           BIGINT PRIMARY KEY,
    agent        TEXT NOT NULL,
    event_type   TEXT NOT NULL,
    summary      TEXT NOT NULL,
    details      TEXT,
    outcome      TEXT,
    duration_s   DOUBLE PRECISION,
    timestamp    TEXT NOT NULL,
    archived_at  TEXT NOT NULL DEFAULT solos_now(),
    fts          TSVECTOR,
    fts_tokens   INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS memory_episodic_archive_agent_time ON memory_episodic_archive (agent, timestamp);
CREATE INDEX IF NOT EXISTS memory_episodic_archive_fts ON memory_episodic_archive USING gin (fts);

CREATE TABLE IF NOT EXISTS memory_retraction (
    id            BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    agent         TEXT NOT NULL,
    tier          TEXT NOT NULL,
    row_id        BIGINT NOT NULL,
    content_hash  TEXT NOT NULL,
    key_hash      TEXT,
    forgotten_at  TEXT NOT NULL DEFAULT solos_now()
);

-- Tables a forget touched whose dead tuples VACUUM has not removed yet (solos_store_pg.vacuum_forgotten).
CREATE TABLE IF NOT EXISTS memory_scrub_pending (
    tier           TEXT PRIMARY KEY,
    retraction_id  BIGINT NOT NULL,
    queued_at      TEXT NOT NULL DEFAULT solos_now()
);

-- id: the transaction's id (xid8) in the high bits and the event's place in it in the low 24, so ids sort
-- in the order readers take them (solos_store_pg.events_after) and a copy resumes from any other's id.
CREATE TABLE IF NOT EXISTS memory_event (
    id      BIGINT PRIMARY KEY,
    xid     XID8 NOT NULL DEFAULT pg_current_xact_id(),
    ts      TEXT NOT NULL DEFAULT solos_now(),
    kind    TEXT NOT NULL,
    tier    TEXT NOT NULL,
    row_id  BIGINT NOT NULL,
    agent   TEXT
);

-- Short rows written with, or moved to, an expiry at or before events_expired_through: the sweep reads only the
-- window past that mark, so it reports these from here (or their delete does). solos_short_changed keeps it.
CREATE TABLE IF NOT EXISTS memory_short_late_expiry (
    row_id  BIGINT PRIMARY KEY
);

CREATE TABLE IF NOT EXISTS memory_job_run (
    id          BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    job         TEXT NOT NULL,
    started_at  TEXT NOT NULL DEFAULT solos_now(),
    ended_at    TEXT,
    result      TEXT NOT NULL DEFAULT 'running',
    rows        BIGINT,
    error       TEXT
);
CREATE INDEX IF NOT EXISTS memory_job_run_job ON memory_job_run (job, id);

CREATE TABLE IF NOT EXISTS memory_activity (
    minute  BIGINT NOT NULL,
    kind    TEXT NOT NULL,
    agent   TEXT NOT NULL,
    detail  TEXT NOT NULL DEFAULT '',
    n       BIGINT NOT NULL,
    PRIMARY KEY (minute, kind, agent, detail)
);

CREATE TABLE IF NOT EXISTS memory_delivery (
    id            BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    reader        TEXT NOT NULL,
    tier          TEXT NOT NULL,
    row_id        BIGINT NOT NULL,
    writer        TEXT NOT NULL,
    delivered_at  TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS memory_delivery_row ON memory_delivery (tier, row_id, delivered_at);
CREATE INDEX IF NOT EXISTS memory_delivery_reader ON memory_delivery (reader, delivered_at);
CREATE INDEX IF NOT EXISTS memory_delivery_writer ON memory_delivery (writer, id);

CREATE TABLE IF NOT EXISTS memory_version (
    id          BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    tier        TEXT NOT NULL,
    row_id      BIGINT NOT NULL,
    agent       TEXT NOT NULL,
    label       TEXT,
    text        TEXT NOT NULL,
    tags        TEXT,
    expires_at  TEXT,
    valid_from  TEXT NOT NULL,
    valid_to    TEXT NOT NULL,
    ended_by    TEXT NOT NULL CHECK (ended_by IN ('update', 'refresh', 'delete'))
);
CREATE INDEX IF NOT EXISTS memory_version_row ON memory_version (tier, row_id, valid_to);
CREATE INDEX IF NOT EXISTS memory_version_until ON memory_version (valid_to);
-- The daily purge's short values past their expiry (solos_store.Queries.purge_expired_short).
CREATE INDEX IF NOT EXISTS memory_version_expiry ON memory_version (tier, expires_at);

CREATE TABLE IF NOT EXISTS memory_forgotten_span (
    retraction_id  BIGINT PRIMARY KEY,
    tier           TEXT NOT NULL,
    row_id         BIGINT NOT NULL,
    agent          TEXT NOT NULL,
    born_at        TEXT NOT NULL,
    forgotten_at   TEXT NOT NULL,
    lived_until    TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS memory_forgotten_span_time ON memory_forgotten_span (forgotten_at);

-- Within a forgotten short row's span, the times it did not count (schema.sql says why).
CREATE TABLE IF NOT EXISTS memory_forgotten_gap (
    retraction_id  BIGINT NOT NULL,
    gap_from       TEXT NOT NULL,
    gap_until      TEXT NOT NULL,
    PRIMARY KEY (retraction_id, gap_from)
);

-- When each author was sharing its episodes (schema.sql says why); the trigger keeps it whoever writes.
CREATE TABLE IF NOT EXISTS episodic_sharing_span (
    agent         TEXT NOT NULL,
    shared_from   TEXT NOT NULL,
    shared_until  TEXT,
    PRIMARY KEY (agent, shared_from)
);
INSERT INTO episodic_sharing_span (agent, shared_from)
    SELECT agent, updated_at FROM episodic_sharing s WHERE shared = 1
    AND NOT EXISTS (SELECT 1 FROM episodic_sharing_span p WHERE p.agent = s.agent)
    ON CONFLICT DO NOTHING;
CREATE OR REPLACE FUNCTION solos_sharing_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' AND old.shared = 1 AND (TG_OP = 'DELETE' OR new.shared = 0) THEN
        UPDATE episodic_sharing_span SET shared_until = solos_now() WHERE agent = old.agent AND shared_until IS NULL;
    ELSIF TG_OP <> 'DELETE' AND new.shared = 1 AND (TG_OP = 'INSERT' OR old.shared = 0) THEN
        INSERT INTO episodic_sharing_span (agent, shared_from) VALUES (new.agent, solos_now()) ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END $$;
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'episodic_sharing_span_changed'
        AND tgrelid = 'episodic_sharing'::regclass) THEN
        CREATE TRIGGER episodic_sharing_span_changed AFTER INSERT OR UPDATE OR DELETE ON episodic_sharing
            FOR EACH ROW EXECUTE FUNCTION solos_sharing_changed();
    END IF;
END $$;

CREATE TABLE IF NOT EXISTS memory_notice (
    id          BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    agent       TEXT NOT NULL,
    tier        TEXT NOT NULL,
    row_id      BIGINT NOT NULL,
    writer      TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('forgotten', 'superseded')),
    new_id      BIGINT,
    version_id  BIGINT,
    at          TEXT NOT NULL,
    acked_at    TEXT,
    UNIQUE (agent, tier, row_id, kind, at)
);
CREATE INDEX IF NOT EXISTS memory_notice_open ON memory_notice (agent, acked_at, id);

-- ==== Trigger functions ====

-- The keyword index: weights as the FTS5 tables' bm25() weights (solos_store.TIER_TABLE), one class each.
CREATE OR REPLACE FUNCTION solos_fts_longterm() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR new.topic IS DISTINCT FROM old.topic OR new.fact IS DISTINCT FROM old.fact
        OR new.tags IS DISTINCT FROM old.tags OR new.agent IS DISTINCT FROM old.agent OR new.fts IS NULL THEN
        new.context := coalesce((SELECT string_agg(p.agent || ': ' || p.fact, ' ' ORDER BY p.id DESC)
            FROM (SELECT agent, fact, id FROM memory_longterm WHERE coalesce(new.topic, '') <> ''
                  AND topic = new.topic AND id < new.id ORDER BY id DESC LIMIT 2) p), '');
        new.fts := setweight(solos_tsvector(coalesce(new.topic, '') || ' ' || new.fact), 'A')
            || setweight(solos_tsvector(coalesce(new.tags, '') || ' ' || new.agent), 'B')
            || setweight(solos_tsvector(new.context), 'C');
        new.fts_tokens := solos_tokens(new.fts);
    END IF;
    RETURN new;
END $$;

-- A row's token count (BM25's document length). PL/pgSQL, not SQL: an SQL function that cannot be inlined (this
-- one reads a set) is parsed and planned again in every transaction that calls it: about a quarter of a write's
-- CPU in the server (docs/benchmarks.md). PL/pgSQL keeps its plan for the session.
CREATE OR REPLACE FUNCTION solos_tokens(doc tsvector) RETURNS integer LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN (SELECT coalesce(sum(coalesce(array_length(positions, 1), 1)), 0)::integer FROM unnest(doc));
END $$;

CREATE OR REPLACE FUNCTION solos_fts_episodic() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    new.fts := setweight(solos_tsvector(new.summary), 'A')
        || setweight(solos_tsvector(coalesce(new.details, '') || ' ' || coalesce(new.outcome, '')), 'B')
        || setweight(solos_tsvector(new.event_type || ' ' || new.agent), 'C');
    new.fts_tokens := solos_tokens(new.fts);
    RETURN new;
END $$;

-- expires_at is compared as text (schema.sql's memory_short_expiry_spelled_in says why): a date spelt other than
-- as the service writes it, from yesterday to 2100, is refused, naming the column; any other value is kept.
-- A trigger of its own, not the keyword index's: migrate copies the SQLite file's rows as they are.
CREATE OR REPLACE FUNCTION solos_short_expiry_spelled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (TG_OP = 'INSERT' OR old.expires_at IS DISTINCT FROM new.expires_at) AND new.expires_at < '2100'
        AND new.expires_at >= to_char(now() AT TIME ZONE 'UTC' - interval '1 day', 'YYYY-MM-DD')
        AND new.expires_at ~ '^\d{4}-\d{2}-\d{2}'
        AND new.expires_at !~ '^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$' THEN
        RAISE EXCEPTION 'memory_short.expires_at must be UTC written as 2026-12-07T09:17:34.000Z, not %: another spelling compares wrong and the row would expire early',
            new.expires_at USING ERRCODE = 'check_violation';
    END IF;
    RETURN new;
END $$;

CREATE OR REPLACE FUNCTION solos_fts_short() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    new.fts := setweight(solos_tsvector(new.key || ' ' || new.value), 'A')
        || setweight(solos_tsvector(coalesce(new.tags, '') || ' ' || new.agent), 'B');
    new.fts_tokens := solos_tokens(new.fts);
    RETURN new;
END $$;

-- One event row: its id places it by transaction, then by order within the transaction. Listening copies are
-- told at commit (NOTIFY), unless the transaction is one of the service's writes (solos_write_begins), which
-- notifies after its commit instead (solos_copies.Notifier): a NOTIFY holds the notify queue's lock from the
-- commit until its WAL flush, so writers that notify queue for each other's flush.
CREATE OR REPLACE FUNCTION solos_log_event(event_kind text, event_tier text, event_row bigint, event_agent text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    place bigint := coalesce(nullif(current_setting('solos.event_place', true), ''), '0')::bigint + 1;
BEGIN
    PERFORM set_config('solos.event_place', place::text, true);
    INSERT INTO memory_event (id, kind, tier, row_id, agent)
    VALUES ((pg_current_xact_id()::text::bigint << 24) + place, event_kind, event_tier, event_row, event_agent);
    IF current_setting('solos.notify_after_commit', true) IS DISTINCT FROM 'on' THEN
        PERFORM pg_notify('solos_memory_event', '');
    END IF;
END $$;

-- A version an update or delete replaced (as-of recall), and notices for those it was delivered to.
CREATE OR REPLACE FUNCTION solos_keep_version(v_tier text, v_row bigint, v_agent text, v_label text, v_text text,
    v_tags text, v_expires text, v_born text, v_ended text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_from text := greatest(v_born, coalesce(
        (SELECT max(valid_to) FROM memory_version WHERE tier = v_tier AND row_id = v_row), ''));
    v_id bigint;
    v_to text := solos_now();
BEGIN
    INSERT INTO memory_version (tier, row_id, agent, label, text, tags, expires_at, valid_from, valid_to, ended_by)
    VALUES (v_tier, v_row, v_agent, v_label, v_text, v_tags, v_expires, v_from, v_to, v_ended) RETURNING id INTO v_id;
    IF v_ended = 'update' THEN
        -- Readers in the order they were first shown the row, as SQLite's trigger reads them (by its index on
        -- delivered_at): DISTINCT alone let PostgreSQL number the same readers' notices in another order.
        INSERT INTO memory_notice (agent, tier, row_id, writer, kind, new_id, version_id, at)
        SELECT reader, v_tier, v_row, v_agent, 'superseded', v_row, v_id, v_to
        FROM memory_delivery WHERE tier = v_tier AND row_id = v_row AND reader <> v_agent
            AND delivered_at >= v_from AND delivered_at <= v_to
        GROUP BY reader ORDER BY min(delivered_at), min(id)
        ON CONFLICT DO NOTHING;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION solos_longterm_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM solos_log_event('write', 'long', new.id, new.agent);
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        DELETE FROM memory_vector WHERE tier = 'long' AND row_id = old.id;
        DELETE FROM memory_promotion WHERE long_id = old.id;
        PERFORM solos_log_event('delete', 'long', old.id, old.agent);
        PERFORM solos_keep_version('long', old.id, old.agent, old.topic, old.fact, old.tags, NULL, old.created_at,
            'delete');
        RETURN NULL;
    END IF;
    IF (old.topic, old.fact, old.agent) IS DISTINCT FROM (new.topic, new.fact, new.agent) THEN
        DELETE FROM memory_vector WHERE tier = 'long' AND row_id = old.id;
    END IF;
    -- The version (and its readers' notices) before the update event, in SQLite's order: a reader is told first.
    IF (old.agent, old.topic, old.fact, old.tags) IS DISTINCT FROM (new.agent, new.topic, new.fact, new.tags) THEN
        PERFORM solos_keep_version('long', old.id, old.agent, old.topic, old.fact, old.tags, NULL, old.created_at,
            CASE WHEN (old.fact, old.agent) IS DISTINCT FROM (new.fact, new.agent) THEN 'update' ELSE 'refresh' END);
    END IF;
    IF (old.agent, old.topic, old.fact, old.source, old.confidence, old.tags)
        IS DISTINCT FROM (new.agent, new.topic, new.fact, new.source, new.confidence, new.tags) THEN
        PERFORM solos_log_event('update', 'long', new.id, new.agent);
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION solos_episodic_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    archived boolean;
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM solos_log_event('write', 'episodic', new.id, new.agent);
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        archived := EXISTS (SELECT 1 FROM memory_episodic_archive WHERE id = old.id);
        DELETE FROM memory_vector WHERE tier = 'episodic' AND row_id = old.id;
        PERFORM solos_log_event(CASE WHEN archived THEN 'archive' ELSE 'delete' END, 'episodic', old.id, old.agent);
        IF NOT archived THEN
            PERFORM solos_keep_version('episodic', old.id, old.agent, old.event_type, old.summary, NULL, NULL,
                old.timestamp, 'delete');
        END IF;
        RETURN NULL;
    END IF;
    IF (old.event_type, old.summary, old.agent) IS DISTINCT FROM (new.event_type, new.summary, new.agent) THEN
        DELETE FROM memory_vector WHERE tier = 'episodic' AND row_id = old.id;
        PERFORM solos_keep_version('episodic', old.id, old.agent, old.event_type, old.summary, NULL, NULL,
            old.timestamp, 'update');
    END IF;
    IF (old.agent, old.event_type, old.summary, old.details, old.outcome, old.duration_s)
        IS DISTINCT FROM (new.agent, new.event_type, new.summary, new.details, new.outcome, new.duration_s) THEN
        PERFORM solos_log_event('update', 'episodic', new.id, new.agent);
    END IF;
    RETURN NULL;
END $$;

-- A short row deleted after its expiry was reported logs nothing; one that expired unreported says 'expire'.
-- A row written with (or moved to) an expiry at or before the sweep's mark is listed for the sweep to report.
-- The mark is read FOR SHARE: the sweep takes it FOR UPDATE before it reads, so a write or delete either commits
-- before the sweep reads the rows, or waits and compares with the sweep's new mark.
CREATE OR REPLACE FUNCTION solos_short_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    mark text;
BEGIN
    IF TG_OP <> 'UPDATE' OR old.expires_at IS DISTINCT FROM new.expires_at THEN
        mark := coalesce((SELECT value FROM solos_memory_meta WHERE key = 'events_expired_through' FOR SHARE), '');
    END IF;
    IF TG_OP = 'INSERT' THEN
        PERFORM solos_log_event('write', 'short', new.id, new.agent);
        IF new.expires_at <= mark THEN
            INSERT INTO memory_short_late_expiry (row_id) VALUES (new.id) ON CONFLICT DO NOTHING;
        END IF;
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        DELETE FROM memory_vector WHERE tier = 'short' AND row_id = old.id;
        IF old.expires_at > mark THEN
            PERFORM solos_log_event(CASE WHEN old.expires_at <= solos_now() THEN 'expire' ELSE 'delete' END,
                'short', old.id, old.agent);
        ELSE
            DELETE FROM memory_short_late_expiry WHERE row_id = old.id;
            IF FOUND THEN
                PERFORM solos_log_event('expire', 'short', old.id, old.agent);
            END IF;
        END IF;
        PERFORM solos_keep_version('short', old.id, old.agent, old.key, old.value, old.tags, old.expires_at,
            old.created_at, 'delete');
        RETURN NULL;
    END IF;
    IF (old.key, old.value, old.agent) IS DISTINCT FROM (new.key, new.value, new.agent) THEN
        DELETE FROM memory_vector WHERE tier = 'short' AND row_id = old.id;
    END IF;
    IF (old.agent, old.key, old.value, old.tags, old.expires_at)
        IS DISTINCT FROM (new.agent, new.key, new.value, new.tags, new.expires_at) THEN
        PERFORM solos_keep_version('short', old.id, old.agent, old.key, old.value, old.tags, old.expires_at,
            old.created_at, CASE WHEN (old.value, old.key, old.agent) IS DISTINCT FROM (new.value, new.key, new.agent)
            THEN 'update' ELSE 'refresh' END);
        PERFORM solos_log_event('update', 'short', new.id, new.agent);
    END IF;
    IF old.expires_at IS DISTINCT FROM new.expires_at THEN
        IF new.expires_at > mark THEN
            DELETE FROM memory_short_late_expiry WHERE row_id = old.id;
        ELSIF old.expires_at > mark THEN
            INSERT INTO memory_short_late_expiry (row_id) VALUES (new.id) ON CONFLICT DO NOTHING;
        END IF;
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION solos_durable_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF substr(old.key, 1, 8) = 'persona/' THEN
            PERFORM solos_log_event('delete', 'durable', old.id, substr(old.key, 9));
        END IF;
    ELSIF substr(new.key, 1, 8) = 'persona/' THEN
        PERFORM solos_log_event(CASE TG_OP WHEN 'INSERT' THEN 'write' ELSE 'update' END, 'durable', new.id,
            substr(new.key, 9));
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION solos_vector_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE solos_memory_meta SET value = (value::bigint + 1)::text WHERE key = 'vector_generation';
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION solos_notice_logged() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM solos_log_event('notice', 'notice', new.id, new.agent);
    RETURN NULL;
END $$;

-- One open notice per (agent, row): a newer one replaces the agent's open ones for the row (schema.sql).
CREATE OR REPLACE FUNCTION solos_notice_coalesce() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF new.acked_at IS NULL THEN
        DELETE FROM memory_notice WHERE agent = new.agent AND tier = new.tier AND row_id = new.row_id
            AND acked_at IS NULL AND id < new.id;
    END IF;
    RETURN NULL;
END $$;

-- ==== The service's writes: one statement each ====
-- solos_store.Store's upsert_short, upsert_long and append_episodic, step for step (the same checks, the same
-- key lock, the same rows, the same outcome), as one function: PgStore.write_row runs it as one statement whose
-- COMMIT ends its round trip, where the steps took 8 round trips for a new long fact (docs/benchmarks.md).
-- The write key's advisory lock is computed by the caller (solos_store_pg.key_lock). Each answers one row:
-- (id, status, expires_at, the vector generation its vector joined); status 'unknown_agent' or 'conflict'
-- wrote nothing.

-- A write's vector, kept with its row unless the row holds one from that model (solos_store.Store.keep_vector):
-- the vector generation it joined, or NULL when none was kept.
CREATE OR REPLACE FUNCTION solos_keep_vector(v_tier text, v_row bigint, v_model text, v_vector bytea)
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    IF v_model IS NULL THEN  -- apart, so a write without a vector runs no query here
        RETURN NULL;
    END IF;
    IF v_model IS NOT DISTINCT FROM (SELECT v.model FROM memory_vector v WHERE v.tier = v_tier AND v.row_id = v_row) THEN
        RETURN NULL;
    END IF;
    INSERT INTO memory_vector (tier, row_id, model, vector)
    VALUES (v_tier, v_row, v_model, CASE WHEN v_tier = 'long' THEN NULL ELSE v_vector END)
    ON CONFLICT (tier, row_id) DO UPDATE SET model = excluded.model, vector = excluded.vector;
    IF v_tier = 'long' THEN  -- the long tier keeps its vector in memory_longterm.embedding
        UPDATE memory_longterm SET embedding = v_vector WHERE memory_longterm.id = v_row;
    END IF;
    RETURN coalesce((SELECT m.value FROM solos_memory_meta m WHERE m.key = 'vector_generation'), '0')::bigint;
END $$;

-- Whether the writer is registered (no orphan rows, ever); if so, its write key's lock is taken (w_lock: NULL for
-- none), so the same key written twice at once waits for the other's commit: one is `created`. The events it
-- logs are notified after its commit, by the service (solos_log_event).
CREATE OR REPLACE FUNCTION solos_write_begins(w_agent text, w_lock bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agent_registry r WHERE r.agent = w_agent) THEN
        RETURN false;
    END IF;
    PERFORM set_config('solos.notify_after_commit', 'on', true);
    IF w_lock IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(w_lock);
    END IF;
    RETURN true;
END $$;

CREATE OR REPLACE FUNCTION solos_write_short(w_agent text, w_lock bigint, w_key text, w_value text, w_tags text,
    w_ttl text, w_model text, w_vector bytea)
RETURNS TABLE (written_id bigint, written_status text, written_expires_at text, written_generation bigint)
LANGUAGE plpgsql AS $$
DECLARE
    existing bigint;
BEGIN
    IF NOT solos_write_begins(w_agent, w_lock) THEN
        written_status := 'unknown_agent';
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT s.id INTO existing FROM memory_short s WHERE s.agent = w_agent AND s.key = w_key;
    -- A key written again is an UPDATE: INSERT ... ON CONFLICT takes an id from the identity even when it
    -- updates, so the next new row's id would skip one, and the same writes would number rows unlike SQLite.
    IF existing IS NOT NULL THEN
        UPDATE memory_short s SET value = w_value, tags = w_tags, created_at = solos_now(),
            expires_at = solos_at(w_ttl::interval)
        WHERE s.id = existing
        RETURNING s.id, s.expires_at INTO written_id, written_expires_at;
    END IF;
    IF written_id IS NULL THEN
        INSERT INTO memory_short AS s (agent, key, value, tags, created_at, expires_at)
        VALUES (w_agent, w_key, w_value, w_tags, solos_now(), solos_at(w_ttl::interval))
        ON CONFLICT (agent, key) DO UPDATE SET value = excluded.value, tags = excluded.tags,
            created_at = excluded.created_at, expires_at = excluded.expires_at
        RETURNING s.id, s.expires_at INTO written_id, written_expires_at;
    END IF;
    -- The row seen may be gone by the insert (a forget committed between): then this one is new.
    written_status := CASE WHEN existing = written_id THEN 'updated' ELSE 'created' END;
    written_generation := solos_keep_vector('short', written_id, w_model, w_vector);
    RETURN NEXT;
END $$;

CREATE OR REPLACE FUNCTION solos_write_long(w_agent text, w_lock bigint, w_key text, w_topic text, w_fact text,
    w_source text, w_confidence double precision, w_tags text, w_model text, w_vector bytea)
RETURNS TABLE (written_id bigint, written_status text, written_expires_at text, written_generation bigint)
LANGUAGE plpgsql AS $$
DECLARE
    changed integer;
BEGIN
    IF NOT solos_write_begins(w_agent, w_lock) THEN
        written_status := 'unknown_agent';
        RETURN NEXT;
        RETURN;
    END IF;
    -- The writer's row holding exactly this fact (w_key: the full text's sha256), if there is one; locked, so a
    -- forget deleting it now is waited for (then the fact is written anew) and none starts before this commits.
    SELECT l.id INTO written_id FROM memory_write_key k JOIN memory_longterm l ON l.id = k.row_id
    WHERE k.agent = w_agent AND k.tier = 'long' AND k.key = w_key AND l.agent = k.agent AND l.fact = w_fact
    FOR NO KEY UPDATE OF l;
    IF written_id IS NULL THEN
        INSERT INTO memory_longterm AS l (agent, topic, fact, source, confidence, tags)
        VALUES (w_agent, w_topic, w_fact, w_source, w_confidence, w_tags) RETURNING l.id INTO written_id;
        INSERT INTO memory_write_key AS k (agent, tier, key, row_id) VALUES (w_agent, 'long', w_key, written_id)
        ON CONFLICT (agent, tier, key) DO UPDATE SET row_id = excluded.row_id;
        written_status := 'created';
    ELSE  -- an identical retry changes nothing (`unchanged`)
        UPDATE memory_longterm l SET topic = w_topic, source = w_source, confidence = w_confidence, tags = w_tags,
            updated_at = solos_now()
        WHERE l.id = written_id AND NOT (l.topic IS NOT DISTINCT FROM w_topic AND l.source IS NOT DISTINCT FROM w_source
            AND l.confidence IS NOT DISTINCT FROM w_confidence AND l.tags IS NOT DISTINCT FROM w_tags);
        GET DIAGNOSTICS changed = ROW_COUNT;
        written_status := CASE WHEN changed > 0 THEN 'updated' ELSE 'unchanged' END;
    END IF;
    written_generation := solos_keep_vector('long', written_id, w_model, w_vector);
    RETURN NEXT;
END $$;

-- w_key: the idempotency key, or NULL for none (then w_lock is NULL too: nothing is locked or remembered).
CREATE OR REPLACE FUNCTION solos_write_episodic(w_agent text, w_lock bigint, w_key text, w_event_type text,
    w_summary text, w_details text, w_outcome text, w_duration_s double precision, w_model text, w_vector bytea)
RETURNS TABLE (written_id bigint, written_status text, written_expires_at text, written_generation bigint)
LANGUAGE plpgsql AS $$
DECLARE
    earlier memory_episodic%ROWTYPE;
BEGIN
    IF NOT solos_write_begins(w_agent, w_lock) THEN
        written_status := 'unknown_agent';
        RETURN NEXT;
        RETURN;
    END IF;
    IF w_key IS NOT NULL THEN
        -- Locked, as solos_write_long's row: a forget deleting it now is waited for (then it is written anew).
        SELECT e.* INTO earlier FROM memory_write_key k JOIN memory_episodic e ON e.id = k.row_id
        WHERE k.agent = w_agent AND k.tier = 'episodic' AND k.key = w_key AND e.agent = k.agent
        FOR SHARE OF e;
        IF FOUND THEN
            written_id := earlier.id;
            IF (earlier.event_type, earlier.summary, earlier.details, earlier.outcome, earlier.duration_s)
                IS DISTINCT FROM (w_event_type, w_summary, w_details, w_outcome, w_duration_s) THEN
                written_status := 'conflict';  -- the key was used for a different event
            ELSE
                written_status := 'unchanged';
                written_generation := solos_keep_vector('episodic', written_id, w_model, w_vector);
            END IF;
            RETURN NEXT;
            RETURN;
        END IF;
        -- Once `purge` moved it to the archive, the key still names it (archived rows have no vector).
        SELECT a.id, a.event_type, a.summary, a.details, a.outcome, a.duration_s
        INTO earlier.id, earlier.event_type, earlier.summary, earlier.details, earlier.outcome, earlier.duration_s
        FROM memory_write_key k JOIN memory_episodic_archive a ON a.id = k.row_id
        WHERE k.agent = w_agent AND k.tier = 'episodic' AND k.key = w_key AND a.agent = k.agent
        FOR SHARE OF a;
        IF FOUND THEN
            written_id := earlier.id;
            written_status := CASE WHEN (earlier.event_type, earlier.summary, earlier.details, earlier.outcome,
                earlier.duration_s) IS DISTINCT FROM (w_event_type, w_summary, w_details, w_outcome, w_duration_s)
                THEN 'conflict' ELSE 'unchanged' END;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    INSERT INTO memory_episodic AS e (agent, event_type, summary, details, outcome, duration_s)
    VALUES (w_agent, w_event_type, w_summary, w_details, w_outcome, w_duration_s) RETURNING e.id INTO written_id;
    IF w_key IS NOT NULL THEN
        INSERT INTO memory_write_key AS k (agent, tier, key, row_id) VALUES (w_agent, 'episodic', w_key, written_id)
        ON CONFLICT (agent, tier, key) DO UPDATE SET row_id = excluded.row_id;
    END IF;
    written_status := 'created';
    written_generation := solos_keep_vector('episodic', written_id, w_model, w_vector);
    RETURN NEXT;
END $$;

-- Triggers: created once (PostgreSQL 15 has no CREATE TRIGGER IF NOT EXISTS); their functions above are
-- replaced at every start, so a changed function needs no new trigger.
DO $$
DECLARE
    wanted text[][] := ARRAY[
        ['memory_longterm_fts', 'memory_longterm', 'BEFORE INSERT OR UPDATE', 'ROW', 'solos_fts_longterm'],
        ['memory_episodic_fts', 'memory_episodic', 'BEFORE INSERT OR UPDATE', 'ROW', 'solos_fts_episodic'],
        ['memory_episodic_archive_fts', 'memory_episodic_archive', 'BEFORE INSERT OR UPDATE', 'ROW',
         'solos_fts_episodic'],
        ['memory_short_fts', 'memory_short', 'BEFORE INSERT OR UPDATE', 'ROW', 'solos_fts_short'],
        ['memory_short_expiry_spelled', 'memory_short', 'BEFORE INSERT OR UPDATE OF expires_at', 'ROW',
         'solos_short_expiry_spelled'],
        ['memory_longterm_changed', 'memory_longterm', 'AFTER INSERT OR UPDATE OR DELETE', 'ROW',
         'solos_longterm_changed'],
        ['memory_episodic_changed', 'memory_episodic', 'AFTER INSERT OR UPDATE OR DELETE', 'ROW',
         'solos_episodic_changed'],
        ['memory_short_changed', 'memory_short', 'AFTER INSERT OR UPDATE OR DELETE', 'ROW', 'solos_short_changed'],
        ['memory_durable_changed', 'memory_durable', 'AFTER INSERT OR UPDATE OR DELETE', 'ROW',
         'solos_durable_changed'],
        ['memory_vector_changed', 'memory_vector', 'AFTER INSERT OR UPDATE OR DELETE', 'STATEMENT',
         'solos_vector_changed'],
        ['memory_notice_logged', 'memory_notice', 'AFTER INSERT', 'ROW', 'solos_notice_logged'],
        ['memory_notice_coalesce', 'memory_notice', 'AFTER INSERT', 'ROW', 'solos_notice_coalesce']
    ];
    one text[];
BEGIN
    FOREACH one SLICE 1 IN ARRAY wanted LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = one[1] AND tgrelid = one[2]::regclass) THEN
            EXECUTE format('CREATE TRIGGER %I %s ON %I FOR EACH %s EXECUTE FUNCTION %I()',
                one[1], one[3], one[2], one[4], one[5]);
        END IF;
    END LOOP;
END $$;

-- ==== The service's role ====
-- Writes everything of its own, reads the fleet's registry and personas, never writes them; reads the token
-- hashes and never writes them either: SQL on a serving connection cannot mint a token, and the
-- `token` command writes them as the URL's user (solos_store_pg.PgStore.keep_token, an admin store).
-- The audit trail (who read whose episodes, what was forgotten) is append-only to it: the service only
-- inserts and reads those rows, so its own credentials cannot rewrite or delete them.
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'solos_memory_service') THEN
        CREATE ROLE solos_memory_service NOLOGIN;
    END IF;
END $$;
GRANT USAGE ON SCHEMA public TO solos_memory_service;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO solos_memory_service;
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON agent_registry, memory_durable, memory_token FROM solos_memory_service;
REVOKE UPDATE, DELETE, TRUNCATE ON memory_retraction, episodic_read_audit FROM solos_memory_service;
GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO solos_memory_service;
