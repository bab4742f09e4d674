"""The task lifecycle of RFC 7 and 9 as a pure, table-driven machine.

A submission is QUEUED in its agent's queue (`TaskMachine.SUBMITTED`); a duplicate job is
HELD for a HITL authorization before it is ever queued (RFC 9.2). A queued task is
DISPATCHED as a DATA envelope, RUNNING once its agent READs it, and ends COMPLETED or
FAILED; a preempted task that yields at a safe point, one whose dispatch timed out with
attempts left, or a shared-queue task whose agent was lost with it (REQUEUE, below
`[scheduler] max_attempts`), goes back to QUEUED keeping its place.

`TaskMachine.step(state, event)` returns the next state, the effects the Scheduler performs
in their order and the event it logs (engine/scheduler/transitions.py performs them); an
input the table has no row for raises `IllegalTransitionError` and changes nothing. Which
task runs next (preempting, dispatching) is the Scheduler's policy, not a task's lifecycle:
a row asks for it only as WAKE (try the agent again from the background loop).

The inputs name their cause, so that the rows say what each cause does: FULFIL and FAIL are
the agent's own results and send the agent back to RUNNABLE (FREE_AGENT); ABANDON (the
agent's lifecycle or its deregistration ended the task) and TERMINATE (forced preemption)
come from the agent's side already. REQUEUE is ABANDON for a task any agent of its shared
queue may take: it goes back to that queue instead of failing.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from apiary.core.machine import TransitionTable
from apiary.core.records import TaskState

_S = TaskState


class TaskInput(StrEnum):
    HOLD = "HOLD"
    """A duplicate job waits for a HITL authorization (RFC 9.2)."""
    AUTHORIZE = "AUTHORIZE"
    """HITL approved the held duplicate: it queues."""
    DENY = "DENY"
    """HITL denied the held duplicate, or its decision was lost over a restart."""
    WAIT_WORKTREE = "WAIT_WORKTREE"
    """The head task needs a bound worktree its agent does not have (RFC 16.3)."""
    DEFER = "DEFER"
    """The head task waits behind running tasks whose scopes conflict (RFC 9.2)."""
    DISPATCH = "DISPATCH"
    """The router accepted the task's DATA envelope for the agent."""
    REFUSE = "REFUSE"
    """The router refused the DATA envelope (other than for a full buffer)."""
    READ = "READ"
    """The agent's READ ACK of the DATA envelope."""
    FULFIL = "FULFIL"
    """The agent's FULFILLED ACK: the result."""
    FAIL = "FAIL"
    """The agent's REJECTED or FAILED ACK, or a TIMED_OUT one with no attempt left."""
    RETRY = "RETRY"
    """The router gave up on an acknowledgement with attempts left: hand the task out again."""
    YIELD = "YIELD"
    """The agent yielded at a safe point under preemption (RFC 7.2): back to its queue."""
    CANCEL = "CANCEL"
    """An operator cancelled a task that has not started."""
    ABANDON = "ABANDON"
    """The agent's lifecycle ended the task (shutdown, failure) or the agent deregistered."""
    REQUEUE = "REQUEUE"
    """As ABANDON, for a shared-queue task with attempts left: back to its queue for the
    next capable agent."""
    TERMINATE = "TERMINATE"
    """Forced preemption ended the task: the agent terminated, or was killed."""


class TaskEffect(StrEnum):
    DEQUEUE = "DEQUEUE"
    """Take the task out of its agent's queue."""
    RELEASE = "RELEASE"
    """Free what the task holds: its agent's running slot and type instance, its preemption
    record and deadline, its conflict-gate entries; wake the agents waiting on them."""
    OCCUPY = "OCCUPY"
    """The task holds its agent: running slot, type instance, preemption record, gate."""
    PERSIST = "PERSIST"
    """Store the record, then keep its live copy (dropped once it ended) and job index."""
    EMIT_EVENT = "EMIT_EVENT"
    """Log the row's `task.*` event."""
    ENQUEUE = "ENQUEUE"
    """Put the task in its queue, its agent's or its shared queue (a requeued task keeps its
    place)."""
    REGISTER_ACTIVITY = "REGISTER_ACTIVITY"
    """Register the task's entry in the activity buffer (RFC 10) as it is dispatched: before
    its agent can start it (the agent starts a task before its READ is answered)."""
    COMPLETE_ACTIVITY = "COMPLETE_ACTIVITY"
    """Close the task's entries in the activity buffer (RFC 10): as it ends, or as it goes
    back to its queue (the attempt's entry, COMPLETED when it yielded, else FAILED)."""
    WAKE = "WAKE"
    """Try to dispatch to the task's agent again (offer a waiting shared task to its
    queue's agents), from the background loop."""
    ANNOUNCE_END = "ANNOUNCE_END"
    """Tell the end listeners (workflows) that the task ended."""
    SCHEDULE_AGENT = "SCHEDULE_AGENT"
    """Agent lifecycle (RFC 8): a task was assigned to it (SCHEDULE when it held none;
    core/agent_window.py)."""
    START_AGENT = "START_AGENT"
    """Agent lifecycle: it works on the task (START when it was SCHEDULED)."""
    FREE_AGENT = "FREE_AGENT"
    """Agent lifecycle: its task ended; back to RUNNABLE as far as its state allows once
    its window is empty at the end of the turn (core/agent_window.py)."""


