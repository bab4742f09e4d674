"""Builds the grpc.aio server over the dispatcher: one generic handler per service.

Requests are decoded here rather than by grpc: bytes that are not the request message
answer INVALID_ARGUMENT validation_error through the same `_abort` as every other error,
with one log line, instead of grpc's UNKNOWN and a traceback per request.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from apiary.core.access.table import STANDARD_RULES
from apiary.errors import ValidationError
from apiary.server.context import CallContext
from apiary.server.dispatch import Dispatcher, Route
from apiary.server.errormap import answer_for, clip
from apiary.server.grpc.reflection import enable_reflection
from apiary.server.grpc.standard import GuardedHandlers
from apiary.server.metrics import Metrics
from apiary.wire.errordetail import ERROR_TRAILER, encode_error_detail
from apiary.wire.services import SERVICES

PEER_CERTIFICATE = "x509_pem_cert"
"""The auth-context property carrying the client certificate of an mTLS connection."""

log = logging.getLogger("apiary.server.grpc")


@dataclass(frozen=True, slots=True)
class Undecodable:
    """What the deserializer hands on for bytes that are not the request message: the
    handler answers it as a validation_error instead of grpc failing the call itself."""

    type_name: str
    reason: str

    def refusal(self, path: str) -> ValidationError:
        """The refusal, logged once (one line, no traceback: the client is at fault)."""
        log.warning("%s: undecodable %s refused (%s)", path, self.type_name, self.reason)
        return ValidationError.for_field(
            "request",
            f"the bytes are not a valid {self.type_name} ({self.reason}); send the request "
            "message serialized as protobuf",
            type=self.type_name,
        )


def request_decoder(request_type: type[Message]) -> Callable[[bytes], Message | Undecodable]:
    """A request deserializer that never raises: undecodable bytes become `Undecodable`."""
    type_name = request_type.DESCRIPTOR.full_name

    def decode(data: bytes) -> Message | Undecodable:
        try:
            return request_type.FromString(data)
        except Exception as exc:  # DecodeError, and whatever else a hostile buffer finds
            # "Error parsing message with type 'X': Wire format was corrupt": the cause only
            _, quoted, cause = str(exc).rpartition("': ")
            return Undecodable(type_name, clip(cause if quoted else type(exc).__name__, 120))

    return decode


async def _decoded(
    frames: AsyncIterator[Message | Undecodable], path: str
) -> AsyncIterator[Message]:
    """A client stream's frames; an undecodable one ends the call with its validation_error."""
    async for frame in frames:
        if isinstance(frame, Undecodable):
            raise frame.refusal(path)
        yield frame


def _context(ctx: grpc.aio.ServicerContext[Any, Any]) -> CallContext:
    metadata = {k.lower(): v for k, v in (ctx.invocation_metadata() or ()) if isinstance(v, str)}

    def certificate() -> bytes:
        found = ctx.auth_context().get(PEER_CERTIFICATE)
        return found[0] if found else b""

    return CallContext(
        transport="grpc", metadata=metadata, peer=ctx.peer() or "", peer_certificate=certificate,
        time_remaining=ctx.time_remaining,
    )  # fmt: skip


async def abort_call(
    ctx: grpc.aio.ServicerContext[Any, Any], exc: BaseException, path: str, metrics: Metrics
) -> None:
    answer = answer_for(exc, path)
    metrics.rpc_done("grpc", path, answer.code)
    detail = encode_error_detail(answer.code, answer.message, answer.details)
    await ctx.abort(
        grpc.StatusCode[answer.spec.grpc_status.name],
        f"{answer.code}: {answer.message}",
        trailing_metadata=((ERROR_TRAILER, detail),),
    )


def _unary(route: Route, metrics: Metrics) -> Callable[..., Any]:
    fn = route.unary()

    async def call(
        request: Message | Undecodable, ctx: grpc.aio.ServicerContext[Any, Any]
    ) -> Message:
        try:
            if isinstance(request, Undecodable):
                raise request.refusal(route.method.path)
            response = await fn(request, _context(ctx))
        except Exception as exc:
            await abort_call(ctx, exc, route.method.path, metrics)
            raise AssertionError("unreachable: abort raises") from exc
        metrics.rpc_done("grpc", route.method.path, "ok")
        return response

    return call


