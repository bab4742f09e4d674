"""Coalescing of concurrent store calls into one batched call (one writer job, one commit).

Many coroutines handling one frame each ask the store for a small change; a Coalescer
gathers the requests made in the same event-loop turn and runs them as one batch. If the
batch fails, each request is retried alone, so one bad request fails only its own caller.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Coalescer(Generic[T, R]):
    def __init__(self, batch: Callable[[Sequence[T]], Awaitable[Sequence[R]]]) -> None:
        self._batch = batch
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._scheduled = False
        self._running: set[asyncio.Future[None]] = set()

    async def submit(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._launch)
        return await future

    def _launch(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, []
        task = asyncio.ensure_future(self._run(pending))
        # Keep a reference: the loop holds tasks weakly.
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, pending: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._batch([item for item, _ in pending])
        except Exception:
            for item, future in pending:
                try:
                    (result,) = await self._batch([item])
                except Exception as exc:
                    if not future.done():
                        future.set_exception(exc)
                else:
                    if not future.done():
                        future.set_result(result)
            return
        for (_, future), result in zip(pending, results, strict=True):
            if not future.done():
                future.set_result(result)
