"""No poison (issue 22): a stored value can never make a later read fail.

Each write path stores values at the boundary of every limit (ids of exactly their byte
limit in multi-byte characters, text of exactly its limit with line breaks, JSON nested to
the depth limit holding the longest integer and an astral character, timestamps at the epoch
and at the far edge of the clock-skew window, the largest sequence number), and every read
path then answers, over gRPC and over the JSON gateway, with the values as they were
written. A value just past each boundary is refused where it is written, and the reads stay
clean. Values stored before the limits existed (written here beneath the service edge) are
rendered by every reader instead of failing it: a stream read over HTTP goes on past them.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from google.protobuf import json_format
from google.protobuf.message import Message

from apiary.core.access.principal import PrincipalKind
from apiary.core.activity import ActivityEntry
from apiary.core.limits import DEFAULT_LIMITS, TIMESTAMP_MAX_S
from apiary.engine.router.admission import Outbound
from apiary.server.auth.keys import KeyRing, credentials_path
from apiary.server.context import AGENT_KEY, RECIPIENT_KEY
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb
from apiary.wire.convert import envelope_from_proto
from apiary.wire.services import find_method
from tests.server.wire_client import WAIT_S, descriptor, envelope

a = pb.apiary_pb2
L = DEFAULT_LIMITS
UINT64_MAX = (1 << 64) - 1
Meta = dict[str, str] | None

# --- the boundary values ----------------------------------------------------------------------

ALICE = "é" * 128
"""An agent id of exactly 256 UTF-8 bytes (the registry's own rule: 128 characters)."""
BOB = "bob"
TASK = "t" * (L.task_id_bytes - 2) + "ß"
CORRELATION = "c" * (L.correlation_id_bytes - 4) + "😀"
"""Exactly the correlation_id limit, ending in a character outside the BMP."""
TOKEN = ALICE[:64] + ":create:" + "h" * (L.idempotency_token_bytes - 128 - 8)
REPO = "r" * L.repo_id_bytes
WORKTREE = "w" * L.worktree_id_bytes
_LINES = ("a line with\ttabs and é\r\n" * 1000).encode()[: L.text_bytes - 3].decode(errors="ignore")
TEXT = _LINES + "x" * (L.text_bytes - len(_LINES.encode()))
"""Free text of exactly its limit, with every control character text may hold."""
NAME = "n" * L.name_bytes
DESCRIPTION = "é" * 4000 + "\n\tdone"
"""A description the registry takes (at most 200 words), 8 KB of two-byte characters."""
DEPTH = L.json_depth
NUMBER = "9" * 4300
DEEPEST = "[" * (DEPTH - 1) + '{"n": ' + NUMBER + ', "s": "😀 é"}' + "]" * (DEPTH - 1)
"""JSON nested exactly to the depth limit, holding the longest integer and an astral
character (a surrogate pair when escaped)."""
DOCUMENT = '{"deep": ' + "[" * (DEPTH - 2) + "1" + "]" * (DEPTH - 2) + ', "n": ' + NUMBER + "}"
"""A JSON object (what HITL, logs and workflow data take) nested to the depth limit."""


def edge_of_skew() -> float:
    """A timestamp just inside the clock-skew window."""
    return time.time() + L.clock_skew_s - 120


@dataclass
class Running:
    coordinator: Coordinator
    channel: grpc.aio.Channel
    http: aiohttp.ClientSession
    operator: str
    """The operator's API key (HITL reads)."""

    def metadata(self, operator: bool) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.operator}"),) if operator else ()

    async def grpc(
        self, path: str, request: Message, *, operator: bool = False, meta: Meta = None
    ) -> Any:
        """The unary answer over gRPC (fails the test on any error)."""
        method = find_method(*path.strip("/").split("/"))
        assert method is not None, path
        call = self.channel.unary_unary(
            path, method.request_type.SerializeToString, method.response_type.FromString
        )
        metadata = self.metadata(operator) + tuple((meta or {}).items())
        return await call(request, metadata=metadata, timeout=WAIT_S)

    async def gateway(
        self, path: str, request: Message, *, operator: bool = False, meta: Meta = None
    ) -> Any:
        """The unary answer over the JSON gateway, parsed into the response message."""
        method = find_method(*path.strip("/").split("/"))
        assert method is not None, path
        body = json_format.MessageToJson(request, preserving_proto_field_name=True)
        headers = dict(self.metadata(operator)) | (meta or {})
        async with self.http.post(f"/v1{path}", data=body, headers=headers) as resp:
            text = await resp.text()
            assert resp.status == 200, (path, resp.status, text[:500])
        return json_format.Parse(text, method.response_type())

    async def both(
        self, path: str, request: Message, *, operator: bool = False, meta: Meta = None
    ) -> list[Any]:
        """The answer over gRPC and over the gateway (each must succeed)."""
        return [
            await self.grpc(path, request, operator=operator, meta=meta),
            await self.gateway(path, request, operator=operator, meta=meta),
        ]


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    ring = KeyRing(credentials_path(tmp_path))
    key = ring.create(PrincipalKind.OPERATOR, "root", roles=("admin",), now=time.time())[1]
    async with (
        open_test_coordinator(tmp_path, store="") as coordinator,
        grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel,
        aiohttp.ClientSession(base_url=f"http://{coordinator.http_address}") as http,
    ):
        r = Running(coordinator, channel, http, key)
        for agent_id in (ALICE, BOB):
            agent = descriptor(agent_id, description=DESCRIPTION, capabilities=[NAME])
            reply = await r.grpc(
                "/sw4rm.registry.RegistryService/RegisterAgent",
                pb.registry_pb2.RegisterAgentRequest(agent=agent),
            )
            assert reply.accepted, reply.reason
        yield r


