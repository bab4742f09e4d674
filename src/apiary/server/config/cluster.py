"""The [cluster] table of the configuration file (docs/cluster.md, "Configuration"):

[cluster]
enabled = false          # cluster mode (`apiary serve --cluster`); PostgreSQL only
replica_id = ""          # default: HOST-PID
lease_s = 5.0            # a dead replica's partitions are taken over within this
partitions = 64          # the same on every replica of a cluster
client_cert = ""         # presented to an mTLS leader on forwarded calls; default tls_cert
client_key = ""          # its key; default tls_key
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from apiary.core.cluster.partitions import MAX_PARTITIONS
from apiary.engine.cluster.settings import ClusterSettings
from apiary.errors import ValidationError
from apiary.server.config.values import typed_fields

_TYPES: Final[dict[str, type]] = {
    "enabled": bool,
    "replica_id": str,
    "lease_s": float,
    "partitions": int,
    "client_cert": str,
    "client_key": str,
}
_PATHS: Final = ("client_cert", "client_key")
MIN_LEASE_S: Final = 0.5
MAX_LEASE_S: Final = 300.0
MAX_REPLICA_ID: Final = 128
_REPLICA_ID: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")


def cluster_settings(values: Mapping[str, Any], source: str) -> ClusterSettings:
    """ClusterSettings from the [cluster] table; errors name the setting and `source`."""
    fields = typed_fields(values, _TYPES, "cluster.", source)
    for name in _PATHS:
        if text := fields.pop(name, ""):
            fields[name] = Path(text)
    settings = ClusterSettings(**fields)
    if not MIN_LEASE_S <= settings.lease_s <= MAX_LEASE_S or not math.isfinite(settings.lease_s):
        raise ValidationError(
            f"{source}: cluster.lease_s must be between {MIN_LEASE_S} and {MAX_LEASE_S} "
            f"seconds, not {settings.lease_s}",
            {"field": "cluster.lease_s"},
        )
    if not 1 <= settings.partitions <= MAX_PARTITIONS:
        raise ValidationError(
            f"{source}: cluster.partitions must be between 1 and {MAX_PARTITIONS}, "
            f"not {settings.partitions}",
            {"field": "cluster.partitions"},
        )
    rid = settings.replica_id
    if rid and (len(rid) > MAX_REPLICA_ID or not _REPLICA_ID.match(rid)):
        raise ValidationError(
            f"{source}: cluster.replica_id must be at most {MAX_REPLICA_ID} letters, digits "
            f"and . _ : @ - (starting with a letter or digit), not {rid!r}",
            {"field": "cluster.replica_id"},
        )
    return settings


def cluster_problem(settings: ClusterSettings, store: str) -> ValidationError | None:
    """Why a coordinator with these settings may not serve `store`, or None: cluster mode
    needs PostgreSQL (several coordinators share a database server)."""
    if not settings.enabled:
        return None
    if store.partition(":")[0].lower() not in ("postgresql", "postgres"):
        return ValidationError(
            '[cluster] enabled needs a PostgreSQL store (store = "postgresql://..." or '
            "--store postgresql://...): replicas share one database server",
            {"field": "cluster.enabled"},
        )
    return None
