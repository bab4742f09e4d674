"""The waits of one client's task handles over one FollowTasks stream (docs/sdk.md, "How
waiting works").

A handle that waits registers its task here; the first wait opens the client's stream
(apiary.v1 TaskQueryService.FollowTasks), which names each task waited for once and answers
its end, many ends to a reply. The coordinator reads each task after following it, so a task
that ended before anyone waited is answered at once.

The stream is opened again when it breaks (the coordinator restarted, or the channel moved
to another of the client's addresses), and after a minute (`SESSION_S`), naming every task
still waited for, whose states are read anew: no end is missed. When it cannot be opened
(an older coordinator, a replica that does not lead, a refusal), or the coordinator will
not follow a task (unknown, or not the caller's to wait for), the waits go to WaitTask, as
every wait did before, which answers as it always has (its refusal included).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, Final

from apiary.errors import UnavailableError
from apiary.sdk.errors import CoordinatorUnreachableError
from apiary.wire import pb

if TYPE_CHECKING:
    from apiary.sdk.client import Client

FRAME_IDS: Final = 100
"""Task ids one frame names at most (well below the coordinator's `[limits] watch_task_ids`,
1000 by default)."""
PAUSE_MIN_S: Final = 0.05
PAUSE_MAX_S: Final = 2.0
"""Pauses between attempts to open the stream again after it broke, doubling."""
STEADY_S: Final = 1.0
"""A stream that lasted this long before it broke is opened again after the shortest pause."""
SESSION_S: Final = 60.0
"""One stream lasts this long at most; then the next is opened, naming the tasks still
waited for: a connection that died unnoticed, or a proxy's idle timeout, holds no wait for
longer (WaitTask's slices of a minute did the same)."""

View = pb.apiary_pb2.TaskView
_TRANSIENT: Final = (CoordinatorUnreachableError, UnavailableError)
"""Failures after which the stream is opened again; any other (a refusal, unimplemented)
makes the waits WaitTask's."""


class TaskWaits:
    """One client's waits for task ends (module docstring). `Client.task_waits` holds it."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._waiters: dict[str, set[asyncio.Future[View | None]]] = {}
        self._follow: set[str] = set()
        """Ids to name in the next frame."""
        self._unfollow: set[str] = set()
        self._wake = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._closed = False
        self.fallback: Exception | None = None
        """Why the stream could not be opened: every wait is WaitTask's from then on."""
        self.opened = 0
        """Streams opened so far (the first, and each after a break)."""

    async def end(self, task_id: str, timeout: float | None) -> View | None:  # noqa: ASYNC109
        """The task once it has ended, within `timeout` seconds (None: no limit); None when
        it has not, or when the stream cannot tell (WaitTask then answers)."""
        if self.fallback is not None or self._closed:
            return None
        waiter: asyncio.Future[View | None] = asyncio.get_running_loop().create_future()
        waiting = self._waiters.get(task_id)
        if waiting is None:
            waiting = self._waiters[task_id] = set()
            self._unfollow.discard(task_id)
            self._follow.add(task_id)
            self._wake.set()
        waiting.add(waiter)
        if self._runner is None:
            self._runner = asyncio.create_task(self._run(), name="apiary-task-waits")
        try:
            if timeout is None:
                return await waiter
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, timeout)):
                    return await waiter
            return None
        finally:
            self._leave(task_id, waiter)

    def waiting(self) -> int:
        """Tasks waited for now."""
        return len(self._waiters)

    async def close(self) -> None:
        """Stop the stream; waits still open raise CoordinatorUnreachableError (as a WaitTask
        call in flight on a channel that closes does)."""
        self._closed = True
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
        closed = CoordinatorUnreachableError("the client was closed while its handles waited")
        for task_id in list(self._waiters):
            for waiter in self._waiters.pop(task_id):
                if not waiter.done():
                    waiter.set_exception(closed)

    def _leave(self, task_id: str, waiter: asyncio.Future[View | None]) -> None:
        """A waiter is done (answered, out of time, or cancelled): the others go on; the
        last one of a task that is still followed stops its following."""
        waiting = self._waiters.get(task_id)
        if waiting is None or waiter not in waiting:
            return
        waiting.discard(waiter)
        if waiting:
            return
        del self._waiters[task_id]
        if task_id in self._follow:
            self._follow.discard(task_id)  # (never named)
        else:
            self._unfollow.add(task_id)
            self._wake.set()

    def _answer(self, task_id: str, view: View | None) -> None:
        for waiter in self._waiters.pop(task_id, ()):
            if not waiter.done():
                waiter.set_result(view)

    def _answer_all(self, view: View | None) -> None:
        for task_id in list(self._waiters):
            self._answer(task_id, view)
        self._follow.clear()
        self._unfollow.clear()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        pause = PAUSE_MIN_S
        while True:
            began = loop.time()
            try:
                if await self._session():
                    pause = PAUSE_MIN_S
                    continue  # (its time was up: the next one at once)
            except _TRANSIENT:
                pass
            except Exception as exc:  # (a refusal, unimplemented, or the unforeseen)
                self.fallback = exc
                self._runner = None
                self._answer_all(None)
                return
            if not self._waiters:  # (a stream broken while nobody waits opens at the next wait)
                self._runner = None
                return
            pause = PAUSE_MIN_S if loop.time() - began >= STEADY_S else min(PAUSE_MAX_S, pause * 2)
            await asyncio.sleep(pause)

    async def _session(self) -> bool:
        """One stream: every task waited for is named anew, then each new one as it comes;
        true when it lasted its time (`SESSION_S`) and there are waits left."""
        call = self._client.task_query.FollowTasks()
        self.opened += 1
        self._follow = set(self._waiters)
        self._unfollow.clear()
        self._wake.set()
        reading = asyncio.ensure_future(self._read(call))
        writing = asyncio.ensure_future(self._write(call))
        try:
            await asyncio.wait(
                {reading, writing}, timeout=SESSION_S, return_when=asyncio.FIRST_COMPLETED
            )
            for part in (reading, writing):
                if part.done():
                    part.result()
                    return False
            return bool(self._waiters)
        finally:
            for part in (reading, writing):
                part.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await part
            call.cancel()

    async def _read(self, call: Any) -> None:
        async for reply in call:
            for view in reply.ended:
                self._answer(view.task_id, view)
            for task_id in reply.refused:
                self._answer(task_id, None)

    async def _write(self, call: Any) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._follow or self._unfollow:
                follow = _take(self._follow)
                unfollow = _take(self._unfollow)
                frame = pb.apiary_pb2.FollowTasksRequest(task_ids=follow, unfollow=unfollow)
                await call.write(frame)


def _take(ids: set[str]) -> list[str]:
    taken: list[str] = []
    while ids and len(taken) < FRAME_IDS:
        taken.append(ids.pop())
    return taken


__all__ = ["TaskWaits"]
