-- Schema version 18: results back to the submitter. A task's submitter (the principal that
-- submitted it, '' when not known: WaitTask and WatchTasks are its) and its result, the JSON
-- value its agent returned, as text ('' for none; at most [limits] task_result_bytes).
ALTER TABLE tasks ADD COLUMN submitter TEXT NOT NULL DEFAULT '';
ALTER TABLE tasks ADD COLUMN result TEXT NOT NULL DEFAULT '';
