-- Schema version 2: delivery bookkeeping on messages, the idempotency cache (RFC 11.2) and
-- the dead letter queue (RFC 21.1). Existing rows get the defaults of StoredMessage.
--
-- The generated columns are STORED (PostgreSQL 15 has no virtual ones), so adding them
-- rewrites the messages table once, inside the migration's transaction.

ALTER TABLE messages
    ADD COLUMN idempotency_token TEXT             NOT NULL DEFAULT '',
    -- The envelope's uint64 as a signed BIGINT (values >= 2^63 wrap around to negative
    -- numbers, see apiary.store.sql_rows): only ever compared for equality.
    ADD COLUMN sequence_number   BIGINT           NOT NULL DEFAULT 0,
    ADD COLUMN lane              TEXT             NOT NULL DEFAULT 'STANDARD',
    ADD COLUMN ack_deadline      DOUBLE PRECISION NOT NULL DEFAULT 0,
    ADD COLUMN expires_at        DOUBLE PRECISION NOT NULL DEFAULT 0,
    ADD COLUMN deliveries        BIGINT           NOT NULL DEFAULT 0,
    ADD COLUMN last_delivered_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    ADD COLUMN acked_stage       TEXT             NOT NULL DEFAULT '',
    -- When the timer loop has to look at a message: the earlier of its set deadlines while
    -- it is unfinished, NULL otherwise. Generated so that no write path can forget to
    -- maintain it. The terminal states are those of MessageState.terminal (tests/store
    -- checks they agree).
    ADD COLUMN due_at DOUBLE PRECISION GENERATED ALWAYS AS (
        CASE
            WHEN state IN ('FULFILLED', 'REJECTED', 'FAILED', 'TIMED_OUT') THEN NULL
            WHEN ack_deadline > 0 AND expires_at > 0 THEN LEAST(ack_deadline, expires_at)
            WHEN ack_deadline > 0 THEN ack_deadline
            WHEN expires_at > 0 THEN expires_at
        END
    ) STORED,
    -- When a finished message finished (NULL while it is not): what retention purges by.
    ADD COLUMN finished_at DOUBLE PRECISION GENERATED ALWAYS AS (
        CASE WHEN state IN ('FULFILLED', 'REJECTED', 'FAILED', 'TIMED_OUT') THEN updated_at END
    ) STORED;

-- Partial: only messages with a pending deadline (or a finished state) are indexed, which
-- keeps both indexes small however many messages are retained.
CREATE INDEX messages_due ON messages (due_at, message_id) WHERE due_at IS NOT NULL;
CREATE INDEX messages_finished ON messages (finished_at) WHERE finished_at IS NOT NULL;

-- Deduplication by (producer_id, sequence_number) asks for the newest match.
CREATE INDEX messages_by_producer_sequence
    ON messages (producer_id, sequence_number, created_at, inbox_offset, message_id);

CREATE TABLE idempotency (
    token               TEXT COLLATE "C" PRIMARY KEY,
    producer_id         TEXT             NOT NULL,
    original_message_id TEXT             NOT NULL,
    current_message_id  TEXT             NOT NULL,
    status              TEXT             NOT NULL,
    created_at          DOUBLE PRECISION NOT NULL,
    updated_at          DOUBLE PRECISION NOT NULL,
    outcome_at          DOUBLE PRECISION NOT NULL DEFAULT 0,
    error_code          TEXT             NOT NULL DEFAULT '',
    result              TEXT             NOT NULL DEFAULT '',
    attempts            JSONB            NOT NULL DEFAULT '[]'
);

CREATE INDEX idempotency_by_updated ON idempotency (updated_at);

-- An identity column: ids only grow (a rolled-back add leaves a gap, which the DLQ allows)
-- and are never handed out twice, even after the newest entries were purged.
CREATE TABLE dlq (
    entry_id       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id     TEXT             NOT NULL,
    producer_id    TEXT COLLATE "C" NOT NULL,
    recipient      TEXT COLLATE "C" NOT NULL,
    correlation_id TEXT             NOT NULL,
    message_type   INTEGER          NOT NULL,
    error_code     TEXT COLLATE "C" NOT NULL,
    reason         TEXT             NOT NULL,
    created_at     DOUBLE PRECISION NOT NULL,
    failed_at      DOUBLE PRECISION NOT NULL,
    content_type   TEXT             NOT NULL,
    payload_size   BIGINT           NOT NULL,
    envelope       BYTEA            NOT NULL,
    attempts       JSONB            NOT NULL DEFAULT '[]',
    route          TEXT             NOT NULL DEFAULT '',
    requeued_at    DOUBLE PRECISION NOT NULL DEFAULT 0,
    requeued_as    TEXT             NOT NULL DEFAULT ''
);

-- Each filter index ends with entry_id so that "after N, in order" is a range scan.
CREATE INDEX dlq_by_failed ON dlq (failed_at);
CREATE INDEX dlq_by_error_code ON dlq (error_code, entry_id);
CREATE INDEX dlq_by_recipient ON dlq (recipient, entry_id);
CREATE INDEX dlq_by_producer ON dlq (producer_id, entry_id);
