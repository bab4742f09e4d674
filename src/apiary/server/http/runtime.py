"""The runtime control plane on the HTTP port (docs/control-plane.md), thin adapters over
the one command table (controlplane/commands.py):

- POST /runtime/v1/{command}: HTTP JSON, the body the command's parameters, the answer its
  result; errors in the one JSON error shape with the error table's status.
- POST /runtime/v1/rpc: JSON-RPC 2.0 (single calls, batches and notifications), `method` a
  command's name and `params` its parameters by name. A command's refusal is an error object
  whose `data` carries the protocol error (`code`, `details`, `httpStatus`).
- GET /runtime/v1/sessions/{session_id}/events: the session's events as server-sent events
  (reconnect_channel's stream): an `event: snapshot` frame first (the channel, the snapshot
  and the position replayed after), then every event after that position as `id: <sequence>`
  frames, live; resumed with `channel_id` and `resume_token`, from `Last-Event-ID` (which
  wins), `?after=` or the channel's acknowledged sequence.
- GET /runtime/v1/sessions/{session_id}/socket: the same channel over a WebSocket, with the
  same sequence numbers: a `snapshot` message first, then an `event` message per event; the
  application acknowledges on the socket (`{"type": "ack", "sequence": N}`, answered
  `acked`), and a message the server cannot take is answered `error` without closing.
- GET /runtime/v1: the commands of the contract, and which are served.

Each command is decided by its rule (core/access/table.py RUNTIME_RULES) before it runs, in
the tenant the call acts in, whose control plane runs it (server/control_plane.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import WSCloseCode, WSMessage, WSMsgType, web

from apiary.controlplane.commands import COMMANDS, CONTRACT_COMMANDS, lookup
from apiary.controlplane.requests import Params, ReconnectChannel
from apiary.controlplane.runtime import RuntimeControl
from apiary.core.access.principal import DEFAULT_TENANT, Principal
from apiary.core.access.table import RUNTIME_RULES
from apiary.core.json_reader import JsonError, read_document
from apiary.core.runtime.events import RuntimeEvent
from apiary.errors import (
    ApiaryError,
    NotFoundError,
    UnavailableError,
    UnimplementedError,
    ValidationError,
)
from apiary.server.auth.guard import AccessGuard
from apiary.server.context import CallContext
from apiary.server.control_plane import (
    MAX_BODY,
    MAX_DEPTH,
    ControlPlanes,
    admit_command,
    command_params,
)
from apiary.server.dispatch import TenantHandlers
from apiary.server.errormap import answer_for, clip
from apiary.server.http.access import http_context
from apiary.server.http.errors import error_response, oversize_error
from apiary.server.http.query import cursor_param
from apiary.server.http.sse import frame, woken_before_close
from apiary.server.metrics import UNKNOWN_METHOD, Metrics

PREFIX: Final = "/runtime/v1"
STREAM_ROUTE: Final = f"{PREFIX}/sessions/{{session_id}}/events"
SOCKET_ROUTE: Final = f"{PREFIX}/sessions/{{session_id}}/socket"
MAX_SOCKET_MESSAGE: Final = 64 * 1024
"""An application's message on the channel's WebSocket at most (acknowledgements are small)."""
MAX_BATCH: Final = 100
"""Calls in one JSON-RPC batch at most."""
KEEPALIVE_S: Final = 15.0
KEEPALIVE_RANGE: Final = (0.05, 300.0)
STORE_POLL_S: Final = 0.5
"""How often a channel reads the store when the events it follows are committed on another
replica of a cluster (the leader's: docs/control-plane.md, "Cluster mode")."""
RETRY_MS: Final = 3000
STREAM_BATCH: Final = 200
MAX_STREAMS: Final = 64

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL: Final = -32603
REFUSED: Final = -32000
"""JSON-RPC error codes: the specification's, and -32000 for a command's own refusal (its
protocol error in `data`)."""

Recheck = Callable[[], object]


@dataclass(frozen=True, slots=True)
class Entered:
    """A command's call once decided: who makes it, the tenant it acts in, and how to decide
    it again (a long-lived stream)."""

    ctx: CallContext
    tenant: str
    recheck: Recheck | None

    @property
    def caller(self) -> Principal:
        return self.ctx.principal


class RuntimeRoutes:
    """The control plane's routes (module docstring); without `controls` every command
    answers unavailable (an app built without an engine)."""

    def __init__(
        self,
        controls: ControlPlanes | None,
        metrics: Metrics,
        guard: AccessGuard | None = None,
        tenancy: TenantHandlers | None = None,
    ) -> None:
        self._controls = controls
        self._metrics = metrics
        self._guard = guard
        self._tenancy = tenancy
        self._closing = asyncio.Event()
        self._streams = 0

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(PREFIX, self.list_commands)
        app.router.add_post(f"{PREFIX}/rpc", self.rpc)
        app.router.add_post(f"{PREFIX}/{{command}}", self.call)
        # No HEAD: the stream's body would follow a HEAD answer and break the connection.
        app.router.add_get(STREAM_ROUTE, self.stream, allow_head=False)
        app.router.add_get(SOCKET_ROUTE, self.socket, allow_head=False)
        app.on_shutdown.append(self.close)

    async def close(self, _app: web.Application | None = None) -> None:
        """End every event stream (an on_shutdown hook)."""
        self._closing.set()

    async def list_commands(self, _request: web.Request) -> web.Response:
        commands = [
            {"command": name, "served": name in COMMANDS,
             "summary": COMMANDS[name].summary if name in COMMANDS else ""}
            for name in CONTRACT_COMMANDS
        ]  # fmt: skip
        return web.json_response({"commands": commands})

    # ------------------------------------------------------------------ deciding

    async def _enter(self, request: web.Request, command: str) -> Entered:
        """Decide the call of `command` by its rule, in its tenant."""
        if self._controls is None:
            raise UnavailableError("this server runs no runtime control plane")
        action = f"{PREFIX}/{command}"
        ctx = http_context(request)
        tenant, recheck = DEFAULT_TENANT, None
        if self._guard is not None:
            guard, rule = self._guard, RUNTIME_RULES[command]
            opened = ctx
            ctx, tenant = guard.authenticate(action, ctx)
            if self._tenancy is not None:
                await self._tenancy.open(ctx, tenant)

            def again() -> object:
                return guard.admit(action, rule, None, opened, again=True)

            recheck = again
            await admit_command(guard, self._tenancy, command, ctx, tenant)
        return Entered(ctx, tenant, recheck)

    async def _run(self, request: web.Request, name: str, params: Any) -> dict[str, Any]:
        """The command `name` decided and run (by the cluster's leader in cluster mode)."""
        entered = await self._enter(request, name)
        assert self._controls is not None  # (`_enter` refused it otherwise)
        return await self._controls.run(name, params, entered.ctx, entered.tenant)

    async def _control(self, entered: Entered) -> RuntimeControl:
        assert self._controls is not None  # (`_enter` refused it otherwise)
        return await self._controls.of(entered.tenant)

    # ------------------------------------------------------------------ HTTP JSON

    async def call(self, request: web.Request) -> web.Response:
        name = request.match_info["command"]
        label = f"{PREFIX}/{name}" if name in COMMANDS else UNKNOWN_METHOD
        try:
            lookup(name)
            body = await _body(request)
            result = await self._run(request, name, body)
        except Exception as exc:
            return error_response(exc, label, self._metrics)
        self._metrics.rpc_done("http", label, "ok")
        return web.json_response(result)

    # ------------------------------------------------------------------ JSON-RPC 2.0

    async def rpc(self, request: web.Request) -> web.Response:
        try:
            raw = await _read(request)
            doc = read_document(raw, max_bytes=MAX_BODY, max_depth=MAX_DEPTH, kept=False)
        except JsonError as exc:
            return web.json_response(_rpc_error(None, PARSE_ERROR, f"parse error: {exc}"))
        except ApiaryError as exc:  # over MAX_BODY
            return web.json_response(_rpc_error(None, INVALID_REQUEST, exc.message))
        if isinstance(doc, list):
            if not doc or len(doc) > MAX_BATCH:
                why = "an empty batch" if not doc else f"more than {MAX_BATCH} calls in a batch"
                return web.json_response(_rpc_error(None, INVALID_REQUEST, why))
            answers = [await self._rpc_one(request, item) for item in doc]
            shown = [a for a in answers if a is not None]
            return web.json_response(shown) if shown else web.Response(status=204)
        answer = await self._rpc_one(request, doc)
        return web.json_response(answer) if answer is not None else web.Response(status=204)

    async def _rpc_one(self, request: web.Request, item: object) -> dict[str, Any] | None:
        """One call's response (None for a notification)."""
        if not isinstance(item, dict):
            return _rpc_error(None, INVALID_REQUEST, "a call must be a JSON object")
        call_id = item.get("id")
        if not isinstance(call_id, str | int | None) or isinstance(call_id, bool):
            return _rpc_error(None, INVALID_REQUEST, "id must be a string, a number or null")
        method, params = item.get("method"), item.get("params")
        if item.get("jsonrpc") != "2.0" or not isinstance(method, str):
            return _rpc_error(call_id, INVALID_REQUEST, 'a call has "jsonrpc": "2.0" and a method')
        notification = "id" not in item
        if params is not None and not isinstance(params, dict):
            answer = _rpc_error(call_id, INVALID_PARAMS, "params must be an object (by name)")
            return None if notification else answer
        label = f"{PREFIX}/{method}" if method in COMMANDS else UNKNOWN_METHOD
        try:
            lookup(method)
            result = await self._run(request, method, params)
        except Exception as exc:
            answer = _rpc_refusal(call_id, exc, label)
            self._metrics.rpc_done("http", label, answer["error"]["data"]["code"])
            return None if notification else answer
        self._metrics.rpc_done("http", label, "ok")
        return None if notification else {"jsonrpc": "2.0", "result": result, "id": call_id}

    # ------------------------------------------------------------------ event stream

    async def stream(self, request: web.Request) -> web.StreamResponse:
        try:
            opened = await self._open_channel(request, sse=True)
        except Exception as exc:
            return error_response(exc, STREAM_ROUTE, self._metrics)
        entered, req, start, keepalive = opened
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )

        async def events(found: list[RuntimeEvent]) -> None:
            await response.write(b"".join(frame(e.sequence, e.to_json()) for e in found))

        async def refused(answer: dict[str, Any]) -> None:
            await response.write(f"event: error\ndata: {json.dumps(answer)}\n\n".encode())

        async def idle() -> None:
            await response.write(b": keep-alive\n\n")

        self._streams += 1
        try:
            await response.prepare(request)
            first = {
                "channel": start.channel, "snapshot": start.snapshot.to_json(),
                "after": start.after,
            }  # fmt: skip
            await response.write(
                f"retry: {RETRY_MS}\nevent: snapshot\ndata: {_line(first)}\n\n".encode()
            )
            pump = _Pump(events, refused, idle, STREAM_ROUTE)
            await self._pump(pump, entered, req.session_id, start.after, keepalive)
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away
        finally:
            self._streams -= 1
        return response

    async def socket(self, request: web.Request) -> web.StreamResponse:
        """The channel over a WebSocket (module docstring): refused before the upgrade with
        the one JSON error shape, like the stream."""
        try:
            opened = await self._open_channel(request, sse=False)
            acking = await self._enter(request, "ack_events")
        except Exception as exc:
            return error_response(exc, SOCKET_ROUTE, self._metrics)
        entered, req, start, keepalive = opened
        ws = web.WebSocketResponse(heartbeat=keepalive, max_msg_size=MAX_SOCKET_MESSAGE)
        self._streams += 1
        try:
            await ws.prepare(request)
            await ws.send_json({
                "type": "snapshot", "channel": start.channel,
                "snapshot": start.snapshot.to_json(), "after": start.after,
            })  # fmt: skip

            async def events(found: list[RuntimeEvent]) -> None:
                for event in found:
                    await ws.send_json(
                        {"type": "event", "id": event.sequence, "event": event.to_json()}
                    )

            async def refused(answer: dict[str, Any]) -> None:
                await ws.send_json({"type": "error", **answer})
                await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"refused")

            async def idle() -> None:
                return None  # the socket's own pings keep it alive

            writes = _Pump(events, refused, idle, SOCKET_ROUTE)
            pump = asyncio.ensure_future(
                self._pump(writes, entered, req.session_id, start.after, keepalive)
            )
            try:
                ids = (start.channel["channelId"],
                       start.channel.get("resumeToken") or req.resume_token)  # fmt: skip
                await self._read_acks(ws, acking, ids)
            finally:
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
            if not ws.closed:
                await ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutting down")
        except ConnectionError:
            pass
        finally:
            self._streams -= 1
        return ws

    async def _read_acks(
        self, ws: web.WebSocketResponse, acking: Entered, channel: tuple[str, str]
    ) -> None:
        """The application's messages until it closes the socket or the server shuts down:
        each `ack` is the ack_events command for this channel, answered `acked` (or `error`,
        the socket staying open)."""
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            while not ws.closed:
                receive = asyncio.ensure_future(ws.receive())
                await asyncio.wait({receive, closing}, return_when=asyncio.FIRST_COMPLETED)
                if not receive.done():
                    receive.cancel()
                    return
                message = receive.result()
                if message.type in _SOCKET_ENDS:
                    return
                control = await self._control(acking)
                await ws.send_json(await _acked(message, acking, control, channel))
        finally:
            closing.cancel()

    async def _open_channel(
        self, request: web.Request, *, sse: bool
    ) -> tuple[Entered, ReconnectChannel, Any, float]:
        """A channel's stream or socket, decided and started: the caller's call, the
        request, the channel's start (snapshot) and the keep-alive period."""
        if self._streams >= MAX_STREAMS:
            raise UnavailableError(f"at most {MAX_STREAMS} runtime event streams at once")
        req, keepalive = _stream_request(request, last_event_id=sse)
        entered = await self._enter(request, "reconnect_channel")
        start = await (await self._control(entered)).channels.start(entered.caller, req)
        return entered, req, start, keepalive

    async def _pump(
        self, pump: _Pump, entered: Entered, session_id: str, after: int, keepalive: float
    ) -> None:
        """The session's events after `after` until shutdown; before each write the caller
        is decided again, and a refusal ends the stream with an error."""
        control, cursor = await self._control(entered), after
        assert self._controls is not None  # (`_enter` refused it otherwise)
        wait_s = keepalive
        if not self._controls.wakes(entered.tenant):
            wait_s = min(keepalive, STORE_POLL_S)
        quiet_s = 0.0
        while not self._closing.is_set():
            replay = await control.channels.replay(session_id, cursor, STREAM_BATCH)
            if entered.recheck is not None and (refused := _refusal(entered.recheck, pump.route)):
                await pump.refused(refused)
                return
            if replay.events:
                await pump.events(list(replay.events))
            cursor = replay.cursor
            if replay.more:
                continue
            if await woken_before_close(control.wait_after(cursor), self._closing, wait_s):
                quiet_s = 0.0
                continue
            quiet_s += wait_s
            if quiet_s >= keepalive or self._closing.is_set():
                await pump.idle()
                quiet_s = 0.0


