-- Schema version 2: delivery bookkeeping on messages, the idempotency cache (RFC 11.2) and
-- the dead letter queue (RFC 21.1). Existing rows get the defaults of StoredMessage.

ALTER TABLE messages ADD COLUMN idempotency_token TEXT    NOT NULL DEFAULT '';
-- The envelope's uint64 stored as a signed 64-bit integer (values >= 2^63 wrap around to
-- negative numbers, see apiary.store.sql_rows): only ever compared for equality.
ALTER TABLE messages ADD COLUMN sequence_number   INTEGER NOT NULL DEFAULT 0;
ALTER TABLE messages ADD COLUMN lane              TEXT    NOT NULL DEFAULT 'STANDARD';
ALTER TABLE messages ADD COLUMN ack_deadline      REAL    NOT NULL DEFAULT 0;
ALTER TABLE messages ADD COLUMN expires_at        REAL    NOT NULL DEFAULT 0;
ALTER TABLE messages ADD COLUMN deliveries        INTEGER NOT NULL DEFAULT 0;
ALTER TABLE messages ADD COLUMN last_delivered_at REAL    NOT NULL DEFAULT 0;
ALTER TABLE messages ADD COLUMN acked_stage       TEXT    NOT NULL DEFAULT '';

-- When the timer loop has to look at a message: the earlier of its set deadlines while it is
-- unfinished, NULL otherwise. Computed (VIRTUAL costs no space in the row) so that no write
-- path can forget to maintain it; the partial index holds only the messages that have one,
-- which keeps it small however many finished messages are retained. The terminal states are
-- those of apiary.core.records.MessageState.terminal (tests/store checks they agree).
ALTER TABLE messages ADD COLUMN due_at REAL GENERATED ALWAYS AS (
    CASE
        WHEN state IN ('FULFILLED', 'REJECTED', 'FAILED', 'TIMED_OUT') THEN NULL
        WHEN ack_deadline > 0 AND expires_at > 0 THEN min(ack_deadline, expires_at)
        WHEN ack_deadline > 0 THEN ack_deadline
        WHEN expires_at > 0 THEN expires_at
    END
) VIRTUAL;
CREATE INDEX messages_due ON messages (due_at, message_id) WHERE due_at IS NOT NULL;

-- When a finished message finished (NULL while it is not): what retention purges by.
ALTER TABLE messages ADD COLUMN finished_at REAL GENERATED ALWAYS AS (
    CASE WHEN state IN ('FULFILLED', 'REJECTED', 'FAILED', 'TIMED_OUT') THEN updated_at END
) VIRTUAL;
CREATE INDEX messages_finished ON messages (finished_at) WHERE finished_at IS NOT NULL;

-- Deduplication by (producer_id, sequence_number) asks for the newest match.
CREATE INDEX messages_by_producer_sequence
    ON messages (producer_id, sequence_number, created_at, inbox_offset, message_id);

CREATE TABLE idempotency (
    token               TEXT PRIMARY KEY,
    producer_id         TEXT NOT NULL,
    original_message_id TEXT NOT NULL,
    current_message_id  TEXT NOT NULL,
    status              TEXT NOT NULL,
    created_at          REAL NOT NULL,
    updated_at          REAL NOT NULL,
    outcome_at          REAL NOT NULL DEFAULT 0,
    error_code          TEXT NOT NULL DEFAULT '',
    result              TEXT NOT NULL DEFAULT '',
    attempts            TEXT NOT NULL DEFAULT '[]'
) WITHOUT ROWID;

CREATE INDEX idempotency_by_updated ON idempotency (updated_at);

-- AUTOINCREMENT: an entry_id is never handed out twice, even after the newest entries were
-- purged (operators refer to entries by id).
CREATE TABLE dlq (
    entry_id       INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id     TEXT    NOT NULL,
    producer_id    TEXT    NOT NULL,
    recipient      TEXT    NOT NULL,
    correlation_id TEXT    NOT NULL,
    message_type   INTEGER NOT NULL,
    error_code     TEXT    NOT NULL,
    reason         TEXT    NOT NULL,
    created_at     REAL    NOT NULL,
    failed_at      REAL    NOT NULL,
    content_type   TEXT    NOT NULL,
    payload_size   INTEGER NOT NULL,
    envelope       BLOB    NOT NULL,
    attempts       TEXT    NOT NULL DEFAULT '[]',
    route          TEXT    NOT NULL DEFAULT '',
    requeued_at    REAL    NOT NULL DEFAULT 0,
    requeued_as    TEXT    NOT NULL DEFAULT ''
);

-- Each filter index ends with entry_id so that "after N, in order" is a range scan.
CREATE INDEX dlq_by_failed ON dlq (failed_at);
CREATE INDEX dlq_by_error_code ON dlq (error_code, entry_id);
CREATE INDEX dlq_by_recipient ON dlq (recipient, entry_id);
CREATE INDEX dlq_by_producer ON dlq (producer_id, entry_id);
