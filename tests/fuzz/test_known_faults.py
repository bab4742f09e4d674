"""The faults the fuzzer found whose cause lies outside the transports, each reproduced
deterministically and marked xfail (strict=False) until it is fixed; known.py marks the
fuzz tests of the same methods. A fix turns its test here green (XPASS): then remove the
mark here and the entry in known.py."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb
from tests.fuzz.known import DLQ_REQUEUE_RETRY_COUNT


@pytest.fixture
async def channel(tmp_path: Path) -> AsyncIterator[grpc.aio.Channel]:
    store = f"sqlite:///{tmp_path / 'apiary.db'}"
    async with (
        open_test_coordinator(tmp_path, store) as coordinator,
        grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel,
    ):
        registry = pb.registry_pb2_grpc.RegistryServiceStub(channel)
        for agent_id in ("alice", "bob"):
            descriptor = pb.registry_pb2.AgentDescriptor(
                agent_id=agent_id, name=agent_id, reasoning_connectors=["builtin://rules"],
                modalities_supported=["application/json"],
            )  # fmt: skip
            await registry.RegisterAgent(pb.registry_pb2.RegisterAgentRequest(agent=descriptor))
        yield channel


@pytest.mark.xfail(strict=False, reason=DLQ_REQUEUE_RETRY_COUNT)
async def test_requeue_of_a_dead_letter_at_the_largest_retry_count(
    channel: grpc.aio.Channel,
) -> None:
    envelope = pb.common_pb2.Envelope(
        message_id=str(uuid.uuid4()), correlation_id=str(uuid.uuid4()), producer_id="alice",
        message_type=pb.common_pb2.DATA, content_type="image/png", content_length=2,
        payload=b"{}", retry_count=2**32 - 1,
    )  # fmt: skip
    router = pb.router_pb2_grpc.RouterServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError):  # bob takes no images: dead-lettered
        await router.SendMessage(
            pb.router_pb2.SendMessageRequest(msg=envelope), metadata=(("sw4rm-recipient", "bob"),)
        )
    dlq = pb.apiary_pb2_grpc.DlqServiceStub(channel)
    listed = await dlq.List(pb.apiary_pb2.ListDlqRequest())
    entry_ids = [entry.entry_id for entry in listed.entries]
    assert entry_ids
    try:
        await dlq.Requeue(pb.apiary_pb2.RequeueDlqRequest(entry_ids=entry_ids))
    except grpc.aio.AioRpcError as exc:
        # Refusing the requeue is fine; an internal error is the fault.
        assert exc.code() is not grpc.StatusCode.INTERNAL, exc.details()
