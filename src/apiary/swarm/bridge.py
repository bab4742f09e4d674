"""The bridge between a swarm node and the local SW4RM deployment (docs/swarm.md, "Bridge").

Inbound: a stored swarm message of type message or notification whose local agent is known
goes into the router as a DATA or NOTIFICATION envelope from the reserved producer "swarm":

    local agent     metadata["to"] of the swarm message, else the bridge's default agent;
                    none: the message stays in the inbox only
    payload         application/json: {"content", "swarm_id", "message_id", "from",
                    "recipient", "type", "thread_id", "in_reply_to", "priority",
                    "expires_at", "references", "attachments", "metadata"}
    correlation_id  the swarm thread_id, else the swarm message_id
    idempotency     "swarm:<message_id>", so a message is bridged once whatever happens

The agent's ACKs come back to "swarm": READ or a terminal stage marks the inbox message read.

Outbound: a DATA or NOTIFICATION envelope an agent sends to "swarm" (`msg.reply(...)` does)
becomes a signed swarm message. Its correlation_id finds the conversation (the newest inbox
message of that thread or id): the reply goes to that message's sender in its swarm, with
in_reply_to that message and the same thread. A JSON object payload may set "content" and
override any of: swarm_id, recipient ("broadcast" too), type, thread_id, in_reply_to,
priority, expires_at, references, attachments, metadata (a payload without "content" is sent
whole as the content); a text payload is the content. Delivery runs in the background (the
outbox records it); what a peer would refuse is refused to the agent at once.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from typing import Any

from apiary.core.envelope import AckStage, Envelope, MessageType
from apiary.engine.notices import SWARM_BRIDGE, NoticeFactory
from apiary.engine.router.admission import Outbound
from apiary.engine.router.router import Router
from apiary.errors import (
    ApiaryError,
    NotFoundError,
    PermissionDeniedError,
    UnsupportedMessageTypeError,
    ValidationError,
)
from apiary.swarm.errors import SwarmError
from apiary.swarm.node import SwarmNode
from apiary.swarm.wire import SwarmMessage

log = logging.getLogger("apiary.swarm.bridge")

_OVERRIDES = (
    "swarm_id", "recipient", "type", "thread_id", "in_reply_to", "priority", "expires_at",
    "references", "attachments", "metadata",
)  # fmt: skip
_AGENT_TYPES = ("message", "notification")
_REMEMBERED = 10_000
"""Envelope ids -> swarm message ids kept for marking messages read from ACKs."""


def local_agent(message: SwarmMessage, default: str) -> str:
    to = message.metadata.get("to")
    return to if isinstance(to, str) and to else default


def envelope_body(message: SwarmMessage) -> dict[str, Any]:
    return {
        "content": message.content, "swarm_id": message.swarm_id,
        "message_id": message.message_id, "from": message.sender.agent_id,
        "recipient": message.recipient, "type": message.type,
        "thread_id": message.thread_id, "in_reply_to": message.in_reply_to,
        "priority": message.priority, "expires_at": message.expires_at,
        "references": list(message.references), "attachments": list(message.attachments),
        "metadata": dict(message.metadata),
    }  # fmt: skip


class SwarmBridge:
    def __init__(
        self, node: SwarmNode, router: Router, notices: NoticeFactory, default_agent: str = ""
    ) -> None:
        self._node = node
        self._router = router
        self._notices = notices
        self.default_agent = default_agent
        self._bridged: OrderedDict[str, str] = OrderedDict()
        router.attach(SWARM_BRIDGE, self._on_envelope)
        node.add_hook(self.deliver)

    # ------------------------------------------------------------------ swarm -> SW4RM

    async def deliver(self, message: SwarmMessage) -> None:
        """Hand a stored swarm message to its local agent (when it has one)."""
        if message.type == "system":
            return
        agent = local_agent(message, self.default_agent)
        if not agent:
            return
        if agent == SWARM_BRIDGE:  # would send the message straight back out
            log.warning("swarm message %s names the bridge itself as its local agent",
                        message.message_id)  # fmt: skip
            return
        kind = MessageType.NOTIFICATION if message.type == "notification" else MessageType.DATA
        payload = json.dumps(envelope_body(message), ensure_ascii=False).encode("utf-8")
        env = self._notices.envelope(
            kind, payload, "application/json",
            correlation_id=message.thread_id or message.message_id,
            idempotency_token=f"swarm:{message.message_id}",
        )  # fmt: skip
        (outcome,) = await self._router.send_many([Outbound(env, agent)])
        if not outcome.accepted:
            log.warning("swarm message %s not bridged to %s: %s", message.message_id, agent,
                        outcome.reason)  # fmt: skip
            return
        self._bridged[env.message_id] = message.message_id
        while len(self._bridged) > _REMEMBERED:
            self._bridged.popitem(last=False)

    # ------------------------------------------------------------------ SW4RM -> swarm

    async def _on_envelope(self, env: Envelope) -> None:
        if env.message_type is MessageType.ACKNOWLEDGEMENT:
            await self._on_ack(env)
        elif env.message_type in (MessageType.DATA, MessageType.NOTIFICATION):
            await self._reply(env)
        else:
            raise UnsupportedMessageTypeError(
                f"the swarm bridge takes DATA and NOTIFICATION envelopes (and ACKs), not "
                f"{env.message_type.name}", {"message_type": env.message_type.name},
            )  # fmt: skip

    async def _on_ack(self, env: Envelope) -> None:
        ack = self._router.codec.decode_ack(env)
        swarm_message = self._bridged.get(ack.ack_for_message_id)
        if swarm_message is None or ack.ack_stage is AckStage.RECEIVED:
            return
        entry = await self._node.store.inbox_get(swarm_message)
        if entry is not None and entry.status == "unread":
            await self._node.mark(swarm_message, "read")

    async def _reply(self, env: Envelope) -> None:
        fields = _reply_fields(env)
        original = await self._node.store.thread_latest(env.correlation_id)
        swarm_id = fields.pop("swarm_id", None) or (original.mail.swarm_id if original else None)
        recipient = fields.pop("recipient", None) or (original.mail.sender_id if original else None)
        if not swarm_id or not recipient:
            raise ValidationError.for_field(
                "correlation_id", f"{env.correlation_id!r} names no swarm conversation: "
                "reply to a bridged message, or give swarm_id and recipient in the payload",
            )  # fmt: skip
        if original is not None:
            fields.setdefault("in_reply_to", original.mail.message_id)
            fields.setdefault("thread_id", original.mail.thread_id or original.mail.message_id)
        default = "notification" if env.message_type is MessageType.NOTIFICATION else "message"
        kind = fields.pop("type", None) or default
        content = fields.pop("content")
        try:
            message, _ = await self._node.send(
                str(swarm_id), str(recipient), content, kind=str(kind), background=True,
                **{k: v for k, v in fields.items() if v is not None},
            )  # fmt: skip
        except SwarmError as exc:
            raise _apiary_error(exc) from None
        log.info("envelope %s from %s sent to the swarm as %s", env.message_id,
                 env.producer_id, message.message_id)  # fmt: skip


def _reply_fields(env: Envelope) -> dict[str, Any]:
    """content and overrides from a reply's payload (see the module doc)."""
    base = env.content_type.split(";")[0].strip().lower()
    try:
        text = env.payload.decode("utf-8")
    except UnicodeDecodeError:
        raise ValidationError.for_field("payload", "must be UTF-8 text or JSON") from None
    if base.startswith("text/"):
        return {"content": text}
    if base != "application/json":
        raise UnsupportedMessageTypeError(
            f"the swarm bridge sends text: application/json or text/*, not {env.content_type}",
            {"content_type": env.content_type},
        )
    try:
        body = json.loads(text)
    except ValueError:
        raise ValidationError.for_field("payload", "is not JSON") from None
    if not isinstance(body, dict):
        return {"content": text}
    fields = {k: body[k] for k in _OVERRIDES if k in body}
    if "content" in body:
        if not isinstance(body["content"], str):
            raise ValidationError.for_field("content", "must be a string")
        fields["content"] = body["content"]
    else:
        fields["content"] = text
    if "metadata" in fields and not isinstance(fields["metadata"], dict):
        raise ValidationError.for_field("metadata", "must be an object")
    for name in ("references", "attachments"):
        if name in fields:
            value = fields[name]
            if not isinstance(value, list):
                raise ValidationError.for_field(name, "must be an array")
            fields[name] = tuple(value)
    if "type" in fields and fields["type"] not in _AGENT_TYPES:
        # Not "system": membership operations are the node's, never a local agent's.
        raise ValidationError.for_field("type", f"must be one of {', '.join(_AGENT_TYPES)}")
    return fields


def _apiary_error(exc: SwarmError) -> ApiaryError:
    details = {"swarm_code": exc.code, **({"field": exc.field} if exc.field else {})}
    if exc.status == 400:
        return ValidationError(exc.message, details)
    if exc.status == 404:
        return NotFoundError(exc.message, details)
    return PermissionDeniedError(exc.message, details)
