"""The HITL invocation lifecycle of RFC 15 as a pure, table-driven machine.

An invocation opens PENDING and ends in one of four terminal states: DECIDED (an operator
approved, denied or modified), TIMED_OUT (the deadline passed: the configured timeout action,
RFC 15.1), FALLBACK_APPLIED (no HITL component could decide: the unavailable policy of RFC 15.3
and 15.4) or CANCELLED (the requester withdrew). A DEFER by an operator or an EXTEND_TIMEOUT
fallback keeps the invocation PENDING with a later deadline.

`HitlMachine` takes a `HitlRecord`, an input and `now` and returns a `HitlStep`: the new record,
the effects the engine performs in order, and the audit event (who, when, why, what changed).
An input the table has no row for raises `IllegalTransitionError` and changes nothing; a bad
or unauthorized input raises an `ApiaryError` and changes nothing.

Decisions this module makes where the RFC is silent:
- Every decision record has the same keys (`DECISION_KEYS`): action, rationale, patch,
  decided_by, decided_at (UTC seconds), via (operator | deadline | unavailable | absent |
  cancelled), fallback (true for deadline, unavailable, absent), policy (as configured),
  applied (what the policy did), error_code. Threshold decisions add score and threshold.
- Automatic outcomes never invent a patch: a suggested "modify" resolves to deny, and so does
  an invocation with no suggestion, except that AUTO_DECIDE_THRESHOLD approves a scored
  proposal that has no suggestion (RFC 15.4: "accept it automatically").
- Deferrals and EXTEND_TIMEOUT share one budget, `HitlPolicy.max_extensions`: nothing keeps
  an invocation open for ever. A deferral past the budget is refused; an unavailable HITL past
  it is denied by default.
- Extensions add to the current deadline. The invocation's original window is derived as
  `(deadline - created_at) / (1 + extensions)` (the record has no field for it), which is exact
  whenever every extension used the default size (`defer_s`/`extend_s` = None).
- An operator decision at or after the deadline is refused with `deadline_exceeded`: the
  deadline is enforced even when the engine's timer has not fired yet.
- A cancelled invocation carries a deny decision so that any waiter fails closed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import Any, Final, TypeVar

from apiary.core.dedup import iso_utc
from apiary.core.hitl_payloads import invocation_payload, plain_json
from apiary.core.records import HitlRecord
from apiary.errors import (
    DeadlineExceededError,
    PermissionDeniedError,
    UnauthenticatedError,
    ValidationError,
)

ADMIN_ROLE: Final = "admin"
"""An operator holding this role may decide every invocation."""
_E = TypeVar("_E", bound=StrEnum)
_T = TypeVar("_T")

SYSTEM_ACTOR: Final = "apiary"
"""`decided_by` and event actor of decisions no person made (deadline, fallbacks)."""
DECISION_KEYS: Final = (
    "action", "rationale", "patch", "decided_by", "decided_at", "via", "fallback", "policy",
    "applied", "error_code",
)  # fmt: skip


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


@dataclass(frozen=True, slots=True)
class HitlPolicy:
    """Deployment policy for HITL invocations (RFC 15.1, 15.3, 15.4)."""

    default_timeout_s: float = 300.0
    timeout_action: TimeoutAction = TimeoutAction.DENY
    unavailable_policy: UnavailablePolicy = UnavailablePolicy.DENY_BY_DEFAULT
    auto_decide_threshold: float = 0.8
    """AUTO_DECIDE_THRESHOLD approves when the score (argument or context["score"]) >= this."""
    extend_s: float | None = None
    """EXTEND_TIMEOUT's extension; None: the invocation's original window (RFC: 1x)."""
    max_extensions: int = 3
    """Deferrals plus EXTEND_TIMEOUT extensions allowed per invocation."""
    defer_s: float | None = None
    """A deferral's extension; None: the invocation's original window."""
    enabled: bool = True
    """False: no HITL component (RFC 15.3); the engine applies `absent` right after `open`."""

    def __post_init__(self) -> None:
        for name in ("default_timeout_s", "extend_s", "defer_s"):
            value = getattr(self, name)
            if value is not None and not (_number(value) and 0 < value < math.inf):
                raise ValidationError.for_field(f"hitl.{name}", "must be a positive duration")
        if not (_number(self.auto_decide_threshold) and math.isfinite(self.auto_decide_threshold)):
            raise ValidationError.for_field("hitl.auto_decide_threshold", "must be a number")
        if isinstance(self.max_extensions, bool) or not isinstance(self.max_extensions, int):
            raise ValidationError.for_field("hitl.max_extensions", "must be an integer")
        if self.max_extensions < 0:
            raise ValidationError.for_field("hitl.max_extensions", "must be >= 0")
        object.__setattr__(self, "timeout_action", parse_timeout_action(self.timeout_action))
        object.__setattr__(
            self, "unavailable_policy", parse_unavailable_policy(self.unavailable_policy)
        )

    @classmethod
    def from_settings(cls, values: Mapping[str, Any]) -> HitlPolicy:
        """A policy from configuration values by field name; enum values may be strings."""
        known = {f.name for f in fields(cls)}
        for key in values:
            if key not in known:
                raise ValidationError.for_field(f"hitl.{key}", "is not a HITL policy setting")
        return cls(**values)


class IllegalTransitionError(Exception):
    """The table has no row for (state, input); nothing changed."""

    def __init__(self, state: HitlState, event: HitlInput) -> None:
        super().__init__(f"no HITL transition from {state} on {event}")
        self.state = state
        self.event = event


@dataclass(frozen=True, slots=True)
class HitlRow:
    """One table entry: the next state, the effects and the audit event type."""

    state: HitlState
    effects: tuple[HitlEffect, ...]
    event_type: str


@dataclass(frozen=True, slots=True)
class HitlStep:
    """A transition's result: the record to store, effects in order, and the audit event.

    `event` is (event type, details); details hold invocation_id, by (who), at (when, UTC
    seconds), why, from_state, to_state and changes ({field: {"from", "to"}}). It is None only
    for a deadline timer that fired early, which changes nothing.
    """

    record: HitlRecord
    effects: tuple[HitlEffect, ...]
    event: tuple[str, dict[str, Any]] | None = None


_S = HitlState
_F = HitlEffect
_I = HitlInput
OPEN_ROW: Final = HitlRow(
    _S.PENDING, (_F.PERSIST, _F.START_TIMER, _F.NOTIFY_OPERATORS, _F.EMIT_EVENT), "hitl.opened"
)
"""What opening does: there is no state before PENDING, so this row is outside the table."""


def _table() -> dict[HitlState, dict[HitlInput, HitlRow]]:
    # Operators are notified of what they did not do themselves; RFC 15.4 asks for an alert
    # on unavailability. A deadline needs no CANCEL_TIMER: its timer is the one that fired.
    rearm, ended = (_F.PERSIST, _F.START_TIMER), (_F.PERSIST, _F.CANCEL_TIMER, _F.RESOLVE)
    notified = (_F.NOTIFY_OPERATORS, _F.EMIT_EVENT)
    pending = {
        _I.DECIDE: HitlRow(_S.DECIDED, (*ended, _F.EMIT_EVENT), "hitl.decided"),
        _I.DEFER: HitlRow(_S.PENDING, (*rearm, _F.EMIT_EVENT), "hitl.deferred"),
        _I.DEADLINE: HitlRow(_S.TIMED_OUT, (_F.PERSIST, _F.RESOLVE, *notified), "hitl.timed_out"),
        _I.EXTEND: HitlRow(_S.PENDING, (*rearm, *notified), "hitl.extended"),
        _I.FALLBACK: HitlRow(_S.FALLBACK_APPLIED, (*ended, *notified), "hitl.fallback"),
        _I.CANCEL: HitlRow(_S.CANCELLED, (*ended, *notified), "hitl.cancelled"),
    }
    return {state: (pending if state is _S.PENDING else {}) for state in _S}


class HitlMachine:
    """The HITL transition table and the transitions that validate and apply it."""

    TABLE: dict[HitlState, dict[HitlInput, HitlRow]] = _table()

    @classmethod
    def row(cls, state: HitlState | str, event: HitlInput) -> HitlRow:
        """The table's row for (state, event); IllegalTransitionError when there is none."""
        found = cls.TABLE[HitlState(state)].get(event)
        if found is None:
            raise IllegalTransitionError(HitlState(state), event)
        return found

    @classmethod
    def allows(cls, state: HitlState | str, event: HitlInput) -> bool:
        return event in cls.TABLE[HitlState(state)]

    @classmethod
    def open(
        cls,
        *,
        invocation_id: str,
        reason_type: HitlReason | str,
        requested_by: str,
        now: float,
        policy: HitlPolicy,
        deadline: float | None = None,
        timeout_s: float | None = None,
        correlation_id: str = "",
        subject: Mapping[str, Any] | None = None,
        context: Mapping[str, Any] | None = None,
        suggested_action: str = "",
        proposed_actions: Iterable[str] = (),
        approver_roles: Iterable[str] = (),
        timeout_action: TimeoutAction | str | None = None,
        priority: int = 0,
    ) -> HitlStep:
        """Validate and open an invocation, PENDING until `deadline` (UTC seconds; else now +
        `timeout_s`, else now + `policy.default_timeout_s`).

        When no HITL component exists (`policy.enabled` False, or no operator configured: only
        the engine knows) the engine applies `absent` next, so nothing waits (RFC 15.3).
        """
        if deadline is not None and timeout_s is not None:
            raise ValidationError.for_field("deadline", "give a deadline or timeout_s, not both")
        window = policy.default_timeout_s if timeout_s is None else timeout_s
        due = now + window if deadline is None else deadline
        if not (_number(due) and math.isfinite(due) and due > now):
            raise ValidationError.for_field("deadline", "must be a finite time after now")
        record = HitlRecord(
            invocation_id=_required(invocation_id, "invocation_id"),
            reason_type=parse_reason(reason_type).value,
            state=HitlState.PENDING.value,
            created_at=now,
            updated_at=now,
            deadline=float(due),
            requested_by=_required(requested_by, "requested_by"),
            correlation_id=_typed(correlation_id, str, "correlation_id"),
            subject=_json_object(subject, "subject"),
            context=_json_object(context, "context"),
            suggested_action=_suggestion(suggested_action),
            proposed_actions=_strings(proposed_actions, "proposed_actions"),
            approver_roles=_strings(approver_roles, "approver_roles"),
            timeout_action=parse_timeout_action(timeout_action or policy.timeout_action).value,
            priority=_typed(priority, int, "priority"),
        )
        return HitlStep(record, OPEN_ROW.effects, _opened_event(record))

    @classmethod
    def decide(
        cls,
        record: HitlRecord,
        action: HitlAction | str,
        *,
        operator: str,
        operator_roles: Iterable[str],
        rationale: str,
        now: float,
        policy: HitlPolicy,
        patch: Mapping[str, Any] | None = None,
    ) -> HitlStep:
        """An operator's decision (RFC 15.1): approve, deny, modify (with a patch) or defer.

        Checks in order: an operator identity (unauthenticated), `authorize` (permission_denied),
        the table (IllegalTransitionError), the deadline (deadline_exceeded), the action,
        the rationale, the patch and the deferral budget (validation_error).
        """
        if not isinstance(operator, str) or not operator.strip():
            raise UnauthenticatedError("a HITL decision needs an authenticated operator")
        authorize(operator_roles, record.approver_roles)
        chosen = parse_action(action)
        event = _I.DEFER if chosen is HitlAction.DEFER else _I.DECIDE
        row = cls.row(record.state, event)
        if now >= record.deadline:
            raise DeadlineExceededError(
                f"the decision deadline passed at {iso_utc(record.deadline)}",
                {"invocation_id": record.invocation_id},
            )
        why = _required(rationale, "rationale")
        plain_patch = _patch(chosen, patch)
        if chosen is HitlAction.DEFER:
            if record.extensions >= policy.max_extensions:
                raise ValidationError.for_field(
                    "action",
                    f"cannot defer: already extended {record.extensions} times "
                    f"(max_extensions={policy.max_extensions})",
                )
            return _extend(record, row, policy.defer_s, now=now, actor=operator, why=why)
        decision = _decision(chosen, why, by=operator, now=now, via="operator", patch=plain_patch)
        return _transition(record, row, now=now, actor=operator, why=why, decision=decision)

    @classmethod
    def deadline_passed(cls, record: HitlRecord, policy: HitlPolicy, now: float) -> HitlStep:
        """The deadline timer fired: apply the invocation's timeout action (RFC 15.1).

        The record's `timeout_action` (fixed at open) wins; the policy's applies when it is
        empty. A timer that fires before `record.deadline` (the deadline moved since it was
        armed) changes nothing and re-arms.
        """
        row = cls.row(record.state, _I.DEADLINE)
        if now < record.deadline:
            return HitlStep(record, (_F.START_TIMER,))
        configured = parse_timeout_action(record.timeout_action or policy.timeout_action)
        action = HitlAction.DENY
        if configured is TimeoutAction.AUTO_RESOLVE:
            action = _automatic(record, default=HitlAction.DENY)
        why = f"no decision by {iso_utc(record.deadline)}: timeout action {configured}"
        decision = _decision(
            action, why, by=SYSTEM_ACTOR, now=now, via="deadline", policy=configured.value,
            applied=configured.value,
            error_code="deadline_exceeded" if action is HitlAction.DENY else None,
        )  # fmt: skip
        return _transition(record, row, now=now, actor=SYSTEM_ACTOR, why=why, decision=decision)

    @classmethod
    def unavailable(
        cls, record: HitlRecord, policy: HitlPolicy, now: float, score: float | None = None
    ) -> HitlStep:
        """No HITL component can take the invocation (RFC 15.4): apply the unavailable policy.

        EXTEND_TIMEOUT keeps it PENDING with a later deadline while the extension budget lasts,
        then behaves as DENY_BY_DEFAULT.
        """
        configured = policy.unavailable_policy
        extend = configured is UnavailablePolicy.EXTEND_TIMEOUT
        if extend and record.extensions < policy.max_extensions:
            row = cls.row(record.state, _I.EXTEND)
            why = "HITL unavailable: EXTEND_TIMEOUT"
            return _extend(record, row, policy.extend_s, now=now, actor=SYSTEM_ACTOR, why=why)
        return _fall_back(record, policy, now, score, via="unavailable")

    @classmethod
    def absent(
        cls, record: HitlRecord, policy: HitlPolicy, now: float, score: float | None = None
    ) -> HitlStep:
        """No HITL component is deployed (RFC 15.3): the unavailable policy decides now.

        EXTEND_TIMEOUT acts as DENY_BY_DEFAULT: there is nobody to wait for.
        """
        return _fall_back(record, policy, now, score, via="absent")

    @classmethod
    def cancel(cls, record: HitlRecord, *, by: str, reason: str, now: float) -> HitlStep:
        """The requester withdrew the invocation; the waiter gets a deny (fails closed)."""
        row = cls.row(record.state, _I.CANCEL)
        actor = _required(by, "by")
        why = _required(reason, "reason")
        decision = _decision(HitlAction.DENY, why, by=actor, now=now, via="cancelled")
        return _transition(record, row, now=now, actor=actor, why=why, decision=decision)


