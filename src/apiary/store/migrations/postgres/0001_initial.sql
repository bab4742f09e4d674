-- Schema version 1: the event log, the agent registry and the per-recipient message inboxes.
-- Applied by apiary.store.postgres.store inside one transaction, with search_path set to the
-- store's schema, so names here are unqualified.
--
-- Text keys use COLLATE "C": byte order is code point order, the order every backend
-- promises (and what Python's sorted() gives), and it makes the btree comparisons cheaper.

CREATE TABLE events (
    sequence       BIGINT           PRIMARY KEY,
    event_type     TEXT COLLATE "C" NOT NULL,
    actor          TEXT             NOT NULL,
    ts             DOUBLE PRECISION NOT NULL,
    correlation_id TEXT COLLATE "C" NOT NULL DEFAULT '',
    agent_id       TEXT COLLATE "C" NOT NULL DEFAULT '',
    details        JSONB            NOT NULL DEFAULT '{}',
    hlc            TEXT             NOT NULL DEFAULT ''
);

CREATE INDEX events_by_correlation ON events (correlation_id, sequence);
CREATE INDEX events_by_agent ON events (agent_id, sequence);
CREATE INDEX events_by_type ON events (event_type, sequence);

-- One row holding the last sequence handed out. An append increments it with UPDATE ...
-- RETURNING, which row-locks it until the appending transaction ends: concurrent appenders
-- (from any replica) are serialized, so sequences are gap-free (a rollback undoes the
-- increment) and commit in sequence order (a reader that sees N has seen everything
-- before N).
CREATE TABLE event_sequence (
    singleton     BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    last_sequence BIGINT  NOT NULL
);
INSERT INTO event_sequence (singleton, last_sequence) VALUES (TRUE, 0);

CREATE TABLE agents (
    agent_id          TEXT COLLATE "C" PRIMARY KEY,
    name              TEXT             NOT NULL,
    state             TEXT             NOT NULL,
    registered_at     DOUBLE PRECISION NOT NULL,
    last_heartbeat_at DOUBLE PRECISION NOT NULL,
    descriptor        JSONB            NOT NULL DEFAULT '{}'
);

CREATE TABLE messages (
    message_id     TEXT COLLATE "C" PRIMARY KEY,
    recipient      TEXT COLLATE "C" NOT NULL,
    inbox_offset   BIGINT           NOT NULL,
    producer_id    TEXT             NOT NULL,
    correlation_id TEXT             NOT NULL,
    message_type   INTEGER          NOT NULL,
    envelope       BYTEA            NOT NULL,
    state          TEXT COLLATE "C" NOT NULL,
    created_at     DOUBLE PRECISION NOT NULL,
    updated_at     DOUBLE PRECISION NOT NULL,
    error_code     TEXT             NOT NULL DEFAULT '',
    UNIQUE (recipient, inbox_offset)
);

CREATE INDEX messages_by_recipient_state ON messages (recipient, state);

-- The last offset handed out per recipient, locked the same way as event_sequence so that
-- a recipient's offsets are gap-free and commit in order.
CREATE TABLE inbox_offsets (
    recipient   TEXT COLLATE "C" PRIMARY KEY,
    last_offset BIGINT           NOT NULL
);
