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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from apiary.core.dedup import iso_utc
from apiary.core.hitl.payloads import invocation_payload
from apiary.core.hitl.policy import HitlPolicy, authorize
from apiary.core.hitl.validation import (
    checked_patch,
    json_object,
    number,
    required,
    strings,
    suggestion,
    typed,
)
from apiary.core.hitl.vocabulary import (
    HitlAction,
    HitlEffect,
    HitlInput,
    HitlReason,
    HitlState,
    TimeoutAction,
    UnavailablePolicy,
    parse_action,
    parse_reason,
    parse_timeout_action,
)
from apiary.core.machine import TransitionTable
from apiary.core.records import HitlRecord
from apiary.errors import DeadlineExceededError, UnauthenticatedError, ValidationError

SYSTEM_ACTOR: Final = "apiary"
"""`decided_by` and event actor of decisions no person made (deadline, fallbacks)."""
DECISION_KEYS: Final = (
    "action", "rationale", "patch", "decided_by", "decided_at", "via", "fallback", "policy",
    "applied", "error_code",
)  # fmt: skip


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
    TRANSITIONS: TransitionTable[HitlState, HitlInput, HitlRow] = TransitionTable(TABLE, "HITL")

    @classmethod
    def row(cls, state: HitlState | str, event: HitlInput) -> HitlRow:
        """The table's row for (state, event); IllegalTransitionError when there is none."""
        return cls.TRANSITIONS.step(HitlState(state), event)

    @classmethod
    def allows(cls, state: HitlState | str, event: HitlInput) -> bool:
        return cls.TRANSITIONS.allows(HitlState(state), event)

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
        if not (number(due) and math.isfinite(due) and due > now):
            raise ValidationError.for_field("deadline", "must be a finite time after now")
        record = HitlRecord(
            invocation_id=required(invocation_id, "invocation_id"),
            reason_type=parse_reason(reason_type).value,
            state=HitlState.PENDING.value,
            created_at=now,
            updated_at=now,
            deadline=float(due),
            requested_by=required(requested_by, "requested_by"),
            correlation_id=typed(correlation_id, str, "correlation_id"),
            subject=json_object(subject, "subject"),
            context=json_object(context, "context"),
            suggested_action=suggestion(suggested_action),
            proposed_actions=strings(proposed_actions, "proposed_actions"),
            approver_roles=strings(approver_roles, "approver_roles"),
            timeout_action=parse_timeout_action(timeout_action or policy.timeout_action).value,
            priority=typed(priority, int, "priority"),
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
        why = required(rationale, "rationale")
        plain_patch = checked_patch(chosen, patch)
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
        actor = required(by, "by")
        why = required(reason, "reason")
        decision = _decision(HitlAction.DENY, why, by=actor, now=now, via="cancelled")
        return _transition(record, row, now=now, actor=actor, why=why, decision=decision)


def original_window(record: HitlRecord) -> float:
    """The invocation's original decision window, in seconds (see the module docstring)."""
    return (record.deadline - record.created_at) / (1 + record.extensions)


def mermaid() -> str:
    """The state diagram of the table, for the docs."""
    ended = (s for s in HitlState if s.terminal)
    return HitlMachine.TRANSITIONS.mermaid(
        (OPEN_ROW.state,), ended, lambda row: row.state, loops=True, entry="OPEN"
    )


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
        if not (number(score) and math.isfinite(score)):
            raise ValidationError.for_field("score", "must be a finite number")
        return float(score)
    found: Any = record.context.get("score")
    return float(found) if number(found) and math.isfinite(found) else None


def _opened_event(record: HitlRecord) -> tuple[str, dict[str, Any]]:
    details = invocation_payload(record)
    # The context can be large and stays in the record: the audit names its keys. The
    # correlation id belongs to the event itself, not to its details.
    details["context"] = sorted(record.context)
    del details["correlation_id"]
    details.update(by=record.requested_by, at=record.created_at, why=record.reason_type)
    details.update(from_state=None, to_state=record.state)
    return OPEN_ROW.event_type, details
