"""The runtime task machine (core/runtime/tasks.py) over every (state, input) pair: a row
or an IllegalTransitionError; what each row emits is a contract event; a new run only from
a draft, a paused or an ended-but-not-completed task; a pause or cancel of a run in hand
records the intent before the run stops; and which input a run's Scheduler state is."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from apiary.core.machine import IllegalTransitionError
from apiary.core.records import TaskRecord, TaskState
from apiary.core.runtime.events import RuntimeEventType
from apiary.core.runtime.tasks import (
    Intent,
    RunState,
    RuntimeTaskEffect,
    RuntimeTaskInput,
    RuntimeTaskMachine,
    RuntimeTaskState,
    mermaid,
    run_input,
    run_state,
)

_S, _I, _E = RuntimeTaskState, RuntimeTaskInput, RuntimeTaskEffect
PAIRS = list(itertools.product(RuntimeTaskState, RuntimeTaskInput))


@pytest.mark.parametrize(("state", "event"), PAIRS, ids=[f"{s}-{i}" for s, i in PAIRS])
def test_every_pair_has_a_row_or_is_refused(
    state: RuntimeTaskState, event: RuntimeTaskInput
) -> None:
    if not RuntimeTaskMachine.allows(state, event):
        with pytest.raises(IllegalTransitionError):
            RuntimeTaskMachine.step(state, event)
        return
    step = RuntimeTaskMachine.step(state, event)
    assert all(kind in RuntimeEventType.__members__.values() for kind in step.events)
    if _E.SUBMIT_RUN in step.effects:  # a new run: from no run in hand, an attempt event
        assert not state.active and step.state is _S.QUEUED
        assert step.events[-1] == RuntimeEventType.TASK_ATTEMPT_STARTED
    if step.events:
        assert _E.PERSIST in step.effects


def test_a_new_run_comes_only_from_a_draft_a_pause_or_an_ended_task_not_completed() -> None:
    starts = {(s, i) for s, i in PAIRS if RuntimeTaskMachine.allows(s, i)
              and _E.SUBMIT_RUN in RuntimeTaskMachine.step(s, i).effects}  # fmt: skip
    assert starts == {(_S.DRAFT, _I.START), (_S.PAUSED, _I.RESUME), (_S.FAILED, _I.RETRY),
                      (_S.CANCELLED, _I.RETRY)}  # fmt: skip
    assert RuntimeTaskMachine.TRANSITIONS.inputs(_S.COMPLETED) == ()


@pytest.mark.parametrize("state", [_S.QUEUED, _S.PREPARING, _S.RUNNING])
def test_pause_and_cancel_record_the_intent_before_the_run_stops(state: RuntimeTaskState) -> None:
    pause = RuntimeTaskMachine.step(state, _I.PAUSE)
    assert pause.state is state and pause.effects[:2] == (_E.PERSIST, _E.STOP_RUN)
    cancel = RuntimeTaskMachine.step(state, _I.CANCEL)
    assert cancel.state is _S.CANCELLING
    assert cancel.events == (RuntimeEventType.TASK_CANCEL_REQUESTED,)
    assert cancel.effects == (_E.PERSIST, _E.STOP_RUN, _E.CANCEL_CHILDREN)
    # The run's end then decides: stopped by the pause, cancelled, or finished first.
    assert RuntimeTaskMachine.step(state, _I.STOP_RUN).state is _S.PAUSED
    assert RuntimeTaskMachine.step(_S.CANCELLING, _I.FAIL_RUN).state is _S.CANCELLED
    assert RuntimeTaskMachine.step(_S.CANCELLING, _I.COMPLETE_RUN).state is _S.COMPLETED


def _run(state: TaskState, error_code: str = "") -> TaskRecord:
    return TaskRecord("r", "a", 0, 0.0, 1, state, 0.0, error_code=error_code)


def test_a_runs_scheduler_state_is_the_tasks_input() -> None:
    none = Intent.NONE
    assert run_input(_S.QUEUED, none, _run(TaskState.DISPATCHED)) is _I.DISPATCH
    assert run_input(_S.PREPARING, none, _run(TaskState.RUNNING)) is _I.RUN
    assert run_input(_S.RUNNING, none, _run(TaskState.RUNNING)) is None
    assert run_input(_S.RUNNING, none, _run(TaskState.QUEUED)) is _I.REQUEUE
    assert run_input(_S.CANCELLING, Intent.CANCEL, _run(TaskState.QUEUED)) is _I.REQUEUE
    assert run_input(_S.RUNNING, none, _run(TaskState.COMPLETED)) is _I.COMPLETE_RUN
    assert run_input(_S.RUNNING, none, _run(TaskState.FAILED, "cancelled")) is _I.FAIL_RUN
    assert run_input(_S.RUNNING, Intent.PAUSE, _run(TaskState.FAILED, "cancelled")) is _I.STOP_RUN
    assert run_input(_S.RUNNING, Intent.PAUSE, _run(TaskState.FAILED, "boom")) is _I.FAIL_RUN
    assert run_input(_S.PAUSED, none, _run(TaskState.COMPLETED)) is None
    assert run_state(_run(TaskState.FAILED, "forced_preemption")) is RunState.CANCELLED
    assert run_state(_run(TaskState.FAILED, "boom")) is RunState.FAILED
    assert run_state(_run(TaskState.HELD)) is RunState.QUEUED


DOC = Path(__file__).resolve().parents[2] / "docs" / "control-plane.md"


def test_the_diagram_draws_every_state_and_the_doc_shows_the_table_as_it_is() -> None:
    drawn = mermaid()
    assert all(state.value in drawn for state in RuntimeTaskState)
    assert f"```mermaid\n{drawn}```" in DOC.read_text()