def authorize(operator_roles: Iterable[str], approver_roles: Iterable[str]) -> None:
    """Allow an operator to decide: no approver roles, an admin, or a shared role.

    Otherwise PermissionDeniedError naming the required roles (`details["missing_roles"]`).
    """
    held = _role_set(operator_roles)
    needed = _role_set(approver_roles)
    if not needed or ADMIN_ROLE in held or held & needed:
        return
    missing = ", ".join(sorted(needed))
    raise PermissionDeniedError(
        f"deciding this invocation needs one of the roles: {missing}",
        {"missing_roles": ",".join(sorted(needed))},
    )


def original_window(record: HitlRecord) -> float:
    """The invocation's original decision window, in seconds (see the module docstring)."""
    return (record.deadline - record.created_at) / (1 + record.extensions)


def parse_action(text: object) -> HitlAction:
    """A decision action in any case ("Approve", "DENY"); ValidationError naming "action"."""
    return _parse(HitlAction, text, "action", str.lower)


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


def mermaid() -> str:
    """The state diagram of the table, for the docs."""
    lines = ["stateDiagram-v2", f"    [*] --> {OPEN_ROW.state}: OPEN"]
    for state, row in HitlMachine.TABLE.items():
        lines.extend(f"    {state} --> {step.state}: {event}" for event, step in row.items())
    lines.extend(f"    {s} --> [*]" for s in HitlState if s.terminal)
    return "\n".join(lines) + "\n"


