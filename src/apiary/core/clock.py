"""The clock the rest of Apiary reads time from, injected so that tests control time.

Core code never reads a clock: machines take `now` as an argument. The engine holds a `Clock`
(`apiary.system.SystemClock` in production, `apiary.testing.FakeClock` in tests) and passes
its readings down.
"""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    """A source of wall-clock and monotonic time."""

    def now(self) -> float:
        """UTC wall time in seconds since the Unix epoch: for timestamps people read."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never goes back: for timeouts and deadlines.

        Wall time can jump (NTP steps, operators); deadlines measured on it would fire early or
        never, so every timer is armed on this reading.
        """
        ...
