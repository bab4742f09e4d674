"""Serving tools from an agent (RFC 18.2): register them, answer TOOL_CALL envelopes.

    async def add(call: ToolCallContext) -> Any:
        return call.args["a"] + call.args["b"]

    async def count(call: ToolCallContext) -> AsyncIterator[Any]:
        for i in range(call.args["n"]):
            yield {"i": i}                      # one streamed frame each

    async with Agent("calc", coordinator=address) as agent:
        host = ToolHost(agent, [Tool("add", add, idempotent=True), Tool("count", count)])
        await host.register()
        await host.serve()                      # or host.handle(env) in your own loop

A coroutine handler's return value is the result (one final frame); an async generator
handler streams a frame per item and ends with a final frame. `str` values are sent as
text/plain, `bytes` as application/octet-stream, anything else as JSON. Raising an
ApiaryError answers TOOL_ERROR with its code; any other exception answers TOOL_FAILED.
A cancel request cancels the handler's task; the host then sends the final frame with a
summary saying cancelled and whether anything was sent.
Each TOOL_CALL is acknowledged READ when it arrives and FULFILLED once answered.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apiary.core.envelope import AckStage, Envelope, MessageType
from apiary.core.trace_context import TraceContext
from apiary.errors import ApiaryError
from apiary.sdk.agent import Agent
from apiary.sdk.tools import ToolClient
from apiary.sdk.tracing import continued, fail_current
from apiary.wire import pb

TOOLS_ENDPOINT = "tools"
JSON = "application/json"


@dataclass(frozen=True, slots=True)
class ToolCallContext:
    """What a handler gets: the call's id, arguments and policy."""

    call_id: str
    tool_name: str
    args: Any
    """The JSON arguments (None when they were not JSON: see `args_bytes`)."""
    args_bytes: bytes
    content_type: str
    policy: Mapping[str, Any]
    stream: bool
    worktree_root: str
    envelope: Envelope


