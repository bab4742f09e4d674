-- Schema version 13: swarm outbox rows wait for their next delivery attempt (status
-- 'retrying' until next_attempt_at; core/swarm_mail.py). Rows whose delivery has not ended
-- ('sent' or 'retrying') are the courier's work list, soonest first.
ALTER TABLE swarm_outbox DROP CONSTRAINT swarm_outbox_status_check;
ALTER TABLE swarm_outbox ADD CONSTRAINT swarm_outbox_status_check
    CHECK (status IN ('sent', 'retrying', 'delivered', 'failed'));
ALTER TABLE swarm_outbox ADD COLUMN next_attempt_at DOUBLE PRECISION NOT NULL DEFAULT 0;
CREATE INDEX swarm_outbox_pending ON swarm_outbox (next_attempt_at, created_at)
    WHERE status IN ('sent', 'retrying');
