"""Followers of Scheduler tasks: the turns and the task runs of a control plane each run as a
Scheduler task, and each is followed until it ends. One follower per key watches its task
(the Scheduler's WatchTasks stream, as its submitter, every change), hands each stored state
to `changed` in order under the control plane's lock until that says the follow is over,
calls `lost` when the Scheduler no longer knows the task, and after any other failure (a
store outage) follows again from what is stored, with a pause that grows from 0.05 s to 5 s."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from apiary.core.records import TaskRecord
from apiary.engine.scheduler.scheduler import Scheduler
from apiary.errors import NotFoundError
from apiary.stopping import stop_tasks

log = logging.getLogger(__name__)

FOLLOW_PAUSE_S: Final = (0.05, 5.0)
"""The first and the longest pause before following a task again after a failure."""

Changed = Callable[[TaskRecord], Awaitable[bool]]
"""A stored state of the task; True when the follow is over."""
Lost = Callable[[], Awaitable[None]]
"""The Scheduler no longer knows the task."""


class TaskFollowers:
    def __init__(self, scheduler: Scheduler, lock: asyncio.Lock, what: str) -> None:
        self._scheduler = scheduler
        self._lock = lock
        self._what = what
        """What a follower follows, for task names and log lines ("turn", "run")."""
        self._running: dict[str, asyncio.Task[None]] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._running)

    def follow(self, key: str, task_id: str, submitter: str, changed: Changed, lost: Lost) -> None:
        """Follow the Scheduler task `task_id` as `submitter` (one follower per `key`; none
        once closed)."""
        if self._closed:
            return
        running = self._running.get(key)
        if running is not None and not running.done():
            return
        follower = asyncio.create_task(
            self._following(key, task_id, submitter, changed, lost),
            name=f"apiary-runtime-{self._what}-{key}",
        )
        self._running[key] = follower
        follower.add_done_callback(lambda done: self._forget(key, done))

    async def close(self) -> None:
        """Stop following for good (the tasks go on; a control plane that follows them again
        starts from the store)."""
        self._closed = True
        followers, self._running = list(self._running.values()), {}
        await stop_tasks(followers, f"runtime {self._what} followers")

    def _forget(self, key: str, done: asyncio.Task[None]) -> None:
        if self._running.get(key) is done:
            del self._running[key]

    async def _following(
        self, key: str, task_id: str, submitter: str, changed: Changed, lost: Lost
    ) -> None:
        pause, longest = FOLLOW_PAUSE_S
        while True:
            try:
                async for task in self._scheduler.watch_tasks(
                    submitter, frozenset({task_id}), every=True
                ):
                    async with self._lock:
                        if await changed(task):
                            return
                return
            except NotFoundError:
                async with self._lock:
                    await lost()
                return
            except Exception as exc:  # a store outage, say: follow again (it reads anew)
                log.warning(
                    "following %s %s failed, again in %.2f s: %s", self._what, key, pause, exc
                )
                await asyncio.sleep(pause)
                pause = min(pause * 2, longest)
