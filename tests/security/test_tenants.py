"""Tenant isolation end to end (RFC 6.5, DESIGN.md section 9) over real gRPC, on every store
backend: what tenant acme makes, tenant globex's principals can neither address, read, list
nor infer. Every call from globex naming an acme object answers exactly as the same call
naming an object that exists nowhere (same status, error code, message and details, but for
the id), every listing in globex is the same before and after acme acted, and a name used in
both tenants (an agent, a task, a workflow, an idempotency token) names two unrelated objects.

The global operator (role `tenants`, in the default tenant) acts in the tenant it names with
`apiary-tenant`; a tenant's own principals, its admin included, cannot name another. Each
tenant's objects are in a store of its own (DATA_DIR/tenants/TENANT/apiary.db, or a
PostgreSQL schema of its own) and stay there across a restart."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message

from apiary.core.access.principal import DEFAULT_TENANT, PrincipalKind
from apiary.engine.worktrees.settings import RepoEntry, WorktreeSettings
from apiary.store.open import open_store, tenant_data_dir
from apiary.wire import pb
from tests.gitrepo import make_repo
from tests.security.tenant_harness import (
    ACME,
    GLOBEX,
    PRINCIPALS,
    TENANTS,
    WAIT_S,
    Refusal,
    Tenants,
    create_keys,
    drop_schemas,
    existing_schemas,
    items_until,
    open_tenants,
    postgres_url,
    tenant_schemas,
)
from tests.server.wire_client import descriptor, envelope

a = pb.apiary_pb2
c = pb.connector_pb2
h = pb.handoff_pb2
n = pb.negotiation_pb2
nr = pb.negotiation_room_pb2
r = pb.registry_pb2
s = pb.scheduler_pb2
w = pb.worktree_pb2
wf = pb.workflow_pb2

MISSING = "ghost-0000"
"""An id no tenant has: what naming another tenant's object must be indistinguishable from."""
UNKNOWN_TENANT = "nowhere"
LATE_TENANT = "initech"
"""A tenant whose first key is made while the coordinator runs."""
NOT_FOUND = grpc.StatusCode.NOT_FOUND

Probe = tuple[str, str, Callable[[str], Message]]
"""A call naming an object: who makes it, the method, and the request naming a given id."""
Listing = tuple[str, Message, str]
"""A listing: the method, its request and who reads it."""


# --------------------------------------------------------------------------- backends


@dataclass(frozen=True)
class Backend:
    name: str
    url: str
    """The `--store` URL ("" is the default SQLite file, DATA_DIR/apiary.db)."""
    dsn: str = ""
    schema: str = ""
    """PostgreSQL: the default tenant's schema; every other tenant's is derived from it."""


def _backend(name: str, request: pytest.FixtureRequest) -> Iterator[Backend]:
    if name == "memory":
        yield Backend(name, "memory://")
    elif name == "sqlite":
        yield Backend(name, "")
    else:
        dsn: str = request.getfixturevalue("postgres_dsn")
        schema: str = request.getfixturevalue("postgres_schema")
        try:
            yield Backend(name, postgres_url(dsn, schema), dsn, schema)
        finally:
            # postgres_schema drops the default tenant's schema; the tenants' are ours.
            drop_schemas(dsn, tenant_schemas(schema, (*TENANTS, UNKNOWN_TENANT, LATE_TENANT)))


POSTGRESQL = pytest.param("postgresql", marks=pytest.mark.postgres)


@pytest.fixture(params=["memory", "sqlite", POSTGRESQL])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    yield from _backend(request.param, request)


@pytest.fixture(params=["sqlite", POSTGRESQL])
def durable(request: pytest.FixtureRequest) -> Iterator[Backend]:
    yield from _backend(request.param, request)


@pytest.fixture
async def world(tmp_path: Path, backend: Backend) -> AsyncIterator[Tenants]:
    async with open_tenants(tmp_path, backend.url) as tenants:
        yield tenants


# --------------------------------------------------------------------------- helpers


async def register(t: Tenants, who: str, agent_id: str = "", **fields: Any) -> None:
    """Register `agent_id` (default: `who`'s own agent) in `who`'s tenant, as `who`."""
    agent = descriptor(agent_id or PRINCIPALS[who][1], **fields)
    reply = await t.call("RegistryService/RegisterAgent", r.RegisterAgentRequest(agent=agent), who)
    assert reply.accepted, reply.reason


def sending(msg: Any) -> Message:
    return pb.router_pb2.SendMessageRequest(msg=msg)


async def send(t: Tenants, who: str, to: str, **fields: Any) -> tuple[Any, Any]:
    """Send a DATA message to `to` as `who` (its producer is `who`'s name): the envelope and
    the answer."""
    msg = envelope(PRINCIPALS[who][1], {"to": to}, **fields)
    return msg, await t.call("RouterService/SendMessage", sending(msg), who)


