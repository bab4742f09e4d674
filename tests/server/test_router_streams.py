"""The router's extension services over real gRPC sockets: batched sending with per-envelope
outcomes (RFC 5.4), batched, resumable inbound delivery (RFC 5.5), per-agent buffer capacity
and the back-pressure metrics (RFC 13)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from apiary.core.access.proof import (
    DEFAULT_AUDIENCE,
    PROOF_KEY,
    CallProof,
    encode_proof,
    proof_payload,
)
from apiary.core.envelope import AckStage
from apiary.engine.settings import RouterSettings
from apiary.wire import pb
from tests.server.wire_client import (
    WAIT_S,
    Running,
    descriptor,
    envelope,
    error_detail,
    next_batch,
    open_running,
    register,
)

apiary_pb2 = pb.apiary_pb2


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    async with open_running(tmp_path) as r:
        await register(r.channel, "alice", "bob")
        yield r


def _frame(*items: tuple[pb.common_pb2.Envelope, str]) -> apiary_pb2.SendFrame:
    return apiary_pb2.SendFrame(
        items=[apiary_pb2.OutboundEnvelope(msg=m, recipient=r) for m, r in items]
    )


async def _ack(running: Running, agent: str, message_id: str, stage: AckStage) -> None:
    body = {"ack_for_message_id": message_id, "ack_stage": stage.name}
    ack = envelope(agent, body, message_type=pb.common_pb2.ACKNOWLEDGEMENT)
    router = pb.router_pb2_grpc.RouterServiceStub(running.channel)
    await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=ack))


# --- batching (RFC 5.4) ---------------------------------------------------------------------------


@pytest.mark.conformance("transport.batching.advertised")
async def test_batching_is_advertised_as_its_own_service(running: Running) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(running.channel)
    request = reflection_pb2.ServerReflectionRequest(
        file_containing_symbol="apiary.v1.RouterStreamService"
    )
    async for reply in stub.ServerReflectionInfo(iter([request])):
        assert reply.file_descriptor_response.file_descriptor_proto
        break
    names = apiary_pb2.DESCRIPTOR.services_by_name["RouterStreamService"].methods_by_name
    assert set(names) == {"SendStream", "Inbound"}


@pytest.mark.conformance(
    "transport.batching.per-message-outcomes", "transport.batching.retry-failed-members"
)
async def test_a_batch_reports_each_member_and_only_failures_are_retried(
    running: Running,
) -> None:
    good1 = envelope("alice", {"n": 1})
    bad_length = envelope("alice", {"n": 2}, content_length=1)
    good2 = envelope("alice", {"n": 3})
    no_route = envelope("alice", {"n": 4})
    unsupported = envelope("alice", b"\x89PNG", content_type="image/png", content_length=4)
    stub = pb.apiary_pb2_grpc.RouterStreamServiceStub(running.channel)
    call = stub.SendStream()
    await call.write(_frame((good1, "bob"), (bad_length, "bob"), (good2, "bob"),
                            (no_route, "ghost"), (unsupported, "bob")))  # fmt: skip
    reply = await asyncio.wait_for(call.read(), WAIT_S)
    results = [(r.message_id, r.accepted, r.error_code) for r in reply.results]
    assert results == [
        (good1.message_id, True, ""),
        (bad_length.message_id, False, "validation_error"),
        (good2.message_id, True, ""),
        (no_route.message_id, False, "no_route"),
        (unsupported.message_id, False, "unsupported_message_type"),
    ]
    accepted = [r for r in reply.results if r.accepted]
    assert [r.recipient for r in accepted] == ["bob", "bob"]
    assert accepted[0].offset < accepted[1].offset
    messages = running.coordinator.store.messages
    for env in (bad_length, no_route, unsupported):
        assert await messages.get(env.message_id) is None
    # Retry only the failed members, corrected, on the same stream.
    bad_length.content_length = len(bad_length.payload)
    await call.write(_frame((bad_length, "bob"), (no_route, "alice")))
    retry = await asyncio.wait_for(call.read(), WAIT_S)
    assert [(r.message_id, r.accepted) for r in retry.results] == [
        (bad_length.message_id, True),
        (no_route.message_id, True),
    ]
    await call.done_writing()
    assert await asyncio.wait_for(call.read(), WAIT_S) is grpc.aio.EOF
    bob = [m.message_id for m in await messages.inbox("bob") if m.producer_id == "alice"]
    assert bob == [good1.message_id, good2.message_id, bad_length.message_id]


async def test_a_batch_member_over_the_buffer_is_refused_alone(tmp_path: Path) -> None:
    async with open_running(tmp_path, RouterSettings(buffer_capacity=2)) as r:
        await register(r.channel, "alice", "bob")
        envs = [envelope("alice", {"n": n}) for n in range(3)]
        call = pb.apiary_pb2_grpc.RouterStreamServiceStub(r.channel).SendStream()
        await call.write(_frame(*((e, "bob") for e in envs)))
        reply = await asyncio.wait_for(call.read(), WAIT_S)
        await call.done_writing()
        assert [(x.accepted, x.error_code) for x in reply.results] == [
            (True, ""),
            (True, ""),
            (False, "buffer_full"),
        ]


@pytest.mark.conformance("transport.batching.size-count-limits")
async def test_frames_are_bounded_by_count_and_size(tmp_path: Path) -> None:
    settings = RouterSettings(max_frame_items=3, max_frame_bytes=64)
    async with open_running(tmp_path, settings) as r:
        await register(r.channel, "alice", "bob")
        stub = pb.apiary_pb2_grpc.RouterStreamServiceStub(r.channel)
        too_many = _frame(*((envelope("alice", {"n": n}), "bob") for n in range(4)))
        too_big = _frame((envelope("alice", {"pad": "x" * 100}), "bob"))
        for frame, needle in ((too_many, "at most 3 envelopes"), (too_big, "at most 64 payload")):
            call = stub.SendStream()
            await call.write(frame)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await asyncio.wait_for(call.read(), WAIT_S)
            assert needle in (caught.value.details() or "")
            assert error_detail(caught.value).error_code == "validation_error"
        # The limit is on payload bytes: a frame whose envelopes make it larger than 64 bytes
        # in all, with payloads under that, is admitted.
        fits = _frame((envelope("alice", {"n": 1}), "bob"), (envelope("alice", {"n": 2}), "bob"))
        assert fits.ByteSize() > 64
        call = stub.SendStream()
        await call.write(fits)
        reply = await asyncio.wait_for(call.read(), WAIT_S)
        assert [r.accepted for r in reply.results] == [True, True]
        await call.done_writing()


# --- inbound delivery and resumption (RFC 5.5) --------------------------------------------


@pytest.mark.conformance("transport.resume.durable", "transport.resume.bound-backlog")
async def test_inbound_batches_carry_offsets_and_resume_tokens(running: Running) -> None:
    router = pb.router_pb2_grpc.RouterServiceStub(running.channel)
    sent = [envelope("alice", {"n": n}) for n in range(5)]
    for env in sent:
        meta = (("sw4rm-recipient", "bob"),)
        assert (
            await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=env), metadata=meta)
        ).accepted
    inbound = pb.apiary_pb2_grpc.RouterStreamServiceStub(running.channel)
    call = inbound.Inbound(apiary_pb2.InboundRequest(agent_id="bob", max_batch=2))
    seen = []
    while len(seen) < 5:
        batch = await asyncio.wait_for(call.read(), WAIT_S)
        assert 0 < len(batch.deliveries) <= 2
        seen.extend(d for d in batch.deliveries if d.msg.producer_id == "alice")
    call.cancel()
    assert [d.msg.message_id for d in seen] == [e.message_id for e in sent]
    assert [d.attempt for d in seen] == [1] * 5
    offsets = [d.offset for d in seen]
    assert offsets == sorted(offsets)
    # The consumer processed up to the third and reconnects with its token.
    resumed = inbound.Inbound(
        apiary_pb2.InboundRequest(agent_id="bob", resume_token=seen[2].resume_token)
    )
    again = await next_batch(resumed)
    resumed.cancel()
    assert [(d.msg.message_id, d.attempt) for d in again] == [
        (sent[3].message_id, 2),
        (sent[4].message_id, 2),
    ]
    # Or with the plain offset.
    by_offset = inbound.Inbound(
        apiary_pb2.InboundRequest(agent_id="bob", resume_after=seen[3].offset)
    )
    assert [d.msg.message_id for d in await next_batch(by_offset)] == [sent[4].message_id]
    by_offset.cancel()


async def test_a_live_stream_receives_new_messages_as_they_arrive(running: Running) -> None:
    inbound = pb.apiary_pb2_grpc.RouterStreamServiceStub(running.channel)
    call = inbound.Inbound(apiary_pb2.InboundRequest(agent_id="bob"))
    await asyncio.wait_for(call.read(), WAIT_S)  # bob's directory notice
    router = pb.router_pb2_grpc.RouterServiceStub(running.channel)
    env = envelope("alice", {"to": "bob"})
    await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=env))
    (delivery,) = await next_batch(call)
    call.cancel()
    assert delivery.msg.message_id == env.message_id


@pytest.mark.conformance("transport.resume.expired-clear-error")
async def test_an_expired_resume_position_fails_with_guidance(running: Running) -> None:
    router = pb.router_pb2_grpc.RouterServiceStub(running.channel)
    sent = [envelope("alice", {"to": "bob", "n": n}) for n in range(3)]
    for env in sent:
        await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=env))
    inbound = pb.apiary_pb2_grpc.RouterStreamServiceStub(running.channel)
    call = inbound.Inbound(apiary_pb2.InboundRequest(agent_id="bob"))
    first = await next_batch(call)
    call.cancel()
    for delivery in first[:2]:
        await _ack(running, "bob", delivery.msg.message_id, AckStage.FULFILLED)
    running.clock.advance(1)
    await running.coordinator.store.messages.purge_finished(running.clock.now())
    stale = inbound.Inbound(
        apiary_pb2.InboundRequest(agent_id="bob", resume_token=first[0].resume_token)
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(stale.read(), WAIT_S)
    assert caught.value.code() is grpc.StatusCode.OUT_OF_RANGE
    detail = error_detail(caught.value)
    assert detail.error_code == "resume_expired"
    assert "Reconnect with resume_after=0" in detail.message
    assert detail.details["oldest_offset"] == str(first[2].offset)
    fresh = inbound.Inbound(apiary_pb2.InboundRequest(agent_id="bob"))
    assert [d.msg.message_id for d in await next_batch(fresh)] == [sent[2].message_id]
    fresh.cancel()


async def test_a_resume_token_of_another_agent_is_refused(running: Running) -> None:
    router = pb.router_pb2_grpc.RouterServiceStub(running.channel)
    await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=envelope("bob", {"to": "alice"})))
    inbound = pb.apiary_pb2_grpc.RouterStreamServiceStub(running.channel)
    call = inbound.Inbound(apiary_pb2.InboundRequest(agent_id="alice"))
    (delivery,) = await next_batch(call)
    call.cancel()
    stolen = inbound.Inbound(
        apiary_pb2.InboundRequest(agent_id="bob", resume_token=delivery.resume_token)
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(stolen.read(), WAIT_S)
    detail = error_detail(caught.value)
    assert (detail.error_code, detail.details["field"]) == ("validation_error", "resume_token")


async def test_a_second_anonymous_stream_is_refused_and_the_first_keeps_reading(
    running: Running,
) -> None:
    """Nobody but bob may read bob's messages: a second stream that does not prove it is bob
    is refused while bob's is live, and bob still receives what comes next."""
    inbound = pb.apiary_pb2_grpc.RouterStreamServiceStub(running.channel)
    first = inbound.Inbound(apiary_pb2.InboundRequest(agent_id="bob"))
    await asyncio.wait_for(first.read(), WAIT_S)
    second = inbound.Inbound(apiary_pb2.InboundRequest(agent_id="bob"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(second.read(), WAIT_S)
    detail = error_detail(caught.value)
    assert (detail.error_code, detail.details["reason"]) == ("already_in_progress", "stream_live")
    assert "bob already has a live stream" in detail.message
    router = pb.router_pb2_grpc.RouterServiceStub(running.channel)
    env = envelope("alice", {"to": "bob"})
    await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=env))
    (delivery,) = await next_batch(first)
    first.cancel()
    assert delivery.msg.message_id == env.message_id


