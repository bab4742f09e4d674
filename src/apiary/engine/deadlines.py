"""The deadlines of unfinished messages (engine/timers.py), and the loop that fires any set of
timers when they are due.

A message has up to three: its ACK deadline, which runs from a hand-out to a stream
(`start_ack`) and is kept in memory only, so that a restart re-arms it from the next
hand-out and never from admission; its TTL expiry; and, while it waits for a recipient that
no stream of holds it, its maximum age. One timer per message is armed at the earliest.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Awaitable, Callable, Iterable

from apiary.core.clock import Clock
from apiary.core.records import StoredMessage
from apiary.engine.timers import Timers

Sleep = Callable[[float], Awaitable[None]]


async def pause_until(until: float, clock: Clock, sleep: Sleep, wake: asyncio.Event) -> None:
    """Until the monotonic time `until`, or sooner once `wake` is set (then cleared). The
    sleep is measured when its task starts, not now: the clock may move first."""

    async def sleep_until() -> None:
        await sleep(max(0.0, until - clock.monotonic()))

    sleeper = asyncio.ensure_future(sleep_until())
    waker = asyncio.ensure_future(wake.wait())
    try:
        await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sleeper, waker):
            task.cancel()
        wake.clear()


COMPACT_ABOVE = 4096
"""A heap this long, more than half of it entries left by re-armed or cancelled timers, is
rebuilt from the armed ones (see `Deadlines.arm`)."""


class Deadlines(Timers):
    """The router's timers, one per unfinished message (keyed by message id).

    It keeps the base class's heap in check itself (`_compact`) and arms a batch of ACK
    deadlines in one pass (`start_acks`): both work on the heap directly."""

    def __init__(self, ack_timeout_s: float = 10.0, max_age_s: float = 0.0) -> None:
        super().__init__()
        self.ack_timeout_s = ack_timeout_s
        self.max_age_s = max_age_s
        self._acks: dict[str, float] = {}
        """The ACK deadline of each message a stream holds unacknowledged."""
        self.on_ack: Callable[[str, float], None] | None = None
        """Cluster mode only (engine/cluster/ack_deadlines.py): told of each ACK deadline
        started (message id, when due) and stopped (0.0), so that the store holds it for the
        partition's owner, which runs it."""

    def arm(self, key: str, at: float) -> None:
        """As `Timers.arm`, keeping the heap compact (`_compact`)."""
        super().arm(key, at)
        self._compact()

    def _compact(self) -> None:
        """Rebuild a heap grown mostly of entries left by re-armed or cancelled timers. A
        message's age deadline lies a day ahead, so the entry it leaves when a hand-out
        re-arms it would otherwise stay that long: rebuilding once they are over half keeps
        the heap within twice the armed timers, at an amortised constant cost."""
        heap = self._heap
        if len(heap) > COMPACT_ABOVE and len(heap) > 2 * len(self._armed):
            heap[:] = [(due, name) for name, due in self._armed.items()]
            heapq.heapify(heap)

    @property
    def held(self) -> int:
        """Entries the timers hold in memory: one per armed timer, and those left by re-armed
        or cancelled ones not yet dropped."""
        return len(self._heap)

    def cancel(self, key: str) -> None:
        """Forget every deadline of `key` (its message finished)."""
        self._armed.pop(key, None)
        self._acks.pop(key, None)

    def ack_due(self, message_id: str) -> float:
        """When the ACK of `message_id` is due; 0 when none is (no stream holds it)."""
        return self._acks.get(message_id, 0.0)

    def start_ack(self, message: StoredMessage, now: float) -> None:
        """START_ACK_TIMER: a stream holds `message` from `now`; see `start_acks`."""
        self.start_acks((message,), now)

    def start_acks(self, messages: Iterable[StoredMessage], now: float) -> None:
        """START_ACK_TIMER for `messages`, handed to a stream at `now`: the first ACK of each
        is due `ack_timeout_s` later (its TTL, if earlier, still comes first). Nothing for a
        message already acknowledged: the deadline runs to the first ACK only. One pass for
        a batch of hand-outs (what `Timers.arm` does for one)."""
        due = now + self.ack_timeout_s
        acks, armed, heap, on_ack = self._acks, self._armed, self._heap, self.on_ack
        earliest: tuple[float, str] | None = None
        for message in messages:
            if message.acked_stage:
                continue
            key = message.message_id
            acks[key] = due
            if on_ack is not None:
                on_ack(key, due)
            ttl = message.expires_at
            at = ttl if 0 < ttl < due else due
            if armed.get(key) != at:
                armed[key] = at
                entry = (at, key)
                heapq.heappush(heap, entry)
                if earliest is None or entry < earliest:
                    earliest = entry
        if earliest is not None:
            if heap[0] == earliest:
                self.changed.set()
            self._compact()

    def stop_ack(self, message_id: str) -> None:
        """CANCEL_ACK_TIMER: no ACK is due any more. The timer stays armed; when it fires
        the message is watched again (`watch`), for whatever deadline it has left."""
        if self._acks.pop(message_id, None) is not None and self.on_ack is not None:
            self.on_ack(message_id, 0.0)

    def age_limit(self, message: StoredMessage) -> float:
        """When `message`, waiting unacknowledged for its recipient, ages out; 0: never."""
        if not self.max_age_s or message.acked_stage:
            return 0.0
        return message.created_at + self.max_age_s

    def watch(self, message: StoredMessage, *, waiting: bool) -> None:
        """(Re)arm the message's earliest deadline: its ACK deadline, its TTL expiry, and,
        when `waiting` (it awaits an ACK and no stream of its recipient holds it), its
        maximum age. No deadline means nothing to watch."""
        message_id = message.message_id
        at = self._acks.get(message_id, 0.0)
        if not at and waiting:
            at = self.age_limit(message)
        ttl = message.expires_at
        if ttl > 0 and (at <= 0 or ttl < at):
            at = ttl
        if at > 0:
            self.arm(message_id, at)
        else:
            self._armed.pop(message_id, None)  # (and no ACK is due: `at` would be it)


async def run_deadlines(
    deadlines: Timers, clock: Clock, fire: Callable[[], Awaitable[int]], sleep: Sleep
) -> None:
    """Forever: wait for the earliest deadline (or an earlier one to appear), then fire.

    `sleep` is injected so that tests drive the loop with a fake clock.
    """
    while True:
        deadlines.changed.clear()
        at = deadlines.next()
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
