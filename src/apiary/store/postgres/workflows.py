"""The PostgreSQL workflow store: `workflows` and `workflow_nodes` (RFC 17.7)."""

from __future__ import annotations

from collections.abc import Sequence

from apiary.core.workflow.definition import WorkflowSpec
from apiary.core.workflow.node import NodeRun
from apiary.core.workflow.run import StoredWorkflow, WorkflowRun
from apiary.store.errors import StoreError
from apiary.store.postgres.pool import PostgresPool, fetch_all, fetch_rows
from apiary.store.sql_rows import check_limit
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
    f"INSERT INTO workflows ({WORKFLOW_COLUMNS})"
    f" VALUES ({', '.join(['%s'] * WORKFLOW_COLUMN_COUNT)})"
    " ON CONFLICT (workflow_id) DO NOTHING"
)
_INSERT_NODE = (
    f"INSERT INTO workflow_nodes ({NODE_COLUMNS}) VALUES ({', '.join(['%s'] * NODE_COLUMN_COUNT)})"
)
_SAVE_RUN = (
    f"UPDATE workflows SET {', '.join(f'{c} = %s' for c in RUN_COLUMNS)} WHERE workflow_id = %s"
)
_TYPES = (
    "text", "bigint", "bigint", "text", "float8", "float8", "text", "text", "bigint", "float8",
    "text", "float8",
)  # fmt: skip
"""SQL types of NODE_NAMES[2:], for the arrays `unnest` reads the saved nodes from."""
_SAVE_NODES = (
    f"UPDATE workflow_nodes AS n SET {', '.join(f'{c} = v.{c}' for c in NODE_NAMES[2:])}"
    f" FROM unnest(%s::text[], {', '.join(f'%s::{t}[]' for t in _TYPES)})"
    f" AS v(node_id, {', '.join(NODE_NAMES[2:])})"
    " WHERE n.workflow_id = %s AND n.node_id = v.node_id"
)


class PostgresWorkflowStore:
    """`WorkflowStore` in PostgreSQL; a create or a save is one transaction."""

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool

    async def create(self, spec: WorkflowSpec, run: WorkflowRun, nodes: Sequence[NodeRun]) -> None:
        row = workflow_row(spec, run)
        rows = [node_row(spec.workflow_id, n) for n in nodes]
        async with self._pool.connection() as conn, conn.transaction():
            cursor = await conn.execute(_CREATE, row)
            if cursor.rowcount == 0:
                raise DuplicateWorkflowError(f"workflow {spec.workflow_id!r} already exists")
            async with conn.cursor() as nodes_cursor:
                await nodes_cursor.executemany(_INSERT_NODE, rows)

    async def get(self, workflow_id: str) -> StoredWorkflow | None:
        async with self._pool.connection() as conn, conn.transaction():
            rows = await fetch_rows(
                conn, f"SELECT {WORKFLOW_COLUMNS} FROM workflows WHERE workflow_id = %s",
                [workflow_id],
            )  # fmt: skip
            if not rows:
                return None
            nodes = await fetch_rows(
                conn, f"SELECT {NODE_COLUMNS} FROM workflow_nodes WHERE workflow_id = %s",
                [workflow_id],
            )  # fmt: skip
        return assemble(rows[0], nodes)

    async def save(self, run: WorkflowRun, nodes: Sequence[NodeRun]) -> None:
        rows = [node_row(run.workflow_id, n) for n in nodes]
        columns = [list(column) for column in zip(*[r[1:] for r in rows], strict=True)]
        async with self._pool.connection() as conn, conn.transaction():
            cursor = await conn.execute(_SAVE_RUN, [*run_values(run), run.workflow_id])
            if cursor.rowcount == 0:
                raise StoreError(f"no workflow {run.workflow_id!r}")
            if rows:
                cursor = await conn.execute(_SAVE_NODES, [*columns, run.workflow_id])
                if cursor.rowcount != len(rows):
                    raise StoreError(f"workflow {run.workflow_id!r} lacks some of the nodes saved")

    async def list(
        self, statuses: frozenset[str] | None = None, after_id: str = "", limit: int = 100
    ) -> list[WorkflowRun]:
        check_limit(limit)
        terms = status_clause(statuses, after_id, "%s")
        if terms is None:
            return []
        where, params = terms
        query = (
            f"SELECT {WORKFLOW_COLUMNS} FROM workflows WHERE {where} ORDER BY workflow_id LIMIT %s"
        )
        return [run_from_row(row) for row in await fetch_all(self._pool, query, [*params, limit])]
