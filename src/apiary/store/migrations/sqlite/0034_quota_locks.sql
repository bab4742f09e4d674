-- Schema version 34: the rows that admissions held to a tenant's quota lock (docs/cluster.md,
-- "Tenants"; apiary.store.sql.bounds). Cluster mode, which holds admissions to the quota in
-- the store, is PostgreSQL's; the table is here too so that the statements shared by both
-- backends run on either (the store's conformance suite) and both count versions alike.

CREATE TABLE quota_locks (
    quota TEXT PRIMARY KEY
);
