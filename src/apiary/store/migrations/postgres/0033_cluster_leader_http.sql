-- Schema version 33: where the cluster's leader serves HTTP (docs/cluster.md, "The leader";
-- docs/control-plane.md, "Cluster mode"). The other replicas forward the runtime control
-- plane's requests there, as they forward the leader's services' gRPC calls to `address`;
-- recorded with `address` when a term begins.

ALTER TABLE cluster_leader ADD COLUMN http_address TEXT NOT NULL DEFAULT '';