def _streaming(route: Route, metrics: Metrics) -> Callable[..., Any]:
    """Server-streaming and bidirectional methods: the handler takes the request (or the
    request iterator) as it comes and yields responses."""
    path = route.method.path
    fn: Callable[[Any, CallContext], AsyncIterator[Message]] = (
        route.bidi() if route.method.client_streaming else route.streaming()
    )

    async def refuse(undecodable: Undecodable) -> AsyncIterator[Message]:
        raise undecodable.refusal(path)
        yield  # pragma: no cover - makes this an async generator

    async def call(request: Any, ctx: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Message]:
        if route.method.client_streaming:
            items = fn(_decoded(request, path), _context(ctx))
        elif isinstance(request, Undecodable):
            items = refuse(request)
        else:
            items = fn(request, _context(ctx))
        try:
            async for item in items:
                yield item
        except Exception as exc:
            await abort_call(ctx, exc, route.method.path, metrics)
            return
        finally:
            # A client that goes away cancels this task between items: close the handler's
            # generator now, so that what it holds (a tool call's process) is released at
            # once rather than whenever the generator is collected.
            close = getattr(items, "aclose", None)
            if close is not None:
                await close()
        metrics.rpc_done("grpc", route.method.path, "ok")

    return call


def _generic_handlers(dispatcher: Dispatcher, metrics: Metrics) -> list[grpc.GenericRpcHandler]:
    handlers = []
    for service, methods in SERVICES.items():
        table = {}
        for method in methods:
            route = dispatcher.route(method.path)
            assert route is not None
            if method.client_streaming:
                make, wrap = grpc.stream_stream_rpc_method_handler, _streaming
            elif method.server_streaming:
                make, wrap = grpc.unary_stream_rpc_method_handler, _streaming
            else:
                make, wrap = grpc.unary_unary_rpc_method_handler, _unary
            table[method.name] = make(
                wrap(route, metrics),
                request_deserializer=request_decoder(method.request_type),
                response_serializer=method.response_type.SerializeToString,
            )
        handlers.append(grpc.method_handlers_generic_handler(service, table))
    return handlers


def build_grpc_server(
    dispatcher: Dispatcher, metrics: Metrics
) -> tuple[grpc.aio.Server, health.aio.HealthServicer]:
    """The server with every service, health (all SERVING once started) and reflection."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 20 * 1024 * 1024),
            ("grpc.max_send_message_length", 20 * 1024 * 1024),
        ]
    )
    server.add_generic_rpc_handlers(_generic_handlers(dispatcher, metrics))
    standard = _Collected()
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, standard)
    names = [*SERVICES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name]
    enable_reflection(standard, names)
    if dispatcher.guard is None:
        server.add_generic_rpc_handlers(standard.handlers)
    else:
        guarded = GuardedHandlers(
            standard.handlers, STANDARD_RULES, dispatcher.guard, _context,
            lambda ctx, exc, path: abort_call(ctx, exc, path, metrics),
        )  # fmt: skip
        server.add_generic_rpc_handlers([guarded])
    return server, health_servicer


class _Collected:
    """Takes the generic handlers grpcio's standard servicers add to a server, so that they
    can be served behind the guard (server/grpc/standard.py)."""

    def __init__(self) -> None:
        self.handlers: list[grpc.GenericRpcHandler] = []

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self.handlers.extend(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        """grpcio's generated code also registers the methods by name (a faster lookup); the
        generic handler it adds first serves the same methods, so these are not needed."""


async def set_serving(health_servicer: health.aio.HealthServicer, serving: bool) -> None:
    """Mark the whole server and every service SERVING or NOT_SERVING."""
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in ("", *SERVICES):
        await health_servicer.set(name, status)
