"""Forwarded ACKs handed to a streaming producer from memory (engine/router/batches.py
`_hand_over`): not stored when the producer's stream takes them in time, stored like any
notice when it does not, so that an accepted ACK is always either handed out or stored, and
never both."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from apiary.core.envelope import AckStage, MessageType
from apiary.engine.router.inbox import Handout
from apiary.engine.settings import RouterSettings
from apiary.testing.engine import EngineHarness, open_test_engine


@asynccontextmanager
async def _engine(wait_s: float) -> AsyncIterator[EngineHarness]:
    settings = RouterSettings(buffer_capacity=100, hand_over_wait_s=wait_s)
    async with open_test_engine(settings) as harness:
        await harness.register("alice")
        await harness.register("bob")
        yield harness


class Reader:
    """alice's inbound stream, read by a task into `batches`."""

    def __init__(self, h: EngineHarness) -> None:
        self.batches: list[list[Handout]] = []
        self.arrived = asyncio.Event()
        self._codec = h.engine.router.codec
        self._stream = h.engine.delivery.stream("alice")
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for batch in self._stream:
            self.batches.append(batch)
            self.arrived.set()

    def acks(self) -> list[tuple[str, Handout]]:
        """(ack_for_message_id, handout) of every ACK read so far."""
        out = []
        for batch in self.batches:
            for handout in batch:
                if handout.message.message_type == MessageType.ACKNOWLEDGEMENT:
                    body = json.loads(self._codec.decode(handout.message.envelope).payload)
                    out.append((body["ack_for_message_id"], handout))
        return out

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def _acks(batch: list[Handout]) -> list[Handout]:
    return [x for x in batch if x.message.message_type == MessageType.ACKNOWLEDGEMENT]


async def _delivered_and_fulfilled(h: EngineHarness) -> tuple[str, str]:
    """alice -> bob DATA, taken by bob and acknowledged FULFILLED: (data id, ack id)."""
    sent = await h.send("alice", "bob", {"n": 1})
    assert [x.message.message_id for x in await h.take("bob")] == [sent.message_id]
    ack = await h.ack("bob", sent.message_id, AckStage.FULFILLED)
    assert ack.accepted, ack.reason
    return sent.message_id, ack.message_id


async def test_an_ack_for_a_streaming_producer_is_handed_over_and_not_stored() -> None:
    async with _engine(5.0) as h:
        reader = Reader(h)
        await asyncio.sleep(0)  # the stream opens
        data_id, ack_id = await _delivered_and_fulfilled(h)
        await asyncio.wait_for(reader.arrived.wait(), 5)
        acks = reader.acks()
        assert [a for a, _ in acks] == [data_id]
        assert acks[0][1].direct and acks[0][1].message.offset == 0
        assert await h.store.messages.get(ack_id) is None
        assert (await h.message(data_id)).state == "FULFILLED"
        # Nothing is left to hand out again on a new stream.
        await reader.close()
        assert _acks(await h.take("alice", notices=True)) == []


async def test_an_ack_for_a_producer_without_a_stream_is_stored_and_delivered_later() -> None:
    async with _engine(5.0) as h:
        data_id, ack_id = await _delivered_and_fulfilled(h)
        stored = await h.message(ack_id)
        assert stored.offset > 0
        handed = _acks(await h.take("alice", notices=True))
        assert [x.message.message_id for x in handed] == [ack_id]
        assert not handed[0].direct
        assert (await h.message(ack_id)).state == "FULFILLED"
        assert (await h.message(data_id)).state == "FULFILLED"


async def test_an_ack_its_producer_stream_does_not_take_in_time_is_stored_once() -> None:
    async with _engine(0.01) as h:
        # alice's stream is open, but its reader is busy with an earlier batch.
        await h.send("bob", "alice", {"first": True})
        stream = h.engine.delivery.stream("alice")
        first = await anext(stream)
        assert MessageType.DATA in [x.message.message_type for x in first]
        _, ack_id = await _delivered_and_fulfilled(h)
        assert (await h.message(ack_id)).offset > 0
        # When the reader comes back it gets the stored ACK, once: the hand-over was
        # withdrawn when it was stored.
        second = _acks(await anext(stream))
        assert [(x.message.message_id, x.direct) for x in second] == [(ack_id, False)]
        assert (await h.message(ack_id)).state == "FULFILLED"
        await stream.aclose()


async def test_a_zero_wait_stores_every_forwarded_ack() -> None:
    async with _engine(0.0) as h:
        reader = Reader(h)
        await asyncio.sleep(0)
        data_id, ack_id = await _delivered_and_fulfilled(h)
        await asyncio.wait_for(reader.arrived.wait(), 5)
        assert [(a, x.direct) for a, x in reader.acks()] == [(data_id, False)]
        assert (await h.message(ack_id)).state == "FULFILLED"
        await reader.close()