def _proof(
    key: Ed25519PrivateKey, agent_id: str, method: str, now: float
) -> tuple[tuple[str, str], ...]:
    unix_ms, nonce = int(now * 1000), os.urandom(16)
    signature = key.sign(proof_payload(DEFAULT_AUDIENCE, method, agent_id, unix_ms, nonce))
    return ((PROOF_KEY, encode_proof(CallProof(agent_id, unix_ms, nonce, signature))),)


async def test_the_agent_proving_it_is_itself_takes_its_stream_over(running: Running) -> None:
    """The hand-over of a reconnecting agent: a new stream with the agent's proof supersedes
    the live one, which ends with agent_unavailable."""
    key = Ed25519PrivateKey.generate()
    registry = pb.registry_pb2_grpc.RegistryServiceStub(running.channel)
    described = descriptor("carol")
    described.public_key = key.public_key().public_bytes_raw()
    reply = await registry.RegisterAgent(pb.registry_pb2.RegisterAgentRequest(agent=described))
    assert reply.accepted, reply.reason
    inbound = pb.apiary_pb2_grpc.RouterStreamServiceStub(running.channel)
    method = "/apiary.v1.RouterStreamService/Inbound"
    first = inbound.Inbound(apiary_pb2.InboundRequest(agent_id="carol"))
    await asyncio.wait_for(first.read(), WAIT_S)
    second = inbound.Inbound(
        apiary_pb2.InboundRequest(agent_id="carol"),
        metadata=_proof(key, "carol", method, running.clock.now()),
    )
    await asyncio.wait_for(second.read(), WAIT_S)  # open: the directory notice
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(first.read(), WAIT_S)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    assert error_detail(caught.value).error_code == "agent_unavailable"
    router = pb.router_pb2_grpc.RouterServiceStub(running.channel)
    env = envelope("alice", {"to": "carol"})
    await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=env))
    (delivery,) = await next_batch(second)
    second.cancel()
    assert delivery.msg.message_id == env.message_id


