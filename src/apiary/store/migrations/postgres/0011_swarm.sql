-- Schema version 11: the Agent Swarm Protocol's inbox and outbox (core/swarm_mail.py).
-- Versions 5-10 belong to other aggregates; the runner applies whatever is missing, in order.
--
-- Each row keeps the message's indexed parts and, in `wire`, the whole message as it
-- travelled (signature included). JSON columns are JSONB. `references` is an SQL keyword:
-- the column is `refs`.

CREATE TABLE swarm_inbox (
    -- COLLATE "C" on the keys compared in SQL, as elsewhere: byte order is code point order.
    message_id   TEXT COLLATE "C" PRIMARY KEY,
    swarm_id     TEXT COLLATE "C" NOT NULL,
    sender_id    TEXT             NOT NULL,
    recipient_id TEXT             NOT NULL,
    message_type TEXT             NOT NULL,
    content      TEXT             NOT NULL,
    sent_at      TEXT             NOT NULL DEFAULT '',
    in_reply_to  TEXT,
    thread_id    TEXT COLLATE "C",
    priority     TEXT             NOT NULL DEFAULT 'normal',
    expires_at   TEXT,
    refs         JSONB            NOT NULL DEFAULT '[]',
    attachments  JSONB            NOT NULL DEFAULT '[]',
    metadata     JSONB            NOT NULL DEFAULT '{}',
    wire         JSONB            NOT NULL DEFAULT '{}',
    received_at  DOUBLE PRECISION NOT NULL,
    status       TEXT             NOT NULL DEFAULT 'unread'
                 CHECK (status IN ('unread', 'read', 'archived', 'deleted')),
    read_at      DOUBLE PRECISION,
    deleted_at   DOUBLE PRECISION
);

-- list_recent: newest first, per swarm or across swarms.
CREATE INDEX swarm_inbox_by_swarm ON swarm_inbox (swarm_id, received_at, message_id);
CREATE INDEX swarm_inbox_by_time ON swarm_inbox (received_at, message_id);
-- The bridge finds the conversation a local agent's reply belongs to by thread.
CREATE INDEX swarm_inbox_by_thread ON swarm_inbox (thread_id, received_at);

-- One row per (message, destination): a broadcast is delivered, or not, member by member.
CREATE TABLE swarm_outbox (
    message_id   TEXT COLLATE "C" NOT NULL,
    swarm_id     TEXT COLLATE "C" NOT NULL,
    sender_id    TEXT             NOT NULL,
    recipient_id TEXT             NOT NULL,
    message_type TEXT             NOT NULL,
    content      TEXT             NOT NULL,
    sent_at      TEXT             NOT NULL DEFAULT '',
    in_reply_to  TEXT,
    thread_id    TEXT,
    priority     TEXT             NOT NULL DEFAULT 'normal',
    expires_at   TEXT,
    refs         JSONB            NOT NULL DEFAULT '[]',
    attachments  JSONB            NOT NULL DEFAULT '[]',
    metadata     JSONB            NOT NULL DEFAULT '{}',
    wire         JSONB            NOT NULL DEFAULT '{}',
    destination  TEXT COLLATE "C" NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    status       TEXT             NOT NULL DEFAULT 'sent'
                 CHECK (status IN ('sent', 'delivered', 'failed')),
    attempts     BIGINT           NOT NULL DEFAULT 0,
    updated_at   DOUBLE PRECISION NOT NULL DEFAULT 0,
    error        TEXT             NOT NULL DEFAULT '',
    PRIMARY KEY (message_id, destination)
);

CREATE INDEX swarm_outbox_by_time ON swarm_outbox (created_at, message_id, destination);
CREATE INDEX swarm_outbox_by_swarm ON swarm_outbox (swarm_id, created_at);
