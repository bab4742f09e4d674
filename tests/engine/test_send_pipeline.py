"""Pipelined send streams (engine/router/send_pipeline.py) and frame-level ACKs (Router.prepare).

A stream prepares its next frame while the previous one commits; what must hold anyway:
answers come in frame order, a producer's messages keep their order in the inbox, an error
of the stream arrives after the answers to the frames before it, and a frame of ACKs moves
every acknowledged message as one ACK at a time would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from apiary.core.envelope import Ack, AckStage, MessageType
from apiary.core.records import MessageState
from apiary.engine.router.admission import Outbound, PreparedSend, SendOutcome
from apiary.engine.router.send_pipeline import SendPipeline
from apiary.errors import ValidationError
from apiary.store.errors import StoreError
from apiary.testing.engine import EngineHarness, open_test_engine
from apiary.wire.convert import ack_to_json


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine() as harness:
        await harness.register("alice")
        await harness.register("bob", capacity=1000)
        yield harness


async def _frames(
    frames: Sequence[Sequence[Outbound]], fail_after: int = -1
) -> AsyncIterator[Sequence[Outbound]]:
    for n, frame in enumerate(frames):
        if n == fail_after:
            raise ValidationError.for_field("items", "a bad frame")
        yield frame


def _frames_of(h: EngineHarness, count: int, size: int = 10) -> list[list[Outbound]]:
    """`count` frames of `size` DATA envelopes from alice to bob."""
    return [
        [Outbound(h.envelope("alice", {"n": f * size + i}), "bob") for i in range(size)]
        for f in range(count)
    ]


async def test_frames_are_answered_and_stored_in_order(h: EngineHarness) -> None:
    frames = _frames_of(h, 6)
    pipeline = SendPipeline(h.engine.router, depth=3)
    answers = [outcomes async for outcomes in pipeline.run(_frames(frames))]
    assert [[o.message_id for o in a] for a in answers] == [
        [item.envelope.message_id for item in frame] for frame in frames
    ]
    assert all(o.accepted for a in answers for o in a)
    stored = await h.store.messages.inbox("bob", 0, 1000)
    sent = [item.envelope.message_id for frame in frames for item in frame]
    assert [m.message_id for m in stored if m.message_id in set(sent)] == sent
    assert [m.offset for m in stored] == sorted(m.offset for m in stored)


async def test_a_stream_error_follows_the_answers_before_it(h: EngineHarness) -> None:
    frames = [[Outbound(h.envelope("alice", {"n": f}), "bob")] for f in range(4)]
    pipeline = SendPipeline(h.engine.router)
    answered = []
    with pytest.raises(ValidationError, match="a bad frame"):
        async for outcomes in pipeline.run(_frames(frames, fail_after=2)):
            answered.append(outcomes[0].message_id)
    assert answered == [frames[0][0].envelope.message_id, frames[1][0].envelope.message_id]
    for frame in frames[:2]:
        assert (await h.message(frame[0].envelope.message_id)).state is MessageState.RECEIVED
    assert await h.store.messages.get(frames[2][0].envelope.message_id) is None


def _ack(h: EngineHarness, agent: str, message_id: str, stage: AckStage) -> Outbound:
    payload = ack_to_json(Ack(message_id, stage))
    return Outbound(h.envelope(agent, payload, message_type=MessageType.ACKNOWLEDGEMENT))


async def test_a_frame_of_acks_moves_each_message_and_forwards_each_ack(
    h: EngineHarness,
) -> None:
    sent = [(await h.send("alice", "bob", {"n": n})).message_id for n in range(5)]
    await h.take("bob")
    frame = [
        _ack(h, "bob", sent[0], AckStage.FULFILLED),
        _ack(h, "bob", sent[1], AckStage.READ),
        _ack(h, "bob", sent[1], AckStage.FULFILLED),  # the same message twice, in order
        _ack(h, "alice", sent[2], AckStage.FULFILLED),  # not alice's to acknowledge
        _ack(h, "bob", "00000000-0000-4000-8000-000000000000", AckStage.FULFILLED),  # unknown
        _ack(h, "bob", sent[3], AckStage.REJECTED),
    ]
    outcomes = await h.engine.router.send_many(frame)
    assert [o.accepted for o in outcomes] == [True, True, True, False, True, True]
    assert outcomes[3].error_code == "permission_denied"
    states = [(await h.message(m)).state for m in sent]
    assert states == [
        MessageState.FULFILLED, MessageState.FULFILLED, MessageState.RECEIVED,
        MessageState.REJECTED, MessageState.RECEIVED,
    ]  # fmt: skip
    stage = (await h.message(sent[1])).acked_stage
    assert stage == "FULFILLED"
    forwarded = [
        (p["ack_for_message_id"], p["ack_stage"])
        for p in await h.inbox_payloads("alice")
        if p["type"] == "ACKNOWLEDGEMENT" and p.get("ack_for_message_id") in set(sent)
    ]
    assert forwarded == [
        (sent[0], "FULFILLED"), (sent[1], "READ"), (sent[1], "FULFILLED"),
        (sent[3], "REJECTED"),
    ]  # fmt: skip
    changes = [
        e.details["message_id"] for e in await h.events("message.state")
        if e.details["message_id"] in set(sent)
    ]  # fmt: skip
    assert sorted(changes) == sorted([sent[0], sent[1], sent[1], sent[3]])
    # The message acknowledged twice moved twice, each step from where the one before left
    # it (one write of its row, with both events).
    moves = [
        (e.details["from"], e.details["to"]) for e in await h.events("message.state")
        if e.details["message_id"] == sent[1]
    ]  # fmt: skip
    assert moves == [("RECEIVED", "READ"), ("READ", "FULFILLED")]


async def test_a_stream_whose_frames_stop_short_never_hangs(h: EngineHarness) -> None:
    async def cancelled_frames() -> AsyncIterator[Sequence[Outbound]]:
        yield [Outbound(h.envelope("alice", {"n": 1}), "bob")]
        raise asyncio.CancelledError

    answered = []

    async def consume() -> None:
        async for outcomes in SendPipeline(h.engine.router).run(cancelled_frames()):
            answered.append(outcomes)

    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(consume(), 5)
    assert len(answered) == 1 and answered[0][0].accepted


class _Counted:
    """Counts the router's prepare and complete calls (and passes them on)."""

    def __init__(self, h: EngineHarness) -> None:
        self.prepares: list[int] = []
        self.completes: list[int] = []
        router = h.engine.router
        prepare, complete = router.prepare, router.complete

        async def counted_prepare(items: Sequence[Outbound]) -> PreparedSend:
            self.prepares.append(len(items))
            return await prepare(items)

        async def counted_complete(batch: PreparedSend) -> list[SendOutcome]:
            self.completes.append(len(batch.items))
            return await complete(batch)

        router.prepare = counted_prepare  # type: ignore[method-assign]
        router.complete = counted_complete  # type: ignore[method-assign]


