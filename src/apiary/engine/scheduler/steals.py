"""Shared tasks prefetched to a busy agent, taken back for a free one (docs/scheduler.md,
"Concurrency and prefetch").

A task prefetched to an agent waits there, unread, until one of the agent's running tasks
ends. Meanwhile another agent of its shared queue may free up and find the queue empty: with
tasks that run for minutes, the free agent would idle while the prefetched one waits. Once
such a task has waited at its agent STEAL_AFTER_S (what the SDK too counts as waiting: it
acknowledges a prefetched task RECEIVED then), it is recalled as a shutdown recalls its
agent's prefetched tasks (`SchedulerPreemption.preempt`: the agent yields it at once,
unstarted) and goes back to its queue in its place, where the free agent, the least loaded,
takes it. A task that has not waited that long is left where it is (it is likely to start
there within a moment): the free agent is tried again when it will have (`steal_key`).

The task recalled is the one that would start last: at the agent with the most tasks
waiting, the latest dispatched there. A free agent recalls one task per free running slot
(its concurrency less what it holds), counting the tasks on their way to it: recalled and
not yet dispatched to another agent. Back in its queue, such a task is withheld from the
agent it was recalled from while the free agent has room (`withheld`), so that the agent
freed first by its yield does not take it straight back.

A recall can cross the task's READ: its agent started it just as the request left (its
running task ended in that moment). The request then flags a running task, which yields at
its next safe point, if it has one, and otherwise runs to its end; the recall's deadline
does not force it (`spares`): a task is never terminated for a rebalancing.

Called with the Scheduler's lock held.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from apiary.core.clock import Clock
from apiary.core.records import TaskRecord, TaskState
from apiary.core.tasks.capacity import PREFETCHED_RECEIVED_AFTER_S, split
from apiary.core.tasks.shared import describe
from apiary.engine.scheduler.live import LiveTasks
from apiary.engine.scheduler.pools import AgentPools
from apiary.engine.scheduler.preemption import SchedulerPreemption
from apiary.engine.scheduler.wakeups import SEP, Wakeups

STEAL_AFTER_S: Final = PREFETCHED_RECEIVED_AFTER_S
"""How long a prefetched shared task waits at a busy agent before a free agent of its queue
takes it back."""
RECALL_PREFIX: Final = "recalled for"
"""How the reason of such a recall begins (its `task.preempt_requested` event)."""


def steal_key(agent_id: str) -> str:
    """The free agent's next look for prefetched tasks to take back, on the timer heap."""
    return f"steal{SEP}{agent_id}"


class PrefetchSteals:
    """Takes prefetched shared tasks back from busy agents for free ones (module docstring)."""

    def __init__(
        self,
        live: LiveTasks,
        pools: AgentPools,
        preemptor: SchedulerPreemption,
        wakeups: Wakeups,
        clock: Clock,
        bound: Callable[[str], bool],
        has_room: Callable[[str], bool],
    ) -> None:
        self._live = live
        self._pools = pools
        self._preemptor = preemptor
        self._wakeups = wakeups
        self._clock = clock
        self._bound = bound
        """Whether an agent has a bound worktree (a `worktree:required` task needs one)."""
        self._has_room = has_room
        """Whether an agent may take one more task now (`SchedulerDispatch.has_room`)."""
        self._recalled: dict[str, tuple[str, str]] = {}
        """By task: (the free agent it was recalled for, the agent it was recalled from),
        while the task is live and held by that agent or back in its queue (`_forget`)."""

    async def rebalance(self, agent_id: str) -> int:
        """The agent has a free running slot and nothing queued for it: take back for it
        prefetched tasks of its shared queues that waited long enough at busy agents (one
        a free slot); returns how many were recalled."""
        free = self._free_slots(agent_id)
        recalled = 0
        for queue in self._pools.queues_of(agent_id):
            while free > 0:
                due, later = self._pick(agent_id, queue)
                if due is None:
                    if later is not None:
                        self._wake_at(agent_id, later)
                    break
                task, holder = due
                self._recalled[task.task_id] = (agent_id, holder)
                reason = f"{RECALL_PREFIX} {agent_id}, free, of {describe(queue)}"
                await self._preemptor.preempt(task, reason)
                free -= 1
                recalled += 1
        return recalled

    def withheld(self, task_id: str, agent_id: str) -> bool:
        """Whether the queued task, recalled from `agent_id` for another agent that still
        has room, must not go back to `agent_id` (lock held)."""
        recalled = self._recalled.get(task_id)
        if recalled is None or recalled[1] != agent_id or not self._kept(task_id, recalled):
            return False
        return self._on_way(task_id) and self._has_room(recalled[0])

    def spares(self, task_id: str) -> bool:
        """Whether the preemption deadline of `task_id` is one of this module's recalls whose
        task started at its agent meanwhile (the recall crossed its READ): it is not forced
        (module docstring)."""
        recalled = self._recalled.get(task_id)
        if recalled is None or not self._kept(task_id, recalled):
            return False
        return not self._on_way(task_id)

    def _kept(self, task_id: str, recalled: tuple[str, str]) -> bool:
        """Whether the recall of `task_id` still stands: the task live, held by the agent it
        was recalled from or back in its queue; forgotten otherwise (given to another agent,
        or ended)."""
        if task_id in self._live.tasks and self._live.holders.get(task_id) in (None, recalled[1]):
            return True
        del self._recalled[task_id]
        return False

    def _on_way(self, task_id: str) -> bool:
        """Whether a recalled task (`_kept`) has not started: on its way to the free agent."""
        return self._live.tasks[task_id].state != TaskState.RUNNING

    def _free_slots(self, agent_id: str) -> int:
        coming = sum(
            1 for task_id, recalled in list(self._recalled.items())
            if self._kept(task_id, recalled) and recalled[0] == agent_id
            and self._on_way(task_id)
        )  # fmt: skip
        return self._pools.concurrency(agent_id) - self._live.count(agent_id) - coming

    def _pick(
        self, agent_id: str, queue: str
    ) -> tuple[tuple[TaskRecord, str] | None, float | None]:
        """The task of `queue` to take back for `agent_id` now (with its holder), and else
        when the first one waiting will have waited STEAL_AFTER_S (None: none waits)."""
        now = self._clock.now()
        best: tuple[tuple[int, int], TaskRecord, str] | None = None
        later: float | None = None
        live, pools = self._live, self._pools
        for holder in pools.agents_for(queue):
            if holder == agent_id:
                continue
            _, waiting = split(live.held_view(holder), pools.concurrency(holder))
            for held in waiting:
                task = live.tasks.get(held.task_id)
                if task is None or not self._movable(task, queue, agent_id) or not held.preemptible:
                    continue
                at = task.updated_at + STEAL_AFTER_S
                if at > now:
                    later = at if later is None else min(later, at)
                    continue
                rank = (len(waiting), held.order)
                if best is None or rank > best[0]:
                    best = (rank, task, holder)
        return (None, later) if best is None else ((best[1], best[2]), None)

    def _movable(self, task: TaskRecord, queue: str, agent_id: str) -> bool:
        """Whether `agent_id` could take the waiting `task` of `queue` in its holder's place."""
        if task.queue != queue or task.task_id in self._recalled:
            return False
        if not self._pools.takes(agent_id, task.content_type):
            return False
        return not self._live.needs_worktree(task) or self._bound(agent_id)

    def _wake_at(self, agent_id: str, at: float) -> None:
        key = steal_key(agent_id)
        armed = self._wakeups.timers.armed(key)
        if armed is None or at < armed:
            self._wakeups.arm(key, at)
