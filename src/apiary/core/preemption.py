"""Cooperative preemption of one running task (RFC 7.1, 7.2; Appendix C.4, C.5) as a pure,
table-driven machine.

`should_preempt` is the trigger rule: only a strictly higher priority (a numerically lower
value) preempts; equal or lower never does.

`PreemptionMachine` follows one running task from RUNNING to one of three ends:

- YIELDED: the agent reached a safe point and yielded (C.4). The task is requeued (it keeps
  its place, see `apiary.core.tasks.queue`) and the higher-priority task is dispatched.
- TERMINATED: forced preemption's soft termination worked: the agent stopped within the
  grace period (C.5, "responds"). The task is marked FAILED with forced_preemption.
- KILLED: the grace period ran out: hard termination, FAILED with forced_preemption.

In between: NON_PREEMPTIBLE (the agent declared a section with a maximum duration),
PREEMPT_REQUESTED (PREEMPT_REQUEST sent; waiting for a safe point), DEFERRED (a request is
pending inside a declared section) and TERMINATING (TERMINATE{grace_ms} sent).

Each method takes the record, an input and `now` and returns a `PreemptionStep`: the new
record, the effects in order, and the grace period or error code the effects need. The record
holds the one timer a state has (`deadline`); START_TIMER arms it, and the engine calls
`deadline(record, now)` when it fires. An input with no row raises `IllegalTransitionError`.

Decisions where the RFC is silent:
- A PREEMPT_REQUEST is sent at once even inside a section (C.5 shows it); only the forcing
  waits. The wait for a safe point is `safe_point_timeout_s` (default 30 s), counted from the
  request, or from the end of the section when the request arrived inside one.
- A section declared while a request is pending is honoured until its own maximum duration
  (RFC 7.2 MUST defer). The safe-point window keeps running meanwhile: leaving the section
  after the window has closed arms the timer at `now`, which starts forced preemption at once
  (it still begins with a soft TERMINATE). So an agent cannot postpone preemption for ever
  by opening sections one after another.
- Sections do not nest and cannot be renewed: a second declaration is illegal; otherwise an
  agent could extend its own maximum duration without bound.
- A section whose maximum duration passes with no request pending lapses: the task is
  RUNNING (preemptible) again.
- A yield that races TERMINATE (the agent reached its safe point before the signal) counts
  as a yield: the task stopped where its state is consistent, so it is requeued, not failed.
- Section declarations and ends that race TERMINATE are ignored: forced preemption is not
  deferred once started.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum, StrEnum
from typing import Final

from apiary.core.machine import TransitionTable
from apiary.core.tasks.queue import validate_priority
from apiary.errors import ForcedPreemptionError, ValidationError

DEFAULT_SAFE_POINT_TIMEOUT_S: Final = 30.0
DEFAULT_GRACE_S: Final = 3.0
DEFAULT_MAX_SECTION_S: Final = 300.0
"""Five minutes: room for a transaction or an atomic file operation, not for a whole task."""
"""Appendix C.5: TERMINATE{grace_ms:3000}."""
FORCED_PREEMPTION: Final = ForcedPreemptionError.code


def should_preempt(running_priority: int, incoming_priority: int) -> bool:
    """Whether a task of `incoming_priority` preempts one running at `running_priority`.

    RFC 7.1: -19 is the highest priority; only a numerically lower (strictly higher priority)
    value preempts. Both are validated (ValidationError, field "priority").
    """
    return validate_priority(incoming_priority) < validate_priority(running_priority)


class PreemptionState(StrEnum):
    """Where the running task stands with respect to preemption."""

    RUNNING = "RUNNING"
    NON_PREEMPTIBLE = "NON_PREEMPTIBLE"
    """The agent declared a non-preemptible section; no preemption is pending."""
    PREEMPT_REQUESTED = "PREEMPT_REQUESTED"
    """PREEMPT_REQUEST sent; waiting for the agent's next safe point."""
    DEFERRED = "DEFERRED"
    """A preemption is pending inside a declared section: deferred until it ends or expires."""
    TERMINATING = "TERMINATING"
    """Forced preemption: soft TERMINATE sent, the grace period runs."""
    YIELDED = "YIELDED"
    TERMINATED = "TERMINATED"
    KILLED = "KILLED"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL: Final = frozenset(
    {PreemptionState.YIELDED, PreemptionState.TERMINATED, PreemptionState.KILLED}
)