async def like_missing(
    t: Tenants, present: str, *probes: Probe, missing: str = MISSING
) -> list[Refusal | str]:
    """What each probe answers naming `present` (another tenant's object), asserting it is
    exactly what the probe answers naming `missing`, which exists nowhere; the answers'
    shapes, ids written as '<id>'."""
    shapes = []
    for who, name, request_for in probes:
        seen = await t.shape(name, request_for(present), who, present)
        assert seen == await t.shape(name, request_for(missing), who, missing), (who, name)
        shapes.append(seen)
    return shapes


def not_found(shape: Refusal | str) -> bool:
    return isinstance(shape, Refusal) and (shape.status, shape.code) == (NOT_FOUND, "NOT_FOUND")


async def shapes(t: Tenants, *listings: Listing) -> list[Refusal | str]:
    return [await t.shape(*listing) for listing in listings]


# --------------------------------------------------------------------------- agents and messages


@pytest.mark.conformance(
    "security.multiuser.user-isolation", "security.multiuser.distinct-boundaries"
)
async def test_another_tenants_agent_answers_like_one_that_does_not_exist(world: Tenants) -> None:
    t = world
    await register(t, "bob@globex")
    listing: Listing = ("DiscoveryService/ListAgents", a.ListAgentsRequest(), "bob@globex")
    before = await t.shape(*listing)
    await register(t, "alice@acme", capabilities=["acme-secret"])
    _, answer = await send(t, "alice@acme", "alice")  # alice exists, and gets mail, in acme
    assert answer.accepted

    assert await t.shape(*listing) == before
    secret = a.ListAgentsRequest(capability="acme-secret")
    assert not (await t.call("DiscoveryService/ListAgents", secret, "bob@globex")).agents
    (seen,) = await like_missing(
        t,
        "alice",
        ("bob@globex", "DiscoveryService/GetAgent", lambda i: a.GetAgentRequest(agent_id=i)),
    )
    assert not_found(seen)
    # Addressing alice from globex, even as globex's admin, reaches nothing.
    await like_missing(
        t,
        "alice",
        ("ops@globex", "AgentControlService/Suspend", lambda i: a.AgentControlRequest(agent_id=i)),
        (
            "ops@globex",
            "DiscoveryService/SetBufferCapacity",
            lambda i: a.SetBufferCapacityRequest(agent_id=i, capacity=3),
        ),
        (
            "ops@globex",
            "SchedulerService/ShutdownAgent",
            lambda i: s.ShutdownAgentRequest(agent_id=i),
        ),
        ("ops@globex", "RegistryService/Heartbeat", lambda i: r.HeartbeatRequest(agent_id=i)),
        (
            "ops@globex",
            "RegistryService/DeregisterAgent",
            lambda i: r.DeregisterAgentRequest(agent_id=i),
        ),
    )
    # A message to alice from globex finds no route, as one to an agent that never existed.
    to_alice, to_ghost = envelope("bob", {"to": "alice"}), envelope("bob", {"to": MISSING})
    refused = await t.refused("RouterService/SendMessage", sending(to_alice), "bob@globex")
    assert (refused.status, refused.code) == (NOT_FOUND, "no_route")
    assert refused.naming("alice", to_alice.message_id) == (
        await t.refused("RouterService/SendMessage", sending(to_ghost), "bob@globex")
    ).naming(MISSING, to_ghost.message_id)

    mine = await t.call(
        "DiscoveryService/GetAgent", a.GetAgentRequest(agent_id="alice"), "alice@acme"
    )
    # Registered, no stream opened yet: INITIALIZING, in its own tenant's lifecycle.
    assert (mine.state, list(mine.descriptor.capabilities)) == ("INITIALIZING", ["acme-secret"])


@pytest.mark.conformance(
    "security.multiuser.user-isolation", "security.multiuser.distinct-boundaries"
)
async def test_an_agent_of_the_same_name_in_another_tenant_is_another_agent(
    world: Tenants,
) -> None:
    t = world
    await register(t, "alice@acme", capabilities=["acme-secret"])
    await register(t, "alice@globex", capabilities=["globex-only"])
    await register(t, "bob@globex")
    for who, capability in (("alice@acme", "acme-secret"), ("alice@globex", "globex-only")):
        found = await t.call("DiscoveryService/GetAgent", a.GetAgentRequest(agent_id="alice"), who)
        assert list(found.descriptor.capabilities) == [capability]

    inbox = pb.router_pb2.StreamRequest(agent_id="alice")
    in_acme = t.stream("RouterService/StreamIncoming", inbox, "alice@acme")
    in_globex = t.stream("RouterService/StreamIncoming", inbox, "alice@globex")
    try:
        secret, answer = await send(t, "app@acme", "alice")
        assert answer.accepted
        marker, answer = await send(t, "bob@globex", "alice")
        assert answer.accepted
        # An inbox is FIFO: had acme's message reached globex's alice, it would come first.
        delivered = await items_until(in_globex, marker.message_id)
        assert [item.msg.message_id for item in delivered] == [marker.message_id]
        (got,) = await items_until(in_acme, secret.message_id)
        assert (got.msg.producer_id, got.msg.payload) == ("app", secret.payload)
    finally:
        in_acme.cancel()
        in_globex.cancel()

    # bob may not open alice's inbox, in any tenant: an agent reads only its own inbox. The
    # rule decides before any lookup, so the refusal is permission_denied, and the same
    # whether or not an agent of that name exists.
    (refused,) = await like_missing(
        t,
        "alice",
        (
            "bob@globex",
            "RouterService/StreamIncoming",
            lambda i: pb.router_pb2.StreamRequest(agent_id=i),
        ),
    )
    assert isinstance(refused, Refusal) and refused.code == "permission_denied"


