-- Schema version 8: negotiation rooms (RFC 17.5). Proposals (one row per artifact), the
-- critics' votes, the decisions with the votes they were based on, and every version of the
-- room policy (audit and rollback). JSON fields are JSON text; the artifact is a BLOB.
--
-- Rowid tables, as hitl and tasks: artifacts and decisions can be large.
CREATE TABLE room_policies (
    version    TEXT NOT NULL PRIMARY KEY,
    settings   TEXT NOT NULL,
    created_at REAL NOT NULL
);

CREATE TABLE room_proposals (
    artifact_id           TEXT NOT NULL PRIMARY KEY,
    negotiation_room_id   TEXT NOT NULL,
    artifact_type         TEXT NOT NULL,
    producer_id           TEXT NOT NULL,
    artifact              BLOB NOT NULL,
    artifact_content_type TEXT NOT NULL,
    requested_critics     TEXT NOT NULL DEFAULT '[]',
    created_at            REAL NOT NULL,
    state                 TEXT NOT NULL,
    updated_at            REAL NOT NULL,
    policy_version        TEXT NOT NULL,
    vote_deadline         REAL NOT NULL,
    invocation_id         TEXT NOT NULL DEFAULT ''
);

-- Listing is "in these states and/or of this room, created after T, by (created_at,
-- artifact_id)": one range scan per state, one for the room, or one over everything.
CREATE INDEX room_proposals_by_state ON room_proposals (state, created_at, artifact_id);
CREATE INDEX room_proposals_by_room
    ON room_proposals (negotiation_room_id, created_at, artifact_id);
CREATE INDEX room_proposals_by_created ON room_proposals (created_at, artifact_id);

-- One vote per critic and artifact: the primary key refuses a second one.
CREATE TABLE room_votes (
    artifact_id         TEXT    NOT NULL,
    critic_id           TEXT    NOT NULL,
    score               REAL    NOT NULL,
    confidence          REAL    NOT NULL,
    passed              INTEGER NOT NULL,
    strengths           TEXT    NOT NULL DEFAULT '[]',
    weaknesses          TEXT    NOT NULL DEFAULT '[]',
    recommendations     TEXT    NOT NULL DEFAULT '[]',
    negotiation_room_id TEXT    NOT NULL,
    voted_at            REAL    NOT NULL,
    PRIMARY KEY (artifact_id, critic_id)
);

CREATE INDEX room_votes_in_order ON room_votes (artifact_id, voted_at, critic_id);

-- At most one decision per (artifact, sequence): the policy's, then the human's.
CREATE TABLE room_decisions (
    artifact_id         TEXT    NOT NULL,
    sequence            INTEGER NOT NULL,
    negotiation_room_id TEXT    NOT NULL,
    outcome             TEXT    NOT NULL,
    votes               TEXT    NOT NULL DEFAULT '[]',
    aggregated_score    TEXT    NOT NULL DEFAULT '{}',
    policy_version      TEXT    NOT NULL,
    reason              TEXT    NOT NULL,
    decided_at          REAL    NOT NULL,
    decided_by          TEXT    NOT NULL,
    via                 TEXT    NOT NULL,
    triggers            TEXT    NOT NULL DEFAULT '[]',
    invocation_id       TEXT    NOT NULL DEFAULT '',
    details             TEXT    NOT NULL DEFAULT '{}',
    PRIMARY KEY (artifact_id, sequence)
);
