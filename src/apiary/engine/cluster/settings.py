"""The [cluster] settings (docs/cluster.md, "Configuration")."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from apiary.core.cluster.partitions import DEFAULT_PARTITIONS


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """How a replica takes part in a cluster; checked by `server.config.cluster`."""

    enabled: bool = False
    """Cluster mode: several replicas share one PostgreSQL store (docs/cluster.md, "What is
    built" says how much of it)."""
    replica_id: str = ""
    """This replica's name in the cluster; empty: `default_replica_id()` (host and pid)."""
    lease_s: float = 5.0
    """How long a lease and a heartbeat last unless renewed: the longest a dead replica's
    partitions wait for another replica."""
    partitions: int = DEFAULT_PARTITIONS
    """How many partitions agents' queues are split into; the same on every replica."""
    client_cert: Path | None = None
    """The certificate (PEM chain) this replica presents to the leader on forwarded calls,
    for a leader that requires client certificates (`tls_client_ca`); None: the server's own
    (`tls_cert`), which must then allow client authentication (docs/cluster.md)."""
    client_key: Path | None = None
    """The key of `client_cert`; None with it: `tls_key`."""

    @property
    def renew_s(self) -> float:
        """How often leases and the heartbeat are renewed: a third of `lease_s`, so that two
        renewals in a row may fail before a lease lapses."""
        return self.lease_s / 3

    def resolved_replica_id(self) -> str:
        """`replica_id`, or the default when it is empty."""
        return self.replica_id or default_replica_id()


def default_replica_id() -> str:
    """`HOST-PID`: unique among the processes of one host, and says where to look."""
    return f"{socket.gethostname()}-{os.getpid()}"
