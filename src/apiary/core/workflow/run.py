"""A workflow's run as a whole (RFC 17.7 "Workflow State"): status, workflow_data, times.

`WorkflowState` on the wire has no status field; Apiary carries the run's status in its
metadata (`status`) and derives it from the nodes (`derive_status`):

- CREATED: defined (CreateWorkflow), not started;
- RUNNING: started, and some node is not finished (PENDING, READY or RUNNING), including
  nodes that wait for an event, a cron time or a ResumeWorkflow;
- COMPLETED: every node COMPLETED or SKIPPED (by a condition), none FAILED;
- FAILED: every node finished and at least one FAILED;
- CANCELLED: CancelWorkflow stopped it (from CREATED or RUNNING): its unfinished nodes were
  ended (core/workflow/node.py, CANCEL) and their tasks stopped. It is final: the status is
  set, never derived, and neither StartWorkflow nor ResumeWorkflow applies to it.

ResumeWorkflow puts a COMPLETED or FAILED run back to RUNNING.
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
    CANCELLED = "CANCELLED"

    @property
    def finished(self) -> bool:
        return self in _FINISHED

    @property
    def cancellable(self) -> bool:
        """Whether CancelWorkflow applies: the run has not finished (CREATED or RUNNING)."""
        return self not in _FINISHED


_FINISHED = frozenset({WorkflowStatus.COMPLETED, WorkflowStatus.FAILED, WorkflowStatus.CANCELLED})


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


@dataclass(frozen=True, slots=True)
class WorkflowSummary:
    """One line of a workflow listing: the run without its data, and how far its nodes got
    (`nodes_done`: COMPLETED, FAILED or SKIPPED)."""

    workflow_id: str
    status: WorkflowStatus
    nodes_total: int
    nodes_done: int
    created_at: float = 0.0
    started_at: float = 0.0
    completed_at: float = 0.0
    updated_at: float = 0.0


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
