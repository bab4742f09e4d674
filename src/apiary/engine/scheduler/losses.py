"""What becomes of the tasks an agent is lost with (docs/scheduler.md, "Shared queues"): the
agent failed, missed its heartbeats, ended its shutdown late or deregistered holding them.

A shared-queue task goes back to its queue, keeping its place, for the next capable agent,
until `[scheduler] max_attempts` of its attempts were lost so; a task submitted to one agent
fails with the loss's code. Its dispatch is taken back: an ACK of it changes nothing
(`task.stale_ack`), and the agent, if it is still registered (cut off, slow to shut down),
is told to stop that attempt, again whenever it reads it (`task.revoked`). So a task never
runs on two agents at once as far as the Scheduler is concerned, and an agent that was not
gone after all stops the attempt it lost.

Called with the Scheduler's lock held.
"""

from __future__ import annotations

from apiary.core.clock import Clock
from apiary.core.records import TaskRecord
from apiary.core.tasks.capacity import split
from apiary.core.tasks.machine import TaskInput
from apiary.engine.eventlog import EventRecorder
from apiary.engine.registry import Registry
from apiary.engine.scheduler.live import LiveTasks
from apiary.engine.scheduler.pools import AgentPools
from apiary.engine.scheduler.preemption import SchedulerPreemption
from apiary.engine.scheduler.transitions import TaskTransitions, requeued
from apiary.engine.settings import SchedulerSettings
from apiary.store.protocols import TaskStore


class LostTasks:
    """The tasks of lost agents (module docstring)."""

    def __init__(
        self,
        live: LiveTasks,
        pools: AgentPools,
        transitions: TaskTransitions,
        preemptor: SchedulerPreemption,
        registry: Registry,
        events: EventRecorder,
        store: TaskStore,
        settings: SchedulerSettings,
        clock: Clock,
    ) -> None:
        self._live = live
        self._pools = pools
        self._transitions = transitions
        self._preemptor = preemptor
        self._registry = registry
        self._events = events
        self._store = store
        self._settings = settings
        self._clock = clock

    async def lost_with(self, task: TaskRecord, code: str, why: str) -> None:
        """The agent holding `task` was lost with it, for `code` (and `why`)."""
        if not task.queue:
            await self._transitions.end(task, TaskInput.ABANDON, code, why)
            return
        self._live.taken_back(task)
        if self._registry.known(task.agent_id) is not None:
            await self._preemptor.revoke(task.agent_id, task, task.message_id)
        lost = task.lost_attempts + 1
        limit = self._settings.max_attempts
        what = (
            f"agent {task.agent_id} was lost with it ({code}: {why}); {lost} of {limit} "
            "attempts lost"
        )
        now = self._clock.now()
        if lost >= limit:
            note = f"{what} ([scheduler] max_attempts)"
            changes = {"error_code": code, "note": note, "updated_at": now, "lost_attempts": lost}
            await self._transitions.apply(
                task, TaskInput.ABANDON, changes, error_code=code, note=note, lost_attempts=lost
            )
            return
        note = f"back in its queue: {what}"
        changes = {"note": note, "updated_at": now, "lost_attempts": lost, **requeued(task)}
        await self._transitions.apply(
            task, TaskInput.REQUEUE, changes, reason=note, error_code=code, lost_attempts=lost
        )

    async def stale_ack(self, agent_id: str, message_id: str, stage: str) -> None:
        """`agent_id` acknowledged `message_id`, which no live task's dispatch is: when it is
        a dispatch taken back from it (or one the store failed, `LiveTasks.unsent`), log it
        (it changes nothing) and, for a READ (it runs that attempt, which may run elsewhere
        now), tell it to stop."""
        task_id = self._live.stale.get(message_id)
        if task_id is None:
            return  # an ACK of a control message, or of a task that ended
        await self._events.record(
            "task.stale_ack", agent_id, correlation_id=task_id, task_id=task_id,
            agent_id=agent_id, message_id=message_id, stage=stage,
        )  # fmt: skip
        if stage == "READ":
            task = self._live.tasks.get(task_id) or await self._store.get(task_id)
            if task is not None:
                await self._preemptor.revoke(agent_id, task, message_id)

    async def recall_waiting(self, agent_id: str, reason: str) -> int:
        """Take back the shared tasks waiting at the agent, not started (prefetched): they
        yield at once and go back to their queues for other agents. Returns how many."""
        view = self._live.held_view(agent_id)
        _, waiting = split(view, self._pools.concurrency(agent_id))
        recalled = 0
        for held in waiting:
            task = self._live.tasks.get(held.task_id)
            if task is not None and task.queue and held.preemptible:
                await self._preemptor.preempt(task, reason)
                recalled += 1
        return recalled
