"""Running an approved tool call: attempts, deadlines, retries, frames (RFC 18.2, 18.3, 18.6).

`CallRunner.run` drives one call from START to its end, as frames for the caller:

- Each attempt runs under the call's deadline: `timeout` (TOOL_TIMEOUT) or `budget_wall_ms`
  (WALL_TIMEOUT), whichever is tighter; for a command tool the sandbox enforces the wall
  budget itself, so the coordinator's clock allows it a moment more to report it.
- A failed attempt is retried only for an idempotent tool, on a transient error, within
  `max_retries`, after the policy's backoff, and (for a streaming call) only while nothing
  has reached the caller yet: a retry must never repeat frames the caller already has.
- Cancel (RFC 18.6) moves the call to CANCELLING and shortens the wait for the next frame to
  the grace period. Frames still arriving are passed on; the provider's normal final frame
  ends the call COMPLETED (too late to stop); anything else ends it CANCELLED with a final
  frame whose summary says `"status": "CANCELLED"`, `"cancelled": true` and
  `"partial_result"` (whether any data had arrived).
- Every final frame's summary counts the call's frames and bytes (RFC 19).

Frames are yielded outside any deadline scope: a cancellation meant for the wait on the
provider must never land in the caller's code between frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apiary.core.tools.calls import ToolCallInput, ToolFrame
from apiary.core.tools.descriptor import ProviderKind, ToolDescriptor
from apiary.core.tools.policy import ExecutionPolicy
from apiary.core.tools.retries import backoff_delay, may_retry
from apiary.core.tools.schema import check_result
from apiary.engine.eventlog import EventRecorder
from apiary.engine.tools.calls import PendingCall
from apiary.engine.tools.catalog import ProviderEntry
from apiary.engine.tools.observers import CallObservers
from apiary.engine.tools.providers import Frame, Invocation
from apiary.errors import (
    ApiaryError,
    CallCancelledError,
    ToolFailedError,
    ToolTimeoutError,
    WallTimeoutError,
)

log = logging.getLogger("apiary.tools")
SANDBOX_SLACK_S = 1.0
"""Extra time the coordinator's clock gives a sandboxed command to report its own wall
timeout (with its partial output) before the coordinator ends the attempt itself."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """A validated call: what it runs, with which policy, where."""

    entry: ProviderEntry
    tool: ToolDescriptor
    policy: ExecutionPolicy
    args: bytes
    arguments: Any
    content_type: str
    cwd: Path | None

    @property
    def provider_id(self) -> str:
        return self.entry.record.provider_id


@dataclass(frozen=True, slots=True)
class RetrySettings:
    base_s: float = 0.2
    cap_s: float = 5.0


def deadline_s(prepared: Prepared) -> tuple[float | None, type[ApiaryError]]:
    """Seconds an attempt may take (None: no limit) and the error when it does not end."""
    policy = prepared.policy
    wall = policy.budget_wall_ms / 1000
    if wall and prepared.entry.record.kind == ProviderKind.COMMAND.value:
        wall += SANDBOX_SLACK_S
    timeout = policy.timeout_ms / 1000
    if wall and (not timeout or wall <= timeout):
        return wall, WallTimeoutError
    return (timeout or None), ToolTimeoutError


class CallRunner:
    def __init__(
        self, events: EventRecorder, retry: RetrySettings, cancel_grace_s: float,
        observers: CallObservers | None = None,
    ) -> None:  # fmt: skip
        self._events = events
        self._observers = observers or CallObservers()
        self._retry = retry
        self.cancel_grace_s = cancel_grace_s

    # ------------------------------------------------------------------ frames

    @staticmethod
    def _frame(
        call: PendingCall, content_type: str, data: bytes, *, final: bool = False,
        summary: Mapping[str, Any] | None = None,
    ) -> ToolFrame:  # fmt: skip
        call.frames += 1
        return ToolFrame(call.call_id, call.frames, final, content_type, data, summary or {})

    def cancelled_frame(self, call: PendingCall) -> ToolFrame:
        """The terminal frame of a cancelled call (RFC 18.6)."""
        summary = {
            "status": "CANCELLED",
            "cancelled": True,
            "partial_result": call.data_frames > 0,
            "frames": call.frames + 1,
            "bytes": call.bytes,
            "attempts": call.attempts,
            "reason": call.cancel_reason or "cancelled",
        }
        return self._frame(call, "", b"", final=True, summary=summary)

    # ------------------------------------------------------------------ the run

    async def run(self, call: PendingCall, prepared: Prepared) -> AsyncGenerator[ToolFrame, None]:
        """Attempts until one completes, the call is cancelled, or it fails for good."""
        retries = 0
        while True:
            call.attempts += 1
            try:
                async with contextlib.aclosing(self._attempt(call, prepared)) as frames:
                    async for frame in frames:
                        yield frame
                return
            except ApiaryError as exc:
                if call.cancelling:
                    call.apply(ToolCallInput.STOPPED)
                    yield self.cancelled_frame(call)
                    return
                retry = call.frames == 0 and may_retry(
                    exc.code, idempotent=prepared.tool.idempotent, retries_done=retries,
                    max_retries=prepared.policy.max_retries,
                )  # fmt: skip
                if not retry:
                    raise
                retries += 1
                call.apply(ToolCallInput.RETRY)
                delay = backoff_delay(
                    prepared.policy.backoff, retries, self._retry.base_s, self._retry.cap_s
                )
                await self._events.record(
                    "tool.call_retry", call.caller or "coordinator",
                    correlation_id=call.correlation_id, call_id=call.call_id,
                    attempt=call.attempts, error_code=exc.code, error=exc.message,
                    delay_s=delay,
                )  # fmt: skip
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await call.stop_requested.wait()
                if call.cancelling:
                    call.apply(ToolCallInput.STOPPED)
                    yield self.cancelled_frame(call)
                    return

    async def _attempt(
        self, call: PendingCall, prepared: Prepared
    ) -> AsyncGenerator[ToolFrame, None]:
        invocation = Invocation(
            call_id=call.call_id, provider_id=prepared.provider_id, tool=prepared.tool,
            args=prepared.args, arguments=prepared.arguments,
            content_type=prepared.content_type, policy=prepared.policy, stream=call.stream,
            caller=call.caller, correlation_id=call.correlation_id, attempt=call.attempts,
            cwd=prepared.cwd,
        )  # fmt: skip
        limit_s, timeout_error = deadline_s(prepared)
        deadline = asyncio.get_running_loop().time() + limit_s if limit_s else None
        collected = bytearray()
        call.bytes = call.data_frames = 0  # the counts describe the attempt that answers
        async with contextlib.aclosing(prepared.entry.provider.call(invocation)) as frames:
            while True:
                frame = await self._next(call, frames, deadline, limit_s, timeout_error)
                call.bytes += len(frame.data)
                if frame.data:
                    call.data_frames += 1
                    self._observers.output(call, frame.data)
                if not call.stream or prepared.tool.output_schema:
                    collected += frame.data
                if frame.final and frame.summary.get("cancelled"):
                    # The provider says it stopped: not a normal terminal frame.
                    raise CallCancelledError(f"provider {call.provider_id!r} stopped the call")
                if frame.final:
                    yield self._final(call, prepared, frame, bytes(collected))
                    return
                call.apply(ToolCallInput.FRAME)
                if call.stream:
                    yield self._frame(call, frame.content_type, frame.data)

    async def _next(
        self, call: PendingCall, frames: AsyncIterator[Frame], deadline: float | None,
        limit_s: float | None, timeout_error: type[ApiaryError],
    ) -> Frame:  # fmt: skip
        """The provider's next frame, within the attempt's deadline (or the cancel grace)."""
        when = deadline
        if call.cancel_deadline is not None:
            when = min(when or call.cancel_deadline, call.cancel_deadline)
        try:
            async with asyncio.timeout_at(when) as scope:
                call.scope = scope
                try:
                    return await anext(frames)
                finally:
                    call.scope = None
        except StopAsyncIteration:
            raise ToolFailedError(
                f"provider {call.provider_id!r} ended {call.call_id} without a final frame"
            ) from None
        except TimeoutError:
            if call.cancelling:
                raise CallCancelledError(
                    f"the provider did not stop within {self.cancel_grace_s} s"
                ) from None
            raise timeout_error(
                f"{call.provider_id}/{call.tool_name} did not finish within {limit_s} s",
                {"limit_s": str(limit_s)},
            ) from None

    def _final(
        self, call: PendingCall, prepared: Prepared, frame: Frame, collected: bytes
    ) -> ToolFrame:
        content_type = frame.content_type or prepared.content_type
        check_result(prepared.tool.output_schema, content_type, collected)
        call.apply(ToolCallInput.FINISH)
        summary = {
            **frame.summary,
            "status": "OK",
            "frames": call.frames + 1,
            "bytes": call.bytes,
            "attempts": call.attempts,
        }
        data = frame.data if call.stream else collected
        return self._frame(call, content_type, data, final=True, summary=summary)
