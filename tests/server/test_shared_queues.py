"""Shared queues and concurrent agents over real gRPC sockets, with a real coordinator and SDK
agents (asyncio tasks of the test): `apiary.Client.submit_task(capability=...)` runs on any
agent offering the capability, spread fairly; a capability nobody offers waits and says so;
an agent declaring `task_concurrency` runs that many handlers at once with the prefetched
task waiting in its runner; and each new field is refused with the field named."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from apiary.engine.scheduler.scheduler import Scheduler
from apiary.engine.settings import SchedulerSettings
from apiary.errors import ValidationError
from apiary.sdk.agent import Agent
from apiary.sdk.client import Client
from apiary.sdk.tasks import TaskContext, TaskRunner
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb

WAIT_S = 20.0
a = pb.apiary_pb2
s = pb.scheduler_pb2
r = pb.registry_pb2


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    settings = SchedulerSettings(prefetch=1)
    async with open_test_coordinator(tmp_path, scheduler_settings=settings) as running:
        yield running


@pytest.fixture
async def client(coordinator: Coordinator) -> AsyncIterator[Client]:
    async with Client(str(coordinator.grpc_address), agent_id="app") as c:
        yield c


def _scheduler(coordinator: Coordinator) -> Scheduler:
    assert coordinator.scheduler is not None
    return coordinator.scheduler


class Gates:
    """Tasks that wait until the test lets them go, and who ran what."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.ran: dict[str, str] = {}
        self.running: set[str] = set()
        self.most_at_once = 0
        self.order: list[tuple[str, int]] = []
        """(key, attempt) of each start, in order."""
        self.cancelled: list[tuple[str, int]] = []

    def gate(self, key: str) -> asyncio.Event:
        return self.gates.setdefault(key, asyncio.Event())

    def handler(self, agent_id: str) -> Callable[[TaskContext], Awaitable[Any]]:
        async def run(task: TaskContext) -> Any:
            key = str((task.json() or {}).get("key", ""))
            self.ran[key] = agent_id
            self.running.add(key)
            self.most_at_once = max(self.most_at_once, len(self.running))
            self.order.append((key, task.attempt))
            try:
                if key.startswith("hold"):
                    try:
                        await self.gate(key).wait()
                    except asyncio.CancelledError:
                        self.cancelled.append((key, task.attempt))
                        raise
                while key.startswith("step") and not self.gate(key).is_set():
                    await task.safe_point()  # yields here once preempted
                    await asyncio.sleep(0.01)
            finally:
                self.running.discard(key)
            return {"key": key, "by": agent_id}

        return run


@asynccontextmanager
async def agents(
    coordinator: Coordinator, gates: Gates, *agent_ids: str, **options: Any
) -> AsyncIterator[dict[str, TaskRunner]]:
    """SDK agents offering `review` (and what `options` say), each running its tasks."""
    options.setdefault("capabilities", ("review",))
    async with contextlib.AsyncExitStack() as stack:
        runners: dict[str, TaskRunner] = {}
        jobs = []
        for agent_id in agent_ids:
            agent = Agent(agent_id, coordinator=str(coordinator.grpc_address), **options)
            await stack.enter_async_context(agent)
            runners[agent_id] = runner = TaskRunner(agent, gates.handler(agent_id))
            jobs.append(asyncio.create_task(runner.run()))
        try:
            for agent_id in agent_ids:  # each stream open: RUNNABLE
                await _until(lambda a=agent_id: _scheduler(coordinator).lifecycles.state(a)
                             == "RUNNABLE")  # fmt: skip
            yield runners
        finally:
            for job in jobs:
                job.cancel()
            for job in jobs:
                with contextlib.suppress(asyncio.CancelledError):
                    await job


async def _until(condition: Callable[[], bool]) -> None:
    """Bounded: the runners' and the Scheduler's plain state has no event to wait for."""
    async with asyncio.timeout(WAIT_S):
        while not condition():  # noqa: ASYNC110 - polls plain attributes
            await asyncio.sleep(0.01)


