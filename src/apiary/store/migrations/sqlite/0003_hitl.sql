-- Schema version 3: HITL invocations and their decisions (RFC 15), one row per invocation.
-- JSON fields are JSON text: subject, context and decision objects, proposed_actions and
-- approver_roles arrays of strings.
--
-- A rowid table (unlike idempotency): context can hold diffs and other large facts, and
-- WITHOUT ROWID suits small rows only.
CREATE TABLE hitl (
    invocation_id    TEXT    NOT NULL PRIMARY KEY,
    reason_type      TEXT    NOT NULL,
    state            TEXT    NOT NULL,
    created_at       REAL    NOT NULL,
    updated_at       REAL    NOT NULL,
    deadline         REAL    NOT NULL,
    requested_by     TEXT    NOT NULL,
    correlation_id   TEXT    NOT NULL DEFAULT '',
    subject          TEXT    NOT NULL DEFAULT '{}',
    context          TEXT    NOT NULL DEFAULT '{}',
    suggested_action TEXT    NOT NULL DEFAULT '',
    proposed_actions TEXT    NOT NULL DEFAULT '[]',
    approver_roles   TEXT    NOT NULL DEFAULT '[]',
    timeout_action   TEXT    NOT NULL DEFAULT 'DENY',
    priority         INTEGER NOT NULL DEFAULT 0,
    extensions       INTEGER NOT NULL DEFAULT 0,
    decision         TEXT    NOT NULL DEFAULT '{}'
);

-- Listing is "in these states, created after T, by (created_at, invocation_id)": with the
-- states given, one range scan per state; with all states, a range scan of the second.
CREATE INDEX hitl_by_state ON hitl (state, created_at, invocation_id);
CREATE INDEX hitl_by_created ON hitl (created_at, invocation_id);
