"""The runtime's agent tasks (the contract's task commands) as a pure, table-driven machine.

A runtime task is the contract's task: what an application asks an agent to do, with its
objective, profile, constraints, acceptance, progress, artifacts, evidence and edges to
other tasks, owned by the principal that created it (in one of its sessions). It runs as
Apiary Scheduler tasks, one per **run** (attempt): `start_task`, `resume_task` and
`retry_task` each submit a new run to the task's agent (or capability queue), and the
earlier runs are kept as they ended. The runtime record holds the contract's metadata; the
Scheduler holds the execution.

A task is created DRAFT (no run). START, RESUME and RETRY submit a run: QUEUED while it
waits for the agent, PREPARING once dispatched, RUNNING once the agent reads it; the run's
end is the task's (COMPLETED, FAILED) unless an intent says otherwise. PAUSE and CANCEL
record the intent first (`intent`), then stop the run (cancel it while it waits, ask the
agent to stop it while it runs): a paused task is PAUSED once its run stopped (RESUME
submits a new run), a cancelled one CANCELLING until then, then CANCELLED. COMPLETE and FAIL
are an owner's reconciliation of a task with no run in hand (a draft, a paused task); an
agent completes its run through the Scheduler instead.

`RuntimeTaskMachine.step(state, input)` gives the next state, the effects the control plane
performs (controlplane/tasks.py) and the contract events of the row; an input without a row
raises IllegalTransitionError and changes nothing. `run_input` says which input a change of
the current run's Scheduler task is.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from apiary.core.machine import TransitionTable
from apiary.core.records import TaskRecord, TaskState
from apiary.core.runtime.events import RuntimeEventType


class RuntimeTaskState(StrEnum):
    """Where a runtime task stands (the contract's `$defs.taskStatusValue` words)."""

    DRAFT = "draft"
    """Created; no run yet."""
    QUEUED = "queued"
    """Its run waits for the agent."""
    PREPARING = "preparing"
    """Its run was handed to the agent, which has not started it."""
    RUNNING = "running"
    PAUSED = "paused"
    """Its run stopped on a pause; RESUME submits a new one."""
    CANCELLING = "cancelling"
    """Cancelled while a run was in hand: the run is being stopped."""
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """Ended: only a retry (failed, cancelled) moves it again."""
        return self in (_S.COMPLETED, _S.FAILED, _S.CANCELLED)

    @property
    def active(self) -> bool:
        """A run is in hand (submitted and not ended)."""
        return self in (_S.QUEUED, _S.PREPARING, _S.RUNNING, _S.CANCELLING)


_S = RuntimeTaskState
OPEN_TASK_STATES: Final = frozenset(s.value for s in RuntimeTaskState if s.active)


class RunState(StrEnum):
    """Where one run (attempt) stands (`$defs.statusValue`)."""

    QUEUED = "queued"
    PREPARING = "preparing"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED)


class Intent(StrEnum):
    """What a task's owner asked for that its run has not reached yet."""

    NONE = ""
    PAUSE = "pause"
    CANCEL = "cancel"


class RuntimeTaskInput(StrEnum):
    START = "START"
    """start_task of a draft: its first run is submitted."""
    RESUME = "RESUME"
    """resume_task of a paused task: a new run is submitted."""
    RETRY = "RETRY"
    """retry_task of a failed or cancelled task: a new run is submitted, the old kept."""
    REFUSE = "REFUSE"
    """The Scheduler refused the new run."""
    DISPATCH = "DISPATCH"
    """The run was handed to the agent."""
    RUN = "RUN"
    """The agent started the run."""
    REQUEUE = "REQUEUE"
    """The run went back to its queue (the agent yielded it)."""
    COMPLETE_RUN = "COMPLETE_RUN"
    """The run COMPLETED: the agent's result is the task's."""
    FAIL_RUN = "FAIL_RUN"
    """The run FAILED on its own (or, cancelling, as it was stopped)."""
    STOP_RUN = "STOP_RUN"
    """The run ended as a pause stopped it."""
    LOSE = "LOSE"
    """The run's Scheduler task cannot be found."""
    PAUSE = "PAUSE"
    """pause_task while a run is in hand: the intent is recorded, the run stopped."""
    CANCEL = "CANCEL"
    """cancel_task: the intent is recorded first; a run in hand is stopped."""
    COMPLETE = "COMPLETE"
    """complete_task of a task with no run in hand (the owner's reconciliation)."""
    FAIL = "FAIL"
    """fail_task of a task with no run in hand."""