# --- transitions ------------------------------------------------------------------------------


def _transition(
    record: HitlRecord, row: HitlRow, *, now: float, actor: str, why: str, **changes: Any
) -> HitlStep:
    """Apply `row`: new state and fields (`changes`), one audit event naming what changed."""
    new = replace(record, state=row.state.value, updated_at=now, **changes)
    changed = {k: {"from": getattr(record, k), "to": v} for k, v in changes.items()}
    details = {
        "invocation_id": record.invocation_id,
        "reason_type": record.reason_type,
        "by": actor,
        "at": now,
        "why": why,
        "from_state": record.state,
        "to_state": new.state,
        "changes": changed,
    }
    return HitlStep(new, row.effects, (row.event_type, details))


def _extend(
    record: HitlRecord, row: HitlRow, size: float | None, *, now: float, actor: str, why: str
) -> HitlStep:
    deadline = record.deadline + (original_window(record) if size is None else size)
    extensions = record.extensions + 1
    return _transition(
        record, row, now=now, actor=actor, why=why, deadline=deadline, extensions=extensions
    )


def _fall_back(
    record: HitlRecord, policy: HitlPolicy, now: float, score: float | None, *, via: str
) -> HitlStep:
    """Decide by the unavailable policy; EXTEND_TIMEOUT here has nothing left to wait for."""
    row = HitlMachine.row(record.state, _I.FALLBACK)
    configured = policy.unavailable_policy
    extras: dict[str, Any] = {}
    action = HitlAction.DENY
    applied = UnavailablePolicy.DENY_BY_DEFAULT
    if configured is UnavailablePolicy.AUTO_DECIDE_THRESHOLD:
        applied = configured
        value = _score(record, score)
        extras = {"score": value, "threshold": policy.auto_decide_threshold}
        if value is not None and value >= policy.auto_decide_threshold:
            action = _automatic(record, default=HitlAction.APPROVE)
    why = f"HITL {via}; policy {configured}: {action}"
    if configured is UnavailablePolicy.EXTEND_TIMEOUT:
        left = "nothing to wait for" if via == "absent" else f"{record.extensions} extensions used"
        why += f" by default ({left})"
    elif extras:
        why += f" (score {extras['score']}, threshold {policy.auto_decide_threshold})"
    decision = _decision(
        action, why, by=SYSTEM_ACTOR, now=now, via=via, policy=configured.value,
        applied=applied.value,
        error_code="hitl_unavailable" if action is HitlAction.DENY else None, **extras,
    )  # fmt: skip
    return _transition(record, row, now=now, actor=SYSTEM_ACTOR, why=why, decision=decision)


