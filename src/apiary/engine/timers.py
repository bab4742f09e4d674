"""Named one-shot timers on the coordinator's clock: a heap with lazy deletion.

Each key has at most one armed deadline; re-arming replaces it and cancelling forgets it
(in O(1): the old heap entry is skipped when it surfaces). `due(now)` pops every key whose
deadline is at or before `now`. The owner runs them from its background loop, woken by
`changed` when an earlier deadline appears.
"""

from __future__ import annotations

import asyncio
import heapq


class Timers:
    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []
        self._armed: dict[str, float] = {}
        self.changed = asyncio.Event()

    def arm(self, key: str, at: float) -> None:
        if self._armed.get(key) == at:
            return
        self._armed[key] = at
        heapq.heappush(self._heap, (at, key))
        if self._heap[0] == (at, key):
            self.changed.set()

    def cancel(self, key: str) -> None:
        self._armed.pop(key, None)

    def armed(self, key: str) -> float | None:
        return self._armed.get(key)

    def next(self) -> float | None:
        """The earliest armed deadline, None when nothing is armed."""
        while self._heap and self._armed.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> list[str]:
        """Keys due at `now`, earliest first; they are disarmed."""
        fired: list[str] = []
        while (at := self.next()) is not None and at <= now:
            _, key = heapq.heappop(self._heap)
            del self._armed[key]
            fired.append(key)
        return fired

    def __len__(self) -> int:
        return len(self._armed)
