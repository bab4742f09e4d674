"""What ListWorkflows and a workflow run's history read (docs/workflows.md).

Both page with a cursor, the position after which the next page starts: a listing by
workflow id (the last id of the previous page), a history by event sequence. A page holds at
most `limit` items and names the cursor of the next one, empty (or 0) when it was the last:
one more item than asked for is read to know.

Every change to a run is stored before it is acted on, so the store's summaries are as
current as the engine's memory. A run's history is what core/history.py says it is, as the
console shows it: the events correlated by the workflow id, the `workflow.*` events the
engine records and the `message.*` events of its nodes' task envelopes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from typing import TypeVar

from apiary.core.events import Event
from apiary.core.history import Subject, history_query
from apiary.core.limits import check_members
from apiary.core.workflow.run import WorkflowStatus, WorkflowSummary
from apiary.engine.eventlog import EventRecorder
from apiary.errors import NotFoundError, ValidationError
from apiary.store.protocols import WorkflowStore

T = TypeVar("T")
C = TypeVar("C")


class WorkflowReads:
    """Workflow listings and run histories."""

    def __init__(self, store: WorkflowStore, events: EventRecorder) -> None:
        self._store = store
        self._events = events

    async def summaries(
        self, states: Iterable[str] | None = None, after_id: str = "", limit: int = 100
    ) -> tuple[list[WorkflowSummary], str]:
        """The runs in `states` (every state when None) by workflow id after `after_id`, at
        most `limit` (at least 1, else a ValidationError naming `limit`), and the next page's
        cursor ('' after the last page). A state that does not exist is a ValidationError
        naming `states`."""
        wanted = None if states is None else check_members(states, WorkflowStatus, "states")
        return await _paged(
            lambda n: self._store.summaries(wanted, after_id, n), limit,
            lambda summary: summary.workflow_id, "",
        )  # fmt: skip

    async def history(
        self, workflow_id: str, after: int = 0, limit: int = 100,
        event_types: frozenset[str] | None = None,
    ) -> tuple[list[Event], int]:  # fmt: skip
        """The run's events after sequence `after`, oldest first, at most `limit` (at least 1),
        of `event_types` (all when None; a type ending with "." names a family), and the next
        page's cursor (0 after the last page). NotFoundError for an unknown workflow."""
        if not workflow_id:
            raise ValidationError.for_field("workflow_id", "is required")
        if await self._store.summary(workflow_id) is None:
            raise NotFoundError(f"no workflow {workflow_id!r}", {"workflow_id": workflow_id})
        where = replace(history_query(Subject.WORKFLOW, workflow_id).where, event_types=event_types)
        return await _paged(
            lambda n: self._events.read(after=after, limit=n, where=where), limit,
            lambda event: event.sequence, 0,
        )  # fmt: skip


async def _paged(
    read: Callable[[int], Awaitable[Sequence[T]]], limit: int, cursor: Callable[[T], C], end: C
) -> tuple[list[T], C]:
    """A page of at most `limit` (>= 1) items from `read(n)`, which reads at most n: one more
    is read to know whether another page follows. The page, and the next one's cursor: the
    `cursor` of its last item, or `end` after the last page."""
    if limit < 1:
        raise ValidationError.for_field("limit", f"must be at least 1, not {limit}")
    found = list(await read(limit + 1))
    if len(found) <= limit:
        return found, end
    del found[limit:]
    return found, cursor(found[-1])