@pytest.mark.conformance(
    "security.multiuser.user-isolation", "security.multiuser.distinct-boundaries"
)
async def test_the_same_idempotency_token_and_message_id_do_not_collide_across_tenants(
    world: Tenants,
) -> None:
    t = world
    await register(t, "alice@acme")
    await register(t, "alice@globex")
    same = sending(envelope("alice", {"to": "alice", "n": 1}, idempotency_token="tok-1"))
    first = await t.call("RouterService/SendMessage", same, "alice@acme")
    other = await t.call("RouterService/SendMessage", same, "alice@globex")
    assert (first.accepted, other.accepted) == (True, True), (first.reason, other.reason)
    # The token is remembered where it was used: the same send again in acme is not new.
    again = await t.call("RouterService/SendMessage", same, "alice@acme")
    assert not again.accepted and again.reason.startswith("already_in_progress"), again.reason


# --------------------------------------------------------------------------- tasks


def _task(agent: str) -> Message:
    return s.SubmitTaskRequest(
        agent_id=agent,
        task_id="t-acme",
        priority=1,
        params=b'{"secret": 1}',
        content_type="application/json",
        scope="repo:acme",
    )


@pytest.mark.conformance(
    "security.multiuser.user-isolation", "security.multiuser.distinct-boundaries"
)
async def test_another_tenants_task_answers_like_one_that_does_not_exist(world: Tenants) -> None:
    t = world
    await register(t, "alice@acme")
    await register(t, "bob@globex")
    listing: Listing = ("TaskQueryService/ListTasks", a.ListTasksRequest(), "bob@globex")
    before = await t.shape(*listing)
    assert (await t.call("SchedulerService/SubmitTask", _task("alice"), "app@acme")).accepted

    assert await t.shape(*listing) == before
    found = await like_missing(
        t,
        "t-acme",
        ("bob@globex", "TaskQueryService/GetTask", lambda i: a.GetTaskRequest(task_id=i)),
        ("ops@globex", "TaskQueryService/CancelTask", lambda i: a.CancelTaskRequest(task_id=i)),
        (
            "ops@globex",
            "SchedulerService/RequestPreemption",
            lambda i: s.PreemptRequest(agent_id="alice", task_id=i),
        ),
    )
    assert not_found(found[0]) and not_found(found[1])
    # The task id is free in globex, and names globex's own task there.
    assert (await t.call("SchedulerService/SubmitTask", _task("bob"), "bob@globex")).accepted
    task = a.GetTaskRequest(task_id="t-acme")
    mine = await t.call("TaskQueryService/GetTask", task, "app@acme")
    theirs = await t.call("TaskQueryService/GetTask", task, "bob@globex")
    assert (mine.agent_id, mine.state, theirs.agent_id) == ("alice", "QUEUED", "bob")


# --------------------------------------------------------------------------- worktrees and tools


@pytest.mark.conformance(
    "security.multiuser.user-isolation", "security.multiuser.distinct-boundaries"
)
async def test_another_tenants_worktree_binding_answers_like_none(world: Tenants) -> None:
    t = world
    await register(t, "alice@acme")
    listing: Listing = ("WorktreeBindingService/List", a.ListBindingsRequest(), "bob@globex")
    before = await t.shape(*listing)
    # No repository is configured: the binding is kept as BIND_FAILED, with its reason.
    bind = w.BindRequest(agent_id="alice", repo_id="api", worktree_id="home")
    await t.call("WorktreeService/Bind", bind, "alice@acme")
    get = a.GetBindingRequest(agent_id="alice")
    mine = await t.call("WorktreeBindingService/Get", get, "alice@acme")
    assert (mine.state, mine.repo_id, mine.reason) == ("BIND_FAILED", "api", "worktree_not_found")

    assert await t.shape(*listing) == before
    unbound, *_ = await like_missing(
        t,
        "alice",
        ("bob@globex", "WorktreeBindingService/Get", lambda i: a.GetBindingRequest(agent_id=i)),
        ("bob@globex", "WorktreeService/Status", lambda i: w.StatusRequest(agent_id=i)),
        ("ops@globex", "WorktreeService/ApproveSwitch", lambda i: w.SwitchApprove(agent_id=i)),
        (
            "ops@globex",
            "WorktreeBindingService/Revoke",
            lambda i: a.RevokeSwitchRequest(agent_id=i),
        ),
    )
    assert unbound == 'agent_id: "<id>"\nstate: "UNBOUND"\n'


