"""The agent handoff lifecycle of RFC 17.6 as a pure, table-driven machine.

A handoff opens PENDING, offered to one target agent until its deadline. The target accepts
(ACCEPTED) or rejects with a reason (REJECTED); the deadline passing first expires it
(EXPIRED). An ACCEPTED handoff is COMPLETED when the context has been transferred: the
origin stops work on it and reports completion (Appendix D, C.11).

Rerouting (RFC 17.6: "MAY route pending handoffs to alternative agents if the primary target
rejects or times out") is a transition of the same handoff, not a new request: REJECTED and
EXPIRED take a REROUTE input that offers the handoff to another agent, PENDING again with the
next attempt number, under the same request_id. The origin keeps one id for the whole
handoff and completes it whoever accepted; `tried` and the event log keep every attempt.
Rows of REJECT and EXPIRE carry the REROUTE effect: the engine then looks for an alternative
and applies REROUTE when it finds one; when it does not, REJECTED or EXPIRED is final.

`HandoffMachine` takes a `HandoffRecord`, an input and `now` and returns a `HandoffStep`: the
new record, the effects the engine performs in the order listed, the event for the log and
the agents whose access to the context snapshot ends. An input the table has no row for
raises `IllegalTransitionError` and changes nothing (`refusal` turns it into the protocol
error a caller gets); a bad or unauthorized input raises an `ApiaryError` and changes nothing.

Decisions where the RFC is silent:
- Access to the context snapshot (`context_holders`): the origin and the current target
  while the handoff is open. A target that rejects, or whose offer expires, loses it; on
  completion the origin loses it (RFC 17.6: the origin "MUST NOT continue work on the
  transferred context after handoff completion"), and only the receiving agent keeps it.
- Only the current target may accept or reject; the origin or the receiving agent may
  complete. An accept or reject at or after the deadline is refused with deadline_exceeded
  even when the engine's timer has not fired yet.
- Completion needs an ACCEPTED handoff; the offer's deadline bounds acceptance only.
- Nobody is notified of what they did themselves (the engine skips the step's actor), except
  that the origin gets a confirmation of its request with the request_id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

from apiary.core.dedup import iso_utc
from apiary.core.handoff_request import HandoffDraft
from apiary.core.machine import IllegalTransitionError, TransitionTable
from apiary.core.records import HandoffRecord
from apiary.errors import (
    AlreadyCompletedError,
    ApiaryError,
    DeadlineExceededError,
    PermissionDeniedError,
    ValidationError,
)


class HandoffState(StrEnum):
    """Handoff states (RFC 17.6), named as `sw4rm.handoff.HandoffStatus`."""

    PENDING = "PENDING"
    ACCEPTED = "ACCEPTED"
    REJECTED = "REJECTED"
    COMPLETED = "COMPLETED"
    EXPIRED = "EXPIRED"

    @property
    def open(self) -> bool:
        """Waiting for a target's answer or for completion."""
        return self in (HandoffState.PENDING, HandoffState.ACCEPTED)


PROTO_NUMBERS: Final[Mapping[HandoffState, int]] = MappingProxyType(
    {state: number for number, state in enumerate(HandoffState, start=1)}
)
"""`sw4rm.handoff.HandoffStatus` numbers; 0 is HANDOFF_STATUS_UNSPECIFIED."""
_BY_NUMBER: Final = {number: state for state, number in PROTO_NUMBERS.items()}


def to_proto(state: HandoffState | str) -> int:
    return PROTO_NUMBERS[HandoffState(state)]


def from_proto(number: int, field: str = "status") -> HandoffState:
    """The state of a HandoffStatus number; ValidationError naming `field` otherwise."""
    found = _BY_NUMBER.get(number)
    if found is None:
        raise ValidationError.for_field(field, f"not a handoff status: {number!r}")
    return found


def parse_state(value: object, field: str = "state") -> HandoffState:
    """A state from its name in any case or its proto number."""
    if isinstance(value, int) and not isinstance(value, bool):
        return from_proto(value, field)
    text = value.strip().upper() if isinstance(value, str) else ""
    if text not in HandoffState.__members__:
        names = ", ".join(HandoffState)
        raise ValidationError.for_field(field, f"must be one of {names}, got {value!r}")
    return HandoffState(text)


class HandoffInput(StrEnum):
    """Inputs of the table; the machine's methods choose one each."""

    ACCEPT = "ACCEPT"
    REJECT = "REJECT"
    EXPIRE = "EXPIRE"
    """The offer's deadline passed."""
    REROUTE = "REROUTE"
    """Offer a rejected or expired handoff to an alternative agent."""
    COMPLETE = "COMPLETE"


