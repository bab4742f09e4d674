-- Schema version 19: shared task queues. A task submitted to a capability or an agent type
-- names its queue ('capability:<name>' or 'agent_type:<name>'; '' for a task submitted to one
-- agent); such a task's agent_id is the agent holding it ('' while it waits). lost_attempts
-- counts the attempts that ended because the agent holding the task was lost ([scheduler]
-- max_attempts).
ALTER TABLE tasks ADD COLUMN queue TEXT NOT NULL DEFAULT '';
ALTER TABLE tasks ADD COLUMN lost_attempts INTEGER NOT NULL DEFAULT 0;
