"""The bounds of an HTTP/1.1 request's head (request line and header fields) and the answers
to a head that breaks them, or HTTP/1.1 itself, in the one JSON error shape (errors.py).

Two layers, one answer. `head_limits_middleware` holds every request to the documented
limits (`MAX_TARGET_BYTES`, `MAX_FIELD_BYTES`) and names what is too long: 414 for the
request target, 431 for a header field, `validation_error` either way. aiohttp's parser runs
before any middleware and refuses a head it cannot parse itself; it is given caps above the
documented limits (so the middleware, which can name the header, decides near them) and its
refusals are answered by `JsonRefusingAppRunner`'s request handler in the same shape and
status: past the caps, too many header fields (431), a malformed request line or header
(400). Such a refusal closes the connection (the parser cannot resynchronise); the server
serves the next one.

The handler hook is aiohttp's `RequestHandler.handle_error`, installed through
`AppRunner._make_server` (not public API: pyproject.toml bounds aiohttp's version and
tests/server/test_request_head.py fails if the hook stops answering).
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.typedefs import Middleware
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from apiary.errors import ApiaryError, DeadlineExceededError, InternalError, ValidationError
from apiary.server.errormap import clip
from apiary.server.http.errors import Handler, error_response, route_label
from apiary.server.metrics import UNKNOWN_METHOD, Metrics

log = logging.getLogger(__name__)

MAX_TARGET_BYTES = 8190
"""The longest request target (path and query) answered; longer is 414 naming
`request_target` (aiohttp's default line limit, kept)."""
MAX_FIELD_BYTES = 8190
"""The longest header field (name and value together) answered; longer is 431 naming the
header (aiohttp's default field limit, kept)."""
MAX_FIELDS = 128
"""The most header fields one request may carry; more is 431 naming `headers` (aiohttp
counts them while parsing)."""
PARSER_LINE_CAP = 32768
"""aiohttp's own request-line cap: past it the parser stops reading (414 all the same)."""
PARSER_FIELD_CAP = 16384
"""aiohttp's own header-field cap (431 all the same). It differs from PARSER_LINE_CAP: the
parser's LineTooLong carries only the cap it hit, which tells a long target from a long
header."""
TOO_MANY_FIELDS = "Too many headers received"
"""aiohttp's message when a head has more than MAX_FIELDS fields (both of its parsers)."""
QUOTE_BYTES = 128
"""How much of the parser's description of a malformed head an answer quotes."""

METRICS_KEY = web.AppKey("apiary.request_head.metrics", Metrics)
"""Where build_http_app leaves its Metrics, for the refusals of the runner's handler."""


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


def target_too_long(size: int | None) -> ValidationError:
    """The 414 refusal of a request target of `size` bytes (None: past the parser's cap)."""
    what = f"{size} bytes" if size is not None else f"more than {PARSER_LINE_CAP} bytes"
    return ValidationError.for_field(
        "request_target",
        f"{what}, over this server's limit of {MAX_TARGET_BYTES} bytes; send long "
        "parameters in a POST body",
        limit=str(MAX_TARGET_BYTES),
    )


def field_too_long(name: str | None, size: int | None) -> ValidationError:
    """The 431 refusal of a header field of `size` bytes, name and value together (None:
    past the parser's cap, which does not tell which header)."""
    what = f"{clip(name, 64)} is {size} bytes" if name is not None and size is not None else (
        f"a header field is more than {PARSER_FIELD_CAP} bytes"
    )  # fmt: skip
    details = {"limit": str(MAX_FIELD_BYTES)}
    if name is not None:
        details["header"] = name
    return ValidationError.for_field(
        "headers", f"{what} (name and value), over this server's limit of {MAX_FIELD_BYTES} bytes",
        **details,
    )  # fmt: skip


def head_limits_middleware(metrics: Metrics) -> Middleware:
    """Refuse a request whose target or a header field is over its limit (414, 431)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        target = _utf8_size(request.raw_path)
        if target > MAX_TARGET_BYTES:
            refusal = target_too_long(target)
            return error_response(refusal, route_label(request), metrics, status=414)
        for name, value in request.raw_headers:
            if len(name) + len(value) > MAX_FIELD_BYTES:
                refusal = field_too_long(name.decode("latin-1"), len(name) + len(value))
                return error_response(refusal, route_label(request), metrics, status=431)
        return await handler(request)

    return middleware


def head_refusal(exc: BaseException | None, status: int) -> tuple[BaseException, int]:
    """The protocol error and HTTP status for a refusal aiohttp's server makes itself:
    `status` 400 with the parser's exception, or a fault past every middleware (500, 504)."""
    if status == 504:
        return DeadlineExceededError("the request took too long to answer"), 504
    if status >= 500 or not isinstance(exc, HttpProcessingError):
        return exc or InternalError("internal error"), 500
    if isinstance(exc, LineTooLong):
        if exc.args[1] == PARSER_LINE_CAP:
            return target_too_long(None), 414
        return field_too_long(None, None), 431
    if exc.message == TOO_MANY_FIELDS:
        return ValidationError.for_field(
            "headers", f"more than {MAX_FIELDS} header fields", limit=str(MAX_FIELDS)
        ), 431  # fmt: skip
    described = exc.message.strip().splitlines()[0] if exc.message.strip() else "unreadable"
    return ValidationError.for_field(
        "request", f"not an HTTP/1.1 request head: {clip(described, QUOTE_BYTES)}"
    ), 400  # fmt: skip


class JsonRefusingRequestHandler(RequestHandler):
    """aiohttp's connection handler, answering its own refusals in the JSON error shape
    with one log line (aiohttp logs a traceback and answers plain text)."""

    metrics: Metrics | None = None

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            # An answer has begun: nothing else can be said on this connection.
            raise ConnectionError("an answer was already being sent")
        error, answer_status = head_refusal(exc, status)
        if isinstance(error, ApiaryError) and answer_status < 500:
            log.info("refused a request head from %s: %s %s", request.remote, answer_status, error)
        response = error_response(error, UNKNOWN_METHOD, self.metrics, status=answer_status)
        response.force_close()
        return response


class _JsonRefusingServer(web.Server):
    def __init__(self, *args: Any, metrics: Metrics | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._metrics = metrics

    def __call__(self) -> RequestHandler:
        handler = JsonRefusingRequestHandler(self, loop=self._loop, **self._kwargs)
        handler.metrics = self._metrics
        return handler


class JsonRefusingAppRunner(web.AppRunner):
    """An AppRunner whose connections answer a malformed or oversized request head in the
    JSON error shape, with the parser caps of this module."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        kwargs.setdefault("max_line_size", PARSER_LINE_CAP)
        kwargs.setdefault("max_field_size", PARSER_FIELD_CAP)
        kwargs.setdefault("max_headers", MAX_FIELDS)
        super().__init__(app, **kwargs)

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()
        return _JsonRefusingServer(
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            metrics=self.app.get(METRICS_KEY),
            **made._kwargs,  # the handler arguments (limits, access log) the runner chose
        )
