"""HITL over real sockets: the CLI session of an operator, the canonical HitlService, the
operator service's authentication and SchedulerPolicyService.HitlAction (RFC 15)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from apiary.engine.assembly import Runtime
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb

TOKEN = "s3cret-operator-token"
SETTINGS = HitlSettings(operators=(OperatorEntry("olivia", token_digest(TOKEN), ("admin",)),))
AUTH = (("authorization", f"Bearer {TOKEN}"),)
a = pb.apiary_pb2


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path, runtime=Runtime(hitl=SETTINGS)) as running:
        yield running


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "apiary.cli.main", "hitl", *args],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "APIARY_TOKEN": TOKEN},
    )  # fmt: skip


@pytest.mark.conformance(
    "hitl.architecture.scheduler-interfaces", "hitl.integration.present-context"
)
async def test_an_operator_approves_from_the_cli_and_the_waiting_party_proceeds(
    coordinator: Coordinator,
) -> None:
    address = str(coordinator.grpc_address)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb.hitl_pb2_grpc.HitlServiceStub(channel)
        invocation = pb.hitl_pb2.HitlInvocation(
            reason_type=pb.common_pb2.SECURITY_APPROVAL,
            context=json.dumps({"operation": "merge", "suggested_action": "approve"}).encode(),
            proposed_actions=["approve", "deny"],
        )

        async def decide() -> pb.hitl_pb2.HitlDecision:
            return await stub.Decide(invocation, metadata=(("sw4rm-agent-id", "merger"),))

        waiting = asyncio.create_task(decide())
        listed = await asyncio.to_thread(_wait_for_listing, address)
        assert listed["reason_type"] == "SECURITY_APPROVAL"
        assert listed["requested_by"] == "merger"
        assert listed["context"] == {"operation": "merge", "suggested_action": "approve"}
        done = await asyncio.to_thread(
            _cli, "approve", listed["invocation_id"], "--reason", "tests pass", "--grpc", address
        )
        assert done.returncode == 0, done.stderr
        assert "DECIDED" in done.stdout
        decision = await asyncio.wait_for(waiting, 10)
    assert decision.action == "approve"
    assert decision.rationale == "tests pass"
    assert json.loads(decision.decision_payload)["decided_by"] == "olivia"
    events = [
        e for e in await coordinator.events.read(limit=1000) if e.event_type == "hitl.decided"
    ]
    assert events and events[0].actor == "olivia"


def _wait_for_listing(address: str) -> dict[str, object]:
    for _ in range(100):
        listing = _cli("list", "--json", "--grpc", address)
        assert listing.returncode == 0, listing.stderr
        lines = listing.stdout.strip().splitlines()
        if lines:
            found: dict[str, object] = json.loads(lines[0])
            return found
    raise AssertionError("the invocation never appeared in `apiary hitl list`")


async def test_list_wait_blocks_until_a_new_invocation_arrives(coordinator: Coordinator) -> None:
    address = str(coordinator.grpc_address)
    watcher = asyncio.create_task(
        asyncio.to_thread(_cli, "list", "--wait", "--json", "--grpc", address)
    )
    assert coordinator.hitl is not None
    for _ in range(300):  # until the CLI's watch stream is open (the operator is seen)
        if coordinator.hitl.operators.last_seen() > 0:
            break
        await asyncio.sleep(0.05)
    assert not watcher.done()
    await coordinator_escalate(coordinator, "CONFLICT")
    done = await asyncio.wait_for(watcher, 30)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[0])["reason_type"] == "CONFLICT"


async def coordinator_escalate(coordinator: Coordinator, reason: str) -> str:
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel:
        stub = pb.apiary_pb2_grpc.HitlOperatorServiceStub(channel)
        view = await stub.Escalate(a.EscalateRequest(reason_type=reason, requested_by="scheduler"))
    return view.invocation_id


async def test_operators_must_present_a_valid_token(coordinator: Coordinator) -> None:
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel:
        stub = pb.apiary_pb2_grpc.HitlOperatorServiceStub(channel)
        for metadata in ((), (("authorization", "Bearer nope"),)):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.List(a.ListInvocationsRequest(), metadata=metadata)
            assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
    denied = await asyncio.to_thread(
        _cli, "list", "--grpc", str(coordinator.grpc_address), "--token", ""
    )
    assert denied.returncode == 1
    assert "unauthenticated: this call needs an operator" in denied.stderr
    assert "(acting as " in denied.stderr


async def test_hitl_action_decides_a_negotiations_invocation(coordinator: Coordinator) -> None:
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel:
        ops = pb.apiary_pb2_grpc.HitlOperatorServiceStub(channel)
        view = await ops.Escalate(
            a.EscalateRequest(
                reason_type="DEBATE_DEADLOCK", requested_by="negotiation",
                subject_json=json.dumps({"negotiation_id": "neg-7"}),
            )
        )  # fmt: skip
        policy = pb.scheduler_policy_pb2_grpc.SchedulerPolicyServiceStub(channel)
        reply = await policy.HitlAction(
            pb.scheduler_policy_pb2.HitlActionRequest(
                negotiation_id="neg-7", action="deny", rationale="both drafts break the API"
            ),
            metadata=AUTH,
        )
        assert reply.ok
        decided = await ops.Get(
            a.GetInvocationRequest(invocation_id=view.invocation_id), metadata=AUTH
        )
    assert decided.state == "DECIDED"
    assert json.loads(decided.decision_json)["action"] == "deny"


@pytest.mark.conformance("hitl.decision.message", "hitl.integration.decision-actions")
async def test_a_hitl_decision_envelope_decides_the_invocation(coordinator: Coordinator) -> None:
    invocation = await coordinator_escalate(coordinator, "WORKTREE_OVERRIDE")
    payload = json.dumps(
        {
            "invocation_id": invocation,
            "decision": "modify",
            "rationale": "switch for 15 minutes only",
            "patch_b64": base64.b64encode(json.dumps({"ttl_ms": 900000}).encode()).decode(),
        }
    ).encode()
    env = pb.common_pb2.Envelope(
        message_id=str(uuid.uuid4()), producer_id="olivia-console",
        correlation_id=str(uuid.uuid4()), message_type=pb.common_pb2.HITL_INVOCATION,
        content_type="application/json", content_length=len(payload), payload=payload,
    )  # fmt: skip
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel:
        router = pb.router_pb2_grpc.RouterServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:  # no operator token
            await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=env))
        assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
        reply = await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=env), metadata=AUTH)
        assert reply.accepted and "DECIDED" in reply.reason
        ops = pb.apiary_pb2_grpc.HitlOperatorServiceStub(channel)
        view = await ops.Get(a.GetInvocationRequest(invocation_id=invocation), metadata=AUTH)
    decision = json.loads(view.decision_json)
    assert (decision["action"], decision["patch"]) == ("modify", {"ttl_ms": 900000})


async def test_operators_decide_over_the_json_gateway(coordinator: Coordinator) -> None:
    invocation = await coordinator_escalate(coordinator, "TOOL_PRIVILEGE_ESCALATION")
    base = f"http://{coordinator.http_address}/v1/apiary.v1.HitlOperatorService"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/List", json={}) as resp:
            assert resp.status == 401
        async with http.post(f"{base}/List", json={}, headers=headers) as resp:
            listed = (await resp.json())["invocations"]
        assert [i["invocation_id"] for i in listed] == [invocation]
        body = {"invocation_id": invocation, "action": "deny", "rationale": "not in this sprint"}
        async with http.post(f"{base}/Decide", json=body, headers=headers) as resp:
            assert resp.status == 200
            assert (await resp.json())["state"] == "DECIDED"