async def test_a_capability_task_runs_on_an_agent_offering_it(
    coordinator: Coordinator, client: Client
) -> None:
    gates = Gates()
    async with (
        agents(coordinator, gates, "reviewer"),
        agents(coordinator, gates, "builder", capabilities=("build",)),
    ):
        handle = await client.submit_task(capability="review", params={"key": "r1"},
                                          scope="repo:a")  # fmt: skip
        assert await handle.result(timeout=WAIT_S) == {"key": "r1", "by": "reviewer"}
        status = await handle.status()
        assert (status.queue, status.agent_id, status.lost_attempts) == (
            "capability:review", "reviewer", 0,
        )  # fmt: skip
        typed = await client.submit_task(agent_type="builder", params={"key": "b1"},
                                         scope="repo:b")  # fmt: skip
        assert await typed.result(timeout=WAIT_S) == {"key": "b1", "by": "builder"}


async def test_shared_tasks_spread_over_three_agents(
    coordinator: Coordinator, client: Client
) -> None:
    gates = Gates()
    async with agents(coordinator, gates, "x", "y", "z"):
        handles = [
            await client.submit_task(
                capability="review", params={"key": f"hold-{n}"}, scope=f"repo:{n}"
            )
            for n in range(6)
        ]
        await _until(lambda: len(gates.ran) == 3)
        assert sorted(gates.ran.values()) == ["x", "y", "z"]  # one each while they hold
        for n in range(3):
            gates.gate(f"hold-{n}").set()
        await _until(lambda: len(gates.ran) == 6)
        for n in range(3, 6):
            gates.gate(f"hold-{n}").set()
        for handle in handles:
            await handle.result(timeout=WAIT_S)
    by_agent = {agent: list(gates.ran.values()).count(agent) for agent in "xyz"}
    assert by_agent == {"x": 2, "y": 2, "z": 2}


async def test_a_capability_nobody_offers_waits_and_says_so(
    coordinator: Coordinator, client: Client
) -> None:
    handle = await client.submit_task(capability="translate", params={"key": "t"},
                                      scope="repo:a")  # fmt: skip
    assert handle.reason == "queued: waiting: no registered agent offers capability 'translate'"
    status = await handle.status()
    assert (status.state, status.agent_id) == ("QUEUED", "")
    assert status.note == "waiting: no registered agent offers capability 'translate'"
    listed = await client.task_query.ListTasks(a.ListTasksRequest(queue="capability:translate"))
    assert [(t.task_id, t.note) for t in listed.tasks] == [(handle.task_id, status.note)]
    gates = Gates()
    async with agents(coordinator, gates, "linguist", capabilities=("translate",)):
        assert await handle.result(timeout=WAIT_S) == {"key": "t", "by": "linguist"}


async def test_an_agent_runs_its_concurrency_with_one_task_prefetched(
    coordinator: Coordinator, client: Client
) -> None:
    gates = Gates()
    async with agents(coordinator, gates, "worker", task_concurrency=3) as runners:
        runner = runners["worker"]
        handles = [
            await client.submit_task("worker", {"key": f"hold-{n}"}, scope=f"repo:{n}")
            for n in range(5)
        ]
        await _until(lambda: len(runner.running) == 3 and len(runner.waiting) == 1)
        assert gates.most_at_once == 3
        scheduler = _scheduler(coordinator)

        def running() -> int:
            return [t.state for t in scheduler.holding("worker")].count("RUNNING")

        await _until(lambda: running() == 3)  # (each READ follows its handler's start)
        assert len(scheduler.holding("worker")) == 4  # 3 running + 1 prefetched
        assert len(scheduler.queued("worker")) == 1
        info = await client.discovery.GetAgent(a.GetAgentRequest(agent_id="worker"))
        assert info.task_concurrency == 3
        gates.gate("hold-0").set()
        await handles[0].result(timeout=WAIT_S)
        # The prefetched task started at once; the last one is prefetched in its place.
        await _until(lambda: len(runner.running) == 3 and len(runner.waiting) == 1)
        assert not scheduler.queued("worker")
        for n in range(1, 5):
            gates.gate(f"hold-{n}").set()
        for handle in handles:
            await handle.result(timeout=WAIT_S)
    assert gates.most_at_once == 3