# --- the writes ---------------------------------------------------------------------------------


def boundary_envelope(n: int) -> pb.common_pb2.Envelope:
    msg = envelope(
        ALICE, DEEPEST.encode(), correlation_id=CORRELATION,
        idempotency_token=f"{TOKEN[:-4]}{n:04d}", repo_id=REPO, worktree_id=WORKTREE,
        sequence_number=UINT64_MAX - n, ttl_ms=int(L.max_duration_s * 1000),
    )  # fmt: skip
    msg.timestamp.seconds = int(edge_of_skew())
    msg.timestamp.nanos = 999_999_999
    return msg


async def write_everything(r: Running) -> None:
    """Every write path, every value at its boundary."""
    meta = ((RECIPIENT_KEY, BOB),)
    router = "/sw4rm.router.RouterService/SendMessage"
    sent = await r.grpc(
        router, pb.router_pb2.SendMessageRequest(msg=boundary_envelope(1)), meta=dict(meta)
    )
    assert sent.accepted, sent.reason
    frame = a.SendFrame(items=[a.OutboundEnvelope(msg=boundary_envelope(2), recipient=BOB)])
    stream = r.channel.stream_stream(
        "/apiary.v1.RouterStreamService/SendStream",
        a.SendFrame.SerializeToString, a.SendResultFrame.FromString,
    )  # fmt: skip
    async for result in stream(iter([frame]), timeout=WAIT_S):
        assert all(item.accepted for item in result.results), result
        break
    nobody = "z" * L.agent_id_bytes
    with pytest.raises(grpc.aio.AioRpcError) as unroutable:  # dead-lettered at the boundary
        await r.grpc(
            router,
            pb.router_pb2.SendMessageRequest(msg=boundary_envelope(3)),
            meta={RECIPIENT_KEY: nobody},
        )
    assert unroutable.value.code() is grpc.StatusCode.NOT_FOUND

    beat = pb.registry_pb2.HeartbeatRequest(
        agent_id=ALICE, state=pb.common_pb2.RUNNING, health={NAME: TEXT}
    )
    await r.grpc("/sw4rm.registry.RegistryService/Heartbeat", beat)

    entry = a.ActivityRecord(
        agent_id=ALICE, task_id=TASK, repo_id=REPO, worktree_id=WORKTREE, branch=NAME,
        description=DESCRIPTION,
    )  # fmt: skip
    entry.started_at.seconds = int(edge_of_skew())
    await r.grpc(
        "/apiary.v1.ActivityBufferService/Register", a.RegisterActivityRequest(entry=entry)
    )
    early = a.ActivityRecord(agent_id=BOB, task_id="epoch")
    early.started_at.nanos = 1  # the epoch's first nanosecond
    await r.grpc(
        "/apiary.v1.ActivityBufferService/Register", a.RegisterActivityRequest(entry=early)
    )
    done = a.ActivityRecord(agent_id=BOB, task_id="done")
    await r.grpc("/apiary.v1.ActivityBufferService/Register", a.RegisterActivityRequest(entry=done))
    await r.grpc(
        "/apiary.v1.ActivityBufferService/Complete",
        a.CompleteActivityRequest(agent_id=BOB, task_id="done", outcome="COMPLETED"),
    )

    log = pb.logging_pb2.LogEvent(
        event_type=NAME, agent_id=ALICE, correlation_id=CORRELATION, details_json=DOCUMENT
    )
    log.ts.seconds = int(edge_of_skew())
    await r.grpc("/sw4rm.logging.LoggingService/Ingest", log)

    task = pb.scheduler_pb2.SubmitTaskRequest(
        agent_id=BOB,
        task_id=TASK,
        params=DOCUMENT.encode(),
        content_type="application/json",
        scope=json.dumps({"repos": [REPO], "paths": ["é/" * 60 + "**"]}),
    )
    submitted = await r.grpc("/sw4rm.scheduler.SchedulerService/SubmitTask", task)
    assert submitted.accepted, submitted.reason

    escalate = a.EscalateRequest(
        reason_type="CONFLICT", correlation_id=CORRELATION, context_json=DOCUMENT,
        subject_json=DOCUMENT, suggested_action="approve", proposed_actions=["approve", "deny"],
        timeout_s=int(L.max_duration_s),
    )  # fmt: skip
    await r.grpc("/apiary.v1.HitlOperatorService/Escalate", escalate)

    definition = pb.workflow_pb2.WorkflowDefinition(
        workflow_id="wf-" + "w" * 190, metadata={NAME: TEXT}
    )
    definition.nodes["a"].CopyFrom(pb.workflow_pb2.WorkflowNode(node_id="a", agent_id=BOB))
    definition.created_at.seconds = int(edge_of_skew())
    await r.grpc(
        "/sw4rm.workflow.WorkflowService/CreateWorkflow",
        pb.workflow_pb2.CreateWorkflowRequest(definition=definition),
    )
    await r.grpc(
        "/sw4rm.workflow.WorkflowService/StartWorkflow",
        pb.workflow_pb2.StartWorkflowRequest(
            workflow_id=definition.workflow_id, workflow_data=DOCUMENT
        ),
    )

    handoff = pb.handoff_pb2.HandoffRequest(
        request_id="h-" + "h" * 190, from_agent=BOB, to_agent=ALICE, reason=TEXT[:2000],
        context_snapshot=DEEPEST.encode(), capabilities_required=[NAME],
    )  # fmt: skip
    await r.grpc("/sw4rm.handoff.HandoffService/RequestHandoff", handoff, meta={AGENT_KEY: BOB})

    opened = pb.negotiation_pb2.NegotiationOpen(
        negotiation_id="n-" + "n" * 190, topic=TEXT,
        participants=[ALICE, BOB], intensity=pb.common_pb2.DebateIntensity.Value("HIGHEST"),
    )  # fmt: skip
    opened.debate_timeout.seconds = 86_400
    await r.grpc("/sw4rm.negotiation.NegotiationService/Open", opened)
    proposal = pb.negotiation_pb2.Proposal(
        negotiation_id=opened.negotiation_id, from_agent=ALICE, content_type="application/json",
        payload=DEEPEST.encode(),
    )  # fmt: skip
    await r.grpc("/sw4rm.negotiation.NegotiationService/Propose", proposal)
    artifact = pb.activity_pb2.Artifact(
        negotiation_id=opened.negotiation_id, kind="note", version=NAME,
        content_type="application/json", content=DEEPEST.encode(),
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(edge_of_skew())),
    )  # fmt: skip
    appended = await r.grpc(
        "/sw4rm.activity.ActivityService/AppendArtifact",
        pb.activity_pb2.AppendArtifactRequest(artifact=artifact),
    )
    assert appended.ok, appended.reason


