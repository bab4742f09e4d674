"""The in-memory worktree bindings (part of `MemoryStore`)."""

from __future__ import annotations

from collections.abc import Sequence

from apiary.core.events import EventDraft
from apiary.core.worktrees.records import WorktreeBinding
from apiary.store.errors import VersionConflictError
from apiary.store.memory.events import MemoryEventLog
from apiary.store.sql.worktrees import worktree_from_row, worktree_row


class MemoryWorktreeStore:
    """`WorktreeStore` over a dict keyed by agent_id; events that commit with a binding go
    to `log`."""

    def __init__(self, log: MemoryEventLog) -> None:
        self._records: dict[str, WorktreeBinding] = {}
        self._log = log

    async def put(self, binding: WorktreeBinding, events: Sequence[EventDraft] = ()) -> None:
        """Store `binding` with `events` when its version follows the stored one;
        VersionConflictError otherwise (nothing changes)."""
        # Through the SQL row and back: refuses and coerces as the SQL backends do.
        stored = worktree_from_row(worktree_row(binding))
        previous = self._records.get(stored.agent_id)
        expected = 1 if previous is None else previous.version + 1
        if stored.version != expected:
            held = "none" if previous is None else previous.version
            raise VersionConflictError(
                f"binding of {stored.agent_id!r} is at version {held}; "
                f"cannot write version {stored.version}"
            )
        drafts = self._log.checked(events)
        self._records[stored.agent_id] = stored
        self._log.append_now(drafts)

    async def get(self, agent_id: str) -> WorktreeBinding | None:
        """The record, or None (records hold immutable values only: no copy needed)."""
        return self._records.get(agent_id)

    async def list(
        self, states: frozenset[str] | None = None, repo_id: str | None = None
    ) -> list[WorktreeBinding]:
        """Bindings in `states` whose home or current repository is `repo_id`, by agent_id."""
        return [
            self._records[agent_id]
            for agent_id in sorted(self._records)
            if (states is None or self._records[agent_id].state in states)
            and (repo_id is None or repo_id in _repos(self._records[agent_id]))
        ]


def _repos(binding: WorktreeBinding) -> tuple[str, str]:
    return (binding.repo_id, binding.current_repo_id)
