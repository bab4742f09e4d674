"""`wait_for_outcome` (sdk/outcome.py) over scripted deliveries: the ACKs of the message it
follows, the replies in its correlation, the end of the batch that finished it, and what it
leaves alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from apiary.core.envelope import Ack, AckStage, Envelope, MessageType
from apiary.sdk.connection import Connection, Delivery, _last_handed_on
from apiary.sdk.outcome import Outcome, wait_for_outcome
from apiary.wire import pb
from apiary.wire.convert import ack_to_json

SENT = Envelope("m-1", "cli", MessageType.DATA, b"{}", "application/json", 2,
                correlation_id="c-1")  # fmt: skip


class Sender(Connection):
    """A connection that records its ACKs instead of sending them."""

    def __init__(self) -> None:
        super().__init__("cli", coordinator="127.0.0.1:1")
        self.acked: list[tuple[str, AckStage]] = []

    async def ack(self, env: Envelope, stage: AckStage, **_: Any) -> Envelope:
        self.acked.append((env.message_id, stage))
        return env


def ack(stage: AckStage, of: str = "m-1", by: str = "echo", note: str = "") -> Envelope:
    payload = ack_to_json(Ack(of, stage, "", note))
    return Envelope(f"a-{of}-{stage.name}", by, MessageType.ACKNOWLEDGEMENT, payload,
                    "application/json", len(payload), correlation_id="c-1")  # fmt: skip


def reply(message_id: str, correlation_id: str = "c-1") -> Envelope:
    return Envelope(message_id, "echo", MessageType.DATA, b'{"r": 1}', "application/json", 8,
                    correlation_id=correlation_id)  # fmt: skip


class Script:
    """Batches of envelopes handed out as the inbound stream would, then silence."""

    def __init__(self, *batches: Sequence[Envelope]) -> None:
        self.batches = batches
        self.read = 0

    async def deliveries(self) -> AsyncGenerator[Delivery, None]:
        for batch in self.batches:
            for index, env in enumerate(batch):
                self.read += 1
                yield Delivery(env, self.read, 1, False, batch_end=index == len(batch) - 1)
        await asyncio.Event().wait()  # nothing more comes


async def _wait(script: Script, sender: Sender, wait_s: float = 5.0) -> Outcome:
    printed: list[str] = []

    async def on_reply(env: Envelope) -> None:
        printed.append(env.message_id)

    outcome = await wait_for_outcome(
        sender, SENT, script.deliveries(), wait_s=wait_s, on_reply=on_reply
    )
    assert printed == [r.message_id for r in outcome.replies]
    return outcome


async def test_a_reply_behind_the_terminal_ack_in_its_batch_is_still_taken() -> None:
    # Forwarded ACKs are handed out ahead of stored messages within a batch.
    later = reply("r-late")
    script = Script(
        [ack(AckStage.RECEIVED), ack(AckStage.READ)],
        [ack(AckStage.FULFILLED, note="echoed"), reply("r-1")],
        [later],
    )
    sender = Sender()
    outcome = await _wait(script, sender)
    assert (outcome.stage, outcome.by, outcome.note, outcome.finished) == (
        AckStage.FULFILLED, "echo", "echoed", True,
    )  # fmt: skip
    assert [r.message_id for r in outcome.replies] == ["r-1"]
    assert sender.acked == [("r-1", AckStage.FULFILLED)]
    assert script.read == 4  # the next batch is not read


async def test_other_messages_and_acks_are_left_alone() -> None:
    script = Script(
        [reply("r-other", correlation_id="c-9"), ack(AckStage.FULFILLED, of="m-9")],
        [ack(AckStage.REJECTED, note="no")],
    )
    sender = Sender()
    outcome = await _wait(script, sender)
    assert (outcome.stage, outcome.replies) == (AckStage.REJECTED, ())
    assert sender.acked == []


async def test_no_terminal_ack_in_time_is_an_unfinished_outcome() -> None:
    script = Script([ack(AckStage.READ), reply("r-1")], [ack(AckStage.RECEIVED)])
    outcome = await _wait(script, Sender(), wait_s=0.2)
    assert not outcome.finished
    assert outcome.stage is AckStage.READ  # a late RECEIVED does not move it back
    assert [r.message_id for r in outcome.replies] == ["r-1"]


async def test_a_coordinator_nack_ends_the_wait() -> None:
    script = Script([ack(AckStage.TIMED_OUT, by="coordinator", note="ack_timeout")])
    outcome = await _wait(script, Sender())
    assert (outcome.stage, outcome.by, outcome.finished) == (
        AckStage.TIMED_OUT, "coordinator", True,
    )  # fmt: skip


def test_a_batch_ends_at_its_last_delivery_handed_on() -> None:
    # Heartbeats and directory notices are handled by the connection, not handed on: the
    # delivery before them ends the batch for its reader.
    def item(message_type: int, producer: str = "echo", payload: bytes = b"") -> Any:
        msg = pb.common_pb2.Envelope(message_type=message_type, producer_id=producer,
                                     payload=payload)  # fmt: skip
        return pb.apiary_pb2.Delivery(msg=msg)

    data, heartbeat = item(pb.common_pb2.DATA), item(pb.common_pb2.HEARTBEAT, "coordinator")
    joined = item(pb.common_pb2.NOTIFICATION, "coordinator", b'{"event": "agent_joined"}')
    hitl = item(pb.common_pb2.NOTIFICATION, "coordinator", b'{"event": "hitl.decided"}')
    assert _last_handed_on([data, heartbeat, joined]) == 0
    assert _last_handed_on([data, hitl, heartbeat]) == 1
    assert _last_handed_on([heartbeat]) == -1
    assert _last_handed_on([]) == -1
