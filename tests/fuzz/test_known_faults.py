"""The faults the fuzzer found whose cause lies outside the transports, each reproduced
deterministically. An open fault is marked xfail (strict=False) here and in known.py, which
marks the fuzz tests of the same methods; a fix removes both marks and its test here then
asserts the answer the fault now gets."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb


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


async def test_requeue_of_a_dead_letter_at_the_largest_retry_count(
    channel: grpc.aio.Channel,
) -> None:
    envelope = pb.common_pb2.Envelope(
        message_id=str(uuid.uuid4()), correlation_id=str(uuid.uuid4()), producer_id="alice",
        message_type=pb.common_pb2.DATA, content_type="application/json", content_length=2,
        payload=b"{}", retry_count=2**32 - 1,
    )  # fmt: skip
    router = pb.router_pb2_grpc.RouterServiceStub(channel)
    await router.SendMessage(
        pb.router_pb2.SendMessageRequest(msg=envelope), metadata=(("sw4rm-recipient", "bob"),)
    )
    # bob fails it: an admitted message that failed, dead-lettered.
    ack = (b'{"ack_for_message_id": "%s", "ack_stage": "FAILED", "error_code": "internal_error"}'
           % envelope.message_id.encode())  # fmt: skip
    failed = pb.common_pb2.Envelope(
        message_id=str(uuid.uuid4()), correlation_id=envelope.correlation_id, producer_id="bob",
        message_type=pb.common_pb2.ACKNOWLEDGEMENT, content_type="application/json",
        content_length=len(ack), payload=ack,
    )  # fmt: skip
    await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=failed))
    dlq = pb.apiary_pb2_grpc.DlqServiceStub(channel)
    listed = await dlq.List(pb.apiary_pb2.ListDlqRequest())
    entry_ids = [entry.entry_id for entry in listed.entries]
    assert entry_ids
    # The copy would need retry_count 2^32, which no Envelope can carry: the requeue of
    # that entry is refused, naming the field, and the entry stays in the DLQ.
    reply = await dlq.Requeue(pb.apiary_pb2.RequeueDlqRequest(entry_ids=entry_ids))
    assert [r.ok for r in reply.results] == [False] * len(entry_ids)
    assert all(r.error.startswith("validation_error: retry_count: ") for r in reply.results)
    pending = await dlq.List(
        pb.apiary_pb2.ListDlqRequest(filter=pb.apiary_pb2.DlqFilter(exclude_requeued=True))
    )
    assert [entry.entry_id for entry in pending.entries] == entry_ids
