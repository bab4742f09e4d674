"""HITL with operators who are principals (API keys, certificates) rather than configured
tokens: a HITL component exists for them, so an invocation waits for one of them instead of
being decided at once by the no-approver policy (RFC 15.3); and an invocation that is decided
at once says so."""

from __future__ import annotations

import time
from pathlib import Path

import grpc

from apiary.core.access.principal import PrincipalKind
from apiary.server.auth.keys import KeyRing, credentials_path
from apiary.server.auth.settings import AuthSettings
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb

a = pb.apiary_pb2


def _escalation() -> a.EscalateRequest:
    return a.EscalateRequest(reason_type="SECURITY_APPROVAL", requested_by="planner")


async def test_an_operator_with_an_api_key_is_a_hitl_component(tmp_path: Path) -> None:
    _, key = KeyRing(credentials_path(tmp_path)).create(
        PrincipalKind.OPERATOR, "olivia", roles=("admin",), now=time.time()
    )
    auth = (("authorization", f"Bearer {key}"),)
    async with (
        open_test_coordinator(tmp_path, auth=AuthSettings(secure=True)) as coordinator,
        grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel,
    ):
        stub = pb.apiary_pb2_grpc.HitlOperatorServiceStub(channel)
        opened = await stub.Escalate(_escalation(), metadata=auth)
        assert opened.state == "PENDING"
        decided = await stub.Decide(
            a.DecideInvocationRequest(
                invocation_id=opened.invocation_id, action="approve", rationale="checked"
            ),
            metadata=auth,
        )
        assert decided.state != "PENDING"
        assert "olivia" in decided.decision_json


async def test_with_no_operator_at_all_the_answer_is_the_policys_decision(tmp_path: Path) -> None:
    async with (
        open_test_coordinator(tmp_path) as coordinator,
        grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel,
    ):
        stub = pb.apiary_pb2_grpc.HitlOperatorServiceStub(channel)
        opened = await stub.Escalate(_escalation())
        stored = await coordinator.store.hitl.get(opened.invocation_id)
    assert stored is not None and stored.state != "PENDING"
    assert opened.state == stored.state  # not the PENDING it was a moment before
