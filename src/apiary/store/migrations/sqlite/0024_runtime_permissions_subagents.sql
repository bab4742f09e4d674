-- Schema version 24: permissions and subagents (docs/control-plane.md).
-- Permissions (evaluate_permission, resolve_permission): one that needs approval is a HITL
-- invocation the runtime follows as it follows actions, a row of runtime_actions whose kind
-- is 'permission', with the request and its evaluation as detail_json. Actions keep kind
-- 'action' and '{}'.
ALTER TABLE runtime_actions ADD COLUMN kind TEXT NOT NULL DEFAULT 'action';
ALTER TABLE runtime_actions ADD COLUMN detail_json TEXT NOT NULL DEFAULT '{}';

-- Subagents (spawn_subagent ... list_subagents): a subagent is a child thread of the same
-- session, bound to its own agent, linked to the thread (and turn) that spawned it; a
-- closed one takes no more turns.
ALTER TABLE runtime_threads ADD COLUMN parent_thread_id TEXT NOT NULL DEFAULT '';
ALTER TABLE runtime_threads ADD COLUMN parent_turn_id TEXT NOT NULL DEFAULT '';
ALTER TABLE runtime_threads ADD COLUMN role TEXT NOT NULL DEFAULT '';
ALTER TABLE runtime_threads ADD COLUMN closed_at REAL NOT NULL DEFAULT 0;
