"""Who waits for tasks: WaitTask's waits for one task's end (`TaskWatch.wait`) and
WatchTasks' feeds of a submitter's changes (`TaskWatch.changes`). Every stored change of a
task (`TaskTransitions`, its PERSIST effect) is told here once it is stored, so that a
waiter never sees a state the store lacks.

A feed keeps the latest record of each task it has not handed out yet, so that a slow
reader holds one record per task, not one per change: it may miss a state in between, never
the last one (an ended task's end is always read). A feed of `every` change (the control
plane's followers of the tasks it submitted itself, a few changes per attempt) keeps each one
instead, in the order they were stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from apiary.core.records import TaskRecord, TaskState
from apiary.errors import NotFoundError

Find = Callable[[str], Awaitable[TaskRecord]]
Sleep = Callable[[float], Awaitable[None]]


def ended(task: TaskRecord) -> bool:
    return TaskState(task.state).terminal


class TaskFeed:
    """The changes of one submitter's tasks (of `task_ids` only, when given) not read yet:
    the latest of each task, or with `every` each change."""

    def __init__(self, submitter: str, task_ids: frozenset[str], *, every: bool = False) -> None:
        self.submitter = submitter
        self.task_ids = task_ids
        self.every = every
        self._pending: dict[str, list[TaskRecord]] = {}
        self._ready = asyncio.Event()

    def wants(self, task: TaskRecord) -> bool:
        return task.submitter == self.submitter and (
            not self.task_ids or task.task_id in self.task_ids
        )

    def offer(self, task: TaskRecord, *, newer: bool = True) -> None:
        """Keep `task` as the next of its id to hand out (after the pending ones with
        `every`); with `newer` false (a record read earlier), only when no change of it is
        pending."""
        held = self._pending.get(task.task_id)
        if held is None:
            self._pending[task.task_id] = [task]
        elif not newer:
            return
        elif self.every:
            held.append(task)
        else:
            held[-1] = task
        self._ready.set()

    async def next(self) -> list[TaskRecord]:
        """The pending records, in the order their tasks first changed, once there are any."""
        while not self._pending:
            self._ready.clear()
            await self._ready.wait()
        taken, self._pending = self._pending, {}
        return [task for changes in taken.values() for task in changes]


class TaskWatch:
    """The waiters for tasks' ends and the open feeds (see the module docstring), over the
    Scheduler's `find` (a task by id, NotFoundError when unknown), its tasks not ended
    (`open_tasks`) and its injected `sleep`."""

    def __init__(
        self, find: Find, open_tasks: Callable[[], Iterable[TaskRecord]], sleep: Sleep
    ) -> None:
        self._find = find
        self._open_tasks = open_tasks
        self._sleep = sleep
        self._ends: dict[str, set[asyncio.Future[TaskRecord]]] = {}
        self._feeds: dict[str, set[TaskFeed]] = {}
        """Submitter -> its open feeds."""

    def changed(self, task: TaskRecord) -> None:
        """A change of `task` was stored."""
        if ended(task):
            for waiter in self._ends.pop(task.task_id, ()):
                if not waiter.done():
                    waiter.set_result(task)
        for feed in self._feeds.get(task.submitter, ()):
            if feed.wants(task):
                feed.offer(task)

    @contextmanager
    def end_of(self, task_id: str) -> Iterator[asyncio.Future[TaskRecord]]:
        """A future of the task's ended record, for the block's duration."""
        waiter: asyncio.Future[TaskRecord] = asyncio.get_running_loop().create_future()
        self._ends.setdefault(task_id, set()).add(waiter)
        try:
            yield waiter
        finally:
            waiting = self._ends.get(task_id)
            if waiting is not None:
                waiting.discard(waiter)
                if not waiting:
                    del self._ends[task_id]
            waiter.cancel()

    @contextmanager
    def feed(
        self, submitter: str, task_ids: frozenset[str] = frozenset(), *, every: bool = False
    ) -> Iterator[TaskFeed]:
        """A feed of the submitter's task changes, open for the block's duration."""
        feed = TaskFeed(submitter, task_ids, every=every)
        feeds = self._feeds.setdefault(submitter, set())
        feeds.add(feed)
        try:
            yield feed
        finally:
            feeds.discard(feed)
            if not feeds and self._feeds.get(submitter) is feeds:
                del self._feeds[submitter]

    async def wait(self, task_id: str, timeout_s: float | None = None) -> TaskRecord:
        """The task once it has ended, or as it stands after `timeout_s` seconds (None: no
        limit but the caller's cancellation); NotFoundError for an unknown one."""
        with self.end_of(task_id) as end:  # before the read: no end slips in between
            task = await self._find(task_id)
            if ended(task):
                return task
            if timeout_s is None:
                return await end
            sleeper = asyncio.ensure_future(self._sleep(max(0.0, timeout_s)))
            racing: set[asyncio.Future[Any]] = {end, sleeper}
            try:
                await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
            return end.result() if end.done() else await self._find(task_id)

    async def changes(
        self, submitter: str, task_ids: frozenset[str] = frozenset(), *, every: bool = False
    ) -> AsyncIterator[TaskRecord]:
        """The submitter's tasks as they change: first each that has not ended (each of
        `task_ids` as it stands, when given: NotFoundError for one that is not the
        submitter's), then their stored changes (the latest of each, or with `every` each
        one); with `task_ids`, until all have ended."""
        with self.feed(submitter, task_ids, every=every) as feed:  # before the reads, as in `wait`
            if task_ids:
                first = [await self._find(task_id) for task_id in sorted(task_ids)]
                for task in first:
                    if task.submitter != submitter:
                        raise NotFoundError(
                            f"no task {task.task_id!r} submitted by {submitter!r}",
                            {"task_id": task.task_id},
                        )
            else:
                mine = (t for t in self._open_tasks() if t.submitter == submitter)
                first = sorted(mine, key=lambda t: t.seq)
            for task in first:
                feed.offer(task, newer=False)
            open_ids = set(task_ids)
            while not task_ids or open_ids:
                for task in await feed.next():
                    yield task
                    if ended(task):
                        open_ids.discard(task.task_id)

    def waiting(self) -> int:
        """Waits and feeds open now (for tests and monitoring)."""
        return sum(len(w) for w in self._ends.values()) + sum(map(len, self._feeds.values()))
