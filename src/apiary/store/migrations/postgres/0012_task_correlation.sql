-- Schema version 12: a task's correlation_id, the correlation id of the envelopes it causes
-- (its dispatches, deferral notices and control messages). '' means the task's own task_id;
-- a workflow's node tasks carry the workflow id, so that one id follows the whole flow (RFC
-- 11.3: correlation_id is per workflow or session, stable across the entire flow).
ALTER TABLE tasks ADD COLUMN correlation_id TEXT NOT NULL DEFAULT '';
