"""core/agent_window.py: how a task's end and the end of the Scheduler's turn step an agent,
over every lifecycle state and window occupancy."""

from __future__ import annotations

import itertools

import pytest

from apiary.core.agent_lifecycle import AgentInput, AgentLifecycleMachine, AgentLifecycleState
from apiary.core.agent_window import (
    FINISH_INPUTS,
    WindowStep,
    settled,
    takes_tasks,
    task_ended,
)

S = AgentLifecycleState
_I = AgentInput
_STATES = list(S)


def _walk(state: AgentLifecycleState, inputs: tuple[AgentInput, ...]) -> AgentLifecycleState:
    """Where `inputs` take an agent in `state`, each applied as the engine's `drive` does:
    only when the table has a row for it."""
    for event in inputs:
        if AgentLifecycleMachine.allows(state, event):
            state = AgentLifecycleMachine.row(state, event).state
    return state


@pytest.mark.parametrize("state", list(FINISH_INPUTS))
def test_every_finish_is_legal_and_ends_runnable_or_leaving(state: AgentLifecycleState) -> None:
    at = state
    for event in FINISH_INPUTS[state]:
        assert AgentLifecycleMachine.allows(at, event), (state, at, event)
        at = AgentLifecycleMachine.row(at, event).state
    assert at is (S.SHUTTING_DOWN if state is S.SHUTTING_DOWN else S.RUNNABLE)


@pytest.mark.parametrize(
    ("state", "held", "running", "waiting"),
    [
        (state, held, running, waiting)
        for state, held, running, waiting in itertools.product(
            _STATES, (0, 1, 2), (False, True), (False, True)
        )
        if held or not running  # running tasks are held ones
    ],
)
def test_a_task_end_steps_the_agent_only_when_its_window_empties(
    state: AgentLifecycleState, held: int, running: bool, waiting: bool
) -> None:
    step = task_ended(state, held, running, waiting)
    if running or (state is S.RUNNING and held):
        # It runs another, or goes straight on to one it holds: nothing changes.
        assert step == WindowStep()
    elif state is S.RUNNING and waiting:
        # Its window emptied with a task waiting for it: decided at the turn's end.
        assert step == WindowStep(at_turn_end=True)
    else:
        # Nothing waits for it (idle at once, as soon as the end can be seen), or it was
        # not simply running (waiting, resumed, shutting down, ...): as far back to
        # RUNNABLE as the table allows, and assigned again when it holds tasks still.
        assert not step.at_turn_end
        assert step.inputs == FINISH_INPUTS.get(state, ()) + ((_I.SCHEDULE,) if held else ())
        if state in FINISH_INPUTS and state is not S.SHUTTING_DOWN:
            assert _walk(state, step.inputs) is (S.SCHEDULED if held else S.RUNNABLE)


@pytest.mark.parametrize(("state", "held"), list(itertools.product(_STATES, (0, 1, 3))))
def test_the_turn_end_frees_an_agent_holding_nothing(state: AgentLifecycleState, held: int) -> None:
    inputs = settled(state, held)
    if held:
        assert inputs == ()  # handed a task in the turn: it stays as it is
    else:
        assert inputs == FINISH_INPUTS.get(state, ())
    if state is S.RUNNING:
        assert _walk(state, inputs) is (S.RUNNING if held else S.RUNNABLE)


@pytest.mark.parametrize(
    ("state", "held", "emptied"), list(itertools.product(_STATES, (0, 1), (False, True)))
)
def test_who_takes_a_task(state: AgentLifecycleState, held: int, emptied: bool) -> None:
    expected = (
        state in (S.SCHEDULED, S.RUNNING)
        if held
        else state is S.RUNNABLE or (emptied and state is S.RUNNING)
    )
    assert takes_tasks(state, held, emptied) is expected
    if not held and not emptied:  # RFC 8.1: an idle agent takes tasks in RUNNABLE only
        assert expected is AgentLifecycleMachine.allows(state, _I.SCHEDULE)
