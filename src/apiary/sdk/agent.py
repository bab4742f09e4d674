"""A minimal asynchronous agent: register, send, receive, acknowledge, deregister.

async with Agent("bob", coordinator="127.0.0.1:50051") as bob:
    async for env in bob.messages():
        ...
        await bob.ack(env, AckStage.FULFILLED)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any

import grpc

from apiary.core.clock import Clock
from apiary.core.envelope import Ack, AckStage, Envelope, MessageType
from apiary.core.ids import IdGenerator
from apiary.errors import ValidationError
from apiary.sdk import errors
from apiary.system import SystemClock, UuidIds
from apiary.wire import pb
from apiary.wire.convert import ack_to_json, envelope_from_proto, envelope_to_proto

RECIPIENT_KEY = "sw4rm-recipient"
JSON = "application/json"


class Agent:
    """One agent's connection to a coordinator."""

    def __init__(
        self,
        agent_id: str,
        *,
        coordinator: str,
        name: str = "",
        description: str = "",
        capabilities: Sequence[str] = (),
        modalities: Sequence[str] = (JSON, "text/plain"),
        reasoning_connectors: Sequence[str] = ("builtin://rules",),
        clock: Clock | None = None,
        ids: IdGenerator | None = None,
    ) -> None:
        self.agent_id = agent_id
        self._coordinator = coordinator
        self._descriptor = pb.registry_pb2.AgentDescriptor(
            agent_id=agent_id,
            name=name or agent_id,
            description=description,
            capabilities=list(capabilities),
            modalities_supported=list(modalities),
            reasoning_connectors=list(reasoning_connectors),
        )
        self._clock = clock or SystemClock()
        self._ids = ids or UuidIds()
        # Sequence numbers must stay monotonic across restarts of the agent (the router
        # deduplicates by (producer_id, sequence_number)), so they start from the clock.
        self._sequence = int(self._clock.now() * 1_000_000)
        self._channel: grpc.aio.Channel | None = None

    async def __aenter__(self) -> Agent:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop("agent exited" if et is None else f"agent failed: {et.__name__}")

    async def start(self) -> None:
        """Connect and register with the coordinator."""
        self._channel = grpc.aio.insecure_channel(self._coordinator)
        request = pb.registry_pb2.RegisterAgentRequest(agent=self._descriptor)
        stub = pb.registry_pb2_grpc.RegistryServiceStub(self._channel)
        reply = await errors.call(lambda: stub.RegisterAgent(request))
        if not reply.accepted:
            await self._channel.close()
            self._channel = None
            raise ValidationError(f"registration of {self.agent_id} refused: {reply.reason}")

    async def stop(self, reason: str = "shutdown") -> None:
        """Deregister and close the connection (idempotent)."""
        if self._channel is None:
            return
        stub = pb.registry_pb2_grpc.RegistryServiceStub(self._channel)
        request = pb.registry_pb2.DeregisterAgentRequest(agent_id=self.agent_id, reason=reason)
        try:
            await errors.call(lambda: stub.DeregisterAgent(request))
        finally:
            await self._channel.close()
            self._channel = None

    def _envelope(
        self, message_type: MessageType, payload: bytes, content_type: str, correlation_id: str
    ) -> Envelope:
        self._sequence += 1
        message_id = self._ids.new_id()
        return Envelope(
            message_id=message_id,
            producer_id=self.agent_id,
            message_type=message_type,
            payload=payload,
            content_type=content_type,
            content_length=len(payload),
            correlation_id=correlation_id or message_id,
            sequence_number=self._sequence,
            timestamp=self._clock.now(),
        )

    async def _send(self, env: Envelope, to: str = "") -> Envelope:
        stub = pb.router_pb2_grpc.RouterServiceStub(self._require_channel())
        request = pb.router_pb2.SendMessageRequest(msg=envelope_to_proto(env))
        metadata = ((RECIPIENT_KEY, to),) if to else None
        await errors.call(lambda: stub.SendMessage(request, metadata=metadata))
        return env

    async def send(
        self,
        to: str,
        body: Any,
        *,
        content_type: str = JSON,
        message_type: MessageType = MessageType.DATA,
        correlation_id: str = "",
    ) -> Envelope:
        """Send `body` (bytes as they are; anything else as JSON) to agent `to`."""
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        env = self._envelope(message_type, payload, content_type, correlation_id)
        return await self._send(env, to)

    async def ack(
        self, env: Envelope, stage: AckStage, *, error_code: str = "", note: str = ""
    ) -> Envelope:
        """Acknowledge `env` at `stage`; the coordinator forwards it to the producer."""
        payload = ack_to_json(Ack(env.message_id, stage, error_code, note))
        ack = self._envelope(MessageType.ACKNOWLEDGEMENT, payload, JSON, env.correlation_id)
        return await self._send(ack)

    async def messages(self) -> AsyncIterator[Envelope]:
        """Inbound envelopes, in order, until the connection closes."""
        stub = pb.router_pb2_grpc.RouterServiceStub(self._require_channel())
        call = stub.StreamIncoming(pb.router_pb2.StreamRequest(agent_id=self.agent_id))
        async for item in errors.stream(call.__aiter__()):
            yield envelope_from_proto(item.msg)

    def _require_channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            raise RuntimeError(f"agent {self.agent_id} is not started")
        return self._channel