async def test_each_tenants_worktrees_are_under_a_root_of_its_own(tmp_path: Path) -> None:
    """`[worktrees] root` is the default tenant's; another tenant's worktrees are made under
    `ROOT/tenants/TENANT`, as its other files are under DATA_DIR/tenants/TENANT."""
    root = tmp_path / "worktrees"
    repos = (RepoEntry("api", make_repo(tmp_path / "repos" / "api")),)
    settings = WorktreeSettings(repos=repos, root=root)
    async with open_tenants(tmp_path / "data", "memory://", worktrees=settings) as t:
        for who, worktree in (("alice@acme", "home"), ("alice@globex", "other")):
            await register(t, who)
            bind = w.BindRequest(agent_id="alice", repo_id="api", worktree_id=worktree)
            bound = await t.call("WorktreeService/Bind", bind, who)
            assert (bound.ok, bound.reason) == (True, "")
    made = sorted(str(p.relative_to(root)) for p in root.glob("tenants/*/api/*"))
    assert made == ["tenants/acme/api/home", "tenants/globex/api/other"]
    assert not (root / "api").exists()


@pytest.mark.conformance(
    "security.multiuser.user-isolation", "security.multiuser.distinct-boundaries"
)
async def test_another_tenants_tool_provider_answers_like_one_that_does_not_exist(
    world: Tenants,
) -> None:
    t = world
    await register(t, "alice@acme")
    await register(t, "bob@globex")
    listings: list[Listing] = [
        ("ToolProviderService/ListProviders", a.ListToolProvidersRequest(), "bob@globex"),
        ("ConnectorService/DescribeTools", c.DescribeToolsRequest(), "bob@globex"),
    ]
    before = await shapes(t, *listings)
    tool = c.ToolDescriptor(tool_name="grep", input_schema='{"type":"object"}')
    offer = c.ProviderRegisterRequest(provider_id="alice", tools=[tool])
    assert (await t.call("ConnectorService/RegisterProvider", offer, "alice@acme")).ok

    assert await shapes(t, *listings) == before
    *found, removed = await like_missing(
        t,
        "alice",
        (
            "bob@globex",
            "ToolProviderService/ListProviders",
            lambda i: a.ListToolProvidersRequest(provider_id=i),
        ),
        (
            "bob@globex",
            "ConnectorService/DescribeTools",
            lambda i: c.DescribeToolsRequest(provider_id=i),
        ),
        (
            "bob@globex",
            "ToolService/Call",
            lambda i: pb.tool_pb2.ToolCall(
                tool_name="grep",
                provider_id=i,
                call_id="c-1",
                args=b"{}",
                content_type="application/json",
            ),
        ),
        (
            "ops@globex",
            "ToolProviderService/RemoveProvider",
            lambda i: a.RemoveToolProviderRequest(provider_id=i),
        ),
    )
    assert all(map(not_found, found))
    assert removed == ""  # removed: false, as for any provider globex does not have
    mine = await t.call(
        "ToolProviderService/ListProviders", a.ListToolProvidersRequest(), "alice@acme"
    )
    assert [p.provider_id for p in mine.providers] == ["alice"]


# --------------------------------------------------------------------------- HITL and dead letters


@pytest.mark.conformance(
    "security.multiuser.user-isolation", "security.multiuser.distinct-boundaries"
)
async def test_another_tenants_hitl_invocation_answers_like_one_that_does_not_exist(
    world: Tenants,
) -> None:
    t = world
    listing: Listing = ("HitlOperatorService/List", a.ListInvocationsRequest(), "ops@globex")
    before = await t.shape(*listing)
    escalate = a.EscalateRequest(reason_type="SECURITY_APPROVAL", context_json='{"acme": 1}')
    asked = await t.call("HitlOperatorService/Escalate", escalate, "alice@acme")

    assert await t.shape(*listing) == before
    found = await like_missing(
        t,
        asked.invocation_id,
        (
            "ops@globex",
            "HitlOperatorService/Get",
            lambda i: a.GetInvocationRequest(invocation_id=i),
        ),
        (
            "ops@globex",
            "HitlOperatorService/Decide",
            lambda i: a.DecideInvocationRequest(invocation_id=i, action="approve"),
        ),
        missing=str(uuid.uuid4()),
    )
    assert all(map(not_found, found))
    # globex's operator watching every pending invocation sees only globex's.
    watch = t.stream(
        "HitlOperatorService/Watch", a.WatchInvocationsRequest(include_pending=True), "ops@globex"
    )
    try:
        own = await t.call("HitlOperatorService/Escalate", escalate, "bob@globex")
        first = await asyncio.wait_for(watch.read(), WAIT_S)
        assert first.invocation_id == own.invocation_id
    finally:
        watch.cancel()
    get = a.GetInvocationRequest(invocation_id=asked.invocation_id)
    assert (await t.call("HitlOperatorService/Get", get, "ops@acme")).state == "PENDING"