# --- the reads ----------------------------------------------------------------------------------


async def read_stream_over_grpc(r: Running, agent_id: str, count: int) -> list[Any]:
    """The first `count` envelopes StreamIncoming hands `agent_id` over gRPC (the stream then
    closed)."""
    stream = r.channel.unary_stream(
        "/sw4rm.router.RouterService/StreamIncoming",
        pb.router_pb2.StreamRequest.SerializeToString, pb.router_pb2.StreamItem.FromString,
    )  # fmt: skip
    request = pb.router_pb2.StreamRequest(agent_id=agent_id)
    call = stream(request, metadata=((AGENT_KEY, agent_id),), timeout=WAIT_S)
    items = []
    async for item in call:
        if item.msg.producer_id != "coordinator":
            items.append(item.msg)
        if len(items) == count:
            break
    call.cancel()
    return items


async def read_stream_over_http(
    r: Running, path: str, body: dict[str, Any], lines: int
) -> list[Any]:
    """The first `lines` NDJSON lines of a server-streaming call over the gateway; none may
    be an error."""
    found: list[Any] = []
    async with r.http.post(
        f"/v1{path}", data=json.dumps(body), headers={AGENT_KEY: body.get("agent_id", "")}
    ) as resp:
        assert resp.status == 200, await resp.text()
        while len(found) < lines:
            line = json.loads(await resp.content.readline())
            assert "error" not in line, line
            found.append(line)
    return found


