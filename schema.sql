-- solos-memory schema. Additive only: every statement is CREATE … IF NOT EXISTS,
-- so it runs on the fleet's existing solos.db as well as on a fresh file. The
-- first four tables belong to the fleet and are declared here as the service
-- expects them; the service never ALTERs, DROPs or adds columns to them.
-- Timestamps are UTC ISO 8601 with milliseconds ('2026-11-30T06:00:00.000Z'),
-- so text comparison is time comparison.

-- ==== Fleet tables (existing) ====

CREATE TABLE IF NOT EXISTS agent_registry (
    agent       TEXT PRIMARY KEY,
    role        TEXT,
    created_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- Identity records keyed like 'persona/<agent>' or 'hermes-migration/...'.
-- Read-only for the service.
CREATE TABLE IF NOT EXISTS memory_durable (
    id          INTEGER PRIMARY KEY,
    key         TEXT NOT NULL UNIQUE,
    value       TEXT NOT NULL,
    updated_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

CREATE TABLE IF NOT EXISTS memory_longterm (
    id          INTEGER PRIMARY KEY,
    agent       TEXT NOT NULL,
    topic       TEXT,
    fact        TEXT NOT NULL,
    source      TEXT,
    confidence  REAL,
    tags        TEXT,            -- JSON array of strings
    embedding   BLOB,            -- little-endian float32, see memory_embedding_model
    created_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    updated_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

CREATE TABLE IF NOT EXISTS memory_episodic (
    id          INTEGER PRIMARY KEY,
    agent       TEXT NOT NULL,
    event_type  TEXT NOT NULL,
    summary     TEXT NOT NULL,
    details     TEXT,
    outcome     TEXT,
    duration_s  REAL,
    timestamp   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- Indexes the service's scope filters and recency reads need.
CREATE INDEX IF NOT EXISTS memory_longterm_agent_updated ON memory_longterm (agent, updated_at);
CREATE INDEX IF NOT EXISTS memory_longterm_updated ON memory_longterm (updated_at);
CREATE INDEX IF NOT EXISTS memory_episodic_agent_time ON memory_episodic (agent, timestamp);
CREATE INDEX IF NOT EXISTS memory_episodic_time ON memory_episodic (timestamp);

-- ==== Service tables ====

-- The service's own schema version and settings; never PRAGMA user_version,
-- which belongs to the fleet's database.
CREATE TABLE IF NOT EXISTS solos_memory_meta (
    key    TEXT PRIMARY KEY,
    value  TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS memory_short (
    id          INTEGER PRIMARY KEY,
    agent       TEXT NOT NULL,
    key         TEXT NOT NULL,
    value       TEXT NOT NULL,
    tags        TEXT,            -- JSON array of strings
    created_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    expires_at  TEXT NOT NULL,
    UNIQUE (agent, key)
);
CREATE INDEX IF NOT EXISTS memory_short_agent_expiry ON memory_short (agent, expires_at);
CREATE INDEX IF NOT EXISTS memory_short_expiry ON memory_short (expires_at);

-- Write keys for tiers whose natural key is not a column: long facts are keyed
-- by a hash of their content, episodic events by the client's idempotency key.
CREATE TABLE IF NOT EXISTS memory_write_key (
    agent   TEXT NOT NULL,
    tier    TEXT NOT NULL,
    key     TEXT NOT NULL,
    row_id  INTEGER NOT NULL,
    PRIMARY KEY (agent, tier, key)
) WITHOUT ROWID;

-- An author's opt-in to let other agents read its episodic rows.
CREATE TABLE IF NOT EXISTS episodic_sharing (
    agent       TEXT PRIMARY KEY,
    shared      INTEGER NOT NULL CHECK (shared IN (0, 1)),
    updated_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- Every foreign episodic row handed to a reader; the author can read it.
CREATE TABLE IF NOT EXISTS episodic_read_audit (
    id       INTEGER PRIMARY KEY,
    reader   TEXT NOT NULL,
    author   TEXT NOT NULL,
    row_id   INTEGER NOT NULL,
    read_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX IF NOT EXISTS episodic_read_audit_author ON episodic_read_audit (author, id);

-- Which rows have a vector, from which embedder. Long facts keep the vector
-- itself in memory_longterm.embedding (vector is NULL here); episodic and short
-- rows keep it in vector. Encoding: little-endian float32, L2-normalised, the
-- model's dimension (384 for all-MiniLM-L6-v2). Recall compares only vectors
-- whose model is the loaded embedder's, so two models' vectors never mix.
CREATE TABLE IF NOT EXISTS memory_vector (
    tier    TEXT NOT NULL,
    row_id  INTEGER NOT NULL,
    model   TEXT NOT NULL,
    vector  BLOB,
    PRIMARY KEY (tier, row_id)
) WITHOUT ROWID;

-- Bumped on every vector change (the row is created by the service at startup),
-- so the service reloads its in-memory vectors only when needed.
CREATE TRIGGER IF NOT EXISTS memory_vector_ai AFTER INSERT ON memory_vector BEGIN
    UPDATE solos_memory_meta SET value = value + 1 WHERE key = 'vector_generation';
END;
CREATE TRIGGER IF NOT EXISTS memory_vector_au AFTER UPDATE ON memory_vector BEGIN
    UPDATE solos_memory_meta SET value = value + 1 WHERE key = 'vector_generation';
END;
CREATE TRIGGER IF NOT EXISTS memory_vector_ad AFTER DELETE ON memory_vector BEGIN
    UPDATE solos_memory_meta SET value = value + 1 WHERE key = 'vector_generation';
END;

-- A row whose text changes or that disappears loses its vector (whoever wrote
-- it); the embedding worker gives it a fresh one.
CREATE TRIGGER IF NOT EXISTS memory_longterm_vector_au AFTER UPDATE OF topic, fact, agent ON memory_longterm BEGIN
    DELETE FROM memory_vector WHERE tier = 'long' AND row_id = old.id;
END;
CREATE TRIGGER IF NOT EXISTS memory_longterm_vector_ad AFTER DELETE ON memory_longterm BEGIN
    DELETE FROM memory_vector WHERE tier = 'long' AND row_id = old.id;
END;
CREATE TRIGGER IF NOT EXISTS memory_episodic_vector_au AFTER UPDATE OF event_type, summary, agent ON memory_episodic BEGIN
    DELETE FROM memory_vector WHERE tier = 'episodic' AND row_id = old.id;
END;
CREATE TRIGGER IF NOT EXISTS memory_episodic_vector_ad AFTER DELETE ON memory_episodic BEGIN
    DELETE FROM memory_vector WHERE tier = 'episodic' AND row_id = old.id;
END;
CREATE TRIGGER IF NOT EXISTS memory_short_vector_au AFTER UPDATE OF key, value, agent ON memory_short BEGIN
    DELETE FROM memory_vector WHERE tier = 'short' AND row_id = old.id;
END;
CREATE TRIGGER IF NOT EXISTS memory_short_vector_ad AFTER DELETE ON memory_short BEGIN
    DELETE FROM memory_vector WHERE tier = 'short' AND row_id = old.id;
END;

-- ==== Keyword index ====
-- External-content FTS5 tables kept in step by triggers, so rows the fleet's
-- other writers insert, update or delete directly are searchable (or gone) on
-- the very next request. Porter stemming: "planned" finds "plans". The agent
-- column makes the writer's name searchable.

-- Long facts get a self-contained FTS5 table (it keeps its own copy of the
-- text) because of one extra column: context, the two facts written just
-- before this one under the same topic. Conversation memory is split across
-- consecutive rows ("What did you do?" / "I went to ..."); indexing that
-- context at weight 0.3 lifts LoCoMo hit@5 by 0.07-0.12 (bench/RESULTS-locomo.md).
CREATE INDEX IF NOT EXISTS memory_longterm_topic ON memory_longterm (topic, id);
CREATE VIRTUAL TABLE IF NOT EXISTS memory_longterm_fts USING fts5 (
    topic, fact, tags, agent, context,
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER IF NOT EXISTS memory_longterm_fts_ai AFTER INSERT ON memory_longterm BEGIN
    INSERT INTO memory_longterm_fts (rowid, topic, fact, tags, agent, context)
    VALUES (new.id, new.topic, new.fact, new.tags, new.agent, (
        SELECT coalesce(group_concat(agent || ': ' || fact, ' '), '') FROM (
            SELECT agent, fact FROM memory_longterm
            WHERE new.topic <> '' AND topic = new.topic AND id < new.id ORDER BY id DESC LIMIT 2)));
END;
CREATE TRIGGER IF NOT EXISTS memory_longterm_fts_ad AFTER DELETE ON memory_longterm BEGIN
    DELETE FROM memory_longterm_fts WHERE rowid = old.id;
END;
CREATE TRIGGER IF NOT EXISTS memory_longterm_fts_au
AFTER UPDATE OF topic, fact, tags, agent ON memory_longterm BEGIN
    DELETE FROM memory_longterm_fts WHERE rowid = old.id;
    INSERT INTO memory_longterm_fts (rowid, topic, fact, tags, agent, context)
    VALUES (new.id, new.topic, new.fact, new.tags, new.agent, (
        SELECT coalesce(group_concat(agent || ': ' || fact, ' '), '') FROM (
            SELECT agent, fact FROM memory_longterm
            WHERE new.topic <> '' AND topic = new.topic AND id < new.id ORDER BY id DESC LIMIT 2)));
END;

CREATE VIRTUAL TABLE IF NOT EXISTS memory_episodic_fts USING fts5 (
    event_type, summary, details, outcome, agent,
    content = 'memory_episodic', content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER IF NOT EXISTS memory_episodic_fts_ai AFTER INSERT ON memory_episodic BEGIN
    INSERT INTO memory_episodic_fts (rowid, event_type, summary, details, outcome, agent)
    VALUES (new.id, new.event_type, new.summary, new.details, new.outcome, new.agent);
END;
CREATE TRIGGER IF NOT EXISTS memory_episodic_fts_ad AFTER DELETE ON memory_episodic BEGIN
    INSERT INTO memory_episodic_fts (memory_episodic_fts, rowid, event_type, summary, details, outcome, agent)
    VALUES ('delete', old.id, old.event_type, old.summary, old.details, old.outcome, old.agent);
END;
CREATE TRIGGER IF NOT EXISTS memory_episodic_fts_au
AFTER UPDATE OF event_type, summary, details, outcome, agent ON memory_episodic BEGIN
    INSERT INTO memory_episodic_fts (memory_episodic_fts, rowid, event_type, summary, details, outcome, agent)
    VALUES ('delete', old.id, old.event_type, old.summary, old.details, old.outcome, old.agent);
    INSERT INTO memory_episodic_fts (rowid, event_type, summary, details, outcome, agent)
    VALUES (new.id, new.event_type, new.summary, new.details, new.outcome, new.agent);
END;

CREATE VIRTUAL TABLE IF NOT EXISTS memory_short_fts USING fts5 (
    key, value, tags, agent,
    content = 'memory_short', content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER IF NOT EXISTS memory_short_fts_ai AFTER INSERT ON memory_short BEGIN
    INSERT INTO memory_short_fts (rowid, key, value, tags, agent)
    VALUES (new.id, new.key, new.value, new.tags, new.agent);
END;
CREATE TRIGGER IF NOT EXISTS memory_short_fts_ad AFTER DELETE ON memory_short BEGIN
    INSERT INTO memory_short_fts (memory_short_fts, rowid, key, value, tags, agent)
    VALUES ('delete', old.id, old.key, old.value, old.tags, old.agent);
END;
CREATE TRIGGER IF NOT EXISTS memory_short_fts_au
AFTER UPDATE OF key, value, tags, agent ON memory_short BEGIN
    INSERT INTO memory_short_fts (memory_short_fts, rowid, key, value, tags, agent)
    VALUES ('delete', old.id, old.key, old.value, old.tags, old.agent);
    INSERT INTO memory_short_fts (rowid, key, value, tags, agent)
    VALUES (new.id, new.key, new.value, new.tags, new.agent);
END;

-- ==== Qdrant (optional, solos_qdrant.py) ====

-- Every point `import-qdrant` has looked at, with its latest verdict: the row
-- it became (row_id: a long fact's, reason NULL; or, reason 'imported_private',
-- the episode a private point became), or why it was left out (reason: no_agent,
-- no_text, unregistered_agent, ...). /v1/stats counts the reasons. Keyed by the
-- text's sha256 too, so a point rewritten in place is looked at again. Forgetting
-- a private point's episode sets reason 'forget_pending' (the point's delete,
-- queued for the mirror: its id and the text's hash, never the text), then
-- 'forgotten' once Qdrant has deleted it.
CREATE TABLE IF NOT EXISTS qdrant_import (
    collection      TEXT NOT NULL,
    point_id        TEXT NOT NULL,
    content_sha256  TEXT NOT NULL,
    row_id          INTEGER,
    reason          TEXT,
    seen_at         TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (collection, point_id, content_sha256)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS qdrant_import_row ON qdrant_import (row_id);
CREATE INDEX IF NOT EXISTS qdrant_import_forget_pending ON qdrant_import (collection)
    WHERE reason = 'forget_pending';

-- Long-fact changes waiting to reach Qdrant, written by the triggers below in
-- the writer's own transaction (so no acknowledged write can miss the mirror)
-- and deleted by the mirror once Qdrant has them. An upsert names the row (its
-- current state is sent); a delete keeps the old writer and text, from which
-- the point id is derived.
CREATE TABLE IF NOT EXISTS qdrant_outbox (
    id           INTEGER PRIMARY KEY,
    action       TEXT NOT NULL CHECK (action IN ('upsert', 'delete')),
    row_id       INTEGER NOT NULL,
    agent        TEXT,
    fact         TEXT,
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT,
    next_try_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    created_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX IF NOT EXISTS qdrant_outbox_due ON qdrant_outbox (next_try_at);

-- Only while a mirror has been switched on (solos_memory_meta.qdrant_mirror =
-- 'on', set by `serve --qdrant-url/--qdrant-path`); otherwise a write pays one
-- primary-key lookup. Vector updates (embedding) are not changes to mirror.
CREATE TRIGGER IF NOT EXISTS qdrant_outbox_long_ai AFTER INSERT ON memory_longterm
WHEN (SELECT value FROM solos_memory_meta WHERE key = 'qdrant_mirror') = 'on' BEGIN
    INSERT INTO qdrant_outbox (action, row_id) VALUES ('upsert', new.id);
END;
CREATE TRIGGER IF NOT EXISTS qdrant_outbox_long_au
AFTER UPDATE OF agent, topic, fact, source, confidence, tags ON memory_longterm
WHEN (SELECT value FROM solos_memory_meta WHERE key = 'qdrant_mirror') = 'on' BEGIN
    INSERT INTO qdrant_outbox (action, row_id, agent, fact)
    SELECT 'delete', old.id, old.agent, old.fact WHERE old.agent IS NOT new.agent OR old.fact IS NOT new.fact;
    INSERT INTO qdrant_outbox (action, row_id) VALUES ('upsert', new.id);
END;
CREATE TRIGGER IF NOT EXISTS qdrant_outbox_long_ad AFTER DELETE ON memory_longterm
WHEN (SELECT value FROM solos_memory_meta WHERE key = 'qdrant_mirror') = 'on' BEGIN
    INSERT INTO qdrant_outbox (action, row_id, agent, fact) VALUES ('delete', old.id, old.agent, old.fact);
END;

-- ==== Promotion and archive (solos_lifecycle.py) ====

-- Which episodic rows a long fact was promoted from (episodic -> long only).
CREATE TABLE IF NOT EXISTS memory_promotion (
    long_id      INTEGER NOT NULL,
    episodic_id  INTEGER NOT NULL,
    agent        TEXT NOT NULL,
    promoted_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (long_id, episodic_id)
) WITHOUT ROWID;

-- A long fact that goes (forgotten, or deleted by any writer) takes its promotion records along,
-- so promoted_facts counts facts that exist.
CREATE TRIGGER IF NOT EXISTS memory_promotion_long_ad AFTER DELETE ON memory_longterm BEGIN
    DELETE FROM memory_promotion WHERE long_id = old.id;
END;

-- Episodic rows past the archive age, moved here by `purge` with their ids:
-- out of the hot table and its indexes, recallable with archive=true.
CREATE TABLE IF NOT EXISTS memory_episodic_archive (
    id           INTEGER PRIMARY KEY,
    agent        TEXT NOT NULL,
    event_type   TEXT NOT NULL,
    summary      TEXT NOT NULL,
    details      TEXT,
    outcome      TEXT,
    duration_s   REAL,
    timestamp    TEXT NOT NULL,
    archived_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX IF NOT EXISTS memory_episodic_archive_agent_time ON memory_episodic_archive (agent, timestamp);
CREATE VIRTUAL TABLE IF NOT EXISTS memory_episodic_archive_fts USING fts5 (
    event_type, summary, details, outcome, agent,
    content = 'memory_episodic_archive', content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER IF NOT EXISTS memory_episodic_archive_fts_ai AFTER INSERT ON memory_episodic_archive BEGIN
    INSERT INTO memory_episodic_archive_fts (rowid, event_type, summary, details, outcome, agent)
    VALUES (new.id, new.event_type, new.summary, new.details, new.outcome, new.agent);
END;
CREATE TRIGGER IF NOT EXISTS memory_episodic_archive_fts_ad AFTER DELETE ON memory_episodic_archive BEGIN
    INSERT INTO memory_episodic_archive_fts (memory_episodic_archive_fts, rowid, event_type, summary, details, outcome, agent)
    VALUES ('delete', old.id, old.event_type, old.summary, old.details, old.outcome, old.agent);
END;

-- ==== Dataspace: retractions and the event log (solos_dataspace.py) ====

-- One row per forgotten row: who, which row, when, and a hash of what it said.
-- Never the text: an audit can show that something was forgotten, not what.
-- A restore re-applies these, so a forgotten row stays forgotten.
CREATE TABLE IF NOT EXISTS memory_retraction (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    agent         TEXT NOT NULL,
    tier          TEXT NOT NULL,
    row_id        INTEGER NOT NULL,
    content_hash  TEXT NOT NULL,   -- sha256 of the row's content (long: of the fact)
    key_hash      TEXT,            -- short rows: sha256 of the key, which names the row across its versions
    forgotten_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
-- Whether a writer forgot these words: asked by import-qdrant of each point it takes in, inside its batch's
-- write transaction (solos_qdrant: an old copy never brings a forgotten fact or private episode back).
CREATE INDEX IF NOT EXISTS memory_retraction_content ON memory_retraction (agent, tier, content_hash);

-- Forgets whose scrub has not finished: the tier's keyword-index segments and
-- the WAL may still hold the forgotten text. Written in the forget's own
-- transaction, cleared once a merge and a WAL checkpoint are done; a service
-- that died in between finishes the scrub when it starts again.
CREATE TABLE IF NOT EXISTS memory_scrub_pending (
    tier           TEXT PRIMARY KEY,
    retraction_id  INTEGER NOT NULL,   -- the latest retraction the scrub covers
    queued_at      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- Every write, update, delete, forget and expiry, in commit order, whoever made
-- it: the triggers below log rows the fleet's other writers change directly.
-- AUTOINCREMENT: an id is never reused, so subscribers resume by id. No text:
-- subscribers read the row itself, so a forget leaves nothing behind here.
-- Pruned after the retention window (solos_dataspace.EVENT_RETENTION_S).
CREATE TABLE IF NOT EXISTS memory_event (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    ts      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    kind    TEXT NOT NULL,   -- write, update, delete, forget, expire, archive
    tier    TEXT NOT NULL,
    row_id  INTEGER NOT NULL,
    agent   TEXT             -- the row's writer; durable: the agent of persona/<agent>
);

CREATE TRIGGER IF NOT EXISTS memory_longterm_event_ai AFTER INSERT ON memory_longterm BEGIN
    INSERT INTO memory_event (kind, tier, row_id, agent) VALUES ('write', 'long', new.id, new.agent);
END;
-- Only a change of content is an event: the embedder filling `embedding`, or a
-- re-write of the same fact, is not.
CREATE TRIGGER IF NOT EXISTS memory_longterm_event_au AFTER UPDATE OF agent, topic, fact, source, confidence, tags
ON memory_longterm WHEN old.agent IS NOT new.agent OR old.topic IS NOT new.topic OR old.fact IS NOT new.fact
    OR old.source IS NOT new.source OR old.confidence IS NOT new.confidence OR old.tags IS NOT new.tags BEGIN
    INSERT INTO memory_event (kind, tier, row_id, agent) VALUES ('update', 'long', new.id, new.agent);
END;
CREATE TRIGGER IF NOT EXISTS memory_longterm_event_ad AFTER DELETE ON memory_longterm BEGIN
    INSERT INTO memory_event (kind, tier, row_id, agent) VALUES ('delete', 'long', old.id, old.agent);
END;

CREATE TRIGGER IF NOT EXISTS memory_episodic_event_ai AFTER INSERT ON memory_episodic BEGIN
    INSERT INTO memory_event (kind, tier, row_id, agent) VALUES ('write', 'episodic', new.id, new.agent);
END;
CREATE TRIGGER IF NOT EXISTS memory_episodic_event_au
AFTER UPDATE OF agent, event_type, summary, details, outcome, duration_s ON memory_episodic
WHEN old.agent IS NOT new.agent OR old.event_type IS NOT new.event_type OR old.summary IS NOT new.summary
    OR old.details IS NOT new.details OR old.outcome IS NOT new.outcome OR old.duration_s IS NOT new.duration_s BEGIN
    INSERT INTO memory_event (kind, tier, row_id, agent) VALUES ('update', 'episodic', new.id, new.agent);
END;
-- `purge` moves old episodes to the archive (insert there, then delete here): 'archive', not 'delete'.
CREATE TRIGGER IF NOT EXISTS memory_episodic_event_ad AFTER DELETE ON memory_episodic BEGIN
    INSERT INTO memory_event (kind, tier, row_id, agent) VALUES (
        CASE WHEN EXISTS (SELECT 1 FROM memory_episodic_archive WHERE id = old.id) THEN 'archive' ELSE 'delete' END,
        'episodic', old.id, old.agent);
END;

CREATE TRIGGER IF NOT EXISTS memory_short_event_ai AFTER INSERT ON memory_short BEGIN
    INSERT INTO memory_event (kind, tier, row_id, agent) VALUES ('write', 'short', new.id, new.agent);
END;
CREATE TRIGGER IF NOT EXISTS memory_short_event_au AFTER UPDATE OF agent, key, value, tags, expires_at ON memory_short
BEGIN
    INSERT INTO memory_event (kind, tier, row_id, agent) VALUES ('update', 'short', new.id, new.agent);
END;
-- The service logs 'expire' when a short row's TTL passes and then advances
-- events_expired_through; deleting a row it already reported (purge) is no new
-- event. A row that expired unreported (the service was down) reports now.
CREATE TRIGGER IF NOT EXISTS memory_short_event_ad AFTER DELETE ON memory_short
WHEN old.expires_at > coalesce((SELECT value FROM solos_memory_meta WHERE key = 'events_expired_through'), '') BEGIN
    INSERT INTO memory_event (kind, tier, row_id, agent) VALUES (
        CASE WHEN old.expires_at <= strftime('%Y-%m-%dT%H:%M:%fZ', 'now') THEN 'expire' ELSE 'delete' END,
        'short', old.id, old.agent);
END;

-- expires_at is compared as text, so the service writes it one way: UTC as 2026-12-07T09:17:34.000Z. A fleet
-- script's other spelling of a date ('2026-12-07 09:17:34', no milliseconds, an offset) compares wrong: its
-- row is hidden and purged up to a day early (an offset: hours off), and nobody is told. Such a write is
-- refused, naming the column. Only a date from yesterday on is judged so: an older one ('2000-01-01': "expire it")
-- or one from 2100 on ('9999-12-31': "never") is on the same side of now in any spelling, and a value that is no
-- date ('2999', 'z') was never compared as one: each is taken as written.
CREATE TRIGGER IF NOT EXISTS memory_short_expiry_spelled_in BEFORE INSERT ON memory_short
WHEN new.expires_at < '2100' AND new.expires_at >= strftime('%Y-%m-%d', 'now', '-1 day')
    AND new.expires_at GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]*' AND NOT new.expires_at
    GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9].[0-9][0-9][0-9]Z' BEGIN
    SELECT RAISE(ABORT, 'memory_short.expires_at must be UTC written as 2026-12-07T09:17:34.000Z (strftime(''%Y-%m-%dT%H:%M:%fZ'', ...)): another spelling compares wrong and the row would expire early');
END;
CREATE TRIGGER IF NOT EXISTS memory_short_expiry_spelled_up BEFORE UPDATE OF expires_at ON memory_short
WHEN new.expires_at IS NOT old.expires_at AND new.expires_at < '2100'
    AND new.expires_at >= strftime('%Y-%m-%d', 'now', '-1 day')
    AND new.expires_at GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]*'
    AND NOT new.expires_at
    GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9].[0-9][0-9][0-9]Z' BEGIN
    SELECT RAISE(ABORT, 'memory_short.expires_at must be UTC written as 2026-12-07T09:17:34.000Z (strftime(''%Y-%m-%dT%H:%M:%fZ'', ...)): another spelling compares wrong and the row would expire early');
END;

-- The sweep reads only the window (events_expired_through, now]. A short row
-- written with, or moved to, an expiry at or before that mark (the fleet
-- back-dates it, or shortens its TTL to the past) waits here until the sweep
-- reports it, or its delete does; a new TTL past the mark takes it out.
CREATE TABLE IF NOT EXISTS memory_short_late_expiry (
    row_id  INTEGER PRIMARY KEY
);
CREATE TRIGGER IF NOT EXISTS memory_short_late_expiry_ai AFTER INSERT ON memory_short
WHEN new.expires_at <= (SELECT value FROM solos_memory_meta WHERE key = 'events_expired_through') BEGIN
    INSERT OR IGNORE INTO memory_short_late_expiry (row_id) VALUES (new.id);
END;
CREATE TRIGGER IF NOT EXISTS memory_short_late_expiry_au AFTER UPDATE OF expires_at ON memory_short
WHEN old.expires_at IS NOT new.expires_at BEGIN
    DELETE FROM memory_short_late_expiry WHERE row_id = old.id AND new.expires_at > coalesce(
        (SELECT value FROM solos_memory_meta WHERE key = 'events_expired_through'), '');
    INSERT OR IGNORE INTO memory_short_late_expiry (row_id) SELECT new.id FROM solos_memory_meta
    WHERE key = 'events_expired_through' AND new.expires_at <= value AND old.expires_at > value;
END;
CREATE TRIGGER IF NOT EXISTS memory_short_late_expiry_ad AFTER DELETE ON memory_short
WHEN EXISTS (SELECT 1 FROM memory_short_late_expiry WHERE row_id = old.id) BEGIN
    DELETE FROM memory_short_late_expiry WHERE row_id = old.id;
    INSERT INTO memory_event (kind, tier, row_id, agent) VALUES ('expire', 'short', old.id, old.agent);
END;

-- The fleet writes persona/<agent> records directly; each is an event for that agent alone.
CREATE TRIGGER IF NOT EXISTS memory_durable_event_ai AFTER INSERT ON memory_durable
WHEN substr(new.key, 1, 8) = 'persona/' BEGIN
    INSERT INTO memory_event (kind, tier, row_id, agent) VALUES ('write', 'durable', new.id, substr(new.key, 9));
END;
CREATE TRIGGER IF NOT EXISTS memory_durable_event_au AFTER UPDATE ON memory_durable
WHEN substr(new.key, 1, 8) = 'persona/' BEGIN
    INSERT INTO memory_event (kind, tier, row_id, agent) VALUES ('update', 'durable', new.id, substr(new.key, 9));
END;
CREATE TRIGGER IF NOT EXISTS memory_durable_event_ad AFTER DELETE ON memory_durable
WHEN substr(old.key, 1, 8) = 'persona/' BEGIN
    INSERT INTO memory_event (kind, tier, row_id, agent) VALUES ('delete', 'durable', old.id, substr(old.key, 9));
END;

-- ==== Row ids: never reused ====
-- The fleet's tables have no AUTOINCREMENT, so SQLite gives a new row the
-- largest id + 1: forget the newest row and the next writer's row takes its
-- id, which events, the archive, retractions and clients still name (once,
-- a replayed event showed another agent's private episode). The high-water
-- mark of each id space (an archived episode keeps its id, so the archive
-- shares the episodic one) lives in solos_memory_meta as 'row_id_high:<tier>'.
-- When a table's largest id has fallen below its mark, a new row without an id
-- of its own is placed above the mark: a placeholder row (agent '', which no
-- agent name can be, and a text saying so) holds the mark while SQLite picks
-- the next id, and goes again, with the events and outbox rows it caused, once
-- the row is in (or, for an upsert that became an update, once that is done).
-- Rows inserted with explicit ids (purge's archive, restore) keep them. The
-- service sets each mark at start from every id it knows of (Store.migrate).
CREATE TRIGGER IF NOT EXISTS memory_longterm_id_mark AFTER INSERT ON memory_longterm
WHEN new.id > coalesce((SELECT CAST(value AS INTEGER) FROM solos_memory_meta WHERE key = 'row_id_high:long'), 0)
BEGIN
    INSERT OR REPLACE INTO solos_memory_meta (key, value) VALUES ('row_id_high:long', new.id);
END;
CREATE TRIGGER IF NOT EXISTS memory_longterm_id_reserve BEFORE INSERT ON memory_longterm
WHEN new.id < 0 AND coalesce((SELECT max(id) FROM memory_longterm), 0)
    < coalesce((SELECT CAST(value AS INTEGER) FROM solos_memory_meta WHERE key = 'row_id_high:long'), 0) BEGIN
    INSERT INTO memory_longterm (id, agent, fact) VALUES (
        coalesce((SELECT CAST(value AS INTEGER) FROM solos_memory_meta WHERE key = 'row_id_high:long'), 0),
        '', '(row id reserved by solos-memory)');
END;
CREATE TRIGGER IF NOT EXISTS memory_longterm_id_release_in AFTER INSERT ON memory_longterm
WHEN new.agent <> '' AND EXISTS (SELECT 1 FROM memory_longterm WHERE agent = '' AND fact = '(row id reserved by solos-memory)') BEGIN
    DELETE FROM memory_longterm WHERE agent = '' AND fact = '(row id reserved by solos-memory)';
    DELETE FROM memory_event WHERE id > (SELECT max(id) FROM memory_event) - 8 AND tier = 'long' AND agent = '';
    DELETE FROM qdrant_outbox WHERE id > (SELECT max(id) FROM qdrant_outbox) - 4
        AND (agent = '' OR (action = 'upsert' AND row_id NOT IN (SELECT id FROM memory_longterm)));
END;

CREATE TRIGGER IF NOT EXISTS memory_episodic_id_mark AFTER INSERT ON memory_episodic
WHEN new.id > coalesce((SELECT CAST(value AS INTEGER) FROM solos_memory_meta WHERE key = 'row_id_high:episodic'), 0)
BEGIN
    INSERT OR REPLACE INTO solos_memory_meta (key, value) VALUES ('row_id_high:episodic', new.id);
END;
CREATE TRIGGER IF NOT EXISTS memory_episodic_archive_id_mark AFTER INSERT ON memory_episodic_archive
WHEN new.id > coalesce((SELECT CAST(value AS INTEGER) FROM solos_memory_meta WHERE key = 'row_id_high:episodic'), 0)
BEGIN
    INSERT OR REPLACE INTO solos_memory_meta (key, value) VALUES ('row_id_high:episodic', new.id);
END;
CREATE TRIGGER IF NOT EXISTS memory_episodic_id_reserve BEFORE INSERT ON memory_episodic
WHEN new.id < 0 AND coalesce((SELECT max(id) FROM memory_episodic), 0)
    < coalesce((SELECT CAST(value AS INTEGER) FROM solos_memory_meta WHERE key = 'row_id_high:episodic'), 0) BEGIN
    INSERT INTO memory_episodic (id, agent, event_type, summary) VALUES (
        coalesce((SELECT CAST(value AS INTEGER) FROM solos_memory_meta WHERE key = 'row_id_high:episodic'), 0),
        '', 'reserved', '(row id reserved by solos-memory)');
END;
CREATE TRIGGER IF NOT EXISTS memory_episodic_id_release_in AFTER INSERT ON memory_episodic
WHEN new.agent <> '' AND EXISTS (SELECT 1 FROM memory_episodic WHERE agent = '' AND summary = '(row id reserved by solos-memory)') BEGIN
    DELETE FROM memory_episodic WHERE agent = '' AND summary = '(row id reserved by solos-memory)';
    DELETE FROM memory_event WHERE id > (SELECT max(id) FROM memory_event) - 8 AND tier = 'episodic' AND agent = '';
END;

CREATE TRIGGER IF NOT EXISTS memory_short_id_mark AFTER INSERT ON memory_short
WHEN new.id > coalesce((SELECT CAST(value AS INTEGER) FROM solos_memory_meta WHERE key = 'row_id_high:short'), 0)
BEGIN
    INSERT OR REPLACE INTO solos_memory_meta (key, value) VALUES ('row_id_high:short', new.id);
END;
CREATE TRIGGER IF NOT EXISTS memory_short_id_reserve BEFORE INSERT ON memory_short
WHEN new.id < 0 AND coalesce((SELECT max(id) FROM memory_short), 0)
    < coalesce((SELECT CAST(value AS INTEGER) FROM solos_memory_meta WHERE key = 'row_id_high:short'), 0) BEGIN
    INSERT INTO memory_short (id, agent, key, value, expires_at) VALUES (
        coalesce((SELECT CAST(value AS INTEGER) FROM solos_memory_meta WHERE key = 'row_id_high:short'), 0),
        '', '', '(row id reserved by solos-memory)', '');
END;
CREATE TRIGGER IF NOT EXISTS memory_short_id_release_in AFTER INSERT ON memory_short
WHEN new.agent <> '' AND EXISTS (SELECT 1 FROM memory_short WHERE agent = '' AND value = '(row id reserved by solos-memory)') BEGIN
    DELETE FROM memory_short WHERE agent = '' AND value = '(row id reserved by solos-memory)';
    DELETE FROM memory_event WHERE id > (SELECT max(id) FROM memory_event) - 8 AND tier = 'short' AND agent = '';
END;
CREATE TRIGGER IF NOT EXISTS memory_short_id_release_up AFTER UPDATE ON memory_short
WHEN new.agent <> '' AND EXISTS (SELECT 1 FROM memory_short WHERE agent = '' AND value = '(row id reserved by solos-memory)') BEGIN
    DELETE FROM memory_short WHERE agent = '' AND value = '(row id reserved by solos-memory)';
    DELETE FROM memory_event WHERE id > (SELECT max(id) FROM memory_event) - 8 AND tier = 'short' AND agent = '';
END;

-- ==== The operator's view: jobs and activity (solos_jobs.py, solos_status.py) ====

-- One row per run of a daily job (purge, archive, snapshot): when it started and
-- ended, how it went and how many rows it touched. The last 100 per job are kept.
CREATE TABLE IF NOT EXISTS memory_job_run (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    job         TEXT NOT NULL,
    started_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    ended_at    TEXT,                                -- NULL while it runs (or if it died unrecorded)
    result      TEXT NOT NULL DEFAULT 'running',     -- running, ok, failed
    rows        INTEGER,                             -- rows touched (a snapshot: rows copied)
    error       TEXT                                 -- a failed run's message
);
CREATE INDEX IF NOT EXISTS memory_job_run_job ON memory_job_run (job, id);

-- What the service counted per minute, so the status page's hour and day survive a
-- restart: recalls per agent, rows an agent read of another's, and recall latency
-- (how many of an agent's recalls took at most `detail` ms). Counts only, never text;
-- rows older than 25 hours are deleted.
CREATE TABLE IF NOT EXISTS memory_activity (
    minute  INTEGER NOT NULL,          -- minutes since the Unix epoch
    kind    TEXT NOT NULL,             -- recall, read, latency
    agent   TEXT NOT NULL,             -- the reader
    detail  TEXT NOT NULL DEFAULT '',  -- read: the writer; latency: the bucket's upper bound in ms
    n       INTEGER NOT NULL,
    PRIMARY KEY (minute, kind, agent, detail)
) WITHOUT ROWID;

-- ==== Provenance: who was shown what, versions, retraction notices (solos_provenance.py) ====

-- The rows recall, read_events or a stream handed to an agent: reader, row, its writer, when. No text. One row
-- per (reader, row, version) an hour, written before the answer (solos_provenance.DeliveryLog); kept 90 days.
CREATE TABLE IF NOT EXISTS memory_delivery (
    id            INTEGER PRIMARY KEY,
    reader        TEXT NOT NULL,
    tier          TEXT NOT NULL,
    row_id        INTEGER NOT NULL,
    writer        TEXT NOT NULL,
    delivered_at  TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS memory_delivery_row ON memory_delivery (tier, row_id, delivered_at);
CREATE INDEX IF NOT EXISTS memory_delivery_reader ON memory_delivery (reader, delivered_at);
CREATE INDEX IF NOT EXISTS memory_delivery_writer ON memory_delivery (writer, id);

-- The versions an update or a delete replaced, for as-of recall: valid from valid_from until valid_to
-- (a short row also only until its expires_at). Filled by the triggers below, whoever writes; the current
-- version is the row itself. A forget deletes every version of its row (solos_store.erase).
CREATE TABLE IF NOT EXISTS memory_version (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    tier        TEXT NOT NULL,
    row_id      INTEGER NOT NULL,
    agent       TEXT NOT NULL,
    label       TEXT,            -- long: topic; short: key; episodic: event_type
    text        TEXT NOT NULL,   -- long: fact; short: value; episodic: summary
    tags        TEXT,
    expires_at  TEXT,            -- short rows
    valid_from  TEXT NOT NULL,
    valid_to    TEXT NOT NULL,
    ended_by    TEXT NOT NULL CHECK (ended_by IN ('update', 'refresh', 'delete'))  -- refresh: same text
);
CREATE INDEX IF NOT EXISTS memory_version_row ON memory_version (tier, row_id, valid_to);
CREATE INDEX IF NOT EXISTS memory_version_until ON memory_version (valid_to);
-- The daily purge's short values past their expiry (solos_store.Queries.purge_expired_short).
CREATE INDEX IF NOT EXISTS memory_version_expiry ON memory_version (tier, expires_at);

-- A row's versions follow each other: a version starts where the one before it ended (or at the row's birth).
CREATE TRIGGER IF NOT EXISTS memory_longterm_version_au AFTER UPDATE OF agent, topic, fact, tags ON memory_longterm
WHEN old.agent IS NOT new.agent OR old.topic IS NOT new.topic OR old.fact IS NOT new.fact OR old.tags IS NOT new.tags
BEGIN
    INSERT INTO memory_version (tier, row_id, agent, label, text, tags, valid_from, valid_to, ended_by)
    VALUES ('long', old.id, old.agent, old.topic, old.fact, old.tags, max(old.created_at, coalesce(
        (SELECT max(valid_to) FROM memory_version WHERE tier = 'long' AND row_id = old.id), '')),
        strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
        CASE WHEN old.fact IS NOT new.fact OR old.agent IS NOT new.agent THEN 'update' ELSE 'refresh' END);
END;
CREATE TRIGGER IF NOT EXISTS memory_longterm_version_ad AFTER DELETE ON memory_longterm WHEN old.agent <> '' BEGIN
    INSERT INTO memory_version (tier, row_id, agent, label, text, tags, valid_from, valid_to, ended_by)
    VALUES ('long', old.id, old.agent, old.topic, old.fact, old.tags, max(old.created_at, coalesce(
        (SELECT max(valid_to) FROM memory_version WHERE tier = 'long' AND row_id = old.id), '')),
        strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), 'delete');
END;
CREATE TRIGGER IF NOT EXISTS memory_short_version_au AFTER UPDATE OF agent, key, value, tags, expires_at ON memory_short
WHEN old.agent <> '' AND (old.agent IS NOT new.agent OR old.key IS NOT new.key OR old.value IS NOT new.value
    OR old.tags IS NOT new.tags OR old.expires_at IS NOT new.expires_at) BEGIN
    INSERT INTO memory_version (tier, row_id, agent, label, text, tags, expires_at, valid_from, valid_to, ended_by)
    VALUES ('short', old.id, old.agent, old.key, old.value, old.tags, old.expires_at, max(old.created_at, coalesce(
        (SELECT max(valid_to) FROM memory_version WHERE tier = 'short' AND row_id = old.id), '')),
        strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
        CASE WHEN old.value IS NOT new.value OR old.key IS NOT new.key OR old.agent IS NOT new.agent
        THEN 'update' ELSE 'refresh' END);
END;
CREATE TRIGGER IF NOT EXISTS memory_short_version_ad AFTER DELETE ON memory_short WHEN old.agent <> '' BEGIN
    INSERT INTO memory_version (tier, row_id, agent, label, text, tags, expires_at, valid_from, valid_to, ended_by)
    VALUES ('short', old.id, old.agent, old.key, old.value, old.tags, old.expires_at, max(old.created_at, coalesce(
        (SELECT max(valid_to) FROM memory_version WHERE tier = 'short' AND row_id = old.id), '')),
        strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), 'delete');
END;
CREATE TRIGGER IF NOT EXISTS memory_episodic_version_au AFTER UPDATE OF agent, event_type, summary ON memory_episodic
WHEN old.agent <> '' AND (old.agent IS NOT new.agent OR old.event_type IS NOT new.event_type
    OR old.summary IS NOT new.summary) BEGIN
    INSERT INTO memory_version (tier, row_id, agent, label, text, valid_from, valid_to, ended_by)
    VALUES ('episodic', old.id, old.agent, old.event_type, old.summary, max(old.timestamp, coalesce(
        (SELECT max(valid_to) FROM memory_version WHERE tier = 'episodic' AND row_id = old.id), '')),
        strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), 'update');
END;
-- An archived episode lives on in the archive table: only a real delete ends it.
CREATE TRIGGER IF NOT EXISTS memory_episodic_version_ad AFTER DELETE ON memory_episodic
WHEN old.agent <> '' AND NOT EXISTS (SELECT 1 FROM memory_episodic_archive WHERE id = old.id) BEGIN
    INSERT INTO memory_version (tier, row_id, agent, label, text, valid_from, valid_to, ended_by)
    VALUES ('episodic', old.id, old.agent, old.event_type, old.summary, max(old.timestamp, coalesce(
        (SELECT max(valid_to) FROM memory_version WHERE tier = 'episodic' AND row_id = old.id), '')),
        strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), 'delete');
END;

-- When a forgotten row was born (timestamps only), so as-of recall can show it as a retraction at the times
-- it existed; written by the forget with its retraction.
CREATE TABLE IF NOT EXISTS memory_forgotten_span (
    retraction_id  INTEGER PRIMARY KEY,
    tier           TEXT NOT NULL,
    row_id         INTEGER NOT NULL,
    agent          TEXT NOT NULL,
    born_at        TEXT NOT NULL,
    forgotten_at   TEXT NOT NULL,
    lived_until    TEXT NOT NULL     -- forgotten_at, or a short row's expiry if that came first
);
CREATE INDEX IF NOT EXISTS memory_forgotten_span_time ON memory_forgotten_span (forgotten_at);

-- Within a forgotten short row's span, the times it did not count: expired, until its key was written again.
-- As-of recall lists no retraction then (the row was not there to be shown). Written with the span.
CREATE TABLE IF NOT EXISTS memory_forgotten_gap (
    retraction_id  INTEGER NOT NULL,
    gap_from       TEXT NOT NULL,
    gap_until      TEXT NOT NULL,
    PRIMARY KEY (retraction_id, gap_from)
);

-- When each author was sharing its episodes (episodic_sharing's opt-in, from when until when), kept by the
-- triggers below whoever writes: as-of recall shows another agent only an episode's versions that were current
-- while their author was sharing. A database from before this table starts each sharing author's
-- span at its last opt-in (updated_at): earlier replaced versions stay hidden rather than guessed shared.
CREATE TABLE IF NOT EXISTS episodic_sharing_span (
    agent         TEXT NOT NULL,
    shared_from   TEXT NOT NULL,
    shared_until  TEXT,             -- NULL: sharing now
    PRIMARY KEY (agent, shared_from)
);
INSERT OR IGNORE INTO episodic_sharing_span (agent, shared_from)
    SELECT agent, updated_at FROM episodic_sharing s WHERE shared = 1
    AND NOT EXISTS (SELECT 1 FROM episodic_sharing_span p WHERE p.agent = s.agent);
CREATE TRIGGER IF NOT EXISTS episodic_sharing_span_ai AFTER INSERT ON episodic_sharing WHEN new.shared = 1 BEGIN
    INSERT OR IGNORE INTO episodic_sharing_span (agent, shared_from)
    VALUES (new.agent, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));
END;
CREATE TRIGGER IF NOT EXISTS episodic_sharing_span_on AFTER UPDATE OF shared ON episodic_sharing
WHEN old.shared = 0 AND new.shared = 1 BEGIN
    INSERT OR IGNORE INTO episodic_sharing_span (agent, shared_from)
    VALUES (new.agent, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));
END;
CREATE TRIGGER IF NOT EXISTS episodic_sharing_span_off AFTER UPDATE OF shared ON episodic_sharing
WHEN old.shared = 1 AND new.shared = 0 BEGIN
    UPDATE episodic_sharing_span SET shared_until = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
    WHERE agent = old.agent AND shared_until IS NULL;
END;
CREATE TRIGGER IF NOT EXISTS episodic_sharing_span_ad AFTER DELETE ON episodic_sharing WHEN old.shared = 1 BEGIN
    UPDATE episodic_sharing_span SET shared_until = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
    WHERE agent = old.agent AND shared_until IS NULL;
END;

-- A row an agent was delivered was forgotten or replaced: one notice per agent, no text. Forgotten: written
-- by the forget; superseded: by the trigger below, for the agents delivered the replaced version (whoever
-- updated it). The row's writer, who made the change, gets none. Acknowledged by the agent (acked_at).
CREATE TABLE IF NOT EXISTS memory_notice (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    agent       TEXT NOT NULL,   -- who is told: an agent the row was delivered to
    tier        TEXT NOT NULL,
    row_id      INTEGER NOT NULL,
    writer      TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('forgotten', 'superseded')),
    new_id      INTEGER,         -- superseded: the row now holding the fact (updates are in place: the same id)
    version_id  INTEGER,         -- superseded: the replaced version in memory_version
    at          TEXT NOT NULL,   -- when it was forgotten or replaced
    acked_at    TEXT,
    UNIQUE (agent, tier, row_id, kind, at)
);
CREATE INDEX IF NOT EXISTS memory_notice_open ON memory_notice (agent, acked_at, id);

CREATE TRIGGER IF NOT EXISTS memory_version_notice_ai AFTER INSERT ON memory_version WHEN new.ended_by = 'update'
BEGIN
    INSERT OR IGNORE INTO memory_notice (agent, tier, row_id, writer, kind, new_id, version_id, at)
    SELECT DISTINCT reader, new.tier, new.row_id, new.agent, 'superseded', new.row_id, new.id, new.valid_to
    FROM memory_delivery WHERE tier = new.tier AND row_id = new.row_id AND reader <> new.agent
        AND delivered_at >= new.valid_from AND delivered_at <= new.valid_to;
END;
-- One open notice per (agent, row): a newer one replaces the agent's open ones for the row (without it, 2,000
-- rewrites of a key an agent had read left 2,000). The newest says what the row's state is; its event is new.
CREATE TRIGGER IF NOT EXISTS memory_notice_coalesce_ai AFTER INSERT ON memory_notice WHEN new.acked_at IS NULL
BEGIN
    DELETE FROM memory_notice WHERE agent = new.agent AND tier = new.tier AND row_id = new.row_id
        AND acked_at IS NULL AND id < new.id;
END;
-- Each notice is an event for its agent alone (solos_events shows it whatever the stream's filter).
CREATE TRIGGER IF NOT EXISTS memory_notice_event_ai AFTER INSERT ON memory_notice BEGIN
    INSERT INTO memory_event (kind, tier, row_id, agent) VALUES ('notice', 'notice', new.id, new.agent);
END;
