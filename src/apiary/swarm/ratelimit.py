"""Sliding-window rate limits (the protocol's recommended limits): pure, time is an argument.

    60 messages per minute per sender, 100 per minute per swarm, 10 joins per hour per IP.

`check` records an attempt when it is allowed and otherwise answers how many whole seconds
to wait (the Retry-After header's value: seconds, never a timestamp).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Limit:
    count: int
    window_s: float

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 < self.window_s < math.inf:
            raise ValueError(f"a rate limit needs count >= 1 and a window > 0, not {self}")


MESSAGES_PER_SENDER = Limit(60, 60.0)
MESSAGES_PER_SWARM = Limit(100, 60.0)
JOINS_PER_IP = Limit(10, 3600.0)


class SlidingWindow:
    """At most `limit.count` attempts per key in any window of `limit.window_s` seconds."""

    def __init__(self, limit: Limit, max_keys: int = 100_000) -> None:
        self.limit = limit
        self._seen: dict[str, deque[float]] = {}
        self._max_keys = max_keys

    def retry_after(self, key: str, now: float) -> int:
        """0 when an attempt is allowed now, else the seconds to wait (at least 1)."""
        times = self._seen.get(key)
        if times is None:
            return 0
        while times and times[0] <= now - self.limit.window_s:
            times.popleft()
        if len(times) < self.limit.count:
            return 0
        return max(1, math.ceil(times[0] + self.limit.window_s - now))

    def record(self, key: str, now: float) -> None:
        times = self._seen.get(key)
        if times is None:
            if len(self._seen) >= self._max_keys:
                self._forget_idle(now)
            times = self._seen[key] = deque()
        times.append(now)

    def check(self, key: str, now: float) -> int:
        """`retry_after`, recording the attempt when it is allowed."""
        wait = self.retry_after(key, now)
        if wait == 0:
            self.record(key, now)
        return wait

    def _forget_idle(self, now: float) -> None:
        for key in [
            k for k, t in self._seen.items() if not t or t[-1] <= now - self.limit.window_s
        ]:
            del self._seen[key]
