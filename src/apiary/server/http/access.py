"""Every HTTP route behind the same checks (DESIGN.md section 9): a browser's cross-site or
rebound-DNS request is refused on every route (GET and server-sent events included), and
each route's rule (core/access/table.py HTTP_RULES) is decided by the access guard before its
handler runs. Gateway calls are then decided per method by the dispatcher's guard."""

from __future__ import annotations

import ssl
import urllib.parse
from collections.abc import Awaitable, Callable
from functools import partial

from aiohttp import web
from aiohttp.typedefs import Middleware

from apiary.core.access.principal import DEFAULT_TENANT, Mechanism
from apiary.core.access.rules import Rule, Who
from apiary.core.access.table import HTTP_RULES
from apiary.errors import PermissionDeniedError
from apiary.server.auth.guard import AccessGuard
from apiary.server.config.address import is_loopback_host
from apiary.server.context import CallContext
from apiary.server.http.errors import error_response, route_label
from apiary.server.metrics import Metrics

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Recheck = Callable[[], object]
RECHECK: web.RequestKey[Recheck] = web.RequestKey("apiary.access.recheck")
"""Decides the request again (raising its refusal): a long-lived response (the event
stream) ends when the credential it was opened with is revoked or expires."""
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def route_key(request: web.Request) -> str | None:
    """'GET /console/{name}': the rule table's key of the route `request` matched."""
    route = request.match_info.route
    resource = route.resource
    if resource is None:
        return None
    method = "GET" if request.method == "HEAD" else request.method
    return f"{method} {resource.canonical}"


def http_context(request: web.Request, metadata: dict[str, str] | None = None) -> CallContext:
    """The call context of an HTTP request: headers as metadata, the client certificate."""
    headers = {k.lower(): v for k, v in request.headers.items()}
    transport = request.transport

    def certificate() -> bytes:
        ssl_object = transport.get_extra_info("ssl_object") if transport else None
        if not isinstance(ssl_object, ssl.SSLObject):
            return b""
        der = ssl_object.getpeercert(binary_form=True)
        return ssl.DER_cert_to_PEM_cert(der).encode() if der else b""

    return CallContext(
        transport="http", metadata={**headers, **(metadata or {})}, peer=request.remote or "",
        peer_certificate=certificate,
    )  # fmt: skip


def access_middleware(guard: AccessGuard | None, metrics: Metrics) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        key = route_key(request)
        try:
            check_same_origin(request)
            if key is not None:
                rule = HTTP_RULES.get(key)
                if rule is None:
                    raise PermissionDeniedError(f"{key} has no authorization rule", {"route": key})
                if guard is not None:
                    opened = http_context(request)
                    ctx = guard.admit(key, rule, None, opened)
                    _default_tenant_only(key, rule, ctx)
                    if ctx.principal.mechanism is not Mechanism.AGENT_PROOF:
                        # (a per-call proof is good once: it vouched for the opening)
                        recheck: Recheck = partial(guard.admit, key, rule, None, opened, again=True)
                        request[RECHECK] = recheck
        except Exception as exc:
            return error_response(exc, key or route_label(request), metrics)
        return await handler(request)

    return middleware


def _default_tenant_only(key: str, rule: Rule, ctx: CallContext) -> None:
    """The console's data, the event stream and /metrics read the default tenant's engine:
    another tenant's operator is refused them (its data is reached per call, through the
    gateway and gRPC, in its own tenant)."""
    if rule.who is Who.PUBLIC or ctx.tenant() == DEFAULT_TENANT:
        return
    raise PermissionDeniedError(
        f"{key} serves the {DEFAULT_TENANT} tenant; {ctx.principal.label} reads its own "
        "tenant through the gateway (POST /v1/...) or gRPC",
        {"route": key, "principal": ctx.principal.label},
    )


def check_same_origin(request: web.Request) -> None:
    """Refuse a browser's cross-site request: a page on another site must not make an
    operator's browser call the coordinator (CSRF) or read from it, nor a rebound DNS name
    reach a loopback one. Clients that are not browsers send no Origin and are unaffected;
    on loopback a Host that is not a loopback name is refused whatever the Origin."""
    host = request.headers.get("Host", "")
    name = urllib.parse.urlsplit(f"//{host}").hostname or ""
    if _on_loopback(request) and host and name not in LOOPBACK_NAMES:
        raise PermissionDeniedError(
            f"this loopback coordinator was reached as {host!r} (DNS rebinding?); use "
            "localhost or 127.0.0.1",
            {"host": host, "reason": "not_loopback_host"},
        )
    origin = request.headers.get("Origin")
    if origin is not None and urllib.parse.urlsplit(origin).netloc != host:
        raise PermissionDeniedError(
            f"cross-site request from {origin} refused (this is {host})",
            {"origin": origin, "reason": "cross_site"},
        )


def _on_loopback(request: web.Request) -> bool:
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    if not sockname:
        return False
    return is_loopback_host(str(sockname[0]))
