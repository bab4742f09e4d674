"""Appendix C.10 (Negotiation Room: Producer-Critic-Coordinator) with real agent processes.

The coordinator runs in the test process (real gRPC over loopback sockets); the producer and
the critics are separate processes started with `apiary agent run` on the classes of
tests/e2e/room_agents.py, which use only the SDK. Waits are driven by the agents' stdout
lines and the coordinator's event log, each bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import grpc
import pytest

from apiary.core.events import Event
from apiary.core.rooms.policy import RoomPolicy
from apiary.engine.assembly import Runtime
from apiary.engine.hitl import HitlSettings
from apiary.engine.negotiation.rooms import NegotiationRooms, RoomSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.testing.events import wait_for_event
from apiary.wire import pb
from tests.e2e.agent_process import AgentProcess

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 30.0
TOKEN = "room-operator-token"
HITL = HitlSettings(operators=(OperatorEntry("olivia", token_digest(TOKEN), ("admin",)),))
ROOMS = RoomSettings(policy=RoomPolicy(version="c10-v1"))


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path, runtime=Runtime(hitl=HITL, rooms=ROOMS)) as c:
        yield c


@asynccontextmanager
async def agent(
    coordinator: Coordinator, cls: str, agent_id: str, logs: Path, **env: str
) -> AsyncIterator[AgentProcess]:
    with (logs / f"{agent_id}.stderr").open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "apiary.cli.main", "agent", "run",
            f"tests.e2e.room_agents:{cls}", "--id", agent_id,
            "--coordinator", str(coordinator.grpc_address), cwd=ROOT,
            env={**os.environ, **env}, stdout=asyncio.subprocess.PIPE, stderr=stderr,
        )  # fmt: skip
    running = AgentProcess(proc, wait_s=WAIT_S, failure="failed")
    try:
        await running.expect("ready")
        yield running
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), WAIT_S)


async def start(
    coordinator: Coordinator, logs: Path, critics: dict[str, str], artifact_id: str
) -> tuple[AsyncExitStack, AgentProcess]:
    """Critics first, side by side (registered before they are asked), then the producer."""
    stack = AsyncExitStack()
    await asyncio.gather(
        *(stack.enter_async_context(agent(coordinator, cls, agent_id, logs))
          for agent_id, cls in critics.items())
    )  # fmt: skip
    producer = await stack.enter_async_context(
        agent(
            coordinator, "Producer", "planner", logs, ROOM_CRITICS=",".join(critics),
            ROOM_ARTIFACT_ID=artifact_id, ROOM_ID="schema-migration",
        )
    )  # fmt: skip
    return stack, producer


async def event(coordinator: Coordinator, where: Callable[[Event], bool]) -> Event:
    """The first matching event of the log, waiting for new ones as they land."""
    return await wait_for_event(coordinator.events, where, timeout_s=WAIT_S)


async def room_log(coordinator: Coordinator) -> list[Event]:
    every = await coordinator.events.read(limit=100_000)
    return [e for e in every if e.event_type.startswith(("room.", "hitl."))]


def rooms(coordinator: Coordinator) -> NegotiationRooms:
    assert coordinator.rooms is not None
    return coordinator.rooms


@pytest.mark.conformance(
    "room.wait-for-decision", "room.auto-approval.all-conditions",
    "patterns.room.auto-approval.all-conditions", "room.decision.policy-version",
)  # fmt: skip
async def test_c10_two_critics_approve_and_the_producer_is_told(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    critics = {"critic-1": "GenerousCritic", "critic-2": "CautiousCritic"}
    stack, producer = await start(coordinator, tmp_path, critics, "plan-approved")
    async with stack:
        proposed = await producer.expect("proposed")
        decided = (await producer.expect("decision"))["decision"]
        notice = (await producer.expect("notice"))["body"]
    assert proposed == {"event": "proposed", "artifact_id": "plan-approved",
                        "room": "schema-migration"}  # fmt: skip
    # C.10: scores 8 (0.9) and 6 (0.7): weighted_mean ~7.2, std_dev 1.0 -> APPROVED.
    assert decided["outcome"] == "APPROVED"
    assert decided["policy_version"] == "c10-v1"
    assert decided["aggregated_score"]["weighted_mean"] == pytest.approx(7.125)
    assert decided["aggregated_score"]["std_dev"] == pytest.approx(1.0)
    assert sorted(v["critic_id"] for v in decided["votes"]) == ["critic-1", "critic-2"]
    assert (notice["event"], notice["outcome"]) == ("room.decided", "APPROVED")
    log = await room_log(coordinator)
    assert [e.event_type for e in log] == [
        "room.proposed", "room.voted", "room.voted", "room.decided",
    ]  # fmt: skip
    assert {e.correlation_id for e in log} == {"schema-migration"}
    assert {e.agent_id for e in log if e.event_type == "room.voted"} == set(critics)
    assert log[0].actor == "planner"
    stored = await rooms(coordinator).decision("plan-approved")
    assert stored is not None and (stored.outcome, stored.via) == ("APPROVED", "policy")


@pytest.mark.conformance(
    "room.escalate.critic-request", "patterns.room.escalate.critic-request",
    "hitl.decision.apply-immediately",
)  # fmt: skip
async def test_c10_a_critic_asks_for_a_human_and_the_operator_decides(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    critics = {"critic-1": "GenerousCritic", "critic-3": "WaryCritic"}
    stack, producer = await start(coordinator, tmp_path, critics, "plan-escalated")
    async with stack:
        escalated = await event(coordinator, lambda e: e.event_type == "room.escalated")
        invocation_id = escalated.details["invocation_id"]
        assert escalated.details["triggers"] == ["critic_request"]
        assert escalated.details["hitl_reason"] == "CONFLICT"
        told = (await producer.expect("notice"))["body"]
        assert (told["event"], told["invocation_id"]) == ("room.escalated", invocation_id)
        async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel:
            operators = pb.apiary_pb2_grpc.HitlOperatorServiceStub(channel)
            view = await operators.Get(
                pb.apiary_pb2.GetInvocationRequest(invocation_id=invocation_id),
                metadata=(("authorization", f"Bearer {TOKEN}"),),
            )
            context = json.loads(view.context_json)
            assert context["triggers"] == ["critic_request"]
            assert "billing" in json.dumps(context["votes"])
            await operators.Decide(
                pb.apiary_pb2.DecideInvocationRequest(
                    invocation_id=invocation_id, action="approve",
                    rationale="backfill reviewed with the billing team",
                ),
                metadata=(("authorization", f"Bearer {TOKEN}"),),
            )  # fmt: skip
        decided = (await producer.expect("decision"))["decision"]
    assert decided["outcome"] == "APPROVED"
    assert "approve by olivia: backfill reviewed" in decided["reason"]
    log = await room_log(coordinator)
    assert [e.event_type for e in log] == [
        "room.proposed", "room.voted", "room.voted", "hitl.opened", "room.escalated",
        "hitl.decided", "room.decided",
    ]  # fmt: skip
    assert (log[-1].actor, log[-1].details["via"]) == ("olivia", "hitl")
    history = await rooms(coordinator).decisions("plan-escalated")
    assert [(d.outcome, d.decided_by) for d in history] == [
        ("ESCALATED_TO_HITL", "negotiation_room"), ("APPROVED", "olivia"),
    ]  # fmt: skip
