"""The SQLite workflow store: `workflows` and `workflow_nodes` (RFC 17.7)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from apiary.core.workflow.definition import WorkflowSpec
from apiary.core.workflow.node import NodeRun
from apiary.core.workflow.run import StoredWorkflow, WorkflowRun
from apiary.store.errors import StoreError
from apiary.store.sql_rows import check_limit
from apiary.store.sqlite.database import SqliteDatabase, placeholders
from apiary.store.workflow_rows import (
    NODE_COLUMN_COUNT,
    NODE_COLUMNS,
    NODE_NAMES,
    RUN_COLUMNS,
    WORKFLOW_COLUMN_COUNT,
    WORKFLOW_COLUMNS,
    DuplicateWorkflowError,
    assemble,
    node_row,
    run_from_row,
    run_values,
    status_clause,
    workflow_row,
)

_CREATE = (
    f"INSERT INTO workflows ({WORKFLOW_COLUMNS}) VALUES ({placeholders(WORKFLOW_COLUMN_COUNT)})"
    " ON CONFLICT (workflow_id) DO NOTHING"
)
_INSERT_NODE = (
    f"INSERT INTO workflow_nodes ({NODE_COLUMNS}) VALUES ({placeholders(NODE_COLUMN_COUNT)})"
)
_SAVE_RUN = (
    f"UPDATE workflows SET {', '.join(f'{c} = ?' for c in RUN_COLUMNS)} WHERE workflow_id = ?"
)
_SAVE_NODE = (
    f"UPDATE workflow_nodes SET {', '.join(f'{c} = ?' for c in NODE_NAMES[2:])}"
    " WHERE workflow_id = ? AND node_id = ?"
)


class SqliteWorkflowStore:
    """`WorkflowStore` in SQLite; a create or a save is one job, so one transaction."""

    def __init__(self, database: SqliteDatabase) -> None:
        self._db = database

    async def create(self, spec: WorkflowSpec, run: WorkflowRun, nodes: Sequence[NodeRun]) -> None:
        row = workflow_row(spec, run)
        rows = [node_row(spec.workflow_id, n) for n in nodes]
        await self._db.call(_create, spec.workflow_id, row, rows)

    async def get(self, workflow_id: str) -> StoredWorkflow | None:
        def query(conn: sqlite3.Connection) -> StoredWorkflow | None:
            row = conn.execute(
                f"SELECT {WORKFLOW_COLUMNS} FROM workflows WHERE workflow_id = ?", (workflow_id,)
            ).fetchone()
            if row is None:
                return None
            nodes = conn.execute(
                f"SELECT {NODE_COLUMNS} FROM workflow_nodes WHERE workflow_id = ?", (workflow_id,)
            ).fetchall()
            return assemble(row, nodes)

        return await self._db.read(query)

    async def save(self, run: WorkflowRun, nodes: Sequence[NodeRun]) -> None:
        values = (*run_values(run), run.workflow_id)
        rows = [_save_params(node_row(run.workflow_id, n)) for n in nodes]
        await self._db.call(_save, run.workflow_id, values, rows)

    async def list(
        self, statuses: frozenset[str] | None = None, after_id: str = "", limit: int = 100
    ) -> list[WorkflowRun]:
        check_limit(limit)
        terms = status_clause(statuses, after_id, "?")
        if terms is None:
            return []
        where, params = terms
        sql = f"SELECT {WORKFLOW_COLUMNS} FROM workflows WHERE {where} ORDER BY workflow_id LIMIT ?"
        rows = await self._db.read(lambda conn: conn.execute(sql, [*params, limit]).fetchall())
        return [run_from_row(row) for row in rows]


def _create(
    conn: sqlite3.Connection, workflow_id: str, row: Sequence[Any], rows: list[Any]
) -> None:
    if conn.execute(_CREATE, row).rowcount == 0:
        raise DuplicateWorkflowError(f"workflow {workflow_id!r} already exists")
    conn.executemany(_INSERT_NODE, rows)


def _save(
    conn: sqlite3.Connection, workflow_id: str, values: Sequence[Any], rows: list[Any]
) -> None:
    if conn.execute(_SAVE_RUN, values).rowcount == 0:
        raise StoreError(f"no workflow {workflow_id!r}")
    changed = conn.executemany(_SAVE_NODE, rows).rowcount if rows else 0
    if changed != len(rows):
        raise StoreError(f"workflow {workflow_id!r} lacks some of the nodes saved")


def _save_params(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A node row reordered for _SAVE_NODE: the changed columns, then the key."""
    return (*row[2:], row[0], row[1])
