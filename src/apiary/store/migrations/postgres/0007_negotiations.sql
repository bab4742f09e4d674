-- Schema version 7: negotiations (RFC 17, 17.2-17.4). One row per negotiation ("room") with
-- its EffectivePolicy, one per admitted draft (round) with its evaluations, the Scheduler's
-- base policy and policy profiles, and the artifacts of ActivityService (contract_vN.json,
-- diff_v{N-1}_to_vN.json, evaluation and decision reports). JSON fields are JSONB;
-- payloads and artifact contents are BYTEA (any bytes).
CREATE TABLE negotiations (
    -- COLLATE "C": listings break created_at ties by code point order, as SQLite does.
    negotiation_id TEXT COLLATE "C" PRIMARY KEY,
    correlation_id TEXT             NOT NULL,
    topic          TEXT             NOT NULL,
    participants   JSONB            NOT NULL DEFAULT '[]',
    intensity      TEXT             NOT NULL,
    state          TEXT COLLATE "C" NOT NULL,
    created_at     DOUBLE PRECISION NOT NULL,
    updated_at     DOUBLE PRECISION NOT NULL,
    deadline       DOUBLE PRECISION NOT NULL,
    opened_by      TEXT             NOT NULL DEFAULT '',
    profile        TEXT             NOT NULL DEFAULT '',
    policy         JSONB            NOT NULL DEFAULT '{}',
    validation     JSONB            NOT NULL DEFAULT '{}',
    round_number   BIGINT           NOT NULL DEFAULT 0,
    round_deadline DOUBLE PRECISION NOT NULL DEFAULT 0,
    tokens_spent   BIGINT           NOT NULL DEFAULT 0,
    oscillations   BIGINT           NOT NULL DEFAULT 0,
    invocation_id  TEXT             NOT NULL DEFAULT '',
    stop_reason    TEXT             NOT NULL DEFAULT '',
    decision       JSONB            NOT NULL DEFAULT '{}'
);

-- Listing is "in these states, created after T, by (created_at, negotiation_id)", as for hitl.
CREATE INDEX negotiations_by_state ON negotiations (state, created_at, negotiation_id);
CREATE INDEX negotiations_by_created ON negotiations (created_at, negotiation_id);

CREATE TABLE negotiation_rounds (
    negotiation_id TEXT COLLATE "C" NOT NULL,
    round_number   BIGINT           NOT NULL,
    kind           TEXT             NOT NULL,
    from_agent     TEXT             NOT NULL,
    content_type   TEXT             NOT NULL DEFAULT '',
    payload        BYTEA            NOT NULL DEFAULT '',
    submitted_at   DOUBLE PRECISION NOT NULL,
    tokens         BIGINT           NOT NULL DEFAULT 0,
    checks         JSONB            NOT NULL DEFAULT '{}',
    delta          JSONB            NOT NULL DEFAULT '{}',
    evaluations    JSONB            NOT NULL DEFAULT '{}',
    llm_confidence DOUBLE PRECISION,
    score          DOUBLE PRECISION,
    PRIMARY KEY (negotiation_id, round_number)
);

-- name '' is the base policy (SetNegotiationPolicy); every other row is a profile.
CREATE TABLE negotiation_policies (
    name       TEXT COLLATE "C" PRIMARY KEY,
    policy     JSONB            NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);

-- seq keeps the append order a listing returns.
CREATE TABLE artifacts (
    seq            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    negotiation_id TEXT COLLATE "C" NOT NULL,
    kind           TEXT COLLATE "C" NOT NULL,
    version        TEXT COLLATE "C" NOT NULL,
    content_type   TEXT             NOT NULL DEFAULT '',
    content        BYTEA            NOT NULL DEFAULT '',
    created_at     DOUBLE PRECISION NOT NULL,
    UNIQUE (negotiation_id, kind, version)
);
CREATE INDEX artifacts_by_negotiation ON artifacts (negotiation_id, seq);
