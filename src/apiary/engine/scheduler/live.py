"""The Scheduler's tasks in memory: every task that has not ended (its last stored record),
the job index, the per-(agent, lane) and per-(shared queue, lane) queues, which tasks each
agent holds (several when it runs them concurrently or has some prefetched), the held tasks'
preemption records, and who waits for what to be released.

Each of the Scheduler's parts is given this one object and works on it under the
Scheduler's lock; what changes it when a task changes state is the task machine's effects
(engine/scheduler/transitions.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from itertools import count
from typing import Final

from apiary.core.clock import Clock
from apiary.core.lanes import LANES
from apiary.core.preemption import PreemptionMachine, PreemptionRecord, PreemptionState
from apiary.core.records import TaskRecord, TaskState
from apiary.core.scope_overlap import parse_scope
from apiary.core.tasks.capacity import HeldTask
from apiary.core.tasks.queue import QueuedTask, TaskQueue
from apiary.engine.scheduler.wakeups import SEP, Wakeups, preempt_key, shared_target

_ENDED: Final = frozenset(s for s in TaskState if s.terminal)
_PREEMPTIBLE: Final = frozenset({PreemptionState.RUNNING, PreemptionState.NON_PREEMPTIBLE})
STALE_KEPT: Final = 10_000
"""Dispatches taken back from lost agents remembered (their late ACKs are answered)."""
ENDED_KEPT: Final = 4096
"""Tasks that ended last kept as they were stored (`known`): their submitters ask for them
just after (WaitTask, FollowTasks, `apiary task status`), and an ended record never changes."""
ENDED_KEPT_BYTES: Final = 16 * 1024 * 1024
"""What those kept records' params and results may hold together: a result may be 1 MiB
(more when configured), so a count alone would not bound them; a record larger than this
is not kept (it is read from the store)."""


def queue_key(target: str, lane: str) -> str:
    """The TaskQueue key of a target's lane (an agent id or a shared queue's target)."""
    return f"{target}{SEP}{lane}"


def key_agent(key: str) -> str:
    """The target of a queue key."""
    return key.partition(SEP)[0]


def target_of(task: TaskRecord) -> str:
    """Where the task waits: its shared queue's target, or its agent."""
    return shared_target(task.queue) if task.queue else task.agent_id


