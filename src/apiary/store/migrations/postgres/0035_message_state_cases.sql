-- Schema version 35: SQLite's generated due_at and finished_at columns test a message's
-- state with a CASE instead of an IN list, which SQLite evaluated through a temporary
-- B-tree at every state change. PostgreSQL stores both columns (version 2) and evaluates
-- the IN list directly, so its schema stays as it is; the version is shared so that both
-- backends count versions alike. The comments say what the columns hold.
COMMENT ON COLUMN messages.due_at IS
    'When the timer loop must look at the message: the earlier of its set deadlines while it is unfinished, NULL once finished';
COMMENT ON COLUMN messages.finished_at IS
    'When the message reached a terminal state (its updated_at then), NULL before';
