"""Cluster mode's imperative shell (docs/cluster.md): the lease keeper that keeps a replica's
heartbeat and partition leases in the store."""