class RuntimeTaskEffect(StrEnum):
    PERSIST = "PERSIST"
    """Store the task (and its runs) with the row's events."""
    SUBMIT_RUN = "SUBMIT_RUN"
    """Submit a new run to the Scheduler and follow it."""
    STOP_RUN = "STOP_RUN"
    """Cancel the run while it waits, ask the agent to stop it while it runs."""
    CANCEL_CHILDREN = "CANCEL_CHILDREN"
    """Cancel the task's child tasks that have not ended (their intent first)."""


@dataclass(frozen=True, slots=True)
class RuntimeTaskStep:
    state: RuntimeTaskState
    effects: tuple[RuntimeTaskEffect, ...]
    events: tuple[str, ...]
    """The contract events the row emits, in order."""


_T = RuntimeEventType
_I = RuntimeTaskInput
_E = RuntimeTaskEffect
_P = (_E.PERSIST,)
_SUBMIT = (_E.PERSIST, _E.SUBMIT_RUN)
_CANCEL = (_E.PERSIST, _E.CANCEL_CHILDREN)
_STOP_CANCEL = (_E.PERSIST, _E.STOP_RUN, _E.CANCEL_CHILDREN)


def _new_run(events: tuple[str, ...]) -> RuntimeTaskStep:
    return RuntimeTaskStep(_S.QUEUED, _SUBMIT, (*events, _T.TASK_ATTEMPT_STARTED))


def _run_rows(state: RuntimeTaskState) -> dict[RuntimeTaskInput, RuntimeTaskStep]:
    """The rows of a task whose run is in hand (not yet cancelling)."""
    rows = {
        _I.COMPLETE_RUN: RuntimeTaskStep(
            _S.COMPLETED, _P, (_T.TASK_ATTEMPT_COMPLETED, _T.TASK_COMPLETED)
        ),
        _I.FAIL_RUN: RuntimeTaskStep(_S.FAILED, _P, (_T.TASK_ATTEMPT_FAILED, _T.TASK_FAILED)),
        _I.STOP_RUN: RuntimeTaskStep(_S.PAUSED, _P, (_T.TASK_ATTEMPT_FAILED, _T.TASK_PAUSED)),
        _I.LOSE: RuntimeTaskStep(_S.FAILED, _P, (_T.TASK_ATTEMPT_FAILED, _T.TASK_LOST)),
        _I.PAUSE: RuntimeTaskStep(state, (_E.PERSIST, _E.STOP_RUN), (_T.TASK_UPDATED,)),
        _I.CANCEL: RuntimeTaskStep(_S.CANCELLING, _STOP_CANCEL, (_T.TASK_CANCEL_REQUESTED,)),
    }
    if state is not _S.QUEUED:
        rows[_I.REQUEUE] = RuntimeTaskStep(_S.QUEUED, _P, (_T.TASK_QUEUED,))
    if state is _S.QUEUED:
        rows[_I.DISPATCH] = RuntimeTaskStep(_S.PREPARING, _P, (_T.RUN_STATUS,))
    if state is not _S.RUNNING:
        rows[_I.RUN] = RuntimeTaskStep(_S.RUNNING, _P, (_T.RUN_STATUS,))
    return rows


