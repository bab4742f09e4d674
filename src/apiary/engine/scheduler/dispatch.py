"""The Scheduler's dispatch (RFC 7.3, 9.1, 9.2, 16.3): when an agent is free, pick the lane
(its LaneScheduler, core/lanes.py) and that lane's head task, and send it unless it must wait:
for a bound worktree (`worktree:required`), for a free instance of its agent type
(max_parallel_instances) or behind a running task whose scope conflicts
(engine/conflict_gate.py). The task goes out as a DATA envelope from `scheduler`; a full
buffer retries it later on the Scheduler's timer heap.

Called with the Scheduler's lock held.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from apiary.core.clock import Clock
from apiary.core.envelope import MessageType
from apiary.core.lanes import LANES, LaneChoice, LaneScheduler
from apiary.core.records import TaskRecord
from apiary.core.tasks.machine import TaskInput
from apiary.core.tasks.queue import QueuedTask
from apiary.engine.conflict_gate import Blocker, ConflictGate
from apiary.engine.lifecycle import Lifecycles
from apiary.engine.notices import NoticeFactory
from apiary.engine.router.admission import Outbound
from apiary.engine.router.router import Router
from apiary.engine.scheduler.live import LiveTasks, queue_key
from apiary.engine.scheduler.transitions import TaskTransitions
from apiary.engine.scheduler.wakeups import Wakeups, retry_key
from apiary.engine.settings import SchedulerSettings


class WorktreeView(Protocol):
    """What the Scheduler needs of the worktree manager (engine/worktrees, RFC 16.3)."""

    def bound_root(self, agent_id: str) -> Path | None:
        """The agent's bound worktree; None while it has none (UNBOUND, BIND_FAILED)."""
        ...

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """Call `listener` with the agent id whenever a binding changes."""
        ...


class SchedulerDispatch:
    """Hands the Scheduler's queued tasks to their agents."""

    def __init__(
        self,
        live: LiveTasks,
        wakeups: Wakeups,
        transitions: TaskTransitions,
        lifecycles: Lifecycles,
        gate: ConflictGate,
        router: Router,
        envelopes: NoticeFactory,
        notices: NoticeFactory,
        settings: SchedulerSettings,
        clock: Clock,
        worktrees: WorktreeView | None,
    ) -> None:
        self._live = live
        self._wakeups = wakeups
        self._transitions = transitions
        self._lifecycles = lifecycles
        self._gate = gate
        self._router = router
        self._envelopes = envelopes
        self._notices = notices
        self._settings = settings
        self._clock = clock
        self._worktrees = worktrees
        self._lanes: dict[str, LaneScheduler] = {}

    async def drain(self) -> None:
        """Dispatch to every agent woken so far (lock held)."""
        agents = self._wakeups.agents
        while agents:
            await self.try_dispatch(agents.pop())

    async def try_dispatch(self, agent_id: str) -> None:
        """Dispatch the agent's next task if everything allows it (lock held)."""
        live = self._live
        if agent_id in live.running or not self._lifecycles.accepts_tasks(agent_id):
            return
        picked = self._head(agent_id)
        if picked is None:
            return
        head, choice = picked
        task = live.tasks[head.task_id]
        if live.needs_worktree(task) and not self._bound(task.agent_id):
            await self._held_for_worktree(task)
            return
        limit = self._settings.instance_limit(task.agent_type)
        if live.active[task.agent_type] >= limit:
            live.wait_for_type(task.agent_type, agent_id)
            return
        blockers = await self._gate.blockers(task, live.running.values(), live.tasks)
        if blockers:
            await self._deferred(task, blockers)
            return
        live.queue.remove(head.task_id)
        await self._dispatch(task, choice)

    def _bound(self, agent_id: str) -> bool:
        return self._worktrees is not None and self._worktrees.bound_root(agent_id) is not None

    async def _held_for_worktree(self, task: TaskRecord) -> None:
        """RFC 16.3: no worktree task for an agent without a bound worktree (BIND_FAILED is
        treated like UNBOUND); the task waits until a BIND succeeds (`wake`)."""
        note = "waiting for the agent to bind a worktree (worktree:required)"
        if task.note == note:
            return
        changes = {"note": note, "updated_at": self._clock.now()}
        await self._transitions.apply(task, TaskInput.WAIT_WORKTREE, changes, reason=note)

    def _head(self, agent_id: str) -> tuple[QueuedTask, LaneChoice] | None:
        queue = self._live.queue
        ready = {lane: queue.count(queue_key(agent_id, lane)) for lane in LANES}
        if not any(ready.values()):
            return None
        lanes = self._lanes.get(agent_id)
        if lanes is None:
            lanes = self._lanes[agent_id] = LaneScheduler(self._settings.lanes)
        choice = lanes.pick(ready, self._clock.now())
        assert choice is not None
        head = queue.peek(queue_key(agent_id, choice.lane))
        return None if head is None else (head, choice)

    async def _deferred(self, task: TaskRecord, blockers: list[Blocker]) -> None:
        for blocker in blockers:
            self._live.wait_behind(blocker.task_id, task.agent_id)
        note = "; ".join(f"{b.outcome} behind {b.task_id}: {b.reason}" for b in blockers)
        if task.note == note:
            return
        blocked_by = [b.task_id for b in blockers]
        task = await self._transitions.apply(
            task, TaskInput.DEFER, {"note": note, "updated_at": self._clock.now()},
            blocked_by=blocked_by, reason=note,
        )  # fmt: skip
        await self._router.notify(
            task.agent_id,
            self._notices.notification(
                {"event": "task_deferred", "task_id": task.task_id,
                 "blocked_by": [b.task_id for b in blockers], "reason": note},
                task.flow_id,
            ),
        )  # fmt: skip

    async def _dispatch(self, task: TaskRecord, choice: LaneChoice) -> None:
        attempt = task.attempts + 1
        env = self._envelopes.envelope(
            MessageType.DATA, task.params, task.content_type, correlation_id=task.flow_id,
            idempotency_token=f"task:{task.task_id}:{attempt}",
        )  # fmt: skip
        (outcome,) = await self._router.send_many([Outbound(env, task.agent_id, lane=task.lane)])
        if not outcome.accepted:
            code = outcome.error_code
            if code == "buffer_full":
                self._live.push(task)
                self._wakeups.arm(
                    retry_key(task.agent_id), self._clock.now() + self._settings.retry_after_s
                )
                return
            await self._transitions.end(
                task, TaskInput.REFUSE, code or "internal_error", outcome.reason
            )
            return
        changes = {"message_id": env.message_id, "attempts": attempt,
                   "updated_at": self._clock.now(), "note": ""}  # fmt: skip
        await self._transitions.apply(
            task, TaskInput.DISPATCH, changes, message_id=env.message_id, attempt=attempt,
            lane=task.lane, urgent=choice.urgent, overflowed=choice.overflowed,
        )  # fmt: skip
