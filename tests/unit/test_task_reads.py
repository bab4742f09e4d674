"""A task's READ in the task runner (sdk/tasks.py): the handler starts at once, its READ lazy;
a task that ends soon sends its READ and its end in one frame, in that order; a READ the
coordinator refuses cancels the handler and its end is never sent.

The connection is a stand-in (its `ack_soon` goes through the real AckFrames into a fake
streaming sender the test answers), so the frames the runner makes are seen exactly; the
coordinator's side of the same frames is tested in tests/engine/test_task_ack_commit.py
and end to end in tests/server/test_sdk_tasks.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

import pytest

from apiary.core.envelope import Ack, AckStage, Envelope, MessageType
from apiary.core.trace_context import TraceContext
from apiary.sdk import task_acks, tasks
from apiary.sdk.connection import Delivery
from apiary.sdk.sender import SendResult
from apiary.sdk.task_acks import AckFrames
from apiary.sdk.tasks import SCHEDULER, TaskContext, TaskRunner
from apiary.wire.convert import ack_from_payload, ack_to_json

WAIT_S = 5.0


class FakeAgent:
    """What the runner uses of a Connection: its deliveries (the tasks given), and ACKs over
    AckFrames into frames the test answers (`frames`, `answers`)."""

    agent_id = "worker"

    def __init__(self, *tasks: Envelope) -> None:
        self._tasks = tasks
        self._acks = AckFrames(self._send)
        self.frames: list[list[tuple[str, str]]] = []
        """Each frame's ACKs: (task id, stage)."""
        self.answers: asyncio.Queue[bool] = asyncio.Queue()
        """One per frame: whether its ACKs are taken (else refused, permission_denied)."""
        self.sent = asyncio.Event()
        self.answered = 0
        """Frames answered so far."""
        self.calls: list[tuple[str, int]] = []
        """Heartbeats sent (agent state, frames answered by then)."""

    async def deliveries(self, *, reconnect: bool = False) -> AsyncGenerator[Delivery, None]:
        for n, env in enumerate(self._tasks):
            yield Delivery(env, n + 1, 1, False)
        await asyncio.Event().wait()  # the stream stays open

    def ack_soon(
        self, env: Envelope, stage: AckStage, *, error_code: str = "", note: str = "",
        lazy: bool = False,
    ) -> asyncio.Future[None]:  # fmt: skip
        payload = ack_to_json_bytes(env, stage, error_code, note)
        ack = Envelope(
            message_id=str(uuid.uuid4()), producer_id=self.agent_id,
            message_type=MessageType.ACKNOWLEDGEMENT, payload=payload,
            content_type="application/json", correlation_id=env.correlation_id,
        )  # fmt: skip
        return self._acks.send(ack, lazy=lazy)

    async def _send(
        self, items: Sequence[tuple[Envelope, str]], traces: Sequence[TraceContext | None]
    ) -> list[SendResult]:
        frame = []
        for env, _ in items:
            ack = ack_from_payload(env.content_type, env.payload)
            frame.append((env.correlation_id, ack.ack_stage.name))
        self.frames.append(frame)
        self.sent.set()
        taken = await self.answers.get()
        self.answered += 1
        code = "" if taken else "permission_denied"
        return [SendResult(env.message_id, taken, code, code, "", 0) for env, _ in items]

    def acks_now(self) -> None:
        self._acks.now()

    async def heartbeat(self, state: str) -> None:
        """A call to the coordinator: recorded with the frames answered by then."""
        self.calls.append((state, self.answered))

    async def close(self) -> None:
        await self._acks.close()


def ack_to_json_bytes(env: Envelope, stage: AckStage, code: str, note: str) -> bytes:
    return ack_to_json(Ack(env.message_id, stage, code, note))


def _task(task_id: str) -> Envelope:
    payload = b"{}"
    return Envelope(
        message_id=str(uuid.uuid4()), producer_id=SCHEDULER, message_type=MessageType.DATA,
        payload=payload, content_type="application/json", content_length=len(payload),
        correlation_id=task_id, idempotency_token=f"task:{task_id}:1",
    )  # fmt: skip


async def _next_frame(agent: FakeAgent, count: int) -> None:
    """Until `count` frames have been sent."""
    while len(agent.frames) < count:
        agent.sent.clear()
        await asyncio.wait_for(agent.sent.wait(), WAIT_S)


async def _idle(runner: TaskRunner) -> None:
    """Until no task runs (its supervisor has settled it)."""
    for _ in range(int(WAIT_S / 0.01)):
        if not runner.running:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"still running: {runner.running}")


@contextlib.asynccontextmanager
async def _running(agent: FakeAgent, handler: Any) -> AsyncIterator[TaskRunner]:
    """A TaskRunner of `handler` running on `agent` until the block ends."""
    runner = TaskRunner(agent, handler)  # type: ignore[arg-type]
    running = asyncio.ensure_future(runner.run())
    try:
        yield runner
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await agent.close()