@pytest.mark.conformance(
    "security.multiuser.user-isolation", "security.multiuser.distinct-boundaries"
)
async def test_another_tenants_dead_letters_answer_like_ones_that_do_not_exist(
    world: Tenants,
) -> None:
    t = world
    await register(t, "alice@acme")
    listing: Listing = ("DlqService/List", a.ListDlqRequest(), "ops@globex")
    before = await t.shape(*listing)
    # alice fails a message (her own, to herself): an admitted message that failed, a dead
    # letter of acme's.
    lost, _ = await send(t, "alice@acme", "alice")
    ack = {"ack_for_message_id": lost.message_id, "ack_stage": "FAILED",
           "error_code": "internal_error", "note": "lost"}  # fmt: skip
    failed = envelope("alice", ack, message_type=pb.common_pb2.ACKNOWLEDGEMENT)
    await t.call("RouterService/SendMessage", sending(failed), "alice@acme")
    (letter,) = (await t.call("DlqService/List", a.ListDlqRequest(), "ops@acme")).entries
    assert (letter.message_id, letter.error_code) == (lost.message_id, "internal_error")

    assert await t.shape(*listing) == before
    got, _ = await like_missing(
        t,
        str(letter.entry_id),
        ("ops@globex", "DlqService/Get", lambda i: a.GetDlqRequest(entry_id=int(i))),
        ("ops@globex", "DlqService/Requeue", lambda i: a.RequeueDlqRequest(entry_ids=[int(i)])),
        missing="987654",
    )
    assert not_found(got)
    exported = await t.call("DlqService/Export", a.ExportDlqRequest(), "ops@globex")
    assert exported.entries == 0 and lost.message_id.encode() not in exported.bundle


@pytest.mark.conformance(
    "security.multiuser.user-isolation", "security.multiuser.distinct-boundaries"
)
async def test_another_tenants_events_are_not_in_the_event_log(world: Tenants) -> None:
    t = world
    marker = f"acme-marker-{uuid.uuid4()}"
    await register(t, "bob@globex")
    await register(t, "alice@acme", description=marker, capabilities=[marker])
    await send(t, "alice@acme", "alice")

    read = a.ReadEventsRequest(limit=5000)
    theirs = (await t.call("EventLogService/ReadEvents", read, "ops@globex")).events
    assert [e.agent_id for e in theirs if e.event_type == "agent.registered"] == ["bob"]
    assert [e for e in theirs if ACME in str(e) or marker in str(e)] == []
    decided = {e.actor for e in theirs if e.event_type == "access.decided"}
    assert decided <= {"agent:bob@globex", "operator:ops@globex"}, decided

    mine = (await t.call("EventLogService/ReadEvents", read, "ops@acme")).events
    registered = [
        (e.agent_id, json.loads(e.details_json)["capabilities"])
        for e in mine
        if e.event_type == "agent.registered"
    ]
    assert registered == [("alice", [marker])]
    assert [e for e in mine if GLOBEX in str(e) or "bob" in e.agent_id] == []


# --------------------------------------------------------------------------- workflows, negotiation


def _workflow(agent: str) -> Message:
    definition = wf.WorkflowDefinition(workflow_id="etl")
    definition.nodes["a"].CopyFrom(
        wf.WorkflowNode(node_id="a", agent_id=agent, trigger_type=wf.MANUAL)
    )
    return wf.CreateWorkflowRequest(definition=definition)


@pytest.mark.conformance(
    "security.multiuser.user-isolation", "security.multiuser.distinct-boundaries"
)
async def test_another_tenants_workflow_answers_like_one_that_does_not_exist(
    world: Tenants,
) -> None:
    t = world
    assert (await t.call("WorkflowService/CreateWorkflow", _workflow("alice"), "app@acme")).success

    found = await like_missing(
        t,
        "etl",
        (
            "bob@globex",
            "WorkflowService/GetWorkflowState",
            lambda i: wf.GetWorkflowStateRequest(workflow_id=i),
        ),
        (
            "bob@globex",
            "WorkflowService/StartWorkflow",
            lambda i: wf.StartWorkflowRequest(workflow_id=i),
        ),
        (
            "bob@globex",
            "WorkflowService/ResumeWorkflow",
            lambda i: wf.ResumeWorkflowRequest(workflow_id=i),
        ),
    )
    assert all(map(not_found, found))
    # The id is free in globex, and each tenant then reads its own workflow by it.
    assert (await t.call("WorkflowService/CreateWorkflow", _workflow("bob"), "bob@globex")).success
    await t.call(
        "WorkflowService/StartWorkflow", wf.StartWorkflowRequest(workflow_id="etl"), "bob@globex"
    )
    state = wf.GetWorkflowStateRequest(workflow_id="etl")
    mine = await t.call("WorkflowService/GetWorkflowState", state, "app@acme")
    theirs = await t.call("WorkflowService/GetWorkflowState", state, "bob@globex")
    assert [got.state.metadata["status"] for got in (mine, theirs)] == ["CREATED", "RUNNING"]


