"""Shared task queues: a task may name a capability or an agent type instead of an agent; it
waits in that queue, and any RUNNABLE agent offering the capability (or of that type) takes
it (docs/scheduler.md, "Shared queues").

A queue is named `capability:<name>` or `agent_type:<name>`: the capability as agents list
it in their descriptors (`AgentDescriptor.capabilities`), the type as their descriptor's
`name`. Names follow the descriptor's rules for a capability: not empty, at most 256
characters, no whitespace or control characters. The same name may be both a capability
and a type; the kind keeps the two queues apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from apiary.core.descriptor import MAX_CAPABILITY_LENGTH
from apiary.errors import ValidationError

CAPABILITY: Final = "capability"
AGENT_TYPE: Final = "agent_type"
KINDS: Final = (CAPABILITY, AGENT_TYPE)


def _checked_name(value: str, field: str) -> str:
    if len(value) > MAX_CAPABILITY_LENGTH:
        raise ValidationError.for_field(field, f"is longer than {MAX_CAPABILITY_LENGTH} characters")
    if any(ch.isspace() or not ch.isprintable() for ch in value):
        raise ValidationError.for_field(
            field, f"must not contain whitespace or controls, got {value[:40]!r}"
        )
    return value


def queue_name(*, agent_id: str = "", capability: str = "", agent_type: str = "") -> str:
    """The shared queue a submission names ('' for one that names an agent).

    Exactly one of `agent_id`, `capability` and `agent_type` is given: ValidationError naming
    `agent_id` when none is, naming the second one when two are, naming the field whose
    value is not a valid name."""
    given = [(f, v) for f, v in (("agent_id", agent_id), (CAPABILITY, capability),
                                 (AGENT_TYPE, agent_type)) if v]  # fmt: skip
    if not given:
        raise ValidationError.for_field(
            "agent_id", "is required: name an agent, or a capability or agent type any of "
            "whose agents may take the task",
        )  # fmt: skip
    if len(given) > 1:
        first, second = given[0][0], given[1][0]
        raise ValidationError.for_field(
            second, f"names who runs the task, as {first} does: give one of them"
        )
    field, value = given[0]
    if field == "agent_id":
        return ""
    return f"{field}:{_checked_name(value, field)}"


def queue_parts(queue: str) -> tuple[str, str]:
    """(kind, name) of a queue's name; ValueError for one that is not a queue's name."""
    kind, sep, name = queue.partition(":")
    if not sep or kind not in KINDS or not name:
        raise ValueError(f"not a shared queue: {queue!r}")
    return kind, name


def queues_served(capabilities: Iterable[str], agent_type: str) -> tuple[str, ...]:
    """The shared queues an agent with these capabilities and this type takes tasks from."""
    served = [f"{CAPABILITY}:{c}" for c in capabilities if c]
    if agent_type:
        served.append(f"{AGENT_TYPE}:{agent_type}")
    return tuple(dict.fromkeys(served))


def describe(queue: str) -> str:
    """How messages name a queue: "capability 'review'", "agent type 'coder'"."""
    kind, name = queue_parts(queue)
    return f"{'capability' if kind == CAPABILITY else 'agent type'} {name!r}"
