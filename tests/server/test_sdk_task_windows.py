"""An SDK agent that runs tasks back to back against a real coordinator over gRPC sockets:
its lifecycle steps when its window of tasks fills and when it empties, not per task
(core/agent_window.py), and DiscoveryService shows it RUNNING while a task runs and RUNNABLE
once the last has ended."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest

from apiary.core.events import Event
from apiary.sdk.agent import Agent
from apiary.sdk.scheduler import SchedulerClient
from apiary.sdk.tasks import TaskContext, TaskRunner
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.testing.events import wait_for_event
from apiary.wire import pb

N = 12
WAIT_S = 20.0


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path) as running:
        yield running


async def _shown(coordinator: Coordinator, agent_id: str) -> tuple[str, str]:
    """The agent's state through DiscoveryService: (GetAgent, ListAgents)."""
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel:
        stub = pb.apiary_pb2_grpc.DiscoveryServiceStub(channel)
        one = await stub.GetAgent(pb.apiary_pb2.GetAgentRequest(agent_id=agent_id))
        listed = await stub.ListAgents(pb.apiary_pb2.ListAgentsRequest())
    (found,) = [a.state for a in listed.agents if a.descriptor.agent_id == agent_id]
    return one.state, found


def _is_move(agent_id: str, to: str) -> Callable[[Event], bool]:
    def where(e: Event) -> bool:
        return (
            e.event_type == "agent.lifecycle" and e.agent_id == agent_id and (e.details["to"] == to)
        )

    return where


@pytest.mark.conformance("lifecycle.running.execute", "observability.log.every-transition")
async def test_tasks_run_back_to_back_step_the_agent_once_each_way(
    coordinator: Coordinator,
) -> None:
    first_started = asyncio.Event()
    go_on = asyncio.Event()
    ran: list[str] = []

    async def handler(task: TaskContext) -> str:
        if not ran:
            await task.started()  # the coordinator has its READ: the agent RUNNING there
            first_started.set()
            await go_on.wait()  # the others queue up meanwhile
        ran.append(task.task_id)
        return "done"

    async with (
        Agent("worker", coordinator=str(coordinator.grpc_address)) as agent,
        SchedulerClient(str(coordinator.grpc_address)) as client,
    ):
        runner = asyncio.create_task(TaskRunner(agent, handler).run())
        try:
            await wait_for_event(
                coordinator.events, _is_move("worker", "RUNNABLE"), timeout_s=WAIT_S
            )
            start = (await coordinator.events.read(limit=100_000))[-1].sequence
            for n in range(N):
                accepted, reason = await client.submit_task(
                    "worker", f"t{n}", {"n": n}, scope=f"repo:r{n}"
                )
                assert accepted, reason
            await asyncio.wait_for(first_started.wait(), WAIT_S)
            assert await _shown(coordinator, "worker") == ("RUNNING", "RUNNING")
            go_on.set()
            assert coordinator.scheduler is not None
            for n in range(N):
                done = await coordinator.scheduler.wait(f"t{n}", WAIT_S)
                assert done.state == "COMPLETED", done
            await wait_for_event(
                coordinator.events, _is_move("worker", "RUNNABLE"), after=start, timeout_s=WAIT_S
            )
            assert await _shown(coordinator, "worker") == ("RUNNABLE", "RUNNABLE")
        finally:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
    assert ran == [f"t{n}" for n in range(N)]
    moves = [
        (e.details["from"], e.details["to"])
        for e in await coordinator.events.read(after=start, limit=100_000)
        if e.event_type == "agent.lifecycle" and e.agent_id == "worker"
    ]
    # N tasks, one round (a round per task made 4 * N events).
    assert moves == [
        ("RUNNABLE", "SCHEDULED"), ("SCHEDULED", "RUNNING"), ("RUNNING", "COMPLETED"),
        ("COMPLETED", "RUNNABLE"),
    ]  # fmt: skip
