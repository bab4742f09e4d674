"""Value types of the event log (DESIGN.md section 7, RFC section 19)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from apiary.core.value import value
from apiary.errors import ValidationError

MAX_EVENT_TYPES: Final = 100
"""The most event types (or families) one filter may name: a read names a few; each is a
term of the store's query, which a database bounds (SQLite's expression depth)."""

JsonObject = Mapping[str, Any]


@value
class EventDraft:
    """An event before the log has given it a sequence number."""

    event_type: str
    actor: str
    ts: float
    """UTC wall time, seconds since the epoch, read from the injected clock."""
    correlation_id: str = ""
    agent_id: str = ""
    details: JsonObject = field(default_factory=dict)
    hlc: str = ""


@value
class Event:
    """One appended event; `sequence` is gap-free and strictly increasing from 1."""

    sequence: int
    event_type: str
    actor: str
    ts: float
    correlation_id: str = ""
    agent_id: str = ""
    details: JsonObject = field(default_factory=dict)
    hlc: str = ""

    @classmethod
    def from_draft(cls, sequence: int, draft: EventDraft) -> Event:
        d = draft  # positional: keywords cost a lookup each, and every event comes here
        return cls(
            sequence, d.event_type, d.actor, d.ts, d.correlation_id, d.agent_id, d.details, d.hlc
        )


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Conjunctive filter over events; a field left as None matches everything. An event type
    that ends with a dot names a family: `task.` matches `task.submitted`, `task.failed`, ..."""

    correlation_id: str | None = None
    agent_id: str | None = None
    event_types: frozenset[str] | None = None
    before: int | None = None
    """Only events with a sequence below this one (a read backwards in windows)."""

    def __post_init__(self) -> None:
        if self.event_types is not None and len(self.event_types) > MAX_EVENT_TYPES:
            raise ValidationError.for_field(
                "event_types",
                f"names {len(self.event_types)} types; at most {MAX_EVENT_TYPES} per read",
            )

    def matches(self, event: Event) -> bool:
        if self.before is not None and event.sequence >= self.before:
            return False
        if self.correlation_id is not None and event.correlation_id != self.correlation_id:
            return False
        if self.agent_id is not None and event.agent_id != self.agent_id:
            return False
        if self.event_types is None or event.event_type in self.event_types:
            return True
        return any(t.endswith(".") and event.event_type.startswith(t) for t in self.event_types)
