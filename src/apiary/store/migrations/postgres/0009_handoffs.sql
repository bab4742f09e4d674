-- Schema version 9: agent handoffs (RFC 17.6), one row per handoff, so that pending offers
-- and their expiry deadlines survive a restart. context_snapshot is the transferred context
-- as requested (BYTEA: any bytes). capabilities_required, tried and context_holders are
-- JSONB arrays of strings.

CREATE TABLE handoffs (
    -- COLLATE "C" on the keys compared in SQL, as elsewhere: byte order is code point order.
    request_id            TEXT COLLATE "C" PRIMARY KEY,
    from_agent            TEXT COLLATE "C" NOT NULL,
    to_agent              TEXT COLLATE "C" NOT NULL,
    state                 TEXT COLLATE "C" NOT NULL,
    created_at            DOUBLE PRECISION NOT NULL,
    updated_at            DOUBLE PRECISION NOT NULL,
    deadline              DOUBLE PRECISION NOT NULL,
    timeout_s             DOUBLE PRECISION NOT NULL,
    requested_to          TEXT             NOT NULL DEFAULT '',
    reason                TEXT             NOT NULL DEFAULT '',
    context_snapshot      BYTEA            NOT NULL DEFAULT '',
    snapshot_content_type TEXT             NOT NULL DEFAULT '',
    capabilities_required JSONB            NOT NULL DEFAULT '[]',
    priority              BIGINT           NOT NULL DEFAULT 0,
    attempt               BIGINT           NOT NULL DEFAULT 1,
    tried                 JSONB            NOT NULL DEFAULT '[]',
    accepting_agent       TEXT             NOT NULL DEFAULT '',
    rejection_reason      TEXT             NOT NULL DEFAULT '',
    context_holders       JSONB            NOT NULL DEFAULT '[]'
);

-- Listing is "in these states, to/from this agent, created after T, by (created_at,
-- request_id)": the pending offers of one agent (GetPendingHandoffs) are one range scan of
-- the second index, the open handoffs at start-up one per state of the first.
CREATE INDEX handoffs_by_state ON handoffs (state, created_at, request_id);
CREATE INDEX handoffs_by_target ON handoffs (to_agent, state, created_at, request_id);
CREATE INDEX handoffs_by_origin ON handoffs (from_agent, created_at, request_id);
