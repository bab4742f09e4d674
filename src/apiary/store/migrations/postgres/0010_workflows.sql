-- Schema version 10: DAG workflows (RFC 17.7). One row per workflow (its definition as JSON
-- text, which keeps the node order where JSONB would not, and its run state) and one row per
-- node (its run state), so that a run survives a restart and resumes where it was.

CREATE TABLE workflows (
    -- COLLATE "C" on the keys compared in SQL, as elsewhere: byte order is code point order.
    workflow_id  TEXT COLLATE "C" PRIMARY KEY,
    definition   TEXT             NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    status       TEXT COLLATE "C" NOT NULL,
    data         TEXT             NOT NULL DEFAULT '{}',
    started_at   DOUBLE PRECISION NOT NULL DEFAULT 0,
    completed_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    updated_at   DOUBLE PRECISION NOT NULL DEFAULT 0,
    metadata     TEXT             NOT NULL DEFAULT '{}'
);

-- Restart reads the runs still RUNNING.
CREATE INDEX workflows_by_status ON workflows (status, workflow_id);

CREATE TABLE workflow_nodes (
    workflow_id  TEXT COLLATE "C" NOT NULL REFERENCES workflows (workflow_id),
    node_id      TEXT COLLATE "C" NOT NULL,
    status       TEXT COLLATE "C" NOT NULL,
    attempts     BIGINT           NOT NULL DEFAULT 0,
    dispatches   BIGINT           NOT NULL DEFAULT 0,
    task_id      TEXT             NOT NULL DEFAULT '',
    started_at   DOUBLE PRECISION NOT NULL DEFAULT 0,
    completed_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    output       TEXT             NOT NULL DEFAULT '',
    error        TEXT             NOT NULL DEFAULT '',
    triggered    BIGINT           NOT NULL DEFAULT 0,
    due_at       DOUBLE PRECISION NOT NULL DEFAULT 0,
    event        TEXT             NOT NULL DEFAULT '',
    updated_at   DOUBLE PRECISION NOT NULL DEFAULT 0,
    PRIMARY KEY (workflow_id, node_id)
);
