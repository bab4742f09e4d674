-- Schema version 22: cluster mode (DESIGN.md section 8, docs/cluster.md). Replicas beat in
-- cluster_replicas; agents' queues are split into partitions, each leased by one replica in
-- partition_leases with an expiry and a fencing epoch. Times are seconds since the epoch on
-- the database server's clock (the one clock every replica's lease decisions are read
-- against). The lease rules are apiary.core.cluster.leases; the statements that apply them
-- are apiary.store.postgres.cluster.

CREATE TABLE cluster_replicas (
    replica_id   TEXT COLLATE "C" PRIMARY KEY,
    -- One per start of a replica, so that a restarted replica is told from its predecessor.
    incarnation  TEXT             NOT NULL,
    address      TEXT             NOT NULL DEFAULT '',
    started_at   DOUBLE PRECISION NOT NULL,
    heartbeat_at DOUBLE PRECISION NOT NULL,
    -- heartbeat_at + lease_s: the replica counts as gone from then unless it beats again.
    expires_at   DOUBLE PRECISION NOT NULL
);

CREATE TABLE partition_leases (
    partition   INTEGER          PRIMARY KEY CHECK (partition >= 0),
    -- NULL: free (never taken, or released).
    owner       TEXT COLLATE "C",
    -- Grows by one with each term of ownership; fenced writes name the epoch they expect.
    epoch       BIGINT           NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    expires_at  DOUBLE PRECISION NOT NULL DEFAULT 0,
    -- When the current term began (for operators: how long it has been held).
    acquired_at DOUBLE PRECISION NOT NULL DEFAULT 0
);