@dataclass(frozen=True, slots=True)
class _Pump:
    """How a channel's transport writes: its events, a refusal, a keep-alive."""

    events: Callable[[list[RuntimeEvent]], Awaitable[None]]
    refused: Callable[[dict[str, Any]], Awaitable[None]]
    idle: Callable[[], Awaitable[None]]
    route: str
    """The transport's route, which its refusals are logged and counted under."""


_SOCKET_ENDS: Final = frozenset(
    {WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR}
)


async def _acked(
    message: WSMessage, acking: Entered, control: RuntimeControl, channel: tuple[str, str]
) -> dict[str, Any]:
    """The answer to an application's socket message: the channel (id, resume token) once
    acknowledged, or the error that refuses the message."""
    channel_id, token = channel
    try:
        params = {
            "channel_id": channel_id,
            "resume_token": token,
            "sequence": _ack_sequence(message),
        }
        acked = await lookup("ack_events")(control, acking.caller, params)
    except Exception as exc:
        answer = answer_for(exc, SOCKET_ROUTE)
        return {"type": "error", "code": answer.code, "message": answer.message,
                "details": answer.details}  # fmt: skip
    return {"type": "acked", "channel": acked}


def _ack_sequence(message: WSMessage) -> int:
    """The sequence an application's socket message acknowledges; validation_error naming
    what is wrong with any other message."""
    if message.type is not WSMsgType.TEXT:
        raise ValidationError.for_field("message", "must be a JSON text message")
    try:
        doc = read_document(message.data.encode(), max_bytes=MAX_SOCKET_MESSAGE, max_depth=8,
                            kept=False)  # fmt: skip
    except JsonError as exc:
        raise ValidationError.for_field("message", clip(str(exc))) from None
    if not isinstance(doc, dict) or doc.get("type") != "ack":
        raise ValidationError.for_field("type", 'must be "ack" (the socket takes acknowledgements)')
    sequence = doc.get("sequence")
    if isinstance(sequence, bool) or not isinstance(sequence, int):
        raise ValidationError.for_field("sequence", "must be an integer")
    return sequence