def _decision(
    action: HitlAction, rationale: str, *, by: str, now: float, via: str, **rest: Any
) -> dict[str, Any]:
    """A decision with every key of DECISION_KEYS (None where it does not apply)."""
    fixed = {"action": action.value, "rationale": rationale, "decided_by": by}
    fallback = via in {"deadline", "unavailable", "absent"}
    return {**_UNSET, **fixed, "decided_at": now, "via": via, "fallback": fallback, **rest}


_UNSET: Final = dict.fromkeys(DECISION_KEYS)


def _automatic(record: HitlRecord, *, default: HitlAction) -> HitlAction:
    """The suggested action as an automatic outcome; no patch can be invented for modify."""
    if not record.suggested_action:
        return default
    return HitlAction.APPROVE if record.suggested_action == "approve" else HitlAction.DENY


def _score(record: HitlRecord, score: float | None) -> float | None:
    """The score argument, else a numeric context["score"], else None (below any threshold)."""
    if score is not None:
        if not (_number(score) and math.isfinite(score)):
            raise ValidationError.for_field("score", "must be a finite number")
        return float(score)
    found: Any = record.context.get("score")
    return float(found) if _number(found) and math.isfinite(found) else None


def _opened_event(record: HitlRecord) -> tuple[str, dict[str, Any]]:
    details = invocation_payload(record)
    # The context can be large and stays in the record: the audit names its keys. The
    # correlation id belongs to the event itself, not to its details.
    details["context"] = sorted(record.context)
    del details["correlation_id"]
    details.update(by=record.requested_by, at=record.created_at, why=record.reason_type)
    details.update(from_state=None, to_state=record.state)
    return OPEN_ROW.event_type, details


