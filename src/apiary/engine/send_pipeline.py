"""Pipelined admission of a send stream's frames (RFC 5.4 SendStream).

A stream's frames are answered in order, and each frame's durable write follows the previous
frame's, so that a producer's messages keep their order in every inbox whatever the store.
Handled one frame at a time, the event loop would idle while a frame commits and the store's
writer would idle while the next frame is validated. Here frame k+1 is prepared (validated,
deduplicated, buffer space reserved) while frame k's write commits, and its own write is
submitted as soon as frame k's has returned. At most `depth` frames are between being read
and being answered, which bounds the reservations a stream can hold.

A prepared frame is always completed, even when its stream goes away before the answer: its
reservations are then released or turned into admitted messages, never left dangling.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

from apiary.engine.admission import Outbound, PreparedSend, SendOutcome
from apiary.engine.router import Router

_log = logging.getLogger(__name__)

_Entry = asyncio.Future[list[SendOutcome]] | BaseException | None
"""A frame's answer to come, the error that ended the stream, or None at its end."""


class SendPipeline:
    def __init__(self, router: Router, depth: int = 4) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1: {depth}")
        self._router = router
        self._depth = depth
        self._running: set[asyncio.Future[list[SendOutcome]]] = set()
        """Completions in flight (the loop holds tasks weakly)."""

    async def run(
        self, batches: AsyncIterator[Sequence[Outbound]]
    ) -> AsyncIterator[list[SendOutcome]]:
        """Each batch's outcomes, in order; an error of `batches` is raised after the
        answers to the batches before it."""
        queue: asyncio.Queue[_Entry] = asyncio.Queue()
        slots = asyncio.Semaphore(self._depth)
        pump = asyncio.ensure_future(self._pump(batches, queue, slots))
        # However the pump ends (done, failed, cancelled), the reader learns it after the
        # answers queued before.
        pump.add_done_callback(lambda task: queue.put_nowait(_ending(task)))
        try:
            while (entry := await queue.get()) is not None:
                if isinstance(entry, BaseException):
                    raise entry
                outcomes = await asyncio.shield(entry)
                slots.release()
                yield outcomes
        finally:
            pump.cancel()

    async def _pump(
        self,
        batches: AsyncIterator[Sequence[Outbound]],
        queue: asyncio.Queue[_Entry],
        slots: asyncio.Semaphore,
    ) -> None:
        previous: asyncio.Future[list[SendOutcome]] | None = None
        async for items in batches:
            await slots.acquire()
            prepared = await self._router.prepare(items)
            previous = self._complete_after(previous, prepared)
            queue.put_nowait(previous)

    def _complete_after(
        self, previous: asyncio.Future[list[SendOutcome]] | None, prepared: PreparedSend
    ) -> asyncio.Future[list[SendOutcome]]:
        async def complete() -> list[SendOutcome]:
            if previous is not None:
                await asyncio.wait([previous])
            return await self._router.complete(prepared)

        task = asyncio.ensure_future(complete())
        self._running.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Future[list[SendOutcome]]) -> None:
        self._running.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # Also raised to the stream if it is still there to answer.
            _log.error("completing a send frame failed: %s", task.exception())


def _ending(pump: asyncio.Future[None]) -> BaseException | None:
    """What ends the stream once the pump is done: None at the end of the batches, else
    the error (or cancellation) that stopped it."""
    if pump.cancelled():
        return asyncio.CancelledError()
    return pump.exception()
