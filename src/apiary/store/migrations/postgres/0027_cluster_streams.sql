-- Schema version 27: one live stream per agent across the replicas of a cluster
-- (docs/cluster.md, "One stream per agent"). Each agent whose stream ever opened in cluster
-- mode has one holder row: the replica (and its start, `incarnation`) whose stream is the
-- agent's live one, empty when none is, and a generation that grows by one with each
-- stream granted. The rules are apiary.core.cluster.streams; the statements that apply them
-- are apiary.store.postgres.cluster_streams.

CREATE TABLE stream_holders (
    agent_id    TEXT COLLATE "C" PRIMARY KEY,
    replica_id  TEXT COLLATE "C" NOT NULL DEFAULT '',
    incarnation TEXT             NOT NULL DEFAULT '',
    generation  BIGINT           NOT NULL DEFAULT 0 CHECK (generation >= 0),
    opened_at   DOUBLE PRECISION NOT NULL DEFAULT 0
);

-- Cluster mode's maximum age (docs/cluster.md, "Buffers, credits and the maximum age"): the
-- partition's owner reads the messages that await their first ACK, oldest first, to fail
-- those that waited past max_age_s for an agent with no stream on any replica. Only such
-- messages are indexed: one leaves the index at its first ACK or when it finishes.
CREATE INDEX messages_awaiting_ack ON messages (created_at, message_id)
    WHERE acked_stage = '' AND state IN ('RECEIVED', 'RETRYING');
