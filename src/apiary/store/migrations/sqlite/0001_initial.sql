-- Schema version 1: the event log, the agent registry and the per-recipient message inboxes.
-- Applied by apiary.store.sqlite.database inside one transaction with its schema_migrations row.

-- AUTOINCREMENT (not a bare rowid) so that a sequence is never handed out twice, even if a
-- future retention job deletes the newest events.
CREATE TABLE events (
    sequence       INTEGER PRIMARY KEY AUTOINCREMENT,
    event_type     TEXT    NOT NULL,
    actor          TEXT    NOT NULL,
    ts             REAL    NOT NULL,
    correlation_id TEXT    NOT NULL DEFAULT '',
    agent_id       TEXT    NOT NULL DEFAULT '',
    details        TEXT    NOT NULL DEFAULT '{}',
    hlc            TEXT    NOT NULL DEFAULT ''
);

-- Each filter index ends with sequence so that "after N, in order" is a range scan.
CREATE INDEX events_by_correlation ON events (correlation_id, sequence);
CREATE INDEX events_by_agent ON events (agent_id, sequence);
CREATE INDEX events_by_type ON events (event_type, sequence);

CREATE TABLE agents (
    agent_id          TEXT PRIMARY KEY,
    name              TEXT NOT NULL,
    state             TEXT NOT NULL,
    registered_at     REAL NOT NULL,
    last_heartbeat_at REAL NOT NULL,
    descriptor        TEXT NOT NULL DEFAULT '{}'
) WITHOUT ROWID;

CREATE TABLE messages (
    message_id     TEXT    PRIMARY KEY,
    recipient      TEXT    NOT NULL,
    inbox_offset   INTEGER NOT NULL,
    producer_id    TEXT    NOT NULL,
    correlation_id TEXT    NOT NULL,
    message_type   INTEGER NOT NULL,
    envelope       BLOB    NOT NULL,
    state          TEXT    NOT NULL,
    created_at     REAL    NOT NULL,
    updated_at     REAL    NOT NULL,
    error_code     TEXT    NOT NULL DEFAULT '',
    UNIQUE (recipient, inbox_offset)
);

CREATE INDEX messages_by_recipient_state ON messages (recipient, state);

-- The last offset handed out per recipient. Kept apart from MAX(inbox_offset) so that
-- pruning finished messages can never make an offset be reused (stream resumption relies
-- on offsets only growing).
CREATE TABLE inbox_offsets (
    recipient   TEXT    PRIMARY KEY,
    last_offset INTEGER NOT NULL
) WITHOUT ROWID;
