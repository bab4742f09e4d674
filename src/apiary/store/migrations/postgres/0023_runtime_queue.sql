-- Schema version 23: a thread's queue order and resumed turns (docs/control-plane.md,
-- promote_queued_turn and resume_thread). A thread's queue is its queued turns by
-- (queue_rank, ordinal): a turn is submitted with rank 0 and keeps its ordinal (its place in
-- the thread's history); a promotion ranks the queue anew (-n .. -1), so that later turns,
-- still 0, queue behind it. resumed_from names the turn whose lost task an explicit
-- resume_thread ran again as this turn ('' for none).
ALTER TABLE runtime_turns ADD COLUMN queue_rank BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runtime_turns ADD COLUMN resumed_from TEXT COLLATE "C" NOT NULL DEFAULT '';