# --- buffers and metrics (RFC 13) -----------------------------------------------------------------


@pytest.mark.conformance(
    "backpressure.buffer.configurable-per-agent", "backpressure.buffer.operators-tune",
    "backpressure.overflow.reject-buffer-full",
)  # fmt: skip
async def test_operators_set_an_agents_buffer_capacity(running: Running) -> None:
    discovery = pb.apiary_pb2_grpc.DiscoveryServiceStub(running.channel)
    reply = await discovery.SetBufferCapacity(
        apiary_pb2.SetBufferCapacityRequest(agent_id="bob", capacity=2)
    )
    assert reply.capacity == 2
    router = pb.router_pb2_grpc.RouterServiceStub(running.channel)
    answers = []
    for n in range(3):
        request = pb.router_pb2.SendMessageRequest(msg=envelope("alice", {"to": "bob", "n": n}))
        answers.append(await router.SendMessage(request))
    assert [a.accepted for a in answers] == [True, True, False]
    assert answers[2].reason.startswith("buffer_full: Inbound buffer capacity exceeded")
    info = await discovery.GetAgent(apiary_pb2.GetAgentRequest(agent_id="bob"))
    assert (info.buffer_capacity, info.buffer_depth) == (2, 2)
    other = await discovery.GetAgent(apiary_pb2.GetAgentRequest(agent_id="alice"))
    assert other.buffer_capacity == 10
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await discovery.SetBufferCapacity(
            apiary_pb2.SetBufferCapacityRequest(agent_id="bob", capacity=0)
        )
    assert error_detail(caught.value).details["field"] == "capacity"
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await discovery.SetBufferCapacity(
            apiary_pb2.SetBufferCapacityRequest(agent_id="ghost", capacity=5)
        )
    assert missing.value.code() is grpc.StatusCode.NOT_FOUND


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


