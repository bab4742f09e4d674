"""Per-agent task queues in the order of RFC 7.1: priority first, then FIFO.

Priorities are integers from -19 (highest) to 20 (lowest), default 0 (`validate_priority`).
A lower number is served first: every -19 task before any -18 task, and so on down to 20.
Within one priority, tasks are served by `submitted_at` (the submission timestamp), and tasks
submitted at the same instant by `seq`, a sequence number that only grows, so the order is
total and stable even when the clock does not move.

`TaskQueue` keeps one binary heap per queue key (`agent_id`: the agent, or agent type, the task
waits for). Push is O(log n); pop and remove-by-id are amortized O(log n): removal only forgets
the task (O(1)) and leaves its heap entry behind, and pop discards such stale entries when they
surface. A heap whose stale entries outnumber its live ones is rebuilt (O(n), paid for by the n
removals that made it stale), so a heap never holds more than about twice its live tasks.
`heap_ops` counts heap pushes and pops so that tests can check this bound without a clock.

A preempted task goes back into the queue with its original `submitted_at` and `seq`
(`push(task)`), so it is served before the tasks of its priority submitted after it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from apiary.errors import ValidationError

PRIORITY_HIGHEST: Final = -19
"""The numerically lowest priority value, served first (RFC 7.1)."""
PRIORITY_LOWEST: Final = 20
"""The numerically highest priority value, served last."""
DEFAULT_PRIORITY: Final = 0
_MIN_REBUILD: Final = 64
"""Heaps with fewer stale entries than this are never rebuilt: not worth the copy."""


def validate_priority(priority: object = None) -> int:
    """The priority as an int in -19..20; None means the default, 0 (RFC 7.1).

    Raises ValidationError (field "priority") for a non-integer (bool included) or a value
    out of range.
    """
    if priority is None:
        return DEFAULT_PRIORITY
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValidationError.for_field("priority", "must be an integer")
    if not PRIORITY_HIGHEST <= priority <= PRIORITY_LOWEST:
        raise ValidationError.for_field(
            "priority", f"must be between {PRIORITY_HIGHEST} and {PRIORITY_LOWEST}"
        )
    return int(priority)


def _required(value: object, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValidationError.for_field(name, "must be a non-empty string")
    return value


@dataclass(frozen=True, slots=True)
class QueuedTask:
    """A task waiting for an agent: what the queue orders and what the scheduler dispatches.

    `scope` is the task's scope metadata as submitted (see `apiary.core.scope_overlap`);
    `job_key` its job identity for uniqueness checks (RFC 9.2), empty when not given.
    """

    task_id: str
    agent_id: str
    priority: int
    submitted_at: float
    seq: int
    scope: str = ""
    job_key: str = ""

    def __post_init__(self) -> None:
        _required(self.task_id, "task_id")
        _required(self.agent_id, "agent_id")
        object.__setattr__(self, "priority", validate_priority(self.priority))
        at = self.submitted_at
        if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
            raise ValidationError.for_field("submitted_at", "must be a finite number")
        if isinstance(self.seq, bool) or not isinstance(self.seq, int) or self.seq < 0:
            raise ValidationError.for_field("seq", "must be an integer >= 0")
        if not isinstance(self.scope, str):
            raise ValidationError.for_field("scope", "must be a string")
        if not isinstance(self.job_key, str):
            raise ValidationError.for_field("job_key", "must be a string")

    @property
    def sort_key(self) -> tuple[int, float, int]:
        """The service order: lower sorts first."""
        return (self.priority, self.submitted_at, self.seq)


def _service_order(task: QueuedTask) -> tuple[int, float, int, str]:
    return (*task.sort_key, task.task_id)


# A heap entry: the sort key, a stamp unique to this push, and the task id. The stamp tells a
# live entry from a stale one left by a removed (and perhaps re-pushed) task of the same id.
_Entry = tuple[int, float, int, int, str]


@dataclass(slots=True)
class _AgentHeap:
    entries: list[_Entry] = field(default_factory=list)
    live: int = 0


class TaskQueue:
    """Per-agent priority queues: -19 first, FIFO by submission within a priority (RFC 7.1).

    Task ids are unique across the whole queue. Pop and peek take an agent id; iteration and
    `listing` give tasks in service order for listings.
    """

    def __init__(self) -> None:
        self._heaps: dict[str, _AgentHeap] = {}
        self._tasks: dict[str, tuple[QueuedTask, int]] = {}
        self._next_seq = 0
        self._next_stamp = 0
        self.heap_ops = 0
        """Heap pushes and pops done so far (each O(log n)); for tests of the bound."""

    # --- adding -------------------------------------------------------------------------------

    def submit(
        self,
        task_id: str,
        agent_id: str,
        submitted_at: float,
        priority: object = None,
        *,
        scope: str = "",
        job_key: str = "",
    ) -> QueuedTask:
        """Queue a new task with the next sequence number; returns it."""
        task = QueuedTask(
            task_id, agent_id, validate_priority(priority), submitted_at, self._next_seq,
            scope, job_key,
        )  # fmt: skip
        self.push(task)
        return task

    def push(self, task: QueuedTask) -> None:
        """Queue `task` as it is (a requeue keeps its place); O(log n).

        Raises ValidationError (field "task_id") when a task with this id is already queued.
        """
        if task.task_id in self._tasks:
            raise ValidationError.for_field("task_id", "is already queued", task_id=task.task_id)
        stamp = self._next_stamp
        self._next_stamp += 1
        self._next_seq = max(self._next_seq, task.seq + 1)
        heap = self._heaps.setdefault(task.agent_id, _AgentHeap())
        heapq.heappush(heap.entries, (*task.sort_key, stamp, task.task_id))
        heap.live += 1
        self.heap_ops += 1
        self._tasks[task.task_id] = (task, stamp)

    @property
    def next_seq(self) -> int:
        """The sequence number `submit` gives next (above every seq pushed so far)."""
        return self._next_seq

    # --- taking -------------------------------------------------------------------------------

    def peek(self, agent_id: str) -> QueuedTask | None:
        """The task `pop(agent_id)` would return, or None; amortized O(log n)."""
        heap = self._heaps.get(agent_id)
        if heap is None:
            return None
        self._drop_stale_top(heap)
        return self._tasks[heap.entries[0][4]][0] if heap.entries else None

    def pop(self, agent_id: str) -> QueuedTask | None:
        """Take the agent's next task in service order, or None; amortized O(log n)."""
        heap = self._heaps.get(agent_id)
        if heap is None:
            return None
        self._drop_stale_top(heap)
        if not heap.entries:
            return None
        entry = heapq.heappop(heap.entries)
        self.heap_ops += 1
        task, _ = self._tasks.pop(entry[4])
        self._forget_one(agent_id, heap)
        return task

    def remove(self, task_id: str) -> QueuedTask | None:
        """Take a task out wherever it is (cancelled, expired), or None if it is not queued.

        O(1) now; its heap entry is discarded later (amortized O(log n)).
        """
        found = self._tasks.pop(task_id, None)
        if found is None:
            return None
        task = found[0]
        heap = self._heaps[task.agent_id]
        self._forget_one(task.agent_id, heap)
        stale = len(heap.entries) - heap.live
        if heap.live and stale > heap.live and stale >= _MIN_REBUILD:
            self._rebuild(heap)
        return task

    # --- looking ------------------------------------------------------------------------------

    def get(self, task_id: str) -> QueuedTask | None:
        """The queued task with this id, or None."""
        found = self._tasks.get(task_id)
        return found[0] if found else None

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    def count(self, agent_id: str) -> int:
        """How many tasks wait for this agent."""
        heap = self._heaps.get(agent_id)
        return heap.live if heap else 0

    def counts(self) -> Mapping[str, int]:
        """Tasks waiting per agent, for agents with at least one."""
        return {agent: heap.live for agent, heap in self._heaps.items()}

    def agents(self) -> tuple[str, ...]:
        """The agents with queued tasks, sorted."""
        return tuple(sorted(self._heaps))

    def listing(self, agent_id: str | None = None) -> list[QueuedTask]:
        """Queued tasks in service order: one agent's, or all agents' merged; O(n log n)."""
        if agent_id is None:
            return sorted((task for task, _ in self._tasks.values()), key=_service_order)
        heap = self._heaps.get(agent_id)
        if heap is None:
            return []
        return [self._tasks[e[4]][0] for e in sorted(heap.entries) if self._is_live(e)]

    def __iter__(self) -> Iterator[QueuedTask]:
        """All queued tasks in service order (a snapshot)."""
        return iter(self.listing())

    def heap_size(self, agent_id: str) -> int:
        """Entries in the agent's heap, stale ones included (at most ~2x its live tasks)."""
        heap = self._heaps.get(agent_id)
        return len(heap.entries) if heap else 0

    # --- internals ----------------------------------------------------------------------------

    def _is_live(self, entry: _Entry) -> bool:
        found = self._tasks.get(entry[4])
        return found is not None and found[1] == entry[3]

    def _drop_stale_top(self, heap: _AgentHeap) -> None:
        while heap.entries and not self._is_live(heap.entries[0]):
            heapq.heappop(heap.entries)
            self.heap_ops += 1

    def _forget_one(self, agent_id: str, heap: _AgentHeap) -> None:
        heap.live -= 1
        if heap.live == 0:
            # Nothing live: drop the heap and its stale entries at once.
            del self._heaps[agent_id]

    def _rebuild(self, heap: _AgentHeap) -> None:
        heap.entries = [e for e in heap.entries if self._is_live(e)]
        heapq.heapify(heap.entries)
