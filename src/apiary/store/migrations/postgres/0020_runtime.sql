-- Schema version 20: the runtime control plane (spec/runtime-control-plane.txt): sessions,
-- their threads, the turns queued and run on them, and the event channels applications
-- follow, so that a thread's queue and its turns survive a restart. input_json and
-- result_json are JSON values as text (any JSON value, kept as the caller and the agent
-- wrote it); a channel keeps the digest of its resume token only.

CREATE TABLE runtime_sessions (
    -- COLLATE "C" on the keys compared in SQL, as elsewhere: byte order is code point order.
    session_id   TEXT COLLATE "C" PRIMARY KEY,
    owner        TEXT COLLATE "C" NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    updated_at   DOUBLE PRECISION NOT NULL,
    workspace_id TEXT             NOT NULL DEFAULT '',
    title        TEXT             NOT NULL DEFAULT ''
);

CREATE TABLE runtime_threads (
    thread_id      TEXT COLLATE "C" PRIMARY KEY,
    session_id     TEXT COLLATE "C" NOT NULL,
    agent_id       TEXT COLLATE "C" NOT NULL,
    scope          TEXT             NOT NULL DEFAULT '',
    queue_policy   TEXT             NOT NULL,
    status         TEXT             NOT NULL,
    created_at     DOUBLE PRECISION NOT NULL,
    updated_at     DOUBLE PRECISION NOT NULL,
    active_turn_id TEXT COLLATE "C" NOT NULL DEFAULT '',
    turn_count     BIGINT           NOT NULL DEFAULT 0
);

-- A session's threads are one range scan.
CREATE INDEX runtime_threads_by_session ON runtime_threads (session_id, created_at, thread_id);

CREATE TABLE runtime_turns (
    turn_id       TEXT COLLATE "C" PRIMARY KEY,
    session_id    TEXT COLLATE "C" NOT NULL,
    thread_id     TEXT COLLATE "C" NOT NULL,
    ordinal       BIGINT           NOT NULL,
    state         TEXT COLLATE "C" NOT NULL,
    input_json    TEXT             NOT NULL,
    task_id       TEXT COLLATE "C" NOT NULL,
    created_at    DOUBLE PRECISION NOT NULL,
    updated_at    DOUBLE PRECISION NOT NULL,
    started_at    DOUBLE PRECISION NOT NULL DEFAULT 0,
    ended_at      DOUBLE PRECISION NOT NULL DEFAULT 0,
    error_code    TEXT             NOT NULL DEFAULT '',
    message       TEXT             NOT NULL DEFAULT '',
    result_json   TEXT             NOT NULL DEFAULT '',
    interrupt     TEXT             NOT NULL DEFAULT '',
    status_reason TEXT             NOT NULL DEFAULT '',
    submitted_by  TEXT             NOT NULL DEFAULT '',
    priority      BIGINT           NOT NULL DEFAULT 0
);

-- A thread's turns in order (its queue, its last turns); no two share a place.
CREATE UNIQUE INDEX runtime_turns_by_thread ON runtime_turns (thread_id, ordinal);
-- One turn per Scheduler task: a task's turn is found from the task.
CREATE UNIQUE INDEX runtime_turns_by_task ON runtime_turns (task_id);
-- The turns not ended, at start-up and per thread.
CREATE INDEX runtime_turns_open ON runtime_turns (state, thread_id, ordinal);

CREATE TABLE runtime_channels (
    channel_id     TEXT COLLATE "C" PRIMARY KEY,
    session_id     TEXT COLLATE "C" NOT NULL,
    owner          TEXT COLLATE "C" NOT NULL,
    token_digest   TEXT             NOT NULL,
    acked_sequence BIGINT           NOT NULL,
    created_at     DOUBLE PRECISION NOT NULL,
    updated_at     DOUBLE PRECISION NOT NULL,
    expires_at     DOUBLE PRECISION NOT NULL
);
