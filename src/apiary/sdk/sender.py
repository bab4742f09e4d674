"""The streaming sender: many envelopes per frame over apiary.v1 SendStream (RFC 5.4)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from apiary.core.envelope import Envelope
from apiary.core.trace_context import TraceContext
from apiary.sdk import errors
from apiary.sdk.tracing import current
from apiary.wire import pb
from apiary.wire.convert import envelope_to_proto


@dataclass(frozen=True, slots=True)
class SendResult:
    message_id: str
    accepted: bool
    error_code: str
    reason: str
    recipient: str
    offset: int


class BatchSender:
    """One bidirectional SendStream; frames are answered in order, one at a time."""

    def __init__(
        self, channel: grpc.aio.Channel, sign: Callable[[bytes], bytes] | None = None
    ) -> None:
        """`sign`: signs each envelope's deterministic bytes when message signing is on."""
        self._stub = pb.apiary_pb2_grpc.RouterStreamServiceStub(channel)
        self._sign = sign
        self._call: Any = None
        self._lock = asyncio.Lock()

    async def send(
        self,
        items: Sequence[tuple[Envelope, str]],
        traces: Sequence[TraceContext | None] | None = None,
    ) -> list[SendResult]:
        """One frame; each envelope carries the span current when it is sent, or its own
        of `traces` (one per item) when given (envelopes queued earlier, each in its span)."""
        frame = pb.apiary_pb2.SendFrame()
        now = current()
        for i, (env, to) in enumerate(items):
            item = frame.items.add(msg=envelope_to_proto(env), recipient=to)
            if self._sign is not None:
                item.signature = self._sign(item.msg.SerializeToString(deterministic=True))
            trace = now if traces is None else traces[i]
            if trace is not None:
                item.traceparent, item.tracestate = trace.traceparent, trace.tracestate
        async with self._lock:
            if self._call is None:
                self._call = self._stub.SendStream()
            try:
                await self._call.write(frame)
                reply = await self._call.read()
            except grpc.aio.AioRpcError as exc:
                self._call = None
                raise errors.translate(exc) from None
            except asyncio.InvalidStateError:
                # The stream already ended (the coordinator went away between frames):
                # drop it, so that the next send opens a new one.
                self._call = None
                raise errors.CoordinatorUnreachableError(
                    "the send stream ended; send again to reconnect"
                ) from None
        if reply is grpc.aio.EOF:
            # Closed with the frame unanswered: its outcome is unknown (a repeat is safe).
            self._call = None
            raise errors.CoordinatorUnreachableError("the send stream closed")
        return [
            SendResult(r.message_id, r.accepted, r.error_code, r.reason, r.recipient, r.offset)
            for r in reply.results
        ]

    async def close(self) -> None:
        if self._call is not None:
            call, self._call = self._call, None
            with contextlib.suppress(asyncio.InvalidStateError, grpc.aio.AioRpcError):
                await call.done_writing()
