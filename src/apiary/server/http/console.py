"""The operator console (DESIGN.md section 10): one page on the HTTP port, and its live feed.

GET /console serves a self-contained page (HTML, CSS and JavaScript modules shipped as
package data in `console/`); the page reads every panel through the JSON gateway, so a
panel shows exactly what `POST /v1/<service>/<Method>` answers. Two reads the gateway has
no RPC for live here:

- GET /v1/events/stream: the event log as server-sent events, one event per `data:` line
  as JSON with `id:` its sequence; resumable with `Last-Event-ID` (which wins) or
  `?after=N`; `: keep-alive` comments every `?keepalive=S` seconds (default 15) while idle.
  Without either it starts at the end of the log. The streams end when the server shuts
  down (the browser then reconnects by itself, from the last id it saw).
- GET /console/api/workflows: the latest workflows (found by their `workflow.created`
  events), or with `?workflow_id=` that one, with their definition and state, in the proto3
  JSON the gateway uses; the definition's dependencies are what the page lays the graph out
  by, and WorkflowService.GetWorkflowState does not carry them.
- GET /console/api/history and /console/api/finished: a page's history and the list of
  finished work, from the event log (history.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar

from aiohttp import web
from google.protobuf import json_format

from apiary.core.events import Event, EventFilter
from apiary.core.limits import DEFAULT_LIMITS, check_id
from apiary.engine.eventlog import EventRecorder
from apiary.engine.hitl import Hitl
from apiary.engine.workflows import Workflows
from apiary.errors import ApiaryError, NotFoundError, UnavailableError, ValidationError
from apiary.server.errormap import answer_for
from apiary.server.http.access import RECHECK
from apiary.server.http.errors import error_response
from apiary.server.http.history import WorkReads, event_json
from apiary.server.http.query import cursor_param, limit_param
from apiary.server.http.sse import frame, woken_before_close
from apiary.wire.workflow import definition_to_proto, state_to_proto

log = logging.getLogger("apiary.server.console")

STREAM_PATH = "/v1/events/stream"
ASSET_TYPES: Mapping[str, str] = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
}
# The page loads nothing from elsewhere and runs no inline script: even a bug that put
# markup from data into the DOM could not run code.
PAGE_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
KEEPALIVE_S = 15.0
KEEPALIVE_RANGE = (0.05, 300.0)
RETRY_MS = 3000
BATCH = 200
MAX_STREAMS = 64
WORKFLOWS_SHOWN = 20
WORKFLOWS_KNOWN = 1000
CREATED = EventFilter(event_types=frozenset({"workflow.created"}))

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ConsoleSources:
    """The engine parts the console reads directly (None: that part answers 503)."""

    events: EventRecorder | None
    workflows: Workflows | None = None
    hitl: Hitl | None = None


def sse_frame(event: Event) -> bytes:
    return frame(event.sequence, event_json(event))


class EventStream:
    """GET /v1/events/stream over EventRecorder.read and wait_after."""

    def __init__(self, events: EventRecorder | None) -> None:
        self._events = events
        self._closing = asyncio.Event()
        self._open = 0

    async def close(self, _app: web.Application | None = None) -> None:
        """End every stream (an on_shutdown hook: before the server waits for handlers)."""
        self._closing.set()

    async def stream(self, request: web.Request) -> web.StreamResponse:
        try:
            if self._events is None:
                raise UnavailableError("this server has no event log to stream")
            if self._open >= MAX_STREAMS:
                raise UnavailableError(f"at most {MAX_STREAMS} event streams at once")
            after, keepalive = await self._start(request, self._events)
        except Exception as exc:
            return error_response(exc, STREAM_PATH)
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        self._open += 1
        try:
            await response.prepare(request)
            await response.write(f"retry: {RETRY_MS}\n: stream after {after}\n\n".encode())
            await self._pump(response, self._events, after, keepalive, request.get(RECHECK))
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away
        finally:
            self._open -= 1
        return response

    async def _start(self, request: web.Request, events: EventRecorder) -> tuple[int, float]:
        resume = request.headers.get("Last-Event-ID", "")
        after_text = request.query.get("after", "")
        if resume.strip():
            after = cursor_param(resume, "Last-Event-ID")
        elif after_text:
            after = cursor_param(after_text, "after")
        else:
            after = await events.last_sequence()
        try:
            keepalive = float(request.query.get("keepalive", KEEPALIVE_S))
        except ValueError:
            raise ValidationError.for_field("keepalive", "must be a number of seconds") from None
        low, high = KEEPALIVE_RANGE
        if not low <= keepalive <= high:
            raise ValidationError.for_field("keepalive", f"must be within {low}..{high} seconds")
        return after, keepalive

    async def _pump(
        self,
        response: web.StreamResponse,
        events: EventRecorder,
        after: int,
        keepalive: float,
        recheck: Callable[[], object] | None,
    ) -> None:
        """Events after `after` until shutdown; before each write the caller is decided
        again (`recheck`), and a refusal (a revoked or expired credential) ends the stream
        with an `error` event carrying it."""
        cursor = after
        while not self._closing.is_set():
            batch = await events.read(after=cursor, limit=BATCH)
            if recheck is not None and (refused := _refusal(recheck)) is not None:
                await response.write(refused)
                return
            if batch:
                await response.write(b"".join(sse_frame(e) for e in batch))
                cursor = batch[-1].sequence
            elif not await woken_before_close(events.wait_after(cursor), self._closing, keepalive):
                await response.write(b": keep-alive\n\n")


def _refusal(recheck: Callable[[], object]) -> bytes | None:
    """The `error` event of a caller no longer allowed, or None while it is."""
    try:
        recheck()
    except ApiaryError as exc:
        answer = answer_for(exc, STREAM_PATH)
        body = {"code": answer.code, "message": answer.message}
        return f"event: error\ndata: {json.dumps(body)}\n\n".encode()
    return None


class WorkflowIndex:
    """GET /console/api/workflows: the latest workflows, found in the event log once each."""

    def __init__(self, events: EventRecorder | None, workflows: Workflows | None) -> None:
        self._events = events
        self._workflows = workflows
        self._known: dict[str, None] = {}  # insertion order: the order they were created
        self._scanned = 0
        self._lock = asyncio.Lock()

    async def latest(self, limit: int) -> list[str]:
        """The ids of the `limit` workflows created last, newest first."""
        if self._events is None:
            return []
        async with self._lock:
            top = await self._events.last_sequence()
            while batch := await self._events.read(after=self._scanned, limit=500, where=CREATED):
                for event in batch:
                    workflow_id = str(event.details.get("workflow_id") or event.correlation_id)
                    self._known.pop(workflow_id, None)
                    self._known[workflow_id] = None
                self._scanned = batch[-1].sequence
            # Every event up to `top` was flushed before the reads: none is left to find.
            self._scanned = max(self._scanned, top)
            while len(self._known) > WORKFLOWS_KNOWN:
                del self._known[next(iter(self._known))]
            return list(reversed(self._known))[:limit]

    async def handle(self, request: web.Request) -> web.Response:
        try:
            if self._workflows is None:
                raise UnavailableError("this server runs no workflows")
            wanted = request.query.get("workflow_id", "")
            if wanted:
                found = [check_id(wanted, "workflow_id", DEFAULT_LIMITS.id_bytes)]
            else:
                found = await self.latest(
                    limit_param(request.query, WORKFLOWS_SHOWN, WORKFLOWS_KNOWN)
                )
            shown = []
            for workflow_id in found:
                try:
                    stored = await self._workflows.state(workflow_id)
                except NotFoundError:
                    if wanted:
                        raise
                    continue  # removed since it was created
                shown.append(
                    {
                        "definition": _json(definition_to_proto(stored.spec)),
                        "state": _json(state_to_proto(stored)),
                    }
                )
        except Exception as exc:
            return error_response(exc, request.path)
        return web.json_response({"workflows": shown})


def _json(message: Any) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


class ConsoleAssets:
    """The page and its files, read once from the package (nothing else can be served)."""

    def __init__(self) -> None:
        folder = resources.files("apiary.server.http").joinpath("console")
        self._files: dict[str, tuple[bytes, str]] = {}
        for item in folder.iterdir():
            suffix = "." + item.name.rpartition(".")[2]
            if item.is_file() and suffix in ASSET_TYPES:
                self._files[item.name] = (item.read_bytes(), ASSET_TYPES[suffix])
        if "index.html" not in self._files:
            log.warning("the console's files are missing: GET /console answers 404")

    def names(self) -> list[str]:
        return sorted(self._files)

    async def page(self, _request: web.Request) -> web.Response:
        return self._serve("index.html")

    async def asset(self, request: web.Request) -> web.Response:
        return self._serve(request.match_info["name"])

    def _serve(self, name: str) -> web.Response:
        if name not in self._files:
            return error_response(NotFoundError(f"no console file {name!r}"), "/console")
        body, content_type = self._files[name]
        return web.Response(
            body=body, content_type=content_type, charset="utf-8", headers=PAGE_HEADERS
        )


def add_console_routes(app: web.Application, sources: ConsoleSources) -> None:
    """Mount the console's page, files, event stream and reads on `app`."""
    assets = ConsoleAssets()
    stream = EventStream(sources.events)
    workflows = WorkflowIndex(sources.events, sources.workflows)
    work = WorkReads(sources.events, sources.hitl)
    app.router.add_get("/console", assets.page)
    app.router.add_get("/console/", assets.page)
    app.router.add_get("/console/api/workflows", workflows.handle)
    app.router.add_get("/console/api/history", work.history)
    app.router.add_get("/console/api/finished", work.finished)
    app.router.add_get("/console/{name}", assets.asset)
    # No HEAD: the stream's body would follow a HEAD answer and break the connection.
    app.router.add_get(STREAM_PATH, stream.stream, allow_head=False)
    app.on_shutdown.append(stream.close)
