"""The worktree binding of RFC 16 as a pure, table-driven machine.

One `WorktreeBinding` record per agent: its home (repo_id, worktree_id), where it works now,
a pending switch, and what went wrong when a BIND failed. `BindingMachine.step` takes
(record, input, now) with the input's arguments and returns a `BindingStep`: the next record
and the effects the engine performs in order. An input the table has no row for raises
`IllegalTransitionError` and changes nothing; a bad argument raises `ValidationError` naming
the field and changes nothing. Time is always an argument.

The rows are exactly the ten transitions of RFC 16.2 plus the BIND_FAILED handling of 16.3
(`RFC_16_3_ROWS`): a failed automatic retry or a new failing BIND stays in BIND_FAILED with
the new reason, and the bind recovery timeout escalates to an operator once.

The engine performs the operations whose outcome the machine cannot know (creating the git
worktree) first and reports their outcome as the input: BIND_OK or BIND_ERROR for a BIND,
RETRY_OK or RETRY_ERROR for an automatic retry. `BindingMachine.allows` tells it beforehand
whether a BIND is legal at all, so that nothing touches the disk for an illegal one.

Decisions where the RFC is silent:
- One home per agent: BIND is legal from UNBOUND and BIND_FAILED only; an agent with a home
  must UNBIND first (RFC 16: "a single home worktree").
- Retries (16.3): `attempts` counts the failed attempts of the current failure; after the
  n-th failure the next retry is due `retry_base_s * 2**(n-1)` later (1 s, 2 s, 4 s by
  default), and after `max_retries` retries (3) no more are scheduled. A new BIND from
  BIND_FAILED is an operator's retry: it starts the count again.
- The bind recovery timeout (16.3, 60 s) counts from entering BIND_FAILED and escalates once
  (ESCALATE_TO_HITL); the agent stays BIND_FAILED. Failing again in BIND_FAILED does not
  restart it: the agent "remains" in the state.
- SWITCH_REQUEST always asks HITL (REQUEST_APPROVAL: a WORKTREE_OVERRIDE invocation):
  non-home operation is forbidden by default. An approval that arrives another way (the
  ApproveSwitch RPC) closes the invocation (CLOSE_INVOCATION).
- The TTL of BOUND_NON_HOME is the approval's, else the request's, else `default_ttl_s`
  (900 s, the RFC's C.7 example); at most `max_ttl_s`.
- SWITCH_PENDING keeps the agent in its home worktree: the switch has not happened yet, so
  `working_location` is the home (an agent awaiting approval is not unbound).
- A timer input (TTL_EXPIRED, RECOVERY_TIMEOUT, RETRY_*) before its deadline is illegal: the
  engine asks `due` which timers have fired.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from apiary.core.machine import IllegalTransitionError, TransitionTable
from apiary.core.worktrees.records import (
    MAX_ID_LENGTH,
    BindingState,
    BindingTimer,
    Location,
    WorktreeBinding,
    valid_id,
)
from apiary.errors import (
    FilesystemError,
    PermissionDeniedError,
    ValidationError,
    WorktreeLockedError,
    WorktreeNotFoundError,
)


class BindingInput(StrEnum):
    """What moves a binding."""

    BIND_OK = "BIND_OK"
    """A BIND created or reused the worktree."""
    BIND_ERROR = "BIND_ERROR"
    """A BIND failed; the reason is one of `FAILURE_REASONS`."""
    RETRY_OK = "RETRY_OK"
    """An automatic retry of the failed BIND (16.3) succeeded."""
    RETRY_ERROR = "RETRY_ERROR"
    UNBIND = "UNBIND"
    SWITCH_REQUEST = "SWITCH_REQUEST"
    SWITCH_APPROVE = "SWITCH_APPROVE"
    SWITCH_REJECT = "SWITCH_REJECT"
    SWITCH_REVOKE = "SWITCH_REVOKE"
    TTL_EXPIRED = "TTL_EXPIRED"
    """The time limit of BOUND_NON_HOME passed."""
    RECOVERY_TIMEOUT = "RECOVERY_TIMEOUT"
    """The agent stayed in BIND_FAILED for the bind recovery timeout (16.3)."""


class BindingEffect(StrEnum):
    """What the engine does after a step, in the order the step lists them. The new record
    and its timers land (PERSIST, CANCEL_TIMER, START_TIMER) before anyone is told."""

    REQUEST_APPROVAL = "REQUEST_APPROVAL"
    """Open a WORKTREE_OVERRIDE HITL invocation for the pending switch (EscalateToHitl); the
    engine stores its id in the record before PERSIST."""
    ESCALATE_TO_HITL = "ESCALATE_TO_HITL"
    """Tell an operator, through a HITL invocation, that the bind cannot recover (16.3)."""
    CLOSE_INVOCATION = "CLOSE_INVOCATION"
    """Cancel the HITL invocation of the state left, when it is still pending."""
    PERSIST = "PERSIST"
    """Store the new record (its version is one above the stored one)."""
    CANCEL_TIMER = "CANCEL_TIMER"
    """Disarm the deadlines the new record no longer has."""
    START_TIMER = "START_TIMER"
    """Arm the new record's deadlines: retry_at, recovery_at, expires_at (StartTimer)."""
    EMIT_EVENT = "EMIT_EVENT"
    """Append the transition to the event log with repo_id and worktree_id (RFC 16, 19)."""
    NOTIFY_AGENT = "NOTIFY_AGENT"
    """Tell the agent its new status (a WORKTREE_CONTROL envelope)."""


