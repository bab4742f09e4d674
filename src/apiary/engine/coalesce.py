"""Coalescing of concurrent store calls into one batched call (one writer job, one commit).

Many coroutines handling one frame each ask the store for a small change; a Coalescer
gathers the requests made in the same event-loop turn and runs them as one batch. A caller
may hand in several requests at once (a whole frame's ACKs), which then share one future. If
the batch fails, each caller's requests are retried alone, so one bad request fails only its
own caller.
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
        self._pending: list[tuple[Sequence[T], asyncio.Future[Sequence[R]]]] = []
        self._scheduled = False
        self._running: set[asyncio.Future[None]] = set()

    async def submit(self, item: T) -> R:
        (result,) = await self.submit_many((item,))
        return result

    async def submit_many(self, items: Sequence[T]) -> Sequence[R]:
        """The results of `items`, in order, from the next batch (all or nothing for them)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Sequence[R]] = loop.create_future()
        self._pending.append((items, future))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._launch)
        return await future

    def _launch(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, []
        task = asyncio.ensure_future(self._run(pending))
        # Keep a reference: the loop holds tasks weakly.
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, pending: list[tuple[Sequence[T], asyncio.Future[Sequence[R]]]]) -> None:
        try:
            results = await self._batch([item for items, _ in pending for item in items])
        except Exception:
            for items, future in pending:
                try:
                    alone = await self._batch(items)
                except Exception as exc:
                    if not future.done():
                        future.set_exception(exc)
                else:
                    if not future.done():
                        future.set_result(alone)
            return
        start = 0
        for items, future in pending:
            end = start + len(items)
            if not future.done():
                future.set_result(results[start:end])
            start = end
