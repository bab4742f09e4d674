"""gRPC's standard services (grpc.health.v1, server reflection) behind the access guard.

They are grpcio's own servicers, not routes of the dispatcher, so their handlers are wrapped
here: each call is decided by its rule in core/access/table.py STANDARD_RULES before the
servicer sees it, and a refusal answers as every other refusal does (status, error code,
error-detail trailer). A method of these services without a rule is refused outright."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import grpc

from apiary.core.access.rules import Rule
from apiary.errors import PermissionDeniedError
from apiary.server.auth.guard import AccessGuard
from apiary.server.context import CallContext

Abort = Callable[["grpc.aio.ServicerContext[Any, Any]", BaseException, str], Any]
ContextOf = Callable[["grpc.aio.ServicerContext[Any, Any]"], CallContext]
_BEHAVIOURS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


class GuardedHandlers(grpc.GenericRpcHandler):  # type: ignore[misc]
    """`handlers` (grpcio's generic handlers of standard services) with each call decided by
    `rules` first."""

    def __init__(
        self,
        handlers: list[grpc.GenericRpcHandler],
        rules: Mapping[str, Rule],
        guard: AccessGuard,
        context_of: ContextOf,
        abort: Abort,
    ) -> None:
        self._handlers = handlers
        self._rules = rules
        self._guard = guard
        self._context_of = context_of
        self._abort = abort

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        path: str = handler_call_details.method
        for handlers in self._handlers:
            found = handlers.service(handler_call_details)
            if found is not None:
                return self._wrapped(path, found)
        return None

    def _wrapped(self, path: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        rule = self._rules.get(path)
        changes = {
            name: self._guarded(path, rule, behaviour)
            for name in _BEHAVIOURS
            if (behaviour := getattr(handler, name)) is not None
        }
        return handler._replace(**changes)

    def _admit(self, path: str, rule: Rule | None, ctx: grpc.aio.ServicerContext[Any, Any]) -> None:
        if rule is None:
            raise PermissionDeniedError(f"{path} has no authorization rule", {"action": path})
        self._guard.admit(path, rule, None, self._context_of(ctx))

    def _guarded(self, path: str, rule: Rule | None, behaviour: Any) -> Any:
        if inspect.isasyncgenfunction(behaviour):

            async def stream(
                request: Any, ctx: grpc.aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                try:
                    self._admit(path, rule, ctx)
                except Exception as exc:
                    await self._abort(ctx, exc, path)
                    return
                async for item in behaviour(request, ctx):
                    yield item

            return stream

        async def call(request: Any, ctx: grpc.aio.ServicerContext[Any, Any]) -> Any:
            try:
                self._admit(path, rule, ctx)
            except Exception as exc:
                await self._abort(ctx, exc, path)
                raise AssertionError("unreachable: abort raises") from exc
            return await behaviour(request, ctx)

        return call
