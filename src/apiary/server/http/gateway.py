"""HTTP/1.1 JSON gateway (RFC 5.1): POST /v1/{package.Service}/{Method}.

The body is the request message in the proto3 JSON mapping (bytes as base64); a top-level
`recipient` field, or the `sw4rm-recipient` header, addresses a SendMessage (DESIGN.md
section 4). Unary answers are the response message as JSON; server-streaming answers are
newline-delimited JSON, one message per line; every field without presence is printed, its
default included (`_to_json`). Errors answer the status of the error table with
`{"error": {"code", "message", "details"}}`.

Bodies are read strictly, so that nothing a client sends reaches a handler malformed or
answers 500: over MAX_BODY is oversize_payload (413); a body that is not JSON as
`core.json_reader` reads it (UTF-8, no NaN or Infinity, nesting within MAX_JSON_DEPTH, no
integer of more than 4300 digits) or holds a lone surrogate is validation_error; bytes fields
take base64 only (json_format alone drops characters outside the alphabet), and the error
names the field. docs/decisions.md, "JSON gateway", lists these limits.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import AsyncIterator
from typing import Any, cast

from aiohttp import web
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from apiary.core.json_reader import JsonError, read_document
from apiary.errors import NotFoundError, ValidationError
from apiary.server.context import RECIPIENT_KEY, CallContext
from apiary.server.dispatch import Dispatcher, Route
from apiary.server.errormap import answer_for, clip
from apiary.server.http.access import http_context
from apiary.server.http.errors import error_body, error_response, oversize_error
from apiary.server.metrics import UNKNOWN_METHOD, Metrics

MAX_BODY = 20 * 1024 * 1024
MAX_JSON_DEPTH = 100
"""Nesting of arrays and objects in a request body at most (the proto3 JSON parser's own
recursion limit; JSON a request carries inside a field meets `[limits] json_depth`)."""
UNKNOWN_RPC = UNKNOWN_METHOD
"""The metrics label of calls to methods that do not exist (what a client typed is never a
label: labels are kept for the life of the process)."""

_SURROGATE = re.compile(r"[\ud800-\udfff]")
_CONSTANT = re.compile(r"(-?Infinity|NaN) is not JSON")
_BASE64 = re.compile(r"[A-Za-z0-9+/_-]*")
_DECODE_FAILURES = (json_format.ParseError, ValueError, TypeError, OverflowError)


def _to_json(msg: Message) -> dict[str, Any]:
    """A response in the proto3 JSON mapping with every field shown, defaults included
    (`"accepted": false`, `"entries": []`, `"reason": ""`): an answer says what happened
    instead of leaving a client to know which absent fields mean false, zero or empty. Fields
    with presence (messages, oneofs, `optional`) still appear only when set."""
    return json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def _json_body(raw: bytes, where: str) -> Any:
    """A request body (or NDJSON line) as JSON read by `core.json_reader` within MAX_BODY
    and MAX_JSON_DEPTH, without lone surrogates (which no protobuf string can hold)."""
    try:
        # Within MAX_BODY always (the read answers 413 first): the limit is stated for the
        # reader, which refuses by it too.
        document = read_document(raw, max_bytes=MAX_BODY, max_depth=MAX_JSON_DEPTH, kept=False)
    except JsonError as exc:
        problem = clip(str(exc))
        constant = _CONSTANT.search(problem)
        if constant:
            problem += f'; proto3 JSON writes it as the string "{constant[1]}"'
        raise ValidationError.for_field(where, problem) from None
    _check_strings(document, where)
    return document


def _check_strings(document: Any, where: str) -> None:
    """Walk the document once (no recursion; the reader bounded its depth): every key and
    string valid text, the error naming the path of the first that is not."""
    stack: list[tuple[Any, str]] = [(document, where)]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                raise ValidationError.for_field(
                    clip(path), "holds a lone surrogate (half a UTF-16 pair); send valid Unicode"
                )
        elif isinstance(value, dict):
            for key, item in value.items():
                if _SURROGATE.search(key):
                    raise ValidationError.for_field(clip(path), "has a key with a lone surrogate")
                stack.append((item, f"{path}.{key}"))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(value))


def _field(descriptor: Descriptor, key: str) -> FieldDescriptor | None:
    found = descriptor.fields_by_name.get(key)
    if found is not None:
        return found
    return next((f for f in descriptor.fields if f.json_name == key), None)


def _check_base64(descriptor: Descriptor, body: object, path: str) -> None:
    """Every bytes field of `body` (the proto3 JSON of a `descriptor` message) is base64,
    standard or URL-safe, padded or not, and nothing else: json_format's own decoder drops
    characters outside the alphabet, so a typo would otherwise arrive as other bytes."""
    if not isinstance(body, dict):
        return
    for key, value in body.items():
        field = _field(descriptor, key)
        if field is None:
            continue  # json_format names unknown fields itself
        name = f"{path}.{field.name}" if path else field.name
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            target = field.message_type.fields_by_name["value"]
            items = list(value.items()) if isinstance(value, dict) else []
            for map_key, item in items:
                _check_value(target, item, f"{name}[{clip(str(map_key), 40)!r}]")
        elif field.is_repeated and isinstance(value, list):
            for index, item in enumerate(value):
                _check_value(field, item, f"{name}[{index}]")
        else:
            _check_value(field, value, name)


def _check_value(field: FieldDescriptor, value: object, name: str) -> None:
    if field.message_type is not None:
        _check_base64(field.message_type, value, name)
        return
    if field.type != FieldDescriptor.TYPE_BYTES or not isinstance(value, str):
        return  # not bytes, or not a string: json_format refuses the type itself
    if not _is_base64(value):
        raise ValidationError.for_field(
            name,
            f"is not base64 ({clip(value, 24)!r}); encode the bytes with the standard or "
            "URL-safe base64 alphabet",
        )


def _is_base64(text: str) -> bool:
    core = text.rstrip("=")
    padding = len(text) - len(core)
    if not _BASE64.fullmatch(core) or len(core) % 4 == 1 or padding > 2:
        return False
    if padding and (len(text) % 4 or padding != -len(core) % 4):
        return False
    standard = core.replace("-", "+").replace("_", "/")
    try:
        base64.b64decode(standard + "=" * (-len(core) % 4), validate=True)
    except binascii.Error:
        return False
    return True


def _message(route: Route, body: object, where: str) -> Message:
    if not isinstance(body, dict):
        raise ValidationError(f"{where} must be a JSON object", {"field": "body"})
    message = route.method.request_type()
    _check_base64(cast(Descriptor, route.method.request_type.DESCRIPTOR), body, "")
    try:
        json_format.ParseDict(body, message)
    except _DECODE_FAILURES as exc:
        raise ValidationError(f"{where}: {clip(str(exc), 400)}", {"field": "body"}) from None
    return message


async def _read_body(request: web.Request) -> bytes:
    """The request body; over MAX_BODY it is oversize_payload (413), not aiohttp's raise."""
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise oversize_error(MAX_BODY) from None


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
        label = path
        try:
            route = self._dispatcher.route(path)
            if route is None:
                label = UNKNOWN_RPC
                raise NotFoundError(
                    f"no RPC {clip(path)}; GET /v1 lists every method", {"path": clip(path)}
                )
            if route.method.client_streaming:
                frames, ctx = await self._parse_frames(request, route)
                return await self._stream(request, route, route.bidi()(frames, ctx))
            message, ctx = await self._parse(request, route)
            if route.method.server_streaming:
                return await self._stream(request, route, route.streaming()(message, ctx))
            response = _to_json(await route.unary()(message, ctx))
        except Exception as exc:
            return error_response(exc, label, self._metrics)
        self._metrics.rpc_done("http", path, "ok")
        return web.json_response(response)

    async def _parse_frames(
        self, request: web.Request, route: Route
    ) -> tuple[AsyncIterator[Message], CallContext]:
        """A client-streaming call over HTTP/1.1: one request message per NDJSON line."""
        lines = [ln for ln in (await _read_body(request)).splitlines() if ln.strip()]
        messages = []
        for number, line in enumerate(lines, 1):
            body = _json_body(line, f"line {number}")
            messages.append(_message(route, body, f"line {number}"))

        async def frames() -> AsyncIterator[Message]:
            for message in messages:
                yield message

        return frames(), self._context(request, {})

    def _context(self, request: web.Request, metadata: dict[str, str]) -> CallContext:
        return http_context(request, metadata)

    async def _parse(self, request: web.Request, route: Route) -> tuple[Message, CallContext]:
        raw = await _read_body(request)
        body = _json_body(raw, "body") if raw.strip() else {}
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
            await response.write((json.dumps(error_body(answer)) + "\n").encode())
        finally:
            await items.aclose()  # type: ignore[attr-defined]
        await response.write_eof()
        return response
