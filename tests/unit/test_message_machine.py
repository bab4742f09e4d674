"""The message lifecycle table over every (state, input) pair (STYLE.md principle 1)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.machine import IllegalTransitionError
from apiary.core.message_machine import (
    ACK_INPUTS,
    Effect,
    MessageInput,
    MessageMachine,
    Step,
    mermaid,
)
from apiary.core.records import MessageState as S

PAIRS = list(itertools.product(S, MessageInput))
LIVE = (S.RECEIVED, S.RETRYING, S.READ)
ACKS = tuple(ACK_INPUTS.values())


@pytest.mark.parametrize(("state", "event"), PAIRS)
def test_every_pair_has_a_row_or_is_illegal(state: S, event: MessageInput) -> None:
    if MessageMachine.allows(state, event):
        step = MessageMachine.step(state, event)
        assert isinstance(step.state, S)
        assert all(isinstance(e, Effect) for e in step.effects)
        assert MessageMachine.step_if_allowed(state, event) is step
    else:
        with pytest.raises(IllegalTransitionError) as caught:
            MessageMachine.step(state, event)
        assert (caught.value.state, caught.value.event) == (state, event)
        assert MessageMachine.step_if_allowed(state, event) is None


def test_only_admission_leaves_sent_and_no_ack_is_due_before_a_hand_out() -> None:
    assert [e for e in MessageInput if MessageMachine.allows(S.SENT, e)] == [MessageInput.ADMIT]
    step = MessageMachine.step(S.SENT, MessageInput.ADMIT)
    assert step == Step(S.RECEIVED, (Effect.PERSIST,))


@pytest.mark.conformance("router.lifecycle.sequence")
def test_the_happy_path_is_received_read_fulfilled() -> None:
    state = MessageMachine.step(S.SENT, MessageInput.ADMIT).state
    for event, expected in (
        (MessageInput.ACK_RECEIVED, S.RECEIVED),
        (MessageInput.ACK_READ, S.READ),
        (MessageInput.ACK_FULFILLED, S.FULFILLED),
    ):
        state = MessageMachine.step(state, event).state
        assert state is expected


@pytest.mark.parametrize(("state", "event"), [(s, e) for s in S if s.terminal for e in ACKS])
def test_terminal_states_never_change_and_log_late_acks(state: S, event: MessageInput) -> None:
    step = MessageMachine.step(state, event)
    assert step.state is state and step.late
    assert Effect.LOG_LATE_ACK in step.effects
    assert Effect.PERSIST not in step.effects


@pytest.mark.parametrize("state", [s for s in S if s.terminal])
def test_terminal_states_accept_no_timer_or_delivery_input(state: S) -> None:
    for event in (MessageInput.ACK_TIMEOUT, MessageInput.TTL_EXPIRE, MessageInput.AGE_EXPIRE,
                  MessageInput.ADMIT, MessageInput.DELIVER, MessageInput.REDELIVER,
                  MessageInput.STREAM_LOST, MessageInput.DELIVERIES_EXHAUSTED):  # fmt: skip
        assert not MessageMachine.allows(state, event)


# --- the ACK deadline runs from a hand-out; a message no stream holds waits -------------------

In = MessageInput
START, CANCEL = Effect.START_ACK_TIMER, Effect.CANCEL_ACK_TIMER
_FAILS = (Effect.PERSIST, CANCEL, Effect.NACK, Effect.DEAD_LETTER, Effect.UPDATE_IDEMPOTENCY,
          Effect.RELEASE_CREDIT)  # fmt: skip
_TIMES_OUT = Step(
    S.TIMED_OUT, (Effect.PERSIST, Effect.NACK, Effect.UPDATE_IDEMPOTENCY, Effect.RELEASE_CREDIT)
)
_NOT_ACKS = (In.ADMIT, In.DELIVER, In.REDELIVER, In.STREAM_LOST, In.ACK_TIMEOUT, In.TTL_EXPIRE,
             In.AGE_EXPIRE, In.DELIVERIES_EXHAUSTED)  # fmt: skip
EXPECTED: dict[tuple[S, MessageInput], Step] = {
    (S.SENT, In.ADMIT): Step(S.RECEIVED, (Effect.PERSIST,)),
    (S.RECEIVED, In.DELIVER): Step(S.RECEIVED, (START,)),
    (S.RECEIVED, In.REDELIVER): Step(S.RETRYING, (Effect.PERSIST, START)),
    (S.RECEIVED, In.STREAM_LOST): Step(S.RECEIVED, (CANCEL,)),
    (S.RECEIVED, In.ACK_TIMEOUT): _TIMES_OUT,
    (S.RECEIVED, In.TTL_EXPIRE): Step(S.FAILED, _FAILS),
    (S.RECEIVED, In.AGE_EXPIRE): Step(S.FAILED, _FAILS),
    (S.RECEIVED, In.DELIVERIES_EXHAUSTED): Step(S.FAILED, _FAILS),
    (S.RETRYING, In.REDELIVER): Step(S.RETRYING, (START,)),
    (S.RETRYING, In.STREAM_LOST): Step(S.RETRYING, (CANCEL,)),
    (S.RETRYING, In.ACK_TIMEOUT): _TIMES_OUT,
    (S.RETRYING, In.TTL_EXPIRE): Step(S.FAILED, _FAILS),
    (S.RETRYING, In.AGE_EXPIRE): Step(S.FAILED, _FAILS),
    (S.RETRYING, In.DELIVERIES_EXHAUSTED): Step(S.FAILED, _FAILS),
    # READ was acknowledged: no ACK deadline, no maximum age, no retry budget; only its TTL.
    (S.READ, In.REDELIVER): Step(S.READ, ()),
    (S.READ, In.TTL_EXPIRE): Step(S.FAILED, _FAILS),
}
"""Every row of the inputs that are not ACKs; every pair not here is illegal."""


@pytest.mark.parametrize(("state", "event"), list(itertools.product(S, _NOT_ACKS)), ids=str)
def test_every_pair_of_a_hand_out_stream_or_timer_input(state: S, event: MessageInput) -> None:
    expected = EXPECTED.get((state, event))
    if expected is None:
        assert not MessageMachine.allows(state, event)
    else:
        assert MessageMachine.step(state, event) == expected


def test_only_a_hand_out_starts_the_ack_deadline() -> None:
    starting = {(s, e) for (s, e), step in EXPECTED.items() if START in step.effects}
    every = {(s, e) for s in S for e in MessageInput if MessageMachine.allows(s, e)}
    assert {(s, e) for s, e in every if START in MessageMachine.step(s, e).effects} == starting
    assert {e for _, e in starting} == {In.DELIVER, In.REDELIVER}


def test_a_lost_stream_changes_only_the_deadline() -> None:
    # The router takes DELIVER and STREAM_LOST without the store: their rows must say so.
    for state in (S.RECEIVED, S.RETRYING):
        step = MessageMachine.step(state, In.STREAM_LOST)
        assert (step.state, step.effects) == (state, (CANCEL,))
    assert MessageMachine.step(S.RECEIVED, In.DELIVER).effects == (START,)


@pytest.mark.parametrize("state", [S.RECEIVED, S.RETRYING])
def test_waiting_past_the_maximum_age_fails_into_the_dlq_and_nacks(state: S) -> None:
    step = MessageMachine.step(state, In.AGE_EXPIRE)
    assert step.state is S.FAILED
    assert {Effect.NACK, Effect.DEAD_LETTER, Effect.RELEASE_CREDIT} <= set(step.effects)


@given(st.lists(st.sampled_from([In.DELIVER, In.REDELIVER, In.STREAM_LOST]), max_size=30))
def test_the_deadline_runs_exactly_while_a_stream_holds_the_message(
    events: list[MessageInput],
) -> None:
    state, armed = MessageMachine.step(S.SENT, In.ADMIT).state, False
    for event in events:
        step = MessageMachine.step_if_allowed(state, event)
        if step is None:
            continue
        armed = (armed or START in step.effects) and CANCEL not in step.effects
        state = step.state
        assert armed == (event is not In.STREAM_LOST)
        assert not state.terminal


def test_the_diagram_draws_the_rows_that_start_or_stop_the_deadline() -> None:
    drawn = mermaid()
    assert "RECEIVED --> RECEIVED: DELIVER (ACK deadline starts)" in drawn
    assert "RETRYING --> RETRYING: STREAM_LOST (ACK deadline stops)" in drawn
    assert "RECEIVED --> FAILED: AGE_EXPIRE" in drawn
    assert "RECEIVED --> RECEIVED: ACK_RECEIVED" not in drawn  # a redundant ACK is left out


@pytest.mark.parametrize("state", [S.RECEIVED, S.RETRYING])
def test_ack_timeout_times_out_and_nacks(state: S) -> None:
    step = MessageMachine.step(state, MessageInput.ACK_TIMEOUT)
    assert step.state is S.TIMED_OUT
    assert {Effect.PERSIST, Effect.NACK, Effect.RELEASE_CREDIT} <= set(step.effects)


def test_a_read_message_cannot_time_out_on_the_ack_deadline() -> None:
    assert not MessageMachine.allows(S.READ, MessageInput.ACK_TIMEOUT)


@pytest.mark.parametrize("state", LIVE)
def test_ttl_expiry_fails_into_the_dlq(state: S) -> None:
    step = MessageMachine.step(state, MessageInput.TTL_EXPIRE)
    assert step.state is S.FAILED
    assert {Effect.NACK, Effect.DEAD_LETTER, Effect.RELEASE_CREDIT} <= set(step.effects)


@pytest.mark.parametrize(("state", "event"), list(itertools.product(LIVE, ACKS)))
def test_every_live_ack_is_forwarded_and_cached(state: S, event: MessageInput) -> None:
    step = MessageMachine.step(state, event)
    assert Effect.FORWARD_ACK in step.effects
    assert Effect.UPDATE_IDEMPOTENCY in step.effects
    if step.state.terminal:
        assert Effect.RELEASE_CREDIT in step.effects


def test_read_never_goes_back() -> None:
    assert MessageMachine.step(S.READ, MessageInput.ACK_RECEIVED).state is S.READ


def test_redelivery_marks_retrying_and_any_ack_resolves_it() -> None:
    assert MessageMachine.step(S.RECEIVED, MessageInput.REDELIVER).state is S.RETRYING
    assert MessageMachine.step(S.RETRYING, MessageInput.ACK_READ).state is S.READ


@pytest.mark.parametrize("event", [MessageInput.ACK_REJECTED, MessageInput.ACK_FAILED])
def test_agent_failures_are_dead_lettered(event: MessageInput) -> None:
    assert Effect.DEAD_LETTER in MessageMachine.step(S.RECEIVED, event).effects
