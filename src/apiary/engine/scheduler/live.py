"""The Scheduler's tasks in memory: every task that has not ended (its last stored record),
the job index, the per-(agent, lane) queues, which task holds which agent, the running
tasks' preemption records, and who waits for what to be released.

Each of the Scheduler's parts is given this one object and works on it under the
Scheduler's lock; what changes it when a task changes state is the task machine's effects
(engine/scheduler/transitions.py).
"""

from __future__ import annotations

from collections import Counter
from typing import Final

from apiary.core.clock import Clock
from apiary.core.preemption import PreemptionMachine, PreemptionRecord
from apiary.core.records import TaskRecord, TaskState
from apiary.core.scope_overlap import parse_scope
from apiary.core.tasks.queue import QueuedTask, TaskQueue
from apiary.engine.scheduler.wakeups import SEP, Wakeups, preempt_key

_ENDED: Final = frozenset(s for s in TaskState if s.terminal)


def queue_key(agent_id: str, lane: str) -> str:
    """The TaskQueue key of the agent's lane."""
    return f"{agent_id}{SEP}{lane}"


def key_agent(key: str) -> str:
    return key.partition(SEP)[0]


class LiveTasks:
    """The Scheduler's live tasks and what they hold; see the module docstring."""

    def __init__(self, clock: Clock, wakeups: Wakeups) -> None:
        self._clock = clock
        self._wakeups = wakeups
        self.tasks: dict[str, TaskRecord] = {}
        """Task id -> its last stored record, for every task that has not ended."""
        self.jobs: dict[str, str] = {}
        """Job key -> the open task of that job (RFC 9.2); HELD duplicates are not in it."""
        self.queue = TaskQueue()
        self.running: dict[str, str] = {}
        """Agent id -> the task it holds (DISPATCHED or RUNNING)."""
        self.by_message: dict[str, str] = {}
        """A held task's DATA envelope id -> the task (its ACKs name the envelope)."""
        self.active: Counter[str] = Counter()
        """Agent type -> tasks of that type held (max_parallel_instances, RFC 9.1)."""
        self.preemptions: dict[str, PreemptionRecord] = {}
        """Held task -> where its cooperative preemption stands (core/preemption.py)."""
        self._seq = 0
        self._type_waiters: dict[str, set[str]] = {}
        """Agent type -> agents whose next task waits for a free instance of it (RFC 9.1)."""
        self._blocked_by: dict[str, set[str]] = {}
        """Running task -> agents whose next task waits for it to end (RFC 9.2)."""
        self._needs_worktree: dict[str, bool] = {}

    # ------------------------------------------------------------------ reads

    def held_by(self, agent_id: str) -> TaskRecord | None:
        """The task the agent holds (DISPATCHED or RUNNING), if any."""
        task_id = self.running.get(agent_id)
        return self.tasks.get(task_id) if task_id else None

    def queued(self, agent_id: str | None = None) -> list[TaskRecord]:
        """Waiting tasks in service order per lane (all agents when None)."""
        keys = [k for k in self.queue.agents() if agent_id is None or key_agent(k) == agent_id]
        return [self.tasks[q.task_id] for k in sorted(keys) for q in self.queue.listing(k)]

    def needs_worktree(self, task: TaskRecord) -> bool:
        """Whether the task's scope says `worktree:required` (parsed once per task)."""
        needs = self._needs_worktree.get(task.task_id)
        if needs is None:
            needs = self._needs_worktree[task.task_id] = parse_scope(task.scope).needs_worktree
        return needs

    # ------------------------------------------------------------------ changes

    def next_seq(self) -> int:
        """The next submission sequence number."""
        seq = self._seq
        self._seq += 1
        return seq

    def resume_seq(self, seq: int) -> None:
        """Go on numbering from `seq` (after a restart: above every stored one)."""
        self._seq = max(seq, 0)

    def adopt(self, record: TaskRecord) -> None:
        """A record found open in the store at start-up."""
        self.tasks[record.task_id] = record
        if record.job_key:
            self.jobs[record.job_key] = record.task_id

    def stored(self, task: TaskRecord) -> None:
        """The task's record was stored: keep it live (forget it once it ended) and keep
        the job index."""
        if task.state in _ENDED:
            self.tasks.pop(task.task_id, None)
            self._needs_worktree.pop(task.task_id, None)
            if self.jobs.get(task.job_key) == task.task_id:
                del self.jobs[task.job_key]
        else:
            self.tasks[task.task_id] = task
            if task.state != TaskState.HELD:
                self.jobs.setdefault(task.job_key, task.task_id)

    def push(self, task: TaskRecord) -> None:
        """Queue the task in its agent's lane (a requeued task keeps its place)."""
        self.queue.push(
            QueuedTask(task.task_id, queue_key(task.agent_id, task.lane), task.priority,
                       task.submitted_at, task.seq, task.scope, task.job_key)
        )  # fmt: skip

    def occupy(self, task: TaskRecord) -> None:
        """The task holds its agent now."""
        self.running[task.agent_id] = task.task_id
        self.by_message[task.message_id] = task.task_id
        self.active[task.agent_type] += 1
        self.preemptions[task.task_id] = PreemptionMachine.start(task.task_id, self._clock.now())

    def release(self, task: TaskRecord) -> None:
        """The task no longer holds its agent (ended, yielded or requeued): wake the agents
        that waited for what it held."""
        if self.running.get(task.agent_id) == task.task_id:
            del self.running[task.agent_id]
        self.by_message.pop(task.message_id, None)
        if self.active[task.agent_type] > 0:
            self.active[task.agent_type] -= 1
        self.preemptions.pop(task.task_id, None)
        self._wakeups.timers.cancel(preempt_key(task.task_id))
        for agent_id in self._type_waiters.pop(task.agent_type, set()):
            self._wakeups.wake(agent_id)
        for agent_id in self._blocked_by.pop(task.task_id, set()):
            self._wakeups.wake(agent_id)

    def wait_for_type(self, agent_type: str, agent_id: str) -> None:
        """The agent's next task waits for a free instance of `agent_type`."""
        self._type_waiters.setdefault(agent_type, set()).add(agent_id)

    def wait_behind(self, task_id: str, agent_id: str) -> None:
        """The agent's next task waits for the running task `task_id` to end."""
        self._blocked_by.setdefault(task_id, set()).add(agent_id)

    def wake_task(self, task_id: str) -> None:
        """Wake the agent of a live task (the conflict gate's decision came)."""
        task = self.tasks.get(task_id)
        if task is not None:
            self._wakeups.wake(task.agent_id)
