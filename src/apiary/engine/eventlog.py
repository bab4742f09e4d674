"""The coordinator's event recorder: one append path for every transition and decision.

Every event goes to the store's event log and, as one structured JSON line, to the
`apiary.events` logger (DESIGN.md section 7). Live readers wait on `wait_after`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from apiary.core.clock import Clock
from apiary.core.events import Event, EventDraft, EventFilter
from apiary.store.protocols import EventLog

log = logging.getLogger("apiary.events")


class EventRecorder:
    """Appends events with the injected clock's time and wakes live readers."""

    def __init__(self, events: EventLog, clock: Clock) -> None:
        self._events = events
        self._clock = clock
        self._appended = asyncio.Condition()
        self._last = 0

    async def record(
        self,
        event_type: str,
        actor: str,
        *,
        correlation_id: str = "",
        agent_id: str = "",
        **details: Any,
    ) -> Event:
        draft = EventDraft(
            event_type=event_type,
            actor=actor,
            ts=self._clock.now(),
            correlation_id=correlation_id,
            agent_id=agent_id,
            details=details,
        )
        (event,) = await self._events.append([draft])
        if log.isEnabledFor(logging.INFO):
            log.info(json.dumps(_as_json(event), separators=(",", ":"), default=str))
        async with self._appended:
            self._last = max(self._last, event.sequence)
            self._appended.notify_all()
        return event

    async def read(
        self, after: int = 0, limit: int = 500, where: EventFilter | None = None
    ) -> list[Event]:
        return await self._events.read(after=after, limit=limit, where=where)

    async def last_sequence(self) -> int:
        return await self._events.last_sequence()

    async def wait_after(self, sequence: int) -> None:
        """Return once an event with a sequence above `sequence` was recorded here."""
        async with self._appended:
            await self._appended.wait_for(lambda: self._last > sequence)


def _as_json(event: Event) -> dict[str, Any]:
    return {
        "seq": event.sequence,
        "ts": event.ts,
        "type": event.event_type,
        "actor": event.actor,
        "correlation_id": event.correlation_id,
        "agent_id": event.agent_id,
        "details": dict(event.details),
    }
