"""Privilege and network escalation of tool calls (RFC 18.5.2, 18.5.3, 15): HITL invocations
with reason TOOL_PRIVILEGE_ESCALATION decided by an operator over real gRPC, pre-approval by
configuration, and the logging each level requires."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from apiary.engine.assembly import Runtime
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.engine.tools.settings import ToolSettings
from apiary.errors import ApiaryError
from apiary.sdk.tool_provider import Tool, ToolCallContext
from apiary.sdk.tools import ToolClient
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb
from tests.server.tool_agents import tool_agent

TOKEN = "operator-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
a = pb.apiary_pb2
PREAPPROVED = {
    "ELEVATED": frozenset({"trusted"}),
    "PRIVILEGED": frozenset({"trusted/reboot"}),
}


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    runtime = Runtime(
        hitl=HitlSettings(operators=(OperatorEntry("olivia", token_digest(TOKEN), ("admin",)),)),
        tools=ToolSettings(preapproved=PREAPPROVED),
    )
    async with open_test_coordinator(tmp_path, runtime=runtime) as running:
        yield running


@pytest.fixture
async def channel(coordinator: Coordinator) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as ch:
        yield ch


class Ran:
    """Tools that record each run."""

    def __init__(self) -> None:
        self.runs: list[str] = []

    def tool(self, name: str) -> Tool:
        async def handler(call: ToolCallContext) -> Any:
            self.runs.append(name)
            return {"ran": name}

        return Tool(name, handler)


async def pending_invocation(channel: grpc.aio.Channel) -> a.HitlInvocationView:
    stub = pb.apiary_pb2_grpc.HitlOperatorServiceStub(channel)
    for _ in range(500):
        listing = await stub.List(a.ListInvocationsRequest(), metadata=AUTH)
        if listing.invocations:
            (view,) = listing.invocations
            return view
        await asyncio.sleep(0.01)
    raise AssertionError("no HITL invocation appeared")


async def decide(channel: grpc.aio.Channel, invocation_id: str, action: str) -> None:
    stub = pb.apiary_pb2_grpc.HitlOperatorServiceStub(channel)
    request = a.DecideInvocationRequest(
        invocation_id=invocation_id, action=action, rationale=f"{action} in a test"
    )
    await stub.Decide(request, metadata=AUTH)


async def privilege_events(coordinator: Coordinator) -> list[dict[str, Any]]:
    found = await coordinator.events.read(limit=10_000)
    return [dict(e.details) for e in found if e.event_type == "tool.privilege"]


@pytest.mark.conformance(
    "tool.privilege.privileged-hitl", "tool.privilege.escalation-hitl",
    "tool.privilege.privileged-warn-log",
)  # fmt: skip
async def test_a_privileged_call_waits_for_approval_and_runs_when_approved(
    coordinator: Coordinator, channel: grpc.aio.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    ran = Ran()
    caplog.set_level(logging.INFO, logger="apiary.tools")
    async with tool_agent(str(coordinator.grpc_address), "ops", [ran.tool("reboot")]):
        client = ToolClient(channel, agent_id="alice")
        pending = asyncio.create_task(
            client.call("reboot", {"host": "db-1"}, call_id="p-1",
                        policy={"privilege_level": "PRIVILEGED"})
        )  # fmt: skip
        view = await pending_invocation(channel)
        assert ran.runs == []  # nothing runs before the decision
        assert view.reason_type == "TOOL_PRIVILEGE_ESCALATION"
        assert view.requested_by == "alice"
        assert json.loads(view.subject_json) == {
            "call_id": "p-1", "provider_id": "ops", "tool_name": "reboot",
        }  # fmt: skip
        context = json.loads(view.context_json)
        assert context["reasons"] == ["privilege_level=PRIVILEGED"]
        assert context["args_excerpt"] == '{"host": "db-1"}'
        await decide(channel, view.invocation_id, "approve")
        frame = await asyncio.wait_for(pending, 10)
    assert frame.json() == {"ran": "reboot"}
    assert ran.runs == ["reboot"]
    warnings = [
        r for r in caplog.records
        if r.name == "apiary.tools" and r.levelno == logging.WARNING and "p-1" in r.getMessage()
    ]  # fmt: skip
    assert len(warnings) == 1
    assert "privilege_level=PRIVILEGED" in warnings[0].getMessage()
    (event,) = await privilege_events(coordinator)
    assert (event["call_id"], event["log_level"], event["hitl"]) == ("p-1", "warning", True)


@pytest.mark.conformance(
    "tool.privilege.escalation-hitl", "tool.network.full-access-hitl",
    "tool.errors.structured-codes",
)  # fmt: skip
@pytest.mark.parametrize(
    ("policy", "reason"),
    [
        ({"privilege_level": "ELEVATED"}, "privilege_level=ELEVATED"),
        ({"network_policy": "FULL_ACCESS"}, "network_policy=FULL_ACCESS"),
    ],
)
async def test_a_denied_escalation_answers_permission_denied_and_nothing_runs(
    coordinator: Coordinator, channel: grpc.aio.Channel, policy: dict[str, str], reason: str
) -> None:
    ran = Ran()
    async with tool_agent(str(coordinator.grpc_address), "ops", [ran.tool("fetch")]):
        client = ToolClient(channel, agent_id="alice")
        pending = asyncio.create_task(client.call("fetch", {}, policy=policy))
        view = await pending_invocation(channel)
        assert json.loads(view.context_json)["reasons"] == [reason]
        await decide(channel, view.invocation_id, "deny")
        with pytest.raises(ApiaryError) as caught:
            await asyncio.wait_for(pending, 10)
    assert caught.value.code == "permission_denied"
    assert caught.value.details["decision"] == "deny"
    assert caught.value.details["invocation_id"] == view.invocation_id
    assert ran.runs == []


@pytest.mark.conformance("tool.privilege.elevated-log", "tool.privilege.escalation-hitl")
async def test_pre_approved_escalations_skip_hitl_but_are_still_logged(
    coordinator: Coordinator, channel: grpc.aio.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    ran = Ran()
    caplog.set_level(logging.INFO, logger="apiary.tools")
    tools = [ran.tool("restart"), ran.tool("reboot"), ran.tool("wipe")]
    async with tool_agent(str(coordinator.grpc_address), "trusted", tools):
        client = ToolClient(channel, agent_id="alice")
        elevated = {"privilege_level": "ELEVATED"}
        await client.call("restart", {}, call_id="e-1", policy=elevated)
        await client.call("restart", {}, call_id="e-2", policy=elevated)
        # PRIVILEGED is pre-approved for trusted/reboot only (and covers ELEVATED there).
        await client.call("reboot", {}, call_id="e-3", policy={"privilege_level": "PRIVILEGED"})
        pending = asyncio.create_task(
            client.call("wipe", {}, call_id="e-4", policy={"privilege_level": "PRIVILEGED"})
        )
        view = await pending_invocation(channel)
        await decide(channel, view.invocation_id, "deny")
        with pytest.raises(ApiaryError):
            await asyncio.wait_for(pending, 10)
    assert ran.runs == ["restart", "restart", "reboot"]
    logged = [(e["call_id"], e["log_level"], e["preapproved"], e["hitl"])
              for e in await privilege_events(coordinator)]  # fmt: skip
    assert logged == [
        ("e-1", "info", True, False),
        ("e-2", "info", True, False),
        ("e-3", "warning", True, False),
        ("e-4", "warning", False, True),
    ]
    info = [r for r in caplog.records if r.name == "apiary.tools" and r.levelno == logging.INFO]
    assert sum("ELEVATED" in r.getMessage() for r in info) == 2  # each elevation, every time


async def test_cancel_withdraws_a_pending_approval(
    coordinator: Coordinator, channel: grpc.aio.Channel
) -> None:
    ran = Ran()
    async with tool_agent(str(coordinator.grpc_address), "ops", [ran.tool("reboot")]):
        client = ToolClient(channel, agent_id="alice")
        stream = client.stream(
            "reboot", {}, call_id="w-1", policy={"privilege_level": "PRIVILEGED"}
        )
        first = asyncio.create_task(anext(stream))
        view = await pending_invocation(channel)
        assert await client.cancel("w-1") == (
            "CANCELLED",
            "w-1: cancellation initiated (CANCELLED)",
        )
        frame = await asyncio.wait_for(first, 10)
    assert frame.final
    assert frame.summary["status"] == "CANCELLED"
    assert ran.runs == []
    stub = pb.apiary_pb2_grpc.HitlOperatorServiceStub(channel)
    withdrawn = await stub.Get(a.GetInvocationRequest(invocation_id=view.invocation_id),
                               metadata=AUTH)  # fmt: skip
    assert withdrawn.state == "CANCELLED"


async def test_only_operators_of_the_approver_roles_approve_an_escalation(tmp_path: Path) -> None:
    """`[tools] hitl_approver_roles`: an escalation carries them, and an operator without one
    of them is refused the decision (least privilege: not any operator may let a privileged
    call run)."""
    viewer = "viewer-token"
    runtime = Runtime(
        hitl=HitlSettings(
            operators=(
                OperatorEntry("olivia", token_digest(TOKEN), ("release_manager",)),
                OperatorEntry("victor", token_digest(viewer), ("events",)),
            )
        ),
        tools=ToolSettings(hitl_approver_roles=("release_manager",)),
    )
    ran = Ran()
    async with (
        open_test_coordinator(tmp_path, runtime=runtime) as running,
        grpc.aio.insecure_channel(str(running.grpc_address)) as channel,
        tool_agent(str(running.grpc_address), "ops", [ran.tool("reboot")]),
    ):
        client = ToolClient(channel, agent_id="alice")
        pending = asyncio.create_task(
            client.call("reboot", {}, call_id="r-1", policy={"privilege_level": "PRIVILEGED"})
        )
        view = await pending_invocation(channel)
        assert list(view.approver_roles) == ["release_manager"]
        stub = pb.apiary_pb2_grpc.HitlOperatorServiceStub(channel)
        request = a.DecideInvocationRequest(invocation_id=view.invocation_id, action="approve")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Decide(request, metadata=(("authorization", f"Bearer {viewer}"),))
        assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "release_manager" in (caught.value.details() or "")
        assert ran.runs == []
        await decide(channel, view.invocation_id, "approve")
        await asyncio.wait_for(pending, 10)
    assert ran.runs == ["reboot"]
