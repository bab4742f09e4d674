"""The SDK's side of tracing (docs/tracing.md): an agent continues the trace a delivery
carries, and what it sends carries the current trace on.

- A delivery that carries a W3C trace context (`Delivery.trace`: the coordinator traces) is
  handled within a span of its own, a child of that context: a message's handler
  (`continued`), a task's handler and its report (`started`), a tool's handler. The spans
  come from the application's OpenTelemetry tracer provider (the global one); without one
  configured they record nothing but still carry the context on.
- Every call a client makes carries the span current in its task as `traceparent` and
  `tracestate` metadata (`call_metadata`, on every channel of `open_channel`), and each
  envelope of a streamed send carries the span current when it was sent (`current`).

OpenTelemetry is imported (`sdk/trace_spans.py`) only once a delivery carries a context, or
when the application imported it itself: an agent that nothing traces does not load it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Final

from apiary.core.trace_context import TRACEPARENT, TraceContext

if TYPE_CHECKING:
    from apiary.sdk.trace_spans import AgentSpan

Attributes = Mapping[str, str | int | bool]
NO_SPAN: Final[AbstractContextManager[None]] = nullcontext()
"""What `continued` is without a context: nothing happens."""
_API: Final = "opentelemetry.trace"
SEND_STREAM: Final = "/apiary.v1.RouterStreamService/SendStream"


def current() -> TraceContext | None:
    """The context of the span current in this task; None without one (or when nothing in
    the process loaded OpenTelemetry: then no span can be current)."""
    if _API not in sys.modules:
        return None
    from apiary.sdk.trace_spans import current_context  # noqa: PLC0415

    return current_context()


def call_metadata(method: str, given: Sequence[tuple[str, str | bytes]]) -> list[tuple[str, str]]:
    """The metadata that carries the current span on a call (a `CallMetadata` source of
    `open_channel`): none without a current span, or when the call names a parent itself,
    nor on a send stream, whose envelopes each carry their own (a stream opened within one
    span goes on serving sends made in others)."""
    if method == SEND_STREAM:
        return []
    found = current()
    if found is None or any(key == TRACEPARENT for key, _ in given):
        return []
    return list(found.headers().items())


def continued(
    trace: TraceContext | None, name: str, attributes: Attributes
) -> AbstractContextManager[AgentSpan | None]:
    """A span named `name` continuing `trace`, current for the block and ended at its end
    (nothing at all when `trace` is None)."""
    if trace is None:
        return NO_SPAN
    from apiary.sdk.trace_spans import continued_span  # noqa: PLC0415

    return continued_span(trace, name, attributes)


def started(trace: TraceContext | None, name: str, attributes: Attributes) -> AgentSpan | None:
    """A span continuing `trace`, for work that outlives the block that starts it (a task's
    handler runs as an asyncio task of its own): `within()` makes it current, `end()` ends
    it. None when `trace` is None."""
    if trace is None:
        return None
    from apiary.sdk.trace_spans import AgentSpan  # noqa: PLC0415

    return AgentSpan.start(trace, name, attributes)


def fail_current(code: str, note: str = "") -> None:
    """Mark the span current in this task failed with protocol error `code` (nothing without
    one)."""
    if _API not in sys.modules:
        return
    from apiary.sdk.trace_spans import fail_current_span  # noqa: PLC0415

    fail_current_span(code, note)
