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

from collections.abc import Iterable
from dataclasses import replace

from apiary.core.events import Event
from apiary.core.history import Subject, history_query
from apiary.core.limits import quote
from apiary.core.workflow.run import WorkflowStatus, WorkflowSummary
from apiary.engine.eventlog import EventRecorder
from apiary.errors import NotFoundError, ValidationError
from apiary.store.protocols import WorkflowStore


class WorkflowReads:
    """Workflow listings and run histories."""

    def __init__(self, store: WorkflowStore, events: EventRecorder) -> None:
        self._store = store
        self._events = events

    async def summaries(
        self, states: Iterable[str] | None = None, after_id: str = "", limit: int = 100
    ) -> tuple[list[WorkflowSummary], str]:
        """The runs in `states` (every state when None) by workflow id after `after_id`, at
        most `limit`, and the next page's cursor ('' after the last page). A state that does
        not exist is a ValidationError naming `states`."""
        _check_limit(limit)
        wanted = None
        if states is not None:
            wanted = frozenset(states)
            for state in sorted(wanted):
                if state not in WorkflowStatus.__members__:
                    names = ", ".join(WorkflowStatus)
                    raise ValidationError.for_field(
                        "states", f"must be among {names}, not {quote(state)}"
                    )
        found = list(await self._store.summaries(wanted, after_id, limit + 1))
        more = len(found) > limit
        del found[limit:]
        return found, found[-1].workflow_id if more else ""

    async def history(
        self, workflow_id: str, after: int = 0, limit: int = 100,
        event_types: frozenset[str] | None = None,
    ) -> tuple[list[Event], int]:  # fmt: skip
        """The run's events after sequence `after`, oldest first, at most `limit`, of
        `event_types` (all when None; a type ending with "." names a family), and the next
        page's cursor (0 after the last page). NotFoundError for an unknown workflow."""
        if not workflow_id:
            raise ValidationError.for_field("workflow_id", "is required")
        _check_limit(limit)
        if await self._store.summary(workflow_id) is None:
            raise NotFoundError(f"no workflow {workflow_id!r}", {"workflow_id": workflow_id})
        where = replace(history_query(Subject.WORKFLOW, workflow_id).where, event_types=event_types)
        found = await self._events.read(after=after, limit=limit + 1, where=where)
        more = len(found) > limit
        del found[limit:]
        return found, found[-1].sequence if more else 0


def _check_limit(limit: int) -> None:
    if limit < 1:
        raise ValidationError.for_field("limit", f"must be at least 1, not {limit}")