Handler = Callable[[ToolCallContext], Awaitable[Any] | AsyncIterator[Any]]


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool this agent offers: its descriptor fields and its handler."""

    name: str
    handler: Handler
    input_schema: str | Mapping[str, Any] = ""
    output_schema: str | Mapping[str, Any] = ""
    idempotent: bool = False
    needs_worktree: bool = False
    default_timeout_s: int = 0
    max_concurrency: int = 0
    side_effects: str = ""

    def descriptor(self) -> pb.connector_pb2.ToolDescriptor:
        def schema(value: str | Mapping[str, Any]) -> str:
            return value if isinstance(value, str) else json.dumps(dict(value))

        return pb.connector_pb2.ToolDescriptor(
            tool_name=self.name, input_schema=schema(self.input_schema),
            output_schema=schema(self.output_schema), idempotent=self.idempotent,
            needs_worktree=self.needs_worktree, default_timeout_s=self.default_timeout_s,
            max_concurrency=self.max_concurrency, side_effects=self.side_effects,
        )  # fmt: skip


def _encoded(value: Any) -> dict[str, Any]:
    if isinstance(value, bytes):
        return {"result_b64": base64.b64encode(value).decode(),
                "content_type": "application/octet-stream"}  # fmt: skip
    if isinstance(value, str):
        return {"result": value, "content_type": "text/plain"}
    return {"result": value, "content_type": JSON}


@dataclass(eq=False)
class _Running:
    task: asyncio.Task[None]
    frames: int = 0
    cancel_requested: bool = False


@dataclass(eq=False)
class ToolHost:
    """Registers an agent's tools and answers the TOOL_CALL envelopes routed to it."""

    agent: Agent
    tools: Sequence[Tool]
    _running: dict[str, _Running] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._by_name = {t.name: t for t in self.tools}

    async def register(self) -> str:
        """ConnectorService.RegisterProvider as this agent; the coordinator's reason."""
        client = ToolClient(self.agent.channel, agent_id=self.agent.agent_id)
        reply = await client.register_provider(
            self.agent.agent_id, [t.descriptor() for t in self.tools]
        )
        if not reply.ok:
            raise ValueError(f"tool registration refused: {reply.reason}")
        return str(reply.reason)

    async def serve(self) -> None:
        """Answer tool calls until the agent's inbound stream ends (other envelopes are
        acknowledged FULFILLED and dropped: use `handle` in your own loop to keep them)."""
        try:
            async for delivery in self.agent.deliveries():
                env = delivery.envelope
                if not await self.handle(env, delivery.trace) and env.message_type is not (
                    MessageType.ACKNOWLEDGEMENT
                ):
                    await self.agent.ack(env, AckStage.FULFILLED, note="not a tool call")
        finally:
            await self.close()

    async def handle(self, env: Envelope, trace: TraceContext | None = None) -> bool:
        """Take `env` if it is a TOOL_CALL (True); leave anything else to the caller.
        `trace`: the trace context its delivery carried (`Delivery.trace`), which the tool's
        run continues as a span (docs/tracing.md); without it, the run continues the span
        current in the caller, if any."""
        if env.message_type is not MessageType.TOOL_CALL:
            return False
        await self.agent.ack(env, AckStage.READ)
        doc = json.loads(env.payload)
        call_id = str(doc.get("call_id", ""))
        if doc.get("action") == "cancel":
            running = self._running.get(call_id)
            if running is not None:
                running.cancel_requested = True
                running.task.cancel()
            await self.agent.ack(env, AckStage.FULFILLED)
            return True
        tool = self._by_name.get(str(doc.get("tool_name", "")))
        if tool is None:
            await self.agent.ack(env, AckStage.REJECTED, error_code="validation_error",
                                 note=f"no tool {doc.get('tool_name')!r} here")  # fmt: skip
            return True
        task = asyncio.create_task(self._traced(env, doc, tool, trace))
        self._running[call_id] = _Running(task)
        return True

    async def close(self) -> None:
        for running in list(self._running.values()):
            running.task.cancel()
        for running in list(self._running.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await running.task

    async def _traced(
        self, env: Envelope, doc: Mapping[str, Any], tool: Tool, trace: TraceContext | None
    ) -> None:
        """`_run` within a span of the call's trace, when its delivery carried one."""
        if trace is None:
            await self._run(env, doc, tool)
            return
        attributes = {
            "apiary.tool_name": tool.name, "apiary.call_id": str(doc.get("call_id", "")),
            "messaging.message.id": env.message_id,
        }  # fmt: skip
        with continued(trace, f"tool {tool.name}", attributes):
            await self._run(env, doc, tool)

    async def _run(self, env: Envelope, doc: Mapping[str, Any], tool: Tool) -> None:
        call_id = str(doc["call_id"])
        running = self._running[call_id]
        context = ToolCallContext(
            call_id=call_id, tool_name=tool.name, args=doc.get("args"),
            args_bytes=base64.b64decode(doc["args_b64"]) if "args_b64" in doc else b"",
            content_type=str(doc.get("content_type", JSON)),
            policy=dict(doc.get("execution_policy") or {}), stream=bool(doc.get("stream")),
            worktree_root=str(doc.get("worktree_root", "")), envelope=env,
        )  # fmt: skip
        try:
            outcome = tool.handler(context)
            if inspect.isasyncgen(outcome) or isinstance(outcome, AsyncIterator):
                async for item in outcome:
                    running.frames += 1
                    await self._send(env, {**_encoded(item), "final": False,
                                           "frame_no": running.frames})  # fmt: skip
                await self._send(env, {"final": True, "summary": {"frames": running.frames}})
            else:
                value = await outcome
                await self._send(env, {**_encoded(value), "final": True})
        except asyncio.CancelledError:
            if not running.cancel_requested:
                raise
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()  # the cancellation was the caller's request, now handled
            summary = {"cancelled": True, "partial_result": running.frames > 0,
                       "frames": running.frames}  # fmt: skip
            await self._send(env, {"final": True, "summary": summary})
        except ApiaryError as exc:
            await self._error(env, exc.code, exc.message)
        except Exception as exc:
            await self._error(env, "TOOL_FAILED", f"{type(exc).__name__}: {exc}")
        finally:
            self._running.pop(call_id, None)
        await self.agent.ack(env, AckStage.FULFILLED)

    async def _send(self, call: Envelope, body: dict[str, Any]) -> None:
        doc = {"call_id": json.loads(call.payload)["call_id"], "status": "OK", **body}
        reply = self.agent.envelope(
            doc, message_type=MessageType.TOOL_RESULT, correlation_id=call.correlation_id
        )
        await self.agent.send_envelope(reply, to=TOOLS_ENDPOINT)

    async def _error(self, call: Envelope, code: str, note: str) -> None:
        fail_current(code, note)  # the tool's span, when it has one (docs/tracing.md)
        doc = {"call_id": json.loads(call.payload)["call_id"], "error_code": code, "note": note}
        reply = self.agent.envelope(
            doc, message_type=MessageType.TOOL_ERROR, correlation_id=call.correlation_id
        )
        await self.agent.send_envelope(reply, to=TOOLS_ENDPOINT)
