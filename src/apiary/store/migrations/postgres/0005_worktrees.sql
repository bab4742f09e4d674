-- Schema version 5: worktree bindings (RFC 16), one row per agent, so that homes, pending
-- switches, non-home time limits and bind failures with their retry and recovery deadlines
-- survive a restart. Deadlines are UTC seconds, 0 for none. version grows by one with every
-- change (optimistic concurrency: a write names the version it replaces, so that replicas
-- sharing the database cannot overwrite each other's transitions).

CREATE TABLE worktrees (
    -- COLLATE "C" on the keys compared in SQL, as elsewhere: byte order is code point order.
    agent_id            TEXT COLLATE "C" PRIMARY KEY,
    state               TEXT COLLATE "C" NOT NULL,
    repo_id             TEXT COLLATE "C" NOT NULL DEFAULT '',
    worktree_id         TEXT             NOT NULL DEFAULT '',
    branch              TEXT             NOT NULL DEFAULT '',
    commit_sha          TEXT             NOT NULL DEFAULT '',
    current_repo_id     TEXT COLLATE "C" NOT NULL DEFAULT '',
    current_worktree_id TEXT             NOT NULL DEFAULT '',
    target_repo_id      TEXT             NOT NULL DEFAULT '',
    target_worktree_id  TEXT             NOT NULL DEFAULT '',
    reason              TEXT             NOT NULL DEFAULT '',
    note                TEXT             NOT NULL DEFAULT '',
    attempts            BIGINT           NOT NULL DEFAULT 0,
    retry_at            DOUBLE PRECISION NOT NULL DEFAULT 0,
    recovery_at         DOUBLE PRECISION NOT NULL DEFAULT 0,
    expires_at          DOUBLE PRECISION NOT NULL DEFAULT 0,
    ttl_s               DOUBLE PRECISION NOT NULL DEFAULT 0,
    invocation_id       TEXT             NOT NULL DEFAULT '',
    entered_at          DOUBLE PRECISION NOT NULL DEFAULT 0,
    updated_at          DOUBLE PRECISION NOT NULL DEFAULT 0,
    version             BIGINT           NOT NULL
);

-- Listings by state (every BIND_FAILED agent, every non-home one) read one range.
CREATE INDEX worktrees_by_state ON worktrees (state, agent_id);
