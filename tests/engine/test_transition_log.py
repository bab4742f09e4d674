"""Every transition of the message lifecycle is logged (RFC 19; DESIGN.md section 7): each
row of the pure machine's table, driven through the router, leaves its event in the log."""

from __future__ import annotations

import pytest

from apiary.core.envelope import Ack, AckStage
from apiary.core.events import Event
from apiary.core.message_machine import ACK_INPUTS, MessageInput, MessageMachine
from apiary.core.records import MessageState
from apiary.engine.settings import RouterSettings
from apiary.testing.engine import EngineHarness, open_test_engine

_STAGES = {event: stage for stage, event in ACK_INPUTS.items()}
_ROWS = [
    (state, event)
    for state, row in MessageMachine.TABLE.items()
    for event in row
    if state is not MessageState.SENT  # SENT -> RECEIVED is admission: see the last test
]
_HAND_OUTS = frozenset({MessageInput.DELIVER, MessageInput.REDELIVER, MessageInput.STREAM_LOST})


async def _message_events(h: EngineHarness, message_id: str) -> list[Event]:
    return [
        e
        for e in await h.events()
        if e.details.get("message_id") == message_id and e.event_type != "message.received"
    ]


@pytest.mark.conformance("observability.log.every-transition")
@pytest.mark.parametrize(("state", "event"), _ROWS, ids=str)
async def test_every_row_of_the_message_machine_is_logged(
    state: MessageState, event: MessageInput
) -> None:
    async with open_test_engine(RouterSettings(buffer_capacity=10)) as h:
        await h.register("alice")
        await h.register("bob")
        sent = await h.send("alice", "bob", {"n": 1})
        router = h.engine.router
        if state is not MessageState.RECEIVED:
            await h.store.messages.set_state(sent.message_id, state, h.clock.now())
        message = await h.message(sent.message_id)
        router.refresh(message)
        stage = _STAGES.get(event)
        ack = None if stage is None else Ack(sent.message_id, stage)
        code = "" if ack is not None else "test_code"
        await router.apply(message, event, h.clock.now(), ack=ack, error_code=code)
        step = MessageMachine.step(state, event)
        logged = await _message_events(h, sent.message_id)
        kinds = [e.event_type for e in logged]
        if step.late:
            (late,) = [e for e in logged if e.event_type == "message.late_ack"]
            assert (late.details["state"], late.details["input"]) == (state, event)
        elif step.state is not state:
            (moved,) = [e for e in logged if e.event_type == "message.state"]
            assert (moved.details["from"], moved.details["to"], moved.details["input"]) == (
                state, step.state, event,
            )  # fmt: skip
        elif event in _HAND_OUTS:
            # A hand-out or a lost stream that changes nothing but the ACK deadline is not a
            # transition (deliveries are counted on the message and streams are logged as
            # they open and close).
            assert kinds == []
        else:
            (acked,) = [e for e in logged if e.event_type == "message.acknowledged"]
            assert acked.details["input"] == event
            assert acked.details["state"] == state
            assert acked.details["acked_stage"] == stage.name  # type: ignore[union-attr]


@pytest.mark.conformance("observability.log.every-transition")
async def test_admission_and_rejection_are_logged() -> None:
    async with open_test_engine(RouterSettings(buffer_capacity=1)) as h:
        await h.register("alice")
        await h.register("bob")
        admitted = await h.send("alice", "bob", {"n": 1})
        refused = await h.send("alice", "bob", {"n": 2})  # the buffer of 1 is full
        assert not refused.accepted
        received = await h.events("message.received")
        assert [e.details["message_id"] for e in received] == [admitted.message_id]
        (rejected,) = await h.events("message.rejected")
        assert (rejected.details["message_id"], rejected.details["error_code"]) == (
            refused.message_id, "buffer_full",
        )  # fmt: skip


async def test_an_acknowledgement_that_moves_no_state_names_its_stage() -> None:
    async with open_test_engine(RouterSettings(buffer_capacity=10)) as h:
        await h.register("alice")
        await h.register("bob")
        sent = await h.send("alice", "bob", {"n": 1})
        await h.take("bob")
        await h.ack("bob", sent.message_id, AckStage.RECEIVED)
        (acked,) = await h.events("message.acknowledged")
        assert (acked.agent_id, acked.details["acked_stage"], acked.details["state"]) == (
            "bob", "RECEIVED", "RECEIVED",
        )  # fmt: skip