async def test_frames_read_while_one_is_prepared_are_prepared_as_one(h: EngineHarness) -> None:
    # Six frames arrive at once: they are prepared and written together, yet each is
    # answered on its own, in order, and stored in order.
    calls = _Counted(h)
    frames = _frames_of(h, 6)
    pipeline = SendPipeline(h.engine.router, depth=6)
    answers = [outcomes async for outcomes in pipeline.run(_frames(frames))]
    assert [[o.message_id for o in a] for a in answers] == [
        [item.envelope.message_id for item in frame] for frame in frames
    ]
    assert all(o.accepted for a in answers for o in a)
    assert sum(calls.prepares) == sum(calls.completes) == 60
    assert len(calls.prepares) < 6 and len(calls.completes) < 6
    stored = await h.store.messages.inbox("bob", 0, 1000)
    sent = [item.envelope.message_id for frame in frames for item in frame]
    assert [m.message_id for m in stored] == sent


async def test_frames_prepared_while_a_write_commits_are_written_as_one(
    h: EngineHarness,
) -> None:
    calls = _Counted(h)
    router = h.engine.router
    complete = router.complete
    committing = asyncio.Event()
    release = asyncio.Event()

    async def slow_first(batch: PreparedSend) -> list[SendOutcome]:
        if not committing.is_set():
            committing.set()
            await release.wait()  # the first write takes its time
        return await complete(batch)

    router.complete = slow_first  # type: ignore[method-assign]
    frames = _frames_of(h, 4)

    async def one_at_a_time() -> AsyncIterator[Sequence[Outbound]]:
        yield frames[0]
        await committing.wait()
        for n, frame in enumerate(frames[1:], start=2):
            yield frame
            while len(calls.prepares) < n:  # noqa: ASYNC110 - until the pump has taken it
                await asyncio.sleep(0)
        release.set()

    answers = [a async for a in SendPipeline(router, depth=4).run(one_at_a_time())]
    assert [len(a) for a in answers] == [10, 10, 10, 10]
    assert calls.prepares == [10, 10, 10, 10]
    assert calls.completes == [10, 30]  # the three that waited, in one write
    stored = await h.store.messages.inbox("bob", 0, 1000)
    assert [m.message_id for m in stored] == [i.envelope.message_id for f in frames for i in f]


async def test_frames_are_not_taken_together_beyond_merge_items(h: EngineHarness) -> None:
    calls = _Counted(h)
    frames = [[Outbound(h.envelope("alice", {"n": f}), "bob")] for f in range(5)]
    pipeline = SendPipeline(h.engine.router, depth=5, merge_items=1)
    answers = [outcomes async for outcomes in pipeline.run(_frames(frames))]
    assert len(answers) == 5
    assert calls.prepares == calls.completes == [1] * 5


async def test_a_merged_write_that_fails_fails_each_of_its_frames(h: EngineHarness) -> None:
    router = h.engine.router
    complete = router.complete
    failures = 0

    async def failing_once(batch: PreparedSend) -> list[SendOutcome]:
        nonlocal failures
        if len(batch.items) > 1 and not failures:
            failures += 1
            raise StoreError("disk full")
        return await complete(batch)

    router.complete = failing_once  # type: ignore[method-assign]
    frames = [[Outbound(h.envelope("alice", {"n": f}), "bob")] for f in range(4)]
    with pytest.raises(StoreError, match="disk full"):
        async for _ in SendPipeline(router, depth=4).run(_frames(frames)):
            pass
    assert failures == 1
