"""The task runner's ACK frames (sdk/task_acks.py): ACKs queued while a frame is in flight go
together in the next one, in the order they were queued; each ACK's own outcome comes back to
its sender (a refusal as the ApiaryError of its code, a failed frame to each of its ACKs)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from apiary.core.envelope import Envelope, MessageType
from apiary.core.trace_context import TraceContext
from apiary.errors import ApiaryError, UnavailableError
from apiary.sdk import task_acks
from apiary.sdk.sender import SendResult
from apiary.sdk.task_acks import AckFrames


def _ack(n: int) -> Envelope:
    return Envelope(
        message_id=f"00000000-0000-4000-8000-{n:012d}", producer_id="worker",
        message_type=MessageType.ACKNOWLEDGEMENT, content_type="application/json",
    )  # fmt: skip


class Stream:
    """A fake streaming sender whose frames are answered when the test says so."""

    def __init__(self) -> None:
        self.frames: list[list[str]] = []
        self.answers: asyncio.Queue[list[SendResult] | BaseException] = asyncio.Queue()

    async def send(
        self, items: Sequence[tuple[Envelope, str]], traces: Sequence[TraceContext | None]
    ) -> list[SendResult]:
        assert len(traces) == len(items)
        self.frames.append([env.message_id[-2:] for env, _ in items])
        answer = await self.answers.get()
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def accept(self, *ids: str, refuse: str = "") -> list[SendResult]:
        return [
            SendResult(i, not refuse or i != refuse, "buffer_full" if i == refuse else "",
                       "full" if i == refuse else "", "", 0)
            for i in ids
        ]  # fmt: skip


async def test_acks_queued_during_a_frame_go_together_in_order() -> None:
    stream = Stream()
    frames = AckFrames(stream.send)
    first = frames.send(_ack(1))
    await asyncio.sleep(0)  # the first frame leaves alone
    later = [frames.send(_ack(n)) for n in (2, 3, 4)]
    assert stream.frames == [["01"]]
    await stream.answers.put(stream.accept("01"))
    await first
    await asyncio.sleep(0)
    assert stream.frames == [["01"], ["02", "03", "04"]]
    await stream.answers.put(stream.accept("02", "03", "04", refuse="03"))
    await later[0]
    with pytest.raises(ApiaryError) as refused:
        await later[1]
    assert refused.value.code == "buffer_full"
    await later[2]


async def test_acks_queued_in_one_turn_share_the_first_frame() -> None:
    stream = Stream()
    frames = AckFrames(stream.send)
    sent = [frames.send(_ack(n)) for n in (1, 2)]
    await asyncio.sleep(0)
    assert stream.frames == [["01", "02"]]
    await stream.answers.put(stream.accept("01", "02"))
    await asyncio.gather(*sent)


async def test_a_failed_frame_fails_each_of_its_acks_and_the_next_frame_goes_on() -> None:
    stream = Stream()
    frames = AckFrames(stream.send)
    lost = frames.send(_ack(1))
    await asyncio.sleep(0)
    after = frames.send(_ack(2))
    await stream.answers.put(UnavailableError("the coordinator went away"))
    with pytest.raises(UnavailableError):
        await lost
    await asyncio.sleep(0)
    assert stream.frames == [["01"], ["02"]]
    await stream.answers.put(stream.accept("02"))
    await after


async def test_closing_fails_what_is_still_queued() -> None:
    stream = Stream()
    frames = AckFrames(stream.send)
    in_flight = frames.send(_ack(1))
    await asyncio.sleep(0)
    queued = frames.send(_ack(2))
    await frames.close()
    for ack in (in_flight, queued):
        with pytest.raises(ApiaryError):
            await ack


async def test_a_lazy_ack_rides_with_the_next_eager_one() -> None:
    stream = Stream()
    frames = AckFrames(stream.send)
    received = frames.send(_ack(1), lazy=True)
    await asyncio.sleep(0)
    assert stream.frames == []  # no frame of its own
    ended = frames.send(_ack(2))
    await asyncio.sleep(0)
    assert stream.frames == [["01", "02"]]
    await stream.answers.put(stream.accept("01", "02"))
    await asyncio.gather(received, ended)


async def test_a_lazy_ack_queued_during_a_frame_waits_for_an_eager_one() -> None:
    stream = Stream()
    frames = AckFrames(stream.send)
    first = frames.send(_ack(1))
    await asyncio.sleep(0)
    received = frames.send(_ack(2), lazy=True)
    await stream.answers.put(stream.accept("01"))
    await first
    await asyncio.sleep(0)
    assert stream.frames == [["01"]]  # the frame's answer sent no frame for the lazy one
    frames.send(_ack(3))
    await asyncio.sleep(0)
    assert stream.frames == [["01"], ["02", "03"]]
    await stream.answers.put(stream.accept("02", "03"))
    await received


async def test_a_lazy_ack_alone_goes_after_its_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(task_acks, "LAZY_S", 0.001)
    stream = Stream()
    frames = AckFrames(stream.send)
    received = frames.send(_ack(1), lazy=True)
    await asyncio.sleep(0.05)  # far past LAZY_S: the frame left on its own
    assert stream.frames == [["01"]]
    await stream.answers.put(stream.accept("01"))
    await received


async def test_closing_fails_a_lazy_ack_no_frame_took() -> None:
    frames = AckFrames(Stream().send)
    received = frames.send(_ack(1), lazy=True)
    await frames.close()
    with pytest.raises(ApiaryError, match="not sent"):
        await received
