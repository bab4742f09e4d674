"""The turn lifecycle (core/runtime/turns.py) over every (state, input) pair, the mapping of
a task's stored states onto its turn, a thread's status, and the channel's resume rules
(core/runtime/channels.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from apiary.core.machine import IllegalTransitionError
from apiary.core.records import TaskRecord, TaskState
from apiary.core.runtime.channels import (
    acknowledged,
    opened,
    resume_position,
    token_digest,
    touched,
)
from apiary.core.runtime.records import TurnRecord, TurnState
from apiary.core.runtime.turns import (
    INTERRUPT_PREFIX,
    TurnEffect,
    TurnInput,
    TurnMachine,
    is_interrupt,
    mermaid,
    task_inputs,
    thread_status,
)
from apiary.errors import PermissionDeniedError, ResumeExpiredError, ValidationError

S, I, E = TurnState, TurnInput, TurnEffect  # noqa: E741 - the table's own short names
ROWS: dict[tuple[TurnState, TurnInput], tuple[TurnState, tuple[str, ...]]] = {
    (S.QUEUED, I.START): (S.PREPARING, ("task.created",)),
    (S.QUEUED, I.REFUSE): (S.FAILED, ("turn.failed",)),
    (S.QUEUED, I.CANCEL): (S.CANCELLED, ("turn.failed",)),
    (S.PREPARING, I.RUN): (S.RUNNING, ("task.started", "turn.started")),
    (S.PREPARING, I.INTERRUPT): (S.PREPARING, ("task.cancel_requested",)),
    (S.RUNNING, I.INTERRUPT): (S.RUNNING, ("task.cancel_requested",)),
    (S.RUNNING, I.REQUEUE): (S.PREPARING, ("task.queued",)),
    **{
        (state, event): (after, events)
        for state in (S.PREPARING, S.RUNNING)
        for event, after, events in (
            (I.COMPLETE, S.COMPLETED, ("task.completed", "turn.completed")),
            (I.FAIL, S.FAILED, ("task.failed", "turn.failed")),
            (I.STOP, S.CANCELLED, ("task.cancelled", "turn.failed")),
            (I.LOSE, S.FAILED, ("task.lost", "turn.failed")),
        )
    },
}


@pytest.mark.parametrize("state", list(S))
@pytest.mark.parametrize("event", list(I))
def test_every_state_and_input(state: TurnState, event: TurnInput) -> None:
    expected = ROWS.get((state, event))
    if expected is None:
        with pytest.raises(IllegalTransitionError, match="no turn transition"):
            TurnMachine.step(state, event)
        assert not TurnMachine.allows(state, event)
        return
    step = TurnMachine.step(state, event)
    assert (step.state, step.events) == expected
    assert step.effects[0] is E.PERSIST  # every row stores before it acts
    # The thread goes on exactly when a task-holding turn ends, or a refused one.
    ends_hold = step.state.terminal and (state.active or event is I.REFUSE)
    assert (E.START_NEXT in step.effects) == ends_hold
    assert (E.FOLLOW_TASK in step.effects) == (event is I.START)
    assert (E.CANCEL_TASK in step.effects) == (event is I.INTERRUPT and state is S.PREPARING)
    assert (E.PREEMPT_TASK in step.effects) == (event is I.INTERRUPT and state is S.RUNNING)


def test_the_diagram_draws_every_row_that_changes_the_state() -> None:
    drawn = mermaid()
    for (state, event), (after, _) in ROWS.items():
        assert (f"{state} --> {after}: {event}" in drawn) == (state != after)


T0 = 1_780_000_000.0


def _turn(state: TurnState, **fields: Any) -> TurnRecord:
    return TurnRecord("u", "s", "t", 0, state.value, "{}", "k", T0, T0, **fields)


def _task(state: TaskState, code: str = "") -> TaskRecord:
    return TaskRecord("k", "coder", 0, T0, 0, state, T0, error_code=code)


@pytest.mark.parametrize(
    ("turn", "task", "code", "interrupted", "expected"),
    [
        (S.PREPARING, TaskState.QUEUED, "", False, ()),
        (S.PREPARING, TaskState.HELD, "", False, ()),
        (S.PREPARING, TaskState.DISPATCHED, "", False, ()),
        (S.PREPARING, TaskState.RUNNING, "", False, (I.RUN,)),
        (S.RUNNING, TaskState.RUNNING, "", False, ()),
        (S.RUNNING, TaskState.QUEUED, "", False, (I.REQUEUE,)),
        (S.PREPARING, TaskState.COMPLETED, "", False, (I.RUN, I.COMPLETE)),  # it ran unseen
        (S.RUNNING, TaskState.COMPLETED, "", True, (I.COMPLETE,)),  # the interrupt came late
        (S.RUNNING, TaskState.FAILED, "no_answer", False, (I.FAIL,)),
        (S.RUNNING, TaskState.FAILED, "no_answer", True, (I.FAIL,)),
        (S.RUNNING, TaskState.FAILED, "cancelled", False, (I.FAIL,)),
        (S.RUNNING, TaskState.FAILED, "cancelled", True, (I.STOP,)),
        (S.RUNNING, TaskState.FAILED, "forced_preemption", True, (I.STOP,)),
        (S.PREPARING, TaskState.FAILED, "cancelled", True, (I.STOP,)),
        (S.QUEUED, TaskState.COMPLETED, "", False, ()),
        (S.COMPLETED, TaskState.FAILED, "x", False, ()),
    ],
)
def test_a_tasks_stored_state_is_an_input_of_its_turn(
    turn: TurnState, task: TaskState, code: str, interrupted: bool,
    expected: tuple[TurnInput, ...],
) -> None:  # fmt: skip
    record = _turn(turn, interrupt="stop" if interrupted else "")
    assert task_inputs(record, _task(task, code)) == expected


@pytest.mark.parametrize(
    ("active", "last", "queued", "status"),
    [
        (None, None, 0, "idle"),
        (None, None, 2, "queued"),
        (S.PREPARING, None, 0, "queued"),
        (S.RUNNING, S.FAILED, 3, "running"),
        (None, S.COMPLETED, 0, "completed"),
        (None, S.CANCELLED, 0, "cancelled"),
        (None, S.FAILED, 1, "queued"),
    ],
)
def test_a_threads_status(
    active: TurnState | None, last: TurnState | None, queued: int, status: str
) -> None:
    assert thread_status(active, last, queued) == status


def test_an_interrupts_reason_is_told_apart() -> None:
    assert is_interrupt(f"{INTERRUPT_PREFIX} user asked") and not is_interrupt("higher priority")


# ---------------------------------------------------------------------- channels

TTL = 100.0


def _channel(acked: int = 10) -> Any:
    return opened("c", "s", "application:ci", "secret", at=acked, now=T0, ttl_s=TTL)


def test_a_channel_keeps_the_digest_of_its_token_only() -> None:
    channel = _channel()
    assert channel.token_digest == token_digest("secret") != "secret"
    assert (channel.acked_sequence, channel.expires_at) == (10, T0 + TTL)


@pytest.mark.conformance("runtime.channel.reconnect-params")
def test_a_channel_resumes_from_its_acknowledged_sequence_or_a_later_position() -> None:
    channel = _channel()
    assert resume_position(channel, "secret", None, now=T0 + 1, last=50) == 10
    assert resume_position(channel, "secret", 10, now=T0 + 1, last=50) == 10
    assert resume_position(channel, "secret", 42, now=T0 + 1, last=50) == 42


@pytest.mark.parametrize(
    ("token", "position", "now", "error", "field"),
    [
        ("wrong", None, T0, PermissionDeniedError, "resume_token"),
        ("secret", None, T0 + TTL, ResumeExpiredError, "channel_id"),
        ("secret", 9, T0, ResumeExpiredError, "last_acknowledged_sequence"),
        ("secret", 51, T0, ValidationError, "last_acknowledged_sequence"),
        ("secret", -1, T0, ValidationError, "last_acknowledged_sequence"),
    ],
)
def test_a_resume_that_cannot_be_served_says_why_and_how_to_recover(
    token: str, position: int | None, now: float, error: type[Exception], field: str
) -> None:
    with pytest.raises(error) as caught:
        resume_position(_channel(), token, position, now=now, last=50)
    assert caught.value.details["field"] == field  # type: ignore[attr-defined]
    if error is ResumeExpiredError:
        assert "open a new channel" in str(caught.value)


def test_acknowledgements_never_go_back_and_keep_the_channel_alive() -> None:
    channel = acknowledged(_channel(), 30, now=T0 + 50, last=50, ttl_s=TTL)
    assert (channel.acked_sequence, channel.expires_at) == (30, T0 + 50 + TTL)
    assert acknowledged(channel, 20, now=T0 + 60, last=50, ttl_s=TTL).acked_sequence == 30
    for sequence in (-1, 51):
        with pytest.raises(ValidationError, match="sequence"):
            acknowledged(channel, sequence, now=T0, last=50, ttl_s=TTL)
    assert touched(channel, now=T0 + 70, ttl_s=TTL) == replace(
        channel, updated_at=T0 + 70, expires_at=T0 + 70 + TTL
    )
