"""sw4rm.workflow.WorkflowService over real gRPC (127.0.0.1 sockets): the canonical messages,
errors carried as protocol error codes naming the field, state with its status; and
apiary.v1.WorkflowQueryService (list, cancel, history) over gRPC and the JSON gateway."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from apiary.errors import (
    AlreadyCompletedError,
    AlreadyExistsError,
    NotFoundError,
    ValidationError,
    WorkflowCycleDetectedError,
)
from apiary.sdk.client import Client
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb

w = pb.workflow_pb2
a = pb.apiary_pb2


@pytest.fixture
async def client(coordinator: Coordinator) -> AsyncIterator[Client]:
    async with Client(str(coordinator.grpc_address)) as running:
        yield running


def definition(workflow_id: str, **nodes: w.WorkflowNode) -> w.WorkflowDefinition:
    message = w.WorkflowDefinition(workflow_id=workflow_id, metadata={"team": "data"})
    for key, node in nodes.items():
        message.nodes[key].CopyFrom(node)
    return message


def node(
    node_id: str, *dependencies: str, trigger: int = w.DEPENDENCY, **metadata: str
) -> w.WorkflowNode:
    return w.WorkflowNode(
        node_id=node_id, agent_id=f"agent-{node_id}", dependencies=list(dependencies),
        trigger_type=trigger, metadata=metadata,
    )  # fmt: skip


@pytest.mark.conformance("workflow.cycle.error-code", "workflow.cycle.report-nodes")
async def test_create_refuses_a_cycle_with_its_code_and_nodes(client: Client) -> None:
    cyclic = definition("loop", a=node("a"), b=node("b", "a", "c"), c=node("c", "b"))
    with pytest.raises(WorkflowCycleDetectedError) as caught:
        await client.workflow.CreateWorkflow(w.CreateWorkflowRequest(definition=cyclic))
    assert caught.value.details["cycle"] == "b,c"
    with pytest.raises(NotFoundError):  # nothing was stored
        await client.workflow.GetWorkflowState(w.GetWorkflowStateRequest(workflow_id="loop"))


async def test_bad_input_gets_an_error_naming_the_field(client: Client) -> None:
    for bad, name in (
        (definition("x", a=node("a", "ghost")), "nodes.a.dependencies"),
        (definition("x", a=node("a", "a")), "nodes.a.dependencies"),
        (definition("x", a=node("a", retries="lots")), "nodes.a.metadata.retries"),
        (definition("x", a=node("a", trigger=w.SCHEDULE, cron="61 * * * *")),
         "nodes.a.metadata.cron"),
        (definition("x"), "nodes"),
    ):  # fmt: skip
        with pytest.raises(ValidationError) as caught:
            await client.workflow.CreateWorkflow(w.CreateWorkflowRequest(definition=bad))
        assert caught.value.details["field"] == name
    with pytest.raises(ValidationError) as caught:
        await client.workflow.CreateWorkflow(w.CreateWorkflowRequest())
    assert caught.value.details["field"] == "definition"


@pytest.mark.conformance("workflow.ops.create", "workflow.ops.get-state", "workflow.ops.start")
async def test_create_start_get_and_resume_over_the_wire(client: Client) -> None:
    manual = definition("etl", a=node("a", trigger=w.MANUAL), b=node("b", "a"))
    created = await client.workflow.CreateWorkflow(w.CreateWorkflowRequest(definition=manual))
    assert (created.workflow_id, created.success) == ("etl", True)
    with pytest.raises(AlreadyExistsError):
        await client.workflow.CreateWorkflow(w.CreateWorkflowRequest(definition=manual))

    got = await client.workflow.GetWorkflowState(w.GetWorkflowStateRequest(workflow_id="etl"))
    assert got.success and got.state.metadata["status"] == "CREATED"
    assert {k: s.status for k, s in got.state.node_states.items()} == {
        "a": w.PENDING, "b": w.PENDING
    }  # fmt: skip

    started = await client.workflow.StartWorkflow(
        w.StartWorkflowRequest(workflow_id="etl", workflow_data='{"src": "s3://b/k"}',
                               metadata={"requested_by": "cron"})
    )  # fmt: skip
    state = started.state
    assert started.success and state.metadata == {"requested_by": "cron", "status": "RUNNING"}
    assert json.loads(state.workflow_data) == {"src": "s3://b/k"}
    assert state.started_at.seconds > 0 and not state.HasField("completed_at")
    assert state.node_states["a"].status == w.PENDING  # MANUAL: waits for ResumeWorkflow

    with pytest.raises(NotFoundError):
        await client.workflow.ResumeWorkflow(
            w.ResumeWorkflowRequest(workflow_id="etl", node_id="zz")
        )
    with pytest.raises(ValidationError) as caught:
        await client.workflow.StartWorkflow(
            w.StartWorkflowRequest(workflow_id="etl2", workflow_data="{nope")
        )
    assert caught.value.details["field"] == "workflow_data"
    # The agent is not registered: the manual node runs, and fails as not submitted.
    resumed = await client.workflow.ResumeWorkflow(
        w.ResumeWorkflowRequest(workflow_id="etl", node_id="a", workflow_data='{"extra": 1}')
    )
    a = resumed.state.node_states["a"]
    assert a.status == w.FAILED and a.error.startswith("not submitted: NOT_FOUND")
    assert resumed.state.node_states["b"].status == w.SKIPPED
    assert resumed.state.metadata["status"] == "FAILED"
    assert json.loads(resumed.state.workflow_data) == {"src": "s3://b/k", "extra": 1}


# --- apiary.v1.WorkflowQueryService: list, cancel, history --------------------------------


@pytest.fixture
async def on_sqlite(tmp_path: Path) -> AsyncIterator[Coordinator]:
    store = f"sqlite:///{tmp_path / 'apiary.db'}"
    async with open_test_coordinator(tmp_path, store) as running:
        yield running


async def _waiting(client: Client, workflow_id: str) -> None:
    """A RUNNING workflow: its root is MANUAL, so nothing runs until a resume."""
    manual = definition(workflow_id, a=node("a", trigger=w.MANUAL), b=node("b", "a"))
    await client.workflow.CreateWorkflow(w.CreateWorkflowRequest(definition=manual))
    await client.workflow.StartWorkflow(w.StartWorkflowRequest(workflow_id=workflow_id))


async def test_list_cancel_and_history_over_grpc_on_sqlite(on_sqlite: Coordinator) -> None:
    async with Client(str(on_sqlite.grpc_address)) as client:
        query = client.workflow_query
        for workflow_id in ("wf-1", "wf-2", "wf-3"):
            await _waiting(client, workflow_id)
        first = await query.ListWorkflows(a.ListWorkflowsRequest(limit=2))
        assert [s.workflow_id for s in first.workflows] == ["wf-1", "wf-2"]
        assert first.next_after_id == "wf-2"
        summary = first.workflows[0]
        assert (summary.state, summary.nodes_done, summary.nodes_total) == ("RUNNING", 0, 2)
        assert summary.HasField("started_at") and not summary.HasField("completed_at")
        rest = await query.ListWorkflows(a.ListWorkflowsRequest(after_id="wf-2", limit=2))
        assert [s.workflow_id for s in rest.workflows] == ["wf-3"] and rest.next_after_id == ""

        cancelled = await query.CancelWorkflow(
            a.CancelWorkflowRequest(workflow_id="wf-2", reason="not needed")
        )
        assert cancelled.metadata["status"] == "CANCELLED"
        why = cancelled.node_states["a"].error
        assert why.startswith("cancelled by ") and why.endswith(": not needed")
        assert {k: (n.status, n.error) for k, n in cancelled.node_states.items()} == {
            "a": (w.SKIPPED, why), "b": (w.SKIPPED, why)
        }  # fmt: skip
        with pytest.raises(AlreadyCompletedError) as caught:
            await query.CancelWorkflow(a.CancelWorkflowRequest(workflow_id="wf-2"))
        assert caught.value.details["state"] == "CANCELLED"
        with pytest.raises(AlreadyCompletedError):
            await client.workflow.ResumeWorkflow(w.ResumeWorkflowRequest(workflow_id="wf-2"))
        with pytest.raises(NotFoundError):
            await query.CancelWorkflow(a.CancelWorkflowRequest(workflow_id="ghost"))

        only = await query.ListWorkflows(a.ListWorkflowsRequest(states=["cancelled"]))
        assert [(s.workflow_id, s.state, s.nodes_done) for s in only.workflows] == [
            ("wf-2", "CANCELLED", 2)
        ]
        with pytest.raises(ValidationError) as bad:
            await query.ListWorkflows(a.ListWorkflowsRequest(states=["FINISHED"]))
        assert bad.value.details["field"] == "states"

        history = await query.WorkflowHistory(a.WorkflowHistoryRequest(workflow_id="wf-2"))
        types = [e.event_type for e in history.events]
        assert types[0] == "workflow.created" and types[-1] == "workflow.cancelled"
        assert {e.correlation_id for e in history.events} == {"wf-2"}
        assert history.next_after_sequence == 0
        paged = await query.WorkflowHistory(
            a.WorkflowHistoryRequest(workflow_id="wf-2", limit=1, event_types=["workflow."])
        )
        assert [e.event_type for e in paged.events] == ["workflow.created"]
        assert paged.next_after_sequence == paged.events[0].sequence
        with pytest.raises(NotFoundError):
            await query.WorkflowHistory(a.WorkflowHistoryRequest(workflow_id="ghost"))


async def test_a_limit_above_the_bound_is_lowered_to_it(client: Client) -> None:
    await _waiting(client, "wf")
    reply = await client.workflow_query.ListWorkflows(a.ListWorkflowsRequest(limit=10**9))
    assert [s.workflow_id for s in reply.workflows] == ["wf"]
    history = await client.workflow_query.WorkflowHistory(
        a.WorkflowHistoryRequest(workflow_id="wf", limit=10**9)
    )
    assert history.events and history.next_after_sequence == 0


async def test_the_gateway_serves_the_workflow_queries(
    coordinator: Coordinator, client: Client
) -> None:
    await _waiting(client, "wf")
    base = f"http://{coordinator.http_address}/v1/apiary.v1.WorkflowQueryService"
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/ListWorkflows", json={"states": ["RUNNING"]}) as resp:
            assert resp.status == 200
            listed = await resp.json()
        assert [s["workflow_id"] for s in listed["workflows"]] == ["wf"]
        assert listed["workflows"][0]["nodes_total"] == 2
        async with http.post(f"{base}/CancelWorkflow", json={"workflow_id": "wf"}) as resp:
            assert resp.status == 200
            assert (await resp.json())["metadata"]["status"] == "CANCELLED"
        async with http.post(f"{base}/CancelWorkflow", json={"workflow_id": "wf"}) as resp:
            assert resp.status == 409  # FAILED_PRECONDITION: it has finished
            error = (await resp.json())["error"]
        assert "CANCELLED" in error["message"]
        async with http.post(f"{base}/WorkflowHistory", json={"workflow_id": "wf"}) as resp:
            assert resp.status == 200
            events = (await resp.json())["events"]
        assert events[-1]["event_type"] == "workflow.cancelled"


async def test_query_requests_meet_the_limits_naming_the_field(client: Client) -> None:
    query = client.workflow_query
    for call, field in (
        (query.ListWorkflows(a.ListWorkflowsRequest(after_id="x" * 10_000)), "after_id"),
        (query.CancelWorkflow(a.CancelWorkflowRequest(workflow_id="bad\nid")), "workflow_id"),
        (query.WorkflowHistory(a.WorkflowHistoryRequest(workflow_id="wf", after_sequence=2**63)),
         "after_sequence"),
    ):  # fmt: skip
        with pytest.raises(ValidationError) as caught:
            await call
        assert caught.value.details["field"] == field
