"""The agent lifecycle of RFC 8 as a pure, table-driven machine.

States are the twelve of RFC 8.1 (`sw4rm.common.AgentState`). `AgentLifecycleMachine.step`
takes (state, input, now) plus when the state was entered and the agent's `LifecycleTimeouts`,
and returns a `LifecycleStep`: the next state, the effects the engine performs in order, the
error code the agent's record takes, and the deadline of the timer to arm. An input the table
has no row for raises `IllegalTransitionError` and changes nothing. Time is always an argument.

Every row cites the RFC text behind it. Rows the RFC draws (8.1, 8.2, 8.3, the Appendix B
diagram) are plain; the few rows the RFC implies without drawing are in `DERIVED_ROWS`:
- INITIALIZING + INIT_FAILED -> FAILED: an agent that knows its start-up failed need not wait
  60 s for init_timeout (8.1: FAILED is "an unrecoverable error").
- RUNNABLE + SHUTDOWN -> SHUTTING_DOWN: an idle agent must be able to shut down too (8.4 speaks
  of "its current task" only "if time permits"); the RFC draws shutdown from RUNNING only.
  SCHEDULED + SHUTDOWN likewise: the assigned task may still complete within the grace.
- SHUTTING_DOWN + COMPLETE stays SHUTTING_DOWN: 8.4 "MAY complete its current task".
- SHUTTING_DOWN + SHUTDOWN_COMPLETE stays SHUTTING_DOWN with DEREGISTER: the RFC has no state
  after a graceful shutdown (the proto enum neither), so the agent's lifecycle ends there and
  the engine removes its registration.
- LOST -> FAILED from every state that holds or may take a task (RUNNABLE through COMPLETED):
  the coordinator lost the agent (it missed its heartbeats, RFC 14), which for the Scheduler
  is an unrecoverable error until the agent shows up again (8.1 FAILED; recovery follows as
  for any failure). Its tasks are abandoned: a shared-queue task goes back to its queue. The
  agent is not deregistered (RFC 14: not solely for missed heartbeats).

Other decisions where the RFC is silent:
- Only RUNNABLE accepts task assignments (`accepts_tasks`): 8.1 makes RUNNABLE the state that
  "MUST be available to receive task assignments"; every other state either holds a task
  (SCHEDULED ... RESUMED), must not take one (INITIALIZING, SHUTTING_DOWN), or has not finished
  with the last (COMPLETED: cleanup and reporting come first) or with a failure (FAILED,
  RECOVERING). SUSPENDED keeps its preserved task, so it takes no other.
- A deadline is due at `entered_at + timeout` inclusive: at the boundary the timeout applies.
- A timer that fires before its deadline changes nothing and re-arms (as HITL deadlines do).
- The WAITING timeout is off by default (8.3: "no default (task-specific)"); when configured
  it escalates to HITL once and the agent stays WAITING ("MAY escalate to HITL"): the HITL
  decision is the awaited event.
- Failures the agent reports (INIT_FAILED, FAIL, RECOVERY_FAILED) carry the code it gives,
  internal_error when it gives none; timeouts carry their fixed 8.3 code.
- FAILED + RECOVER is always a legal row; whether to recover automatically is the policy's
  call (8.1: "depending on the failure type"). `auto_recovery_allowed` refuses
  agent_shutdown_timeout, since recovering would undo a requested shutdown (8.4: the code
  "MUST be distinct ... to enable appropriate remediation").
- Shutdown is not accepted in FAILED, SUSPENDED, WAITING, ...: the RFC draws it from RUNNING
  and RECOVERING only (plus RUNNABLE above). A repeated shutdown request is illegal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from apiary.core.machine import TransitionTable
from apiary.errors import (
    AgentShutdownTimeoutError,
    ApiaryError,
    InitTimeoutError,
    InternalError,
    RecoveryTimeoutError,
    ResourceTimeoutError,
    SuspendTimeoutError,
    ValidationError,
)


class AgentLifecycleState(StrEnum):
    """Agent lifecycle states (RFC 8.1), named and numbered as `sw4rm.common.AgentState`.

    FAILED is FAILED_STATE on the wire (the proto name avoids a clash in its package).
    """

    INITIALIZING = "INITIALIZING"
    RUNNABLE = "RUNNABLE"
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    WAITING = "WAITING"
    WAITING_RESOURCES = "WAITING_RESOURCES"
    SUSPENDED = "SUSPENDED"
    RESUMED = "RESUMED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    RECOVERING = "RECOVERING"


_S = AgentLifecycleState

PROTO_NUMBERS: Final[Mapping[AgentLifecycleState, int]] = MappingProxyType(
    {state: number for number, state in enumerate(_S, start=1)}
)
"""`sw4rm.common.AgentState` numbers; 0 is AGENT_STATE_UNSPECIFIED and has no state."""
PROTO_NAMES: Final[Mapping[AgentLifecycleState, str]] = MappingProxyType(
    {state: ("FAILED_STATE" if state is _S.FAILED else state.value) for state in _S}
)
_BY_NUMBER: Final = {number: state for state, number in PROTO_NUMBERS.items()}
_BY_NAME: Final = {**{s.value: s for s in _S}, **{n: s for s, n in PROTO_NAMES.items()}}


def to_proto(state: AgentLifecycleState) -> int:
    """The `sw4rm.common.AgentState` number of `state`."""
    return PROTO_NUMBERS[state]


def from_proto(number: int) -> AgentLifecycleState:
    """The state for an `AgentState` number; ValidationError for 0 (unspecified) or unknown."""
    found = _BY_NUMBER.get(number)
    if found is None:
        raise ValidationError.for_field("state", f"not an agent state number: {number!r}")
    return found


def parse_state(value: object) -> AgentLifecycleState:
    """A state from its name in any case (FAILED or FAILED_STATE) or its proto number."""
    if isinstance(value, int) and not isinstance(value, bool):
        return from_proto(value)
    found = _BY_NAME.get(value.strip().upper()) if isinstance(value, str) else None
    if found is None:
        raise ValidationError.for_field("state", f"not an agent state: {value!r}")
    return found


class AgentInput(StrEnum):
    """What moves an agent (RFC 8.1, 8.2, 8.3). Reported by the agent unless said otherwise."""

    INITIALIZED = "INITIALIZED"
    """Identity established, registered with the Scheduler, environment prepared."""
    INIT_FAILED = "INIT_FAILED"
    SCHEDULE = "SCHEDULE"
    """Scheduler: a task is assigned to the agent."""
    START = "START"
    """Execution of the assigned task begins (the task is dispatched)."""
    WAIT = "WAIT"
    """Execution waits for an external event (user input, a service, another agent)."""
    INPUT_RECEIVED = "INPUT_RECEIVED"
    """The awaited event occurred."""
    RESOURCES_NEEDED = "RESOURCES_NEEDED"
    RESOURCES_AVAILABLE = "RESOURCES_AVAILABLE"
    SUSPEND = "SUSPEND"
    """Scheduler: pause for higher-priority preemption or maintenance."""
    RESUME = "RESUME"
    """Scheduler: conditions permit resuming a suspended agent."""
    RESTORED = "RESTORED"
    """A resumed agent reconstructed its state and returns to RUNNING."""
    COMPLETE = "COMPLETE"
    """The assigned task finished successfully."""
    REPORTED = "REPORTED"
    """Cleanup and result reporting after COMPLETED are done."""
    FAIL = "FAIL"
    """An unrecoverable error during execution."""
    LOST = "LOST"
    """Coordinator: the agent missed its heartbeats (RFC 14); it may be gone."""
    RECOVER = "RECOVER"
    """Scheduler or policy: start recovery of a failed agent."""
    RECOVERED = "RECOVERED"
    RECOVERY_FAILED = "RECOVERY_FAILED"
    SHUTDOWN = "SHUTDOWN"
    """Operator or policy: shut the agent down gracefully (RFC 8.4)."""
    SHUTDOWN_COMPLETE = "SHUTDOWN_COMPLETE"
    """The agent finished its graceful termination within the grace period."""
    INIT_TIMEOUT = "INIT_TIMEOUT"
    WAITING_TIMEOUT = "WAITING_TIMEOUT"
    RESOURCE_TIMEOUT = "RESOURCE_TIMEOUT"
    SUSPEND_TIMEOUT = "SUSPEND_TIMEOUT"
    RECOVERY_TIMEOUT = "RECOVERY_TIMEOUT"
    SHUTDOWN_TIMEOUT = "SHUTDOWN_TIMEOUT"
    """The grace period passed (RFC 8.4 grace timeout)."""


_I = AgentInput

TIMEOUT_INPUTS: Final[Mapping[AgentLifecycleState, AgentInput]] = MappingProxyType({
    _S.INITIALIZING: _I.INIT_TIMEOUT,
    _S.WAITING: _I.WAITING_TIMEOUT,
    _S.WAITING_RESOURCES: _I.RESOURCE_TIMEOUT,
    _S.SUSPENDED: _I.SUSPEND_TIMEOUT,
    _S.RECOVERING: _I.RECOVERY_TIMEOUT,
    _S.SHUTTING_DOWN: _I.SHUTDOWN_TIMEOUT,
})  # fmt: skip
"""The timed states of RFC 8.3 and the input their deadline produces."""

TIMEOUT_ERRORS: Final[Mapping[AgentLifecycleState, type[ApiaryError]]] = MappingProxyType({
    _S.INITIALIZING: InitTimeoutError,
    _S.WAITING_RESOURCES: ResourceTimeoutError,
    _S.SUSPENDED: SuspendTimeoutError,
    _S.RECOVERING: RecoveryTimeoutError,
    _S.SHUTTING_DOWN: AgentShutdownTimeoutError,
})  # fmt: skip
"""The error each 8.3 timeout fails the agent with; WAITING's timeout fails nothing."""

