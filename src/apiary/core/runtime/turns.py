"""The turn lifecycle of the runtime control plane as a pure, table-driven machine.

A submitted turn waits QUEUED in its thread's queue; when its thread is free it STARTs: its
Scheduler task is submitted and it is PREPARING until the agent runs it (RUNNING). Its task's
end is the turn's: COMPLETE with the agent's result, FAIL with its error, or STOP when the
task ended because the turn was interrupted (CANCELLED). A queued turn that is removed or
interrupted is CANCELled without ever having a task; one whose task could not be submitted is
REFUSEd. INTERRUPT records the intent first (the turn keeps its state, `interrupt` set) and
asks the Scheduler to cancel the task (while it waits) or to preempt it (while it runs). A
running task that yields back to its queue REQUEUEs the turn.

`TurnMachine.step(state, input)` gives the next state, the effects the control plane performs
(controlplane/turns.py) and the contract events the row emits; an input without a row raises
IllegalTransitionError and changes nothing. `task_inputs` says which inputs a change of the
turn's task is, in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from apiary.core.machine import TransitionTable
from apiary.core.records import TaskRecord, TaskState
from apiary.core.runtime.events import RuntimeEventType
from apiary.core.runtime.records import TurnRecord, TurnState
from apiary.core.runtime.snapshot import ThreadStatus

INTERRUPT_PREFIX: Final = "interrupt:"
"""How the reason of a preempt_request the control plane sends for an interrupted turn
starts: the agent is asked to stop the task, not to yield it (the SDK's runner then fails it
with `cancelled` at its next safe point; sdk/tasks.py)."""
STOPPED_CODES: Final = frozenset({"cancelled", "forced_preemption"})
"""Task error codes that, on an interrupted turn, mean the interrupt took effect."""


def is_interrupt(reason: str) -> bool:
    """Whether a preemption reason asks the task to stop (`INTERRUPT_PREFIX`)."""
    return reason.startswith(INTERRUPT_PREFIX)


class TurnInput(StrEnum):
    START = "START"
    """The thread is free: the turn's task was submitted."""
    REFUSE = "REFUSE"
    """The turn's task could not be submitted (an unknown agent, a refusal)."""
    CANCEL = "CANCEL"
    """The queued turn was removed or interrupted before it started."""
    RUN = "RUN"
    """The agent started the turn's task (RUNNING)."""
    REQUEUE = "REQUEUE"
    """The running task yielded back to its agent's queue."""
    COMPLETE = "COMPLETE"
    """The task COMPLETED: the agent's result is the turn's."""
    FAIL = "FAIL"
    """The task FAILED on its own."""
    STOP = "STOP"
    """The task ended because the turn was interrupted (cancelled, forced preemption)."""
    LOSE = "LOSE"
    """The task cannot be found any more."""
    INTERRUPT = "INTERRUPT"
    """An interrupt was asked for: record it, then cancel or preempt the task."""


class TurnEffect(StrEnum):
    PERSIST = "PERSIST"
    """Store the turn (and its thread) with the row's events."""
    FOLLOW_TASK = "FOLLOW_TASK"
    """Follow the task's changes (Scheduler.watch_tasks)."""
    CANCEL_TASK = "CANCEL_TASK"
    """Cancel the task while it waits (Scheduler.cancel)."""
    PREEMPT_TASK = "PREEMPT_TASK"
    """Ask the running task to stop (Scheduler.request_preemption, `INTERRUPT_PREFIX`)."""
    START_NEXT = "START_NEXT"
    """The thread is free: start its next queued turn."""


@dataclass(frozen=True, slots=True)
class TurnStep:
    state: TurnState
    effects: tuple[TurnEffect, ...]
    events: tuple[str, ...]
    """The contract events the row emits, in order."""


_T = RuntimeEventType
_S = TurnState
_I = TurnInput
_E = TurnEffect
_END = (_E.PERSIST, _E.START_NEXT)


def _task_rows() -> dict[TurnInput, TurnStep]:
    """The rows of a turn whose task exists (PREPARING or RUNNING)."""
    return {
        _I.COMPLETE: TurnStep(_S.COMPLETED, _END, (_T.TASK_COMPLETED, _T.TURN_COMPLETED)),
        _I.FAIL: TurnStep(_S.FAILED, _END, (_T.TASK_FAILED, _T.TURN_FAILED)),
        _I.STOP: TurnStep(_S.CANCELLED, _END, (_T.TASK_CANCELLED, _T.TURN_FAILED)),
        _I.LOSE: TurnStep(_S.FAILED, _END, (_T.TASK_LOST, _T.TURN_FAILED)),
    }


