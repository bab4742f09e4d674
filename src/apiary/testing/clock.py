"""A clock that only moves when a test moves it, with sleepers that wake on `advance`.

Engine timers (ack timeouts, heartbeats, grace periods, TTLs, HITL deadlines) sleep on the
injected clock; with `FakeClock` a test arms them, calls `advance`, and they fire at once in
deadline order, so no test ever waits in real time.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from typing import Final

DEFAULT_START: Final = 1_700_000_000.0
"""2023-11-14T22:13:20Z: a fixed wall time, so that timestamps in test output are stable."""


class FakeClock:
    """A deterministic `apiary.core.clock.Clock` with asyncio-aware sleeps.

    Wall time starts at `start` and monotonic time at 0.0; both move together under `advance`.
    Not thread-safe: drive it from the event loop's thread, as tests do.
    """

    def __init__(self, start: float = DEFAULT_START) -> None:
        if not math.isfinite(start):
            raise ValueError(f"start must be finite, got {start!r}")
        self._wall = start
        self._monotonic = 0.0
        # (deadline, registration order, waiter): the order breaks deadline ties FIFO.
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._dead = 0

    def now(self) -> float:
        """The fake UTC wall time, seconds since the epoch."""
        return self._wall

    def monotonic(self) -> float:
        """The fake monotonic time, seconds since the clock was made."""
        return self._monotonic

    def advance(self, seconds: float) -> None:
        """Move both clocks forward and wake, in deadline order, every sleeper now due.

        The woken tasks run at the loop's next turn (after the caller's next `await`) and see
        the time after the whole advance. Raises ValueError for negative or non-finite steps:
        monotonic time cannot go back (use `set_wall` to model a wall-clock step).
        """
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"advance needs a finite, non-negative step, got {seconds!r}")
        self._wall += seconds
        self._monotonic += seconds
        self._wake_due()

    def set_wall(self, now: float) -> None:
        """Step the wall clock to `now` (either direction) without touching monotonic time.

        Models NTP steps and operator changes, which timers must be immune to.
        """
        if not math.isfinite(now):
            raise ValueError(f"wall time must be finite, got {now!r}")
        self._wall = now

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock has been advanced by `seconds` (<= 0: just yield once)."""
        await self.sleep_until(self._monotonic + max(seconds, 0.0))

    async def sleep_until(self, monotonic_deadline: float) -> None:
        """Wait until monotonic time reaches `monotonic_deadline` (past: just yield once)."""
        if monotonic_deadline <= self._monotonic:
            # Still a checkpoint, as asyncio.sleep(0) is, so loops over due timers stay fair.
            await asyncio.sleep(0)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (monotonic_deadline, next(self._order), waiter))
        try:
            await waiter
        finally:
            if waiter.cancelled():
                self._forget_cancelled()

    @property
    def pending_sleepers(self) -> int:
        """How many sleeps are still waiting for the clock to reach their deadline."""
        return sum(1 for _, _, waiter in self._sleepers if not waiter.done())

    @property
    def next_deadline(self) -> float | None:
        """The earliest monotonic deadline of a waiting sleeper, None when nobody sleeps."""
        live = [deadline for deadline, _, waiter in self._sleepers if not waiter.done()]
        return min(live, default=None)

    def _wake_due(self) -> None:
        while self._sleepers and self._sleepers[0][0] <= self._monotonic:
            _, _, waiter = heapq.heappop(self._sleepers)
            if waiter.done():
                self._dead -= 1
            else:
                waiter.set_result(None)

    def _forget_cancelled(self) -> None:
        # Cancelled timers are the common case (an ack cancels its timeout), so their entries
        # are dropped in bulk once they are half the heap, keeping cancellation O(1) amortized.
        self._dead += 1
        if self._dead * 2 > len(self._sleepers):
            self._sleepers = [entry for entry in self._sleepers if not entry[2].done()]
            heapq.heapify(self._sleepers)
            self._dead = 0
