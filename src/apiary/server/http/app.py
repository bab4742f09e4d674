"""The coordinator's HTTP application: /healthz, /readyz, /metrics, the JSON gateway, the
runtime control plane (runtime.py) and the operator console (console.py)."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from apiary import __version__
from apiary.server.auth.guard import AccessGuard
from apiary.server.control_plane import ControlPlanes
from apiary.server.dispatch import Dispatcher, TenantHandlers
from apiary.server.http.access import access_middleware
from apiary.server.http.console import ConsoleSources, add_console_routes
from apiary.server.http.errors import error_middleware
from apiary.server.http.gateway import MAX_BODY, JsonGateway
from apiary.server.http.request_head import METRICS_KEY, head_limits_middleware
from apiary.server.http.runtime import RuntimeRoutes
from apiary.server.metrics import CONTENT_TYPE, Metrics

OWN_ERROR_FORMAT = ("/swarm/",)
"""Routes that answer in their own protocol's error object (the swarm endpoint, mounted
under /swarm): the error middleware leaves their answers as they are."""


def build_http_app(
    dispatcher: Dispatcher,
    metrics: Metrics,
    is_ready: Callable[[], bool],
    console: ConsoleSources | None = None,
    guard: AccessGuard | None = None,
    *,
    runtime: ControlPlanes | None = None,
    tenancy: TenantHandlers | None = None,
) -> web.Application:
    """The HTTP app; the console reads `console` (without it, its data panels answer 503).
    Every route is behind the access middleware (same-origin checks, the route's rule), and
    every error, aiohttp's own refusals included (404, 405, 413), answers in the one JSON
    error shape (errors.py); a request target or header field over its limit is refused
    first (request_head.py, whose runner also answers what aiohttp's parser refuses). The
    runtime control plane's commands run on `runtime` (without it they answer
    unavailable), each in the tenant of its call (`tenancy`)."""
    middlewares = [
        head_limits_middleware(metrics),
        error_middleware(metrics, MAX_BODY, OWN_ERROR_FORMAT),
        access_middleware(guard, metrics),
    ]
    app = web.Application(client_max_size=MAX_BODY, middlewares=middlewares)
    app[METRICS_KEY] = metrics

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "version": __version__})

    async def readyz(_: web.Request) -> web.Response:
        ready = is_ready()
        return web.json_response(
            {"status": "ready" if ready else "not ready"}, status=200 if ready else 503
        )

    async def metrics_page(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_page)
    JsonGateway(dispatcher, metrics).add_routes(app)
    RuntimeRoutes(runtime, metrics, guard, tenancy).add_routes(app)
    add_console_routes(app, console or ConsoleSources(None))
    return app
