"""The SQLite worktree binding store: the `worktrees` table, one row per agent."""

from __future__ import annotations

from apiary.core.worktree_binding import WorktreeBinding
from apiary.store.errors import VersionConflictError
from apiary.store.sql_rows import (
    WORKTREE_COLUMNS,
    worktree_from_row,
    worktree_list_clauses,
    worktree_row,
    worktree_write_params,
    worktree_write_sql,
)
from apiary.store.sqlite.database import SqliteDatabase

_INSERT = worktree_write_sql("?", 1)
_UPDATE = worktree_write_sql("?", 2)


class SqliteWorktreeStore:
    """`WorktreeStore` in the `worktrees` table; a write is guarded by the stored version."""

    def __init__(self, database: SqliteDatabase) -> None:
        self._db = database

    async def put(self, binding: WorktreeBinding) -> None:
        """Store `binding` when its version follows the stored one; VersionConflictError
        otherwise (nothing changes)."""
        row = worktree_row(binding)
        sql = _INSERT if row[-1] == 1 else _UPDATE
        params = worktree_write_params(row)
        written = await self._db.execute(sql, params)
        if written != 1:
            raise VersionConflictError(
                f"binding of {binding.agent_id!r} is not at version {binding.version - 1}"
            )

    async def get(self, agent_id: str) -> WorktreeBinding | None:
        """The record, or None."""
        sql = f"SELECT {WORKTREE_COLUMNS} FROM worktrees WHERE agent_id = ?"
        row = await self._db.read(lambda conn: conn.execute(sql, (agent_id,)).fetchone())
        return None if row is None else worktree_from_row(row)

    async def list(
        self, states: frozenset[str] | None = None, repo_id: str | None = None
    ) -> list[WorktreeBinding]:
        """Bindings in `states` whose home or current repository is `repo_id`, by agent_id."""
        terms = worktree_list_clauses(states, repo_id, "?")
        if terms is None:
            return []
        clauses, params = terms
        sql = (
            f"SELECT {WORKTREE_COLUMNS} FROM worktrees WHERE {' AND '.join(clauses)}"
            " ORDER BY agent_id"
        )
        rows = await self._db.read(lambda conn: conn.execute(sql, params).fetchall())
        return [worktree_from_row(row) for row in rows]