class PreemptionInput(StrEnum):
    """Inputs of the table; the machine's methods choose one each."""

    REQUEST_PREEMPT = "REQUEST_PREEMPT"
    """A strictly higher-priority task wants this agent (`should_preempt`)."""
    ENTER_SECTION = "ENTER_SECTION"
    """The agent declared a non-preemptible section with a maximum duration."""
    LEAVE_SECTION = "LEAVE_SECTION"
    SAFE_POINT_YIELD = "SAFE_POINT_YIELD"
    """The agent reached a safe point and yielded (ACK FULFILLED, yielded)."""
    TERMINATED = "TERMINATED"
    """The agent stopped after TERMINATE (ACK FULFILLED, terminated)."""
    DEADLINE = "DEADLINE"
    """The state's timer fired."""


class PreemptionEffect(StrEnum):
    """What the engine does after a step, in the order the step lists them."""

    SEND_PREEMPT_REQUEST = "SEND_PREEMPT_REQUEST"
    """CONTROL PREEMPT_REQUEST to the agent."""
    SEND_TERMINATE = "SEND_TERMINATE"
    """Soft termination: TERMINATE{grace_ms: step.grace_ms}."""
    KILL = "KILL"
    """Hard termination of the agent's execution."""
    MARK_FAILED = "MARK_FAILED"
    """The task ends FAILED with error_code = step.error_code (forced_preemption)."""
    REQUEUE_TASK = "REQUEUE_TASK"
    """Put the task back in its queue, keeping its place."""
    DISPATCH_HIGHER = "DISPATCH_HIGHER"
    """The agent is free: dispatch the higher-priority task that asked for it."""
    START_TIMER = "START_TIMER"
    """(Re-)arm the timer at `record.deadline`; it calls `deadline` when it fires."""
    CANCEL_TIMER = "CANCEL_TIMER"


@dataclass(frozen=True, slots=True)
class PreemptionPolicy:
    """Time limits of cooperative and forced preemption (seconds)."""

    safe_point_timeout_s: float = DEFAULT_SAFE_POINT_TIMEOUT_S
    """How long a PREEMPT_REQUEST waits for a safe point before forced preemption."""
    grace_s: float = DEFAULT_GRACE_S
    """The soft termination's grace period before hard termination."""
    max_section_s: float = DEFAULT_MAX_SECTION_S
    """The longest non-preemptible section an agent may declare: sections are for short
    critical work (transactions, atomic file operations), to be used sparingly (RFC 7.2)."""

    def __post_init__(self) -> None:
        for name in ("safe_point_timeout_s", "grace_s", "max_section_s"):
            _duration(getattr(self, name), f"preemption.{name}")

    @property
    def grace_ms(self) -> int:
        return round(self.grace_s * 1000)


@dataclass(frozen=True, slots=True)
class PreemptionRecord:
    """The preemption state of one running task.

    `deadline` is the state's timer (section end, safe-point wait, grace period), None in
    RUNNING and the end states. `safe_point_due` is when a pending request stops waiting for a
    safe point; None while a request that arrived inside a section waits for it to end.
    """

    task_id: str
    state: PreemptionState = PreemptionState.RUNNING
    deadline: float | None = None
    safe_point_due: float | None = None
    updated_at: float = 0.0


@dataclass(frozen=True, slots=True)
class PreemptionRow:
    """One table entry: the next state and the effects, in order."""

    state: PreemptionState
    effects: tuple[PreemptionEffect, ...]


@dataclass(frozen=True, slots=True)
class PreemptionStep:
    """A transition's result: the record to keep and the effects to perform in order.

    `grace_ms` is set with SEND_TERMINATE, `error_code` with MARK_FAILED.
    """

    record: PreemptionRecord
    effects: tuple[PreemptionEffect, ...]
    grace_ms: int | None = None
    error_code: str | None = None


_S = PreemptionState
_I = PreemptionInput
_F = PreemptionEffect


