"""Ack and TTL deadlines of unfinished messages (engine/timers.py), and the loop that fires
any set of timers when they are due."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from apiary.core.clock import Clock
from apiary.core.records import StoredMessage
from apiary.engine.timers import Timers

Sleep = Callable[[float], Awaitable[None]]


def _deadline(message: StoredMessage) -> float:
    times = [t for t in (message.ack_deadline, message.expires_at) if t > 0]
    return min(times) if times else 0.0


class Deadlines(Timers):
    """The router's timers, one per unfinished message (keyed by message id)."""

    def watch(self, message: StoredMessage) -> None:
        """(Re)arm the message's earliest deadline; no deadline means nothing to watch."""
        deadline = _deadline(message)
        if deadline <= 0:
            self.cancel(message.message_id)
        else:
            self.arm(message.message_id, deadline)


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
