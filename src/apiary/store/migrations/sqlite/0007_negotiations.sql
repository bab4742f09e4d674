-- Schema version 7: negotiations (RFC 17, 17.2-17.4). One row per negotiation ("room") with
-- its EffectivePolicy, one per admitted draft (round) with its evaluations, the Scheduler's
-- base policy and policy profiles, and the artifacts of ActivityService (contract_vN.json,
-- diff_v{N-1}_to_vN.json, evaluation and decision reports). JSON fields are JSON text;
-- payloads and artifact contents are BLOBs (any bytes).
CREATE TABLE negotiations (
    negotiation_id TEXT    NOT NULL PRIMARY KEY,
    correlation_id TEXT    NOT NULL,
    topic          TEXT    NOT NULL,
    participants   TEXT    NOT NULL DEFAULT '[]',
    intensity      TEXT    NOT NULL,
    state          TEXT    NOT NULL,
    created_at     REAL    NOT NULL,
    updated_at     REAL    NOT NULL,
    deadline       REAL    NOT NULL,
    opened_by      TEXT    NOT NULL DEFAULT '',
    profile        TEXT    NOT NULL DEFAULT '',
    policy         TEXT    NOT NULL DEFAULT '{}',
    validation     TEXT    NOT NULL DEFAULT '{}',
    round_number   INTEGER NOT NULL DEFAULT 0,
    round_deadline REAL    NOT NULL DEFAULT 0,
    tokens_spent   INTEGER NOT NULL DEFAULT 0,
    oscillations   INTEGER NOT NULL DEFAULT 0,
    invocation_id  TEXT    NOT NULL DEFAULT '',
    stop_reason    TEXT    NOT NULL DEFAULT '',
    decision       TEXT    NOT NULL DEFAULT '{}'
);

-- Listing is "in these states, created after T, by (created_at, negotiation_id)", as for hitl.
CREATE INDEX negotiations_by_state ON negotiations (state, created_at, negotiation_id);
CREATE INDEX negotiations_by_created ON negotiations (created_at, negotiation_id);

CREATE TABLE negotiation_rounds (
    negotiation_id TEXT    NOT NULL,
    round_number   INTEGER NOT NULL,
    kind           TEXT    NOT NULL,
    from_agent     TEXT    NOT NULL,
    content_type   TEXT    NOT NULL DEFAULT '',
    payload        BLOB    NOT NULL DEFAULT X'',
    submitted_at   REAL    NOT NULL,
    tokens         INTEGER NOT NULL DEFAULT 0,
    checks         TEXT    NOT NULL DEFAULT '{}',
    delta          TEXT    NOT NULL DEFAULT '{}',
    evaluations    TEXT    NOT NULL DEFAULT '{}',
    llm_confidence REAL,
    score          REAL,
    PRIMARY KEY (negotiation_id, round_number)
);

-- name '' is the base policy (SetNegotiationPolicy); every other row is a profile.
CREATE TABLE negotiation_policies (
    name       TEXT NOT NULL PRIMARY KEY,
    policy     TEXT NOT NULL,
    updated_at REAL NOT NULL
);

-- seq keeps the append order a listing returns.
CREATE TABLE artifacts (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    negotiation_id TEXT NOT NULL,
    kind           TEXT NOT NULL,
    version        TEXT NOT NULL,
    content_type   TEXT NOT NULL DEFAULT '',
    content        BLOB NOT NULL DEFAULT X'',
    created_at     REAL NOT NULL,
    UNIQUE (negotiation_id, kind, version)
);
CREATE INDEX artifacts_by_negotiation ON artifacts (negotiation_id, seq);
