"""What the messaging tests over real sockets share: a coordinator on a fake clock, canonical
envelopes, registration, and reading the structured error trailer."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from apiary.engine.assembly import Runtime
from apiary.engine.presence import PresenceSettings
from apiary.engine.settings import RouterSettings
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.testing.clock import FakeClock
from apiary.wire import pb
from apiary.wire.errordetail import ERROR_TRAILER

WAIT_S = 10.0
"""Bound on every wait for the server: generous, since nothing here waits on time."""


@dataclass
class Running:
    coordinator: Coordinator
    clock: FakeClock
    channel: grpc.aio.Channel

    @property
    def grpc(self) -> str:
        return str(self.coordinator.grpc_address)

    @property
    def http(self) -> str:
        return str(self.coordinator.http_address)


@asynccontextmanager
async def open_running(
    tmp_path: Path,
    settings: RouterSettings | None = None,
    store: str = "memory://",
    presence: PresenceSettings | None = None,
) -> AsyncIterator[Running]:
    """A coordinator on real loopback sockets whose timers run on a FakeClock."""
    clock = FakeClock()
    runtime = Runtime(clock=clock, sleep=clock.sleep, presence=presence or PresenceSettings())
    async with (
        open_test_coordinator(tmp_path, store, runtime=runtime, router_settings=settings) as c,
        grpc.aio.insecure_channel(str(c.grpc_address)) as channel,
    ):
        yield Running(c, clock, channel)


def envelope(producer: str, body: Any = None, **fields: Any) -> pb.common_pb2.Envelope:
    payload = body if isinstance(body, bytes) else json.dumps(body or {}).encode()
    values: dict[str, Any] = {
        "message_id": str(uuid.uuid4()),
        "correlation_id": str(uuid.uuid4()),
        "producer_id": producer,
        "message_type": pb.common_pb2.DATA,
        "content_type": "application/json",
        "content_length": len(payload),
        "payload": payload,
    }
    values.update(fields)
    return pb.common_pb2.Envelope(**values)


def descriptor(agent_id: str, **fields: Any) -> pb.registry_pb2.AgentDescriptor:
    values: dict[str, Any] = {
        "agent_id": agent_id,
        "name": agent_id,
        "reasoning_connectors": ["builtin://rules"],
        "modalities_supported": ["application/json", "text/plain"],
    }
    values.update(fields)
    return pb.registry_pb2.AgentDescriptor(**values)


async def register(channel: grpc.aio.Channel, *agent_ids: str) -> None:
    stub = pb.registry_pb2_grpc.RegistryServiceStub(channel)
    for agent_id in agent_ids:
        reply = await stub.RegisterAgent(
            pb.registry_pb2.RegisterAgentRequest(agent=descriptor(agent_id))
        )
        assert reply.accepted, reply.reason


def error_detail(err: grpc.aio.AioRpcError) -> pb.apiary_pb2.ErrorDetail:
    for key, value in err.trailing_metadata() or ():
        if key == ERROR_TRAILER:
            detail = pb.apiary_pb2.ErrorDetail()
            detail.ParseFromString(value)
            return detail
    raise AssertionError(f"no {ERROR_TRAILER} trailer on {err}")


async def next_batch(call: Any) -> Sequence[Any]:
    """The next InboundBatch's deliveries of agents' messages (coordinator notices skipped);
    waits for a batch that has some."""
    while True:
        batch = await asyncio.wait_for(call.read(), WAIT_S)
        assert batch is not grpc.aio.EOF, "the stream ended"
        found = [d for d in batch.deliveries if d.msg.producer_id != "coordinator"]
        if found:
            return found
