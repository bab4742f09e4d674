"""Agent tool providers: calls routed to a registered agent as TOOL_CALL envelopes (RFC 18.2).

The coordinator's reserved endpoint `tools` (`AgentToolLink`, attached to the router as the
Scheduler attaches itself) produces the TOOL_CALL envelopes and receives what providers send
back: TOOL_RESULT frames, TOOL_ERROR, and the ACKs of its own envelopes. Wire shapes
(JSON payloads, after the RFC's representative JSON; docs/tools.md):

    TOOL_CALL   {"action": "call", "call_id", "tool_name", "provider_id", "args",
                 "args_b64", "content_type", "execution_policy", "stream", "attempt"}
    TOOL_CALL   {"action": "cancel", "call_id", "tool_name", "provider_id"}
    TOOL_RESULT {"call_id", "status": "OK", "result" | "result_b64", "content_type",
                 "final", "frame_no", "summary"}      ("final" defaults to true)
    TOOL_ERROR  {"call_id", "error_code", "note"}

`args` is the arguments' JSON value when they are JSON, `args_b64` their bytes otherwise.
Results and errors carry the call's call_id and correlation_id. A result or error for a
call_id the coordinator is not waiting for (finished, cancelled, never made) is logged and
ignored; one from an agent other than the call's provider is refused (permission_denied).
A TOOL_CALL the agent rejects or fails (NACK), or does not acknowledge in time, fails the
attempt: unacknowledged is `agent_unavailable`, which an idempotent tool retries. A TOOL_CALL
lives no longer than its attempt may take (its ttl_ms), so that one still undelivered when
the coordinator restarts is not run for a caller long gone; a cancel request lives 30 s.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field, replace
from typing import Any, Final

from apiary.core.envelope import AckStage, Envelope, MessageType
from apiary.core.json_reader import JsonError, read_document
from apiary.core.tools.descriptor import ProviderKind, ToolDescriptor
from apiary.core.tools.policy import ExecutionPolicy
from apiary.core.tools.schema import JSON, is_json
from apiary.engine.eventlog import EventRecorder
from apiary.engine.notices import TOOLS, NoticeFactory
from apiary.engine.registry import Registry
from apiary.engine.router.admission import Outbound
from apiary.engine.router.router import Router
from apiary.engine.tools.providers import OFFLINE, READY, Frame, Invocation
from apiary.errors import (
    AgentUnavailableError,
    ApiaryError,
    CallCancelledError,
    NoRouteError,
    PermissionDeniedError,
    ToolFailedError,
    ValidationError,
    error_for_code,
    lookup_code,
)

log = logging.getLogger("apiary.tools")
CANCEL_TTL_MS: Final = 30_000
_FAILED_STAGES = frozenset({AckStage.REJECTED, AckStage.FAILED, AckStage.TIMED_OUT})


@dataclass(eq=False)
class _Channel:
    """One attempt waiting for its agent's answers."""

    agent_id: str
    queue: asyncio.Queue[Frame | ApiaryError] = field(default_factory=asyncio.Queue)
    message_ids: set[str] = field(default_factory=set)


def policy_json(policy: ExecutionPolicy) -> dict[str, Any]:
    """The policy as the TOOL_CALL payload carries it (RFC 18.2 `execution_policy`)."""
    return {
        "timeout_ms": policy.timeout_ms,
        "max_retries": policy.max_retries,
        "backoff": policy.backoff,
        "worktree_required": policy.worktree_required,
        "network_policy": str(policy.network),
        "privilege_level": str(policy.privilege),
        "budget_cpu_ms": policy.budget_cpu_ms,
        "budget_wall_ms": policy.budget_wall_ms,
    }


def _payload(env: Envelope, max_bytes: int) -> dict[str, Any]:
    """The JSON object of a TOOL_RESULT or TOOL_ERROR payload (read by `core.json_reader`
    within `max_bytes`, the message type's payload limit, and the depth limit)."""
    try:
        # Read as the router reads the payloads it passes on: syntax and depth (and size).
        doc = read_document(env.payload, max_bytes=max_bytes, kept=False)
    except JsonError as exc:
        raise ValidationError.for_field(
            "payload", f"a {env.message_type.name} payload {exc}"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("call_id"), str) or not doc["call_id"]:
        raise ValidationError.for_field(
            "payload", f"a {env.message_type.name} payload needs a string call_id"
        )
    return doc