def _table() -> dict[RuntimeTaskState, dict[RuntimeTaskInput, RuntimeTaskStep]]:
    cancelled = (_T.TASK_CANCEL_REQUESTED, _T.TASK_CANCELLED)
    no_run = {
        _I.CANCEL: RuntimeTaskStep(_S.CANCELLED, _CANCEL, cancelled),
        _I.COMPLETE: RuntimeTaskStep(_S.COMPLETED, _P, (_T.TASK_COMPLETED,)),
        _I.FAIL: RuntimeTaskStep(_S.FAILED, _P, (_T.TASK_FAILED,)),
    }
    refused = RuntimeTaskStep(_S.FAILED, _P, (_T.TASK_ATTEMPT_FAILED, _T.TASK_FAILED))
    return {
        _S.DRAFT: {_I.START: _new_run((_T.TASK_STARTED,)), **no_run},
        _S.QUEUED: {_I.REFUSE: refused, **_run_rows(_S.QUEUED)},
        _S.PREPARING: _run_rows(_S.PREPARING),
        _S.RUNNING: _run_rows(_S.RUNNING),
        _S.PAUSED: {_I.RESUME: _new_run((_T.TASK_RESUMED,)), **no_run},
        _S.CANCELLING: {
            # The run ended: the task is cancelled, unless the agent finished it first.
            _I.COMPLETE_RUN: RuntimeTaskStep(
                _S.COMPLETED, _P, (_T.TASK_ATTEMPT_COMPLETED, _T.TASK_COMPLETED)
            ),
            _I.FAIL_RUN: RuntimeTaskStep(
                _S.CANCELLED, _P, (_T.TASK_ATTEMPT_FAILED, _T.TASK_CANCELLED)
            ),
            _I.STOP_RUN: RuntimeTaskStep(
                _S.CANCELLED, _P, (_T.TASK_ATTEMPT_FAILED, _T.TASK_CANCELLED)
            ),
            _I.LOSE: RuntimeTaskStep(_S.CANCELLED, _P, (_T.TASK_ATTEMPT_FAILED, _T.TASK_CANCELLED)),
            _I.REQUEUE: RuntimeTaskStep(_S.CANCELLING, _P, ()),
            _I.DISPATCH: RuntimeTaskStep(_S.CANCELLING, (), ()),
            _I.RUN: RuntimeTaskStep(_S.CANCELLING, (), ()),
        },
        _S.COMPLETED: {},
        _S.FAILED: {_I.RETRY: _new_run((_T.TASK_RETRYING,))},
        _S.CANCELLED: {_I.RETRY: _new_run((_T.TASK_RETRYING,))},
    }


class RuntimeTaskMachine:
    """The runtime task table with `step` as its operation."""

    TABLE: dict[RuntimeTaskState, dict[RuntimeTaskInput, RuntimeTaskStep]] = _table()
    TRANSITIONS: TransitionTable[RuntimeTaskState, RuntimeTaskInput, RuntimeTaskStep] = (
        TransitionTable(TABLE, "runtime task")
    )
    INITIAL: Final = _S.DRAFT
    CREATED: Final = (_T.TASK_CREATED,)
    """The events of a new task."""

    @classmethod
    def step(cls, state: RuntimeTaskState, event: RuntimeTaskInput) -> RuntimeTaskStep:
        """The row for (state, event); IllegalTransitionError when there is none."""
        return cls.TRANSITIONS.step(state, event)

    @classmethod
    def allows(cls, state: RuntimeTaskState, event: RuntimeTaskInput) -> bool:
        return cls.TRANSITIONS.allows(state, event)


STOPPED_CODES: Final = frozenset({"cancelled", "forced_preemption"})
"""Run error codes that, with an intent recorded, mean the intent stopped the run."""


def run_input(state: RuntimeTaskState, intent: Intent, run: TaskRecord) -> RuntimeTaskInput | None:
    """The input a stored state of the current run's Scheduler task is for the task, or
    None when it changes nothing. A run back in its queue while an intent is recorded is
    stopped again by the control plane (REQUEUE, then its stop)."""
    if not state.active:
        return None
    if run.state == TaskState.COMPLETED:
        return _I.COMPLETE_RUN
    if run.state == TaskState.FAILED:
        stopped = intent is Intent.PAUSE and run.error_code in STOPPED_CODES
        return _I.STOP_RUN if stopped else _I.FAIL_RUN
    if run.state == TaskState.RUNNING:
        return _I.RUN if state is not _S.RUNNING else None
    if run.state == TaskState.DISPATCHED:
        return _I.DISPATCH if state is _S.QUEUED else None
    if run.state in (TaskState.QUEUED, TaskState.HELD):
        return _I.REQUEUE if state in (_S.PREPARING, _S.RUNNING, _S.CANCELLING) else None
    return None


def run_state(task: TaskRecord) -> RunState:
    """A run's state from its Scheduler task."""
    if task.state == TaskState.COMPLETED:
        return RunState.COMPLETED
    if task.state == TaskState.FAILED:
        return RunState.CANCELLED if task.error_code in STOPPED_CODES else RunState.FAILED
    if task.state == TaskState.RUNNING:
        return RunState.RUNNING
    if task.state == TaskState.DISPATCHED:
        return RunState.PREPARING
    return RunState.QUEUED


def mermaid() -> str:
    """The state diagram of the table (docs/control-plane.md shows it)."""
    terminal = (_S.COMPLETED,)
    return RuntimeTaskMachine.TRANSITIONS.mermaid(
        (RuntimeTaskMachine.INITIAL,), terminal, lambda step: step.state, entry="CREATE"
    )
