"""Preemption and scope conflicts with real agent processes (Appendix C.4, C.5, C.6).

The coordinator runs in the test process (real gRPC over loopback sockets); every agent is
a separate Python process running tests/e2e/task_agents.py, which uses only the SDK. Waits
are driven by the coordinator's event log and the agents' stdout lines, each bounded.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from apiary.core.events import Event
from apiary.core.preemption import PreemptionPolicy
from apiary.core.records import TaskState
from apiary.engine.assembly import Runtime
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.engine.scheduler.scheduler import Scheduler
from apiary.engine.settings import SchedulerSettings
from apiary.sdk.agent import Agent
from apiary.sdk.scheduler import SchedulerClient
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.testing.events import wait_for_event
from apiary.wire import pb
from tests.e2e.agent_process import AgentProcess

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 30.0
SCOPE = "path:src/app/**"
SAFE_POINT_TIMEOUT_S = 10.0
"""Long on purpose: nothing here may be forced because a safe point came late."""
GRACE_S = 0.5
SECTION_S = 1.0
TOKEN = "preemption-operator-token"
HITL = HitlSettings(operators=(OperatorEntry("olivia", token_digest(TOKEN), ("admin",)),))
AUTH = (("authorization", f"Bearer {TOKEN}"),)


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    settings = SchedulerSettings(
        preemption=PreemptionPolicy(safe_point_timeout_s=SAFE_POINT_TIMEOUT_S, grace_s=GRACE_S)
    )
    async with open_test_coordinator(
        tmp_path, runtime=Runtime(hitl=HITL), scheduler_settings=settings
    ) as running:
        yield running


@pytest.fixture
async def client(coordinator: Coordinator) -> AsyncIterator[SchedulerClient]:
    async with SchedulerClient(str(coordinator.grpc_address)) as scheduler:
        yield scheduler


@asynccontextmanager
async def agent_process(
    coordinator: Coordinator, agent_id: str, logs: Path
) -> AsyncIterator[AgentProcess]:
    with (logs / f"{agent_id}.stderr").open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.e2e.task_agents", agent_id,
            str(coordinator.grpc_address), cwd=ROOT,
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


def _scheduler(coordinator: Coordinator) -> Scheduler:
    assert coordinator.scheduler is not None
    return coordinator.scheduler


async def _event(coordinator: Coordinator, where: Callable[[Event], bool]) -> Event:
    return await wait_for_event(coordinator.events, where, timeout_s=WAIT_S)


async def _running(coordinator: Coordinator, task_id: str) -> Event:
    return await _event(
        coordinator,
        lambda e: e.event_type == "task.running" and e.details.get("task_id") == task_id,
    )


async def _ended(coordinator: Coordinator, task_id: str) -> Event:
    return await _event(
        coordinator,
        lambda e: (
            e.event_type in ("task.completed", "task.failed")
            and e.details.get("task_id") == task_id
        ),
    )


async def _log(coordinator: Coordinator) -> list[Event]:
    return await coordinator.events.read(limit=100_000)


def _task_log(events: list[Event], task_id: str) -> list[tuple[str, str]]:
    """(event type, what it says) of every event of the task, in order."""
    out = []
    for e in events:
        if e.details.get("task_id") != task_id or not e.event_type.startswith("task."):
            continue
        what = {
            "task.control": str(e.details.get("command")),
            "task.preemption": f"{e.details.get('from')}->{e.details.get('to')}",
        }.get(e.event_type, str(e.details.get("state", "")))
        out.append((e.event_type, what))
    return out


def _seq(events: list[Event], kind: str, task_id: str, nth: int = 0) -> int:
    found = [
        e.sequence for e in events if e.event_type == kind and e.details.get("task_id") == task_id
    ]
    return found[nth]


@pytest.mark.conformance(
    "preemption.trigger.higher-priority",
    "preemption.cooperative.required",
    "preemption.cooperative.no-force-first",
    "preemption.safepoint.agents-implement",
    "preemption.safepoint.respond",
    "lifecycle.running.execute",
)
async def test_c4_a_higher_priority_task_preempts_at_a_safe_point(
    coordinator: Coordinator, client: SchedulerClient, tmp_path: Path
) -> None:
    async with agent_process(coordinator, "x", tmp_path) as x:
        params = {"mode": "yield_once", "max_steps": 3000}
        assert (await client.submit_task("x", "low", params, priority=10, scope=SCOPE)).accepted
        await x.expect("started", task="low", attempt=1)
        # C.4 preempts a RUNNING task: the handler starts as its READ leaves, and the
        # coordinator records the task RUNNING once it lands (sdk/tasks.py).
        await _running(coordinator, "low")
        accepted, reason = await client.submit_task(
            "x", "high", {"mode": "quick"}, priority=-5, scope=SCOPE
        )
        assert accepted and reason == "queued: preempting task low (priority 10)", reason
        await _ended(coordinator, "low")
        await x.expect("yielding", task="low")
        await x.expect("started", task="low", attempt=2)
    assert [line["task"] for line in x.printed("started")] == ["low", "high", "low"]
    scheduler = _scheduler(coordinator)
    assert (await scheduler.find("low")).state == TaskState.COMPLETED
    assert (await scheduler.find("high")).state == TaskState.COMPLETED
    events = await _log(coordinator)
    assert _task_log(events, "low") == [
        ("task.submitted", "QUEUED"), ("task.dispatched", "DISPATCHED"),
        ("task.running", "RUNNING"), ("task.preempt_requested", ""),
        ("task.preemption", "RUNNING->PREEMPT_REQUESTED"), ("task.control", "preempt_request"),
        ("task.preemption", "PREEMPT_REQUESTED->YIELDED"), ("task.requeued", "QUEUED"),
        ("task.dispatched", "DISPATCHED"), ("task.running", "RUNNING"),
        ("task.completed", "COMPLETED"),
    ]  # fmt: skip
    # The yield freed the agent for the high task (RUN highP after the yield, C.4), which ran
    # to its end before low resumed; low went back to the agent behind it (the prefetch).
    assert (
        _seq(events, "task.requeued", "low")
        < _seq(events, "task.dispatched", "high")
        < _seq(events, "task.completed", "high")
        < _seq(events, "task.running", "low", 1)
    )
    assert _seq(events, "task.dispatched", "high") < _seq(events, "task.dispatched", "low", 1)
    commands = [e.details["command"] for e in events if e.event_type == "task.control"]
    assert commands == ["preempt_request"]  # cooperation sufficed: no terminate, no kill


@pytest.mark.conformance(
    "preemption.deferral.defer",
    "preemption.deferral.enforce-max-duration",
    "preemption.nonpreemptible.max-duration",
    "preemption.forced.soft-signal-grace",
    "preemption.forced.mark-failed",
    "preemption.cooperative.no-force-first",
)
async def test_c5_a_section_defers_preemption_until_its_maximum_then_terminate(
    coordinator: Coordinator, client: SchedulerClient, tmp_path: Path
) -> None:
    async with agent_process(coordinator, "x", tmp_path) as x:
        params = {"mode": "section", "max_duration": SECTION_S}
        await client.submit_task("x", "low", params, priority=10, scope=SCOPE)
        await x.expect("in_section", task="low")
        await client.submit_task("x", "high", {"mode": "quick"}, priority=-5, scope=SCOPE)
        failed = await _ended(coordinator, "low")
        await x.expect("cancelled", task="low")
        await _event(
            coordinator,
            lambda e: e.event_type == "task.completed" and e.details.get("task_id") == "high",
        )
    assert failed.event_type == "task.failed"
    assert failed.details["error_code"] == "forced_preemption"
    events = await _log(coordinator)
    assert _task_log(events, "low")[3:] == [
        ("task.preemption", "RUNNING->NON_PREEMPTIBLE"), ("task.preempt_requested", ""),
        ("task.preemption", "NON_PREEMPTIBLE->DEFERRED"), ("task.control", "preempt_request"),
        ("task.preemption", "DEFERRED->TERMINATING"), ("task.control", "terminate"),
        ("task.preemption", "TERMINATING->TERMINATED"), ("task.failed", "FAILED"),
    ]  # fmt: skip
    by_kind = {
        (e.event_type, e.details.get("to") or e.details.get("command")): e
        for e in events
        if e.details.get("task_id") == "low"
    }
    entered = by_kind[("task.preemption", "NON_PREEMPTIBLE")]
    terminate = by_kind[("task.control", "terminate")]
    # Deferred for the section's declared maximum, then forced: long before the safe-point
    # window (10 s) would have closed.
    assert SECTION_S - 0.05 <= terminate.ts - entered.ts < SAFE_POINT_TIMEOUT_S / 2
    assert not [e for e in events if e.details.get("command") == "kill"]
    assert _seq(events, "task.failed", "low") < _seq(events, "task.dispatched", "high")


@pytest.mark.conformance(
    "preemption.forced.soft-signal-grace",
    "preemption.forced.hard-after-grace",
    "preemption.forced.mark-failed",
    "lifecycle.recovering.attempt",
)
async def test_c5_an_agent_that_ignores_terminate_is_killed_after_the_grace_period(
    coordinator: Coordinator, client: SchedulerClient, tmp_path: Path
) -> None:
    async with agent_process(coordinator, "x", tmp_path) as x:
        params = {"mode": "stubborn", "max_duration": SECTION_S}
        await client.submit_task("x", "low", params, priority=10, scope=SCOPE)
        await x.expect("in_section", task="low")
        await client.submit_task("x", "high", {"mode": "quick"}, priority=-5, scope=SCOPE)
        failed = await _ended(coordinator, "low")
        await x.expect("ignored_cancel", task="low")
        # The runner abandoned the handler and reported the agent recovered: high runs.
        await _event(
            coordinator,
            lambda e: e.event_type == "task.completed" and e.details.get("task_id") == "high",
        )
    assert (failed.event_type, failed.details["error_code"]) == ("task.failed", "forced_preemption")
    events = await _log(coordinator)
    low = _task_log(events, "low")
    assert low[-5:] == [
        ("task.preemption", "DEFERRED->TERMINATING"), ("task.control", "terminate"),
        ("task.preemption", "TERMINATING->KILLED"), ("task.control", "kill"),
        ("task.failed", "FAILED"),
    ]  # fmt: skip
    assert [kind for kind, _ in low].count("task.failed") == 1
    terminate, kill = (
        e
        for e in events
        if e.event_type == "task.control" and e.details["command"] != "preempt_request"
    )
    assert terminate.details["command"] == "terminate"
    assert kill.ts - terminate.ts >= GRACE_S - 0.05
    moves = [
        (e.details["from"], e.details["to"], e.details["error_code"])
        for e in events
        if e.event_type == "agent.lifecycle" and e.agent_id == "x"
    ]
    failed_at = moves.index(("RUNNING", "FAILED", "forced_preemption"))
    assert moves[failed_at + 1][:2] == ("FAILED", "RECOVERING")
    assert moves[failed_at + 2][:2] == ("RECOVERING", "RUNNABLE")
    assert not _scheduler(coordinator).active().get("x")  # no instance counted twice or lost


async def _conflict_invocation(channel: grpc.aio.Channel, task_id: str) -> Any:
    ops = pb.apiary_pb2_grpc.HitlOperatorServiceStub(channel)
    listed = await ops.List(pb.apiary_pb2.ListInvocationsRequest(), metadata=AUTH)
    (found,) = [
        i for i in listed.invocations if json.loads(i.subject_json).get("task_id") == task_id
    ]
    return found


async def _decide(channel: grpc.aio.Channel, invocation_id: str, action: str) -> None:
    ops = pb.apiary_pb2_grpc.HitlOperatorServiceStub(channel)
    view = await ops.Decide(
        pb.apiary_pb2.DecideInvocationRequest(
            invocation_id=invocation_id, action=action, rationale="test operator"
        ),
        metadata=AUTH,
    )
    assert view.state == "DECIDED"


@pytest.mark.conformance(
    "concurrency.scope.overlap-analysis",
    "concurrency.conflict.consult-inference",
    "concurrency.inference.below-threshold-hitl",
    "concurrency.safety.serialize-when-uncertain",
)
@pytest.mark.parametrize("action", ["deny", "approve"])
async def test_c6_overlapping_scopes_escalate_and_the_operator_decides(
    coordinator: Coordinator, client: SchedulerClient, tmp_path: Path, action: str
) -> None:
    address = str(coordinator.grpc_address)
    async with (
        agent_process(coordinator, "x", tmp_path) as x,
        agent_process(coordinator, "y", tmp_path) as y,
        Agent("driver", coordinator=address) as driver,
        grpc.aio.insecure_channel(address) as channel,
    ):
        await client.submit_task("x", "x1", {"mode": "hold"}, scope=SCOPE)
        await x.expect("started", task="x1")
        accepted, reason = await client.submit_task(
            "y", "y1", {"mode": "quick"}, scope="path:src/app/models/**"
        )
        assert accepted, reason
        notice = await y.expect("notice")
        assert notice["body"]["event"] == "task_deferred"
        assert (notice["body"]["task_id"], notice["body"]["blocked_by"]) == ("y1", ["x1"])
        invocation = await _conflict_invocation(channel, "y1")
        assert invocation.reason_type == "CONFLICT"
        context = json.loads(invocation.context_json)
        assert context["confidence_score"] < 0.7
        assert json.loads(invocation.subject_json)["running_task_id"] == "x1"
        await _decide(channel, invocation.invocation_id, action)
        decided = await _event(coordinator, lambda e: e.event_type == "scheduler.conflict_decided")
        if action == "approve":
            assert decided.details["outcome"] == "PARALLEL"
            await _ended(coordinator, "y1")  # beside x1, which still runs
            assert _scheduler(coordinator).running("x") is not None
            await driver.send("x", {"release": "x1"})
            await _ended(coordinator, "x1")
        else:
            assert decided.details["outcome"] == "SERIALIZE"
            # Y is told again why it waits; its task stays queued while x1 runs.
            await _event(
                coordinator,
                lambda e: (
                    e.event_type == "task.deferred"
                    and e.details.get("reason", "").startswith("SERIALIZE")
                ),
            )
            assert [t.task_id for t in _scheduler(coordinator).queued("y")] == ["y1"]
            assert not [line for line in y.lines if line["event"] == "started"]
            await driver.send("x", {"release": "x1"})
            await _ended(coordinator, "y1")
        await y.expect("started", task="y1")
    scheduler = _scheduler(coordinator)
    assert (await scheduler.find("y1")).state == TaskState.COMPLETED
    assert (await scheduler.find("x1")).state == TaskState.COMPLETED
    events = await _log(coordinator)
    conflict = next(e for e in events if e.event_type == "scheduler.conflict")
    assert conflict.details["outcome"] == "ESCALATE"
    if action == "approve":
        assert _seq(events, "task.completed", "y1") < _seq(events, "task.completed", "x1")
    else:
        assert _seq(events, "task.completed", "x1") < _seq(events, "task.dispatched", "y1")
