-- Schema version 26: threads bound to a capability queue (docs/control-plane.md).
-- A thread names an agent or a capability: its turns' tasks go to that shared queue and any
-- capable agent runs each; a turn keeps the agent that ran it ('' until one took it).
ALTER TABLE runtime_threads ADD COLUMN capability TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE runtime_turns ADD COLUMN agent_id TEXT COLLATE "C" NOT NULL DEFAULT '';
