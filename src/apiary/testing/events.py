"""Waiting for the event log in tests: the first matching event, as it lands."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from apiary.core.events import Event
from apiary.engine.eventlog import EventRecorder


async def wait_for_event(
    events: EventRecorder,
    where: Callable[[Event], bool],
    *,
    after: int = 0,
    timeout_s: float = 20.0,
) -> Event:
    """The first event after sequence `after` that matches `where`, waiting for new ones;
    TimeoutError after `timeout_s`."""

    async def scan() -> Event:
        seen = after
        while True:
            batch = await events.read(after=seen, limit=1000)
            for event in batch:
                if where(event):
                    return event
            if batch:
                seen = batch[-1].sequence
            else:
                await events.wait_after(seen)

    async with asyncio.timeout(timeout_s):
        return await scan()