REPORTED_FAILURES: Final = frozenset({_I.INIT_FAILED, _I.FAIL, _I.RECOVERY_FAILED, _I.LOST})
"""Inputs whose error code the reporter supplies (internal_error when it supplies none; the
presence check reports LOST with agent_unavailable)."""


class LifecycleEffect(StrEnum):
    """What the engine does after a step, in the order the step lists them."""

    PERSIST = "PERSIST"
    """Store the new state, when it was entered (`now`) and the step's error code."""
    CANCEL_TIMER = "CANCEL_TIMER"
    """Disarm the deadline of the state left (a timer that fired needs no cancelling)."""
    START_TIMER = "START_TIMER"
    """Arm the new state's deadline at `LifecycleStep.deadline`."""
    STOP_DISPATCH = "STOP_DISPATCH"
    """Dispatch no new task to the agent; route its queued assignments elsewhere (RFC 8.4)."""
    ABANDON_TASK = "ABANDON_TASK"
    """End the agent's current task, if it holds one, and report it incomplete (RFC 8.4)."""
    RELEASE_RESOURCES = "RELEASE_RESOURCES"
    """Clean up the agent's files, connections, locks and other resources (RFC 8.4)."""
    ESCALATE_TO_HITL = "ESCALATE_TO_HITL"
    """Open a HITL invocation for an agent waiting too long (RFC 8.3, WAITING)."""
    NOTIFY_AGENT = "NOTIFY_AGENT"
    """Tell the agent of a change the Scheduler decided (suspend, resume, shutdown, failure)."""
    DEREGISTER = "DEREGISTER"
    """The agent's lifecycle is over: remove its registration."""
    EMIT_EVENT = "EMIT_EVENT"
    """Append the transition to the event log (RFC 8.3: timeouts MUST be logged)."""


