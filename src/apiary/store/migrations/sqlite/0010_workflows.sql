-- Schema version 10: DAG workflows (RFC 17.7). One row per workflow (its definition as JSON
-- text, which keeps the node order, and its run state) and one row per node (its run state),
-- so that a run survives a restart and resumes where it was.
CREATE TABLE workflows (
    workflow_id  TEXT NOT NULL PRIMARY KEY,
    definition   TEXT NOT NULL,
    created_at   REAL NOT NULL,
    status       TEXT NOT NULL,
    data         TEXT NOT NULL DEFAULT '{}',
    started_at   REAL NOT NULL DEFAULT 0,
    completed_at REAL NOT NULL DEFAULT 0,
    updated_at   REAL NOT NULL DEFAULT 0,
    metadata     TEXT NOT NULL DEFAULT '{}'
);

-- Restart reads the runs still RUNNING.
CREATE INDEX workflows_by_status ON workflows (status, workflow_id);

CREATE TABLE workflow_nodes (
    workflow_id  TEXT    NOT NULL REFERENCES workflows (workflow_id),
    node_id      TEXT    NOT NULL,
    status       TEXT    NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    dispatches   INTEGER NOT NULL DEFAULT 0,
    task_id      TEXT    NOT NULL DEFAULT '',
    started_at   REAL    NOT NULL DEFAULT 0,
    completed_at REAL    NOT NULL DEFAULT 0,
    output       TEXT    NOT NULL DEFAULT '',
    error        TEXT    NOT NULL DEFAULT '',
    triggered    INTEGER NOT NULL DEFAULT 0,
    due_at       REAL    NOT NULL DEFAULT 0,
    event        TEXT    NOT NULL DEFAULT '',
    updated_at   REAL    NOT NULL DEFAULT 0,
    PRIMARY KEY (workflow_id, node_id)
);
