"""Message routing: admission, per-agent inbound streams, acknowledgements.

Foundation scope: a message is durably admitted (state RECEIVED) before SendMessage answers,
delivered over the recipient's stream from its inbox (resumable by offset), and ACK
envelopes move the acknowledged message's state and reach its producer. Envelope validation
by the message-types rules, buffers and back-pressure, ack timeouts, retries, idempotency
and the DLQ arrive with the router area (issue 3).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from apiary.core.addressing import resolve_recipient
from apiary.core.clock import Clock
from apiary.core.envelope import Ack, AckStage, Envelope, MessageType
from apiary.core.ids import is_uuid4
from apiary.core.records import MessageState, StoredMessage
from apiary.engine.eventlog import EventRecorder
from apiary.engine.registry import Registry
from apiary.errors import DuplicateDetectedError, NoRouteError, ValidationError
from apiary.store.errors import DuplicateMessageError
from apiary.store.protocols import MessageStore

_STAGE_STATE = {
    AckStage.RECEIVED: MessageState.RECEIVED,
    AckStage.READ: MessageState.READ,
    AckStage.FULFILLED: MessageState.FULFILLED,
    AckStage.REJECTED: MessageState.REJECTED,
    AckStage.FAILED: MessageState.FAILED,
    AckStage.TIMED_OUT: MessageState.TIMED_OUT,
}
_UNFINISHED = frozenset(s for s in MessageState if not s.terminal)


class EnvelopeCodec(Protocol):
    """Wire encoding of envelopes and ACK payloads, injected by the server layer."""

    def encode(self, env: Envelope) -> bytes: ...

    def decode(self, data: bytes) -> Envelope: ...

    def decode_ack(self, env: Envelope) -> Ack: ...


@dataclass(frozen=True, slots=True)
class Admission:
    message: StoredMessage
    envelope: Envelope


class Router:
    def __init__(
        self,
        messages: MessageStore,
        registry: Registry,
        events: EventRecorder,
        codec: EnvelopeCodec,
        clock: Clock,
    ) -> None:
        self._messages = messages
        self._registry = registry
        self._events = events
        self._codec = codec
        self._clock = clock
        self._arrivals: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)

    async def send(self, env: Envelope, recipient: str = "") -> Admission:
        """Admit `env` durably for its recipient; returns once it is recorded."""
        _check_envelope(env)
        acked_producer = ""
        if env.message_type is MessageType.ACKNOWLEDGEMENT:
            acked_producer = await self._apply_ack(env)
        target = resolve_recipient(env, recipient, acked_producer)
        if await self._registry.find(target) is None:
            raise NoRouteError(
                f"no registered agent {target!r} to deliver {env.message_id} to",
                {"recipient": target, "message_id": env.message_id},
            )
        now = self._clock.now()
        record = StoredMessage(
            message_id=env.message_id,
            recipient=target,
            producer_id=env.producer_id,
            correlation_id=env.correlation_id,
            message_type=int(env.message_type),
            envelope=self._codec.encode(env),
            state=MessageState.RECEIVED,
            created_at=now,
            updated_at=now,
        )
        try:
            stored = await self._messages.admit(record)
        except DuplicateMessageError:
            # message_id is unique per attempt (RFC 11.3); a reused id is refused, and the
            # message already recorded under it stays as it was.
            raise DuplicateDetectedError(
                f"message_id {env.message_id} was already used",
                {"message_id": env.message_id, "field": "message_id"},
            ) from None
        await self._events.record(
            "message.received",
            env.producer_id,
            correlation_id=env.correlation_id,
            agent_id=target,
            message_id=env.message_id,
            message_type=env.message_type.name,
            offset=stored.offset,
        )
        self._arrivals[target].set()
        return Admission(stored, env)

    async def stream(self, agent_id: str, after_offset: int = 0) -> AsyncIterator[Envelope]:
        """The agent's unfinished messages after `after_offset`, then new ones as they come.

        Delivery is at-least-once: a reconnecting agent resumes from the last offset it saw.
        """
        await self._registry.get(agent_id)
        cursor = after_offset
        arrivals = self._arrivals[agent_id]
        while True:
            arrivals.clear()
            batch = await self._messages.inbox(agent_id, cursor, limit=100, states=_UNFINISHED)
            for stored in batch:
                cursor = stored.offset
                yield self._codec.decode(stored.envelope)
            if not batch:
                await arrivals.wait()

    async def _apply_ack(self, env: Envelope) -> str:
        """Move the acknowledged message's state; returns its producer ('' if unknown)."""
        ack = self._codec.decode_ack(env)
        original = await self._messages.get(ack.ack_for_message_id)
        if original is None:
            return ""
        state = _STAGE_STATE.get(ack.ack_stage)
        if state is not None and not original.state.terminal:
            await self._messages.set_state(
                original.message_id, state, self._clock.now(), ack.error_code
            )
            await self._events.record(
                "message.acknowledged",
                env.producer_id,
                correlation_id=original.correlation_id,
                agent_id=original.recipient,
                message_id=original.message_id,
                stage=ack.ack_stage.name,
                error_code=ack.error_code,
            )
        return original.producer_id


def _check_envelope(env: Envelope) -> None:
    if not is_uuid4(env.message_id):
        raise ValidationError(
            f"message_id {env.message_id!r} is not a UUIDv4", {"field": "message_id"}
        )
    if not env.producer_id:
        raise ValidationError("producer_id is required", {"field": "producer_id"})
    if env.message_type is MessageType.MESSAGE_TYPE_UNSPECIFIED:
        raise ValidationError("message_type is required", {"field": "message_type"})
    if env.content_length != len(env.payload):
        raise ValidationError(
            f"content_length {env.content_length} != payload size {len(env.payload)}",
            {"field": "content_length"},
        )