class LiveTasks:
    """The Scheduler's live tasks and what they hold; see the module docstring."""

    def __init__(self, clock: Clock, wakeups: Wakeups) -> None:
        self._clock = clock
        self._wakeups = wakeups
        self.tasks: dict[str, TaskRecord] = {}
        """Task id -> its last stored record, for every task that has not ended (with the
        attempts of dispatches the store failed counted: `unsent`)."""
        self.jobs: dict[str, str] = {}
        """Job key -> the open task of that job (RFC 9.2); HELD duplicates are not in it."""
        self.queue = TaskQueue()
        self.ended: dict[str, TaskRecord] = {}
        """The tasks that ended last, as stored, oldest first (at most ENDED_KEPT, with at
        most ENDED_KEPT_BYTES of params and results)."""
        self._ended_bytes = 0
        self.held: dict[str, dict[str, None]] = {}
        """Agent id -> the tasks it holds (DISPATCHED or RUNNING), in dispatch order."""
        self.holders: dict[str, str] = {}
        """Held task -> its agent (every held task: what the conflict gate compares with)."""
        self.by_message: dict[str, str] = {}
        """A held task's DATA envelope id -> the task (its ACKs name the envelope)."""
        self.stale: dict[str, str] = {}
        """The DATA envelope of a dispatch taken back from a lost agent, or not stored
        (`unsent`) -> its task."""
        self.active: Counter[str] = Counter()
        """Agent type -> agents of that type holding a task (max_parallel_instances, RFC 9.1)."""
        self.preemptions: dict[str, PreemptionRecord] = {}
        """Held task -> where its cooperative preemption stands (core/preemption.py)."""
        self.cancelling: dict[str, str] = {}
        """Dispatched task, not read, that an operator cancelled -> the note it ends FAILED
        with once its agent gives it back (Scheduler.cancel)."""
        self._seq = 0
        self._order = count()
        self._dispatched: dict[str, int] = {}
        """Held task -> its dispatch order (core/tasks/capacity.py `HeldTask.order`)."""
        self._instance: dict[str, str] = {}
        """Agent holding tasks -> the type its instance counts under in `active`."""
        self._type_waiters: dict[str, set[str]] = {}
        """Agent type -> targets whose next task waits for a free instance of it (RFC 9.1)."""
        self._blocked_by: dict[str, set[str]] = {}
        """Running task -> targets whose next task waits for it to end (RFC 9.2)."""
        self._needs_worktree: dict[str, bool] = {}

    # ------------------------------------------------------------------ reads

    def known(self, task_id: str) -> TaskRecord | None:
        """The task if it is live or ended lately (`ended`); None: ask the store."""
        return self.tasks.get(task_id) or self.ended.get(task_id)

    def held_by(self, agent_id: str) -> TaskRecord | None:
        """The agent's earliest dispatched task (DISPATCHED or RUNNING), if any."""
        held = self.held.get(agent_id)
        return self.tasks.get(next(iter(held))) if held else None

    def holding(self, agent_id: str) -> list[TaskRecord]:
        """The tasks the agent holds, in dispatch order."""
        return [self.tasks[t] for t in self.held.get(agent_id, ()) if t in self.tasks]

    def count(self, agent_id: str) -> int:
        """How many tasks the agent holds."""
        held = self.held.get(agent_id)
        return len(held) if held else 0

    def holds(self, agent_id: str, task_id: str) -> bool:
        return self.holders.get(task_id) == agent_id

    def held_view(self, agent_id: str) -> list[HeldTask]:
        """The agent's held tasks as preemption sees them (core/tasks/capacity.py)."""
        found = []
        for task in self.holding(agent_id):
            record = self.preemptions.get(task.task_id)
            found.append(HeldTask(
                task.task_id, task.priority, task.state == TaskState.RUNNING,
                self._dispatched.get(task.task_id, 0),
                record is not None and record.state in _PREEMPTIBLE,
            ))  # fmt: skip
        return found

    def ready(self, targets: Sequence[str]) -> dict[str, int]:
        """How many tasks wait in each lane of `targets` (agents' and shared queues'), all
        together."""
        queue = self.queue
        return {lane: sum(queue.count(queue_key(t, lane)) for t in targets) for lane in LANES}

    def queued(self, agent_id: str | None = None) -> list[TaskRecord]:
        """Waiting tasks in service order per lane: an agent's own queue, a shared queue's
        (`shared_target`), or all of them when None."""
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
            self._keep_ended(task)
            self._needs_worktree.pop(task.task_id, None)
            if self.jobs.get(task.job_key) == task.task_id:
                del self.jobs[task.job_key]
        else:
            self.tasks[task.task_id] = task
            if task.state != TaskState.HELD:
                self.jobs.setdefault(task.job_key, task.task_id)

    def _keep_ended(self, task: TaskRecord) -> None:
        """`task` in `ended`, the oldest dropped past ENDED_KEPT or ENDED_KEPT_BYTES."""
        if (kept := self.ended.pop(task.task_id, None)) is not None:
            self._ended_bytes -= _payload(kept)
        size = _payload(task)
        if size > ENDED_KEPT_BYTES:
            return
        self.ended[task.task_id] = task
        self._ended_bytes += size
        while len(self.ended) > ENDED_KEPT or self._ended_bytes > ENDED_KEPT_BYTES:
            self._ended_bytes -= _payload(self.ended.pop(next(iter(self.ended))))

    def withdraw(self, task_id: str) -> None:
        """A new task taken in for its first dispatch and not sent (`SchedulerDispatch.
        first`): out of the queue and the live tasks, as if it had never come."""
        task = self.tasks.pop(task_id, None)
        self.queue.remove(task_id)
        self._needs_worktree.pop(task_id, None)
        if task is not None and self.jobs.get(task.job_key) == task_id:
            del self.jobs[task.job_key]

    def push(self, task: TaskRecord) -> None:
        """Queue the task in its target's lane (a requeued task keeps its place)."""
        self.queue.push(
            QueuedTask(task.task_id, queue_key(target_of(task), task.lane), task.priority,
                       task.submitted_at, task.seq, task.scope, task.job_key)
        )  # fmt: skip

    def occupy(self, task: TaskRecord) -> None:
        """The task is held by its agent now."""
        agent_id = task.agent_id
        held = self.held.setdefault(agent_id, {})
        if not held:
            self._instance[agent_id] = task.agent_type
            self.active[task.agent_type] += 1
        held[task.task_id] = None
        self.holders[task.task_id] = agent_id
        self._dispatched[task.task_id] = next(self._order)
        self.by_message[task.message_id] = task.task_id
        self.preemptions[task.task_id] = PreemptionMachine.start(task.task_id, self._clock.now())

    def release(self, task: TaskRecord) -> None:
        """The task is no longer held (ended, yielded or requeued): wake the targets that
        waited for what it held."""
        freed = self._unhold(task)
        if freed is not None:
            for target in self._type_waiters.pop(freed, set()):
                self._wakeups.wake(target)
        self.cancelling.pop(task.task_id, None)
        self._wakeups.timers.cancel(preempt_key(task.task_id))
        for target in self._blocked_by.pop(task.task_id, set()):
            self._wakeups.wake(target)

    def unoccupy(self, task: TaskRecord) -> None:
        """`occupy` undone, waking nobody: a dispatch reserved and not stored yet
        (engine/scheduler/dispatch.py `_reserve`) whose batch decides what it is."""
        self._unhold(task)

    def _unhold(self, task: TaskRecord) -> str | None:
        """The task out of its agent's hands; the agent type whose instance that freed
        (the agent holds nothing now), else None."""
        freed = None
        agent_id = self.holders.pop(task.task_id, None)
        held = self.held.get(agent_id) if agent_id is not None else None
        if agent_id is not None and held is not None:
            held.pop(task.task_id, None)
            if not held:
                del self.held[agent_id]
                freed = self._instance.pop(agent_id, task.agent_type)
                if self.active[freed] > 0:
                    self.active[freed] -= 1
        self._dispatched.pop(task.task_id, None)
        self.by_message.pop(task.message_id, None)
        self.preemptions.pop(task.task_id, None)
        return freed

    def taken_back(self, task: TaskRecord) -> None:
        """The task's dispatch was taken back from its lost agent: an ACK of that envelope
        is stale from now on."""
        self._stale(task.message_id, task.task_id)

    def unsent(self, task: TaskRecord, message_id: str, attempt: int) -> TaskRecord:
        """A dispatch of the QUEUED `task` as `message_id`, its `attempt`, that the store
        failed (the envelope may have gone out, the DISPATCH was not stored): the task as it
        was, with that attempt counted (the next one's idempotency token is its own); an ACK
        of that envelope is stale. Returns the live record."""
        counted = replace(task, attempts=attempt)
        self.tasks[task.task_id] = counted
        self._stale(message_id, task.task_id)
        return counted

    def _stale(self, message_id: str, task_id: str) -> None:
        self.stale[message_id] = task_id
        while len(self.stale) > STALE_KEPT:
            del self.stale[next(iter(self.stale))]

    def wait_for_type(self, agent_type: str, target: str) -> None:
        """The target's next task waits for a free instance of `agent_type`."""
        self._type_waiters.setdefault(agent_type, set()).add(target)

    def wait_behind(self, task_id: str, target: str) -> None:
        """The target's next task waits for the running task `task_id` to end."""
        self._blocked_by.setdefault(task_id, set()).add(target)

    def wake_task(self, task_id: str) -> None:
        """Wake where a live task waits (the conflict gate's decision came)."""
        task = self.tasks.get(task_id)
        if task is not None:
            self._wakeups.wake(target_of(task) if task.state == TaskState.QUEUED else task.agent_id)


def _payload(task: TaskRecord) -> int:
    """What a record holds beyond its bounded fields: its params and its result."""
    return len(task.params) + len(task.result)
