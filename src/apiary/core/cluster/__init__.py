"""Cluster mode (DESIGN.md section 8, docs/cluster.md): agents' queues split into partitions,
partitions leased by coordinator replicas with an expiry and a fencing epoch, and a fair
assignment of partitions over the live replicas. Pure: time is an argument, nothing here
reads a clock or a database."""
