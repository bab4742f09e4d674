"""The one dispatcher boundary between transports and service handlers.

Each canonical service has one handler object whose snake_case coroutine methods take the
request message and a CallContext (server-streaming methods are async generators). The
gRPC server and the JSON gateway both route through `Dispatcher`, so a method behaves the
same on either transport. Methods whose handler is not built yet answer `unimplemented`
naming the area that owns them.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

from google.protobuf.message import Message

from apiary.core.access.rules import Rule
from apiary.core.access.table import METHOD_RULES
from apiary.errors import ApiaryError, UnimplementedError
from apiary.server.auth.guard import AccessGuard
from apiary.server.context import CallContext
from apiary.wire.services import SERVICES, RpcMethod

UnaryFn = Callable[[Message, CallContext], Awaitable[Message]]
StreamFn = Callable[[Message, CallContext], AsyncIterator[Message]]
BidiFn = Callable[[AsyncIterator[Message], CallContext], AsyncIterator[Message]]


REFUSED_STREAM_FRAMES = 4
REFUSED_STREAM_WAIT_S = 0.5


def snake_case(name: str) -> str:
    """'SendMessage' -> 'send_message'."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


@dataclass(frozen=True, slots=True)
class Route:
    """A method and the callable that serves it."""

    method: RpcMethod
    fn: UnaryFn | StreamFn | BidiFn
    implemented: bool

    def unary(self) -> UnaryFn:
        return cast(UnaryFn, self.fn)

    def streaming(self) -> StreamFn:
        return cast(StreamFn, self.fn)

    def bidi(self) -> BidiFn:
        return cast(BidiFn, self.fn)


def _unimplemented(method: RpcMethod) -> UnaryFn | StreamFn | BidiFn:
    text = f"{method.service}/{method.name} is not implemented by this coordinator"

    if method.server_streaming:

        async def stream(_req: object, _ctx: CallContext) -> AsyncIterator[Message]:
            raise UnimplementedError(text, {"method": method.path})
            yield  # pragma: no cover - makes this an async generator

        return stream

    async def unary(_req: Message, _ctx: CallContext) -> Message:
        raise UnimplementedError(text, {"method": method.path})

    return unary


class CallTracing(Protocol):
    def traced(self, method: RpcMethod, fn: UnaryFn) -> UnaryFn:
        """`fn` within a span of the call, continuing the trace context the call's metadata
        (or HTTP headers) carry (docs/tracing.md)."""
        ...


class TenantHandlers(Protocol):
    async def open(self, ctx: CallContext, tenant: str) -> None:
        """Open the engine of the tenant the call acts in (a tenant's first call), so that
        its decision is recorded in its own log."""
        ...

    async def route(
        self, ctx: CallContext, method: str, request: object | None
    ) -> Mapping[str, object] | None:
        """The handlers of the tenant the call acts in, None for the default tenant's (the
        dispatcher's own), once the tenant's quota allows the call."""
        ...


def _guarded(
    method: RpcMethod, rule: Rule, fn: Any, guard: AccessGuard, tenants: TenantHandlers | None
) -> Any:
    """`fn` behind the guard: the call is decided before the handler runs (a client stream
    when it opens, then frame by frame), the handler's context carries the principal, and
    the handler is that of the principal's tenant."""
    path = method.path
    name = snake_case(method.name)

    async def enter(ctx: CallContext, request: object | None) -> tuple[CallContext, Any]:
        """Who calls, in which tenant, whether it may: the context and the handler."""
        ctx, tenant = guard.authenticate(path, ctx)
        if tenants is not None:
            await tenants.open(ctx, tenant)
        await guard.check(path, rule, request, ctx, tenant)
        handlers = await tenants.route(ctx, path, request) if tenants is not None else None
        if handlers is None:
            return ctx, fn
        return ctx, getattr(handlers.get(method.service), name, None) or _unimplemented(method)

    if method.client_streaming:

        async def bidi(frames: AsyncIterator[Message], ctx: CallContext) -> AsyncIterator[Message]:
            try:
                ctx, handler = await enter(ctx, None)
            except ApiaryError:
                await _settle(frames)
                raise
            async for item in handler(guard.frames(path, rule, frames, ctx), ctx):
                yield item

        return bidi
    if method.server_streaming:

        async def stream(request: Message, ctx: CallContext) -> AsyncIterator[Message]:
            ctx, handler = await enter(ctx, request)
            async for item in handler(request, ctx):
                yield item

        return stream

    async def unary(request: Message, ctx: CallContext) -> Message:
        ctx, handler = await enter(ctx, request)
        return await handler(request, ctx)  # type: ignore[no-any-return]

    return unary


async def _settle(frames: AsyncIterator[Message]) -> None:
    """Read and drop what a refused client stream's caller is still sending (at most
    REFUSED_STREAM_FRAMES frames, each bounded by the transport's message limit, for at most
    REFUSED_STREAM_WAIT_S): a gRPC client whose request is still being written when the
    stream closes reports the refusal as `internal`, not as the refusal it was."""
    count = 0
    try:
        async with asyncio.timeout(REFUSED_STREAM_WAIT_S):
            async for _frame in frames:
                count += 1
                if count >= REFUSED_STREAM_FRAMES:
                    return
    except (TimeoutError, ApiaryError):
        return


class Dispatcher:
    """Routes every served method to its handler (or to an `unimplemented` answer), each
    behind the access guard when there is one: every method has a rule in
    core/access/table.py, or the dispatcher refuses to be built. With `tracing`, each unary
    call is a span (streams are not: they last as long as their clients)."""

    def __init__(
        self,
        handlers: Mapping[str, object],
        guard: AccessGuard | None = None,
        tenants: TenantHandlers | None = None,
        *,
        tracing: CallTracing | None = None,
    ) -> None:
        unknown = set(handlers) - set(SERVICES)
        if unknown:
            raise ValueError(f"handlers for unknown services: {sorted(unknown)}")
        unruled = [m.path for ms in SERVICES.values() for m in ms if m.path not in METHOD_RULES]
        if unruled:
            raise ValueError(f"methods without an authorization rule: {unruled}")
        self.guard = guard
        """The guard the calls are decided by (gRPC's standard services too), if any."""
        self._routes: dict[str, Route] = {}
        for service, methods in SERVICES.items():
            handler = handlers.get(service)
            for method in methods:
                fn: Any = getattr(handler, snake_case(method.name), None) if handler else None
                implemented = fn is not None
                if not implemented:
                    fn = _unimplemented(method)
                if guard is not None:
                    fn = _guarded(method, METHOD_RULES[method.path], fn, guard, tenants)
                if tracing is not None and not (method.server_streaming or method.client_streaming):
                    fn = tracing.traced(method, fn)
                self._routes[method.path] = Route(method, fn, implemented)

    def route(self, path: str) -> Route | None:
        """The route for '/package.Service/Method', or None if no such method exists."""
        return self._routes.get(path)

    def routes(self) -> list[Route]:
        return list(self._routes.values())
