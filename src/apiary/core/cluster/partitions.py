"""Which partition an agent's queue belongs to: a stable hash of its agent_id.

Stable means the same on every replica, every Python process and every version of Apiary:
not `hash()` (randomized per process) but BLAKE2b over the UTF-8 bytes, whose first eight
bytes, big-endian, modulo the partition count, are the partition. The count is fixed for a
cluster's life: every replica must use the same one (the lease table is seeded with it and
a replica configured with another is refused), because changing it moves most agents.
"""

from __future__ import annotations

import hashlib
from typing import Final

DEFAULT_PARTITIONS: Final = 64
MAX_PARTITIONS: Final = 4096
"""More would only make every heartbeat longer: each replica renews its leases in one
statement, and 64 already spread well over any replica count one database serves."""


def partition_of(agent_id: str, partitions: int) -> int:
    """The partition, in [0, partitions), that `agent_id`'s queue belongs to."""
    check_partitions(partitions)
    digest = hashlib.blake2b(agent_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def check_partitions(partitions: int) -> None:
    """ValueError unless 1 <= partitions <= MAX_PARTITIONS."""
    if isinstance(partitions, bool) or not 1 <= partitions <= MAX_PARTITIONS:
        raise ValueError(f"partitions must be between 1 and {MAX_PARTITIONS}, not {partitions}")