@pytest.mark.conformance("preemption.trigger.higher-priority")
async def test_a_higher_priority_preempts_and_recalls_the_prefetched_task(
    coordinator: Coordinator, client: Client
) -> None:
    gates = Gates()
    async with agents(coordinator, gates, "worker", task_concurrency=1) as runners:
        low = await client.submit_task("worker", {"key": "step-low"}, scope="repo:a",
                                       priority=5)  # fmt: skip
        await _until(lambda: "step-low" in gates.running)
        waiting = await client.submit_task("worker", {"key": "later"}, scope="repo:b",
                                           priority=9)  # fmt: skip
        await _until(lambda: runners["worker"].waiting == [waiting.task_id])
        urgent = await client.submit_task("worker", {"key": "urgent"}, scope="repo:c",
                                          priority=-5)  # fmt: skip
        assert urgent.reason == f"queued: preempting task {low.task_id} (priority 5)"
        assert await urgent.result(timeout=WAIT_S) == {"key": "urgent", "by": "worker"}
        gates.gate("step-low").set()
        await low.result(timeout=WAIT_S)
        await waiting.result(timeout=WAIT_S)
    # The prefetched task went back without running; urgent ran next, then the rest. (Which
    # of the two runs first after urgent is not this test's subject: the agent's yield and
    # the recall's are separate ACKs, and once a loaded run saw the recalled one go first.)
    assert gates.order[:2] == [("step-low", 1), ("urgent", 1)]
    assert sorted(gates.order[2:]) == [("later", 2), ("step-low", 2)]
    assert (await waiting.status()).attempts == 2


async def test_a_task_prefetched_to_a_busy_agent_runs_on_one_that_frees_up(
    coordinator: Coordinator, client: Client
) -> None:
    """x runs a long task with the next one prefetched behind it; y joins with nothing to
    do: once the prefetched task has waited a second at x, x gives it back and y runs it
    (engine/scheduler/steals.py), while x's long task runs on."""
    gates = Gates()
    async with agents(coordinator, gates, "x", task_concurrency=1) as runners:
        long = await client.submit_task(capability="review", params={"key": "hold-long"},
                                        scope="repo:a")  # fmt: skip
        await _until(lambda: "hold-long" in gates.running)
        waiting = await client.submit_task(capability="review", params={"key": "next"},
                                           scope="repo:b")  # fmt: skip
        await _until(lambda: runners["x"].waiting == [waiting.task_id])
        async with agents(coordinator, gates, "y", task_concurrency=1):
            assert await waiting.result(timeout=WAIT_S) == {"key": "next", "by": "y"}
            assert "hold-long" in gates.running
            status = await waiting.status()
            assert (status.agent_id, status.attempts) == ("y", 2)
            gates.gate("hold-long").set()
            assert await long.result(timeout=WAIT_S) == {"key": "hold-long", "by": "x"}
    assert gates.order == [("hold-long", 1), ("next", 2)]  # it never started at x


async def test_an_agent_taken_for_lost_stops_the_attempt_taken_back(
    coordinator: Coordinator, client: Client
) -> None:
    """An agent the coordinator lost (missed heartbeats, say) that is alive after all is told
    to stop the attempt taken back from it; the task's next attempt starts only once it
    stopped (here on the same agent, recovered)."""
    gates = Gates()
    async with agents(coordinator, gates, "x") as runners:
        handle = await client.submit_task(capability="review", params={"key": "hold-1"},
                                          scope="repo:a")  # fmt: skip
        await _until(lambda: "hold-1" in gates.running)
        await _scheduler(coordinator).agent_lost("x", "missed heartbeats")
        await _until(lambda: gates.cancelled == [("hold-1", 1)])
        # Recovered (it reported RUNNABLE once its task stopped), it takes the next attempt.
        await _until(lambda: gates.order[-1] == ("hold-1", 2))
        assert runners["x"].running == [handle.task_id]
        status = await handle.status()
        assert (status.attempts, status.lost_attempts) == (2, 1)
        gates.gate("hold-1").set()
        assert await handle.result(timeout=WAIT_S) == {"key": "hold-1", "by": "x"}
    assert gates.most_at_once == 1  # never two attempts at once
    kinds = [e.event_type for e in await coordinator.events.read(limit=10_000)]
    assert "task.revoked" in kinds and "task.stale_ack" in kinds  # its terminated ACK


