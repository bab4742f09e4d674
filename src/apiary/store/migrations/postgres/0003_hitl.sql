-- Schema version 3: HITL invocations and their decisions (RFC 15), one row per invocation.
-- JSON fields are JSONB: subject, context and decision objects, proposed_actions and
-- approver_roles arrays of strings.

CREATE TABLE hitl (
    -- COLLATE "C": listings break created_at ties by code point order, as SQLite does.
    invocation_id    TEXT COLLATE "C" PRIMARY KEY,
    reason_type      TEXT             NOT NULL,
    state            TEXT COLLATE "C" NOT NULL,
    created_at       DOUBLE PRECISION NOT NULL,
    updated_at       DOUBLE PRECISION NOT NULL,
    deadline         DOUBLE PRECISION NOT NULL,
    requested_by     TEXT             NOT NULL,
    correlation_id   TEXT             NOT NULL DEFAULT '',
    subject          JSONB            NOT NULL DEFAULT '{}',
    context          JSONB            NOT NULL DEFAULT '{}',
    suggested_action TEXT             NOT NULL DEFAULT '',
    proposed_actions JSONB            NOT NULL DEFAULT '[]',
    approver_roles   JSONB            NOT NULL DEFAULT '[]',
    timeout_action   TEXT             NOT NULL DEFAULT 'DENY',
    priority         BIGINT           NOT NULL DEFAULT 0,
    extensions       BIGINT           NOT NULL DEFAULT 0,
    decision         JSONB            NOT NULL DEFAULT '{}'
);

-- Listing is "in these states, created after T, by (created_at, invocation_id)": with the
-- states given, one range scan per state; with all states, a range scan of the second.
CREATE INDEX hitl_by_state ON hitl (state, created_at, invocation_id);
CREATE INDEX hitl_by_created ON hitl (created_at, invocation_id);