def _line(doc: object) -> str:
    # json.dumps escapes every line break, so the data is always one `data:` line.
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def _refusal(recheck: Recheck, route: str) -> dict[str, Any] | None:
    """The error a channel's renewed decision (`recheck`) ends it with, under its `route`;
    None while the caller is still allowed."""
    try:
        recheck()
    except ApiaryError as exc:
        answer = answer_for(exc, route)
        return {"code": answer.code, "message": answer.message}
    return None


def _stream_request(
    request: web.Request, *, last_event_id: bool = True
) -> tuple[ReconnectChannel, float]:
    query = request.query
    resume = request.headers.get("Last-Event-ID", "").strip() if last_event_id else ""
    params: dict[str, Any] = {"session_id": request.match_info["session_id"]}
    for name in ("channel_id", "resume_token"):
        if query.get(name):
            params[name] = query[name]
    if resume:
        params["last_acknowledged_sequence"] = cursor_param(resume, "Last-Event-ID")
    elif query.get("after"):
        params["last_acknowledged_sequence"] = cursor_param(query["after"], "after")
    given = Params(params)
    req = ReconnectChannel.read(given)
    given.done()
    try:
        keepalive = float(query.get("keepalive", KEEPALIVE_S))
    except ValueError:
        raise ValidationError.for_field("keepalive", "must be a number of seconds") from None
    low, high = KEEPALIVE_RANGE
    if not low <= keepalive <= high:
        raise ValidationError.for_field("keepalive", f"must be within {low}..{high} seconds")
    return req, keepalive


async def _read(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise oversize_error(MAX_BODY) from None


async def _body(request: web.Request) -> object:
    """A command's body: a JSON object (empty: no parameters)."""
    return command_params(await _read(request), "body")


def _rpc_error(call_id: object, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "error": error, "id": call_id}


def _rpc_refusal(call_id: object, exc: Exception, label: str) -> dict[str, Any]:
    """A command's failure as a JSON-RPC error: the protocol error in `data`."""
    answer = answer_for(exc, label)
    data = {
        "code": answer.code.lower(), "details": answer.details,
        "httpStatus": answer.spec.http_status,
    }  # fmt: skip
    if isinstance(exc, UnimplementedError | NotFoundError) and "command" in answer.details:
        code = METHOD_NOT_FOUND
    elif answer.code == ValidationError.code:
        code = INVALID_PARAMS
    elif isinstance(exc, ApiaryError):
        code = REFUSED
    else:
        code = INTERNAL
    return _rpc_error(call_id, code, answer.message, data)
