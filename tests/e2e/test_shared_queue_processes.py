"""Shared queues with real agent processes: an agent SIGKILLed with a task in hand is found
lost by its missed heartbeats, and its task goes back to the queue for the next agent
offering the capability (never running on two agents at once), until max_attempts of its
attempts were lost, when it fails with the reason.

The coordinator runs in the test process (real gRPC over loopback sockets) with short
heartbeats; every agent is a separate Python process running tests/e2e/task_agents.py (the
SDK only). Waits are driven by the coordinator's event log and the agents' stdout lines,
each bounded.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from apiary.core.events import Event
from apiary.engine.assembly import Runtime
from apiary.engine.presence import PresenceSettings
from apiary.engine.scheduler.scheduler import Scheduler
from apiary.engine.settings import SchedulerSettings
from apiary.sdk.agent import Agent
from apiary.sdk.client import Client
from apiary.sdk.errors import TaskFailedError
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.testing.events import wait_for_event
from tests.e2e.agent_process import AgentProcess

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 30.0
PRESENCE = PresenceSettings(heartbeat_interval_s=0.25, heartbeat_timeout_s=2.0, debounce=2)
"""An agent silent for 2 s, two checks in a row, is lost: seconds, not the default minute."""
HOLD = {"mode": "hold"}


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(
        tmp_path, runtime=Runtime(presence=PRESENCE),
        scheduler_settings=SchedulerSettings(max_attempts=2),
    ) as running:  # fmt: skip
        yield running


@pytest.fixture
async def client(coordinator: Coordinator) -> AsyncIterator[Client]:
    async with Client(str(coordinator.grpc_address), agent_id="app") as c:
        yield c


@asynccontextmanager
async def crunching_agent(
    coordinator: Coordinator, agent_id: str, logs: Path
) -> AsyncIterator[AgentProcess]:
    """An agent process offering the capability `crunch`."""
    with (logs / f"{agent_id}.stderr").open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.e2e.task_agents", agent_id,
            str(coordinator.grpc_address), "crunch", cwd=ROOT,
            stdout=asyncio.subprocess.PIPE, stderr=stderr,
        )  # fmt: skip
    agent = AgentProcess(proc, wait_s=WAIT_S)
    try:
        await agent.expect("ready")
        yield agent
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), WAIT_S)


async def _kill(agent: AgentProcess) -> None:
    agent.proc.kill()  # SIGKILL: no deregistration, no last ACK
    await asyncio.wait_for(agent.proc.wait(), WAIT_S)


def _scheduler(coordinator: Coordinator) -> Scheduler:
    assert coordinator.scheduler is not None
    return coordinator.scheduler


async def _event(coordinator: Coordinator, where: Callable[[Event], bool]) -> Event:
    return await wait_for_event(coordinator.events, where, timeout_s=WAIT_S)


def _of(kind: str, task_id: str) -> Callable[[Event], bool]:
    return lambda e: e.event_type == kind and e.details.get("task_id") == task_id


async def _task_log(coordinator: Coordinator, task_id: str) -> list[tuple[str, str]]:
    """(event type, agent) of the task's state changes, in order."""
    events = await coordinator.events.read(limit=100_000)
    return [
        (e.event_type, e.agent_id)
        for e in events
        if e.details.get("task_id") == task_id
        and e.event_type in ("task.submitted", "task.dispatched", "task.requeued",
                             "task.completed", "task.failed")
    ]  # fmt: skip


async def test_a_task_in_hand_of_a_killed_agent_runs_on_the_next_one(
    coordinator: Coordinator, client: Client, tmp_path: Path
) -> None:
    address = str(coordinator.grpc_address)
    async with crunching_agent(coordinator, "first", tmp_path) as first:
        handle = await client.submit_task(capability="crunch", params=HOLD, scope="repo:x",
                                          task_id="job-1")  # fmt: skip
        await first.expect("started", task="job-1", attempt=1)
        await _kill(first)
    requeued = await _event(coordinator, _of("task.requeued", "job-1"))
    assert requeued.details["error_code"] == "agent_unavailable"
    waiting = await handle.status()
    assert (waiting.state, waiting.agent_id, waiting.lost_attempts) == ("QUEUED", "", 1)
    async with (
        crunching_agent(coordinator, "second", tmp_path) as second,
        Agent("driver", coordinator=address) as driver,
    ):
        await second.expect("started", task="job-1", attempt=2)
        await driver.send("second", {"release": "job-1"})
        assert await handle.result(timeout=WAIT_S) == "released"
    done = await handle.status()
    assert (done.state, done.agent_id, done.attempts, done.lost_attempts) == (
        "COMPLETED", "second", 2, 1,
    )  # fmt: skip
    # Never held by two agents: back in the queue before it went out again.
    assert await _task_log(coordinator, "job-1") == [
        ("task.submitted", ""), ("task.dispatched", "first"), ("task.requeued", ""),
        ("task.dispatched", "second"), ("task.completed", "second"),
    ]  # fmt: skip
    lifecycle = [
        (e.details["input"], e.details["error_code"])
        for e in await coordinator.events.read(limit=100_000)
        if e.event_type == "agent.lifecycle" and e.agent_id == "first"
    ]
    assert ("LOST", "agent_unavailable") in lifecycle
    assert _scheduler(coordinator).holding("first") == []


async def test_after_max_attempts_lost_the_task_fails_with_the_reason(
    coordinator: Coordinator, client: Client, tmp_path: Path
) -> None:
    handle = await client.submit_task(capability="crunch", params=HOLD, scope="repo:x",
                                      task_id="job-2")  # fmt: skip
    for attempt, name in enumerate(("one", "two"), start=1):
        async with crunching_agent(coordinator, name, tmp_path) as agent:
            await agent.expect("started", task="job-2", attempt=attempt)
            await _kill(agent)
    failed = await _event(coordinator, _of("task.failed", "job-2"))
    assert failed.details["error_code"] == "agent_unavailable"
    with pytest.raises(TaskFailedError) as caught:
        await handle.result(timeout=WAIT_S)
    assert caught.value.error_code == "agent_unavailable"
    assert "agent two was lost with it" in caught.value.message
    assert "2 of 2 attempts lost ([scheduler] max_attempts)" in caught.value.message
    status = await handle.status()
    assert (status.state, status.lost_attempts) == ("FAILED", 2)
