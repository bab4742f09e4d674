"""The activity buffer (RFC 10): a queryable, bounded view of in-flight work.

The buffer is advisory (it never blocks scheduling or execution) and, as RFC 10.1 allows,
held in memory and bounded: a full buffer rejects registrations with
`activity_buffer_full`, nothing is dropped silently. Every mutation is in the event log: an
`activity.*` event of its own, or, for the entries the Scheduler keeps for its tasks
(`logged`), the task's own event that the mutation follows (`task.dispatched` registers the
entry, `task.completed` or `task.failed` completes it; docs/scheduler.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from apiary.core.activity import ActivityBuffer, ActivityEntry, ActivityLimits
from apiary.core.clock import Clock
from apiary.engine.eventlog import EventRecorder


class Activity:
    def __init__(
        self, events: EventRecorder, clock: Clock, limits: ActivityLimits | None = None
    ) -> None:
        self.buffer = ActivityBuffer(limits or ActivityLimits())
        self._events = events
        self._clock = clock

    async def register(self, entry: ActivityEntry, *, logged: bool = False) -> ActivityEntry:
        """Register `entry` (ApiaryError activity_buffer_full when the buffer is full);
        `logged`: the caller's own event records it (no `activity.registered`)."""
        stored = self.buffer.register(entry, self._clock.now())
        if not logged:
            await self._events.record(
                "activity.registered", entry.agent_id, agent_id=entry.agent_id,
                task_id=entry.task_id, repo_id=entry.repo_id, worktree_id=entry.worktree_id,
                branch=entry.branch,
            )  # fmt: skip
        return stored

    async def refused(self, entry: ActivityEntry, code: str) -> None:
        """Record that the buffer refused `entry` (`code`) whose registration the caller's
        event stood for (`register(..., logged=True)`)."""
        await self._events.record(
            "activity.refused", entry.agent_id, agent_id=entry.agent_id, task_id=entry.task_id,
            error_code=code,
        )  # fmt: skip

    async def complete(
        self, agent_id: str, task_id: str, outcome: str, *, logged: bool = False
    ) -> ActivityEntry | None:
        """Complete the agent's entry of `task_id` (None: it has none); `logged`: the
        caller's own event records it (no `activity.completed`)."""
        done = self.buffer.complete(agent_id, task_id, outcome, self._clock.now())
        if done is not None and not logged:
            await self._events.record(
                "activity.completed", agent_id, agent_id=agent_id, task_id=task_id,
                outcome=done.outcome,
            )  # fmt: skip
        return done

    async def purge(self, agent_id: str, task_ids: list[str] | None) -> int:
        purged = self.buffer.purge(agent_id, task_ids, self._clock.now())
        if purged:
            await self._events.record(
                "activity.purged", "coordinator", agent_id=agent_id, purged=purged,
                task_ids=task_ids or [],
            )  # fmt: skip
        return purged

    async def reconcile_with(
        self, task_state: Callable[[str], Awaitable[str | None]], grace_s: float
    ) -> int:
        """Reconcile against the Scheduler's task states (RFC 10): entries of tasks that are
        COMPLETED, FAILED or unknown to it are purged. Entries younger than `grace_s` count as
        running: an agent registers its entry as it starts, before anything else is known."""
        now = self._clock.now()
        known: dict[str, str] = {}
        for entry in self.buffer.active():
            state = await task_state(entry.task_id)
            if state is not None:
                known[entry.task_id] = state
            elif now - entry.started_at < grace_s:
                known[entry.task_id] = "RUNNING"
        return await self.reconcile(known)

    async def reconcile(self, known: Mapping[str, str]) -> int:
        """Purge entries of tasks that are COMPLETED, FAILED or unknown (RFC 10)."""
        purged = self.buffer.reconcile(known, self._clock.now())
        for entry in purged:
            await self._events.record(
                "activity.reconciled", "coordinator", agent_id=entry.agent_id,
                task_id=entry.task_id,
            )  # fmt: skip
        return len(purged)