def _negotiation(*participants: str) -> Message:
    return n.NegotiationOpen(
        negotiation_id="neg-1",
        topic="/acme/pricing",
        participants=list(participants),
        intensity=pb.common_pb2.HIGH,
        debate_timeout=Duration(seconds=300),
    )


@pytest.mark.conformance(
    "security.multiuser.user-isolation", "security.multiuser.distinct-boundaries"
)
async def test_another_tenants_negotiation_answers_like_one_that_does_not_exist(
    world: Tenants,
) -> None:
    t = world
    await register(t, "alice@acme")
    await register(t, "ops@acme", "carol")
    await register(t, "bob@globex")
    listing: Listing = (
        "NegotiationOperatorService/List", a.ListNegotiationsRequest(), "bob@globex"
    )  # fmt: skip
    before = await t.shape(*listing)
    await t.call("NegotiationService/Open", _negotiation("alice", "carol"), "app@acme")

    assert await t.shape(*listing) == before
    found = await like_missing(
        t,
        "neg-1",
        (
            "bob@globex",
            "NegotiationOperatorService/Get",
            lambda i: a.GetNegotiationRequest(negotiation_id=i),
        ),
        (
            "bob@globex",
            "NegotiationService/Propose",
            lambda i: n.Proposal(
                negotiation_id=i,
                from_agent="bob",
                content_type="application/json",
                payload=b"{}",
            ),
        ),
        (
            "ops@globex",
            "NegotiationService/Abort",
            lambda i: n.AbortRequest(negotiation_id=i, reason="mine now"),
        ),
    )
    assert all(map(not_found, found))
    get = a.GetNegotiationRequest(negotiation_id="neg-1")
    mine = await t.call("NegotiationOperatorService/Get", get, "app@acme")
    assert (mine.state, list(mine.participants)) == ("OPEN", ["alice", "carol"])


@pytest.mark.conformance(
    "security.multiuser.user-isolation", "security.multiuser.distinct-boundaries"
)
async def test_another_tenants_room_proposal_answers_like_one_that_does_not_exist(
    world: Tenants,
) -> None:
    t = world
    await register(t, "alice@acme")
    await register(t, "ops@acme", "carol")
    await register(t, "bob@globex")
    listing: Listing = (
        "NegotiationRoomQueryService/ListProposals", a.ListRoomProposalsRequest(), "bob@globex"
    )  # fmt: skip
    before = await t.shape(*listing)
    proposal = nr.NegotiationProposal(
        artifact_type=nr.CODE, artifact_id="code-1", artifact=b"acme secret\n",
        artifact_content_type="text/plain", requested_critics=["carol"],
        negotiation_room_id="room-1", producer_id="alice",
    )  # fmt: skip
    submit = nr.SubmitProposalRequest(proposal=proposal)
    await t.call("NegotiationRoomService/SubmitProposal", submit, "alice@acme")

    assert await t.shape(*listing) == before
    found = await like_missing(
        t,
        "code-1",
        (
            "bob@globex",
            "NegotiationRoomService/GetVotes",
            lambda i: nr.GetVotesRequest(artifact_id=i),
        ),
        (
            "bob@globex",
            "NegotiationRoomService/GetDecision",
            lambda i: nr.GetDecisionRequest(artifact_id=i),
        ),
        (
            "bob@globex",
            "NegotiationRoomQueryService/GetProposal",
            lambda i: a.GetRoomProposalRequest(artifact_id=i, include_artifact=True),
        ),
        (
            "bob@globex",
            "NegotiationRoomService/SubmitVote",
            lambda i: nr.SubmitVoteRequest(
                vote=nr.NegotiationVote(
                    artifact_id=i, critic_id="bob", score=9, confidence=0.9, passed=True
                )
            ),
        ),
    )
    assert all(map(not_found, found))
    mine = await t.call(
        "NegotiationRoomQueryService/ListProposals", a.ListRoomProposalsRequest(), "alice@acme"
    )
    assert [p.proposal.artifact_id for p in mine.proposals] == ["code-1"]