# --- validation -------------------------------------------------------------------------------


def _patch(action: HitlAction, patch: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if action is HitlAction.MODIFY:
        if patch is None:
            raise ValidationError.for_field("patch", "a modify decision needs a patch")
        return _json_object(patch, "patch")
    if patch is not None:
        raise ValidationError.for_field(
            "patch", f"only a modify decision carries one, not {action}"
        )
    return None


def _suggestion(value: object) -> str:
    if value == "":
        return ""
    found = _parse(HitlAction, value, "suggested_action", str.lower)
    if found is HitlAction.DEFER:
        raise ValidationError.for_field("suggested_action", "must be approve, deny or modify")
    return found.value


def _required(value: object, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValidationError.for_field(name, "is required")
    return value


def _typed(value: object, kind: type[_T], name: str) -> _T:
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValidationError.for_field(name, f"must be a {kind.__name__}")
    return value


def _strings(values: Iterable[str], name: str) -> tuple[str, ...]:
    if isinstance(values, str):
        raise ValidationError.for_field(name, "must be a list of strings")
    items = tuple(values)
    for item in items:
        _required(item, name)
    return tuple(dict.fromkeys(items))


def _role_set(roles: Iterable[str]) -> frozenset[str]:
    # A bare string is one role, not a set of one-letter roles.
    return frozenset((roles,) if isinstance(roles, str) else roles)


def _json_object(value: object, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValidationError.for_field(name, "must be a JSON object")
    plain: dict[str, Any] = plain_json(value, name)
    return plain


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _upper_name(text: str) -> str:
    return text.upper().replace("-", "_")


def _parse(enum: type[_E], value: object, name: str, fold: Callable[[str], str]) -> _E:
    """The member of `enum` whose value is `fold(value.strip())`, or ValidationError."""
    found = enum._value2member_map_.get(fold(value.strip())) if isinstance(value, str) else None
    if isinstance(found, enum):
        return found
    names = ", ".join(m.value for m in enum)
    raise ValidationError.for_field(name, f"must be one of {names}, got {value!r}")
