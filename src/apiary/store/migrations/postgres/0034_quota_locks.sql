-- Schema version 34: the rows that admissions held to a tenant's quota lock (docs/cluster.md,
-- "Tenants"). In cluster mode each admission of a tenant with a `queued_messages` quota
-- counts the tenant's queued messages in its transaction; it locks the quota's row here
-- first, so that two such admissions on two replicas (to different recipients, whose
-- offset counters do not serialize them) commit one after the other and never both take
-- the last place. One row per quota, created by the first admission that locks it.
-- Statements: apiary.store.sql.bounds.

CREATE TABLE quota_locks (
    quota TEXT COLLATE "C" PRIMARY KEY
);