async def test_a_canonical_submit_request_is_an_apiary_one_on_the_wire(
    coordinator: Coordinator,
) -> None:
    """TaskQueryService.SubmitTask takes apiary.v1.SubmitTaskRequest, the canonical request's
    fields under the same numbers: a client sending the canonical message still works."""
    await coordinator.registry.register({
        "agent_id": "worker", "name": "worker", "reasoning_connectors": ["builtin://rules"],
    })  # fmt: skip
    canonical = s.SubmitTaskRequest(agent_id="worker", task_id="c-1", params=b"{}",
                                    content_type="application/json", scope="repo:a")  # fmt: skip
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel:
        call = channel.unary_unary(
            "/apiary.v1.TaskQueryService/SubmitTask",
            request_serializer=s.SubmitTaskRequest.SerializeToString,
            response_deserializer=a.SubmitTaskReply.FromString,
        )
        reply = await call(canonical, timeout=WAIT_S)
    assert (reply.task.task_id, reply.task.agent_id, reply.task.queue) == ("c-1", "worker", "")


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"agent_id": "worker", "capability": "review"}, "capability"),
        ({"capability": "review", "agent_type": "coder"}, "agent_type"),
        ({"capability": "two words"}, "capability"),
        ({"agent_type": "x" * 300}, "agent_type"),
        ({}, "agent_id"),
    ],
)
async def test_a_submission_naming_none_or_several_runners_is_refused(
    coordinator: Coordinator, client: Client, fields: dict[str, str], field: str
) -> None:
    request = a.SubmitTaskRequest(params=b"{}", scope="repo:a", **fields)
    with pytest.raises(ValidationError) as caught:
        await client.task_query.SubmitTask(request)
    assert caught.value.details["field"] == field
    listed = await client.task_query.ListTasks(a.ListTasksRequest())
    assert list(listed.tasks) == []


async def test_the_new_fields_are_refused_with_their_names(
    coordinator: Coordinator, client: Client
) -> None:
    descriptor = r.AgentDescriptor(agent_id="w", name="w", reasoning_connectors=["builtin://rules"])
    for bad in ("0", "-1", "lots", "257"):
        reply = await client.registry.RegisterAgent(
            r.RegisterAgentRequest(agent=descriptor),
            metadata=(("apiary-task-concurrency", bad),),
        )
        assert not reply.accepted and reply.reason.startswith("apiary-task-concurrency:"), bad
    assert coordinator.registry.known("w") is None
    with pytest.raises(ValidationError) as caught:
        await client.task_query.ListTasks(a.ListTasksRequest(queue="review"))
    assert caught.value.details["field"] == "queue"
    # CompleteTask of an attempt that is not the task's current one.
    gates = Gates()
    async with agents(coordinator, gates, "worker"):
        handle = await client.submit_task("worker", {"key": "hold-1"}, scope="repo:a")
        await _until(lambda: "hold-1" in gates.running)
        scheduler = _scheduler(coordinator)
        await _until(lambda: getattr(scheduler.get(handle.task_id), "state", "") == "RUNNING")
        stale = a.CompleteTaskRequest(task_id=handle.task_id, agent_id="worker",
                                      result_json="1", attempt=7)  # fmt: skip
        with pytest.raises(ValidationError) as caught:
            await client.task_query.CompleteTask(stale)
        assert caught.value.details["field"] == "attempt"
        assert (await handle.status()).state == "RUNNING"
        gates.gate("hold-1").set()
        assert await handle.result(timeout=WAIT_S) == {"key": "hold-1", "by": "worker"}


async def test_the_cli_submits_to_a_capability(coordinator: Coordinator) -> None:
    gates = Gates()
    async with agents(coordinator, gates, "reviewer"):
        out, err = await _cli(
            coordinator, "task", "submit", "--capability", "review", "--scope", "repo:a",
            "--params", json.dumps({"key": "cli"}), "--wait", "--timeout", str(WAIT_S),
        )  # fmt: skip
    assert json.loads(out) == {"key": "cli", "by": "reviewer"}
    listed, _ = await _cli(coordinator, "task", "list", "--queue", "capability:review", "--json")
    (doc,) = [json.loads(line) for line in listed.splitlines()]
    assert (doc["queue"], doc["agent_id"], doc["state"]) == (
        "capability:review", "reviewer", "COMPLETED",
    )  # fmt: skip
    _, err = await _cli(
        coordinator, "task", "submit", "worker", "--capability", "review", "--scope", "repo:a",
        code=2,
    )  # fmt: skip
    assert "AGENT_ID and --capability both name who runs it" in err


async def _cli(coordinator: Coordinator, *args: str, code: int = 0) -> tuple[str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "apiary.cli.main", *args, "--grpc", str(coordinator.grpc_address),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in {**os.environ, "COLUMNS": "200"}.items() if k != "APIARY_TOKEN"},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == code, (proc.returncode, err.decode())
    return out.decode(), err.decode()
