"""The workflow store (RFC 17.7): `workflows` and `workflow_nodes`.

JSON (the definition, metadata) is kept as text in both dialects, because JSONB would not
keep the definition's node order. A create or a save is one transaction, with the events
it is given (`SqlEventLog.write_with`). The rows are
shared with the memory backend, which keeps them as the SQL stores do, so that every
backend hands back the same values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from apiary.core.events import EventDraft
from apiary.core.workflow.definition import WorkflowSpec, spec_from_json, spec_to_json
from apiary.core.workflow.node import NodeRun, NodeStatus
from apiary.core.workflow.run import StoredWorkflow, WorkflowRun, WorkflowStatus, WorkflowSummary
from apiary.store.errors import DuplicateWorkflowError, StoreError
from apiary.store.sql.bulk import chunks, values_rows
from apiary.store.sql.checks import check_limit
from apiary.store.sql.columns import Columns
from apiary.store.sql.database import SqlDatabase
from apiary.store.sql.dialect import Dialect, by_dialect
from apiary.store.sql.events import SqlEventLog
from apiary.store.sql.statements import Execute, ExecuteMany, Query, QueryOne, Transaction
from apiary.store.sql.where import Where


class RunRow(NamedTuple):
    """The columns of `workflows` a save rewrites (the definition never changes)."""

    status: str
    data: str
    started_at: float
    completed_at: float
    updated_at: float
    metadata: str


class WorkflowRow(NamedTuple):
    """A row of `workflows`: the definition, then the run (`RunRow`'s columns)."""

    workflow_id: str
    definition: str
    created_at: float
    status: str
    data: str
    started_at: float
    completed_at: float
    updated_at: float
    metadata: str


class NodeRow(NamedTuple):
    """A row of `workflow_nodes`."""

    workflow_id: str
    node_id: str
    status: str
    attempts: int
    dispatches: int
    task_id: str
    started_at: float
    completed_at: float
    output: str
    error: str
    triggered: int
    due_at: float
    event: str
    updated_at: float


class SummaryRow(NamedTuple):
    """A workflow listing's line: the run's columns but its data, and its nodes counted."""

    workflow_id: str
    status: str
    nodes_total: int
    nodes_done: int
    created_at: float
    started_at: float
    completed_at: float
    updated_at: float


WORKFLOWS = Columns(WorkflowRow)
RUNS = Columns(RunRow)
NODES = Columns(NodeRow)
SUMMARIES = Columns(SummaryRow)
ENDED_NODES = tuple(sorted(s.value for s in NodeStatus if s.terminal))
"""The node statuses a summary counts as done."""


def workflow_row(spec: WorkflowSpec, run: WorkflowRun) -> WorkflowRow:
    """The workflow's row; ValueError when `run` is of another workflow."""
    if spec.workflow_id != run.workflow_id:
        raise ValueError(f"run {run.workflow_id!r} is not of workflow {spec.workflow_id!r}")
    definition = json.dumps(spec_to_json(spec), separators=(",", ":"), ensure_ascii=False)
    return WorkflowRow(
        workflow_id=spec.workflow_id,
        definition=definition,
        created_at=float(spec.created_at),
        **run_values(run)._asdict(),
    )


def run_values(run: WorkflowRun) -> RunRow:
    """The run's columns."""
    return RunRow(
        status=WorkflowStatus(run.status).value,
        data=run.data,
        started_at=float(run.started_at),
        completed_at=float(run.completed_at),
        updated_at=float(run.updated_at),
        metadata=json.dumps(dict(run.metadata), separators=(",", ":"), ensure_ascii=False),
    )


def run_from_row(row: WorkflowRow) -> WorkflowRun:
    """The run of a workflow's row."""
    return WorkflowRun(
        workflow_id=row.workflow_id, status=WorkflowStatus(row.status), data=row.data,
        started_at=float(row.started_at), completed_at=float(row.completed_at),
        updated_at=float(row.updated_at), metadata=dict(json.loads(row.metadata)),
    )  # fmt: skip


def node_row(workflow_id: str, node: NodeRun) -> NodeRow:
    """The node's row in workflow `workflow_id`."""
    return NodeRow(
        workflow_id=workflow_id, node_id=node.node_id, status=NodeStatus(node.status).value,
        attempts=int(node.attempts), dispatches=int(node.dispatches), task_id=node.task_id,
        started_at=float(node.started_at), completed_at=float(node.completed_at),
        output=node.output, error=node.error, triggered=int(bool(node.triggered)),
        due_at=float(node.due_at), event=node.event, updated_at=float(node.updated_at),
    )  # fmt: skip


def node_from_row(row: NodeRow) -> NodeRun:
    """The node of a row."""
    return NodeRun(
        node_id=row.node_id, status=NodeStatus(row.status), attempts=int(row.attempts),
        dispatches=int(row.dispatches), task_id=row.task_id, started_at=float(row.started_at),
        completed_at=float(row.completed_at), output=row.output, error=row.error,
        triggered=bool(row.triggered), due_at=float(row.due_at), event=row.event,
        updated_at=float(row.updated_at),
    )  # fmt: skip


def summary_from_row(row: SummaryRow) -> WorkflowSummary:
    """The summary of a listing's row."""
    return WorkflowSummary(
        workflow_id=row.workflow_id, status=WorkflowStatus(row.status),
        nodes_total=int(row.nodes_total), nodes_done=int(row.nodes_done),
        created_at=float(row.created_at), started_at=float(row.started_at),
        completed_at=float(row.completed_at), updated_at=float(row.updated_at),
    )  # fmt: skip


def assemble(row: WorkflowRow, node_rows: Sequence[NodeRow]) -> StoredWorkflow:
    """A `StoredWorkflow` from its row and its nodes' rows, nodes in definition order."""
    spec = spec_from_json(json.loads(row.definition))
    found: Mapping[str, NodeRun] = {r.node_id: node_from_row(r) for r in node_rows}
    nodes = {key: found.get(key) or NodeRun(key) for key in spec.nodes}
    return StoredWorkflow(spec, run_from_row(row), nodes)


_CREATE = by_dialect(
    lambda d: d.insert("workflows", WORKFLOWS, " ON CONFLICT (workflow_id) DO NOTHING")
)
_INSERT_NODE = by_dialect(lambda d: d.insert("workflow_nodes", NODES))
_SAVE_RUN = (
    f"UPDATE workflows SET {', '.join(f'{c} = ?' for c in RUNS.names)} WHERE workflow_id = ?"
)
_GET = f"SELECT {WORKFLOWS.sql} FROM workflows WHERE workflow_id = ?"
_NODES_OF = f"SELECT {NODES.sql} FROM workflow_nodes WHERE workflow_id = ?"
_NODE_MARKERS = ", ".join("?" * NODES.count)
_COUNT_NODES = "(SELECT COUNT(*) FROM workflow_nodes n WHERE n.workflow_id = w.workflow_id{})"
_ENDED_LIST = ", ".join(f"'{status}'" for status in ENDED_NODES)
_SUMMARY = (
    f"SELECT w.workflow_id, w.status, {_COUNT_NODES.format('')}, "
    f"{_COUNT_NODES.format(f' AND n.status IN ({_ENDED_LIST})')}, "
    "w.created_at, w.started_at, w.completed_at, w.updated_at FROM workflows w"
)
# A VALUES list names its columns column1, column2, ... in both dialects.
_SAVE_NODES = (
    "UPDATE workflow_nodes SET "
    + ", ".join(f"{name} = v.column{i}" for i, name in enumerate(NODES.names, 1) if i > 2)
    + " FROM ({values}) AS v"
    " WHERE workflow_nodes.workflow_id = v.column1 AND workflow_nodes.node_id = v.column2"
)


class SqlWorkflowStore:
    """`WorkflowStore` in `workflows` and `workflow_nodes`; events that commit with a change
    go through `log`."""

    def __init__(self, database: SqlDatabase, log: SqlEventLog) -> None:
        self._db = database
        self._log = log

    async def create(
        self,
        spec: WorkflowSpec,
        run: WorkflowRun,
        nodes: Sequence[NodeRun],
        events: Sequence[EventDraft] = (),
    ) -> None:
        """Store a new workflow and its nodes with `events`; DuplicateWorkflowError when its
        id is taken (nothing is stored)."""
        row = workflow_row(spec, run)
        rows = [node_row(spec.workflow_id, n) for n in nodes]
        await self._log.write_with(events, _create, row, rows)

    async def get(self, workflow_id: str) -> StoredWorkflow | None:
        """The workflow with its nodes, or None."""
        return await self._db.read(_get, workflow_id)

    async def save(
        self, run: WorkflowRun, nodes: Sequence[NodeRun], events: Sequence[EventDraft] = ()
    ) -> None:
        """Rewrite the run and the given nodes with `events`; StoreError for an unknown
        workflow or node (nothing changes)."""
        rows = [node_row(run.workflow_id, n) for n in nodes]
        await self._log.write_with(events, _save, run.workflow_id, run_values(run), rows)

    async def list(
        self, statuses: frozenset[str] | None = None, after_id: str = "", limit: int = 100
    ) -> list[WorkflowRun]:
        """Runs in `statuses` (all when None) with ids after `after_id`, by id, at most
        `limit`."""
        check_limit(limit)
        values = None if statuses is None else {WorkflowStatus(s).value for s in statuses}
        where = Where().term("workflow_id > ?", after_id).among("status", values)
        if where.impossible:
            return []
        sql = (
            f"SELECT {WORKFLOWS.sql} FROM workflows WHERE {where.sql} ORDER BY workflow_id LIMIT ?"
        )
        rows = await self._db.read(Query(sql, [*where.params, limit]))
        return [run_from_row(WORKFLOWS.of(row)) for row in rows]

    async def summaries(
        self, statuses: frozenset[str] | None = None, after_id: str = "", limit: int = 100
    ) -> Sequence[WorkflowSummary]:
        """As `list`, each run summarized with its nodes counted."""
        check_limit(limit)
        values = None if statuses is None else {WorkflowStatus(s).value for s in statuses}
        where = Where().term("w.workflow_id > ?", after_id).among("w.status", values)
        if where.impossible:
            return []
        sql = f"{_SUMMARY} WHERE {where.sql} ORDER BY w.workflow_id LIMIT ?"
        rows = await self._db.read(Query(sql, [*where.params, limit]))
        return [summary_from_row(SUMMARIES.of(row)) for row in rows]

    async def summary(self, workflow_id: str) -> WorkflowSummary | None:
        """The summary of one workflow, or None."""
        row = await self._db.read(QueryOne(f"{_SUMMARY} WHERE w.workflow_id = ?", (workflow_id,)))
        return None if row is None else summary_from_row(SUMMARIES.of(row))


def _create(d: Dialect, row: WorkflowRow, nodes: list[NodeRow]) -> Transaction[None]:
    if (yield from Execute(_CREATE, row)) == 0:
        raise DuplicateWorkflowError(f"workflow {row.workflow_id!r} already exists")
    yield from ExecuteMany(_INSERT_NODE, nodes)


def _get(d: Dialect, workflow_id: str) -> Transaction[StoredWorkflow | None]:
    row = yield from QueryOne(_GET, (workflow_id,))
    if row is None:
        return None
    nodes = yield from Query(_NODES_OF, (workflow_id,))
    return assemble(WORKFLOWS.of(row), [NODES.of(n) for n in nodes])


def _save(d: Dialect, workflow_id: str, run: RunRow, nodes: list[NodeRow]) -> Transaction[None]:
    if (yield from Execute(_SAVE_RUN, (*run, workflow_id))) == 0:
        raise StoreError(f"no workflow {workflow_id!r}")
    changed = 0
    for count, params in chunks(d, nodes, NODES.count):
        sql = _SAVE_NODES.format(values=f"VALUES {values_rows(count, _NODE_MARKERS)}")
        changed += yield from Execute(sql, params)
    if changed != len(nodes):
        raise StoreError(f"workflow {workflow_id!r} lacks some of the nodes saved")
