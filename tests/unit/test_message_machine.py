"""The message lifecycle table over every (state, input) pair (STYLE.md principle 1)."""

from __future__ import annotations

import itertools

import pytest

from apiary.core.machine import IllegalTransitionError
from apiary.core.message_machine import ACK_INPUTS, Effect, MessageInput, MessageMachine
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


def test_only_admission_leaves_sent() -> None:
    assert [e for e in MessageInput if MessageMachine.allows(S.SENT, e)] == [MessageInput.ADMIT]
    step = MessageMachine.step(S.SENT, MessageInput.ADMIT)
    assert step.state is S.RECEIVED
    assert Effect.START_ACK_TIMER in step.effects


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
    for event in (MessageInput.ACK_TIMEOUT, MessageInput.TTL_EXPIRE, MessageInput.ADMIT,
                  MessageInput.DELIVER, MessageInput.REDELIVER):  # fmt: skip
        assert not MessageMachine.allows(state, event)


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
