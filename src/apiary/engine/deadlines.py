"""Ack and TTL deadlines of unfinished messages: a heap with lazy deletion."""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Awaitable, Callable

from apiary.core.clock import Clock
from apiary.core.records import StoredMessage

Sleep = Callable[[float], Awaitable[None]]


def _deadline(message: StoredMessage) -> float:
    times = [t for t in (message.ack_deadline, message.expires_at) if t > 0]
    return min(times) if times else 0.0


class Deadlines:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._heap: list[tuple[float, str]] = []
        self._current: dict[str, float] = {}
        self.changed = asyncio.Event()

    def watch(self, message: StoredMessage) -> None:
        """(Re)arm the message's earliest deadline; no deadline means nothing to watch."""
        deadline = _deadline(message)
        if deadline <= 0:
            self.forget(message.message_id)
            return
        if self._current.get(message.message_id) == deadline:
            return
        self._current[message.message_id] = deadline
        heapq.heappush(self._heap, (deadline, message.message_id))
        if self._heap[0][1] == message.message_id:
            self.changed.set()

    def forget(self, message_id: str) -> None:
        self._current.pop(message_id, None)

    def next_at(self) -> float | None:
        while self._heap and self._current.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[str]:
        due: list[str] = []
        while (at := self.next_at()) is not None and at <= now:
            _, message_id = heapq.heappop(self._heap)
            self._current.pop(message_id, None)
            due.append(message_id)
        return due

    def __len__(self) -> int:
        return len(self._current)


async def run_deadlines(
    deadlines: Deadlines, clock: Clock, fire: Callable[[], Awaitable[int]], sleep: Sleep
) -> None:
    """Forever: wait for the earliest deadline (or an earlier one to appear), then fire.

    `sleep` is injected so that tests drive the loop with a fake clock.
    """
    while True:
        deadlines.changed.clear()
        at = deadlines.next_at()
        if at is not None and at <= clock.now():
            await fire()
            continue
        waiter = asyncio.ensure_future(deadlines.changed.wait())
        sleeper = asyncio.ensure_future(sleep(at - clock.now())) if at is not None else None
        pending = {waiter} | ({sleeper} if sleeper else set())
        try:
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pending:
                task.cancel()
