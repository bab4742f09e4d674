-- Schema version 25: the runtime control plane's jobs (create_job, get_job, cancel_job,
-- docs/control-plane.md): a job is a batch of agent tasks (runtime_tasks) of one session, its
-- items. A job keeps its own status and how many of its items stand in each task status
-- (counts_json, moved in the same transaction as the item's task); its items in order.

CREATE TABLE runtime_jobs (
    job_id         TEXT COLLATE "C" PRIMARY KEY,
    session_id     TEXT COLLATE "C" NOT NULL,
    owner          TEXT COLLATE "C" NOT NULL,
    state          TEXT COLLATE "C" NOT NULL,
    created_at     DOUBLE PRECISION NOT NULL,
    updated_at     DOUBLE PRECISION NOT NULL,
    item_count     BIGINT           NOT NULL,
    counts_json    TEXT             NOT NULL,
    meta_json      TEXT             NOT NULL DEFAULT '{}',
    intent         TEXT             NOT NULL DEFAULT '',
    intent_reason  TEXT             NOT NULL DEFAULT '',
    parent_task_id TEXT COLLATE "C" NOT NULL DEFAULT '',
    started_at     DOUBLE PRECISION NOT NULL DEFAULT 0,
    ended_at       DOUBLE PRECISION NOT NULL DEFAULT 0
);

-- A session's jobs, newest first.
CREATE INDEX runtime_jobs_by_session ON runtime_jobs (session_id, created_at);
-- The jobs a task's cancellation cancels.
CREATE INDEX runtime_jobs_by_parent ON runtime_jobs (parent_task_id);

CREATE TABLE runtime_job_items (
    job_id     TEXT COLLATE "C" NOT NULL,
    ordinal    BIGINT           NOT NULL,
    task_id    TEXT COLLATE "C" NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (job_id, ordinal)
);

-- A task is the item of one job at most.
CREATE UNIQUE INDEX runtime_job_items_by_task ON runtime_job_items (task_id);