def _table() -> dict[PreemptionState, dict[PreemptionInput, PreemptionRow]]:
    terminate = PreemptionRow(_S.TERMINATING, (_F.SEND_TERMINATE, _F.START_TIMER))
    yielded = PreemptionRow(_S.YIELDED, (_F.CANCEL_TIMER, _F.REQUEUE_TASK, _F.DISPATCH_HIGHER))
    ignored = PreemptionRow(_S.TERMINATING, ())
    return {
        _S.RUNNING: {
            _I.REQUEST_PREEMPT: PreemptionRow(
                _S.PREEMPT_REQUESTED, (_F.SEND_PREEMPT_REQUEST, _F.START_TIMER)
            ),
            _I.ENTER_SECTION: PreemptionRow(_S.NON_PREEMPTIBLE, (_F.START_TIMER,)),
        },
        _S.NON_PREEMPTIBLE: {
            # The agent learns of the request now; the scheduler defers forcing it (C.5).
            _I.REQUEST_PREEMPT: PreemptionRow(_S.DEFERRED, (_F.SEND_PREEMPT_REQUEST,)),
            _I.LEAVE_SECTION: PreemptionRow(_S.RUNNING, (_F.CANCEL_TIMER,)),
            _I.DEADLINE: PreemptionRow(_S.RUNNING, ()),
        },
        _S.PREEMPT_REQUESTED: {
            _I.REQUEST_PREEMPT: PreemptionRow(_S.PREEMPT_REQUESTED, ()),
            _I.ENTER_SECTION: PreemptionRow(_S.DEFERRED, (_F.START_TIMER,)),
            _I.SAFE_POINT_YIELD: yielded,
            _I.DEADLINE: terminate,
        },
        _S.DEFERRED: {
            _I.REQUEST_PREEMPT: PreemptionRow(_S.DEFERRED, ()),
            _I.LEAVE_SECTION: PreemptionRow(_S.PREEMPT_REQUESTED, (_F.START_TIMER,)),
            _I.SAFE_POINT_YIELD: yielded,
            _I.DEADLINE: terminate,
        },
        _S.TERMINATING: {
            _I.REQUEST_PREEMPT: ignored,
            _I.ENTER_SECTION: ignored,
            _I.LEAVE_SECTION: ignored,
            _I.SAFE_POINT_YIELD: yielded,
            _I.TERMINATED: PreemptionRow(
                _S.TERMINATED, (_F.CANCEL_TIMER, _F.MARK_FAILED, _F.DISPATCH_HIGHER)
            ),
            _I.DEADLINE: PreemptionRow(_S.KILLED, (_F.KILL, _F.MARK_FAILED, _F.DISPATCH_HIGHER)),
        },
        _S.YIELDED: {},
        _S.TERMINATED: {},
        _S.KILLED: {},
    }


