"""The coordinator over real gRPC sockets: health, reflection, dispatch, errors, routing."""

from __future__ import annotations

import asyncio
import json
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from apiary.errors import UnimplementedError
from apiary.server.context import CallContext
from apiary.server.coordinator import Coordinator
from apiary.server.dispatch import Dispatcher
from apiary.wire import pb
from apiary.wire.services import CANONICAL_SERVICES
from tests.server.wire_client import envelope, error_detail, register

CANONICAL = {
    "sw4rm.registry.RegistryService",
    "sw4rm.router.RouterService",
    "sw4rm.scheduler.SchedulerService",
    "sw4rm.scheduler.SchedulerPolicyService",
    "sw4rm.hitl.HitlService",
    "sw4rm.worktree.WorktreeService",
    "sw4rm.tool.ToolService",
    "sw4rm.connector.ConnectorService",
    "sw4rm.negotiation.NegotiationService",
    "sw4rm.negotiation_room.NegotiationRoomService",
    "sw4rm.handoff.HandoffService",
    "sw4rm.workflow.WorkflowService",
    "sw4rm.reasoning.InferenceProxy",
    "sw4rm.reasoning.ReasoningProxy",
    "sw4rm.activity.ActivityService",
    "sw4rm.logging.LoggingService",
}


async def _next(
    stream: grpc.aio.UnaryStreamCall,
    message_type: int,  # type: ignore[type-arg]
) -> pb.router_pb2.StreamItem:
    """The next delivered item of `message_type`, skipping coordinator notices."""
    while True:
        item = await asyncio.wait_for(stream.read(), 10)
        if item.msg.message_type == message_type:
            return item  # type: ignore[no-any-return]


def test_catalogue_lists_every_canonical_service() -> None:
    assert set(CANONICAL_SERVICES) == CANONICAL


@pytest.mark.conformance("transport.health.grpc-health")
async def test_health_reports_serving(channel: grpc.aio.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    for service in ("", "sw4rm.router.RouterService"):
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.conformance("transport.proto.canonical-contracts")
async def test_reflection_lists_all_canonical_services(channel: grpc.aio.Channel) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    async for reply in stub.ServerReflectionInfo(iter([request])):
        names = {s.name for s in reply.list_services_response.service}
        break
    assert names >= CANONICAL | {"apiary.v1.EventLogService", "grpc.health.v1.Health"}


async def test_unbuilt_method_answers_unimplemented_naming_its_area(
    channel: grpc.aio.Channel,
) -> None:
    stub = pb.worktree_pb2_grpc.WorktreeServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Bind(pb.worktree_pb2.BindRequest())
    assert caught.value.code() is grpc.StatusCode.UNIMPLEMENTED
    assert "worktrees" in (caught.value.details() or "")
    assert error_detail(caught.value).error_code == "unimplemented"


async def test_unbuilt_streaming_method_answers_unimplemented() -> None:
    # Every streaming method is built now: a dispatcher without the tool handler stands in.
    route = Dispatcher({}).route("/sw4rm.tool.ToolService/CallStream")
    assert route is not None
    assert not route.implemented
    with pytest.raises(UnimplementedError) as caught:
        async for _ in route.streaming()(pb.tool_pb2.ToolCall(call_id="c"), CallContext("grpc")):
            pass
    assert "tool calling" in caught.value.message


async def test_register_send_and_stream_round_trip(
    coordinator: Coordinator, channel: grpc.aio.Channel
) -> None:
    await register(channel, "alice")
    await register(channel, "bob")
    router = pb.router_pb2_grpc.RouterServiceStub(channel)
    env = envelope("alice", {"to": "bob", "text": "hi"})
    reply = await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=env))
    assert reply.accepted
    stream = router.StreamIncoming(pb.router_pb2.StreamRequest(agent_id="bob"))
    item = await _next(stream, pb.common_pb2.DATA)
    stream.cancel()
    assert item.msg.message_id == env.message_id
    assert item.msg.payload == env.payload
    stored = await coordinator.store.messages.get(env.message_id)
    assert stored is not None and stored.recipient == "bob"


async def test_recipient_metadata_overrides_payload(
    coordinator: Coordinator, channel: grpc.aio.Channel
) -> None:
    for agent in ("alice", "bob", "carol"):
        await register(channel, agent)
    router = pb.router_pb2_grpc.RouterServiceStub(channel)
    env = envelope("alice", {"to": "bob"})
    await router.SendMessage(
        pb.router_pb2.SendMessageRequest(msg=env), metadata=(("sw4rm-recipient", "carol"),)
    )
    stored = await coordinator.store.messages.get(env.message_id)
    assert stored is not None and stored.recipient == "carol"


async def test_unaddressed_message_is_no_route(channel: grpc.aio.Channel) -> None:
    await register(channel, "alice")
    router = pb.router_pb2_grpc.RouterServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=envelope("alice", {})))
    assert error_detail(caught.value).error_code == "no_route"
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND


async def test_bad_content_length_is_validation_error_naming_field(
    coordinator: Coordinator, channel: grpc.aio.Channel
) -> None:
    await register(channel, "alice")
    await register(channel, "bob")
    router = pb.router_pb2_grpc.RouterServiceStub(channel)
    env = envelope("alice", {"to": "bob"}, content_length=3)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=env))
    detail = error_detail(caught.value)
    assert detail.error_code == "validation_error"
    assert detail.details["field"] == "content_length"
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert await coordinator.store.messages.get(env.message_id) is None