async def test_a_task_that_ends_soon_sends_its_read_and_its_end_in_one_frame(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(task_acks, "LAZY_S", WAIT_S)  # "soon", however loaded the machine
    agent = FakeAgent(_task("t1"))
    started: list[str] = []

    async def handler(task: TaskContext) -> dict[str, int]:
        started.append(task.task_id)  # before the READ was even sent
        assert agent.frames == []
        return {"n": 1}

    async with _running(agent, handler) as runner:
        await _next_frame(agent, 1)
        assert agent.frames == [[("t1", "READ"), ("t1", "FULFILLED")]]
        agent.answers.put_nowait(True)
        await _idle(runner)
        assert started == ["t1"]


async def test_a_refused_read_cancels_the_handler_and_its_end_is_not_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(task_acks, "LAZY_S", 0.001)  # the READ leaves alone, at once
    agent = FakeAgent(_task("t1"))
    cancelled = asyncio.Event()

    async def handler(task: TaskContext) -> None:
        try:
            await asyncio.Event().wait()  # runs until the runner stops it
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with _running(agent, handler) as runner:
        await _next_frame(agent, 1)
        assert agent.frames == [[("t1", "READ")]]
        agent.answers.put_nowait(False)  # taken back meanwhile: not this agent's to run
        await asyncio.wait_for(cancelled.wait(), WAIT_S)
        await _idle(runner)
        await asyncio.sleep(0.05)  # an end ACK, were one sent, would be in a frame by now
        assert agent.frames == [[("t1", "READ")]]


async def test_a_task_running_on_sends_its_read_alone_and_its_end_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(task_acks, "LAZY_S", 0.001)
    agent = FakeAgent(_task("t1"))
    release = asyncio.Event()

    async def handler(task: TaskContext) -> str:
        await release.wait()
        return "done"

    async with _running(agent, handler) as runner:
        await _next_frame(agent, 1)
        assert agent.frames == [[("t1", "READ")]]
        agent.answers.put_nowait(True)
        release.set()
        await _next_frame(agent, 2)
        assert agent.frames[1] == [("t1", "FULFILLED")]
        agent.answers.put_nowait(True)
        await _idle(runner)


async def test_a_prefetched_task_that_starts_soon_sends_no_received() -> None:
    agent = FakeAgent(_task("t1"), _task("t2"))
    async with _running(agent, _quick) as runner:
        await _next_frame(agent, 1)
        agent.answers.put_nowait(True)
        await _next_frame(agent, 2)
        agent.answers.put_nowait(True)
        await _idle(runner)
        stages = [ack for frame in agent.frames for ack in frame]
        assert stages == [
            ("t1", "READ"), ("t1", "FULFILLED"), ("t2", "READ"), ("t2", "FULFILLED"),
        ]  # fmt: skip


async def test_a_prefetched_task_that_waits_is_acknowledged_received(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(task_acks, "LAZY_S", 0.001)
    # Long enough after LAZY_S that a loaded machine does not send t1's READ and t2's RECEIVED
    # in one frame.
    monkeypatch.setattr(tasks, "RECEIVED_AFTER_S", 0.2)
    agent = FakeAgent(_task("t1"), _task("t2"))
    release = asyncio.Event()

    async def handler(task: TaskContext) -> None:
        await release.wait()

    async with _running(agent, handler) as runner:
        await _next_frame(agent, 1)
        assert agent.frames == [[("t1", "READ")]]
        agent.answers.put_nowait(True)
        await _next_frame(agent, 2)
        assert agent.frames[1] == [("t2", "RECEIVED")]  # t2 waits behind t1 (prefetched)
        assert runner.waiting == ["t2"]
        agent.answers.put_nowait(True)
        release.set()
        for _ in range(3):
            agent.answers.put_nowait(True)
        await _idle(runner)
        stages = [ack for frame in agent.frames[2:] for ack in frame]
        assert stages == [("t1", "FULFILLED"), ("t2", "READ"), ("t2", "FULFILLED")]


async def _quick(task: TaskContext) -> str:
    return "done"


async def test_a_handler_calls_the_coordinator_only_once_its_read_is_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`task.waiting()` (an agent state the coordinator allows a RUNNING agent only) waits
    for the task's READ to be taken, and asks the lazy READ to leave at once."""
    monkeypatch.setattr(task_acks, "LAZY_S", WAIT_S)  # only the handler's call makes it go
    agent = FakeAgent(_task("t1"))

    async def handler(task: TaskContext) -> None:
        async with task.waiting():
            pass

    async with _running(agent, handler) as runner:
        await _next_frame(agent, 1)
        assert agent.frames == [[("t1", "READ")]]  # sent for the call, ahead of the end
        await asyncio.sleep(0.05)
        assert agent.calls == []  # its READ is not answered yet
        agent.answers.put_nowait(True)
        await _next_frame(agent, 2)
        assert agent.calls == [("WAITING", 1), ("RUNNING", 1)]
        assert agent.frames[1] == [("t1", "FULFILLED")]
        agent.answers.put_nowait(True)
        await _idle(runner)


async def test_started_waits_for_the_read_and_a_cancelled_wait_leaves_it_be(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`task.started()` is True once the READ is taken; a wait for it that is cancelled
    (the handler terminated meanwhile, say) does not cancel the READ's answer for the rest."""
    monkeypatch.setattr(task_acks, "LAZY_S", WAIT_S)
    agent = FakeAgent(_task("t1"), _task("t2"))
    seen: list[bool] = []

    async def handler(task: TaskContext) -> None:
        if task.task_id == "t1":
            seen.append(await task.started())
        else:
            waiter = asyncio.ensure_future(task.started())
            await asyncio.sleep(0)
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)
            seen.append(await task.started())  # the READ's answer is still to come

    async with _running(agent, handler) as runner:
        await _next_frame(agent, 1)
        assert agent.frames == [[("t1", "READ")]]
        agent.answers.put_nowait(True)
        for n in range(2, 4):
            await _next_frame(agent, n)
            agent.answers.put_nowait(True)
        await _idle(runner)
        assert seen == [True, True]
        stages = [ack for frame in agent.frames for ack in frame]
        assert stages == [
            ("t1", "READ"), ("t1", "FULFILLED"), ("t2", "READ"), ("t2", "FULFILLED"),
        ]  # fmt: skip
