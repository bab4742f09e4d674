"""The in-memory event log (part of `MemoryStore`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from apiary.core.events import Event, EventDraft, EventFilter
from apiary.store.memory.copies import json_copy


class MemoryEventLog:
    """`EventLog` over a list: the event with sequence N is at index N - 1."""

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._listeners: list[Callable[[Sequence[Event]], None]] = []

    def listen(self, listener: Callable[[Sequence[Event]], None]) -> None:
        """Call `listener` with every append's events (see EventLog)."""
        self._listeners.append(listener)

    async def append(self, drafts: Sequence[EventDraft]) -> list[Event]:
        """Append the drafts atomically, in order; return them with their sequences."""
        return self.append_now(self.checked(drafts))

    def checked(self, drafts: Sequence[EventDraft]) -> list[EventDraft]:
        """The drafts with copies of their details; ValueError (nothing appended) when one
        is not JSON: for a caller that must check before changing anything else."""
        return [dataclasses.replace(d, details=json_copy(d.details)) for d in drafts]

    def append_now(self, drafts: Sequence[EventDraft]) -> list[Event]:
        """Append `checked` drafts, at once (another aggregate's change appends its events
        this way, in the same step as the change)."""
        if not drafts:
            return []
        first = len(self._events) + 1
        appended = [Event.from_draft(first + i, draft) for i, draft in enumerate(drafts)]
        self._events.extend(appended)
        for listener in self._listeners:
            listener(appended)
        return [dataclasses.replace(e, details=json_copy(e.details)) for e in appended]

    async def read(
        self, after: int = 0, limit: int = 500, where: EventFilter | None = None
    ) -> list[Event]:
        """Events with sequence > `after` that match `where`, ascending, at most `limit`."""
        if limit < 0:
            raise ValueError(f"limit must not be negative: {limit}")
        found: list[Event] = []
        end = len(self._events) if where is None or where.before is None else where.before - 1
        for event in self._events[max(after, 0) : max(end, 0)]:
            if len(found) >= limit:
                break
            if where is None or where.matches(event):
                found.append(dataclasses.replace(event, details=json_copy(event.details)))
        return found

    async def last_sequence(self) -> int:
        """The highest sequence appended so far (0 for an empty log)."""
        return len(self._events)