async def test_ack_moves_state_and_reaches_the_producer(
    coordinator: Coordinator, channel: grpc.aio.Channel
) -> None:
    await register(channel, "alice")
    await register(channel, "bob")
    router = pb.router_pb2_grpc.RouterServiceStub(channel)
    env = envelope("alice", {"to": "bob"})
    await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=env))
    ack_body = {"ack_for_message_id": env.message_id, "ack_stage": "FULFILLED"}
    ack = envelope("bob", ack_body, message_type=pb.common_pb2.ACKNOWLEDGEMENT)
    await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=ack))
    stored = await coordinator.store.messages.get(env.message_id)
    assert stored is not None and stored.state == "FULFILLED"
    stream = router.StreamIncoming(pb.router_pb2.StreamRequest(agent_id="alice"))
    item = await _next(stream, pb.common_pb2.ACKNOWLEDGEMENT)
    stream.cancel()
    assert item.msg.message_id == ack.message_id


async def test_protobuf_ack_payload_is_accepted(
    coordinator: Coordinator, channel: grpc.aio.Channel
) -> None:
    await register(channel, "alice")
    await register(channel, "bob")
    router = pb.router_pb2_grpc.RouterServiceStub(channel)
    env = envelope("alice", {"to": "bob"})
    await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=env))
    payload = pb.common_pb2.Ack(
        ack_for_message_id=env.message_id, ack_stage=pb.common_pb2.REJECTED,
        error_code=pb.common_pb2.VALIDATION_ERROR,
    ).SerializeToString()  # fmt: skip
    ack = pb.common_pb2.Envelope(
        message_id=str(uuid.uuid4()), producer_id="bob", correlation_id=str(uuid.uuid4()),
        message_type=pb.common_pb2.ACKNOWLEDGEMENT, content_type="application/protobuf",
        content_length=len(payload), payload=payload,
    )  # fmt: skip
    await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=ack))
    stored = await coordinator.store.messages.get(env.message_id)
    assert stored is not None
    assert (stored.state, stored.error_code) == ("REJECTED", "validation_error")


async def test_stream_for_unknown_agent_is_not_found(channel: grpc.aio.Channel) -> None:
    router = pb.router_pb2_grpc.RouterServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in router.StreamIncoming(pb.router_pb2.StreamRequest(agent_id="ghost")):
            pass
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND


async def test_events_are_logged_and_readable(channel: grpc.aio.Channel) -> None:
    await register(channel, "alice")
    logging_stub = pb.logging_pb2_grpc.LoggingServiceStub(channel)
    await logging_stub.Ingest(
        pb.logging_pb2.LogEvent(
            agent_id="alice", event_type="task.step", level="INFO",
            correlation_id="c-1", details_json='{"step": 1}',
        )
    )  # fmt: skip
    stub = pb.apiary_pb2_grpc.EventLogServiceStub(channel)
    reply = await stub.ReadEvents(pb.apiary_pb2.ReadEventsRequest(correlation_id="c-1"))
    assert [e.event_type for e in reply.events] == ["agent.log"]
    assert json.loads(reply.events[0].details_json)["details"] == {"step": 1}
    everything = await stub.ReadEvents(pb.apiary_pb2.ReadEventsRequest())
    types = [e.event_type for e in everything.events]
    assert types[:2] == ["coordinator.started", "agent.registered"]
    assert everything.last_sequence == everything.events[-1].sequence


async def test_ingest_rejects_bad_level(channel: grpc.aio.Channel) -> None:
    stub = pb.logging_pb2_grpc.LoggingServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Ingest(pb.logging_pb2.LogEvent(event_type="x", level="LOUD"))
    assert error_detail(caught.value).details["field"] == "level"


@pytest.mark.conformance(
    "router.fields.message-id", "ids.message-id.uuid4", "envelope.message-id.uuid4"
)
async def test_non_uuid4_message_id_is_rejected(
    coordinator: Coordinator, channel: grpc.aio.Channel
) -> None:
    await register(channel, "alice")
    await register(channel, "bob")
    router = pb.router_pb2_grpc.RouterServiceStub(channel)
    for bad in ("not-a-uuid", str(uuid.uuid1()), ""):
        env = envelope("alice", {"to": "bob"}, message_id=bad)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=env))
        assert error_detail(caught.value).details["field"] == "message_id"
    inbox = await coordinator.store.messages.inbox("bob")
    assert [m for m in inbox if m.message_type == pb.common_pb2.DATA] == []


@pytest.mark.conformance("ids.message-id.unique", "envelope.message-id.unique")
async def test_reused_message_id_is_refused_and_the_first_kept(
    coordinator: Coordinator, channel: grpc.aio.Channel
) -> None:
    await register(channel, "alice")
    await register(channel, "bob")
    router = pb.router_pb2_grpc.RouterServiceStub(channel)
    first = envelope("alice", {"to": "bob", "n": 1})
    await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=first))
    second = envelope("alice", {"to": "bob", "n": 2}, message_id=first.message_id)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await router.SendMessage(pb.router_pb2.SendMessageRequest(msg=second))
    assert error_detail(caught.value).error_code == "validation_error"
    assert error_detail(caught.value).details["field"] == "message_id"
    inbox = [
        m
        for m in await coordinator.store.messages.inbox("bob")
        if m.message_type == pb.common_pb2.DATA
    ]
    assert [m.message_id for m in inbox] == [first.message_id]
    assert b'"n": 1' in inbox[0].envelope