FAILURE_REASONS: Final = frozenset({
    WorktreeNotFoundError.code,
    PermissionDeniedError.code,
    FilesystemError.code,
    WorktreeLockedError.code,
})  # fmt: skip
"""The error reasons 16.3 names for BIND_FAILED."""

_S = BindingState
_I = BindingInput
_F = BindingEffect


@dataclass(frozen=True, slots=True)
class BindingPolicy:
    """Retry, recovery and TTL policy (RFC 16.2, 16.3)."""

    retry_base_s: float = 1.0
    max_retries: int = 3
    recovery_timeout_s: float = 60.0
    default_ttl_s: float = 900.0
    max_ttl_s: float = 86_400.0

    def __post_init__(self) -> None:
        for name in ("retry_base_s", "recovery_timeout_s", "default_ttl_s", "max_ttl_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValidationError.for_field(name, f"must be a number, got {value!r}")
            if not 0 < value < math.inf:
                raise ValidationError.for_field(name, f"must be a positive duration, got {value}")
        count = self.max_retries
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValidationError.for_field(
                "max_retries", f"must be a non-negative integer, got {count!r}"
            )
        if self.default_ttl_s > self.max_ttl_s:
            raise ValidationError.for_field("default_ttl_s", "must not exceed max_ttl_s")

    def retry_delay(self, attempts: int) -> float | None:
        """Seconds from the `attempts`-th failure to the next retry; None when the retries
        are used up (exponential backoff, at most `max_retries` retries)."""
        if attempts < 1 or attempts > self.max_retries:
            return None
        return float(self.retry_base_s * 2 ** (attempts - 1))


DEFAULT_POLICY: Final = BindingPolicy()


@dataclass(frozen=True, slots=True)
class BindingRow:
    state: BindingState
    effects: tuple[BindingEffect, ...]


@dataclass(frozen=True, slots=True)
class BindingStep:
    """A transition's result: the new record (`before` is the old one) and the effects."""

    record: WorktreeBinding
    before: WorktreeBinding
    input: BindingInput
    effects: tuple[BindingEffect, ...]


_R = BindingRow
_NOTIFY = (_F.PERSIST, _F.EMIT_EVENT, _F.NOTIFY_AGENT)
_ENTER_FAILED = (_F.PERSIST, _F.CANCEL_TIMER, _F.START_TIMER, _F.EMIT_EVENT, _F.NOTIFY_AGENT)
_LEAVE_FAILED = (_F.CLOSE_INVOCATION, _F.PERSIST, _F.CANCEL_TIMER, _F.EMIT_EVENT, _F.NOTIFY_AGENT)
_LEAVE_NON_HOME = (_F.PERSIST, _F.CANCEL_TIMER, _F.EMIT_EVENT, _F.NOTIFY_AGENT)
_DECIDED = (_F.CLOSE_INVOCATION, _F.PERSIST, _F.EMIT_EVENT, _F.NOTIFY_AGENT)

TABLE: Final[Mapping[BindingState, Mapping[BindingInput, BindingRow]]] = MappingProxyType({
    _S.UNBOUND: {
        # 16.2 "UNBOUND | BOUND_HOME | Successful BIND operation | Normal startup flow"
        _I.BIND_OK: _R(_S.BOUND_HOME, _NOTIFY),
        # 16.2 "UNBOUND | BIND_FAILED | BIND operation error"; 16.3 retry with backoff
        _I.BIND_ERROR: _R(_S.BIND_FAILED, _ENTER_FAILED),
    },
    _S.BIND_FAILED: {
        # 16.2 "BIND_FAILED | UNBOUND | Retry reset or explicit UNBIND"
        _I.UNBIND: _R(_S.UNBOUND, _LEAVE_FAILED),
        # 16.2 "BIND_FAILED | BOUND_HOME | Successful retry BIND"; 16.3 manual recovery
        _I.BIND_OK: _R(_S.BOUND_HOME, _LEAVE_FAILED),
        _I.RETRY_OK: _R(_S.BOUND_HOME, _LEAVE_FAILED),
        # 16.3 "MAY issue a new BIND request to retry": it failed again
        _I.BIND_ERROR: _R(_S.BIND_FAILED, _ENTER_FAILED),
        # 16.3 "retrying the BIND operation after a backoff period": it failed again
        _I.RETRY_ERROR: _R(_S.BIND_FAILED, _ENTER_FAILED),
        # 16.3 "longer than the configured bind recovery timeout ... escalate"
        _I.RECOVERY_TIMEOUT: _R(
            _S.BIND_FAILED, (_F.ESCALATE_TO_HITL, _F.PERSIST, _F.CANCEL_TIMER, _F.EMIT_EVENT)
        ),
    },
    _S.BOUND_HOME: {
        # 16.2 "BOUND_HOME | SWITCH_PENDING | SWITCH_REQUEST issued | Awaiting HITL"
        _I.SWITCH_REQUEST: _R(_S.SWITCH_PENDING, (_F.REQUEST_APPROVAL, *_NOTIFY)),
        # 16.2 "BOUND_HOME | UNBOUND | UNBIND operation"
        _I.UNBIND: _R(_S.UNBOUND, _NOTIFY),
    },
    _S.SWITCH_PENDING: {
        # 16.2 "SWITCH_PENDING | BOUND_NON_HOME | SWITCH_APPROVE received | TTL enforced"
        _I.SWITCH_APPROVE: _R(
            _S.BOUND_NON_HOME,
            (_F.CLOSE_INVOCATION, _F.PERSIST, _F.START_TIMER, _F.EMIT_EVENT, _F.NOTIFY_AGENT),
        ),
        # 16.2 "SWITCH_PENDING | BOUND_HOME | SWITCH_REJECT received"
        _I.SWITCH_REJECT: _R(_S.BOUND_HOME, _DECIDED),
    },
    _S.BOUND_NON_HOME: {
        # 16.2 "BOUND_NON_HOME | BOUND_HOME | TTL expired or SWITCH_REVOKE"
        _I.TTL_EXPIRED: _R(_S.BOUND_HOME, _NOTIFY),
        _I.SWITCH_REVOKE: _R(_S.BOUND_HOME, _LEAVE_NON_HOME),
        # 16.2 "BOUND_NON_HOME | UNBOUND | UNBIND operation"
        _I.UNBIND: _R(_S.UNBOUND, _LEAVE_NON_HOME),
    },
})  # fmt: skip
"""(state, input) -> row. States absent from a state's mapping are illegal inputs."""

RFC_16_3_ROWS: Final = frozenset({
    (_S.BIND_FAILED, _I.BIND_ERROR),
    (_S.BIND_FAILED, _I.RETRY_ERROR),
    (_S.BIND_FAILED, _I.RECOVERY_TIMEOUT),
    (_S.BIND_FAILED, _I.RETRY_OK),
})  # fmt: skip
"""Rows from the BIND_FAILED handling of 16.3 rather than the 16.2 table (RETRY_OK is 16.2's
"Successful retry BIND" made automatic)."""

_TIMER_INPUTS: Final = {
    _I.TTL_EXPIRED: BindingTimer.TTL,
    _I.RECOVERY_TIMEOUT: BindingTimer.RECOVERY,
    _I.RETRY_OK: BindingTimer.RETRY,
    _I.RETRY_ERROR: BindingTimer.RETRY,
}


class BindingMachine:
    """The binding table with `step` as its operation."""

    TABLE = TABLE
    TRANSITIONS: Final[TransitionTable[BindingState, BindingInput, BindingRow]] = TransitionTable(
        TABLE, "worktree binding"
    )

    @classmethod
    def row(cls, state: BindingState, event: BindingInput) -> BindingRow:
        """The table's row for (state, event); IllegalTransitionError when there is none."""
        return cls.TRANSITIONS.step(state, event)

    @classmethod
    def allows(cls, state: BindingState | str, event: BindingInput) -> bool:
        return cls.TRANSITIONS.allows(BindingState(state), event)

    @classmethod
    def step(
        cls,
        record: WorktreeBinding,
        event: BindingInput,
        now: float,
        *,
        location: Location | None = None,
        branch: str = "",
        commit_sha: str = "",
        reason: str = "",
        note: str = "",
        ttl_s: float = 0.0,
        policy: BindingPolicy = DEFAULT_POLICY,
    ) -> BindingStep:
        """Apply `event` to `record` at `now`.

        `location` is the worktree of a BIND (BIND_OK, BIND_ERROR; with its `branch` and
        `commit_sha`) or of a SWITCH_REQUEST, and for SWITCH_APPROVE, when given, must be the
        pending target. `reason` is the error code
        of BIND_ERROR / RETRY_ERROR; `ttl_s` the TTL of a SWITCH_REQUEST or SWITCH_APPROVE
        (0.0: see the module docstring); `note` says why, for the record and the log.
        """
        state = BindingState(record.state)
        found = cls.row(state, event)
        timer = _TIMER_INPUTS.get(event)
        if timer is not None:
            due = record.deadline(timer)
            if not due or now < due:
                why = f"the {timer} timer is not due"
                raise IllegalTransitionError(state, event, "worktree binding", why)
        fields = _FIELDS[event](
            record, now, _Args(location, branch, commit_sha, reason, note, ttl_s, policy)
        )
        default_note = str(fields.pop("note", ""))
        changed = found.state is not state
        new = replace(
            record,
            **fields,  # type: ignore[arg-type]
            state=found.state.value,
            note=note or default_note,
            entered_at=now if changed else record.entered_at,
            updated_at=now,
            version=record.version + 1,
        )
        return BindingStep(new, record, event, found.effects)

    @classmethod
    def due(cls, record: WorktreeBinding, now: float) -> tuple[BindingTimer, ...]:
        """The record's timers whose deadline is at or before `now`, in firing order."""
        return tuple(t for t in BindingTimer if 0 < record.deadline(t) <= now)


@dataclass(frozen=True, slots=True)
class _Args:
    location: Location | None
    branch: str
    commit_sha: str
    reason: str
    note: str
    ttl_s: float
    policy: BindingPolicy


def _need_location(args: _Args, field: str, *, exists: bool = True) -> Location:
    """The input's location; with `exists`, both ids must be valid (a worktree was made
    there). A failed BIND may name anything non-empty: what it named is recorded."""
    if args.location is None:
        raise ValidationError.for_field(field, "is required")
    named = (("repo_id", args.location.repo_id), ("worktree_id", args.location.worktree_id))
    for name, value in named:
        if not value or len(value) > MAX_ID_LENGTH:
            raise ValidationError.for_field(name, f"must be 1-{MAX_ID_LENGTH} characters")
        if exists and not valid_id(value):
            raise ValidationError.for_field(name, f"not a repository/worktree id: {value!r}")
    return args.location


def _need_reason(args: _Args) -> str:
    if args.reason not in FAILURE_REASONS:
        raise ValidationError.for_field(
            "reason", f"must be one of {', '.join(sorted(FAILURE_REASONS))}, not {args.reason!r}"
        )
    return args.reason


def _ttl(value: float, policy: BindingPolicy) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError.for_field("ttl_ms", f"must be a number of milliseconds: {value!r}")
    if value < 0 or value > policy.max_ttl_s:
        raise ValidationError.for_field(
            "ttl_ms",
            f"must be between 0 and {policy.max_ttl_s * 1000:.0f} ms, not {value * 1000:.0f}",
        )
    return float(value)


_CLEAR_SWITCH: Final = {"target_repo_id": "", "target_worktree_id": "", "ttl_s": 0.0}
_CLEAR_FAILURE: Final = {"reason": "", "attempts": 0, "retry_at": 0.0, "recovery_at": 0.0}


def _home_fields(location: Location, branch: str, commit_sha: str) -> dict[str, object]:
    return {
        "repo_id": location.repo_id, "worktree_id": location.worktree_id,
        "branch": branch or location.worktree_id, "commit_sha": commit_sha,
        "current_repo_id": location.repo_id,
        "current_worktree_id": location.worktree_id, "expires_at": 0.0, "invocation_id": "",
        **_CLEAR_SWITCH, **_CLEAR_FAILURE,
    }  # fmt: skip


def _bound(record: WorktreeBinding, now: float, args: _Args) -> dict[str, object]:
    location = _need_location(args, "worktree_id")
    return _home_fields(location, args.branch, args.commit_sha)


def _retried(record: WorktreeBinding, now: float, args: _Args) -> dict[str, object]:
    home = record.home
    assert home is not None, "a BIND_FAILED record names the worktree it failed on"
    return {**_home_fields(home, record.branch, record.commit_sha), "note": "retry succeeded"}


def _failed(record: WorktreeBinding, now: float, args: _Args) -> dict[str, object]:
    location = _need_location(args, "worktree_id", exists=False)
    reason = _need_reason(args)
    delay = args.policy.retry_delay(1)
    keep = record.state == _S.BIND_FAILED
    return {
        "repo_id": location.repo_id, "worktree_id": location.worktree_id,
        "branch": args.branch or location.worktree_id, "commit_sha": args.commit_sha,
        "current_repo_id": "",
        "current_worktree_id": "", "reason": reason, "attempts": 1,
        "retry_at": 0.0 if delay is None else now + delay,
        "recovery_at": record.recovery_at if keep else now + args.policy.recovery_timeout_s,
        "invocation_id": record.invocation_id if keep else "", "expires_at": 0.0,
        **_CLEAR_SWITCH,
    }  # fmt: skip


def _retry_failed(record: WorktreeBinding, now: float, args: _Args) -> dict[str, object]:
    reason = _need_reason(args)
    attempts = record.attempts + 1
    delay = args.policy.retry_delay(attempts)
    return {
        "reason": reason,
        "attempts": attempts,
        "retry_at": 0.0 if delay is None else now + delay,
    }


def _escalated(record: WorktreeBinding, now: float, args: _Args) -> dict[str, object]:
    return {"recovery_at": 0.0, "note": f"in BIND_FAILED since {record.entered_at:.3f}"}


def _unbound(record: WorktreeBinding, now: float, args: _Args) -> dict[str, object]:
    return {
        "repo_id": "", "worktree_id": "", "branch": "", "commit_sha": "", "current_repo_id": "",
        "current_worktree_id": "", "expires_at": 0.0, "invocation_id": "",
        **_CLEAR_SWITCH, **_CLEAR_FAILURE,
    }  # fmt: skip


def _switch_requested(record: WorktreeBinding, now: float, args: _Args) -> dict[str, object]:
    location = _need_location(args, "target_worktree_id")
    if location == record.home:
        raise ValidationError.for_field(
            "target_worktree_id", f"{location} is the agent's home worktree already"
        )
    return {
        "target_repo_id": location.repo_id,
        "target_worktree_id": location.worktree_id,
        "ttl_s": _ttl(args.ttl_s, args.policy),
        "invocation_id": "",
    }


def _approved(record: WorktreeBinding, now: float, args: _Args) -> dict[str, object]:
    target = record.target
    assert target is not None, "a SWITCH_PENDING record names its target"
    if args.location is not None and args.location.worktree_id != target.worktree_id:
        raise ValidationError.for_field(
            "target_worktree_id", f"the pending switch is to {target}, not {args.location}"
        )
    ttl = _ttl(args.ttl_s, args.policy) or record.ttl_s or args.policy.default_ttl_s
    return {
        "current_repo_id": target.repo_id, "current_worktree_id": target.worktree_id,
        "expires_at": now + ttl, "invocation_id": "", **_CLEAR_SWITCH,
    }  # fmt: skip


def _back_home(record: WorktreeBinding, now: float, args: _Args) -> dict[str, object]:
    return {
        "current_repo_id": record.repo_id, "current_worktree_id": record.worktree_id,
        "expires_at": 0.0, "invocation_id": "", **_CLEAR_SWITCH,
    }  # fmt: skip


_FIELDS: Final = MappingProxyType({
    _I.BIND_OK: _bound,
    _I.BIND_ERROR: _failed,
    _I.RETRY_OK: _retried,
    _I.RETRY_ERROR: _retry_failed,
    _I.RECOVERY_TIMEOUT: _escalated,
    _I.UNBIND: _unbound,
    _I.SWITCH_REQUEST: _switch_requested,
    _I.SWITCH_APPROVE: _approved,
    _I.SWITCH_REJECT: _back_home,
    _I.SWITCH_REVOKE: _back_home,
    _I.TTL_EXPIRED: _back_home,
})  # fmt: skip


def mermaid() -> str:
    """The state diagram of the table, for the docs; rows from 16.3 are marked "(16.3)"."""
    return BindingMachine.TRANSITIONS.mermaid(
        (_S.UNBOUND,), (), lambda row: row.state, loops=True, mark=_rfc_16_3_mark
    )


def _rfc_16_3_mark(state: BindingState, event: BindingInput, row: BindingRow) -> str:
    return " (16.3)" if (state, event) in RFC_16_3_ROWS else ""
