"""The task lifecycle table over every (state, input) pair (STYLE.md principle 1)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.machine import IllegalTransitionError
from apiary.core.records import TaskState as S
from apiary.core.tasks.machine import (
    TaskEffect,
    TaskInput,
    TaskMachine,
    TaskStep,
    mermaid,
)

E = TaskEffect
I = TaskInput  # noqa: E741 - the machine's inputs, short as in the table
PAIRS = list(itertools.product(S, I))
HELD_BY_AGENT = (S.DISPATCHED, S.RUNNING)
ENDS = (S.COMPLETED, S.FAILED)


def _rows() -> list[tuple[S, I, TaskStep]]:
    return [(s, e, step) for s, row in TaskMachine.TABLE.items() for e, step in row.items()]


@pytest.mark.parametrize(("state", "event"), PAIRS)
def test_every_pair_has_a_row_or_is_illegal(state: S, event: I) -> None:
    if TaskMachine.allows(state, event):
        step = TaskMachine.step(state, event)
        assert isinstance(step.state, S)
        assert all(isinstance(e, E) for e in step.effects)
        assert step.event.startswith("task.")
    else:
        with pytest.raises(IllegalTransitionError) as caught:
            TaskMachine.step(state, event)
        assert (caught.value.state, caught.value.event) == (state, event)
        assert caught.value.machine == "task"


def test_every_state_has_a_row_of_the_table() -> None:
    assert set(TaskMachine.TABLE) == set(S)


@pytest.mark.parametrize("state", ENDS)
def test_ended_tasks_take_no_input(state: S) -> None:
    assert TaskMachine.TABLE[state] == {}


def test_the_happy_path_is_queued_dispatched_running_completed() -> None:
    state = TaskMachine.INITIAL
    for event, expected in (
        (I.DISPATCH, S.DISPATCHED),
        (I.READ, S.RUNNING),
        (I.FULFIL, S.COMPLETED),
    ):
        state = TaskMachine.step(state, event).state
        assert state is expected


def test_a_submission_is_stored_logged_and_queued() -> None:
    step = TaskMachine.SUBMITTED
    assert step.state is TaskMachine.INITIAL is S.QUEUED
    assert step.effects == (E.PERSIST, E.EMIT_EVENT, E.ENQUEUE)
    assert step.event == "task.submitted"


@pytest.mark.parametrize(("state", "event", "step"), _rows())
def test_every_row_is_stored_before_it_is_logged(state: S, event: I, step: TaskStep) -> None:
    assert E.PERSIST in step.effects and E.EMIT_EVENT in step.effects
    assert step.effects.index(E.PERSIST) < step.effects.index(E.EMIT_EVENT)
    assert len(set(step.effects)) == len(step.effects)


@pytest.mark.parametrize(("state", "event", "step"), _rows())
def test_an_end_frees_and_announces_the_task(state: S, event: I, step: TaskStep) -> None:
    ended = step.state in ENDS
    let_go = state in HELD_BY_AGENT and step.state not in HELD_BY_AGENT
    assert (E.RELEASE in step.effects) is (ended or let_go)
    # An entry (RFC 10) is closed whenever the task leaves its agent: ended or requeued.
    assert (E.COMPLETE_ACTIVITY in step.effects) is (ended or let_go)
    assert (E.ANNOUNCE_END in step.effects) is ended
    if ended:
        assert step.event == ("task.completed" if step.state is S.COMPLETED else "task.failed")
        assert step.effects.index(E.RELEASE) < step.effects.index(E.PERSIST)
        assert E.WAKE in step.effects


@pytest.mark.parametrize(("state", "event", "step"), _rows())
def test_the_dispatch_registers_the_activity_entry(state: S, event: I, step: TaskStep) -> None:
    """Before the agent can start the task (RFC 10): the SDK starts a handler before its READ
    is answered, so the READ registers nothing."""
    assert (E.REGISTER_ACTIVITY in step.effects) is (event is I.DISPATCH)


@pytest.mark.parametrize(("state", "event", "step"), _rows())
def test_only_the_agents_own_results_free_it(state: S, event: I, step: TaskStep) -> None:
    assert (E.FREE_AGENT in step.effects) is (event in (I.FULFIL, I.FAIL, I.YIELD))


@pytest.mark.parametrize(("state", "event", "step"), _rows())
def test_a_queued_task_leaves_its_queue_when_it_ends(state: S, event: I, step: TaskStep) -> None:
    assert (E.DEQUEUE in step.effects) is (state is S.QUEUED and step.state in ENDS)


@pytest.mark.parametrize(("state", "event", "step"), _rows())
def test_back_to_the_queue_means_enqueued(state: S, event: I, step: TaskStep) -> None:
    assert (E.ENQUEUE in step.effects) is (step.state is S.QUEUED and state is not S.QUEUED)


def test_only_dispatch_occupies_and_only_read_starts() -> None:
    occupying = [(s, e) for s, e, step in _rows() if E.OCCUPY in step.effects]
    assert occupying == [(S.QUEUED, I.DISPATCH)]
    assert TaskMachine.step(S.QUEUED, I.DISPATCH).effects[-1] is E.SCHEDULE_AGENT
    starting = [(s, e) for s, e, step in _rows() if E.START_AGENT in step.effects]
    assert starting == [(S.DISPATCHED, I.READ)]


def test_a_running_task_cannot_be_read_again() -> None:
    assert not TaskMachine.allows(S.RUNNING, I.READ)


@pytest.mark.parametrize("state", list(S))
def test_only_a_task_not_started_can_be_cancelled(state: S) -> None:
    assert TaskMachine.allows(state, I.CANCEL) is (state in (S.QUEUED, S.HELD))


def test_a_held_duplicate_is_authorized_denied_or_cancelled() -> None:
    assert TaskMachine.TRANSITIONS.inputs(S.HELD) == (I.AUTHORIZE, I.DENY, I.CANCEL)
    assert TaskMachine.step(S.HELD, I.AUTHORIZE).state is S.QUEUED
    assert TaskMachine.step(S.QUEUED, I.HOLD).state is S.HELD


@pytest.mark.parametrize("state", HELD_BY_AGENT)
@pytest.mark.parametrize("event", [I.RETRY, I.YIELD, I.REQUEUE])
def test_a_requeue_frees_the_agent_and_wakes_it(state: S, event: I) -> None:
    step = TaskMachine.step(state, event)
    assert step.state is S.QUEUED and step.event == "task.requeued"
    assert step.effects[0] is E.RELEASE and step.effects[-1] is E.WAKE


@pytest.mark.parametrize("state", HELD_BY_AGENT)
def test_a_task_lost_with_its_agent_goes_back_to_its_queue_or_fails(state: S) -> None:
    requeued = TaskMachine.step(state, I.REQUEUE)
    assert requeued.effects == (
        E.RELEASE, E.PERSIST, E.EMIT_EVENT, E.COMPLETE_ACTIVITY, E.ENQUEUE, E.WAKE,
    )  # fmt: skip
    abandoned = TaskMachine.step(state, I.ABANDON)
    assert abandoned.state is S.FAILED and E.FREE_AGENT not in abandoned.effects
    assert not TaskMachine.allows(S.QUEUED, I.REQUEUE)


def test_only_waiting_rows_keep_the_state() -> None:
    loops = [(s, e) for s, e, step in _rows() if step.state is s]
    assert loops == [(S.QUEUED, I.WAIT_WORKTREE), (S.QUEUED, I.DEFER)]


@given(st.lists(st.sampled_from(list(I)), max_size=30))
def test_any_input_sequence_stays_in_the_table(events: list[I]) -> None:
    state = TaskMachine.INITIAL
    for event in events:
        if not TaskMachine.allows(state, event):
            with pytest.raises(IllegalTransitionError):
                TaskMachine.step(state, event)
            continue
        step = TaskMachine.step(state, event)
        if state in ENDS:
            pytest.fail(f"{state} took {event}")
        state = step.state
    assert state in S


def test_the_diagram_draws_every_state_change() -> None:
    diagram = mermaid()
    assert diagram.startswith("stateDiagram-v2\n    [*] --> QUEUED: SUBMIT\n")
    for state, event, step in _rows():
        arrow = f"    {state} --> {step.state}: {event}\n"
        assert (arrow in diagram) is (step.state is not state)
    for state in ENDS:
        assert f"    {state} --> [*]\n" in diagram
