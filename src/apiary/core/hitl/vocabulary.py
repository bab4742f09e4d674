"""The words of a HITL invocation (RFC 15): its states, the operators' actions, the reason
types, the timeout and unavailable policies, the machine's inputs and effects, and the parsers
that read them from a request in any case."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import TypeVar

from apiary.errors import ValidationError

_E = TypeVar("_E", bound=StrEnum)


class HitlState(StrEnum):
    """Lifecycle states of a HITL invocation (stored in `HitlRecord.state`)."""

    PENDING = "PENDING"
    DECIDED = "DECIDED"
    TIMED_OUT = "TIMED_OUT"
    FALLBACK_APPLIED = "FALLBACK_APPLIED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self is not HitlState.PENDING


class HitlAction(StrEnum):
    """An operator's decision, lower-case on the wire (RFC 15.1)."""

    APPROVE = "approve"
    DENY = "deny"
    MODIFY = "modify"
    DEFER = "defer"


class HitlReason(StrEnum):
    """The reason types of RFC 15: `sw4rm.common.HitlReasonType`, same names and order."""

    CONFLICT = "CONFLICT"
    SECURITY_APPROVAL = "SECURITY_APPROVAL"
    TASK_ESCALATION = "TASK_ESCALATION"
    MANUAL_OVERRIDE = "MANUAL_OVERRIDE"
    WORKTREE_OVERRIDE = "WORKTREE_OVERRIDE"
    DEBATE_DEADLOCK = "DEBATE_DEADLOCK"
    TOOL_PRIVILEGE_ESCALATION = "TOOL_PRIVILEGE_ESCALATION"
    CONNECTOR_APPROVAL = "CONNECTOR_APPROVAL"


class TimeoutAction(StrEnum):
    """What the deadline applies (RFC 15.1: deny-by-default or auto-resolve)."""

    DENY = "DENY"
    AUTO_RESOLVE = "AUTO_RESOLVE"
    """The suggested action (deny when there is none or it is "modify")."""


class UnavailablePolicy(StrEnum):
    """`hitl_unavailable_policy` (RFC 15.4)."""

    DENY_BY_DEFAULT = "DENY_BY_DEFAULT"
    AUTO_DECIDE_THRESHOLD = "AUTO_DECIDE_THRESHOLD"
    EXTEND_TIMEOUT = "EXTEND_TIMEOUT"


class HitlEffect(StrEnum):
    """What the engine does after a step, in the order the step lists them."""

    PERSIST = "PERSIST"
    """Store the step's record."""
    START_TIMER = "START_TIMER"
    """(Re-)arm the deadline timer at `record.deadline`."""
    CANCEL_TIMER = "CANCEL_TIMER"
    RESOLVE = "RESOLVE"
    """Wake the party waiting on the invocation with `record.decision`."""
    NOTIFY_OPERATORS = "NOTIFY_OPERATORS"
    """Tell operators about something they did not do themselves (new, expired, fallback)."""
    EMIT_EVENT = "EMIT_EVENT"
    """Append the step's event to the event log (the audit trail)."""


class HitlInput(StrEnum):
    """Inputs of the table; the machine's methods choose one each."""

    DECIDE = "DECIDE"
    """An operator approves, denies or modifies."""
    DEFER = "DEFER"
    DEADLINE = "DEADLINE"
    EXTEND = "EXTEND"
    """HITL unavailable under EXTEND_TIMEOUT with budget left."""
    FALLBACK = "FALLBACK"
    """HITL unavailable or absent: the unavailable policy decides."""
    CANCEL = "CANCEL"


def parse_action(text: object, name: str = "action") -> HitlAction:
    """A decision action in any case ("Approve", "DENY"); ValidationError naming `name`."""
    return _parse(HitlAction, text, name, str.lower)


def parse_reason(value: object) -> HitlReason:
    """A reason type by name in any case, or by proto number 1..8."""
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= len(HitlReason):
        return list(HitlReason)[value - 1]
    return _parse(HitlReason, value, "reason_type", str.upper)


def parse_timeout_action(value: object) -> TimeoutAction:
    """DENY or AUTO_RESOLVE in any case, with "-" or "_"."""
    return _parse(TimeoutAction, value, "timeout_action", _upper_name)


def parse_unavailable_policy(value: object) -> UnavailablePolicy:
    """A `hitl_unavailable_policy` value in any case, with "-" or "_"."""
    return _parse(UnavailablePolicy, value, "hitl_unavailable_policy", _upper_name)


def _upper_name(text: str) -> str:
    return text.upper().replace("-", "_")


def _parse(enum: type[_E], value: object, name: str, fold: Callable[[str], str]) -> _E:
    """The member of `enum` whose value is `fold(value.strip())`, or ValidationError."""
    found = enum._value2member_map_.get(fold(value.strip())) if isinstance(value, str) else None
    if isinstance(found, enum):
        return found
    names = ", ".join(m.value for m in enum)
    raise ValidationError.for_field(name, f"must be one of {names}, got {value!r}")
