"""The task runner's ACKs, many to a frame of the streaming sender (sdk/tasks.py).

A runner acknowledges each task at least twice (READ as it starts, FULFILLED or FAILED as it
ends) and each prefetched one once more (RECEIVED). Sent one frame each, every ACK would wait
for the one before it to be answered, and an agent running one task at a time would wait for
its last task's end to be recorded before the next one's READ even leaves. `AckFrames` sends
the ACKs queued while a frame is in flight together in the next frame, in the order they were
queued (the coordinator applies a frame's ACKs in order): a task's end and the next task's
READ travel and commit together. Each ACK's own outcome still comes back to its sender.
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


class AckFrames:
    """ACK envelopes queued now and sent, in order, in as few frames as the stream allows."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._queued: list[tuple[Envelope, TraceContext | None, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None

    def send(self, ack: Envelope) -> asyncio.Future[None]:
        """Queue `ack` now (it goes after every ACK queued before it, in the span current
        now); the future is done once the coordinator took it, or fails with the ApiaryError
        that refused it."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queued.append((ack, current(), done))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush())
        return done

    async def _flush(self) -> None:
        while self._queued:
            frame, self._queued = self._queued, []
            try:
                results = await self._send(
                    [(ack, "") for ack, _, _ in frame], [trace for _, trace, _ in frame]
                )
            except ApiaryError as exc:
                for _, _, done in frame:
                    _settle(done, exc)
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

    async def close(self) -> None:
        """Stop sending; ACKs still queued fail."""
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(BaseException):
                await self._flusher


def _settle(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.done():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)
