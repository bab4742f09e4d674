-- Schema version 9: agent handoffs (RFC 17.6), one row per handoff, so that pending offers
-- and their expiry deadlines survive a restart. context_snapshot is the transferred context
-- as requested (BLOB: any bytes). capabilities_required, tried and context_holders are JSON
-- arrays of strings.
--
-- A rowid table (like tasks): snapshots can be large, and WITHOUT ROWID suits small rows only.
CREATE TABLE handoffs (
    request_id            TEXT    NOT NULL PRIMARY KEY,
    from_agent            TEXT    NOT NULL,
    to_agent              TEXT    NOT NULL,
    state                 TEXT    NOT NULL,
    created_at            REAL    NOT NULL,
    updated_at            REAL    NOT NULL,
    deadline              REAL    NOT NULL,
    timeout_s             REAL    NOT NULL,
    requested_to          TEXT    NOT NULL DEFAULT '',
    reason                TEXT    NOT NULL DEFAULT '',
    context_snapshot      BLOB    NOT NULL DEFAULT X'',
    snapshot_content_type TEXT    NOT NULL DEFAULT '',
    capabilities_required TEXT    NOT NULL DEFAULT '[]',
    priority              INTEGER NOT NULL DEFAULT 0,
    attempt               INTEGER NOT NULL DEFAULT 1,
    tried                 TEXT    NOT NULL DEFAULT '[]',
    accepting_agent       TEXT    NOT NULL DEFAULT '',
    rejection_reason      TEXT    NOT NULL DEFAULT '',
    context_holders       TEXT    NOT NULL DEFAULT '[]'
);

-- Listing is "in these states, to/from this agent, created after T, by (created_at,
-- request_id)": the pending offers of one agent (GetPendingHandoffs) are one range scan of
-- the second index, the open handoffs at start-up one per state of the first.
CREATE INDEX handoffs_by_state ON handoffs (state, created_at, request_id);
CREATE INDEX handoffs_by_target ON handoffs (to_agent, state, created_at, request_id);
CREATE INDEX handoffs_by_origin ON handoffs (from_agent, created_at, request_id);