@pytest.mark.conformance(
    "security.multiuser.user-isolation", "security.multiuser.distinct-boundaries"
)
async def test_another_tenants_handoff_answers_like_one_that_does_not_exist(world: Tenants) -> None:
    t = world
    await register(t, "alice@acme")
    await register(t, "ops@acme", "carol")
    await register(t, "bob@globex")
    listing: Listing = ("HandoffQueryService/ListHandoffs", a.ListHandoffsRequest(), "bob@globex")
    before = await t.shape(*listing)
    offer = h.HandoffRequest(
        request_id="h-1", from_agent="alice", to_agent="carol", reason="acme review",
        context_snapshot=b'{"acme": "secret"}',
    )  # fmt: skip
    await t.call("HandoffService/RequestHandoff", offer, "alice@acme")

    assert await t.shape(*listing) == before
    found = await like_missing(
        t,
        "h-1",
        (
            "bob@globex",
            "HandoffQueryService/GetHandoff",
            lambda i: a.GetHandoffRequest(request_id=i, include_snapshot=True),
        ),
        (
            "bob@globex",
            "HandoffService/AcceptHandoff",
            lambda i: h.HandoffResponse(request_id=i, accepted=True, accepting_agent="bob"),
        ),
        (
            "bob@globex",
            "HandoffService/CompleteHandoff",
            lambda i: h.CompleteHandoffRequest(request_id=i, status=h.COMPLETED),
        ),
    )
    assert all(map(not_found, found))
    get = a.GetHandoffRequest(request_id="h-1")
    mine = await t.call("HandoffQueryService/GetHandoff", get, "alice@acme")
    assert (mine.status, mine.request.to_agent) == (h.PENDING, "carol")


# --------------------------------------------------------------------------- who may name a tenant


@pytest.mark.conformance(
    "security.multiuser.user-isolation", "security.multiuser.distinct-boundaries"
)
async def test_the_global_operator_acts_in_the_tenant_it_names_and_no_one_else_may(
    tmp_path: Path, world: Tenants, backend: Backend
) -> None:
    t = world
    await register(t, "alice@acme")
    assert (await t.call("SchedulerService/SubmitTask", _task("alice"), "app@acme")).accepted
    get = a.GetAgentRequest(agent_id="alice")
    seen = await t.call("DiscoveryService/GetAgent", get, "root@default", tenant=ACME)
    task = await t.call(
        "TaskQueryService/GetTask", a.GetTaskRequest(task_id="t-acme"), "root@default", tenant=ACME
    )
    assert (seen.descriptor.agent_id, task.agent_id) == ("alice", "alice")
    # Without naming one, root acts in the default tenant, where alice does not exist.
    (here,) = await like_missing(
        t,
        "alice",
        ("root@default", "DiscoveryService/GetAgent", lambda i: a.GetAgentRequest(agent_id=i)),
    )
    assert not_found(here)

    # A tenant root names that does not exist is not found, and nothing is made for it.
    unknown = await t.refused(
        "DiscoveryService/GetAgent", get, "root@default", tenant=UNKNOWN_TENANT
    )
    assert (unknown.status, unknown.code, unknown.details["field"]) == (
        NOT_FOUND, "NOT_FOUND", "apiary-tenant",
    )  # fmt: skip
    assert UNKNOWN_TENANT in unknown.message
    assert not tenant_data_dir(tmp_path, UNKNOWN_TENANT).exists()
    if backend.dsn:
        assert (
            existing_schemas(backend.dsn, tenant_schemas(backend.schema, [UNKNOWN_TENANT])) == set()
        )
    assert t.coordinator.tenancy is not None
    assert t.coordinator.tenancy.names() == sorted([*TENANTS, DEFAULT_TENANT])

    # A tenant's own principals, its admin included, act in their own tenant only: naming
    # another is refused, and alike whether that tenant exists or not.
    listing = a.ListAgentsRequest()
    for who in ("ops@globex", "bob@globex", "alice@acme"):
        other = GLOBEX if who.endswith(ACME) else ACME
        refused = await t.refused("DiscoveryService/ListAgents", listing, who, tenant=other)
        assert (refused.status, refused.code) == (
            grpc.StatusCode.PERMISSION_DENIED, "permission_denied",
        )  # fmt: skip
        assert refused == await t.refused(
            "DiscoveryService/ListAgents", listing, who, tenant=UNKNOWN_TENANT
        )
    own = await t.call("DiscoveryService/ListAgents", listing, "ops@globex", tenant=GLOBEX)
    assert list(own.agents) == []


async def _decisions(t: Tenants, who: str, tenant: str = "") -> list[tuple[str, str, bool]]:
    """The access decisions in the event log `who` reads: actor, action and allowed."""
    read = a.ReadEventsRequest(event_types=["access.decided"], limit=5000)
    events = (await t.call("EventLogService/ReadEvents", read, who, tenant=tenant)).events
    found = []
    for event in events:
        details = json.loads(event.details_json)
        found.append((event.actor, details["action"].rpartition(".")[2], details["allowed"]))
    return found


