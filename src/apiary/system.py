"""The real clock and id source, for production wiring; tests use `apiary.testing` instead."""

from __future__ import annotations

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
