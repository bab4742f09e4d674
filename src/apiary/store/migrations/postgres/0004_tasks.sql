-- Schema version 4: Scheduler tasks (RFC 7, 9), one row per task, so that queued, held and
-- dispatched work survives a restart. params is the task's payload as submitted (BYTEA: any
-- bytes, NULs included).

CREATE TABLE tasks (
    -- COLLATE "C" on the keys compared in SQL, as elsewhere: byte order is code point order.
    task_id      TEXT COLLATE "C" PRIMARY KEY,
    agent_id     TEXT COLLATE "C" NOT NULL,
    priority     BIGINT           NOT NULL,
    submitted_at DOUBLE PRECISION NOT NULL,
    seq          BIGINT           NOT NULL,
    state        TEXT COLLATE "C" NOT NULL,
    updated_at   DOUBLE PRECISION NOT NULL,
    scope        TEXT             NOT NULL DEFAULT '',
    job_key      TEXT             NOT NULL DEFAULT '',
    params       BYTEA            NOT NULL DEFAULT '',
    content_type TEXT             NOT NULL DEFAULT '',
    agent_type   TEXT             NOT NULL DEFAULT '',
    message_id   TEXT             NOT NULL DEFAULT '',
    attempts     BIGINT           NOT NULL DEFAULT 0,
    error_code   TEXT             NOT NULL DEFAULT '',
    note         TEXT             NOT NULL DEFAULT '',
    lane         TEXT    NOT NULL DEFAULT 'STANDARD'
);

-- seq is the submission order the Scheduler hands out: no two tasks share one, and a listing
-- with no filter is a range scan of this index.
CREATE UNIQUE INDEX tasks_by_seq ON tasks (seq);
-- Listing is "in these states and/or of this agent, after seq N, by seq": one range scan per
-- state, or one for the agent.
CREATE INDEX tasks_by_state ON tasks (state, seq);
CREATE INDEX tasks_by_agent ON tasks (agent_id, seq);
