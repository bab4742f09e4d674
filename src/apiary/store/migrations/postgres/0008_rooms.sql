-- Schema version 8: negotiation rooms (RFC 17.5). Proposals (one row per artifact), the
-- critics' votes, the decisions with the votes they were based on, and every version of the
-- room policy (audit and rollback). JSON fields are JSONB; the artifact is BYTEA.

CREATE TABLE room_policies (
    -- COLLATE "C" on the keys compared in SQL, as elsewhere: byte order is code point order.
    version    TEXT COLLATE "C" PRIMARY KEY,
    settings   JSONB            NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE room_proposals (
    artifact_id           TEXT COLLATE "C" PRIMARY KEY,
    negotiation_room_id   TEXT COLLATE "C" NOT NULL,
    artifact_type         TEXT             NOT NULL,
    producer_id           TEXT             NOT NULL,
    artifact              BYTEA            NOT NULL,
    artifact_content_type TEXT             NOT NULL,
    requested_critics     JSONB            NOT NULL DEFAULT '[]',
    created_at            DOUBLE PRECISION NOT NULL,
    state                 TEXT COLLATE "C" NOT NULL,
    updated_at            DOUBLE PRECISION NOT NULL,
    policy_version        TEXT             NOT NULL,
    vote_deadline         DOUBLE PRECISION NOT NULL,
    invocation_id         TEXT             NOT NULL DEFAULT ''
);

-- Listing is "in these states and/or of this room, created after T, by (created_at,
-- artifact_id)": one range scan per state, one for the room, or one over everything.
CREATE INDEX room_proposals_by_state ON room_proposals (state, created_at, artifact_id);
CREATE INDEX room_proposals_by_room
    ON room_proposals (negotiation_room_id, created_at, artifact_id);
CREATE INDEX room_proposals_by_created ON room_proposals (created_at, artifact_id);

-- One vote per critic and artifact: the primary key refuses a second one.
CREATE TABLE room_votes (
    artifact_id         TEXT COLLATE "C" NOT NULL,
    critic_id           TEXT COLLATE "C" NOT NULL,
    score               DOUBLE PRECISION NOT NULL,
    confidence          DOUBLE PRECISION NOT NULL,
    passed              BOOLEAN          NOT NULL,
    strengths           JSONB            NOT NULL DEFAULT '[]',
    weaknesses          JSONB            NOT NULL DEFAULT '[]',
    recommendations     JSONB            NOT NULL DEFAULT '[]',
    negotiation_room_id TEXT             NOT NULL,
    voted_at            DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (artifact_id, critic_id)
);

CREATE INDEX room_votes_in_order ON room_votes (artifact_id, voted_at, critic_id);

-- At most one decision per (artifact, sequence): the policy's, then the human's.
CREATE TABLE room_decisions (
    artifact_id         TEXT COLLATE "C" NOT NULL,
    sequence            BIGINT           NOT NULL,
    negotiation_room_id TEXT             NOT NULL,
    outcome             TEXT             NOT NULL,
    votes               JSONB            NOT NULL DEFAULT '[]',
    aggregated_score    JSONB            NOT NULL DEFAULT '{}',
    policy_version      TEXT             NOT NULL,
    reason              TEXT             NOT NULL,
    decided_at          DOUBLE PRECISION NOT NULL,
    decided_by          TEXT             NOT NULL,
    via                 TEXT             NOT NULL,
    triggers            JSONB            NOT NULL DEFAULT '[]',
    invocation_id       TEXT             NOT NULL DEFAULT '',
    details             JSONB            NOT NULL DEFAULT '{}',
    PRIMARY KEY (artifact_id, sequence)
);
