"""Work in the event log: which events are the history of an agent, a task, a workflow run,
a negotiation room, a negotiation or a HITL invocation, and which event finishes each kind of
work (the operator console's pages and its list of finished work).

A subject's history is what the coordinator recorded about it (DESIGN.md section 7):

- agent: the events whose agent_id is the agent's (its registration, lifecycle, messages it
  received or acknowledged, its tasks' progress);
- task, workflow, room, negotiation: the events correlated by the subject's id. A task's
  transitions carry its task id (and so do the messages of a task submitted without a
  correlation id of its own); a workflow's node events and its tasks' messages carry the
  workflow id; a room's proposals, votes and decisions its room id; a negotiation's rounds its
  negotiation id;
- hitl: the events naming the invocation (`details.invocation_id`) among those correlated
  like the invocation, or among the HITL events when it has no correlation id.

Finished work is read from the events that end it: the terminal rows of the task, HITL, room
and negotiation machines, and a workflow's `workflow.<status>` for each finished status. Each
becomes a `FinishedItem`: what the list shows and what a search looks in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

from apiary.core.events import Event, EventFilter
from apiary.core.hitl.machine import HitlMachine
from apiary.core.negotiation.machine import NegotiationMachine
from apiary.core.rooms.machine import RoomMachine
from apiary.core.tasks.machine import TaskMachine
from apiary.core.workflow.run import WorkflowStatus


class Subject(StrEnum):
    """What a console page is about."""

    AGENT = "agent"
    TASK = "task"
    WORKFLOW = "workflow"
    ROOM = "room"
    NEGOTIATION = "negotiation"
    HITL = "hitl"


@dataclass(frozen=True, slots=True)
class HistoryQuery:
    """The events of one subject: those `where` selects that `keeps` keeps."""

    where: EventFilter
    invocation_id: str = ""
    """For a HITL invocation: only the events naming it."""

    def keeps(self, event: Event) -> bool:
        return not self.invocation_id or event.details.get("invocation_id") == self.invocation_id


HITL_EVENTS: Final = EventFilter(event_types=frozenset({"hitl."}))


def history_query(subject: Subject, subject_id: str, correlation_id: str = "") -> HistoryQuery:
    """The query of `subject_id`'s history; for a HITL invocation `correlation_id` is the
    invocation's own ('' when it has none)."""
    if subject is Subject.AGENT:
        return HistoryQuery(EventFilter(agent_id=subject_id))
    if subject is Subject.HITL:
        where = EventFilter(correlation_id=correlation_id) if correlation_id else HITL_EVENTS
        return HistoryQuery(where, invocation_id=subject_id)
    return HistoryQuery(EventFilter(correlation_id=subject_id))


def _ending(table: Mapping[Any, Mapping[Any, Any]], name: str) -> frozenset[str]:
    """The event types of a machine's rows that end in a terminal state."""
    return frozenset(
        getattr(row, name) for rows in table.values() for row in rows.values() if row.state.terminal
    )


FINISHING: Final[Mapping[Subject, frozenset[str]]] = MappingProxyType(
    {
        Subject.TASK: _ending(TaskMachine.TABLE, "event"),
        Subject.WORKFLOW: frozenset(
            f"workflow.{status.value.lower()}" for status in WorkflowStatus if status.finished
        ),
        Subject.ROOM: _ending(RoomMachine.TABLE, "event_type"),
        Subject.NEGOTIATION: _ending(NegotiationMachine.TABLE, "event_type"),
        Subject.HITL: _ending(HitlMachine.TABLE, "event_type"),
    }
)
"""Per kind of work, the event types that finish it (agents are not work: they leave)."""
_KIND_OF: Final = {event_type: kind for kind, types in FINISHING.items() for event_type in types}


def finishing_filter(kind: Subject | None = None) -> EventFilter:
    """The events that finish work of `kind` (every kind: None)."""
    kinds = FINISHING if kind is None else {kind: FINISHING[kind]}
    return EventFilter(event_types=frozenset().union(*kinds.values()))


@dataclass(frozen=True, slots=True)
class FinishedItem:
    """One piece of finished work, as the event that finished it tells."""

    kind: Subject
    id: str
    """The id its page is opened with (a room's for a decided proposal)."""
    state: str
    sequence: int
    ts: float
    agent_id: str = ""
    detail: str = ""
    """Within the kind: the proposal's artifact id; empty for the others."""
    summary: str = ""

    def matches(self, query: str) -> bool:
        """Whether a search for `query` finds it: its id, detail, agent, state, summary or
        kind contains it anywhere, ignoring case (an empty query finds everything)."""
        wanted = query.strip().casefold()
        if not wanted:
            return True
        fields = (self.id, self.detail, self.agent_id, self.state, self.summary, self.kind.value)
        return any(wanted in field.casefold() for field in fields if field)

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value, "id": self.id, "state": self.state,
            "sequence": self.sequence, "ts": self.ts, "agent_id": self.agent_id,
            "detail": self.detail, "summary": self.summary,
        }  # fmt: skip


def _text(details: Mapping[str, Any], *keys: str) -> str:
    """The first of `keys` that holds something, as text."""
    for key in keys:
        value = details.get(key)
        if value not in (None, "", [], {}):
            return str(value)
    return ""


def finished_item(event: Event) -> FinishedItem | None:
    """What `event` finished, or None when it finishes nothing."""
    kind = _KIND_OF.get(event.event_type)
    if kind is None:
        return None
    d = event.details
    state = _text(d, "state", "status", "to_state", "outcome") or event.event_type.partition(".")[2]
    agent_id, detail, summary = event.agent_id, "", ""
    if kind is Subject.TASK:
        subject_id, summary = _text(d, "task_id"), _text(d, "error_code", "note")
    elif kind is Subject.WORKFLOW:
        subject_id, agent_id = _text(d, "workflow_id"), ""
    elif kind is Subject.ROOM:
        subject_id, detail = _text(d, "negotiation_room_id"), _text(d, "artifact_id")
        agent_id, summary = _text(d, "producer_id") or agent_id, _text(d, "reason")
    elif kind is Subject.NEGOTIATION:
        subject_id = _text(d, "negotiation_id")
        summary = _text(d, "rationale", "stop_reason", "reason", "why")
    else:
        subject_id = _text(d, "invocation_id")
        summary = " · ".join(filter(None, (_text(d, k) for k in ("reason_type", "by", "why"))))
    return FinishedItem(
        kind, subject_id or event.correlation_id, state.upper(), event.sequence, event.ts,
        agent_id, detail, summary,
    )  # fmt: skip
