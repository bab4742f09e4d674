"""The console's reads of work in the event log (docs/console.md; which events belong to what
is core/history.py's):

- GET /console/api/history?kind=K&id=ID[&before=N][&limit=N]: the history of an agent, a
  task, a workflow run, a negotiation room, a negotiation or a HITL invocation, newest first:
  `{"events": [...], "next": N|null}`, each event as the live stream sends it.
- GET /console/api/finished[?kind=K][&q=TEXT][&before=N][&limit=N]: finished work, newest
  first, each item as the event that finished it tells (`FinishedItem`); `q` keeps the items
  with an id or text containing it (ignoring case): `{"items": [...], "next": N|null}`.

Both page backwards by sequence: `next` is the `before` of the next page, null once the log's
start is reached. The log reads forwards only, so a page is found in windows of the log read
back from `before`, each twice as long as the last, until the page is full. One answer reads
at most `SCAN_BUDGET` matching events: a search among much older work answers what it found
with the `next` to continue from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final

from aiohttp import web

from apiary.core.events import Event, EventFilter
from apiary.core.history import (
    FinishedItem,
    Subject,
    finished_item,
    finishing_filter,
    history_query,
)
from apiary.engine.eventlog import EventRecorder
from apiary.engine.hitl import Hitl
from apiary.errors import UnavailableError, ValidationError
from apiary.server.http.errors import error_response
from apiary.server.http.query import (
    choice_param,
    id_param,
    limit_param,
    optional_choice,
    optional_cursor,
    text_param,
)

SHOWN: Final = 50
MOST: Final = 500
"""Events or items per answer: the default and the most."""
SCAN_BUDGET: Final = 20_000
"""Matching events one answer reads at most."""
BATCH: Final = 1000


def event_json(event: Event) -> dict[str, Any]:
    """One event as the console reads it (the live stream's `data:` and a page's history)."""
    return {
        "sequence": event.sequence, "ts": event.ts, "event_type": event.event_type,
        "actor": event.actor, "correlation_id": event.correlation_id,
        "agent_id": event.agent_id, "details": dict(event.details), "hlc": event.hlc,
    }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Page:
    """Events newest first, and the `before` of the next page (None: nothing older)."""

    events: list[Event]
    next: int | None


async def read_back(
    events: EventRecorder,
    where: EventFilter,
    keep: Callable[[Event], bool],
    before: int | None,
    limit: int,
    budget: int = SCAN_BUDGET,
) -> Page:
    """The `limit` newest events below sequence `before` (the log's end: None) that `where`
    selects and `keep` keeps, reading at most about `budget` selected events: windows of
    the log read backwards, each twice as wide as the one before, and half as wide again
    when one would select more than the budget left."""
    last = await events.last_sequence()
    high = last if before is None else min(before - 1, last)
    found: list[Event] = []
    window, left = limit, budget
    while high > 0 and left > 0:
        low = max(0, high - window)
        selected = await _window(events, where, low, high, left)
        if selected is None:
            window = max(1, (high - low) // 2)
            continue
        left -= len(selected)
        found.extend(reversed([e for e in selected if keep(e)]))
        if len(found) >= limit:
            page = found[:limit]
            return Page(page, page[-1].sequence)
        high = low
        window *= 2
    return Page(found, high + 1 if high > 0 else None)


async def _window(
    events: EventRecorder, where: EventFilter, low: int, high: int, budget: int
) -> list[Event] | None:
    """The events in (low, high] that `where` selects, ascending; None as soon as they are
    more than `budget` (a window of one event never is: `budget` is at least 1)."""
    bounded = replace(where, before=high + 1)
    selected: list[Event] = []
    cursor = low
    while True:
        want = min(BATCH, budget + 1 - len(selected))
        batch = await events.read(after=cursor, limit=want, where=bounded)
        selected.extend(batch)
        if len(selected) > budget:
            return None
        if len(batch) < want:
            return selected
        cursor = batch[-1].sequence


class WorkReads:
    """The two routes, over the default tenant's event log and HITL invocations."""

    def __init__(self, events: EventRecorder | None, hitl: Hitl | None) -> None:
        self._events = events
        self._hitl = hitl

    def _log(self) -> EventRecorder:
        if self._events is None:
            raise UnavailableError("this server has no event log to read")
        return self._events

    async def history(self, request: web.Request) -> web.Response:
        try:
            events = self._log()
            kind = choice_param(request.query, "kind", Subject)
            subject_id = id_param(request.query, "id")
            before = optional_cursor(request.query, "before")
            limit = limit_param(request.query, SHOWN, MOST)
            correlation = ""
            if kind is Subject.HITL and self._hitl is not None:
                correlation = (await self._hitl.get(subject_id)).correlation_id
            query = history_query(kind, subject_id, correlation)
            page = await read_back(events, query.where, query.keeps, before, limit)
        except Exception as exc:
            return error_response(exc, request.path)
        return web.json_response(
            {"events": [event_json(e) for e in page.events], "next": page.next}
        )

    async def finished(self, request: web.Request) -> web.Response:
        try:
            events = self._log()
            kind = optional_choice(request.query, "kind", Subject)
            if kind is Subject.AGENT:
                raise ValidationError.for_field(
                    "kind", "must be a kind of work (task, workflow, room, negotiation, hitl)"
                )
            wanted = text_param(request.query, "q")
            before = optional_cursor(request.query, "before")
            limit = limit_param(request.query, SHOWN, MOST)
            items: dict[int, FinishedItem] = {}

            def keep(event: Event) -> bool:
                item = finished_item(event)
                if item is None or not item.matches(wanted):
                    return False
                items[event.sequence] = item
                return True

            page = await read_back(events, finishing_filter(kind), keep, before, limit)
        except Exception as exc:
            return error_response(exc, request.path)
        return web.json_response(
            {"items": [items[e.sequence].as_json() for e in page.events], "next": page.next}
        )