def as_datetime(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


async def read_everything(r: Running, *, expect_written: bool) -> None:
    """Every read path over gRPC and the gateway; with `expect_written`, the boundary values
    come back as written."""
    for agents in await r.both("/apiary.v1.DiscoveryService/ListAgents", a.ListAgentsRequest()):
        if expect_written:
            mine = {i.descriptor.agent_id: i for i in agents.agents}
            assert mine[ALICE].descriptor.description == DESCRIPTION
    await r.both("/apiary.v1.DiscoveryService/GetAgent", a.GetAgentRequest(agent_id=ALICE))

    for poll in await r.both(
        "/sw4rm.scheduler.SchedulerService/PollActivityBuffer",
        pb.scheduler_pb2.PollActivityBufferRequest(),
    ):
        if expect_written:
            stamps = {e.task_id: e.timestamp for e in poll.entries}
            assert stamps["epoch"].startswith("1970-01-01T00:00:00")
            assert stamps[TASK].startswith(as_datetime(edge_of_skew())[:13])
    for history in (False, True):
        for listed in await r.both(
            "/apiary.v1.ActivityBufferService/List", a.ListActivityRequest(history=history)
        ):
            if expect_written and not history:
                assert {e.task_id: e.repo_id for e in listed.entries}[TASK] == REPO

    for events in await r.both(
        "/apiary.v1.EventLogService/ReadEvents", a.ReadEventsRequest(limit=5000)
    ):
        details = [json.loads(e.details_json) for e in events.events]
        if expect_written:
            logged = [
                d
                for e, d in zip(events.events, details, strict=True)
                if e.event_type == "agent.log"
            ]
            assert logged and logged[0]["details"] == json.loads(DOCUMENT)

    for tasks in await r.both("/apiary.v1.TaskQueryService/ListTasks", a.ListTasksRequest()):
        if expect_written:
            assert TASK in [t.task_id for t in tasks.tasks]
    if expect_written:
        for task in await r.both(
            "/apiary.v1.TaskQueryService/GetTask", a.GetTaskRequest(task_id=TASK)
        ):
            assert json.loads(task.params) == json.loads(DOCUMENT)

    for invocations in await r.both(
        "/apiary.v1.HitlOperatorService/List", a.ListInvocationsRequest(include_decided=True),
        operator=True,
    ):  # fmt: skip
        if expect_written:
            (view,) = [v for v in invocations.invocations if v.correlation_id == CORRELATION]
            assert json.loads(view.context_json) == json.loads(DOCUMENT)
            await r.both(
                "/apiary.v1.HitlOperatorService/Get",
                a.GetInvocationRequest(invocation_id=view.invocation_id), operator=True,
            )  # fmt: skip

    for handoffs in await r.both(
        "/apiary.v1.HandoffQueryService/ListHandoffs", a.ListHandoffsRequest()
    ):
        for view in handoffs.handoffs:
            await r.both(
                "/apiary.v1.HandoffQueryService/GetHandoff",
                a.GetHandoffRequest(request_id=view.request.request_id, include_snapshot=True),
                meta={AGENT_KEY: BOB},
            )
    await r.both(
        "/sw4rm.handoff.HandoffService/GetPendingHandoffs",
        pb.handoff_pb2.GetPendingHandoffsRequest(agent_id=BOB),
        meta={AGENT_KEY: BOB},
    )

    for negotiations in await r.both(
        "/apiary.v1.NegotiationOperatorService/List", a.ListNegotiationsRequest()
    ):
        for view in negotiations.negotiations:
            await r.both(
                "/apiary.v1.NegotiationOperatorService/Get",
                a.GetNegotiationRequest(negotiation_id=view.negotiation_id),
            )
            for artifacts in await r.both(
                "/sw4rm.activity.ActivityService/ListArtifacts",
                pb.activity_pb2.ListArtifactsRequest(negotiation_id=view.negotiation_id),
            ):
                if expect_written:
                    assert NAME in [x.version for x in artifacts.items]

    async with r.http.get("/console/api/workflows") as resp:
        assert resp.status == 200, await resp.text()
        workflows = await resp.json()
    for workflow in workflows.get("workflows", []):
        workflow_id = workflow["definition"]["workflow_id"]
        await r.both(
            "/sw4rm.workflow.WorkflowService/GetWorkflowState",
            pb.workflow_pb2.GetWorkflowStateRequest(workflow_id=workflow_id),
        )

    for letters in await r.both("/apiary.v1.DlqService/List", a.ListDlqRequest()):
        for entry in letters.entries:
            await r.both("/apiary.v1.DlqService/Get", a.GetDlqRequest(entry_id=entry.entry_id))
    await r.both("/apiary.v1.DlqService/Export", a.ExportDlqRequest(include_payloads=True))

    last = (
        await r.grpc("/apiary.v1.EventLogService/ReadEvents", a.ReadEventsRequest(limit=1))
    ).last_sequence
    await read_event_stream(r, last)


async def read_event_stream(r: Running, last: int) -> None:
    """The console's live feed from the start of the log up to `last`: every event a JSON
    `data:` line."""
    seen = 0
    async with r.http.get("/v1/events/stream?after=0&keepalive=60") as resp:
        assert resp.status == 200, await resp.text()
        while seen < last:
            line = (await resp.content.readline()).decode()
            if line.startswith("data:"):
                event = json.loads(line[5:])
                seen = int(event.get("sequence", seen + 1))


# --- the tests ----------------------------------------------------------------------------------


async def test_every_boundary_value_written_reads_back_on_every_path(running: Running) -> None:
    await write_everything(running)
    await read_everything(running, expect_written=True)
    for msg in await read_stream_over_grpc(running, BOB, 2):
        assert (msg.correlation_id, msg.repo_id, msg.worktree_id) == (CORRELATION, REPO, WORKTREE)
        assert msg.timestamp.nanos == 999_999_999 and msg.sequence_number >= UINT64_MAX - 2
        assert json.loads(msg.payload) == json.loads(DEEPEST)
    path = "/sw4rm.router.RouterService/StreamIncoming"
    for line in await read_stream_over_http(running, path, {"agent_id": BOB}, 2):
        msg = line["msg"]
        assert msg["correlation_id"] == CORRELATION and msg["sequence_number"].startswith("18446")
        assert json.loads(base64.b64decode(msg["payload"])) == json.loads(DEEPEST)


def _past(path: str, request: Message, field: str, **meta: str) -> Any:
    return pytest.param(path, request, field, meta, id=field)


def _started(seconds: int, nanos: int = 0) -> a.RegisterActivityRequest:
    entry = a.ActivityRecord(agent_id=BOB, task_id="late")
    entry.started_at.seconds, entry.started_at.nanos = seconds, nanos
    return a.RegisterActivityRequest(entry=entry)


def _send(**fields: Any) -> pb.router_pb2.SendMessageRequest:
    return pb.router_pb2.SendMessageRequest(msg=envelope(BOB, {"n": 1}, **fields))


def _stamped(seconds: int) -> pb.router_pb2.SendMessageRequest:
    request = _send()
    request.msg.timestamp.seconds = seconds
    return request


SEND = "/sw4rm.router.RouterService/SendMessage"
REGISTER = "/apiary.v1.ActivityBufferService/Register"
INGEST = "/sw4rm.logging.LoggingService/Ingest"
ESCALATE = "/apiary.v1.HitlOperatorService/Escalate"
TO_BOB = {RECIPIENT_KEY: BOB}
DEEPER = "[" * (DEPTH + 1) + "]" * (DEPTH + 1)
LATE = int(time.time() + L.clock_skew_s + 86_400)
"""Past the skew window however long after collection the test runs (a day: a full suite on
a busy machine ran this test 17 minutes after its parameters were built)."""


def _escalation(**fields: Any) -> a.EscalateRequest:
    return a.EscalateRequest(reason_type="CONFLICT", **fields)


def _activity(**fields: Any) -> a.RegisterActivityRequest:
    return a.RegisterActivityRequest(entry=a.ActivityRecord(agent_id=BOB, task_id="t", **fields))


PAST_THE_BOUNDARY = [
    _past(SEND, _send(correlation_id="c" * 257), "correlation_id", **TO_BOB),
    _past(SEND, _send(idempotency_token="t" * 513), "idempotency_token", **TO_BOB),
    _past(SEND, _send(repo_id="é" * 129), "repo_id", **TO_BOB),
    _past(SEND, _stamped(TIMESTAMP_MAX_S + 1), "msg.timestamp", **TO_BOB),
    _past(SEND, _send(), RECIPIENT_KEY, **{RECIPIENT_KEY: "r" * 257}),
    _past(REGISTER, _started(LATE), "entry.started_at"),
    _past(REGISTER, _started(-1, 999_999_999), "entry.started_at"),
    _past(REGISTER, _activity(description="d" * (L.text_bytes + 1)), "entry.description"),
    _past(
        "/sw4rm.registry.RegistryService/Heartbeat",
        pb.registry_pb2.HeartbeatRequest(agent_id=BOB, health={"k": "\x00"}),
        "health['k']",
    ),
    _past(INGEST, pb.logging_pb2.LogEvent(event_type="e", details_json=DEEPER), "details_json"),
    _past(INGEST, pb.logging_pb2.LogEvent(event_type="e" * (L.name_bytes + 1)), "event_type"),
    _past(ESCALATE, _escalation(context_json='{"n": ' + "9" * 4301 + "}"), "context_json"),
    _past(ESCALATE, _escalation(subject_json='{"x": -1e309}'), "subject_json"),
    _past(ESCALATE, _escalation(timeout_s=int(L.max_duration_s) + 1), "timeout_s"),
    _past(
        "/sw4rm.scheduler.SchedulerService/SubmitTask",
        pb.scheduler_pb2.SubmitTaskRequest(agent_id=BOB, task_id="t" * 257),
        "task_id",
    ),
    _past(
        "/apiary.v1.TaskQueryService/ListTasks", a.ListTasksRequest(after_seq=2**63), "after_seq"
    ),
    _past("/apiary.v1.DlqService/Get", a.GetDlqRequest(entry_id=2**63), "entry_id"),
]


@pytest.mark.parametrize(("path", "request_message", "field", "meta"), PAST_THE_BOUNDARY)
async def test_a_value_just_past_its_boundary_is_refused_and_reads_stay_clean(
    running: Running, path: str, request_message: Message, field: str, meta: dict[str, str]
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await running.grpc(path, request_message, meta=meta)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert f"{field}:" in (caught.value.details() or "")
    await read_everything(running, expect_written=False)


async def test_values_stored_before_the_limits_are_rendered_by_every_reader(
    running: Running,
) -> None:
    """Written beneath the service edge, as a store from before the limits holds them."""
    c = running.coordinator
    assert c.activity is not None
    await c.activity.register(ActivityEntry(agent_id=BOB, task_id="old", started_at=2.0**40))
    await c.events.record("legacy.values", "test", agent_id=BOB, big=2**70, text="\u2028 é")
    await c.events.flush()
    poisoned = envelope(ALICE, {"n": "old"})
    clean = envelope_from_proto(poisoned)
    poisoned.timestamp.seconds = 2**62
    stored = await c.router.send(
        Outbound(clean, BOB, raw=poisoned.SerializeToString(deterministic=True))
    )
    assert stored.accepted, stored.reason
    new = pb.router_pb2.SendMessageRequest(msg=envelope(ALICE, {"n": "new"}))
    later = await running.grpc(SEND, new, meta=TO_BOB)
    assert later.accepted

    await read_everything(running, expect_written=False)
    for history in await running.both(
        "/sw4rm.scheduler.SchedulerService/PollActivityBuffer",
        pb.scheduler_pb2.PollActivityBufferRequest(agent_id=BOB),
    ):
        stamps = {e.task_id: e.timestamp for e in history.entries}
        assert stamps["old"].startswith("9999-12-31T23:59:59")
    path = "/sw4rm.router.RouterService/StreamIncoming"
    old, new = await read_stream_over_http(running, path, {"agent_id": BOB}, 2)
    assert old["msg"]["timestamp"].startswith("9999-12-31T23:59:59")
    assert json.loads(base64.b64decode(new["msg"]["payload"])) == {"n": "new"}
    for events in await running.both(
        "/apiary.v1.EventLogService/ReadEvents", a.ReadEventsRequest(limit=5000)
    ):
        (legacy,) = [e for e in events.events if e.event_type == "legacy.values"]
        details = json.loads(legacy.details_json)
        assert details == {"big": 2**70, "text": "\u2028 é"}
