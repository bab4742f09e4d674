"""A workflow's run as a whole (RFC 17.7 "Workflow State"): status, workflow_data, times.

`WorkflowState` on the wire has no status field; Apiary carries the run's status in its
metadata (`status`) and derives it from the nodes (`derive_status`):

- CREATED: defined (CreateWorkflow), not started;
- RUNNING: started, and some node is not finished (PENDING, READY or RUNNING), including
  nodes that wait for an event, a cron time or a ResumeWorkflow;
- COMPLETED: every node COMPLETED or SKIPPED (by a condition), none FAILED;
- FAILED: every node finished and at least one FAILED.

ResumeWorkflow puts a finished run back to RUNNING.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from apiary.core.workflow.definition import WorkflowSpec
from apiary.core.workflow.node import NodeRun, NodeStatus


class WorkflowStatus(StrEnum):
    CREATED = "CREATED"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"

    @property
    def finished(self) -> bool:
        return self in (WorkflowStatus.COMPLETED, WorkflowStatus.FAILED)


@dataclass(frozen=True, slots=True)
class WorkflowRun:
    """The run state of one workflow, as stored; `data` is workflow_data as JSON text and
    `metadata` the StartWorkflow (and ResumeWorkflow) request metadata."""

    workflow_id: str
    status: WorkflowStatus = WorkflowStatus.CREATED
    data: str = "{}"
    started_at: float = 0.0
    completed_at: float = 0.0
    updated_at: float = 0.0
    metadata: Mapping[str, str] = field(default_factory=dict)


def derive_status(nodes: Iterable[NodeRun]) -> WorkflowStatus:
    """RUNNING, COMPLETED or FAILED from the nodes of a started run (module docstring)."""
    failed = False
    for run in nodes:
        if not run.status.terminal:
            return WorkflowStatus.RUNNING
        failed = failed or run.status is NodeStatus.FAILED
    return WorkflowStatus.FAILED if failed else WorkflowStatus.COMPLETED


@dataclass(frozen=True, slots=True)
class StoredWorkflow:
    """A workflow as the store holds it: definition, run, and each node's run (in the
    definition's node order)."""

    spec: WorkflowSpec
    run: WorkflowRun
    nodes: Mapping[str, NodeRun]
