"""The in-memory workflow store: what the SQL backends keep, in dicts."""

from __future__ import annotations

from collections.abc import Sequence

from apiary.core.events import EventDraft
from apiary.core.workflow.definition import WorkflowSpec
from apiary.core.workflow.node import NodeRun
from apiary.core.workflow.run import StoredWorkflow, WorkflowRun, WorkflowStatus, WorkflowSummary
from apiary.store.errors import DuplicateWorkflowError, StoreError
from apiary.store.memory.events import MemoryEventLog
from apiary.store.sql.checks import check_limit
from apiary.store.sql.workflows import (
    ENDED_NODES,
    NodeRow,
    SummaryRow,
    WorkflowRow,
    assemble,
    node_row,
    run_from_row,
    run_values,
    summary_from_row,
    workflow_row,
)


class MemoryWorkflowStore:
    """`WorkflowStore` over rows kept in dicts (round-tripped as the SQL stores do, so that
    every backend hands back the same values); events that commit with a change go to
    `log`, in the same step."""

    def __init__(self, log: MemoryEventLog) -> None:
        self._rows: dict[str, WorkflowRow] = {}
        self._nodes: dict[str, dict[str, NodeRow]] = {}
        self._log = log

    async def create(
        self,
        spec: WorkflowSpec,
        run: WorkflowRun,
        nodes: Sequence[NodeRun],
        events: Sequence[EventDraft] = (),
    ) -> None:
        row = workflow_row(spec, run)
        node_rows = {n.node_id: node_row(spec.workflow_id, n) for n in nodes}
        if spec.workflow_id in self._rows:
            raise DuplicateWorkflowError(f"workflow {spec.workflow_id!r} already exists")
        drafts = self._log.checked(events)
        self._rows[spec.workflow_id] = row
        self._nodes[spec.workflow_id] = node_rows
        self._log.append_now(drafts)

    async def get(self, workflow_id: str) -> StoredWorkflow | None:
        row = self._rows.get(workflow_id)
        if row is None:
            return None
        return assemble(row, list(self._nodes[workflow_id].values()))

    async def save(
        self, run: WorkflowRun, nodes: Sequence[NodeRun], events: Sequence[EventDraft] = ()
    ) -> None:
        row = self._rows.get(run.workflow_id)
        if row is None:
            raise StoreError(f"no workflow {run.workflow_id!r}")
        stored = self._nodes[run.workflow_id]
        rows = [node_row(run.workflow_id, n) for n in nodes]
        unknown = [r.node_id for r in rows if r.node_id not in stored]
        if unknown:
            raise StoreError(f"workflow {run.workflow_id!r} has no node {unknown[0]!r}")
        values = run_values(run)
        drafts = self._log.checked(events)
        self._rows[run.workflow_id] = row._replace(**values._asdict())
        for node in rows:
            stored[node.node_id] = node
        self._log.append_now(drafts)

    async def list(
        self, statuses: frozenset[str] | None = None, after_id: str = "", limit: int = 100
    ) -> list[WorkflowRun]:
        check_limit(limit)
        wanted = None if statuses is None else {WorkflowStatus(s) for s in statuses}
        found = []
        for workflow_id in sorted(k for k in self._rows if k > after_id):
            run = run_from_row(self._rows[workflow_id])
            if wanted is None or run.status in wanted:
                found.append(run)
        return found[:limit]

    async def summaries(
        self, statuses: frozenset[str] | None = None, after_id: str = "", limit: int = 100
    ) -> Sequence[WorkflowSummary]:
        runs = await self.list(statuses, after_id, limit)
        return [self._summary(run.workflow_id) for run in runs]

    async def summary(self, workflow_id: str) -> WorkflowSummary | None:
        return self._summary(workflow_id) if workflow_id in self._rows else None

    def _summary(self, workflow_id: str) -> WorkflowSummary:
        row, nodes = self._rows[workflow_id], self._nodes[workflow_id].values()
        return summary_from_row(
            SummaryRow(
                row.workflow_id, row.status, len(nodes),
                sum(1 for n in nodes if n.status in ENDED_NODES), row.created_at,
                row.started_at, row.completed_at, row.updated_at,
            )
        )  # fmt: skip
