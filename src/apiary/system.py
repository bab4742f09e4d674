"""The real clock and id source, for production wiring (tests use `apiary.testing`
instead), and whether a process of the host is alive."""

from __future__ import annotations

import os
import time
import uuid


class SystemClock:
    """`apiary.core.clock.Clock` on the host's clocks."""

    def now(self) -> float:
        """UTC wall time in seconds since the epoch (`time.time`)."""
        return time.time()

    def monotonic(self) -> float:
        """Seconds on the host's monotonic clock (`time.monotonic`)."""
        return time.monotonic()


class UuidIds:
    """`apiary.core.ids.IdGenerator` backed by `uuid.uuid4` (the OS's random source)."""

    def new_id(self) -> str:
        """A fresh random UUIDv4 string."""
        return str(uuid.uuid4())


def process_alive(pid: int) -> bool:
    """Whether a process `pid` exists on this host, another user's included. pid 1 does (a
    coordinator may be a container's first process); 0 and below name no one process
    (`kill` would signal a process group), so they are not alive."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