@dataclass(frozen=True, slots=True)
class TaskStep:
    state: TaskState
    effects: tuple[TaskEffect, ...]
    event: str
    """The event logged by EMIT_EVENT."""


_E = TaskEffect
_I = TaskInput
_STORE = (_E.PERSIST, _E.EMIT_EVENT)
"""Every row stores the record, then logs its event."""
_END = (_E.RELEASE, *_STORE, _E.COMPLETE_ACTIVITY, _E.WAKE, _E.ANNOUNCE_END)
"""Every end releases the task, even one that never held its agent: a queued head task may
have pairs in the conflict gate."""


_REQUEUED = (_E.RELEASE, *_STORE, _E.COMPLETE_ACTIVITY, _E.ENQUEUE, _E.WAKE)
"""A held task back in its queue: the attempt's activity entry is closed (a yield's as
COMPLETED: the one requeue that frees its agent, FREE_AGENT)."""


def _ended(state: TaskState, *, queued: bool = False, agent: bool = False) -> TaskStep:
    """An ending row: out of the queue first when it waits there, and the agent back to
    RUNNABLE when the end is its own result."""
    effects = ((_E.DEQUEUE,) if queued else ()) + _END + ((_E.FREE_AGENT,) if agent else ())
    return TaskStep(state, effects, "task.completed" if state is _S.COMPLETED else "task.failed")


_DISPATCHED = TaskStep(
    _S.DISPATCHED, (_E.OCCUPY, *_STORE, _E.REGISTER_ACTIVITY, _E.SCHEDULE_AGENT), "task.dispatched"
)


def _dispatched() -> dict[TaskInput, TaskStep]:
    """The rows of a task its agent holds (DISPATCHED or RUNNING)."""
    return {
        _I.FULFIL: _ended(_S.COMPLETED, agent=True),
        _I.FAIL: _ended(_S.FAILED, agent=True),
        _I.RETRY: TaskStep(_S.QUEUED, _REQUEUED, "task.requeued"),
        _I.REQUEUE: TaskStep(_S.QUEUED, _REQUEUED, "task.requeued"),
        _I.YIELD: TaskStep(_S.QUEUED, (*_REQUEUED[:-1], _E.FREE_AGENT, _E.WAKE), "task.requeued"),
        _I.ABANDON: _ended(_S.FAILED),
        _I.TERMINATE: _ended(_S.FAILED),
    }


def _table() -> dict[TaskState, dict[TaskInput, TaskStep]]:
    return {
        _S.QUEUED: {
            _I.HOLD: TaskStep(_S.HELD, _STORE, "task.held"),
            _I.WAIT_WORKTREE: TaskStep(_S.QUEUED, _STORE, "task.waiting_worktree"),
            _I.DEFER: TaskStep(_S.QUEUED, _STORE, "task.deferred"),
            _I.DISPATCH: _DISPATCHED,
            _I.REFUSE: _ended(_S.FAILED, queued=True),
            _I.CANCEL: _ended(_S.FAILED, queued=True),
            _I.ABANDON: _ended(_S.FAILED, queued=True),
        },
        _S.HELD: {
            _I.AUTHORIZE: TaskStep(_S.QUEUED, (*_STORE, _E.ENQUEUE), "task.authorized"),
            _I.DENY: _ended(_S.FAILED),
            _I.CANCEL: _ended(_S.FAILED),
        },
        _S.DISPATCHED: {
            _I.READ: TaskStep(_S.RUNNING, (*_STORE, _E.START_AGENT), "task.running"),
            **_dispatched(),
        },
        _S.RUNNING: _dispatched(),
        _S.COMPLETED: {},
        _S.FAILED: {},
    }


class TaskMachine:
    """The task table with `step` as its operation (`allows` asks it without raising)."""

    TABLE: dict[TaskState, dict[TaskInput, TaskStep]] = _table()
    TRANSITIONS: TransitionTable[TaskState, TaskInput, TaskStep] = TransitionTable(TABLE, "task")
    INITIAL: Final = _S.QUEUED
    SUBMITTED: Final = TaskStep(_S.QUEUED, (*_STORE, _E.ENQUEUE), "task.submitted")
    """What a new submission's record goes through (the Scheduler writes a run of them in
    one group commit)."""

    @classmethod
    def step(cls, state: TaskState, event: TaskInput) -> TaskStep:
        """The row for (state, event); IllegalTransitionError when there is none."""
        return cls.TRANSITIONS.step(state, event)

    @classmethod
    def allows(cls, state: TaskState, event: TaskInput) -> bool:
        return cls.TRANSITIONS.allows(state, event)


def mermaid() -> str:
    """The state diagram of the table (docs/task-lifecycle.md is generated from it)."""
    terminal = (s for s in _S if s.terminal)
    return TaskMachine.TRANSITIONS.mermaid(
        (TaskMachine.INITIAL,), terminal, lambda step: step.state, entry="SUBMIT"
    )