_F = LifecycleEffect


@dataclass(frozen=True, slots=True)
class LifecycleTimeouts:
    """Per-agent state timeouts in seconds (RFC 8.3 defaults; 8.2: configurable per agent
    type or task priority, so the engine picks an instance per agent).

    `shutting_down` is the shutdown grace period (RFC 8.4); `with_grace` sets one request's.
    `waiting` is None (no timeout) unless the application sets one.
    """

    initializing: float = 60.0
    waiting: float | None = None
    waiting_resources: float = 300.0
    suspended: float = 3600.0
    recovering: float = 120.0
    shutting_down: float = 30.0

    def __post_init__(self) -> None:
        for name in _TIMEOUT_FIELDS.values():
            value = getattr(self, name)
            if value is None and name == "waiting":
                continue
            if not _positive_duration(value):
                raise ValidationError.for_field(
                    f"timeouts.{name}", f"must be a positive number of seconds, got {value!r}"
                )

    def for_state(self, state: AgentLifecycleState) -> float | None:
        """The timeout of `state` in seconds; None for an untimed state."""
        name = _TIMEOUT_FIELDS.get(state)
        return None if name is None else getattr(self, name)

    def with_grace(self, grace_s: float | None) -> LifecycleTimeouts:
        """These timeouts with a shutdown request's grace period (None: keep the configured)."""
        return self if grace_s is None else replace(self, shutting_down=grace_s)


