"""The SDK's task runner and Scheduler client against a real coordinator over gRPC sockets:
SDK agents run as asyncio tasks of the test, the coordinator in-process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from apiary.core.envelope import MessageType
from apiary.core.events import Event
from apiary.core.records import TaskState
from apiary.engine.scheduler.scheduler import Scheduler
from apiary.engine.settings import SchedulerSettings
from apiary.errors import ToolTimeoutError, ValidationError
from apiary.sdk.agent import Agent
from apiary.sdk.client import Client
from apiary.sdk.errors import TaskFailedError
from apiary.sdk.scheduler import SchedulerClient
from apiary.sdk.tasks import SCHEDULER, Handler, TaskContext, TaskRunner
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.testing.events import wait_for_event

SCOPE = "path:src/app/**"
WAIT_S = 20.0


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path) as running:
        yield running


@pytest.fixture
async def client(coordinator: Coordinator) -> AsyncIterator[SchedulerClient]:
    async with SchedulerClient(str(coordinator.grpc_address)) as scheduler:
        yield scheduler


def _scheduler(coordinator: Coordinator) -> Scheduler:
    assert coordinator.scheduler is not None
    return coordinator.scheduler


@asynccontextmanager
async def _running_agent(
    coordinator: Coordinator, agent_id: str, handler: Handler, **options: Any
) -> AsyncIterator[TaskRunner]:
    async with Agent(agent_id, coordinator=str(coordinator.grpc_address)) as agent:
        runner = TaskRunner(agent, handler, **options)
        job = asyncio.create_task(runner.run())
        try:
            yield runner
        finally:
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job


async def _event(coordinator: Coordinator, where: Callable[[Event], bool], after: int = 0) -> Event:
    return await wait_for_event(coordinator.events, where, after=after, timeout_s=WAIT_S)


async def _ended(coordinator: Coordinator, task_id: str) -> Event:
    return await _event(
        coordinator,
        lambda e: (
            e.event_type in ("task.completed", "task.failed")
            and e.details.get("task_id") == task_id
        ),
    )


async def _task_events(coordinator: Coordinator, task_id: str) -> list[str]:
    return [
        e.event_type
        for e in await coordinator.events.read(limit=10_000)
        if e.event_type.startswith("task.") and e.details.get("task_id") == task_id
    ]


@pytest.mark.conformance(
    "lifecycle.running.execute",
    "scheduler.priority.default-zero",
    "lifecycle.runnable.accept-assignments",
)
async def test_a_submitted_task_runs_in_the_handler_and_completes(
    coordinator: Coordinator, client: SchedulerClient
) -> None:
    seen: list[tuple[str, Any, str, int]] = []

    async def handler(task: TaskContext) -> str:
        seen.append((task.task_id, task.json(), task.content_type, task.attempt))
        return f"summed {sum(task.json()['numbers'])}"

    async with _running_agent(coordinator, "worker", handler):
        accepted, reason = await client.submit_task(
            "worker", "t-1", {"numbers": [1, 2, 3]}, scope=SCOPE
        )
        assert accepted, reason
        done = await _ended(coordinator, "t-1")
    assert done.event_type == "task.completed"
    assert seen == [("t-1", {"numbers": [1, 2, 3]}, "application/json", 1)]
    task = await _scheduler(coordinator).find("t-1")
    assert (task.state, task.note, task.priority) == (TaskState.COMPLETED, "summed 6", 0)
    assert await _task_events(coordinator, "t-1") == [
        "task.submitted", "task.dispatched", "task.running", "task.completed",
    ]  # fmt: skip
    # The agent went RUNNABLE -> SCHEDULED -> RUNNING (its READ ACK) -> COMPLETED -> RUNNABLE.
    moves = [
        (e.details["from"], e.details["to"])
        for e in await coordinator.events.read(limit=10_000)
        if e.event_type == "agent.lifecycle" and e.agent_id == "worker"
    ]
    assert moves[-4:] == [
        ("RUNNABLE", "SCHEDULED"), ("SCHEDULED", "RUNNING"), ("RUNNING", "COMPLETED"),
        ("COMPLETED", "RUNNABLE"),
    ]  # fmt: skip


async def test_a_failing_handler_fails_the_task_with_its_code(
    coordinator: Coordinator, client: SchedulerClient
) -> None:
    async def handler(task: TaskContext) -> None:
        if task.json()["kind"] == "apiary":
            raise ToolTimeoutError("the linter hung")
        raise KeyError("missing")

    async with _running_agent(coordinator, "worker", handler):
        await client.submit_task("worker", "t-apiary", {"kind": "apiary"}, scope=SCOPE)
        await client.submit_task("worker", "t-plain", {"kind": "plain"}, scope=SCOPE)
        await _ended(coordinator, "t-apiary")
        await _ended(coordinator, "t-plain")
    scheduler = _scheduler(coordinator)
    coded = await scheduler.find("t-apiary")
    assert (coded.state, coded.error_code, coded.note) == (
        TaskState.FAILED, "tool_timeout", "the linter hung",
    )  # fmt: skip
    plain = await scheduler.find("t-plain")
    assert (plain.state, plain.error_code) == (TaskState.FAILED, "internal_error")
    assert plain.note == "KeyError: 'missing'"


@pytest.mark.conformance("preemption.nonpreemptible.max-duration")
async def test_a_non_preemptible_section_needs_a_maximum_duration(
    coordinator: Coordinator, client: SchedulerClient
) -> None:
    refusals: list[str] = []

    async def handler(task: TaskContext) -> str:
        for bad in (None, 0, -1.0, float("inf"), float("nan"), True):
            with pytest.raises(ValueError, match="max_duration"):
                task.non_preemptible(bad)
            refusals.append(repr(bad))
        # The Scheduler refuses a raw declaration without a maximum as well.
        raw = task.agent.envelope(
            {"command": "enter_section", "task_id": task.task_id},
            message_type=MessageType.CONTROL, correlation_id=task.task_id,
        )  # fmt: skip
        with pytest.raises(ValidationError, match="max_duration_ms"):
            await task.agent.send_envelope(raw, SCHEDULER)
        async with task.non_preemptible(max_duration=5):
            assert task.in_section
        assert not task.in_section
        return "ok"

    async with _running_agent(coordinator, "worker", handler):
        await client.submit_task("worker", "t-section", {"n": 1}, scope=SCOPE)
        done = await _ended(coordinator, "t-section")
    assert done.event_type == "task.completed"
    assert len(refusals) == 6
    moves = [
        (e.details["from"], e.details["to"])
        for e in await coordinator.events.read(limit=10_000)
        if e.event_type == "task.preemption" and e.details.get("task_id") == "t-section"
    ]
    assert moves == [("RUNNING", "NON_PREEMPTIBLE"), ("NON_PREEMPTIBLE", "RUNNING")]


@pytest.mark.conformance(
    "scheduler.priority.order-numeric",
    "scheduler.priority.order-fifo",
    "preemption.trigger.not-equal-or-lower",
)
async def test_queued_tasks_run_by_priority_then_fifo_without_preemption(
    tmp_path: Path,
) -> None:
    async with (
        open_test_coordinator(tmp_path, scheduler_settings=SchedulerSettings(prefetch=0)) as c,
        SchedulerClient(str(c.grpc_address)) as client,
    ):
        order = await _run_in_priority_order(c, client, answer="queued behind running task busy")
        assert order == ["busy", *QUEUED_ORDER]
        events = await c.events.read(limit=10_000)
        assert not [e for e in events if e.event_type == "task.preempt_requested"]


async def test_a_prefetched_task_gives_way_to_a_higher_priority_one(tmp_path: Path) -> None:
    """With a prefetch the first task queued behind `busy` is at the agent at once; each
    higher-priority task recalls the one prefetched, so they still run by priority, then in
    submission order."""
    async with (
        open_test_coordinator(tmp_path, scheduler_settings=SchedulerSettings(prefetch=1)) as c,
        SchedulerClient(str(c.grpc_address)) as client,
    ):
        order = await _run_in_priority_order(c, client)
        events = await c.events.read(limit=10_000)
    assert order == ["busy", *QUEUED_ORDER]
    recalled = [e for e in events if e.event_type == "task.preempt_requested"]
    assert recalled and all("recalled for" in str(e.details["reason"]) for e in recalled)
    assert "busy" not in {e.details["task_id"] for e in recalled}


async def test_a_prefetched_task_is_cancelled_without_running(coordinator: Coordinator) -> None:
    """A task waiting at the agent (prefetched behind a running one) has not started: its
    handle cancels it, and the agent gives it back at once, unrun."""
    started: list[str] = []
    release = asyncio.Event()

    async def handler(task: TaskContext) -> None:
        started.append(task.task_id)
        await release.wait()

    address = str(coordinator.grpc_address)
    async with _running_agent(coordinator, "worker", handler), Client(address) as app:
        busy = await app.submit_task("worker", {"n": 0}, scope=SCOPE, task_id="busy")
        await _event(coordinator, lambda e: e.event_type == "task.running")
        waiting = await app.submit_task("worker", {"n": 1}, scope=SCOPE, task_id="waiting")
        assert (await waiting.status()).state == TaskState.DISPATCHED  # at the agent, unread
        await waiting.cancel("not needed")
        with pytest.raises(TaskFailedError) as caught:
            await waiting.result(timeout=WAIT_S)
        assert caught.value.error_code == "cancelled"
        release.set()
        await busy.result(timeout=WAIT_S)
    assert started == ["busy"]


QUEUED = (("low", 5), ("mid-1", 0), ("top-1", -19), ("mid-2", 0), ("top-2", -19))
QUEUED_ORDER = ["top-1", "top-2", "mid-1", "mid-2", "low"]


async def _run_in_priority_order(
    coordinator: Coordinator, client: SchedulerClient, answer: str = ""
) -> list[str]:
    """`busy` runs while QUEUED are submitted (each answered `answer` when given); then it
    ends: the order in which every task started."""
    order: list[str] = []
    busy = asyncio.Event()
    release = asyncio.Event()

    async def handler(task: TaskContext) -> None:
        order.append(task.task_id)
        if task.task_id == "busy":
            busy.set()
            await release.wait()

    async with _running_agent(coordinator, "worker", handler):
        await client.submit_task("worker", "busy", {"n": 0}, priority=-19, scope=SCOPE)
        await asyncio.wait_for(busy.wait(), WAIT_S)
        for n, (task_id, priority) in enumerate(QUEUED, 1):
            accepted, reason = await client.submit_task(
                "worker", task_id, {"n": n}, priority=priority, scope=SCOPE
            )
            assert accepted, reason
            if answer:
                assert reason == answer, reason
        if answer:
            assert [t.task_id for t in _scheduler(coordinator).queued("worker")] == QUEUED_ORDER
        release.set()
        await _ended(coordinator, "low")
    return order


@pytest.mark.conformance("scheduler.priority.range")
async def test_priorities_outside_minus_19_to_20_are_refused(
    coordinator: Coordinator, client: SchedulerClient
) -> None:
    async with Agent("worker", coordinator=str(coordinator.grpc_address)):
        for n, priority in enumerate((-20, 21)):
            with pytest.raises(ValidationError, match="priority"):
                await client.submit_task("worker", f"bad-{n}", {"n": n}, priority=priority,
                                         scope=SCOPE)  # fmt: skip
        for n, priority in enumerate((-19, 20)):
            accepted, _ = await client.submit_task(
                "worker", f"edge-{n}", {"n": n}, priority=priority, scope=SCOPE
            )
            assert accepted


@pytest.mark.conformance("preemption.trigger.higher-priority", "preemption.safepoint.respond")
async def test_request_preemption_yields_at_the_next_safe_point(
    coordinator: Coordinator, client: SchedulerClient
) -> None:
    attempts: list[tuple[str, int]] = []
    stepping = asyncio.Event()

    async def handler(task: TaskContext) -> str:
        attempts.append((task.task_id, task.attempt))
        if task.attempt > 1:
            return "resumed"
        stepping.set()
        while True:  # steps until the Scheduler asks for the agent; each ends at a safe point
            await task.safe_point()
            await asyncio.sleep(0.005)

    async with _running_agent(coordinator, "worker", handler):
        await client.submit_task("worker", "long", {"n": 1}, scope=SCOPE)
        await asyncio.wait_for(stepping.wait(), WAIT_S)
        # The handler starts before its READ is applied (sdk/tasks.py): RUNNING follows.
        await _event(coordinator, lambda e: e.event_type == "task.running")
        assert await client.request_preemption("worker", "long", "operator wants it")
        done = await _ended(coordinator, "long")
    assert done.event_type == "task.completed"
    assert attempts == [("long", 1), ("long", 2)]
    assert await _task_events(coordinator, "long") == [
        "task.submitted", "task.dispatched", "task.running", "task.preempt_requested",
        "task.preemption", "task.control", "task.preemption", "task.requeued",
        "task.dispatched", "task.running", "task.completed",
    ]  # fmt: skip
    assert not await client.request_preemption("worker", "long")  # it ended


async def test_shutdown_ends_the_runner_and_the_submitter_names_the_lane(
    coordinator: Coordinator,
) -> None:
    async def handler(task: TaskContext) -> None:
        return None

    address = str(coordinator.grpc_address)
    async with Agent("boss", coordinator=address, communication_class="PRIVILEGED") as boss:
        boss_client = SchedulerClient.for_agent(boss)
        async with Agent("worker", coordinator=address) as agent:
            runner = TaskRunner(agent, handler)
            job = asyncio.create_task(runner.run())
            await boss_client.submit_task("worker", "t-lane", b'{"n": 1}', scope=SCOPE)
            await _ended(coordinator, "t-lane")
            await boss_client.shutdown_agent("worker", grace_s=5.0)
            await asyncio.wait_for(job, WAIT_S)  # the runner returns on `shutdown`
            assert runner.shutdown_requested.is_set()
    task = await _scheduler(coordinator).find("t-lane")
    assert (task.lane, task.state) == ("PRIVILEGED", TaskState.COMPLETED)
    controls = [
        e.details
        for e in await coordinator.events.read(limit=10_000)
        if e.event_type == "agent.control" and e.agent_id == "worker"
    ]
    assert [c["command"] for c in controls] == ["shutdown"]
