"""Turns gRPC failures into Apiary's exceptions, so SDK users never see raw gRPC errors."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc

from apiary.errors import AgentUnavailableError, ApiaryError, UnimplementedError, error_for_code
from apiary.wire.errordetail import error_from_trailers

T = TypeVar("T")


class CoordinatorUnreachableError(AgentUnavailableError):
    """The call never reached a coordinator (nothing answers at the address, the name does
    not resolve, the connection broke): `agent_unavailable` to code that retries on it, and
    told apart from the coordinator's own `agent_unavailable` answers, which carry an error
    trailer, so that a command line can say "cannot reach the coordinator at X"."""


def translate(exc: grpc.aio.AioRpcError) -> ApiaryError:
    """The Apiary exception for a failed call (from the error trailer when present)."""
    found = error_from_trailers(exc.trailing_metadata() or ())
    if found is not None:
        return found
    status = exc.code()
    text = f"{status.name if status else 'UNKNOWN'}: {exc.details() or ''}".strip()
    if status is grpc.StatusCode.UNIMPLEMENTED:
        return UnimplementedError(text)
    if status is grpc.StatusCode.UNAVAILABLE:
        return CoordinatorUnreachableError(f"coordinator unreachable: {text}")
    return error_for_code("internal_error", text)


async def call(fn: Callable[[], Awaitable[T]]) -> T:
    try:
        return await fn()
    except grpc.aio.AioRpcError as exc:
        raise translate(exc) from None


async def stream(items: AsyncIterator[T]) -> AsyncIterator[T]:
    try:
        async for item in items:
            yield item
    except grpc.aio.AioRpcError as exc:
        raise translate(exc) from None
