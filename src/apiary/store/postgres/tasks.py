"""The PostgreSQL task store: the `tasks` table, one row per Scheduler task."""

from __future__ import annotations

from apiary.core.records import TaskRecord
from apiary.store.postgres.pool import PostgresPool, fetch_all, scalar
from apiary.store.sql_rows import (
    TASK_COLUMN_COUNT,
    TASK_COLUMNS,
    check_limit,
    task_from_row,
    task_list_clauses,
    task_row,
)

_NAMES = TASK_COLUMNS.split(", ")
_PUT = (
    f"INSERT INTO tasks ({TASK_COLUMNS}) VALUES ({', '.join(['%s'] * TASK_COLUMN_COUNT)})"
    " ON CONFLICT (task_id) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in _NAMES if c != "task_id")
)


class PostgresTaskStore:
    """`TaskStore` in the `tasks` table; params is BYTEA.

    A put whose seq belongs to another task fails with StoreError (the unique index on seq)
    and changes nothing.
    """

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool

    async def put(self, record: TaskRecord) -> None:
        """Insert or replace the record with this task_id."""
        row = task_row(record)
        async with self._pool.connection() as conn:
            await conn.execute(_PUT, row)

    async def get(self, task_id: str) -> TaskRecord | None:
        """The record, or None."""
        query = f"SELECT {TASK_COLUMNS} FROM tasks WHERE task_id = %s"
        rows = await fetch_all(self._pool, query, [task_id])
        return task_from_row(rows[0]) if rows else None

    async def list(
        self,
        states: frozenset[str] | None = None,
        agent_id: str | None = None,
        after_seq: int = -1,
        limit: int = 100,
    ) -> list[TaskRecord]:
        """Records in `states` (all when None) for `agent_id` (all when None) with seq above
        `after_seq`, in seq order, at most `limit`."""
        check_limit(limit)
        terms = task_list_clauses(states, agent_id, after_seq, "%s")
        if terms is None:
            return []
        clauses, params = terms
        query = (
            f"SELECT {TASK_COLUMNS} FROM tasks WHERE {' AND '.join(clauses)} ORDER BY seq LIMIT %s"
        )
        params.append(limit)
        return [task_from_row(row) for row in await fetch_all(self._pool, query, params)]

    async def max_seq(self) -> int:
        """The highest seq stored, -1 when there are no tasks."""
        async with self._pool.connection() as conn:
            return await scalar(await conn.execute("SELECT COALESCE(MAX(seq), -1) FROM tasks"))
