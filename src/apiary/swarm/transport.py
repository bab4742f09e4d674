"""The HTTP transport: the protocol's four endpoints on aiohttp, mountable on any
Application (the coordinator's HTTP app, or a TLS listener of its own).

    POST {prefix}/message   200 {"status":"queued","message_id"} (also for a muted drop)
    POST {prefix}/join      200 accepted with the members, 202 pending approval
    GET  {prefix}/health    200 {"status":"healthy",...}
    GET  {prefix}/info      200 agent_id, endpoint, public_key, protocol_version, ...

Refusals are the protocol's error object with its status: 400 naming the field of a
malformed body (never 422), 401 bad signature, 403, 404 unknown swarm, 413 for a body over
MAX_BODY (aiohttp's own refusal included), 429 with Retry-After in seconds. This is the one
place where exceptions become HTTP answers: anything that is not a SwarmError is logged and
answered 500 INTERNAL_ERROR without details.

aiohttp serves HTTP/1.1 only (with TLS, ALPN offers http/1.1): the protocol prefers HTTP/3
and accepts HTTP/2, which a terminating proxy in front provides (docs/swarm.md).
"""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from apiary.core.json_reader import read_json
from apiary.errors import ValidationError
from apiary.swarm.errors import SwarmError, invalid, too_large
from apiary.swarm.node import SwarmNode

log = logging.getLogger("apiary.swarm.transport")

MAX_BODY = 1024 * 1024
"""A swarm message is text; a megabyte is plenty and bounds what a peer can make us read."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(exc: SwarmError) -> web.Response:
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.status == 429 else None
    return web.json_response(exc.to_json(), status=exc.status, headers=headers)


def _guarded(handler: Handler) -> Handler:
    async def guarded(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except SwarmError as exc:
            return _error(exc)
        except web.HTTPException:
            raise
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            body = {"error": {"code": "INTERNAL_ERROR", "message": "internal error"}}
            return web.json_response(body, status=500)

    return guarded


async def _body(request: web.Request) -> Any:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:  # over the app's client_max_size
        raise too_large("body", MAX_BODY) from None
    if len(raw) > MAX_BODY:  # mounted on an app that takes larger bodies (the coordinator's)
        raise too_large("body", MAX_BODY)
    try:
        # One reader for every JSON a client sends: UTF-8, bounded depth and size, no NUL,
        # numbers that stay finite (a deep or huge document answered 500 before).
        return read_json(raw, "body", max_bytes=MAX_BODY)
    except ValidationError as exc:
        raise invalid("body", exc.message) from None


@dataclass(frozen=True, slots=True)
class SwarmRoutes:
    node: SwarmNode

    async def message(self, request: web.Request) -> web.StreamResponse:
        answer = await self.node.reception.message(await _body(request), request.headers)
        return web.json_response(answer)

    async def join(self, request: web.Request) -> web.StreamResponse:
        status, answer = await self.node.reception.join(
            await _body(request), request.remote or "unknown"
        )
        return web.json_response(answer, status=status)

    async def health(self, _: web.Request) -> web.StreamResponse:
        return web.json_response(self.node.health())

    async def info(self, _: web.Request) -> web.StreamResponse:
        return web.json_response(self.node.info())


def add_swarm_routes(app: web.Application, node: SwarmNode, prefix: str = "/swarm") -> None:
    """Serve `node` under `prefix` of `app` (the endpoint's path: https://host/swarm)."""
    routes = SwarmRoutes(node)
    prefix = prefix.rstrip("/")
    app.router.add_post(f"{prefix}/message", _guarded(routes.message))
    app.router.add_post(f"{prefix}/join", _guarded(routes.join))
    app.router.add_get(f"{prefix}/health", _guarded(routes.health))
    app.router.add_get(f"{prefix}/info", _guarded(routes.info))


def swarm_app(node: SwarmNode, prefix: str = "/swarm") -> web.Application:
    app = web.Application(client_max_size=MAX_BODY)
    add_swarm_routes(app, node, prefix)
    return app


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: a free one), bound before the endpoint is known."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


@asynccontextmanager
async def open_swarm_server(
    app: web.Application, sock: socket.socket, ssl_context: ssl.SSLContext | None
) -> AsyncIterator[tuple[str, int]]:
    """Serve `app` on `sock` (HTTPS with `ssl_context`) for the duration of the block;
    yields the bound (host, port)."""
    runner = web.AppRunner(app, shutdown_timeout=2.0, access_log=None)
    await runner.setup()
    try:
        await web.SockSite(runner, sock, ssl_context=ssl_context).start()
        host, port = sock.getsockname()[:2]
        yield host, port
    finally:
        await runner.cleanup()
