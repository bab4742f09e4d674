"""Chunked transfers at the router (RFC 5.4): negotiation, reassembly, failure notices.

A route accepts chunks only when the recipient declared the `chunking` capability at
registration (the negotiation). Chunks are reassembled in memory (core/chunks.py); the
assembled message is then admitted like any other, durably, under the transfer id. A
transfer that is corrupted or left incomplete is failed with a descriptive error and the
producer is NACKed; recipients only ever see whole, verified payloads. In-progress
transfers are not durable: after a coordinator restart the producer sends them again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

from apiary.core.chunks import CHUNKING_CAPABILITY, Reassembly
from apiary.core.envelope import Envelope
from apiary.engine.codec import EnvelopeCodec
from apiary.engine.eventlog import EventRecorder
from apiary.engine.registry import Registry
from apiary.errors import ApiaryError, NoRouteError, ValidationError

Nack = Callable[[str, str, str, ApiaryError], Awaitable[None]]
"""(producer, transfer_id, correlation_id, error) -> NACK the producer."""


class Transfers:
    def __init__(
        self, registry: Registry, codec: EnvelopeCodec, events: EventRecorder, nack: Nack,
        timeout_s: float = 60.0,
    ) -> None:  # fmt: skip
        self._registry = registry
        self._codec = codec
        self._events = events
        self._nack = nack
        self._parts = Reassembly(timeout_s)
        self._owners: dict[str, tuple[str, str]] = {}

    async def receive(self, env: Envelope, target: str, now: float) -> Envelope | None:
        """The assembled envelope once the transfer completes, None while it is partial."""
        await self.expire(now)
        agent = await self._registry.find(target)
        if agent is None:
            raise NoRouteError(f"no registered agent {target!r}", {"recipient": target})
        if CHUNKING_CAPABILITY not in agent.descriptor.get("capabilities", []):
            raise ValidationError.for_field(
                "content_type",
                f"chunking is not negotiated on the route to {target}: it did not declare "
                f"the {CHUNKING_CAPABILITY!r} capability",
            )
        part = self._codec.decode_chunk(env)
        self._owners.setdefault(part.transfer_id, (env.producer_id, env.correlation_id))
        try:
            payload = self._parts.add(part, now)
        except ApiaryError as exc:
            self._owners.pop(part.transfer_id, None)
            await self._events.record(
                "transfer.failed", env.producer_id, correlation_id=env.correlation_id,
                agent_id=target, transfer_id=part.transfer_id, reason=exc.message,
            )  # fmt: skip
            raise
        if payload is None:
            return None
        self._owners.pop(part.transfer_id, None)
        await self._events.record(
            "transfer.completed", env.producer_id, correlation_id=env.correlation_id,
            agent_id=target, transfer_id=part.transfer_id, chunks=part.total,
            bytes=len(payload),
        )  # fmt: skip
        return replace(
            env, message_id=part.transfer_id, payload=payload, content_type=part.content_type,
            content_length=len(payload),
        )  # fmt: skip

    async def expire(self, now: float) -> None:
        for transfer_id, error in self._parts.expire(now):
            producer, correlation = self._owners.pop(transfer_id, ("", ""))
            await self._events.record(
                "transfer.failed", producer, correlation_id=correlation,
                transfer_id=transfer_id, reason=error.message,
            )  # fmt: skip
            await self._nack(producer, transfer_id, correlation, error)
