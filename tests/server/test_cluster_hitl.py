"""HITL from any replica of a cluster (docs/cluster.md, "The leader"): three coordinators
serving one PostgreSQL schema, HITL running on the leader.

- A HITL_DECISION envelope sent to a follower with RouterService.SendMessage decides an
  invocation opened on the leader.
- An invocation a follower's own component opens (as a tool call or a worktree binding
  asking for an approval does) is opened on the leader, decided through the other follower,
  and its requester, waiting on its own replica, gets the decision.
- A privileged tool call made on a follower (its tools are that replica's) waits for an
  approval opened on the leader, decided through the other follower, and then runs.
- A tool call cancelled on that follower while its approval is pending withdraws the
  approval: the leader cancels the invocation (relayed through the store).
- A decision sent through a follower by an operator without the invocation's approver role
  is refused as the leader refuses it, and the invocation stays pending.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest

from apiary.engine.assembly import Runtime
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.sdk.tool_provider import Tool, ToolCallContext
from apiary.sdk.tools import ToolClient
from apiary.server.coordinator import Coordinator
from apiary.wire import pb
from tests.server.test_cluster_leader import AUTH, TOKEN, WAIT_S, _three
from tests.server.tool_agents import tool_agent

pytestmark = pytest.mark.postgres

a = pb.apiary_pb2
VIEWER = "viewer-token-0123456789"
OPERATORS = Runtime(
    hitl=HitlSettings(
        operators=(
            OperatorEntry("olivia", token_digest(TOKEN), ("admin",)),
            OperatorEntry("victor", token_digest(VIEWER), ("viewer",)),
        )
    )
)
AS_VICTOR = (("authorization", f"Bearer {VIEWER}"),)


def _decision(invocation_id: str, action: str) -> pb.router_pb2.SendMessageRequest:
    payload = json.dumps(
        {"invocation_id": invocation_id, "decision": action, "rationale": "checked"}
    ).encode()
    env = pb.common_pb2.Envelope(
        message_id=str(uuid.uuid4()), producer_id="console",
        correlation_id=str(uuid.uuid4()), message_type=pb.common_pb2.HITL_INVOCATION,
        content_type="application/json", content_length=len(payload), payload=payload,
    )  # fmt: skip
    return pb.router_pb2.SendMessageRequest(msg=env)


async def _send(
    replica: Coordinator, request: pb.router_pb2.SendMessageRequest, auth: object
) -> str:
    """The follower's answer: its reason when accepted, else the error's code and message."""
    async with grpc.aio.insecure_channel(str(replica.grpc_address)) as channel:
        try:
            reply = await pb.router_pb2_grpc.RouterServiceStub(channel).SendMessage(
                request, metadata=auth
            )
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name} {exc.details()}"
    assert reply.accepted, reply.reason
    return str(reply.reason)


async def test_a_decision_envelope_sent_to_a_follower_decides_an_invocation_of_the_leader(
    tmp_path: Path, url: str
) -> None:
    async with _three(tmp_path, url, OPERATORS) as (leader, f1, _f2):
        assert leader.hitl is not None
        opened = await leader.hitl.open("SECURITY_APPROVAL", {"op": "merge"}, requested_by="ci")
        waiting = asyncio.create_task(leader.hitl.wait(opened.invocation_id))
        reason = await _send(f1, _decision(opened.invocation_id, "approve"), AUTH)
        assert reason == f"{opened.invocation_id} DECIDED"
        decided = await asyncio.wait_for(waiting, WAIT_S)
        assert decided.decision["action"] == "approve"
        assert decided.decision["decided_by"] == "olivia"


async def test_an_invocation_opened_on_a_follower_is_decided_through_another_and_answers_there(
    tmp_path: Path, url: str
) -> None:
    async with _three(tmp_path, url, OPERATORS) as (leader, f1, f2):
        assert leader.hitl is not None and f1.hitl is not None
        asking = asyncio.create_task(
            f1.hitl.escalate(
                "TOOL_PRIVILEGE_ESCALATION",
                {"tool": "deploy"},
                requested_by="builder",
                approver_roles=("admin",),
            )
        )
        invocation = await leader.hitl.get(await _until_listed(leader, asking))
        assert (invocation.requested_by, invocation.reason_type) == (
            "builder",
            "TOOL_PRIVILEGE_ESCALATION",
        )
        async with grpc.aio.insecure_channel(str(f2.grpc_address)) as two:
            view = await pb.apiary_pb2_grpc.HitlOperatorServiceStub(two).Decide(
                a.DecideInvocationRequest(
                    invocation_id=invocation.invocation_id, action="deny", rationale="no"
                ),
                metadata=AUTH,
            )
        assert view.state == "DECIDED"
        decided = await asyncio.wait_for(asking, WAIT_S)
        assert decided.invocation_id == invocation.invocation_id
        assert (decided.decision["action"], decided.decision["decided_by"]) == ("deny", "olivia")


async def test_a_privileged_tool_call_on_a_follower_runs_once_approved_through_another(
    tmp_path: Path, url: str
) -> None:
    runs: list[str] = []

    async def reboot(call: ToolCallContext) -> object:
        runs.append(call.call_id)
        return {"rebooted": True}

    async with (
        _three(tmp_path, url, OPERATORS) as (leader, f1, f2),
        tool_agent(str(f1.grpc_address), "ops", [Tool("reboot", reboot)]),
        grpc.aio.insecure_channel(str(f1.grpc_address)) as one,
        grpc.aio.insecure_channel(str(f2.grpc_address)) as two,
    ):
        calling = asyncio.create_task(
            ToolClient(one, agent_id="alice").call(
                "reboot",
                {"host": "db-1"},
                call_id="p-1",
                policy={"privilege_level": "PRIVILEGED"},
            )
        )
        operators = pb.apiary_pb2_grpc.HitlOperatorServiceStub(two)
        await _until_listed(leader, calling)
        listed = await operators.List(a.ListInvocationsRequest(), metadata=AUTH)
        (view,) = listed.invocations
        assert (view.reason_type, view.requested_by) == ("TOOL_PRIVILEGE_ESCALATION", "alice")
        assert runs == []  # (nothing runs before the decision)
        await operators.Decide(
            a.DecideInvocationRequest(
                invocation_id=view.invocation_id, action="approve", rationale="planned"
            ),
            metadata=AUTH,
        )
        frame = await asyncio.wait_for(calling, WAIT_S)
    assert frame.json() == {"rebooted": True} and runs == ["p-1"]


async def test_a_tool_call_cancelled_on_a_follower_withdraws_its_approval_on_the_leader(
    tmp_path: Path, url: str
) -> None:
    async def reboot(call: ToolCallContext) -> object:
        raise AssertionError("ran without an approval")

    async with (
        _three(tmp_path, url, OPERATORS) as (leader, f1, _f2),
        tool_agent(str(f1.grpc_address), "ops", [Tool("reboot", reboot)]),
        grpc.aio.insecure_channel(str(f1.grpc_address)) as one,
    ):
        client = ToolClient(one, agent_id="alice")
        stream = client.stream(
            "reboot", {}, call_id="w-1", policy={"privilege_level": "PRIVILEGED"}
        )
        first = asyncio.ensure_future(anext(stream))
        assert leader.hitl is not None
        pending = await _until_listed(leader, first)
        assert await client.cancel("w-1") == (
            "CANCELLED",
            "w-1: cancellation initiated (CANCELLED)",
        )
        frame = await asyncio.wait_for(first, WAIT_S)
        assert frame.final and frame.summary["status"] == "CANCELLED"
        loop = asyncio.get_running_loop()
        until = loop.time() + WAIT_S
        while (found := await leader.hitl.get(pending)).state == "PENDING":
            assert loop.time() < until, "the approval was never withdrawn"
            await asyncio.sleep(0.05)
        assert found.state == "CANCELLED"


async def _until_listed(leader: Coordinator, asking: asyncio.Future[Any]) -> str:
    """The one invocation pending on the leader, once there is one."""
    assert leader.hitl is not None
    loop = asyncio.get_running_loop()
    until = loop.time() + WAIT_S
    while not (pending := await leader.hitl.list()):
        assert loop.time() < until and not asking.done(), "never opened on the leader"
        await asyncio.sleep(0.05)
    (record,) = pending
    return record.invocation_id


async def test_a_decision_through_a_follower_is_authorized_as_on_the_leader(
    tmp_path: Path, url: str
) -> None:
    async with _three(tmp_path, url, OPERATORS) as (leader, f1, _f2):
        assert leader.hitl is not None and f1.hitl is not None
        opened = await f1.hitl.open(
            "SECURITY_APPROVAL", {"op": "rotate keys"}, requested_by="ops",
            approver_roles=("security",),
        )  # fmt: skip
        request = _decision(opened.invocation_id, "approve")
        on_leader = await _send(leader, request, AS_VICTOR)
        request.msg.message_id = str(uuid.uuid4())
        through_follower = await _send(f1, request, AS_VICTOR)
        assert through_follower.startswith("PERMISSION_DENIED"), through_follower
        assert through_follower == on_leader
        # Without an operator's credential: refused on the follower, before forwarding.
        request.msg.message_id = str(uuid.uuid4())
        assert (await _send(f1, request, ())).startswith("UNAUTHENTICATED")
        assert (await leader.hitl.get(opened.invocation_id)).state == "PENDING"
