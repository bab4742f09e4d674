"""HTTP/1.1 JSON gateway (RFC 5.1): POST /v1/{package.Service}/{Method}.

The body is the request message in the proto3 JSON mapping (bytes as base64); a top-level
`recipient` field, or the `sw4rm-recipient` header, addresses a SendMessage (DESIGN.md
section 4). Unary answers are the response message as JSON; server-streaming answers are
newline-delimited JSON, one message per line. Errors answer the status of the error table
with `{"error": {"code", "message", "details"}}`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import Message

from apiary.errors import NotFoundError, ValidationError
from apiary.server.context import RECIPIENT_KEY, CallContext
from apiary.server.dispatch import Dispatcher, Route
from apiary.server.errormap import answer_for
from apiary.server.http.access import http_context
from apiary.server.http.errors import error_response
from apiary.server.metrics import Metrics

MAX_BODY = 20 * 1024 * 1024


def _to_json(msg: Message) -> dict[str, Any]:
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def _message(route: Route, body: object, where: str) -> Message:
    if not isinstance(body, dict):
        raise ValidationError(f"{where} must be a JSON object", {"field": "body"})
    message = route.method.request_type()
    try:
        json_format.ParseDict(body, message)
    except json_format.ParseError as exc:
        raise ValidationError(f"{where}: {exc}", {"field": "body"}) from None
    return message


class JsonGateway:
    def __init__(self, dispatcher: Dispatcher, metrics: Metrics) -> None:
        self._dispatcher = dispatcher
        self._metrics = metrics

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1", self.list_methods)
        app.router.add_post("/v1/{service}/{method}", self.call)

    async def list_methods(self, request: web.Request) -> web.Response:
        methods = [
            {
                "path": f"/v1/{r.method.service}/{r.method.name}",
                "service": r.method.service,
                "method": r.method.name,
                "server_streaming": r.method.server_streaming,
                "implemented": r.implemented,
            }
            for r in self._dispatcher.routes()
        ]
        return web.json_response({"methods": methods})

    async def call(self, request: web.Request) -> web.StreamResponse:
        path = f"/{request.match_info['service']}/{request.match_info['method']}"
        try:
            route = self._dispatcher.route(path)
            if route is None:
                raise NotFoundError(f"no RPC {path}", {"path": path})
            if route.method.client_streaming:
                frames, ctx = await self._parse_frames(request, route)
                return await self._stream(request, route, route.bidi()(frames, ctx))
            message, ctx = await self._parse(request, route)
            if route.method.server_streaming:
                return await self._stream(request, route, route.streaming()(message, ctx))
            response = await route.unary()(message, ctx)
        except Exception as exc:
            return error_response(exc, path, self._metrics)
        self._metrics.rpc_done("http", path, "ok")
        return web.json_response(_to_json(response))

    async def _parse_frames(
        self, request: web.Request, route: Route
    ) -> tuple[AsyncIterator[Message], CallContext]:
        """A client-streaming call over HTTP/1.1: one request message per NDJSON line."""
        lines = [ln for ln in (await request.read()).splitlines() if ln.strip()]
        messages = []
        for number, line in enumerate(lines, 1):
            try:
                body = json.loads(line)
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ValidationError(
                    f"line {number} is not JSON: {exc}", {"field": "body"}
                ) from None
            messages.append(_message(route, body, f"line {number}"))

        async def frames() -> AsyncIterator[Message]:
            for message in messages:
                yield message

        return frames(), self._context(request, {})

    def _context(self, request: web.Request, metadata: dict[str, str]) -> CallContext:
        return http_context(request, metadata)

    async def _parse(self, request: web.Request, route: Route) -> tuple[Message, CallContext]:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw.strip() else {}
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValidationError(f"request body is not JSON: {exc}", {"field": "body"}) from None
        if not isinstance(body, dict):
            raise ValidationError("request body must be a JSON object", {"field": "body"})
        metadata: dict[str, str] = {}
        recipient = body.pop("recipient", None)
        if recipient is not None:
            if not isinstance(recipient, str):
                raise ValidationError("recipient must be a string", {"field": "recipient"})
            metadata[RECIPIENT_KEY] = recipient
        return _message(route, body, "body"), self._context(request, metadata)

    async def _stream(
        self, request: web.Request, route: Route, items: AsyncIterator[Message]
    ) -> web.StreamResponse:
        # Pull the first item before committing to a 200, so that an immediate error
        # (unknown agent, bad argument) still answers with its own status.
        first = await anext(items, None)
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        try:
            item = first
            while item is not None:
                line = json.dumps(_to_json(item), separators=(",", ":")) + "\n"
                await response.write(line.encode())
                item = await anext(items, None)
        except Exception as exc:
            answer = answer_for(exc, route.method.path)
            err = {"error": {"code": answer.code, "message": answer.message}}
            await response.write((json.dumps(err) + "\n").encode())
        finally:
            await items.aclose()  # type: ignore[attr-defined]
        await response.write_eof()
        return response