def result_frame(doc: dict[str, Any]) -> Frame:
    """The frame a TOOL_RESULT payload carries."""
    content_type = str(doc.get("content_type") or JSON)
    if "result_b64" in doc:
        try:
            data = base64.b64decode(str(doc["result_b64"]), validate=True)
        except (binascii.Error, ValueError):
            raise ValidationError.for_field("result_b64", "is not base64") from None
    elif "result" in doc:
        value = doc["result"]
        data = (
            value.encode()
            if isinstance(value, str) and not is_json(content_type)
            else json.dumps(value).encode()
        )
    else:
        data = b""
    summary = doc.get("summary")
    return Frame(
        data=data,
        content_type=content_type,
        final=bool(doc.get("final", True)),
        summary=summary if isinstance(summary, dict) else {},
    )


def error_of(doc: dict[str, Any]) -> ApiaryError:
    """The error a TOOL_ERROR payload reports (codes Apiary does not know: TOOL_FAILED)."""
    code = str(doc.get("error_code") or "TOOL_FAILED")
    note = str(doc.get("note") or doc.get("message") or "")
    if code.upper() == "CANCELLED":
        return CallCancelledError(note or "the provider stopped the call")
    if lookup_code(code) is None:
        return ToolFailedError(f"{code}: {note}" if note else code, {"provider_error_code": code})
    return error_for_code(code, note)


class AgentToolLink:
    """The `tools` endpoint: TOOL_CALL envelopes out, results, errors and ACKs in."""

    def __init__(self, router: Router, notices: NoticeFactory, events: EventRecorder) -> None:
        self._router = router
        self._notices = notices
        self._events = events
        self._channels: dict[str, _Channel] = {}
        self._by_message: dict[str, str] = {}
        router.attach(TOOLS, self._on_envelope, self.check)

    async def load(self) -> None:
        """Number TOOL_CALL envelopes on from those sent before a restart (at start-up)."""
        await self._notices.resume(self._router.last_sequence)

    def open(self, call_id: str, agent_id: str) -> _Channel:
        self.close(call_id)
        channel = self._channels[call_id] = _Channel(agent_id)
        return channel

    def close(self, call_id: str) -> None:
        channel = self._channels.pop(call_id, None)
        if channel is not None:
            for message_id in channel.message_ids:
                self._by_message.pop(message_id, None)

    async def send(
        self, agent_id: str, body: dict[str, Any], correlation_id: str, ttl_ms: int = 0
    ) -> str:
        """Route one TOOL_CALL envelope to `agent_id`; its message_id."""
        payload = json.dumps(body, separators=(",", ":")).encode()
        env = self._notices.envelope(MessageType.TOOL_CALL, payload, JSON, correlation_id)
        if ttl_ms:
            env = replace(env, ttl_ms=ttl_ms)
        channel = self._channels.get(str(body["call_id"]))
        if channel is not None:
            channel.message_ids.add(env.message_id)
            self._by_message[env.message_id] = str(body["call_id"])
        (outcome,) = await self._router.send_many([Outbound(env, agent_id)])
        if outcome.error is not None:
            if isinstance(outcome.error, NoRouteError):
                raise AgentUnavailableError(
                    f"tool provider {agent_id!r} is not a registered agent now",
                    {"provider_id": agent_id},
                )
            raise outcome.error
        return env.message_id

    def check(self, env: Envelope) -> dict[str, Any] | None:
        """The payload of a TOOL_RESULT or TOOL_ERROR, checked (None for an ACK); raising
        refuses the envelope."""
        if env.message_type is MessageType.ACKNOWLEDGEMENT:
            return None
        if env.message_type not in (MessageType.TOOL_RESULT, MessageType.TOOL_ERROR):
            raise ValidationError.for_field(
                "message_type",
                f"the tools endpoint takes TOOL_RESULT, TOOL_ERROR and ACKNOWLEDGEMENT "
                f"envelopes, not {env.message_type.name}",
            )
        return _payload(env, self._router.settings.limits.limit_for(env.message_type))

    async def _on_envelope(self, env: Envelope) -> None:
        doc = self.check(env)
        if doc is None:
            self._on_ack(env)
            return
        call_id = doc["call_id"]
        channel = self._channels.get(call_id)
        if channel is None:
            log.info("ignoring a %s for unknown tool call %s from %s",
                     env.message_type.name, call_id, env.producer_id)  # fmt: skip
            await self._events.record(
                "tool.result_unknown", env.producer_id, correlation_id=env.correlation_id,
                call_id=call_id, message_type=env.message_type.name,
            )  # fmt: skip
            return
        if env.producer_id != channel.agent_id:
            raise PermissionDeniedError(
                f"{env.producer_id} may not answer tool call {call_id}: its provider is "
                f"{channel.agent_id}",
                {"call_id": call_id},
            )
        if env.message_type is MessageType.TOOL_ERROR:
            channel.queue.put_nowait(error_of(doc))
        else:
            channel.queue.put_nowait(result_frame(doc))

    def _on_ack(self, env: Envelope) -> None:
        ack = self._router.codec.decode_ack(env)
        call_id = self._by_message.get(ack.ack_for_message_id)
        channel = self._channels.get(call_id) if call_id else None
        if channel is None or ack.ack_stage not in _FAILED_STAGES:
            return
        code = ack.error_code or "agent_unavailable"
        if code.lower() == "ack_timeout":
            error: ApiaryError = AgentUnavailableError(
                f"tool provider {channel.agent_id!r} did not acknowledge the TOOL_CALL in time",
                {"provider_id": channel.agent_id},
            )
        else:
            error = error_for_code(code, ack.note or f"the provider answered {ack.ack_stage.name}")
        channel.queue.put_nowait(error)


