"""Frames of ACKs from several streams applied together (engine/router/ack_groups.py): a
frame that finds none being applied goes at once, alone; the frames that arrive meanwhile
go next, as one, each answered with its own ACKs' outcomes under its own keys; a group that
fails fails each of its frames, and the next frames still go."""

from __future__ import annotations

import asyncio

import pytest

from apiary.core.envelope import Envelope, MessageType
from apiary.engine.router.ack_groups import AckGroups, Acks, Applied
from apiary.errors import ApiaryError


def _env(message_id: str) -> Envelope:
    return Envelope(
        message_id=message_id, idempotency_token="", producer_id="w", correlation_id="c",
        sequence_number=1, retry_count=0, message_type=MessageType.ACKNOWLEDGEMENT,
        content_type="application/json", content_length=0, repo_id="", worktree_id="",
        hlc_timestamp="", ttl_ms=0, timestamp="2026-01-01T00:00:00Z", payload=b"",
    )  # fmt: skip


class Recorder:
    """An `apply` that records each call's ACKs and answers each by message id once
    `release` is set; a call with the message `failing` fails."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.release = asyncio.Event()
        self.failing = ""

    async def __call__(self, acks: Acks, now: float) -> Applied:
        self.calls.append([env.message_id for _, env in acks])
        await self.release.wait()
        if any(env.message_id == self.failing for _, env in acks):
            raise ApiaryError("the store failed")
        return {key: f"to-{env.message_id}" for key, env in acks}


async def test_frames_that_wait_are_applied_together_each_answered_its_own() -> None:
    apply = Recorder()
    groups = AckGroups(apply)
    first = asyncio.create_task(groups.acknowledge([(0, _env("a1"))], 1.0))
    await asyncio.sleep(0)
    second = asyncio.create_task(groups.acknowledge([(0, _env("b1")), (1, _env("b2"))], 2.0))
    third = asyncio.create_task(groups.acknowledge([(5, _env("c1"))], 3.0))
    await asyncio.sleep(0)
    assert apply.calls == [["a1"]]  # the others wait for it
    apply.release.set()
    assert await first == {0: "to-a1"}
    assert await second == {0: "to-b1", 1: "to-b2"}
    assert await third == {5: "to-c1"}
    assert apply.calls == [["a1"], ["b1", "b2", "c1"]]
    # Nothing waits any more: the next frame goes at once, alone.
    assert await groups.acknowledge([(0, _env("d1"))], 4.0) == {0: "to-d1"}
    assert apply.calls[-1] == ["d1"]


async def test_an_ack_left_out_of_the_group_is_left_out_of_its_frame() -> None:
    async def apply(acks: Acks, now: float) -> Applied:
        await asyncio.sleep(0)
        return {key: "to" for key, env in acks if env.message_id != "skip"}

    groups = AckGroups(apply)
    first = asyncio.create_task(groups.acknowledge([(0, _env("a"))], 1.0))
    await asyncio.sleep(0)
    second = asyncio.create_task(groups.acknowledge([(0, _env("skip")), (1, _env("b"))], 1.0))
    assert await first == {0: "to"}
    assert await second == {1: "to"}


async def test_a_failed_group_fails_each_frame_and_the_next_still_go() -> None:
    apply = Recorder()
    apply.failing = "c"
    groups = AckGroups(apply)
    first = asyncio.create_task(groups.acknowledge([(0, _env("a"))], 1.0))
    await asyncio.sleep(0)
    waiting = [
        asyncio.create_task(groups.acknowledge([(0, _env(name))], 1.0)) for name in ("b", "c")
    ]
    apply.release.set()
    assert await first == {0: "to-a"}
    for task in waiting:
        with pytest.raises(ApiaryError, match="the store failed"):
            await task
    assert await groups.acknowledge([(0, _env("d"))], 1.0) == {0: "to-d"}
