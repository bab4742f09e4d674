-- Schema version 29: the tenants a cluster serves besides the default (docs/cluster.md,
-- "Tenants"). A replica that opens a tenant's engine records the tenant here, in the
-- cluster's schema (the default tenant's, which holds the lease table); every replica opens
-- the engines of the tenants listed, so that the owner of a partition, whichever replica it
-- is, runs the deadlines of each tenant's messages in it. Statements:
-- apiary.store.postgres.cluster_tenants.

CREATE TABLE cluster_tenants (
    tenant    TEXT COLLATE "C" PRIMARY KEY,
    opened_at DOUBLE PRECISION NOT NULL
);
