"""The worktree binding store: the `worktrees` table, one row per agent. A write is guarded
by the stored version, so that replicas sharing a database cannot overwrite each other's
transitions. The events of a transition are appended in the write's transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from apiary.core.events import EventDraft
from apiary.core.worktrees.records import BindingState, WorktreeBinding
from apiary.store.errors import VersionConflictError
from apiary.store.sql.checks import checked_int64
from apiary.store.sql.columns import Columns
from apiary.store.sql.database import SqlDatabase
from apiary.store.sql.dialect import Dialect, by_dialect
from apiary.store.sql.events import SqlEventLog
from apiary.store.sql.statements import Execute, Query, QueryOne, Transaction
from apiary.store.sql.where import Where


class WorktreeRow(NamedTuple):
    """A row of `worktrees`: agent_id is the key, version the write's guard."""

    agent_id: str
    state: str
    repo_id: str
    worktree_id: str
    branch: str
    commit_sha: str
    current_repo_id: str
    current_worktree_id: str
    target_repo_id: str
    target_worktree_id: str
    reason: str
    note: str
    attempts: int
    retry_at: float
    recovery_at: float
    expires_at: float
    ttl_s: float
    invocation_id: str
    entered_at: float
    updated_at: float
    version: int


WORKTREES = Columns(WorktreeRow)


def worktree_row(binding: WorktreeBinding) -> tuple[Any, ...]:
    """The values of the WORKTREES columns for `binding`, in their order.

    Raises ValueError when state is not a BindingState value, when version is below 1 (a
    stored record has been written at least once), or when attempts or version does not fit
    the 64-bit integer both databases store.
    """
    if int(binding.version) < 1:
        raise ValueError(f"a stored binding has version 1 or more, not {binding.version}")
    return (
        binding.agent_id,
        BindingState(binding.state).value,
        binding.repo_id,
        binding.worktree_id,
        binding.branch,
        binding.commit_sha,
        binding.current_repo_id,
        binding.current_worktree_id,
        binding.target_repo_id,
        binding.target_worktree_id,
        binding.reason,
        binding.note,
        checked_int64("attempts", binding.attempts),
        float(binding.retry_at),
        float(binding.recovery_at),
        float(binding.expires_at),
        float(binding.ttl_s),
        binding.invocation_id,
        float(binding.entered_at),
        float(binding.updated_at),
        checked_int64("version", binding.version),
    )


def worktree_from_row(fetched: Sequence[Any]) -> WorktreeBinding:
    """A binding from its row."""
    row = WORKTREES.of(fetched)
    return WorktreeBinding(**row._asdict())


_UPDATED = tuple(name for name in WORKTREES.names if name != "agent_id")
# Version 1 conflicts with nothing stored; a later one updates the row holding the version
# before it. Either changes one row or none (a conflict).
_INSERT = by_dialect(
    lambda d: d.insert("worktrees", WORKTREES, " ON CONFLICT (agent_id) DO NOTHING")
)
_UPDATE = (
    f"UPDATE worktrees SET {', '.join(f'{name} = ?' for name in _UPDATED)}"
    " WHERE agent_id = ? AND version = ?"
)
_GET = QueryOne(f"SELECT {WORKTREES.sql} FROM worktrees WHERE agent_id = ?")


def worktree_write(values: tuple[Any, ...]) -> Execute:
    """The statement that stores a binding's `worktree_row` when its version follows the
    stored one."""
    row = WORKTREES.of(values)
    if row.version == 1:
        return Execute(_INSERT, values)
    named = row._asdict()
    return Execute(_UPDATE, (*(named[n] for n in _UPDATED), row.agent_id, row.version - 1))


def put_worktree(d: Dialect, values: tuple[Any, ...]) -> Transaction[None]:
    """Store a binding's `worktree_row` when its version follows the stored one;
    VersionConflictError otherwise, which undoes the transaction (its events too)."""
    if (yield from worktree_write(values)) != 1:
        row = WORKTREES.of(values)
        raise VersionConflictError(
            f"binding of {row.agent_id!r} is not at version {row.version - 1}"
        )


class SqlWorktreeStore:
    """`WorktreeStore` in the `worktrees` table; events that commit with a binding go
    through `log`."""

    def __init__(self, database: SqlDatabase, log: SqlEventLog) -> None:
        self._db = database
        self._log = log

    async def put(self, binding: WorktreeBinding, events: Sequence[EventDraft] = ()) -> None:
        """Store `binding` with `events` when its version follows the stored one;
        VersionConflictError otherwise (nothing changes)."""
        await self._log.write_with(events, put_worktree, worktree_row(binding))

    async def get(self, agent_id: str) -> WorktreeBinding | None:
        """The record, or None."""
        row = await self._db.read(_GET, (agent_id,))
        return None if row is None else worktree_from_row(row)

    async def list(
        self, states: frozenset[str] | None = None, repo_id: str | None = None
    ) -> list[WorktreeBinding]:
        """Bindings in `states` whose home or current repository is `repo_id`, by agent_id
        (code point order: PostgreSQL's column is COLLATE "C")."""
        where = Where().among("state", states)
        if repo_id is not None:
            where.term("(repo_id = ? OR current_repo_id = ?)", repo_id, repo_id)
        if where.impossible:
            return []
        sql = f"SELECT {WORKTREES.sql} FROM worktrees WHERE {where.sql} ORDER BY agent_id"
        rows = await self._db.read(Query(sql, where.params))
        return [worktree_from_row(row) for row in rows]