_TIMEOUT_FIELDS: Final = {
    _S.INITIALIZING: "initializing",
    _S.WAITING: "waiting",
    _S.WAITING_RESOURCES: "waiting_resources",
    _S.SUSPENDED: "suspended",
    _S.RECOVERING: "recovering",
    _S.SHUTTING_DOWN: "shutting_down",
}


def _positive_duration(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return 0 < value < math.inf


DEFAULT_TIMEOUTS: Final = LifecycleTimeouts()


def deadline_for(
    state: AgentLifecycleState, entered_at: float, timeouts: LifecycleTimeouts = DEFAULT_TIMEOUTS
) -> float | None:
    """When an agent that entered `state` at `entered_at` times out; None if it never does."""
    timeout = timeouts.for_state(state)
    return None if timeout is None else entered_at + timeout


def shutdown_deadline(now: float, grace_s: float) -> float:
    """The end of a grace period of `grace_s` seconds starting at `now` (RFC 8.4)."""
    if not _positive_duration(grace_s):
        raise ValidationError.for_field(
            "grace_period", f"must be a positive number of seconds, got {grace_s!r}"
        )
    return now + grace_s


def grace_remaining(
    now: float, entered_at: float, timeouts: LifecycleTimeouts = DEFAULT_TIMEOUTS
) -> float:
    """Seconds left for a SHUTTING_DOWN agent (entered at `entered_at`) to finish its task.

    0 once the grace period is over: RFC 8.4 then requires the task terminated as incomplete.
    """
    return max(0.0, entered_at + timeouts.shutting_down - now)


def accepts_tasks(state: AgentLifecycleState) -> bool:
    """Whether the Scheduler may assign a task to an agent in `state`: RUNNABLE only.

    Equal to `AgentLifecycleMachine.allows(state, AgentInput.SCHEDULE)`.
    """
    return state is _S.RUNNABLE


def auto_recovery_allowed(error_code: str) -> bool:
    """Whether policy may start recovery of an agent that failed with `error_code` on its own.

    Not after agent_shutdown_timeout: the agent was asked to go away; an operator decides.
    """
    return error_code != AgentShutdownTimeoutError.code


_REPORTS: Final[Mapping[tuple[AgentLifecycleState, AgentLifecycleState], AgentInput]] = (
    MappingProxyType({
        (_S.INITIALIZING, _S.RUNNABLE): _I.INITIALIZED,
        (_S.INITIALIZING, _S.FAILED): _I.INIT_FAILED,
        (_S.RUNNING, _S.WAITING): _I.WAIT,
        (_S.WAITING, _S.RUNNING): _I.INPUT_RECEIVED,
        (_S.RUNNING, _S.WAITING_RESOURCES): _I.RESOURCES_NEEDED,
        (_S.WAITING_RESOURCES, _S.RUNNING): _I.RESOURCES_AVAILABLE,
        (_S.RESUMED, _S.RUNNING): _I.RESTORED,
        (_S.RECOVERING, _S.RUNNABLE): _I.RECOVERED,
        (_S.RECOVERING, _S.FAILED): _I.RECOVERY_FAILED,
        (_S.RUNNING, _S.FAILED): _I.FAIL,
        (_S.COMPLETED, _S.RUNNABLE): _I.REPORTED,
    })
)  # fmt: skip


def input_for_report(
    current: AgentLifecycleState, reported: AgentLifecycleState
) -> AgentInput | None:
    """What an agent's own report of `reported` (its Heartbeat's `AgentState`) means for an
    agent the coordinator holds in `current`; None when the report moves nothing.

    An agent may only report the changes it makes itself: finishing start-up or recovery,
    waiting and resuming, failing, reporting a finished task. States the Scheduler drives
    (SCHEDULED, SUSPENDED, RESUMED, SHUTTING_DOWN, RECOVERING) and task completion, which
    the coordinator learns from the task's result, cannot be claimed by a heartbeat, and a
    report of the current state is just a heartbeat. Ignoring rather than refusing keeps a
    heartbeat that crossed a Scheduler decision on the wire from failing the agent.
    """
    return _REPORTS.get((current, reported))


@dataclass(frozen=True, slots=True)
class LifecycleRow:
    """One table entry: the next state, effects in order and the fixed error code ("" none)."""

    state: AgentLifecycleState
    effects: tuple[LifecycleEffect, ...]
    error_code: str = ""


@dataclass(frozen=True, slots=True)
class LifecycleStep:
    """A transition's result.

    `error_code` is the code the agent's record takes ("" for none: every non-FAILED state).
    `deadline` is when the timer START_TIMER arms fires (None when there is none to arm).
    `entered_at` is when the agent entered `state`: `now` for a change, unchanged otherwise.
    """

    state: AgentLifecycleState
    effects: tuple[LifecycleEffect, ...]
    error_code: str = ""
    deadline: float | None = None
    entered_at: float = 0.0
    input: AgentInput | None = None


_R = LifecycleRow
# Shapes shared by several rows.
_ENTER_SHUTDOWN = (_F.PERSIST, _F.STOP_DISPATCH, _F.START_TIMER, _F.NOTIFY_AGENT, _F.EMIT_EVENT)
_FAILURE = (_F.PERSIST, _F.ABANDON_TASK, _F.RELEASE_RESOURCES, _F.EMIT_EVENT)
_LOST = (_F.PERSIST, _F.CANCEL_TIMER, _F.ABANDON_TASK, _F.RELEASE_RESOURCES, _F.EMIT_EVENT)
"""A lost agent leaves its state, timer included (`step` drops the cancel of an untimed one)."""
_TIMED_OUT_FAILURE = (*_FAILURE, _F.NOTIFY_AGENT)
_TIMED_OUT_IDLE = (_F.PERSIST, _F.RELEASE_RESOURCES, _F.EMIT_EVENT, _F.NOTIFY_AGENT)
_ENDED = (_F.CANCEL_TIMER, _F.ABANDON_TASK, _F.RELEASE_RESOURCES, _F.DEREGISTER, _F.EMIT_EVENT)
_MOVE = (_F.PERSIST, _F.EMIT_EVENT)
_LEAVE_TIMED = (_F.PERSIST, _F.CANCEL_TIMER, _F.EMIT_EVENT)
_ENTER_TIMED = (_F.PERSIST, _F.START_TIMER, _F.EMIT_EVENT)


def _table() -> dict[AgentLifecycleState, dict[AgentInput, LifecycleRow]]:
    return {
        _S.INITIALIZING: {
            # 8.1 "MUST establish their identity, register with the Scheduler"; B: --> RUNNABLE
            _I.INITIALIZED: _R(_S.RUNNABLE, _LEAVE_TIMED),
            # derived: 8.1 FAILED "encountered an unrecoverable error" (during start-up)
            _I.INIT_FAILED: _R(_S.FAILED, (*_LEAVE_TIMED, _F.RELEASE_RESOURCES)),
            # 8.3 "60 seconds | Transition to FAILED with error_code=init_timeout"
            _I.INIT_TIMEOUT: _R(_S.FAILED, _TIMED_OUT_IDLE, InitTimeoutError.code),
        },
        _S.RUNNABLE: {
            # derived: the coordinator lost the agent (missed heartbeats, RFC 14)
            _I.LOST: _R(_S.FAILED, _LOST),
            # 8.1 RUNNABLE "MUST be available to receive task assignments"; B: --> SCHEDULED
            _I.SCHEDULE: _R(_S.SCHEDULED, _MOVE),
            # derived: 8.4 graceful shutdown of an idle agent (the RFC draws RUNNING only)
            _I.SHUTDOWN: _R(_S.SHUTTING_DOWN, _ENTER_SHUTDOWN),
        },
        _S.SCHEDULED: {
            # derived: the coordinator lost the agent (missed heartbeats, RFC 14)
            _I.LOST: _R(_S.FAILED, _LOST),
            # 8.1 "MUST NOT begin task execution until transitioning to RUNNING"; B: --> RUNNING
            _I.START: _R(_S.RUNNING, _MOVE),
            # derived: 8.4 shutdown of an agent whose task is assigned but not yet started
            _I.SHUTDOWN: _R(_S.SHUTTING_DOWN, _ENTER_SHUTDOWN),
        },
        _S.RUNNING: {
            # derived: the coordinator lost the agent (missed heartbeats, RFC 14)
            _I.LOST: _R(_S.FAILED, _LOST),
            # 8.1 WAITING "waiting for external events"; B: RUNNING --> WAITING
            _I.WAIT: _R(_S.WAITING, _ENTER_TIMED),
            # 8.1 "suspend execution when required resources ... are unavailable"
            _I.RESOURCES_NEEDED: _R(_S.WAITING_RESOURCES, _ENTER_TIMED),
            # 8.1 SUSPENDED "in response to Scheduler requests, typically for higher-priority
            # task preemption or system maintenance"; B: RUNNING --> SUSPENDED
            _I.SUSPEND: _R(_S.SUSPENDED, (*_ENTER_TIMED, _F.NOTIFY_AGENT)),
            # 8.1 COMPLETED "successfully finished their assigned task"; B: --> COMPLETED
            _I.COMPLETE: _R(_S.COMPLETED, _MOVE),
            # 8.1 FAILED "encountered an unrecoverable error"; B: RUNNING --> FAILED
            _I.FAIL: _R(_S.FAILED, _FAILURE),
            # 8.1 SHUTTING_DOWN "MAY complete their current task"; B: --> SHUTTING_DOWN
            _I.SHUTDOWN: _R(_S.SHUTTING_DOWN, _ENTER_SHUTDOWN),
        },
        _S.WAITING: {
            # derived: the coordinator lost the agent (missed heartbeats, RFC 14)
            _I.LOST: _R(_S.FAILED, _LOST),
            # 8.1 "execution MUST be suspended until the awaited event occurs"; B: --> RUNNING
            _I.INPUT_RECEIVED: _R(_S.RUNNING, _LEAVE_TIMED),
            # 8.3 "No default (task-specific) | Application-defined; MAY escalate to HITL"
            _I.WAITING_TIMEOUT: _R(_S.WAITING, (_F.ESCALATE_TO_HITL, _F.EMIT_EVENT)),
        },
        _S.WAITING_RESOURCES: {
            # derived: the coordinator lost the agent (missed heartbeats, RFC 14)
            _I.LOST: _R(_S.FAILED, _LOST),
            # 8.1 "MUST transition to RUNNING when resources become available"
            _I.RESOURCES_AVAILABLE: _R(_S.RUNNING, _LEAVE_TIMED),
            # 8.2 "beyond the configured resource acquisition timeout ... FAILED state with
            # error_code=resource_timeout"; 8.3 300 seconds
            _I.RESOURCE_TIMEOUT: _R(_S.FAILED, _TIMED_OUT_FAILURE, ResourceTimeoutError.code),
        },
        _S.SUSPENDED: {
            # derived: the coordinator lost the agent (missed heartbeats, RFC 14)
            _I.LOST: _R(_S.FAILED, _LOST),
            # 8.1 "MUST be capable of resuming when conditions permit"; B: --> RESUMED
            _I.RESUME: _R(_S.RESUMED, (*_LEAVE_TIMED, _F.NOTIFY_AGENT)),
            # 8.3 "3600 seconds | Transition to FAILED with error_code=suspend_timeout"
            _I.SUSPEND_TIMEOUT: _R(_S.FAILED, _TIMED_OUT_FAILURE, SuspendTimeoutError.code),
        },
        _S.RESUMED: {
            # derived: the coordinator lost the agent (missed heartbeats, RFC 14)
            _I.LOST: _R(_S.FAILED, _LOST),
            # 8.1 "state reconstruction and coordination before returning to the RUNNING state"
            _I.RESTORED: _R(_S.RUNNING, _MOVE),
        },
        _S.COMPLETED: {
            # derived: the coordinator lost the agent (missed heartbeats, RFC 14)
            _I.LOST: _R(_S.FAILED, _LOST),
            # 8.1 "MUST perform cleanup operations and result reporting before transitioning
            # to RUNNABLE state" (not drawn in B)
            _I.REPORTED: _R(_S.RUNNABLE, _MOVE),
        },
        _S.FAILED: {
            # 8.1 "Failed Agents MAY attempt automatic recovery"; B: FAILED --> RECOVERING
            _I.RECOVER: _R(_S.RECOVERING, (*_ENTER_TIMED, _F.NOTIFY_AGENT)),
        },
        _S.RECOVERING: {
            # 8.1 "MUST transition to either RUNNABLE (on success)"; B: --> RUNNABLE
            _I.RECOVERED: _R(_S.RUNNABLE, _LEAVE_TIMED),
            # 8.1 "... or FAILED (on recovery failure)"
            _I.RECOVERY_FAILED: _R(_S.FAILED, (*_LEAVE_TIMED, _F.RELEASE_RESOURCES)),
            # 8.3 "120 seconds | Transition to FAILED with error_code=recovery_timeout"
            _I.RECOVERY_TIMEOUT: _R(_S.FAILED, _TIMED_OUT_IDLE, RecoveryTimeoutError.code),
            # 8.2 "requests Agent shutdown while the Agent is in RECOVERING state ... MUST
            # transition the Agent to SHUTTING_DOWN"; B: recovery_abort
            _I.SHUTDOWN: _R(_S.SHUTTING_DOWN, (_F.CANCEL_TIMER, *_ENTER_SHUTDOWN)),
        },
        _S.SHUTTING_DOWN: {
            # derived: 8.4 "the Agent MAY complete its current task" within the grace period
            _I.COMPLETE: _R(_S.SHUTTING_DOWN, (_F.EMIT_EVENT,)),
            # derived: graceful termination done; 8.4 cleanup "regardless of shutdown method"
            _I.SHUTDOWN_COMPLETE: _R(_S.SHUTTING_DOWN, _ENDED),
            # 8.4 "exceeds its configured grace timeout ... mark it as FAILED with the error
            # code agent_shutdown_timeout"; 8.3 30 seconds
            _I.SHUTDOWN_TIMEOUT: _R(_S.FAILED, _TIMED_OUT_FAILURE, AgentShutdownTimeoutError.code),
        },
    }


DERIVED_ROWS: Final = frozenset({
    (_S.INITIALIZING, _I.INIT_FAILED),
    (_S.RUNNABLE, _I.SHUTDOWN),
    (_S.SCHEDULED, _I.SHUTDOWN),
    (_S.SHUTTING_DOWN, _I.COMPLETE),
    (_S.SHUTTING_DOWN, _I.SHUTDOWN_COMPLETE),
    *((state, _I.LOST) for state in (
        _S.RUNNABLE, _S.SCHEDULED, _S.RUNNING, _S.WAITING, _S.WAITING_RESOURCES, _S.SUSPENDED,
        _S.RESUMED, _S.COMPLETED,
    )),
})  # fmt: skip
"""Rows the RFC implies but does not draw (see the module docstring)."""


class AgentLifecycleMachine:
    """The agent lifecycle table with `step` and `timeout` as its operations."""

    TABLE: dict[AgentLifecycleState, dict[AgentInput, LifecycleRow]] = _table()
    TRANSITIONS: TransitionTable[AgentLifecycleState, AgentInput, LifecycleRow] = TransitionTable(
        TABLE, "agent lifecycle"
    )

    @classmethod
    def row(cls, state: AgentLifecycleState, event: AgentInput) -> LifecycleRow:
        """The table's row for (state, event); IllegalTransitionError when there is none."""
        return cls.TRANSITIONS.step(state, event)

    @classmethod
    def allows(cls, state: AgentLifecycleState, event: AgentInput) -> bool:
        return cls.TRANSITIONS.allows(state, event)

    @classmethod
    def step(
        cls,
        state: AgentLifecycleState,
        event: AgentInput,
        now: float,
        *,
        entered_at: float,
        timeouts: LifecycleTimeouts = DEFAULT_TIMEOUTS,
        error_code: str = "",
    ) -> LifecycleStep:
        """Apply `event` to an agent that entered `state` at `entered_at`.

        `error_code` is the reported code of INIT_FAILED, FAIL or RECOVERY_FAILED (empty:
        internal_error); any other input refuses one with ValidationError. A timeout input
        before its deadline (a stale timer) changes nothing and re-arms the timer.
        """
        found = cls.row(state, event)
        if error_code and event not in REPORTED_FAILURES:
            raise ValidationError.for_field("error_code", f"{event} carries no reported error code")
        if event in TIMEOUT_INPUTS.values():
            due = deadline_for(state, entered_at, timeouts)
            if due is None or now < due:
                rearm = () if due is None else (_F.START_TIMER,)
                return LifecycleStep(state, rearm, "", due, entered_at, event)
        code = found.error_code
        if event in REPORTED_FAILURES:
            code = error_code or InternalError.code
        changed = found.state is not state
        deadline = deadline_for(found.state, now, timeouts) if changed else None
        effects = tuple(
            e
            for e in found.effects
            if not (e is _F.START_TIMER and deadline is None)
            and not (e is _F.CANCEL_TIMER and deadline_for(state, entered_at, timeouts) is None)
        )
        return LifecycleStep(
            found.state, effects, code, deadline, now if changed else entered_at, event
        )

    @classmethod
    def timeout(
        cls,
        state: AgentLifecycleState,
        now: float,
        entered_at: float,
        timeouts: LifecycleTimeouts = DEFAULT_TIMEOUTS,
    ) -> LifecycleStep | None:
        """The timeout transition of `state` when its deadline is due at `now`, else None.

        Due means `now >= entered_at + timeout`. Untimed states (and WAITING without a
        configured timeout) never time out.
        """
        event = TIMEOUT_INPUTS.get(state)
        due = deadline_for(state, entered_at, timeouts)
        if event is None or due is None or now < due:
            return None
        return cls.step(state, event, now, entered_at=entered_at, timeouts=timeouts)


def mermaid() -> str:
    """The state diagram of the table, for the docs; derived rows are marked with "*".

    Every row is drawn, loops too; a row that deregisters the agent ends in `[*]`.
    """
    return AgentLifecycleMachine.TRANSITIONS.mermaid(
        (_S.INITIALIZING,), (), _drawn_target, loops=True, mark=_drawn_mark
    )


def _drawn_target(row: LifecycleRow) -> str:
    return "[*]" if _F.DEREGISTER in row.effects else str(row.state)


def _drawn_mark(state: AgentLifecycleState, event: AgentInput, row: LifecycleRow) -> str:
    code = f" ({row.error_code})" if row.error_code else ""
    return code + (" *" if (state, event) in DERIVED_ROWS else "")
