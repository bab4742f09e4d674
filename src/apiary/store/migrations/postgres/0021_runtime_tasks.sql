-- Schema version 21: the runtime control plane's agent tasks (the contract's task commands,
-- docs/control-plane.md): each task with its metadata, its runs (one Scheduler task each,
-- kept after they end: a retry adds a run), the edges between tasks (and to artifacts,
-- evidence, sources, subagents; an unlinked edge is kept as removed), and the idempotency
-- keys of the commands that changed them; and the actions (HITL invocations opened for a
-- turn or a task's run) the runtime reported. *_json columns are JSON as text (kept as written).

CREATE TABLE runtime_tasks (
    task_id        TEXT COLLATE "C" PRIMARY KEY,
    session_id     TEXT COLLATE "C" NOT NULL,
    owner          TEXT COLLATE "C" NOT NULL,
    state          TEXT COLLATE "C" NOT NULL,
    created_at     DOUBLE PRECISION NOT NULL,
    updated_at     DOUBLE PRECISION NOT NULL,
    thread_id      TEXT COLLATE "C" NOT NULL DEFAULT '',
    agent_id       TEXT COLLATE "C" NOT NULL DEFAULT '',
    capability     TEXT COLLATE "C" NOT NULL DEFAULT '',
    scope          TEXT             NOT NULL DEFAULT '',
    priority       BIGINT           NOT NULL DEFAULT 0,
    input_json     TEXT             NOT NULL DEFAULT 'null',
    meta_json      TEXT             NOT NULL DEFAULT '{}',
    result_json    TEXT             NOT NULL DEFAULT '',
    error_code     TEXT             NOT NULL DEFAULT '',
    message        TEXT             NOT NULL DEFAULT '',
    status_reason  TEXT             NOT NULL DEFAULT '',
    intent         TEXT             NOT NULL DEFAULT '',
    intent_reason  TEXT             NOT NULL DEFAULT '',
    run_count      BIGINT           NOT NULL DEFAULT 0,
    current_run_id TEXT COLLATE "C" NOT NULL DEFAULT '',
    started_at     DOUBLE PRECISION NOT NULL DEFAULT 0,
    ended_at       DOUBLE PRECISION NOT NULL DEFAULT 0
);

-- A session's tasks, newest first.
CREATE INDEX runtime_tasks_by_session ON runtime_tasks (session_id, created_at);
-- The tasks with a run in hand, at start-up.
CREATE INDEX runtime_tasks_open ON runtime_tasks (state, task_id);

CREATE TABLE runtime_task_runs (
    run_id       TEXT COLLATE "C" PRIMARY KEY,
    task_id      TEXT COLLATE "C" NOT NULL,
    attempt      BIGINT           NOT NULL,
    state        TEXT             NOT NULL,
    reason       TEXT             NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    updated_at   DOUBLE PRECISION NOT NULL,
    agent_id     TEXT COLLATE "C" NOT NULL DEFAULT '',
    started_at   DOUBLE PRECISION NOT NULL DEFAULT 0,
    ended_at     DOUBLE PRECISION NOT NULL DEFAULT 0,
    error_code   TEXT             NOT NULL DEFAULT '',
    message      TEXT             NOT NULL DEFAULT '',
    outputs_json TEXT             NOT NULL DEFAULT '[]'
);

-- A task's runs in order; no two share an attempt number.
CREATE UNIQUE INDEX runtime_task_runs_by_task ON runtime_task_runs (task_id, attempt);

CREATE TABLE runtime_task_links (
    task_id    TEXT COLLATE "C" NOT NULL,
    kind       TEXT COLLATE "C" NOT NULL,
    target_id  TEXT COLLATE "C" NOT NULL,
    status     TEXT             NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    reason     TEXT             NOT NULL DEFAULT '',
    PRIMARY KEY (task_id, kind, target_id)
);

-- The edges to a task (its children, its dependents).
CREATE INDEX runtime_task_links_by_target ON runtime_task_links (target_id, kind);

CREATE TABLE runtime_command_keys (
    owner       TEXT COLLATE "C" NOT NULL,
    key         TEXT COLLATE "C" NOT NULL,
    command     TEXT             NOT NULL,
    digest      TEXT             NOT NULL,
    answer_json TEXT             NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (owner, key)
);

CREATE TABLE runtime_actions (
    action_id  TEXT COLLATE "C" PRIMARY KEY,
    session_id TEXT COLLATE "C" NOT NULL,
    state      TEXT COLLATE "C" NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    thread_id  TEXT COLLATE "C" NOT NULL DEFAULT '',
    turn_id    TEXT COLLATE "C" NOT NULL DEFAULT '',
    task_id    TEXT COLLATE "C" NOT NULL DEFAULT '',
    run_id     TEXT COLLATE "C" NOT NULL DEFAULT '',
    decision   TEXT             NOT NULL DEFAULT '',
    via        TEXT             NOT NULL DEFAULT ''
);

-- The actions still waiting for a decision.
CREATE INDEX runtime_actions_open ON runtime_actions (state, thread_id);
