"""The SQLite task store: the `tasks` table, one row per Scheduler task."""

from __future__ import annotations

import sqlite3

from apiary.core.records import TaskRecord
from apiary.store.sql_rows import (
    TASK_COLUMN_COUNT,
    TASK_COLUMNS,
    check_limit,
    task_from_row,
    task_list_clauses,
    task_row,
)
from apiary.store.sqlite.database import SqliteDatabase, placeholders

# An upsert on task_id rather than INSERT OR REPLACE: REPLACE would also delete whichever
# other task holds the same seq (a unique index) instead of refusing the clash, as
# PostgreSQL's ON CONFLICT (task_id) does.
_NAMES = TASK_COLUMNS.split(", ")
_PUT = (
    f"INSERT INTO tasks ({TASK_COLUMNS}) VALUES ({placeholders(TASK_COLUMN_COUNT)})"
    " ON CONFLICT (task_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _NAMES if c != "task_id")
)


class SqliteTaskStore:
    """`TaskStore` in the `tasks` table; params is a BLOB.

    A put whose seq belongs to another task fails with StoreError and changes nothing.
    """

    def __init__(self, database: SqliteDatabase) -> None:
        self._db = database

    async def put(self, record: TaskRecord) -> None:
        """Insert or replace the record with this task_id."""
        row = task_row(record)
        await self._db.execute(_PUT, row)

    async def get(self, task_id: str) -> TaskRecord | None:
        """The record, or None."""
        sql = f"SELECT {TASK_COLUMNS} FROM tasks WHERE task_id = ?"
        row = await self._db.read(lambda conn: conn.execute(sql, (task_id,)).fetchone())
        return None if row is None else task_from_row(row)

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
        terms = task_list_clauses(states, agent_id, after_seq, "?")
        if terms is None:
            return []
        clauses, params = terms
        sql = f"SELECT {TASK_COLUMNS} FROM tasks WHERE {' AND '.join(clauses)} ORDER BY seq LIMIT ?"
        params.append(limit)
        rows = await self._db.read(lambda conn: conn.execute(sql, params).fetchall())
        return [task_from_row(row) for row in rows]

    async def max_seq(self) -> int:
        """The highest seq stored, -1 when there are no tasks."""

        def query(conn: sqlite3.Connection) -> int:
            (highest,) = conn.execute("SELECT COALESCE(MAX(seq), -1) FROM tasks").fetchone()
            return int(highest)

        return await self._db.read(query)
