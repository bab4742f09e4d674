"""sw4rm.workflow.WorkflowService over real gRPC (127.0.0.1 sockets): the canonical messages,
errors carried as protocol error codes naming the field, state with its status."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from apiary.errors import (
    AlreadyExistsError,
    NotFoundError,
    ValidationError,
    WorkflowCycleDetectedError,
)
from apiary.sdk.client import Client
from apiary.server.coordinator import Coordinator
from apiary.wire import pb

w = pb.workflow_pb2


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
