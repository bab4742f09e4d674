"""Tracing over the OpenTelemetry SDK (docs/tracing.md): the coordinator's own tracer
provider (never the process's global one, which belongs to the application embedding it),
sampling new traces at [tracing] sample_ratio and following a caller's decision otherwise,
its spans exported in batches over OTLP/gRPC.

Imported only when tracing is on (`open_tracing`): the OpenTelemetry SDK loads with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from google.protobuf.message import Message
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from apiary import __version__
from apiary.core.trace_context import TraceContext
from apiary.engine.tracing import Attributes
from apiary.errors import ApiaryError
from apiary.server.context import CallContext
from apiary.server.dispatch import UnaryFn
from apiary.server.tracing.settings import TracingSettings
from apiary.wire.services import RpcMethod

_PROPAGATOR = TraceContextTextMapPropagator()
_KINDS = {"": SpanKind.INTERNAL, "server": SpanKind.SERVER}


def context_of(span: Span) -> TraceContext | None:
    """`span`'s context as the W3C headers carry it (what the propagator would inject, at a
    fraction of its cost: one per admitted message); None for an invalid span."""
    context = span.get_span_context()
    if not context.is_valid:
        return None
    parent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    state = context.trace_state
    return TraceContext(parent, state.to_header() if state else "")


def _parent(context: TraceContext | None) -> Context:
    """The OpenTelemetry context whose span is `context`'s (an empty one, a new trace, for
    None or an invalid traceparent)."""
    if context is None:
        return Context()
    return _PROPAGATOR.extract(context.headers(), context=Context())


def _failed(span: Span, code: str, note: str) -> None:
    span.set_attribute("apiary.error_code", code)
    span.set_status(Status(StatusCode.ERROR, f"{code}: {note}" if note else code))


class _OpenSpan:
    __slots__ = ("_span", "context")

    def __init__(self, span: Span) -> None:
        self._span = span
        found = context_of(span)
        # A span of the SDK's tracer always has a valid context, sampled or not.
        assert found is not None
        self.context = found

    def end(self, error_code: str = "", note: str = "") -> None:
        if error_code:
            _failed(self._span, error_code, note)
        self._span.end()


class OtelTracing:
    """The engine's `Tracing` and the dispatcher's call spans over `provider`."""

    def __init__(self, provider: TracerProvider, *, owned: bool = False) -> None:
        """`owned`: `close` shuts `provider` down (the coordinator's own, from settings)."""
        self._provider = provider
        self._owned = owned
        self._tracer = provider.get_tracer("apiary", __version__)

    @classmethod
    def from_settings(
        cls, settings: TracingSettings, processor: SpanProcessor | None = None
    ) -> OtelTracing:
        """A provider per `settings`, exporting through `processor` (default: batches over
        OTLP/gRPC to `settings.otlp_endpoint`)."""
        resource = Resource.create(
            {SERVICE_NAME: settings.service_name, SERVICE_VERSION: __version__}
        )
        sampler = ParentBased(TraceIdRatioBased(settings.sample_ratio))
        provider = TracerProvider(resource=resource, sampler=sampler)
        if processor is None:
            # Imported here: its gRPC channel is the exporter's, made only to export.
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415
                OTLPSpanExporter,
            )

            exporter = OTLPSpanExporter(endpoint=settings.otlp_endpoint or None)
            processor = BatchSpanProcessor(exporter)
        provider.add_span_processor(processor)
        return cls(provider, owned=True)

    # ------------------------------------------------------------------ the engine's part

    def current(self) -> TraceContext | None:
        return context_of(trace.get_current_span())

    def annotate(self, attributes: Attributes) -> None:
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attributes(attributes)

    def start(
        self, name: str, parent: TraceContext | None, attributes: Attributes, *, kind: str = ""
    ) -> _OpenSpan:
        span = self._tracer.start_span(
            name, context=_parent(parent), kind=_KINDS[kind], attributes=attributes
        )
        return _OpenSpan(span)

    # ------------------------------------------------------------------ call spans

    def traced(self, method: RpcMethod, fn: UnaryFn) -> UnaryFn:
        name = method.path[1:]
        attributes: Attributes = {
            "rpc.system": "grpc", "rpc.service": method.service, "rpc.method": method.name,
        }  # fmt: skip
        tracer = self._tracer

        async def call(request: Message, ctx: CallContext) -> Message:
            with tracer.start_as_current_span(
                name, context=_PROPAGATOR.extract(ctx.metadata, context=Context()),
                kind=SpanKind.SERVER, attributes=attributes, record_exception=False,
                set_status_on_exception=False,
            ) as span:  # fmt: skip
                span.set_attribute("apiary.transport", ctx.transport)
                try:
                    return await fn(request, ctx)
                except ApiaryError as exc:
                    _failed(span, exc.code, exc.message)
                    raise
                except Exception as exc:
                    span.record_exception(exc)
                    _failed(span, "internal_error", type(exc).__name__)
                    raise

        return call

    async def close(self) -> None:
        if self._owned:
            # Blocking: the batch processor exports what it holds (bounded by its timeout).
            await asyncio.to_thread(self._provider.shutdown)


@asynccontextmanager
async def open_tracing(settings: TracingSettings) -> AsyncIterator[OtelTracing]:
    """The coordinator's tracing per `settings` for the block; what is left is exported at
    its end."""
    tracing = OtelTracing.from_settings(settings)
    try:
        yield tracing
    finally:
        await tracing.close()