def _table() -> dict[TurnState, dict[TurnInput, TurnStep]]:
    return {
        _S.QUEUED: {
            _I.START: TurnStep(_S.PREPARING, (_E.PERSIST, _E.FOLLOW_TASK), (_T.TASK_CREATED,)),
            _I.REFUSE: TurnStep(_S.FAILED, _END, (_T.TURN_FAILED,)),
            _I.CANCEL: TurnStep(_S.CANCELLED, (_E.PERSIST,), (_T.TURN_FAILED,)),
        },
        _S.PREPARING: {
            _I.RUN: TurnStep(_S.RUNNING, (_E.PERSIST,), (_T.TASK_STARTED, _T.TURN_STARTED)),
            _I.INTERRUPT: TurnStep(
                _S.PREPARING, (_E.PERSIST, _E.CANCEL_TASK), (_T.TASK_CANCEL_REQUESTED,)
            ),
            **_task_rows(),
        },
        _S.RUNNING: {
            _I.REQUEUE: TurnStep(_S.PREPARING, (_E.PERSIST,), (_T.TASK_QUEUED,)),
            _I.INTERRUPT: TurnStep(
                _S.RUNNING, (_E.PERSIST, _E.PREEMPT_TASK), (_T.TASK_CANCEL_REQUESTED,)
            ),
            **_task_rows(),
        },
        _S.COMPLETED: {},
        _S.FAILED: {},
        _S.CANCELLED: {},
    }


class TurnMachine:
    """The turn table with `step` as its operation."""

    TABLE: dict[TurnState, dict[TurnInput, TurnStep]] = _table()
    TRANSITIONS: TransitionTable[TurnState, TurnInput, TurnStep] = TransitionTable(TABLE, "turn")
    INITIAL: Final = _S.QUEUED
    SUBMITTED: Final = (_T.TURN_SUBMITTED,)
    """The events of a new turn."""

    @classmethod
    def step(cls, state: TurnState, event: TurnInput) -> TurnStep:
        """The row for (state, event); IllegalTransitionError when there is none."""
        return cls.TRANSITIONS.step(state, event)

    @classmethod
    def allows(cls, state: TurnState, event: TurnInput) -> bool:
        return cls.TRANSITIONS.allows(state, event)


def task_inputs(turn: TurnRecord, task: TaskRecord) -> tuple[TurnInput, ...]:
    """The inputs a stored state of the turn's task is for the turn, in order; none when it
    changes nothing (a task still waiting for a turn that is PREPARING, say). A task that
    completed while the turn had not yet seen it run ran all the same: RUN comes first, so
    the turn reports it started before it completed."""
    state = TurnState(turn.state)
    if state.terminal or state is TurnState.QUEUED:
        return ()
    if task.state == TaskState.COMPLETED:
        ran = (TurnInput.RUN,) if state is TurnState.PREPARING else ()
        return (*ran, TurnInput.COMPLETE)
    if task.state == TaskState.FAILED:
        interrupted = bool(turn.interrupt) and task.error_code in STOPPED_CODES
        return (TurnInput.STOP if interrupted else TurnInput.FAIL,)
    if task.state == TaskState.RUNNING:
        return (TurnInput.RUN,) if state is TurnState.PREPARING else ()
    if task.state in (TaskState.QUEUED, TaskState.HELD):
        return (TurnInput.REQUEUE,) if state is TurnState.RUNNING else ()
    return ()  # DISPATCHED: the agent has not started it yet


def thread_status(active: TurnState | None, last_ended: TurnState | None, queued: int) -> str:
    """A thread's status (`$defs.thread.status`): its active turn's (waiting for the agent:
    queued), else queued when turns wait, else how its last turn ended, else idle."""
    if active is TurnState.RUNNING:
        return ThreadStatus.RUNNING.value
    if active is TurnState.PREPARING or queued:
        return ThreadStatus.QUEUED.value
    if last_ended is not None and last_ended.terminal:
        return last_ended.value
    return ThreadStatus.IDLE.value


def mermaid() -> str:
    """The state diagram of the table (docs/control-plane.md shows it)."""
    terminal = (s for s in _S if s.terminal)
    return TurnMachine.TRANSITIONS.mermaid(
        (TurnMachine.INITIAL,), terminal, lambda step: step.state, entry="SUBMIT"
    )