class AgentToolProvider:
    """One agent's tools: each attempt is a TOOL_CALL envelope and the answers to it."""

    def __init__(
        self, agent_id: str, tools: tuple[ToolDescriptor, ...], link: AgentToolLink,
        registry: Registry,
    ) -> None:  # fmt: skip
        self._agent_id = agent_id
        self._tools = tools
        self._link = link
        self._registry = registry

    @property
    def provider_id(self) -> str:
        return self._agent_id

    @property
    def kind(self) -> ProviderKind:
        return ProviderKind.AGENT

    @property
    def state(self) -> str:
        return READY if self._registry.known(self._agent_id) is not None else OFFLINE

    async def describe(self) -> tuple[ToolDescriptor, ...]:
        return self._tools

    async def call(self, invocation: Invocation) -> AsyncGenerator[Frame, None]:
        channel = self._link.open(invocation.call_id, self._agent_id)
        try:
            await self._link.send(
                self._agent_id, _call_body(invocation), invocation.correlation_id,
                invocation.policy.wall_limit_ms,
            )  # fmt: skip
            while True:
                item = await channel.queue.get()
                if isinstance(item, ApiaryError):
                    raise item
                yield item
                if item.final:
                    return
        finally:
            self._link.close(invocation.call_id)

    async def cancel(self, call_id: str) -> None:
        body = {"action": "cancel", "call_id": call_id, "provider_id": self._agent_id}
        try:
            await self._link.send(self._agent_id, body, call_id, CANCEL_TTL_MS)
        except ApiaryError as exc:  # best effort (RFC 18.6): the service's grace period ends it
            log.info("could not ask %s to cancel %s: %s", self._agent_id, call_id, exc)

    async def close(self) -> None:
        return None


def _call_body(invocation: Invocation) -> dict[str, Any]:
    body: dict[str, Any] = {
        "action": "call",
        "call_id": invocation.call_id,
        "tool_name": invocation.tool.tool_name,
        "provider_id": invocation.provider_id,
        "content_type": invocation.content_type or JSON,
        "execution_policy": policy_json(invocation.policy),
        "stream": invocation.stream,
        "attempt": invocation.attempt,
        "invoked_by": invocation.caller,
    }
    if invocation.arguments is not None:
        body["args"] = invocation.arguments
    else:
        body["args_b64"] = base64.b64encode(invocation.args).decode()
    if invocation.cwd is not None:
        body["worktree_root"] = str(invocation.cwd)
    return body
