"""Remembers the nonces of accepted agent proofs for as long as their time is acceptable, so
that a captured proof cannot be presented twice."""

from __future__ import annotations

import heapq

MAX_REMEMBERED = 1_000_000
"""A bound on memory: past it, the oldest nonces are forgotten early (and proofs older than
the oldest remembered one are refused, see `accept`)."""


class ReplayWindow:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._seen: dict[bytes, float] = {}
        self._expiry: list[tuple[float, bytes]] = []
        self._floor = 0.0

    def accept(self, key: bytes, at: float, now: float) -> str | None:
        """Accept a proof made at `at` with nonce `key`: None, or why it is refused."""
        self._forget(now)
        if abs(now - at) > self.window_s:
            return f"made {now - at:+.1f} s from now; proofs are accepted within {self.window_s} s"
        if at < self._floor:
            return "older than the replay window remembers; make a new proof"
        if key in self._seen:
            return "already used (replay)"
        expires = at + self.window_s
        self._seen[key] = expires
        heapq.heappush(self._expiry, (expires, key))
        while len(self._seen) > MAX_REMEMBERED:
            expired, old = heapq.heappop(self._expiry)
            self._seen.pop(old, None)
            self._floor = max(self._floor, expired - self.window_s)
        return None

    def _forget(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] < now:
            _, key = heapq.heappop(self._expiry)
            self._seen.pop(key, None)
