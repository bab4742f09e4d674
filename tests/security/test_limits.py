"""Limits at the edge (issue 22): what a careless or hostile client sends is refused where it
enters with validation_error naming the field, in an answer of bounded size, and nothing of
it reaches the store. One test per finding, each replayed as it was found, over real gRPC and
HTTP sockets against a coordinator on SQLite (where integers past 2**63 used to overflow).

Every limit and its default: docs/decisions.md, "Limits".
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from google.protobuf.message import Message

from apiary.core.events import MAX_EVENT_TYPES
from apiary.core.limits import DEFAULT_LIMITS
from apiary.server.config.address import Address
from apiary.server.config.loader import load_config
from apiary.server.context import RECIPIENT_KEY
from apiary.server.coordinator import Coordinator, open_coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb
from tests.server.wire_client import WAIT_S, envelope, error_detail, register

apiary_pb2 = pb.apiary_pb2
ANSWER_BYTES = 1024
"""What a refusal may take (message plus details): a short prefix of the input, not all of it."""
HUGE = 100_000
"""Characters of an oversized id (the issue's was 10 MB; the answer must not grow with it)."""
DEEP = "[" * 100_000 + "]" * 100_000
DIGITS = "9" * 5000


@dataclass
class Running:
    coordinator: Coordinator
    channel: grpc.aio.Channel
    http: aiohttp.ClientSession

    def stub(self, module: Any, service: str) -> Any:
        return getattr(module, f"{service}Stub")(self.channel)

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        async with self.http.post(f"/v1/{path}", data=json.dumps(body)) as resp:
            return resp.status, await resp.json(content_type=None)


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    async with (
        open_test_coordinator(tmp_path, store="") as coordinator,
        grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel,
        aiohttp.ClientSession(base_url=f"http://{coordinator.http_address}") as http,
    ):
        await register(channel, "alice", "bob")
        yield Running(coordinator, channel, http)


async def refused(call: Awaitable[Any], field: str) -> grpc.aio.AioRpcError:
    """The call fails INVALID_ARGUMENT validation_error naming `field`, in a short answer."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    error = caught.value
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details())
    detail = error_detail(error)
    assert detail.error_code == "validation_error"
    assert detail.details["field"] == field, (detail.details, detail.message)
    size = len(detail.message) + sum(len(k) + len(v) for k, v in detail.details.items())
    assert size < ANSWER_BYTES, detail.message[:200]
    return error


def router(r: Running) -> Any:
    return r.stub(pb.router_pb2_grpc, "RouterService")


def dlq(r: Running) -> Any:
    return r.stub(pb.apiary_pb2_grpc, "DlqService")


async def nothing_stored(r: Running) -> None:
    """No dead letter, nothing waiting for bob."""
    letters = await dlq(r).List(apiary_pb2.ListDlqRequest())
    assert list(letters.entries) == []
    discovery = r.stub(pb.apiary_pb2_grpc, "DiscoveryService")
    bob = await discovery.GetAgent(apiary_pb2.GetAgentRequest(agent_id="bob"))
    assert bob.buffer_depth == 0


# --- poison that outlives the request ---------------------------------------------------------


async def test_an_activity_start_no_timestamp_can_show_is_refused_and_reads_still_work(
    running: Running,
) -> None:
    stub = running.stub(pb.apiary_pb2_grpc, "ActivityBufferService")
    entry = apiary_pb2.ActivityRecord(agent_id="alice", task_id="t-1")
    entry.started_at.seconds = 2**40
    await refused(
        stub.Register(apiary_pb2.RegisterActivityRequest(entry=entry)), "entry.started_at"
    )
    scheduler = running.stub(pb.scheduler_pb2_grpc, "SchedulerService")
    assert (
        list(
            (
                await scheduler.PollActivityBuffer(pb.scheduler_pb2.PollActivityBufferRequest())
            ).entries
        )
        == []
    )
    status, _ = await running.post("apiary.v1.ActivityBufferService/List", {})
    assert status == 200


async def test_an_activity_start_beyond_the_clock_skew_is_refused(running: Running) -> None:
    stub = running.stub(pb.apiary_pb2_grpc, "ActivityBufferService")
    entry = apiary_pb2.ActivityRecord(agent_id="alice", task_id="t-1")
    entry.started_at.seconds = int(time.time() + DEFAULT_LIMITS.clock_skew_s + 600)
    error = await refused(
        stub.Register(apiary_pb2.RegisterActivityRequest(entry=entry)), "entry.started_at"
    )
    assert "clock_skew_s" in error.details()


async def test_an_envelope_timestamp_no_timestamp_can_show_is_refused_and_http_delivery_goes_on(
    running: Running,
) -> None:
    poisoned = envelope("alice", {"n": 1})
    poisoned.timestamp.seconds = 2**62
    request = pb.router_pb2.SendMessageRequest(msg=poisoned)
    await refused(
        router(running).SendMessage(request, metadata=((RECIPIENT_KEY, "bob"),)), "msg.timestamp"
    )
    later = pb.router_pb2.SendMessageRequest(msg=envelope("alice", {"n": 2}))
    assert (await router(running).SendMessage(later, metadata=((RECIPIENT_KEY, "bob"),))).accepted
    body = json.dumps({"agent_id": "bob"})
    async with running.http.post(
        "/v1/sw4rm.router.RouterService/StreamIncoming", data=body
    ) as resp:
        assert resp.status == 200
        line = json.loads(await resp.content.readline())
    assert "error" not in line, line
    assert json.loads(base64.b64decode(line["msg"]["payload"])) == {"n": 2}


# --- unbounded ids ------------------------------------------------------------------------------

ENVELOPE_IDS = [
    "producer_id",
    "correlation_id",
    "idempotency_token",
    "repo_id",
    "worktree_id",
    "hlc_timestamp",
]


@pytest.mark.parametrize("field", ENVELOPE_IDS)
async def test_an_envelope_id_past_its_limit_is_refused_and_nothing_is_stored(
    running: Running, field: str
) -> None:
    msg = envelope("alice", {"n": 1}, **{field: "x" * HUGE})
    request = pb.router_pb2.SendMessageRequest(msg=msg)
    error = await refused(
        router(running).SendMessage(request, metadata=((RECIPIENT_KEY, "bob"),)), field
    )
    assert f"({HUGE} characters)" in error.details()
    await nothing_stored(running)


@pytest.mark.parametrize("field", ENVELOPE_IDS)
async def test_a_stream_frame_with_an_id_past_its_limit_ends_the_stream_storing_nothing(
    running: Running, field: str
) -> None:
    stub = running.stub(pb.apiary_pb2_grpc, "RouterStreamService")
    good = apiary_pb2.OutboundEnvelope(msg=envelope("alice", {"n": 1}), recipient="bob")
    bad = apiary_pb2.OutboundEnvelope(
        msg=envelope("alice", {"n": 2}, **{field: "x" * HUGE}), recipient="bob"
    )

    async def frames() -> AsyncIterator[apiary_pb2.SendFrame]:
        yield apiary_pb2.SendFrame(items=[good, bad])

    async def drain() -> None:
        async for _ in stub.SendStream(frames()):
            pass

    await refused(drain(), f"items[1].{field}")
    await nothing_stored(running)


@pytest.mark.parametrize(
    ("service", "method", "message", "field"),
    [
        ("RegistryService", "Heartbeat",
         pb.registry_pb2.HeartbeatRequest(agent_id="a" * 300), "agent_id"),
        ("SchedulerService", "SubmitTask",
         pb.scheduler_pb2.SubmitTaskRequest(agent_id="bob", task_id="t" * 300), "task_id"),
        ("EventLogService", "ReadEvents",
         apiary_pb2.ReadEventsRequest(correlation_id="c" * 300), "correlation_id"),
        ("WorktreeBindingService", "List",
         apiary_pb2.ListBindingsRequest(repo_id="r" * 300), "repo_id"),
        ("ActivityBufferService", "List",
         apiary_pb2.ListActivityRequest(worktree_id="w\u202e"), "worktree_id"),
        ("HitlOperatorService", "Escalate",
         apiary_pb2.EscalateRequest(reason_type="CONFLICT", correlation_id="c" * 300),
         "correlation_id"),
        ("LoggingService", "Ingest",
         pb.logging_pb2.LogEvent(event_type="x", agent_id="alice", correlation_id="c\x00"),
         "correlation_id"),
        ("HandoffService", "RejectHandoff",
         pb.handoff_pb2.HandoffResponse(request_id="h", rejection_reason="r" * 20_000),
         "rejection_reason"),
    ],
)  # fmt: skip
async def test_every_request_id_and_string_has_a_limit_and_a_charset(
    running: Running, service: str, method: str, message: Message, field: str
) -> None:
    module = {
        "RegistryService": pb.registry_pb2_grpc, "SchedulerService": pb.scheduler_pb2_grpc,
        "WorktreeService": pb.worktree_pb2_grpc, "LoggingService": pb.logging_pb2_grpc,
        "HandoffService": pb.handoff_pb2_grpc,
    }.get(service, pb.apiary_pb2_grpc)  # fmt: skip
    await refused(getattr(running.stub(module, service), method)(message), field)


async def test_a_huge_recipient_is_a_short_validation_error_not_resource_exhausted(
    running: Running,
) -> None:
    request = pb.router_pb2.SendMessageRequest(msg=envelope("alice"))
    error = await refused(
        router(running).SendMessage(request, metadata=((RECIPIENT_KEY, "r" * 7000),)),
        RECIPIENT_KEY,
    )
    assert "rrrr" in error.details() and "7000" in error.details()


# --- internal_error instead of a specific error -----------------------------------------------


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda r: dlq(r).Get(apiary_pb2.GetDlqRequest(entry_id=2**63)), "entry_id"),
        (lambda r: dlq(r).List(apiary_pb2.ListDlqRequest(after_id=2**64 - 1)), "after_id"),
        (lambda r: dlq(r).Requeue(apiary_pb2.RequeueDlqRequest(entry_ids=[1, 2**63])), "entry_ids"),
        (lambda r: r.stub(pb.apiary_pb2_grpc, "EventLogService").ReadEvents(
            apiary_pb2.ReadEventsRequest(after_sequence=2**63)), "after_sequence"),
        (lambda r: r.stub(pb.apiary_pb2_grpc, "TaskQueryService").ListTasks(
            apiary_pb2.ListTasksRequest(after_seq=2**63)), "after_seq"),
    ],
)  # fmt: skip
async def test_integers_past_what_sql_keeps_are_refused_before_the_store(
    running: Running, call: Any, field: str
) -> None:
    await refused(call(running), field)


async def test_the_largest_integer_sql_keeps_is_a_plain_answer(running: Running) -> None:
    """The boundary of the test above: 2**63 - 1 reaches the store and answers as usual."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await dlq(running).Get(apiary_pb2.GetDlqRequest(entry_id=2**63 - 1))
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND
    events = running.stub(pb.apiary_pb2_grpc, "EventLogService")
    reply = await events.ReadEvents(apiary_pb2.ReadEventsRequest(after_sequence=2**63 - 1))
    assert list(reply.events) == []


async def test_a_read_naming_more_event_types_than_a_query_holds_is_refused(
    running: Running,
) -> None:
    """1,100 type families made SQLite's expression tree too large: internal_error. At most
    MAX_EVENT_TYPES per read, the limit itself answered as usual."""
    events = running.stub(pb.apiary_pb2_grpc, "EventLogService")
    families = [f"t{n}." for n in range(MAX_EVENT_TYPES + 1)]
    await refused(events.ReadEvents(apiary_pb2.ReadEventsRequest(event_types=families)),
                  "event_types")  # fmt: skip
    at_limit = apiary_pb2.ReadEventsRequest(event_types=families[:MAX_EVENT_TYPES])
    assert list((await events.ReadEvents(at_limit)).events) == []


async def test_an_unknown_heartbeat_state_is_a_validation_error(running: Running) -> None:
    stub = running.stub(pb.registry_pb2_grpc, "RegistryService")
    beat = pb.registry_pb2.HeartbeatRequest(agent_id="alice", state=99)  # type: ignore[arg-type]
    await refused(stub.Heartbeat(beat), "state")


async def test_an_unknown_hitl_reason_type_is_a_validation_error(running: Running) -> None:
    stub = running.stub(pb.hitl_pb2_grpc, "HitlService")
    invocation = pb.hitl_pb2.HitlInvocation(reason_type=99, context=b"{}")  # type: ignore[arg-type]
    await refused(stub.Decide(invocation, timeout=WAIT_S), "reason_type")


async def test_an_unknown_communication_class_is_refused_in_the_reply(running: Running) -> None:
    stub = running.stub(pb.registry_pb2_grpc, "RegistryService")
    agent = pb.registry_pb2.AgentDescriptor(agent_id="carol", name="carol", communication_class=42)  # type: ignore[arg-type]
    reply = await stub.RegisterAgent(pb.registry_pb2.RegisterAgentRequest(agent=agent))
    assert not reply.accepted
    assert reply.reason.startswith("agent.communication_class: 42 is not one of")


JSON_ATTACKS = [
    pytest.param(DEEP, "nests", id="deep"),
    pytest.param("[" * 65 + "]" * 65, "nests", id="past-the-depth-limit"),
    pytest.param('{"n": ' + DIGITS + "}", "digits", id="huge-integer"),
]


async def _start_workflow(r: Running, data: str) -> Any:
    """A workflow that exists, started with `data` (the engine reads it then)."""
    stub = r.stub(pb.workflow_pb2_grpc, "WorkflowService")
    definition = pb.workflow_pb2.WorkflowDefinition(workflow_id="wf")
    definition.nodes["a"].CopyFrom(pb.workflow_pb2.WorkflowNode(node_id="a", agent_id="bob"))
    await stub.CreateWorkflow(pb.workflow_pb2.CreateWorkflowRequest(definition=definition))
    return await stub.StartWorkflow(
        pb.workflow_pb2.StartWorkflowRequest(workflow_id="wf", workflow_data=data)
    )


def _hitl(r: Running) -> Any:
    return r.stub(pb.apiary_pb2_grpc, "HitlOperatorService")


def _escalate(**fields: Any) -> apiary_pb2.EscalateRequest:
    return apiary_pb2.EscalateRequest(reason_type="CONFLICT", **fields)


def _json_calls(text: str) -> list[tuple[Any, str]]:
    """(call on a Running, field) for each place client JSON text arrives; None for the
    provider registration, which answers in its reply."""
    conflict = pb.common_pb2.HitlReasonType.Value("CONFLICT")
    invocation = pb.hitl_pb2.HitlInvocation(reason_type=conflict, context=text.encode())
    log = pb.logging_pb2.LogEvent(event_type="x", agent_id="alice", details_json=text)
    negotiation = apiary_pb2.OpenNegotiationRequest(validation_json=text)
    return [
        (lambda r: r.stub(pb.hitl_pb2_grpc, "HitlService").Decide(invocation, timeout=WAIT_S),
         "context"),
        (lambda r: _hitl(r).Escalate(_escalate(context_json=text)), "context_json"),
        (lambda r: _hitl(r).Escalate(_escalate(subject_json=text)), "subject_json"),
        (lambda r: r.stub(pb.logging_pb2_grpc, "LoggingService").Ingest(log), "details_json"),
        (lambda r: r.stub(pb.apiary_pb2_grpc, "NegotiationOperatorService").Open(negotiation),
         "validation_json"),
        (lambda r: _start_workflow(r, text), "workflow_data"),
        (None, "tools[0].input_schema"),
    ]  # fmt: skip


@pytest.mark.parametrize(("text", "words"), JSON_ATTACKS)
@pytest.mark.parametrize("place", range(7))
async def test_deep_or_huge_number_json_is_a_validation_error_everywhere(
    running: Running, text: str, words: str, place: int
) -> None:
    call, field = _json_calls(text)[place]
    if call is not None:
        error = await refused(call(running), field)
        assert words in error.details(), error.details()
        return
    # ConnectorService answers refusals in its reply.
    stub = running.stub(pb.connector_pb2_grpc, "ConnectorService")
    tool = pb.connector_pb2.ToolDescriptor(tool_name="t", input_schema=text)
    reply = await stub.RegisterProvider(
        pb.connector_pb2.ProviderRegisterRequest(provider_id="alice", tools=[tool]),
        metadata=(("sw4rm-agent-id", "alice"),),
    )
    assert not reply.ok and field in reply.reason and words in reply.reason, reply.reason


@pytest.mark.parametrize(("text", "words"), JSON_ATTACKS)
async def test_the_hitl_decision_sniffer_leaves_bad_json_to_validation(
    running: Running, text: str, words: str
) -> None:
    """A HITL_INVOCATION envelope is looked at as a possible decision before routing; JSON
    it cannot read is no decision, and admission refuses it as the invocation it is."""
    payload = ('{"invocation_id": "i", "decision": ' + text + "}").encode()
    msg = envelope("alice", payload, message_type=pb.common_pb2.HITL_INVOCATION)
    request = pb.router_pb2.SendMessageRequest(msg=msg)
    meta = ((RECIPIENT_KEY, "bob"),)
    error = await refused(router(running).SendMessage(request, metadata=meta), "payload")
    assert words in error.details()


async def test_a_payload_nesting_deeper_than_the_limit_is_refused(running: Running) -> None:
    depth = DEFAULT_LIMITS.json_depth
    fine = envelope("alice", ("[" * depth + "]" * depth).encode())
    deep = envelope("alice", ("[" * (depth + 1) + "]" * (depth + 1)).encode())
    meta = ((RECIPIENT_KEY, "bob"),)
    send = router(running).SendMessage
    assert (await send(pb.router_pb2.SendMessageRequest(msg=fine), metadata=meta)).accepted
    error = await refused(
        send(pb.router_pb2.SendMessageRequest(msg=deep), metadata=meta), "payload"
    )
    assert "nests" in error.details()


@pytest.mark.parametrize("text", ['{"x": 1e400}', '{"x": "\\u0000"}', '{"\\ud800": 1}'])
async def test_json_the_coordinator_keeps_must_be_json_it_can_store_and_show(
    running: Running, text: str
) -> None:
    stub = running.stub(pb.apiary_pb2_grpc, "HitlOperatorService")
    await refused(
        stub.Escalate(apiary_pb2.EscalateRequest(reason_type="CONFLICT", context_json=text)),
        "context_json",
    )


# --- names and durations ------------------------------------------------------------------------


async def test_a_duration_past_the_limit_is_refused(running: Running) -> None:
    stub = running.stub(pb.apiary_pb2_grpc, "HitlOperatorService")
    too_long = int(DEFAULT_LIMITS.max_duration_s) + 1
    await refused(
        stub.Escalate(apiary_pb2.EscalateRequest(reason_type="CONFLICT", timeout_s=too_long)),
        "timeout_s",
    )


@pytest.mark.parametrize("offset", ["9" * 30, str(2**63)])
async def test_a_resume_offset_past_what_sql_keeps_is_a_validation_error(
    running: Running, offset: str
) -> None:
    call = router(running).StreamIncoming(
        pb.router_pb2.StreamRequest(agent_id="bob"), metadata=(("sw4rm-resume-after", offset),)
    )
    await refused(call.read(), "sw4rm-resume-after")


async def test_configured_limits_apply_to_a_running_coordinator(tmp_path: Path) -> None:
    """`[limits]` reaches the handlers: a correlation id within the default but past the
    configured limit is refused, naming the field."""
    config = tmp_path / "apiary.toml"
    config.write_text("[limits]\ncorrelation_id_bytes = 16\n")
    limits = load_config(config, {}, {}).limits
    assert limits.correlation_id_bytes == 16
    async with (
        open_coordinator(
            replace(
                load_config(config, {}, {}), data_dir=tmp_path, grpc=Address("127.0.0.1", 0),
                http=Address("127.0.0.1", 0), store="memory://",
            )
        ) as coordinator,
        grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel,
    ):  # fmt: skip
        stub = pb.apiary_pb2_grpc.EventLogServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ReadEvents(pb.apiary_pb2.ReadEventsRequest(correlation_id="c" * 17))
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "correlation_id" in (caught.value.details() or "")
        await stub.ReadEvents(pb.apiary_pb2.ReadEventsRequest(correlation_id="c" * 16))