@pytest.mark.conformance(
    "security.multitenant.log-access-decisions", "security.multitenant.audit-trails"
)
async def test_a_refused_attempt_to_act_in_another_tenant_is_recorded_in_the_callers_log(
    world: Tenants,
) -> None:
    t = world
    refused = await t.refused(
        "DiscoveryService/ListAgents", a.ListAgentsRequest(), "ops@globex", tenant=ACME
    )
    assert refused.code == "permission_denied"
    # The default tenant's own operators see nothing of globex's principals; globex's see
    # their attempt.
    assert [d for d in await _decisions(t, "auditor@default") if GLOBEX in d[0]] == []
    crossing = ("operator:ops@globex", "DiscoveryService/ListAgents", False)
    assert crossing in await _decisions(t, "ops@globex")


@pytest.mark.conformance(
    "security.multitenant.log-access-decisions", "security.multitenant.audit-trails"
)
async def test_the_first_call_of_a_tenant_opened_while_running_is_recorded_in_its_own_log(
    world: Tenants,
) -> None:
    t = world
    t.add_key(PrincipalKind.AGENT, f"carl@{LATE_TENANT}")
    await register(t, f"carl@{LATE_TENANT}", "carl")
    assert [d for d in await _decisions(t, "auditor@default") if LATE_TENANT in d[0]] == []
    own = await _decisions(t, "root@default", LATE_TENANT)
    assert (f"agent:carl@{LATE_TENANT}", "RegistryService/RegisterAgent", True) in own


# --------------------------------------------------------------------------- stores and restarts


async def _agents_in_stores(backend: Backend, data_dir: Path) -> dict[str, list[str]]:
    """The agent ids each tenant's store holds, read from the stores themselves."""
    found = {}
    for tenant in (DEFAULT_TENANT, *TENANTS):
        async with open_store(backend.url or None, data_dir, tenant) as store:
            found[tenant] = sorted(agent.agent_id for agent in await store.agents.list())
    return found


@pytest.mark.conformance(
    "security.multiuser.user-isolation", "security.multiuser.distinct-boundaries"
)
async def test_each_tenant_keeps_its_objects_in_a_store_of_its_own(
    tmp_path: Path, backend: Backend
) -> None:
    async with open_tenants(tmp_path, backend.url) as t:
        await register(t, "alice@acme")
        await register(t, "bob@globex")
        tenancy = t.coordinator.tenancy
        assert tenancy is not None
        held = {}
        for tenant in (DEFAULT_TENANT, *TENANTS):
            opened = tenancy.opened(tenant)
            assert opened is not None
            held[tenant] = sorted(agent.agent_id for agent in await opened.store.agents.list())
        assert held == {DEFAULT_TENANT: [], ACME: ["alice"], GLOBEX: ["bob"]}

    tenants_dir = tmp_path / "tenants"
    if backend.name == "memory":
        assert not tenants_dir.exists()
        return
    if backend.name == "sqlite":
        assert sorted(path.name for path in tenants_dir.iterdir()) == sorted(TENANTS)
        for tenant in TENANTS:
            assert (tenant_data_dir(tmp_path, tenant) / "apiary.db").is_file()
    else:
        names = tenant_schemas(backend.schema)
        assert existing_schemas(backend.dsn, names) == set(names)
    assert await _agents_in_stores(backend, tmp_path) == held


@pytest.mark.conformance(
    "security.multiuser.user-isolation", "security.multiuser.distinct-boundaries"
)
async def test_a_restart_keeps_each_tenants_agents_in_its_tenant(
    tmp_path: Path, durable: Backend
) -> None:
    keys = create_keys(tmp_path)
    async with open_tenants(tmp_path, durable.url, keys) as t:
        await register(t, "alice@acme", capabilities=["acme-secret"])
        await register(t, "alice@globex", capabilities=["globex-only"])
        await register(t, "bob@globex")

    async with open_tenants(tmp_path, durable.url, keys) as t:
        tenancy = t.coordinator.tenancy
        assert tenancy is not None
        # The tenants the API keys name are open before the first call.
        assert [tenancy.opened(tenant) is not None for tenant in TENANTS] == [True, True]

        async def agents(who: str, tenant: str = "") -> list[tuple[str, list[str]]]:
            listed = await t.call(
                "DiscoveryService/ListAgents", a.ListAgentsRequest(), who, tenant=tenant
            )
            return sorted(
                (info.descriptor.agent_id, list(info.descriptor.capabilities))
                for info in listed.agents
            )

        assert await agents("alice@acme") == [("alice", ["acme-secret"])]
        assert await agents("bob@globex") == [("alice", ["globex-only"]), ("bob", [])]
        assert await agents("root@default") == []
        assert await agents("root@default", ACME) == [("alice", ["acme-secret"])]