class HandoffEffect(StrEnum):
    """What the engine does after a step, in the order the step lists them."""

    PERSIST = "PERSIST"
    START_TIMER = "START_TIMER"
    """(Re-)arm the expiry timer at `record.deadline`."""
    CANCEL_TIMER = "CANCEL_TIMER"
    EMIT_EVENT = "EMIT_EVENT"
    REVOKE_CONTEXT = "REVOKE_CONTEXT"
    """`step.revoked` may no longer read the snapshot (recorded as its own event)."""
    NOTIFY_TARGET = "NOTIFY_TARGET"
    """A NOTIFICATION to the target of the step (the one whose offer ended, for EXPIRE)."""
    NOTIFY_ORIGIN = "NOTIFY_ORIGIN"
    REROUTE = "REROUTE"
    """Look for an alternative agent and apply REROUTE when there is one."""


@dataclass(frozen=True, slots=True)
class HandoffRow:
    """One table entry: the next state, the effects and the event type."""

    state: HandoffState
    effects: tuple[HandoffEffect, ...]
    event_type: str


@dataclass(frozen=True, slots=True)
class HandoffStep:
    """A transition's result.

    `event` is (event type, details): request_id, from_agent, to_agent, attempt, by, at,
    why, from_state, to_state (`by` names who caused the step). `target` is whom
    NOTIFY_TARGET addresses and `actor` the party no notification goes to, having caused the
    step ("" when everyone is told). `event` is None only for an expiry timer that fired
    early, which changes nothing.
    """

    record: HandoffRecord
    effects: tuple[HandoffEffect, ...]
    event: tuple[str, dict[str, Any]] | None = None
    revoked: tuple[str, ...] = ()
    target: str = ""
    actor: str = ""


COORDINATOR: Final = "coordinator"
"""The actor of steps nobody asked for (expiry, rerouting)."""

_S = HandoffState
_F = HandoffEffect
_I = HandoffInput
OPEN_ROW: Final = HandoffRow(
    _S.PENDING,
    (_F.PERSIST, _F.START_TIMER, _F.EMIT_EVENT, _F.NOTIFY_TARGET, _F.NOTIFY_ORIGIN),
    "handoff.requested",
)
"""What a request does: there is no state before PENDING, so this row is outside the table."""


def _table() -> dict[HandoffState, dict[HandoffInput, HandoffRow]]:
    notify = (_F.NOTIFY_TARGET, _F.NOTIFY_ORIGIN)
    answered = (_F.PERSIST, _F.CANCEL_TIMER, _F.EMIT_EVENT)
    rerouted = HandoffRow(
        _S.PENDING, (_F.PERSIST, _F.START_TIMER, _F.EMIT_EVENT, *notify), "handoff.rerouted"
    )
    # An expired offer's timer is the one that fired: nothing to cancel. Its target is told
    # the offer is withdrawn; a rejecting target knows already.
    return {
        _S.PENDING: {
            _I.ACCEPT: HandoffRow(
                _S.ACCEPTED,
                (*answered, _F.NOTIFY_ORIGIN),
                "handoff.accepted",
            ),
            _I.REJECT: HandoffRow(
                _S.REJECTED,
                (*answered, _F.REVOKE_CONTEXT, _F.NOTIFY_ORIGIN, _F.REROUTE),
                "handoff.rejected",
            ),
            _I.EXPIRE: HandoffRow(
                _S.EXPIRED,
                (_F.PERSIST, _F.EMIT_EVENT, _F.REVOKE_CONTEXT, *notify, _F.REROUTE),
                "handoff.expired",
            ),
        },
        _S.ACCEPTED: {
            _I.COMPLETE: HandoffRow(
                _S.COMPLETED,
                (_F.PERSIST, _F.EMIT_EVENT, _F.REVOKE_CONTEXT, *notify),
                "handoff.completed",
            ),
        },
        _S.REJECTED: {_I.REROUTE: rerouted},
        _S.EXPIRED: {_I.REROUTE: rerouted},
        _S.COMPLETED: {},
    }


