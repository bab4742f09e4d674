"""A client stream refused when it opens is answered with its refusal only once what its
caller was sending has been read (bounded in frames and time): a gRPC client still writing
its request when the stream closes reports the call as `internal`, not as the refusal."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from google.protobuf.message import Message

from apiary.engine.operators import Operators
from apiary.errors import UnauthenticatedError
from apiary.server import dispatch
from apiary.server.auth.authenticator import Authenticator
from apiary.server.auth.guard import AccessGuard
from apiary.server.context import CallContext
from apiary.server.dispatch import Dispatcher
from apiary.wire.services import SERVICES

SEND_STREAM = next(
    method
    for methods in SERVICES.values()
    for method in methods
    if method.path == "/apiary.v1.RouterStreamService/SendStream"
)


class _Notes:
    """Where the guard records its decisions (the event log's `note`)."""

    def __init__(self) -> None:
        self.refusals: list[str] = []

    def note(self, event_type: str, actor: str, **fields: object) -> None:
        assert event_type == "access.decided"
        self.refusals.append(str(fields["refusal"]))


async def _refuse(frames: AsyncIterator[Message]) -> list[str]:
    """Open SendStream anonymously on a secure dispatcher; the refusals it recorded."""
    notes = _Notes()
    authenticator = Authenticator(
        operators=Operators(), keys=None, certificates=(), public_key=lambda _t, _k: b"",
        now=time.time, secure=True,
    )  # fmt: skip
    guard = AccessGuard(authenticator, lambda _tenant: notes, secure=True)  # type: ignore[arg-type, return-value]
    route = Dispatcher({}, guard).route(SEND_STREAM.path)
    assert route is not None
    with pytest.raises(UnauthenticatedError):
        async for _answer in route.bidi()(frames, CallContext("grpc", peer="ipv4:127.0.0.1:1")):
            pass
    return notes.refusals


async def test_the_refusal_follows_the_callers_last_frame() -> None:
    sent: list[str] = []

    async def frames() -> AsyncIterator[Message]:
        for _ in range(2):
            yield SEND_STREAM.request_type()
            sent.append("frame")
        sent.append("half-close")

    assert await _refuse(frames()) == ["unauthenticated"]
    assert sent == ["frame", "frame", "half-close"]


async def test_a_caller_that_keeps_sending_is_refused_after_a_bounded_number_of_frames() -> None:
    read = 0

    async def endless() -> AsyncIterator[Message]:
        nonlocal read
        while True:
            read += 1
            yield SEND_STREAM.request_type()

    assert await _refuse(endless()) == ["unauthenticated"]
    assert read == dispatch.REFUSED_STREAM_FRAMES


async def test_a_silent_caller_is_refused_after_a_bounded_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dispatch, "REFUSED_STREAM_WAIT_S", 0.05)

    async def silent() -> AsyncIterator[Message]:
        await asyncio.Event().wait()
        yield SEND_STREAM.request_type()

    assert await _refuse(silent()) == ["unauthenticated"]
