"""The Scheduler's dispatch (RFC 7.3, 9.1, 9.2, 16.3): when an agent is free, pick the lane
(its LaneScheduler, core/lanes.py) and that lane's head task, and send it unless it must wait:
for a bound worktree (`worktree:required`), for a free instance of its agent type
(max_parallel_instances) or behind a running task whose scope conflicts
(engine/conflict_gate.py). The task goes out as a DATA envelope from `scheduler`; a full
buffer retries it later on the Scheduler's timer heap.

Called with the Scheduler's lock held.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from apiary.core.agent_lifecycle import AgentInput
from apiary.core.envelope import MessageType
from apiary.core.lanes import LANES, LaneChoice, LaneScheduler
from apiary.core.records import TaskRecord, TaskState
from apiary.core.scope_overlap import parse_scope
from apiary.core.task_queue import QueuedTask
from apiary.engine.conflict_gate import Blocker
from apiary.engine.router.admission import Outbound
from apiary.engine.scheduler.agents import drive

if TYPE_CHECKING:
    from apiary.engine.scheduler.scheduler import Scheduler

SEP = "\x1f"
"""Joins the parts of the Scheduler's queue and timer keys."""


def queue_key(agent_id: str, lane: str) -> str:
    """The TaskQueue key of the agent's lane."""
    return f"{agent_id}{SEP}{lane}"


def key_agent(key: str) -> str:
    return key.partition(SEP)[0]


class SchedulerDispatch:
    """Hands the Scheduler's queued tasks to their agents."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self._lanes: dict[str, LaneScheduler] = {}

    async def try_dispatch(self, agent_id: str) -> None:
        """Dispatch the agent's next task if everything allows it (lock held)."""
        s = self._scheduler
        if agent_id in s._running or not s.lifecycles.accepts_tasks(agent_id):
            return
        picked = self._head(agent_id)
        if picked is None:
            return
        head, choice = picked
        task = s._tasks[head.task_id]
        if self._waits_for_worktree(task):
            await self._held_for_worktree(task)
            return
        limit = s.settings.instance_limit(task.agent_type)
        if s._active[task.agent_type] >= limit:
            s._type_waiters.setdefault(task.agent_type, set()).add(agent_id)
            return
        blockers = await s.gate.blockers(task, s._running.values(), s._tasks)
        if blockers:
            await self._deferred(task, blockers)
            return
        s._queue.remove(head.task_id)
        await self._dispatch(task, choice)

    def _waits_for_worktree(self, task: TaskRecord) -> bool:
        s = self._scheduler
        needs = s._needs_worktree.get(task.task_id)
        if needs is None:
            needs = s._needs_worktree[task.task_id] = parse_scope(task.scope).needs_worktree
        return needs and not s.worktree_bound(task.agent_id)

    async def _held_for_worktree(self, task: TaskRecord) -> None:
        """RFC 16.3: no worktree task for an agent without a bound worktree (BIND_FAILED is
        treated like UNBOUND); the task waits until a BIND succeeds (`wake`)."""
        s = self._scheduler
        note = "waiting for the agent to bind a worktree (worktree:required)"
        if task.note == note:
            return
        task = replace(task, note=note, updated_at=s._clock.now())
        await s._save(task, "task.waiting_worktree", reason=note)

    def _head(self, agent_id: str) -> tuple[QueuedTask, LaneChoice] | None:
        s = self._scheduler
        ready = {lane: s._queue.count(queue_key(agent_id, lane)) for lane in LANES}
        if not any(ready.values()):
            return None
        lanes = self._lanes.get(agent_id)
        if lanes is None:
            lanes = self._lanes[agent_id] = LaneScheduler(s.settings.lanes)
        choice = lanes.pick(ready, s._clock.now())
        assert choice is not None
        head = s._queue.peek(queue_key(agent_id, choice.lane))
        return None if head is None else (head, choice)

    async def _deferred(self, task: TaskRecord, blockers: list[Blocker]) -> None:
        s = self._scheduler
        for blocker in blockers:
            s._blocked_by.setdefault(blocker.task_id, set()).add(task.agent_id)
        note = "; ".join(f"{b.outcome} behind {b.task_id}: {b.reason}" for b in blockers)
        if task.note == note:
            return
        task = replace(task, note=note, updated_at=s._clock.now())
        await s._save(task, "task.deferred", blocked_by=[b.task_id for b in blockers],
                      reason=note)  # fmt: skip
        await s._router.notify(
            task.agent_id,
            s._notices.notification(
                {"event": "task_deferred", "task_id": task.task_id,
                 "blocked_by": [b.task_id for b in blockers], "reason": note},
                task.flow_id,
            ),
        )  # fmt: skip

    async def _dispatch(self, task: TaskRecord, choice: LaneChoice | None = None) -> None:
        s = self._scheduler
        attempt = task.attempts + 1
        env = s._envelopes.envelope(
            MessageType.DATA, task.params, task.content_type, correlation_id=task.flow_id,
            idempotency_token=f"task:{task.task_id}:{attempt}",
        )  # fmt: skip
        (outcome,) = await s._router.send_many([Outbound(env, task.agent_id, lane=task.lane)])
        if not outcome.accepted:
            code = outcome.error_code
            if code == "buffer_full":
                s._push(task)
                s._timers.arm(f"retry{SEP}{task.agent_id}",
                              s._clock.now() + s.settings.retry_after_s)  # fmt: skip
                s._wake.set()
                return
            await s._fail(task, code or "internal_error", outcome.reason)
            return
        task = replace(
            task, state=TaskState.DISPATCHED.value, message_id=env.message_id, attempts=attempt,
            updated_at=s._clock.now(), note="",
        )  # fmt: skip
        s._occupy(task)
        flags = {"urgent": choice.urgent, "overflowed": choice.overflowed} if choice else {}
        await s._save(task, "task.dispatched", message_id=env.message_id, attempt=attempt,
                      lane=task.lane, **flags)  # fmt: skip
        await drive(s, task.agent_id, AgentInput.SCHEDULE)
