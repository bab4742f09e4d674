"""Which message fires an EVENT-triggered workflow node (RFC 17.7 "Trigger Types").

Events are messages addressed to the coordinator-internal participant `workflow` (recipient
metadata `sw4rm-recipient: workflow`, or `"to": "workflow"` in a JSON payload). A node's
metadata says what it waits for; every criterion given must hold:

- `event_type`: the envelope's message type name (`DATA`, `NOTIFICATION`, `CONTROL`, ...);
- `event_producer`: the envelope's producer_id;
- `event_correlation_id`: the envelope's correlation_id;
- `event_match`: a JSON object of {path: value}; the JSON payload must hold each value at its
  path (paths as in core/workflow/data.py: `kind`, `$.file.ext`).

A node that gives none of them waits for a JSON payload naming it: `{"workflow_id": W,
"node_id": N}`. In every case a payload with a `workflow_id` (or `node_id`) field only
reaches that workflow (or node), so one message can be aimed at one run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from apiary.core.workflow.data import MissingPathError, Path, lookup, parse_path
from apiary.errors import ValidationError

MESSAGE_TYPES: Final = frozenset({
    "CONTROL", "DATA", "HEARTBEAT", "NOTIFICATION", "ACKNOWLEDGEMENT", "HITL_INVOCATION",
    "WORKTREE_CONTROL", "NEGOTIATION", "TOOL_CALL", "TOOL_RESULT", "TOOL_ERROR",
})  # fmt: skip
EVENT_KEYS: Final = ("event_type", "event_producer", "event_correlation_id", "event_match")


@dataclass(frozen=True, slots=True)
class EventMessage:
    """What the matcher sees of an arriving message."""

    message_id: str
    message_type: str
    producer_id: str
    correlation_id: str
    content_type: str
    payload: bytes

    def json(self) -> Any:
        """The payload decoded as JSON; None when it is not JSON."""
        try:
            return json.loads(self.payload)
        except ValueError:
            return None

    def summary(self) -> dict[str, Any]:
        """The message as a node sees it in its input (`event`) and its NodeState."""
        body = self.json()
        if body is None:
            body = self.payload.decode("utf-8", errors="replace")
        return {
            "message_id": self.message_id,
            "message_type": self.message_type,
            "producer_id": self.producer_id,
            "correlation_id": self.correlation_id,
            "content_type": self.content_type,
            "payload": body,
        }


@dataclass(frozen=True, slots=True)
class EventMatch:
    """The criteria of one EVENT node (module docstring); empty ones are not checked."""

    message_type: str = ""
    producer_id: str = ""
    correlation_id: str = ""
    fields: tuple[tuple[Path, str, Any], ...] = ()
    """(path, path as written, expected value)."""

    @property
    def explicit(self) -> bool:
        return bool(self.message_type or self.producer_id or self.correlation_id or self.fields)


def parse_event_match(metadata: Mapping[str, str], field: str) -> EventMatch:
    """The criteria in a node's metadata; ValidationError naming `field.<key>`."""
    kind = metadata.get("event_type", "").strip().upper()
    if kind and kind not in MESSAGE_TYPES:
        raise ValidationError.for_field(
            f"{field}.event_type",
            f"{kind!r} is not a message type ({', '.join(sorted(MESSAGE_TYPES))})",
        )
    fields: list[tuple[Path, str, Any]] = []
    raw = metadata.get("event_match", "")
    if raw.strip():
        try:
            wanted = json.loads(raw)
        except ValueError as exc:
            raise ValidationError.for_field(f"{field}.event_match", f"is not JSON: {exc}") from None
        if not isinstance(wanted, dict) or not wanted:
            raise ValidationError.for_field(
                f"{field}.event_match", "must be a non-empty JSON object of {path: value}"
            )
        for path, value in wanted.items():
            fields.append((parse_path(path, f"{field}.event_match"), path, value))
    return EventMatch(
        message_type=kind,
        producer_id=metadata.get("event_producer", "").strip(),
        correlation_id=metadata.get("event_correlation_id", "").strip(),
        fields=tuple(fields),
    )


def event_matches(match: EventMatch, message: EventMessage, workflow_id: str, node_id: str) -> bool:
    """Whether `message` fires node `node_id` of workflow `workflow_id` (module docstring)."""
    body = message.json()
    if isinstance(body, dict):
        for key, own in (("workflow_id", workflow_id), ("node_id", node_id)):
            if key in body and body[key] != own:
                return False
    if not match.explicit:
        return (
            isinstance(body, dict)
            and body.get("workflow_id") == workflow_id
            and body.get("node_id") == node_id
        )
    if match.message_type and message.message_type != match.message_type:
        return False
    if match.producer_id and message.producer_id != match.producer_id:
        return False
    if match.correlation_id and message.correlation_id != match.correlation_id:
        return False
    for path, text, expected in match.fields:
        try:
            if lookup(body, path, text) != expected:
                return False
        except MissingPathError:
            return False
    return True
