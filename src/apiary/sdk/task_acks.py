"""The task runner's ACKs, many to a frame of the streaming sender (sdk/tasks.py).

A runner acknowledges each task at least twice (READ as it starts, FULFILLED or FAILED as it
ends) and each prefetched one once more (RECEIVED). Sent one frame each, every ACK would wait
for the one before it to be answered, and an agent running one task at a time would wait for
its last task's end to be recorded before the next one's READ even leaves. `AckFrames` sends
the ACKs queued while a frame is in flight together in the next frame, in the order they were
queued (the coordinator applies a frame's ACKs in order): a task's end and the next task's
READ travel and commit together. Each ACK's own outcome still comes back to its sender.

A prefetched task's RECEIVED and a task's READ are lazy: they leave no frame of their own but
ride with the next eager ACK (a task's end), or go after LAZY_S when none comes. Sent at once,
a RECEIVED took a frame, a round trip and a commit of its own between a task's end and the
next task's READ, which then waited for it; a READ sent at once made a task two frames and two
commits (READ, then its end) where one does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence

from apiary.core.envelope import Envelope
from apiary.core.trace_context import TraceContext
from apiary.errors import ApiaryError, error_for_code
from apiary.sdk.sender import SendResult
from apiary.sdk.tracing import current

Send = Callable[
    [Sequence[tuple[Envelope, str]], Sequence[TraceContext | None]], Awaitable[list[SendResult]]
]
"""One frame of the streaming sender, each envelope with its trace context: per-envelope
results, in order."""


LAZY_S = 0.01
"""How long a lazy ACK waits for an eager one to carry it before it goes alone."""


class AckFrames:
    """ACK envelopes queued now and sent, in order, in as few frames as the stream allows."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._queued: list[tuple[Envelope, TraceContext | None, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._due = False
        """An ACK queued is eager (or a lazy one waited LAZY_S): the next frame leaves as
        soon as the stream allows."""
        self._timer: asyncio.TimerHandle | None = None

    def send(self, ack: Envelope, *, lazy: bool = False) -> asyncio.Future[None]:
        """Queue `ack` now (it goes after every ACK queued before it, in the span current
        now); the future is done once the coordinator took it, or fails with the ApiaryError
        that refused it. A `lazy` ACK (a prefetched task's RECEIVED, a task's READ) does not
        make a frame leave: it goes with the next eager ACK, or after LAZY_S."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queued.append((ack, current(), done))
        if lazy:
            self._wait_lazily()
        else:
            self._make_due()
        return done

    def now(self) -> None:
        """Send the lazy ACKs queued without waiting any longer (someone waits for one: a
        handler's call that must follow its task's READ)."""
        if self._queued:
            self._make_due()

    def _wait_lazily(self) -> None:
        if self._queued and not self._due and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(LAZY_S, self._make_due)

    def _make_due(self) -> None:
        self._due = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush())

    async def _flush(self) -> None:
        while self._queued and self._due:
            frame, self._queued = self._queued, []
            self._due = False
            try:
                results = await self._send(
                    [(ack, "") for ack, _, _ in frame], [trace for _, trace, _ in frame]
                )
            except ApiaryError as exc:
                for _, _, done in frame:
                    _settle(done, exc)
                self._wait_lazily()
                continue
            except BaseException as exc:  # cancelled (closing) or a bug: nobody waits forever
                for _, _, done in [*frame, *self._queued]:
                    _settle(done, ApiaryError(f"the ACK was not sent: {exc!r}"))
                self._queued = []
                raise
            for (ack, _, done), result in zip(frame, results, strict=True):
                if result.accepted:
                    _settle(done, None)
                else:
                    code, details = (
                        result.error_code or "internal_error",
                        {"message_id": ack.message_id},
                    )
                    _settle(done, error_for_code(code, result.reason, details))
            self._wait_lazily()

    async def close(self) -> None:
        """Stop sending; ACKs still queued fail."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(BaseException):
                await self._flusher
        for _, _, done in self._queued:  # lazy ones no frame took
            _settle(done, ApiaryError("the ACK was not sent: the stream closed"))
        self._queued = []


def _settle(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.done():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)
