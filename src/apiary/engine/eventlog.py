"""The coordinator's event recorder: one append path for every transition and decision.

Every event goes to the store's event log and, as one structured JSON line, to the
`apiary.events` logger (DESIGN.md section 7). Live readers wait on `wait_after`.

Recording never waits for the database: events are queued and appended in order by one
flusher, many per transaction, so that a burst of transitions costs one commit instead of
one each. The store's writer is first-in first-out, so an event is durable no later than
any state change recorded after it; readers of this recorder flush first, and the
coordinator flushes on shutdown.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
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
        self._pending: list[EventDraft] = []
        self._flusher: asyncio.Task[None] | None = None
        self.counts: Counter[str] = Counter()
        """Events recorded by this process, by type (exported at /metrics)."""

    async def record(
        self,
        event_type: str,
        actor: str,
        *,
        correlation_id: str = "",
        agent_id: str = "",
        **details: Any,
    ) -> None:
        self.note(event_type, actor, correlation_id=correlation_id, agent_id=agent_id, **details)

    def note(
        self,
        event_type: str,
        actor: str,
        *,
        correlation_id: str = "",
        agent_id: str = "",
        **details: Any,
    ) -> None:
        """`record` for synchronous callers (recording never waits in either form)."""
        self.counts[event_type] += 1
        self._pending.append(
            EventDraft(event_type, actor, self._clock.now(), correlation_id, agent_id, details)
        )
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush_pending())

    async def _flush_pending(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                appended = await self._events.append(batch)
            except Exception:
                log.exception("could not append %d events to the event log", len(batch))
                continue
            if log.isEnabledFor(logging.INFO):
                for event in appended:
                    log.info(json.dumps(_as_json(event), separators=(",", ":"), default=str))
            async with self._appended:
                self._last = max(self._last, appended[-1].sequence)
                self._appended.notify_all()

    async def flush(self) -> None:
        """Return once every event recorded so far is in the store."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)
        if self._pending:
            self._flusher = asyncio.ensure_future(self._flush_pending())
            await self._flusher

    async def read(
        self, after: int = 0, limit: int = 500, where: EventFilter | None = None
    ) -> list[Event]:
        await self.flush()
        return await self._events.read(after=after, limit=limit, where=where)

    async def last_sequence(self) -> int:
        await self.flush()
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
