"""Turns gRPC failures into Apiary's exceptions, so SDK users never see raw gRPC errors; and
the errors of a task's outcome (`TaskFailedError`, `TaskTimeoutError`, `TaskHeldError`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TypeVar

import grpc

from apiary.errors import (
    AgentUnavailableError,
    ApiaryError,
    DeadlineExceededError,
    UnimplementedError,
    error_for_code,
)
from apiary.wire.errordetail import error_from_trailers

T = TypeVar("T")


class CoordinatorUnreachableError(AgentUnavailableError):
    """The call never reached a coordinator or got no answer from it (nothing answers at the
    address, the name does not resolve, the connection broke, the coordinator stopped with the
    call in flight: its outcome is unknown, and a retry with the same idempotency token is
    safe): `agent_unavailable` to code that retries on it, and
    told apart from the coordinator's own `agent_unavailable` answers, which carry an error
    trailer, so that a command line can say "cannot reach the coordinator at X"."""


class TaskFailedError(ApiaryError):
    """A task ended FAILED. `error_code` and `message` are what its agent said (or the
    Scheduler: `cancelled`, `forced_preemption`, `duplicate_detected`, ...).

    The submitter's `TaskHandle.result()` raises it; an agent's handler raises it to fail its
    task with a code of its own, which the submitter then reads:

        raise TaskFailedError("the input file is empty", error_code="empty_input")
    """

    code = "task_failed"

    def __init__(
        self,
        message: str = "",
        details: Mapping[str, str] | None = None,
        *,
        error_code: str = "",
        task_id: str = "",
    ) -> None:
        given = {"error_code": error_code, "task_id": task_id}
        super().__init__(message, {**(details or {}), **{k: v for k, v in given.items() if v}})

    @property
    def error_code(self) -> str:
        """The task's error code (internal_error when none was given)."""
        return self.details.get("error_code") or "internal_error"

    @property
    def task_id(self) -> str:
        return self.details.get("task_id", "")

    def __str__(self) -> str:
        where = f"task {self.task_id} failed: " if self.task_id else ""
        said = f": {self.message}" if self.message else ""
        return f"{where}{self.error_code}{said}"


class TaskTimeoutError(DeadlineExceededError):
    """`TaskHandle.result(timeout=...)` ran out of time before the task ended; `state` is
    where it stood (details: task_id, state, note)."""

    @property
    def task_id(self) -> str:
        return self.details.get("task_id", "")

    @property
    def state(self) -> str:
        return self.details.get("state", "")


class TaskHeldError(TaskTimeoutError):
    """The task is still HELD when the wait ran out: a duplicate job waiting for a HITL
    authorization (RFC 9.2); `reason` says which job and which invocation."""

    @property
    def reason(self) -> str:
        return self.details.get("note", "")


_UNANSWERED = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL,
     grpc.StatusCode.UNKNOWN}
)  # fmt: skip
"""Statuses that, without the coordinator's error trailer, mean no coordinator answered."""


def translate(exc: grpc.aio.AioRpcError) -> ApiaryError:
    """The Apiary exception for a failed call (from the error trailer when present)."""
    found = error_from_trailers(exc.trailing_metadata() or ())
    if found is not None:
        return found
    status = exc.code()
    text = f"{status.name if status else 'UNKNOWN'}: {exc.details() or ''}".strip()
    if status is grpc.StatusCode.UNIMPLEMENTED:
        return UnimplementedError(text)
    if status in _UNANSWERED:
        # Without the coordinator's trailer (its own refusals, internal errors included, all
        # carry one): the call ended unanswered, a replica stopping with it in flight (gRPC's
        # core ends it CANCELLED, or INTERNAL when the connection is torn mid-stream); a
        # caller's own cancellation raises CancelledError.
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