class PreemptionMachine:
    """The preemption table and the transitions that apply it to a record."""

    TABLE: dict[PreemptionState, dict[PreemptionInput, PreemptionRow]] = _table()
    TRANSITIONS: TransitionTable[PreemptionState, PreemptionInput, PreemptionRow] = TransitionTable(
        TABLE, "preemption"
    )

    @classmethod
    def row(cls, state: PreemptionState, event: PreemptionInput) -> PreemptionRow:
        """The table's row for (state, event); IllegalTransitionError when there is none."""
        return cls.TRANSITIONS.step(state, event)

    @classmethod
    def allows(cls, state: PreemptionState, event: PreemptionInput) -> bool:
        return cls.TRANSITIONS.allows(state, event)

    @staticmethod
    def start(task_id: str, now: float) -> PreemptionRecord:
        """The record of a task that just started running."""
        if not isinstance(task_id, str) or not task_id:
            raise ValidationError.for_field("task_id", "must be a non-empty string")
        return PreemptionRecord(task_id=task_id, updated_at=_time(now))

    @classmethod
    def request_preempt(
        cls, record: PreemptionRecord, now: float, policy: PreemptionPolicy
    ) -> PreemptionStep:
        """A strictly higher-priority task wants the agent. Repeats change nothing."""
        row = cls.row(record.state, _I.REQUEST_PREEMPT)
        if record.state is _S.RUNNING:
            due = _time(now) + policy.safe_point_timeout_s
            return _apply(record, row, now, deadline=due, safe_point_due=due)
        if record.state is _S.NON_PREEMPTIBLE:
            # The safe-point window opens when the section ends.
            return _apply(record, row, now, deadline=record.deadline, safe_point_due=None)
        return _apply(record, row, now)

    @classmethod
    def enter_section(
        cls, record: PreemptionRecord, max_duration: float, now: float
    ) -> PreemptionStep:
        """The agent declared a non-preemptible section of at most `max_duration` seconds.

        ValidationError (field "max_duration") unless it is a positive, finite duration.
        """
        row = cls.row(record.state, _I.ENTER_SECTION)
        if row.state is _S.TERMINATING:
            return _apply(record, row, now)
        ends = _time(now) + _duration(max_duration, "max_duration")
        return _apply(record, row, now, deadline=ends)

    @classmethod
    def leave_section(
        cls, record: PreemptionRecord, now: float, policy: PreemptionPolicy
    ) -> PreemptionStep:
        """The agent's non-preemptible section ended."""
        row = cls.row(record.state, _I.LEAVE_SECTION)
        if row.state is _S.PREEMPT_REQUESTED:
            at = _time(now)
            due = record.safe_point_due
            due = at + policy.safe_point_timeout_s if due is None else due
            return _apply(record, row, now, deadline=max(due, at), safe_point_due=due)
        if row.state is _S.RUNNING:
            return _apply(record, row, now, deadline=None)
        return _apply(record, row, now)

    @classmethod
    def safe_point_yield(cls, record: PreemptionRecord, now: float) -> PreemptionStep:
        """The agent reached a safe point and yielded (C.4: ACK FULFILLED, yielded)."""
        row = cls.row(record.state, _I.SAFE_POINT_YIELD)
        return _apply(record, row, now, deadline=None, safe_point_due=None)

    @classmethod
    def terminated(cls, record: PreemptionRecord, now: float) -> PreemptionStep:
        """The agent stopped within the grace period (C.5: ACK FULFILLED, terminated)."""
        row = cls.row(record.state, _I.TERMINATED)
        step = _apply(record, row, now, deadline=None, safe_point_due=None)
        return replace(step, error_code=FORCED_PREEMPTION)

    @classmethod
    def deadline(
        cls, record: PreemptionRecord, now: float, policy: PreemptionPolicy
    ) -> PreemptionStep:
        """The state's timer fired. Before `record.deadline` (a stale or early timer) this
        changes nothing and returns no effects."""
        row = cls.row(record.state, _I.DEADLINE)
        at = _time(now)
        if record.deadline is not None and at < record.deadline:
            return PreemptionStep(record, ())
        if row.state is _S.TERMINATING:
            step = _apply(record, row, now, deadline=at + policy.grace_s, safe_point_due=None)
            return replace(step, grace_ms=policy.grace_ms)
        if row.state is _S.KILLED:
            step = _apply(record, row, now, deadline=None)
            return replace(step, error_code=FORCED_PREEMPTION)
        return _apply(record, row, now, deadline=None)


class _Keep(Enum):
    """Sentinel for "leave this field as it is" (None is a value: "no timer")."""

    KEEP = "KEEP"


_KEEP: Final = _Keep.KEEP


def _apply(
    record: PreemptionRecord,
    row: PreemptionRow,
    now: float,
    *,
    deadline: float | _Keep | None = _KEEP,
    safe_point_due: float | _Keep | None = _KEEP,
) -> PreemptionStep:
    new = replace(
        record,
        state=row.state,
        updated_at=_time(now),
        deadline=record.deadline if isinstance(deadline, _Keep) else deadline,
        safe_point_due=(
            record.safe_point_due if isinstance(safe_point_due, _Keep) else safe_point_due
        ),
    )
    return PreemptionStep(new, row.effects)


def _time(now: float) -> float:
    if isinstance(now, bool) or not isinstance(now, int | float) or not math.isfinite(now):
        raise ValidationError.for_field("now", "must be a finite number")
    return float(now)


def _duration(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError.for_field(name, "must be a positive duration")
    if not 0 < value < math.inf:
        raise ValidationError.for_field(name, "must be a positive duration")
    return float(value)


def mermaid() -> str:
    """The state diagram of the table, for the docs."""
    terminal = (s for s in PreemptionState if s.terminal)
    return PreemptionMachine.TRANSITIONS.mermaid((_S.RUNNING,), terminal, lambda row: row.state)
