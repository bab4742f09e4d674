"""The one JSON error shape of every HTTP route: `{"error": {"code", "message", "details"}}`
with the status of the error table and the protocol's snake_case codes (the tool codes the
RFC writes in upper case, NOT_FOUND or CANCELLED, are spelled not_found and cancelled here:
`apiary.errors.lookup_code` reads either spelling back).

`error_middleware` puts aiohttp's own refusals in the same shape: an unknown route (404), a
method the route does not serve (405, with its Allow header), a body over the limit (413),
and anything a handler let escape (internal_error, logged once). Routes that answer in a
protocol error object of their own (the swarm endpoint) are left as they answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from apiary.errors import (
    ApiaryError,
    NotFoundError,
    OversizePayloadError,
    PermissionDeniedError,
    UnauthenticatedError,
    UnsupportedMessageTypeError,
    ValidationError,
)
from apiary.server.errormap import ErrorAnswer, answer_for, clip
from apiary.server.metrics import UNKNOWN_METHOD, Metrics

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_body(answer: ErrorAnswer) -> dict[str, Any]:
    """The JSON error object of `answer` (also one line of a failed NDJSON stream)."""
    return {
        "error": {"code": answer.code.lower(), "message": answer.message, "details": answer.details}
    }


def error_response(
    exc: BaseException,
    where: str,
    metrics: Metrics | None = None,
    *,
    status: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """`exc` answered in the one JSON shape; `status` overrides the table's (405)."""
    answer = answer_for(exc, where)
    if metrics is not None:
        metrics.rpc_done("http", where, answer.code)
    return web.json_response(
        error_body(answer), status=status or answer.spec.http_status, headers=headers
    )


def oversize_error(limit: int) -> OversizePayloadError:
    """The refusal of a request body over `limit` bytes (413)."""
    return OversizePayloadError(
        f"body: larger than this server's limit of {limit} bytes; send large payloads over "
        "gRPC or split them",
        {"field": "body", "limit": str(limit)},
    )


def refusal_for(
    exc: web.HTTPException, request: web.Request, max_body: int
) -> tuple[ApiaryError, int]:
    """The protocol error for one of aiohttp's own 4xx refusals, and the status to answer
    with (the table's, except 405: "this route, another method" says more than a 400)."""
    target = f"{request.method} {clip(request.path)}"
    status = exc.status
    if status == 404:
        return NotFoundError(
            f"no route {target}; the gateway serves POST /v1/<package.Service>/<Method> "
            "(GET /v1 lists them)",
            {"route": target},
        ), 404
    if status == 405:
        allowed = exc.headers.get("Allow", "")
        return ValidationError.for_field(
            "method", f"{target} is not served; use {allowed or 'another method'}",
            allowed=allowed,
        ), 405  # fmt: skip
    if status == 413:
        return oversize_error(max_body), 413
    kinds: dict[int, type[ApiaryError]] = {
        401: UnauthenticatedError,
        403: PermissionDeniedError,
        415: UnsupportedMessageTypeError,
    }
    refusal = kinds.get(status, ValidationError)(f"{target}: {exc.reason}", {"route": target})
    return refusal, status


def route_label(request: web.Request) -> str:
    """The route a request matched as its canonical pattern (a bounded set: metrics labels
    and log lines never carry what a client typed as a path)."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else UNKNOWN_METHOD


def error_middleware(
    metrics: Metrics, max_body: int, own_errors: tuple[str, ...] = ()
) -> Middleware:
    """Every refusal and escaped exception as the one JSON error; the routes under
    `own_errors` (path prefixes) answer in their own protocol's error object and are left
    alone (a path there that matches no route is still this shape's 404)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        routed = request.match_info.route.resource is not None
        if routed and own_errors and request.path.startswith(own_errors):
            return await handler(request)
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise  # redirects and the like are answers, not errors
            if exc.status >= 500:  # a fault of ours, whoever raised it: internal_error
                return error_response(exc, route_label(request), metrics)
            error, status = refusal_for(exc, request, max_body)
            headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
            return error_response(
                error, route_label(request), metrics, status=status, headers=headers
            )
        except ConnectionError:
            raise  # the client went away: there is no one to answer
        except Exception as exc:
            return error_response(exc, route_label(request), metrics)

    return middleware