@pytest.mark.conformance("backpressure.metrics.expose")
async def test_back_pressure_metrics_are_exposed(running: Running) -> None:
    router = pb.router_pb2_grpc.RouterServiceStub(running.channel)
    sent = []
    for n in range(11):
        env = envelope("alice", {"to": "bob", "n": n})
        sent.append(env)
        await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=env))
    running.clock.advance(4)
    # bob fetches one bounded batch (a live stream would fetch everything), then finishes one.
    delivery = running.coordinator.delivery
    first = await delivery.poll("bob", await delivery.open("bob"), max_batch=3)
    fetched = [h.message.message_id for h in first if h.message.producer_id == "alice"]
    assert fetched == [e.message_id for e in sent[:3]]
    running.clock.advance(1)
    await _ack(running, "bob", fetched[0], AckStage.FULFILLED)
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://{running.http}/metrics") as response,
    ):
        assert response.status == 200
        text = await response.text()
    samples = _samples(text)
    bob = '{agent_id="bob"}'
    assert samples[f"apiary_router_inbound_queue_capacity{bob}"] == 10
    assert samples[f"apiary_router_inbound_queue_depth{bob}"] == 9
    assert samples['apiary_router_enqueue_rejects_total{agent_id="bob",reason="buffer_full"}'] == 1
    assert samples['apiary_router_nacks_total{agent_id="alice",error_code="buffer_full"}'] == 1
    assert samples[f"apiary_router_messages_accepted_total{bob}"] >= 10
    assert samples[f"apiary_router_enqueue_latency_seconds_count{bob}"] >= 10
    assert samples[f"apiary_agent_dequeue_latency_seconds_count{bob}"] >= 1
    assert samples[f"apiary_agent_dequeue_latency_seconds_sum{bob}"] >= 4.0
    assert samples[f"apiary_agent_process_time_seconds_count{bob}"] == 1
    assert samples[f"apiary_agent_process_time_seconds_sum{bob}"] == 1.0
    # Messages 4 to 10 were never fetched: the oldest of them has waited 5 s.
    assert samples[f"apiary_router_oldest_enqueued_age_seconds{bob}"] == 5.0


async def test_a_refused_send_is_answered_logged_and_counted_not_dead_lettered(
    running: Running,
) -> None:
    router = pb.router_pb2_grpc.RouterServiceStub(running.channel)
    typo = envelope("alice", {"to": "bbo", "n": 1})  # no agent bbo: refused at admission
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=typo))
    assert error_detail(caught.value).error_code == "no_route"
    coordinator = running.coordinator
    (logged,) = [
        e for e in await coordinator.events.read(limit=1000) if e.event_type == "message.rejected"
    ]
    assert (logged.details["message_id"], logged.details["error_code"]) == (
        typo.message_id,
        "no_route",
    )
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://{running.http}/metrics") as response,
    ):
        samples = _samples(await response.text())
    assert samples['apiary_router_admission_refused_total{error_code="no_route"}'] == 1
    # The mistyped name is no label of its own (bounded series): all such are one.
    assert (
        samples['apiary_router_enqueue_rejects_total{agent_id="(unregistered)",reason="no_route"}']
        == 1
    )
    assert not any("bbo" in name for name in samples)
    assert not any(name.startswith("apiary_router_dead_lettered_total") for name in samples)
    assert await coordinator.store.dlq.list() == []
    assert await coordinator.store.messages.get(typo.message_id) is None