class HandoffMachine:
    """The handoff transition table and the transitions that validate and apply it."""

    TABLE: dict[HandoffState, dict[HandoffInput, HandoffRow]] = _table()
    TRANSITIONS: TransitionTable[HandoffState, HandoffInput, HandoffRow] = TransitionTable(
        TABLE, "handoff"
    )

    @classmethod
    def row(cls, state: HandoffState | str, event: HandoffInput) -> HandoffRow:
        """The table's row for (state, event); IllegalTransitionError when there is none."""
        return cls.TRANSITIONS.step(HandoffState(state), event)

    @classmethod
    def allows(cls, state: HandoffState | str, event: HandoffInput) -> bool:
        return cls.TRANSITIONS.allows(HandoffState(state), event)

    @classmethod
    def open(cls, draft: HandoffDraft, *, to_agent: str, now: float) -> HandoffStep:
        """A validated draft (`validate_draft`) offered to `to_agent` (chosen by the engine
        when the draft routes by capability)."""
        if not to_agent or to_agent == draft.from_agent:
            raise ValidationError.for_field("to_agent", "needs a target other than the origin")
        window = float(draft.timeout_s or 0.0)
        if window <= 0:
            raise ValidationError.for_field("timeout", "must be a positive duration")
        record = HandoffRecord(
            request_id=draft.request_id, from_agent=draft.from_agent, to_agent=to_agent,
            state=_S.PENDING.value, created_at=now, updated_at=now, deadline=now + window,
            timeout_s=window, requested_to=draft.to_agent, reason=draft.reason,
            context_snapshot=draft.context_snapshot,
            snapshot_content_type=draft.snapshot_content_type,
            capabilities_required=draft.capabilities_required, priority=draft.priority,
            attempt=1, tried=(to_agent,), context_holders=(draft.from_agent, to_agent),
        )  # fmt: skip
        why = draft.reason or "handoff requested"
        event = _event(OPEN_ROW, record, record, by=draft.from_agent, now=now, why=why)
        event[1].update(
            requested_to=record.requested_to, priority=record.priority,
            capabilities_required=list(record.capabilities_required), deadline=record.deadline,
            snapshot_content_type=record.snapshot_content_type,
            snapshot_size=len(record.context_snapshot),
        )  # fmt: skip
        # No actor: the origin is told too. Its confirmation is the answer C.11 draws
        # ("request_id (PENDING)"), which the canonical RequestHandoff reply cannot carry.
        return HandoffStep(record, OPEN_ROW.effects, event, target=to_agent)

    @classmethod
    def accept(cls, record: HandoffRecord, *, by: str, now: float) -> HandoffStep:
        """The target takes ownership of the work."""
        row = cls.row(record.state, _I.ACCEPT)
        _answerable(record, by, now, "accepting_agent")
        new = replace(record, state=row.state.value, updated_at=now, accepting_agent=by)
        event = _event(row, record, new, by=by, now=now, why="accepted")
        return HandoffStep(new, row.effects, event, target=by, actor=by)

    @classmethod
    def reject(cls, record: HandoffRecord, *, by: str, reason: str, now: float) -> HandoffStep:
        """The target declines, with a reason."""
        row = cls.row(record.state, _I.REJECT)
        _answerable(record, by, now, "accepting_agent")
        if not isinstance(reason, str) or not reason.strip():
            raise ValidationError.for_field("rejection_reason", "is required")
        new = replace(
            record, state=row.state.value, updated_at=now, rejection_reason=reason,
            context_holders=_without(record.context_holders, by),
        )  # fmt: skip
        event = _event(row, record, new, by=by, now=now, why=reason)
        return HandoffStep(new, row.effects, event, revoked=(by,), target=by, actor=by)

    @classmethod
    def expire(cls, record: HandoffRecord, *, now: float) -> HandoffStep:
        """The expiry timer fired. Before the deadline (it moved since the timer was armed)
        nothing changes and the timer is re-armed."""
        row = cls.row(record.state, _I.EXPIRE)
        if now < record.deadline:
            return HandoffStep(record, (_F.START_TIMER,))
        target = record.to_agent
        new = replace(
            record, state=row.state.value, updated_at=now,
            context_holders=_without(record.context_holders, target),
        )  # fmt: skip
        why = f"no answer from {target} by {iso_utc(record.deadline)}"
        event = _event(row, record, new, by=COORDINATOR, now=now, why=why)
        return HandoffStep(new, row.effects, event, revoked=(target,), target=target)

    @classmethod
    def reroute(
        cls, record: HandoffRecord, *, to_agent: str, now: float, max_attempts: int
    ) -> HandoffStep:
        """Offer a rejected or expired handoff to `to_agent`, as attempt `attempt + 1`."""
        row = cls.row(record.state, _I.REROUTE)
        if not to_agent or to_agent == record.from_agent or to_agent in record.tried:
            raise ValidationError.for_field(
                "to_agent", f"{to_agent!r} is the origin or was offered this handoff already"
            )
        if record.attempt >= max_attempts:
            raise ValidationError.for_field(
                "to_agent", f"no attempts left ({record.attempt} of {max_attempts} used)"
            )
        new = replace(
            record, state=row.state.value, updated_at=now, to_agent=to_agent,
            deadline=now + record.timeout_s, attempt=record.attempt + 1,
            tried=(*record.tried, to_agent), rejection_reason="",
            context_holders=(record.from_agent, to_agent),
        )  # fmt: skip
        why = f"{record.state.lower()} by {record.to_agent}; offered to {to_agent}"
        event = _event(row, record, new, by=COORDINATOR, now=now, why=why)
        event[1]["previous_agent"] = record.to_agent
        return HandoffStep(new, row.effects, event, target=to_agent)

    @classmethod
    def complete(cls, record: HandoffRecord, *, by: str, now: float) -> HandoffStep:
        """The context was transferred: the origin (or the receiving agent) says so. The
        origin's access to the context ends here."""
        row = cls.row(record.state, _I.COMPLETE)
        if by not in (record.from_agent, record.to_agent):
            raise PermissionDeniedError(
                f"only {record.from_agent} or {record.to_agent} may complete handoff "
                f"{record.request_id}",
                {"request_id": record.request_id, "agent_id": by},
            )
        new = replace(
            record, state=row.state.value, updated_at=now,
            context_holders=(record.to_agent,),
        )  # fmt: skip
        revoked = tuple(h for h in record.context_holders if h != record.to_agent)
        event = _event(row, record, new, by=by, now=now, why="context transferred")
        return HandoffStep(
            new, row.effects, event, revoked=revoked, target=record.to_agent, actor=by
        )


