"""How an agent's window of tasks drives its lifecycle (RFC 8.1 with `task_concurrency`).

An agent holds up to its window of tasks (its concurrency plus any prefetch,
core/tasks/capacity.py); its lifecycle (core/agent_lifecycle.py) says what the agent as a
whole is doing, so it steps when the window changes between empty and occupied, not with
every task that passes through it:

- empty -> occupied: SCHEDULE at the dispatch (RUNNABLE -> SCHEDULED), START when it reads
  its first task (SCHEDULED -> RUNNING; RFC 8.1: no execution before RUNNING);
- a task ends while the agent still holds others: a RUNNING agent stays RUNNING, whether
  those others run or wait to start (it goes straight on to them);
- the window empties: back to RUNNABLE (COMPLETE, then REPORTED: its FULFILLED or FAILED ACK
  is the result report RFC 8.1 asks of COMPLETED), at once when no task waits for the
  agent in its queues, so that it is idle as soon as its last task's end can be seen;
  with one waiting, at the end of the Scheduler's turn (`settled`), once the dispatches
  that turn made are known. An agent handed its next task in the same turn never had an
  empty window: it stays RUNNING, with no step and no event, where the per-task round was
  RUNNING -> COMPLETED -> RUNNABLE -> SCHEDULED -> RUNNING, four transitions and four
  `agent.lifecycle` events within a millisecond.

RFC 19 asks every state transition logged: the agent's transitions that happen are; the
round above does not happen. Each task's own transitions (`task.dispatched`,
`task.running`, `task.completed`) are logged as before and name the agent.

A task ending from any other state (WAITING, RESUMED, SCHEDULED, SHUTTING_DOWN, COMPLETED:
a task that ended while its agent was not simply running) steps the agent at once, as far
as the table allows, and assigns it again (SCHEDULE) when it holds tasks still.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from apiary.core.agent_lifecycle import AgentInput, AgentLifecycleState

_S = AgentLifecycleState
_I = AgentInput

FINISH_INPUTS: Final[Mapping[AgentLifecycleState, tuple[AgentInput, ...]]] = MappingProxyType({
    _S.SCHEDULED: (_I.START, _I.COMPLETE, _I.REPORTED),
    _S.RUNNING: (_I.COMPLETE, _I.REPORTED),
    _S.WAITING: (_I.INPUT_RECEIVED, _I.COMPLETE, _I.REPORTED),
    _S.WAITING_RESOURCES: (_I.RESOURCES_AVAILABLE, _I.COMPLETE, _I.REPORTED),
    _S.RESUMED: (_I.RESTORED, _I.COMPLETE, _I.REPORTED),
    _S.COMPLETED: (_I.REPORTED,),
    _S.SHUTTING_DOWN: (_I.COMPLETE,),
})  # fmt: skip
"""How an agent whose window emptied (its last task ended: its FULFILLED or FAILED ACK is the
result report, RFC 8.1 COMPLETED) gets back to RUNNABLE from where it stood."""


@dataclass(frozen=True, slots=True)
class WindowStep:
    """What a task's end does to its agent: `inputs` now, in order (each as far as the
    table allows), and whether the window's emptying waits for the end of the turn
    (`settled` decides then)."""

    inputs: tuple[AgentInput, ...] = ()
    at_turn_end: bool = False


_STAY: Final = WindowStep()
_EMPTIED: Final = WindowStep(at_turn_end=True)


def task_ended(state: AgentLifecycleState, held: int, running: bool, waiting: bool) -> WindowStep:
    """The agent's step when one of its tasks ended by its own doing (its result, a yield,
    a termination), in `state`, holding `held` tasks still, `running` whether any of them
    has started, `waiting` whether a task waits for it in its queues (its own or a shared
    one it serves)."""
    if running:
        return _STAY
    if state is _S.RUNNING and held:
        return _STAY
    if state is _S.RUNNING and waiting:
        return _EMPTIED
    again = (_I.SCHEDULE,) if held else ()
    return WindowStep(FINISH_INPUTS.get(state, ()) + again)


def settled(state: AgentLifecycleState, held: int) -> tuple[AgentInput, ...]:
    """At the end of the turn, for an agent whose window emptied during it with a task
    waiting for it (`task_ended`):
    back to RUNNABLE when it holds nothing still; nothing when a task was handed to it
    meanwhile (it stays RUNNING)."""
    return () if held else FINISH_INPUTS.get(state, ())


def takes_tasks(state: AgentLifecycleState, held: int, emptied: bool) -> bool:
    """Whether an agent in `state` holding `held` tasks (fewer than its window) may take one
    more: RUNNABLE when it holds none (RFC 8.1), SCHEDULED or RUNNING when it holds some,
    and RUNNING with none when its window `emptied` in this turn (it takes its next task
    without leaving RUNNING)."""
    if held:
        return state in _BUSY
    return state is _S.RUNNABLE or (emptied and state is _S.RUNNING)


_BUSY: Final = frozenset({_S.SCHEDULED, _S.RUNNING})
"""The states in which an agent that holds tasks takes more, up to its window."""
