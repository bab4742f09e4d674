"""How workflow records map to rows of `workflows` and `workflow_nodes`, for both SQL
backends. JSON (the definition, workflow_data, metadata) is kept as text in both, because
JSONB would not keep the definition's node order."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from apiary.core.workflow.definition import WorkflowSpec, spec_from_json, spec_to_json
from apiary.core.workflow.node import NodeRun, NodeStatus
from apiary.core.workflow.run import StoredWorkflow, WorkflowRun, WorkflowStatus
from apiary.store.errors import StoreError

WORKFLOW_COLUMNS = (
    "workflow_id, definition, created_at, status, data, started_at, completed_at, updated_at,"
    " metadata"
)
WORKFLOW_COLUMN_COUNT = 9
RUN_COLUMNS = ("status", "data", "started_at", "completed_at", "updated_at", "metadata")
"""The columns `save` rewrites (the definition never changes)."""
NODE_COLUMNS = (
    "workflow_id, node_id, status, attempts, dispatches, task_id, started_at, completed_at,"
    " output, error, triggered, due_at, event, updated_at"
)
NODE_COLUMN_COUNT = 14
NODE_NAMES = NODE_COLUMNS.split(", ")


class DuplicateWorkflowError(StoreError):
    """A workflow with this workflow_id is already stored."""


def workflow_row(spec: WorkflowSpec, run: WorkflowRun) -> tuple[Any, ...]:
    """The values of WORKFLOW_COLUMNS."""
    if spec.workflow_id != run.workflow_id:
        raise ValueError(f"run {run.workflow_id!r} is not of workflow {spec.workflow_id!r}")
    definition = json.dumps(spec_to_json(spec), separators=(",", ":"), ensure_ascii=False)
    return (spec.workflow_id, definition, float(spec.created_at), *run_values(run))


def run_values(run: WorkflowRun) -> tuple[Any, ...]:
    """The values of RUN_COLUMNS."""
    return (
        WorkflowStatus(run.status).value, run.data, float(run.started_at),
        float(run.completed_at), float(run.updated_at),
        json.dumps(dict(run.metadata), separators=(",", ":"), ensure_ascii=False),
    )  # fmt: skip


def run_from_row(row: Sequence[Any]) -> WorkflowRun:
    """A `WorkflowRun` from a row of WORKFLOW_COLUMNS."""
    workflow_id, _, _, status, data, started_at, completed_at, updated_at, metadata = row
    return WorkflowRun(
        workflow_id=workflow_id, status=WorkflowStatus(status), data=data,
        started_at=float(started_at), completed_at=float(completed_at),
        updated_at=float(updated_at), metadata=dict(json.loads(metadata)),
    )  # fmt: skip


def spec_from_row(row: Sequence[Any]) -> WorkflowSpec:
    """The definition of a row of WORKFLOW_COLUMNS."""
    return spec_from_json(json.loads(row[1]))


def node_row(workflow_id: str, node: NodeRun) -> tuple[Any, ...]:
    """The values of NODE_COLUMNS."""
    return (
        workflow_id, node.node_id, NodeStatus(node.status).value, int(node.attempts),
        int(node.dispatches), node.task_id, float(node.started_at), float(node.completed_at),
        node.output, node.error, int(bool(node.triggered)), float(node.due_at), node.event,
        float(node.updated_at),
    )  # fmt: skip


def node_from_row(row: Sequence[Any]) -> NodeRun:
    """A `NodeRun` from a row of NODE_COLUMNS."""
    return NodeRun(
        node_id=row[1], status=NodeStatus(row[2]), attempts=int(row[3]), dispatches=int(row[4]),
        task_id=row[5], started_at=float(row[6]), completed_at=float(row[7]), output=row[8],
        error=row[9], triggered=bool(row[10]), due_at=float(row[11]), event=row[12],
        updated_at=float(row[13]),
    )  # fmt: skip


def assemble(row: Sequence[Any], node_rows: Sequence[Sequence[Any]]) -> StoredWorkflow:
    """A `StoredWorkflow` from its row and its nodes' rows, nodes in definition order."""
    spec = spec_from_row(row)
    found: Mapping[str, NodeRun] = {r[1]: node_from_row(r) for r in node_rows}
    nodes = {key: found.get(key) or NodeRun(key) for key in spec.nodes}
    return StoredWorkflow(spec, run_from_row(row), nodes)


def status_clause(
    statuses: frozenset[str] | None, after_id: str, placeholder: str
) -> tuple[str, list[Any]] | None:
    """The WHERE clause and parameters of a listing; None when nothing can match."""
    clauses, params = [f"workflow_id > {placeholder}"], [after_id]
    if statuses is not None:
        if not statuses:
            return None
        values = sorted(WorkflowStatus(s).value for s in statuses)
        clauses.append(f"status IN ({', '.join([placeholder] * len(values))})")
        params.extend(values)
    return " AND ".join(clauses), params
