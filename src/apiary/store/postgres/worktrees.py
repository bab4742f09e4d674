"""The PostgreSQL worktree binding store: the `worktrees` table, one row per agent."""

from __future__ import annotations

from apiary.core.worktree_binding import WorktreeBinding
from apiary.store.errors import VersionConflictError
from apiary.store.postgres.pool import PostgresPool, fetch_all
from apiary.store.sql_rows import (
    WORKTREE_COLUMNS,
    worktree_from_row,
    worktree_list_clauses,
    worktree_row,
    worktree_write_params,
    worktree_write_sql,
)

_INSERT = worktree_write_sql("%s", 1)
_UPDATE = worktree_write_sql("%s", 2)


class PostgresWorktreeStore:
    """`WorktreeStore` in the `worktrees` table; a write is guarded by the stored version,
    so replicas sharing the database cannot overwrite each other's transitions."""

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool

    async def put(self, binding: WorktreeBinding) -> None:
        """Store `binding` when its version follows the stored one; VersionConflictError
        otherwise (nothing changes)."""
        row = worktree_row(binding)
        sql = _INSERT if row[-1] == 1 else _UPDATE
        async with self._pool.connection() as conn:
            cursor = await conn.execute(sql, worktree_write_params(row))
            written = cursor.rowcount
        if written != 1:
            raise VersionConflictError(
                f"binding of {binding.agent_id!r} is not at version {binding.version - 1}"
            )

    async def get(self, agent_id: str) -> WorktreeBinding | None:
        """The record, or None."""
        query = f"SELECT {WORKTREE_COLUMNS} FROM worktrees WHERE agent_id = %s"
        rows = await fetch_all(self._pool, query, [agent_id])
        return worktree_from_row(rows[0]) if rows else None

    async def list(
        self, states: frozenset[str] | None = None, repo_id: str | None = None
    ) -> list[WorktreeBinding]:
        """Bindings in `states` whose home or current repository is `repo_id`, by agent_id
        (code point order: the column is COLLATE "C")."""
        terms = worktree_list_clauses(states, repo_id, "%s")
        if terms is None:
            return []
        clauses, params = terms
        query = (
            f"SELECT {WORKTREE_COLUMNS} FROM worktrees WHERE {' AND '.join(clauses)}"
            " ORDER BY agent_id"
        )
        return [worktree_from_row(row) for row in await fetch_all(self._pool, query, params)]
