"""`sw4rm.workflow` messages (and apiary.v1's `WorkflowSummary`) <-> the workflow domain types
(core/workflow/)."""

from __future__ import annotations

from apiary.core.workflow.definition import (
    TRIGGER_NUMBERS,
    NodeSpec,
    WorkflowSpec,
    parse_trigger,
)
from apiary.core.workflow.node import STATUS_NUMBERS, NodeRun
from apiary.core.workflow.run import StoredWorkflow, WorkflowSummary
from apiary.wire import pb
from apiary.wire.convert import float_to_timestamp, timestamp_to_float

w = pb.workflow_pb2


def definition_from_proto(message: w.WorkflowDefinition) -> WorkflowSpec:
    """The domain form; nothing is validated here (validate_workflow does, naming fields)."""
    nodes = {
        key: NodeSpec(
            node_id=node.node_id or key,
            agent_id=node.agent_id,
            dependencies=tuple(node.dependencies),
            trigger=parse_trigger(int(node.trigger_type), f"nodes.{key}.trigger_type"),
            input_mapping=dict(node.input_mapping),
            output_mapping=dict(node.output_mapping),
            metadata=dict(node.metadata),
        )
        for key, node in message.nodes.items()
    }
    created = timestamp_to_float(message.created_at) if message.HasField("created_at") else 0.0
    return WorkflowSpec(message.workflow_id, nodes, created, dict(message.metadata))


def definition_to_proto(spec: WorkflowSpec) -> w.WorkflowDefinition:
    message = w.WorkflowDefinition(workflow_id=spec.workflow_id, metadata=dict(spec.metadata))
    if spec.created_at:
        message.created_at.CopyFrom(float_to_timestamp(spec.created_at))
    for key, node in spec.nodes.items():
        message.nodes[key].CopyFrom(
            w.WorkflowNode(
                node_id=node.node_id, agent_id=node.agent_id,
                dependencies=list(node.dependencies),
                trigger_type=w.TriggerType.ValueType(TRIGGER_NUMBERS[node.trigger]),
                input_mapping=dict(node.input_mapping), output_mapping=dict(node.output_mapping),
                metadata=dict(node.metadata),
            )
        )  # fmt: skip
    return message


def node_state_to_proto(run: NodeRun) -> w.NodeState:
    message = w.NodeState(
        node_id=run.node_id, status=w.NodeStatus.ValueType(STATUS_NUMBERS[run.status]),
        output=run.output,
        error=run.error,
    )  # fmt: skip
    if run.started_at:
        message.started_at.CopyFrom(float_to_timestamp(run.started_at))
    if run.completed_at:
        message.completed_at.CopyFrom(float_to_timestamp(run.completed_at))
    return message


def state_to_proto(stored: StoredWorkflow) -> w.WorkflowState:
    """`WorkflowState`; the run's status travels in metadata["status"] (core/workflow/run.py)."""
    run = stored.run
    message = w.WorkflowState(
        workflow_id=run.workflow_id, workflow_data=run.data,
        metadata={**run.metadata, "status": run.status.value},
    )  # fmt: skip
    for key, node in stored.nodes.items():
        message.node_states[key].CopyFrom(node_state_to_proto(node))
    if run.started_at:
        message.started_at.CopyFrom(float_to_timestamp(run.started_at))
    if run.completed_at:
        message.completed_at.CopyFrom(float_to_timestamp(run.completed_at))
    return message


def summary_to_proto(summary: WorkflowSummary) -> pb.apiary_pb2.WorkflowSummary:
    """A listing's line; times that are not set (never started, not finished) stay unset."""
    message = pb.apiary_pb2.WorkflowSummary(
        workflow_id=summary.workflow_id, state=summary.status.value,
        nodes_total=summary.nodes_total, nodes_done=summary.nodes_done,
    )  # fmt: skip
    for name in ("created_at", "started_at", "completed_at", "updated_at"):
        seconds = getattr(summary, name)
        if seconds:
            getattr(message, name).CopyFrom(float_to_timestamp(seconds))
    return message
