"""Runtime events in Apiary's one event log (DESIGN.md section 7).

A runtime fact is logged as an event of the `runtime.` family (`runtime.turn.submitted`, ...)
whose correlation id is its session's id, so that a session's stream is one indexed read of
the log (`session_filter`), and whose agent id is the thread's agent. Its details are the
contract event's properties but `type`, `timestamp` and `sequence`, which the log's own
type, time and sequence give back (`runtime_event`): the channel's sequence numbers are the
log's, increasing along a session's stream (with gaps: other sessions' and other parts'
events lie between).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from apiary.core.dedup import iso_utc
from apiary.core.events import Event, EventFilter
from apiary.core.runtime.events import RuntimeEvent

FAMILY: Final = "runtime."
SCHEMA_VERSION: Final = "apiary-runtime-0.1"
"""The `schemaVersion` of the runtime's events and snapshots."""


@dataclass(frozen=True, slots=True)
class Fact:
    """A runtime event before the log numbers it: its contract type and properties."""

    type: str
    session_id: str
    thread_id: str = ""
    turn_id: str = ""
    task_id: str = ""
    run_id: str = ""
    channel_id: str = ""
    status: str = ""
    status_reason: str = ""
    payload: Mapping[str, Any] | None = None
    agent_id: str = ""
    """The thread's agent: the log event's agent id (not a contract property)."""
    extra: Mapping[str, Any] = field(default_factory=dict)


def log_type(event_type: str) -> str:
    """The log's event type of a contract event type."""
    return FAMILY + event_type


def details(fact: Fact, event_id: str, runtime_id: str) -> dict[str, Any]:
    """The log event's details of `fact` (see the module docstring)."""
    out: dict[str, Any] = {
        "eventId": event_id,
        "schemaVersion": SCHEMA_VERSION,
        "runtimeId": runtime_id,
        "sessionId": fact.session_id,
    }
    for key, value in (
        ("threadId", fact.thread_id), ("turnId", fact.turn_id), ("taskId", fact.task_id),
        ("runId", fact.run_id), ("channelId", fact.channel_id), ("status", fact.status),
        ("statusReason", fact.status_reason),
    ):  # fmt: skip
        if value:
            out[key] = value
    if fact.payload is not None:
        out["payload"] = dict(fact.payload)
    for key, value in fact.extra.items():
        out.setdefault(key, value)
    return out


def session_filter(session_id: str) -> EventFilter:
    """The log's events of one session's stream."""
    return EventFilter(correlation_id=session_id, event_types=frozenset({FAMILY}))


def is_runtime(event: Event) -> bool:
    return event.event_type.startswith(FAMILY)


def runtime_event(event: Event) -> RuntimeEvent:
    """The contract event a logged runtime event is (ValueError for another family)."""
    if not is_runtime(event):
        raise ValueError(f"{event.event_type} is not a runtime event")
    doc = {
        **event.details,
        "type": event.event_type[len(FAMILY) :],
        "timestamp": iso_utc(event.ts),
        "sequence": event.sequence,
    }
    return RuntimeEvent.from_json(doc)
