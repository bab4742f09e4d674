-- Schema version 13: swarm outbox rows wait for their next delivery attempt (status
-- 'retrying' until next_attempt_at; core/swarm_mail.py). Rows whose delivery has not ended
-- ('sent' or 'retrying') are the courier's work list, soonest first.
--
-- SQLite cannot change a CHECK constraint in place: the table is rebuilt with the new status
-- and column, its rows copied, and its indexes made again.
CREATE TABLE swarm_outbox_v13 (
    message_id      TEXT    NOT NULL,
    swarm_id        TEXT    NOT NULL,
    sender_id       TEXT    NOT NULL,
    recipient_id    TEXT    NOT NULL,
    message_type    TEXT    NOT NULL,
    content         TEXT    NOT NULL,
    sent_at         TEXT    NOT NULL DEFAULT '',
    in_reply_to     TEXT,
    thread_id       TEXT,
    priority        TEXT    NOT NULL DEFAULT 'normal',
    expires_at      TEXT,
    refs            TEXT    NOT NULL DEFAULT '[]',
    attachments     TEXT    NOT NULL DEFAULT '[]',
    metadata        TEXT    NOT NULL DEFAULT '{}',
    wire            TEXT    NOT NULL DEFAULT '{}',
    destination     TEXT    NOT NULL,
    created_at      REAL    NOT NULL,
    status          TEXT    NOT NULL DEFAULT 'sent'
                    CHECK (status IN ('sent', 'retrying', 'delivered', 'failed')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    updated_at      REAL    NOT NULL DEFAULT 0,
    error           TEXT    NOT NULL DEFAULT '',
    next_attempt_at REAL    NOT NULL DEFAULT 0,
    PRIMARY KEY (message_id, destination)
);

INSERT INTO swarm_outbox_v13 (
    message_id, swarm_id, sender_id, recipient_id, message_type, content, sent_at,
    in_reply_to, thread_id, priority, expires_at, refs, attachments, metadata, wire,
    destination, created_at, status, attempts, updated_at, error
)
SELECT
    message_id, swarm_id, sender_id, recipient_id, message_type, content, sent_at,
    in_reply_to, thread_id, priority, expires_at, refs, attachments, metadata, wire,
    destination, created_at, status, attempts, updated_at, error
FROM swarm_outbox;

DROP TABLE swarm_outbox;
ALTER TABLE swarm_outbox_v13 RENAME TO swarm_outbox;

CREATE INDEX swarm_outbox_by_time ON swarm_outbox (created_at, message_id, destination);
CREATE INDEX swarm_outbox_by_swarm ON swarm_outbox (swarm_id, created_at);
CREATE INDEX swarm_outbox_pending ON swarm_outbox (next_attempt_at, created_at)
    WHERE status IN ('sent', 'retrying');
