"""Pipelined admission of a send stream's frames (RFC 5.4 SendStream).

A stream's frames are answered in order, and each frame's durable write follows the previous
frame's, so that a producer's messages keep their order in every inbox whatever the store.
Handled one frame at a time, the event loop would idle while a frame commits and the store's
writer would idle while the next frame is validated. Here frame k+1 is prepared (validated,
deduplicated, buffer space reserved) while frame k's write commits, and its own write is
submitted as soon as frame k's has returned. At most `depth` frames are between being read
and being answered, which bounds the reservations a stream can hold.

Frames that pile up meanwhile are taken together: those read while the previous ones were
being prepared are prepared as one batch (a frame of ACKs waits on the store there), and
those prepared while the previous write was committing are written as one (up to
`merge_items` envelopes each time). Each frame is still answered on its own, in order; only
the number of writes per frame shrinks as the load grows (a write costs the store about the
same for one frame as for several: docs/performance.md).

A prepared frame is always completed, even when its stream goes away before the answer: its
reservations are then released or turned into admitted messages, never left dangling.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from apiary.engine.router.admission import Outbound, PreparedSend, SendOutcome, merged
from apiary.engine.router.router import Router

_log = logging.getLogger(__name__)


class _End:
    """The end of the stream's frames."""


_END = _End()
_Frame = Sequence[Outbound] | BaseException | _End
"""A frame as read, the error that ended the stream, or its end."""
_Entry = tuple[asyncio.Future[list[SendOutcome]], list[int]] | BaseException | None
"""The answer to come for a group of frames (and their sizes), the error that ended the
stream, or None at its end."""


@dataclass(slots=True)
class _Ready:
    prepared: PreparedSend
    answer: asyncio.Future[list[SendOutcome]]


class SendPipeline:
    def __init__(self, router: Router, depth: int = 4, merge_items: int = 2048) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1: {depth}")
        if merge_items < 1:
            raise ValueError(f"merge_items must be at least 1: {merge_items}")
        self._router = router
        self._depth = depth
        self._merge_items = merge_items
        self._running: set[asyncio.Future[None]] = set()
        """Completers at work (the loop holds tasks weakly)."""

    async def run(
        self, batches: AsyncIterator[Sequence[Outbound]]
    ) -> AsyncIterator[list[SendOutcome]]:
        """Each batch's outcomes, in order; an error of `batches` is raised after the
        answers to the batches before it."""
        frames: asyncio.Queue[_Frame] = asyncio.Queue()
        answers: asyncio.Queue[_Entry] = asyncio.Queue()
        slots = asyncio.Semaphore(self._depth)
        reader = asyncio.ensure_future(_read(batches, frames, slots))
        pump = asyncio.ensure_future(self._pump(frames, answers))
        # However the pump ends (done, failed, cancelled), the reader learns it after the
        # answers queued before.
        pump.add_done_callback(lambda task: answers.put_nowait(_ending(task)))
        try:
            while (entry := await answers.get()) is not None:
                if isinstance(entry, BaseException):
                    raise entry
                answer, sizes = entry
                outcomes = await asyncio.shield(answer)
                start = 0
                for size in sizes:
                    slots.release()
                    yield outcomes[start : start + size]
                    start += size
        finally:
            reader.cancel()
            pump.cancel()

    async def _pump(self, frames: asyncio.Queue[_Frame], answers: asyncio.Queue[_Entry]) -> None:
        ready: deque[_Ready] = deque()
        while True:
            group, ending = _take(frames, await frames.get(), self._merge_items)
            if group:
                items = group[0] if len(group) == 1 else [i for frame in group for i in frame]
                prepared = await self._router.prepare(items)
                answer: asyncio.Future[list[SendOutcome]] = asyncio.Future()
                ready.append(_Ready(prepared, answer))
                if len(ready) == 1:
                    self._start(ready)
                answers.put_nowait((answer, [len(frame) for frame in group]))
            if isinstance(ending, BaseException):
                raise ending
            if ending is _END:
                return

    def _start(self, ready: deque[_Ready]) -> None:
        completer = asyncio.ensure_future(self._complete(ready))
        self._running.add(completer)
        completer.add_done_callback(self._running.discard)

    async def _complete(self, ready: deque[_Ready]) -> None:
        """Write what is prepared, in order, all that waits at once; until none is left.
        Not cancelled with its stream: a prepared frame is always completed."""
        while ready:
            group = [ready[0]]
            count = len(ready[0].prepared.items)
            while len(group) < len(ready) and count < self._merge_items:
                group.append(ready[len(group)])
                count += len(group[-1].prepared.items)
            try:
                if len(group) == 1:
                    outcomes = await self._router.complete(group[0].prepared)
                else:
                    outcomes = await self._router.complete(merged([r.prepared for r in group]))
            except Exception as exc:
                # Also raised to the stream if it is still there to answer.
                _log.error("completing a send frame failed: %s", exc)
                for item in group:
                    item.answer.set_exception(exc)
                    item.answer.exception()  # logged above: not again if the stream is gone
            except BaseException:
                for item in ready:  # the loop is going away: nobody is left to answer
                    item.answer.cancel()
                ready.clear()
                raise
            else:
                start = 0
                for item in group:
                    size = len(item.prepared.items)
                    item.answer.set_result(outcomes[start : start + size])
                    start += size
            for _ in group:
                ready.popleft()


async def _read(
    batches: AsyncIterator[Sequence[Outbound]],
    frames: asyncio.Queue[_Frame],
    slots: asyncio.Semaphore,
) -> None:
    """Move `batches` into `frames`, at most `depth` ahead of the answers (`slots`); then
    their end, or the error that ended them."""
    try:
        async for items in batches:
            await slots.acquire()
            frames.put_nowait(items)
    except BaseException as exc:  # handed to the pump, which raises it after the answers
        frames.put_nowait(exc)
        if not isinstance(exc, Exception):
            raise
    else:
        frames.put_nowait(_END)


def _take(
    frames: asyncio.Queue[_Frame], first: _Frame, limit: int
) -> tuple[list[Sequence[Outbound]], _End | BaseException | None]:
    """`first` and the frames already waiting behind it, up to `limit` envelopes; and how
    the stream ended if that came too (`_END`, its error), else None."""
    group: list[Sequence[Outbound]] = []
    item = first
    count = 0
    while True:
        if isinstance(item, _End | BaseException):
            return group, item
        group.append(item)
        count += len(item)
        if count >= limit or frames.empty():
            return group, None
        item = frames.get_nowait()


def _ending(pump: asyncio.Future[None]) -> BaseException | None:
    """What ends the stream once the pump is done: None at the end of the batches, else
    the error (or cancellation) that stopped it."""
    if pump.cancelled():
        return asyncio.CancelledError()
    return pump.exception()