def may_read(record: HandoffRecord, agent_id: str) -> bool:
    """Whether `agent_id` may read the handoff's context snapshot."""
    return bool(agent_id) and agent_id in record.context_holders


def check_read(record: HandoffRecord, agent_id: str) -> None:
    """PermissionDeniedError unless `agent_id` may read the context snapshot."""
    if may_read(record, agent_id):
        return
    if agent_id == record.from_agent and record.state == _S.COMPLETED.value:
        why = "the context was transferred to " + record.to_agent
    elif not agent_id:
        why = "name the reading agent (sw4rm-agent-id)"
    else:
        why = f"{agent_id} holds no access to it"
    raise PermissionDeniedError(
        f"the context snapshot of handoff {record.request_id} is not readable: {why}",
        {"request_id": record.request_id, "agent_id": agent_id},
    )


def refusal(error: IllegalTransitionError, record: HandoffRecord) -> ApiaryError:
    """The protocol error a caller gets for an input the handoff's state does not take."""
    details = {"request_id": record.request_id, "state": record.state}
    name = f"handoff {record.request_id}"
    state = error.state
    if state is _S.EXPIRED:
        return DeadlineExceededError(f"{name} expired at {iso_utc(record.deadline)}", details)
    if state is _S.PENDING:
        return ValidationError.for_field(
            "request_id",
            f"{name} is PENDING with {record.to_agent}: it can be completed once accepted",
            **details,
        )
    if state is _S.ACCEPTED:
        return AlreadyCompletedError(f"{name} was accepted by {record.accepting_agent}", details)
    if state is _S.REJECTED:
        return AlreadyCompletedError(
            f"{name} was rejected by {record.to_agent}: {record.rejection_reason}", details
        )
    return AlreadyCompletedError(f"{name} is {state}", details)


def mermaid() -> str:
    """The state diagram of the table, for the docs."""
    ended = (s for s in HandoffState if not s.open)
    return HandoffMachine.TRANSITIONS.mermaid(
        (OPEN_ROW.state,), ended, lambda row: row.state, loops=True, entry="REQUEST"
    )


# --- helpers ----------------------------------------------------------------------------------


def _answerable(record: HandoffRecord, by: str, now: float, field: str) -> None:
    if by != record.to_agent:
        raise PermissionDeniedError(
            f"{field}: handoff {record.request_id} is offered to {record.to_agent}, not {by!r}",
            {"field": field, "request_id": record.request_id, "agent_id": by},
        )
    if now >= record.deadline:
        raise DeadlineExceededError(
            f"the offer of handoff {record.request_id} expired at {iso_utc(record.deadline)}",
            {"request_id": record.request_id},
        )


def _without(holders: tuple[str, ...], agent_id: str) -> tuple[str, ...]:
    return tuple(h for h in holders if h != agent_id)


def _event(
    row: HandoffRow,
    before: HandoffRecord,
    after: HandoffRecord,
    *,
    by: str,
    now: float,
    why: str,
) -> tuple[str, dict[str, Any]]:
    details: dict[str, Any] = {
        "request_id": after.request_id,
        "from_agent": after.from_agent,
        "to_agent": after.to_agent,
        "attempt": after.attempt,
        "by": by,
        "at": now,
        "why": why,
        "from_state": None if before is after else before.state,
        "to_state": after.state,
    }
    return row.event_type, details
