"""Who waits for tasks: WaitTask's waits for one task's end (`TaskWatch.wait`),
WatchTasks' feeds of a submitter's changes (`TaskWatch.changes`) and FollowTasks' followers
of the ends of the tasks they name as they go (`TaskWatch.follower`). Every stored change of a
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


class TaskFollower:
    """The tasks one FollowTasks stream follows, and what it has not handed out yet: the
    ends of its tasks (in the order they were stored) and the ids it refused to follow. Its
    ids are added and dropped as the stream goes (`TaskWatch.follow`, `unfollow`); an end is
    offered once and stops the following. `close` says no more ids will come."""

    def __init__(self) -> None:
        self.following: set[str] = set()
        self._ended: dict[str, TaskRecord] = {}
        self._refused: list[str] = []
        self._closed = False
        self._error: BaseException | None = None
        self._ready = asyncio.Event()
        self._held = False

    def offer(self, task: TaskRecord) -> None:
        self.following.discard(task.task_id)
        self._ended[task.task_id] = task
        if not self._held:
            self._ready.set()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Nothing is handed out during the block (a frame's ids being read), so that the
        ends it finds go out together."""
        self._held = True
        try:
            yield
        finally:
            self._held = False
            self._ready.set()

    def withdraw(self, task_id: str) -> None:
        """Take back an end offered but not handed out (a task found not to be allowed)."""
        self._ended.pop(task_id, None)

    def refuse(self, task_ids: list[str]) -> None:
        if task_ids:
            self._refused.extend(task_ids)
            self._ready.set()

    def close(self, error: BaseException | None = None) -> None:
        """No more ids to follow (the stream's requests ended, or failed with `error`)."""
        self._closed = True
        self._error = error
        self._ready.set()

    async def next(self) -> tuple[list[TaskRecord], list[str]] | None:
        """The ends and refusals not handed out yet, once there are any; None once closed
        with nothing followed left; the error it was closed with, if any."""
        while self._held or not (self._ended or self._refused):
            if self._error is not None:
                raise self._error
            if self._closed and not self.following and not self._held:
                return None
            self._ready.clear()
            await self._ready.wait()
        ended, self._ended = list(self._ended.values()), {}
        refused, self._refused = self._refused, []
        return ended, refused


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
        self._followers: dict[str, set[TaskFollower]] = {}
        """Task id -> the followers of its end."""

    def changed(self, task: TaskRecord) -> None:
        """A change of `task` was stored."""
        if ended(task):
            for waiter in self._ends.pop(task.task_id, ()):
                if not waiter.done():
                    waiter.set_result(task)
            for follower in self._followers.pop(task.task_id, ()):
                follower.offer(task)
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

    @contextmanager
    def follower(self) -> Iterator[TaskFollower]:
        """A follower of task ends (FollowTasks), for the block's duration."""
        follower = TaskFollower()
        try:
            yield follower
        finally:
            self.unfollow(follower, list(follower.following))

    async def follow(
        self, follower: TaskFollower, task_ids: Iterable[str], allowed: Callable[[TaskRecord], bool]
    ) -> list[str]:
        """Follow each of `task_ids` not followed yet: an ended one is offered at once (it is
        read after it is followed, so no end slips in between). Those unknown, or not
        `allowed`, are not followed: they are returned."""
        with follower.held():
            return await self._follow(follower, task_ids, allowed)

    async def _follow(
        self, follower: TaskFollower, task_ids: Iterable[str], allowed: Callable[[TaskRecord], bool]
    ) -> list[str]:
        refused = []
        for task_id in task_ids:
            if task_id in follower.following:
                continue
            follower.following.add(task_id)
            self._followers.setdefault(task_id, set()).add(follower)
            try:
                task = await self._find(task_id)
            except NotFoundError:
                task = None
            if task is None or not allowed(task):
                self.unfollow(follower, [task_id])
                follower.withdraw(task_id)  # (an end stored while it was read)
                refused.append(task_id)
            elif ended(task) and task_id in follower.following:
                self.unfollow(follower, [task_id])
                follower.offer(task)
        return refused

    def unfollow(self, follower: TaskFollower, task_ids: Iterable[str]) -> None:
        for task_id in task_ids:
            follower.following.discard(task_id)
            followers = self._followers.get(task_id)
            if followers is not None:
                followers.discard(follower)
                if not followers:
                    del self._followers[task_id]

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
        """Waits, feeds and followed tasks open now (for tests and monitoring)."""
        return (
            sum(len(w) for w in self._ends.values())
            + sum(map(len, self._feeds.values()))
            + sum(map(len, self._followers.values()))
        )
