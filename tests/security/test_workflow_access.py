"""Who may list, cancel and read the history of workflows in secure mode: any principal lists
them; cancelling takes an operator with `tasks` (it ends the workflow's tasks, as CancelTask
does); a run's history is the event log's, for operators with `events`. A refused call
changes nothing."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message

from apiary.core.access.principal import PrincipalKind
from apiary.server.auth.keys import KeyRing, credentials_path
from apiary.wire import pb
from apiary.wire.services import SERVICES, RpcMethod
from tests.security.access_harness import Secure, open_secure

a, w = pb.apiary_pb2, pb.workflow_pb2
QUERY = {m.name: m for m in SERVICES["apiary.v1.WorkflowQueryService"]}
WORKFLOW = {m.name: m for m in SERVICES["sw4rm.workflow.WorkflowService"]}

pytestmark = pytest.mark.conformance("security.multitenant.authorization")


def _add_operator(s: Secure, name: str, role: str) -> None:
    ring = KeyRing(credentials_path(s.coordinator.config.data_dir))
    s.keys[name] = ring.create(PrincipalKind.OPERATOR, name, roles=(role,), now=time.time())[1]


async def _code(s: Secure, method: RpcMethod, request: Message, who: str | None) -> grpc.StatusCode:
    try:
        await s.call(method, request, who)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def _status(s: Secure, workflow_id: str) -> str:
    reply = await s.call(
        WORKFLOW["GetWorkflowState"], w.GetWorkflowStateRequest(workflow_id=workflow_id), "app"
    )
    return str(reply.state.metadata["status"])


async def test_cancel_and_history_need_their_roles_and_listing_any_principal(
    tmp_path: Path,
) -> None:
    async with open_secure(tmp_path) as s:
        _add_operator(s, "tess", "tasks")
        _add_operator(s, "eve", "events")
        definition = w.WorkflowDefinition(workflow_id="etl")
        definition.nodes["a"].CopyFrom(
            w.WorkflowNode(node_id="a", agent_id="alice", trigger_type=w.MANUAL)
        )
        create = w.CreateWorkflowRequest(definition=definition)
        await s.call(WORKFLOW["CreateWorkflow"], create, "app")
        await s.call(WORKFLOW["StartWorkflow"], w.StartWorkflowRequest(workflow_id="etl"), "app")

        listing = a.ListWorkflowsRequest()
        cancel = a.CancelWorkflowRequest(workflow_id="etl", reason="mine")
        history = a.WorkflowHistoryRequest(workflow_id="etl")
        for who in ("app", "alice", "no-role"):
            listed = await s.call(QUERY["ListWorkflows"], listing, who)
            assert [x.workflow_id for x in listed.workflows] == ["etl"]
        for method, request in ((QUERY["CancelWorkflow"], cancel),
                                (QUERY["WorkflowHistory"], history)):  # fmt: skip
            assert await _code(s, method, request, None) == grpc.StatusCode.UNAUTHENTICATED
            for who in ("app", "alice", "no-role"):
                assert await _code(s, method, request, who) == grpc.StatusCode.PERMISSION_DENIED
        assert await _code(s, QUERY["ListWorkflows"], listing, None) == (
            grpc.StatusCode.UNAUTHENTICATED
        )
        # The role of the one does not open the other.
        assert await _code(s, QUERY["WorkflowHistory"], history, "tess") == (
            grpc.StatusCode.PERMISSION_DENIED
        )
        assert await _code(s, QUERY["CancelWorkflow"], cancel, "eve") == (
            grpc.StatusCode.PERMISSION_DENIED
        )
        assert await _status(s, "etl") == "RUNNING"  # no refusal changed anything

        read = await s.call(QUERY["WorkflowHistory"], history, "eve")
        assert [e.event_type for e in read.events][:2] == ["workflow.created", "workflow.started"]
        state = await s.call(QUERY["CancelWorkflow"], cancel, "tess")
        assert state.metadata["status"] == "CANCELLED"
        assert state.node_states["a"].error == "cancelled by tess: mine"
