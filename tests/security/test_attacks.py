"""Attacks on the coordinator's access control, each replayed as its attacker makes it (real
gRPC and HTTP over loopback sockets): the refusal it meets (status, protocol error code and a
message naming who or what) and the proof that nothing of the victim's changed (its state,
descriptor, buffer, activity, worktree binding, messages, dead letters, tool calls).

Secure mode throughout; dev mode too where dev mode's own rules refuse the attack: a second
stream for a live agent, re-registering an agent that registered a key, cancelling another
agent's tool call, a foreign Host or Origin on HTTP, a credential that does not hold."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from google.protobuf.message import Message

from apiary.core.access.principal import PrincipalKind
from apiary.core.envelope import AckStage, Envelope
from apiary.core.events import Event
from apiary.core.records import MessageState
from apiary.core.signatures import SIGNATURE_KEY, encode_signature, public_bytes
from apiary.core.tools.calls import ToolCallState
from apiary.engine.assembly import Runtime
from apiary.engine.worktrees.settings import RepoEntry, WorktreeSettings
from apiary.sdk.agent import Agent
from apiary.sdk.credentials import ClientCredentials
from apiary.sdk.tool_provider import Tool
from apiary.sdk.tools import ToolClient
from apiary.server.auth.keys import KeyRing, credentials_path, iso_utc
from apiary.server.auth.settings import AuthSettings
from apiary.server.context import AGENT_KEY, RECIPIENT_KEY
from apiary.server.inprocess import open_test_coordinator
from apiary.testing.clock import FakeClock
from apiary.wire import pb
from apiary.wire.services import RpcMethod, find_method
from tests.gitrepo import make_repo
from tests.security.access_harness import PRINCIPALS, Secure, open_secure
from tests.server.tool_agents import RawProvider, never
from tests.server.wire_client import WAIT_S, descriptor, envelope, error_detail, next_batch

pytestmark = pytest.mark.conformance("security.multitenant.defense-in-depth")

apiary_pb2 = pb.apiary_pb2
MODES = [pytest.param(True, id="secure"), pytest.param(False, id="dev")]
MALLORY = "agent:mallory@default"
NOT_AS_BOB = f"{MALLORY} may act only as itself, not as bob"
ANONYMOUS = "anonymous:anonymous@default"
Metadata = tuple[tuple[str, str], ...]


# --- a coordinator in either mode, and calls that must fail -------------------------------------


@asynccontextmanager
async def open_mode(
    data_dir: Path,
    *,
    secure: bool,
    worktrees: WorktreeSettings | None = None,
    runtime: Runtime | None = None,
) -> AsyncIterator[Secure]:
    """The harness's coordinator and keys (an API key per name of PRINCIPALS), in secure or
    dev mode, with worktree repositories and a runtime when given. API keys authenticate in
    dev mode too; a call without one is anonymous there."""
    if secure and worktrees is None and runtime is None:
        async with open_secure(data_dir) as opened:
            yield opened
        return
    ring = KeyRing(credentials_path(data_dir))
    keys = {
        name: ring.create(kind, principal, roles=roles, now=time.time())[1]
        for name, (kind, principal, roles) in PRINCIPALS.items()
    }
    auth = AuthSettings(secure=secure)
    async with (
        open_test_coordinator(
            data_dir, auth=auth, worktrees=worktrees, runtime=runtime
        ) as coordinator,
        grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel,
    ):
        yield Secure(coordinator, channel, keys)


def add_key(
    s: Secure, name: str, kind: PrincipalKind, principal: str, roles: tuple[str, ...] = ()
) -> str:
    """One more API key, presented as `name` (the running coordinator re-reads its ring)."""
    ring = KeyRing(credentials_path(s.coordinator.config.data_dir))
    s.keys[name] = ring.create(kind, principal, roles=roles, now=time.time())[1]
    return s.keys[name]


def method(path: str) -> RpcMethod:
    service, _, name = path.strip("/").partition("/")
    found = find_method(service, name)
    assert found is not None, path
    return found


@dataclass(frozen=True)
class Refusal:
    status: grpc.StatusCode
    code: str
    message: str
    details: dict[str, str]


async def refused(call: Awaitable[Any]) -> Refusal:
    """The refusal of a call that must fail (a unary call, or a stream's first read)."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(call, WAIT_S)
    detail = error_detail(caught.value)
    return Refusal(caught.value.code(), detail.error_code, detail.message, dict(detail.details))


async def attack(s: Secure, path: str, request: Message, who: str | None) -> Refusal:
    """Call `path` with `request` as `who` (a name of `s.keys`; None: anonymous): refused."""
    return await refused(s.call(method(path), request, who))


def denied(refusal: Refusal, who: str, path: str, reason: str) -> None:
    """`refusal` is the access guard's: `who` may not call `path`, for `reason`."""
    assert (refusal.status, refusal.code) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "permission_denied",
    ), refusal
    assert refusal.message == f"{who} may not call {path}: {reason}"
    assert (refusal.details["principal"], refusal.details["action"]) == (who, path)


def unauthenticated(refusal: Refusal) -> None:
    """`refusal` is secure mode's answer to a call without a credential."""
    assert (refusal.status, refusal.code) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "unauthenticated",
    ), refusal
    assert refusal.message.startswith(
        "this coordinator runs in secure mode: the call needs a credential"
    )


# --- the victims' side ----------------------------------------------------------------------------


async def register_as_self(s: Secure, *agent_ids: str, key: bytes = b"") -> None:
    """Each agent registers itself with its own API key (and the public `key` when given)."""
    for agent_id in agent_ids:
        request = pb.registry_pb2.RegisterAgentRequest(agent=descriptor(agent_id, public_key=key))
        reply = await s.call(method(REGISTER), request, agent_id)
        assert reply.accepted, reply.reason


async def send(s: Secure, msg: pb.common_pb2.Envelope, to: str = "") -> None:
    """The producer of `msg` sends it to `to` with its own key; the router accepts it."""
    stub = pb.router_pb2_grpc.RouterServiceStub(s.channel)
    metadata = (*s.metadata(msg.producer_id), (RECIPIENT_KEY, to))
    request = pb.router_pb2.SendMessageRequest(msg=msg)
    reply = await stub.SendMessage(request, metadata=metadata, timeout=WAIT_S)
    assert reply.accepted, reply.reason


def inbound(s: Secure, agent_id: str, who: str | None) -> Any:
    """apiary.v1 Inbound for `agent_id`, opened as `who`."""
    stub = pb.apiary_pb2_grpc.RouterStreamServiceStub(s.channel)
    request = apiary_pb2.InboundRequest(agent_id=agent_id)
    return stub.Inbound(request, metadata=s.metadata(who))


def stream_incoming(s: Secure, agent_id: str, who: str | None) -> Any:
    """The canonical StreamIncoming for `agent_id`, opened as `who`."""
    stub = pb.router_pb2_grpc.RouterServiceStub(s.channel)
    request = pb.router_pb2.StreamRequest(agent_id=agent_id)
    return stub.StreamIncoming(request, metadata=s.metadata(who))


async def decisions(s: Secure, action: str) -> list[Event]:
    """The `access.decided` events of calls to `action`, oldest first."""
    events = await s.coordinator.events.read(after=0, limit=10_000)
    return [e for e in events if e.event_type == "access.decided" and e.details["action"] == action]


async def other_events(s: Secure) -> list[tuple[str, str]]:
    """Every event but the access decisions: what a refused call must not add to."""
    events = await s.coordinator.events.read(after=0, limit=10_000)
    return [(e.event_type, e.actor) for e in events if e.event_type != "access.decided"]


async def agent_view(s: Secure, agent_id: str) -> bytes:
    """The agent as discovery shows root: descriptor, state, heartbeat, buffer capacity."""
    stub = pb.apiary_pb2_grpc.DiscoveryServiceStub(s.channel)
    request = apiary_pb2.GetAgentRequest(agent_id=agent_id)
    info = await stub.GetAgent(request, metadata=s.metadata("root"), timeout=WAIT_S)
    return bytes(info.SerializeToString(deterministic=True))


# --- 1. reading another agent's messages ------------------------------------------------------

INBOUND = "/apiary.v1.RouterStreamService/Inbound"
STREAM_INCOMING = "/sw4rm.router.RouterService/StreamIncoming"
ATTEMPTS = 12
"""More than twice the default retry budget (RouterSettings.max_deliveries, 5)."""


@pytest.mark.conformance("security.multitenant.log-access-decisions")
async def test_secure_nobody_but_bob_opens_a_stream_of_bobs_messages(tmp_path: Path) -> None:
    async with open_secure(tmp_path) as s:
        await register_as_self(s, "alice", "bob")
        sent = envelope("alice", {"to": "bob"})
        await send(s, sent, "bob")
        messages = s.coordinator.store.messages
        before = await messages.get(sent.message_id)
        assert before is not None and before.deliveries == 0
        for path, opener in ((INBOUND, inbound), (STREAM_INCOMING, stream_incoming)):
            unauthenticated(await refused(opener(s, "bob", None).read()))
            denied(await refused(opener(s, "bob", "mallory").read()), MALLORY, path, NOT_AS_BOB)
            denied(
                await refused(opener(s, "bob", "app").read()),
                "application:ci@default",
                path,
                "application:ci@default is not an agent: only the agent itself may",
            )
            logged = [
                (e.actor, e.details["object"], e.details["refusal"], e.details["allowed"])
                for e in await decisions(s, path)
            ]
            assert logged == [
                (ANONYMOUS, "bob", "unauthenticated", False),
                (MALLORY, "bob", "permission_denied", False),
                ("application:ci@default", "bob", "permission_denied", False),
            ]
        assert await messages.get(sent.message_id) == before
        own = inbound(s, "bob", "bob")
        (delivery,) = await next_batch(own)
        own.cancel()
    assert (delivery.msg.message_id, delivery.attempt) == (sent.message_id, 1)


async def test_dev_a_second_anonymous_stream_for_bob_spends_none_of_his_deliveries(
    tmp_path: Path,
) -> None:
    """bob reads without the SDK (no key, no proof). Twelve more anonymous streams for bob,
    opened at once, are refused while his is live (each after the wait for bob's to end):
    had they taken it over, each would have handed bob's unacknowledged message out again,
    and the sixth failed it (max_deliveries). The coordinator's clock is fake, so no
    acknowledgement deadline passes meanwhile."""
    clock = FakeClock()
    runtime = Runtime(clock=clock, sleep=clock.sleep)
    async with open_mode(tmp_path, secure=False, runtime=runtime) as dev:
        await register_as_self(dev, "alice", "bob")
        bobs = inbound(dev, "bob", None)
        await asyncio.wait_for(bobs.read(), WAIT_S)  # bob's directory notice: the stream is open
        first = envelope("alice", {"n": 1})
        await send(dev, first, "bob")
        (handed,) = await next_batch(bobs)
        assert (handed.msg.message_id, handed.attempt) == (first.message_id, 1)
        # mallory with her own key is no anonymous caller: she acts only as herself.
        denied(await refused(inbound(dev, "bob", "mallory").read()), MALLORY, INBOUND, NOT_AS_BOB)
        openers = [inbound if n % 2 else stream_incoming for n in range(ATTEMPTS)]
        streams = [opener(dev, "bob", None) for opener in openers]
        for refusal in await asyncio.gather(*(refused(stream.read()) for stream in streams)):
            assert (refusal.status, refusal.code) == (
                grpc.StatusCode.ABORTED,
                "already_in_progress",
            ), refusal
            assert refusal.message.startswith("bob already has a live stream; a second one")
            assert refusal.details == {"agent_id": "bob", "reason": "stream_live"}
        # The live copy holds the hand-out count (the store's is written behind).
        live = dev.coordinator.router.live.copies[first.message_id]
        assert (live.state.terminal, live.deliveries) == (False, 1)
        assert await dev.coordinator.store.dlq.list(limit=100) == []
        # bob's stream was never taken over: the next message reaches it, and bob finishes
        # the first one himself.
        second = envelope("alice", {"n": 2})
        await send(dev, second, "bob")
        (delivery,) = await next_batch(bobs)
        assert (delivery.msg.message_id, delivery.attempt) == (second.message_id, 1)
        ack = {"ack_for_message_id": first.message_id, "ack_stage": AckStage.FULFILLED.name}
        await send(dev, envelope("bob", ack, message_type=pb.common_pb2.ACKNOWLEDGEMENT))
        bobs.cancel()
        stored = await dev.coordinator.store.messages.get(first.message_id)
        assert stored is not None and stored.state is MessageState.FULFILLED


# --- 2. re-registering an agent that registered a key -------------------------------------------

REGISTER = "/sw4rm.registry.RegistryService/RegisterAgent"


def _signed(signature: bytes | None) -> Metadata:
    return () if signature is None else ((SIGNATURE_KEY, encode_signature(signature)),)


async def _refused_in_dev(s: Secure, hijack: Message, signature: Metadata) -> None:
    """Anonymous, claiming to be nobody, mallory or bob himself: the registry's refusal."""
    stub = pb.registry_pb2_grpc.RegistryServiceStub(s.channel)
    for claimed in ((), ((AGENT_KEY, "mallory"),), ((AGENT_KEY, "bob"),)):
        refusal = await refused(stub.RegisterAgent(hijack, metadata=(*signature, *claimed)))
        assert (refusal.status, refusal.code) == (
            grpc.StatusCode.PERMISSION_DENIED,
            "permission_denied",
        ), refusal
        assert refusal.message.startswith(
            "bob is registered with a public key: registering it again (a changed descriptor "
            "or a new key) must be signed by that key (sw4rm-signature metadata)"
        )
        assert refusal.details == {"field": "agent.public_key", "agent_id": "bob"}


async def _refused_in_secure(s: Secure, hijack: Message, signature: Metadata) -> None:
    """Anonymous, mallory, an application, an operator without `agents`: the guard's."""
    stub = pb.registry_pb2_grpc.RegistryServiceStub(s.channel)

    async def as_(who: str | None) -> Refusal:
        return await refused(stub.RegisterAgent(hijack, metadata=(*signature, *s.metadata(who))))

    unauthenticated(await as_(None))
    denied(await as_("mallory"), MALLORY, REGISTER, NOT_AS_BOB)
    denied(
        await as_("app"),
        "application:ci@default",
        REGISTER,
        "application:ci@default is not an agent: only the agent itself may",
    )
    denied(
        await as_("no-role"),
        "operator:olivia@default",
        REGISTER,
        "operator:olivia@default needs the operator role 'agents' (holds: none)",
    )


@pytest.mark.parametrize("secure_mode", MODES)
async def test_re_registering_a_keyed_agent_without_its_signature_changes_nothing(
    tmp_path: Path, secure_mode: bool
) -> None:
    """bob registered his public key. Someone re-registers bob with that key and a descriptor
    that would take him over (another name and capabilities, modalities without JSON), with
    no signature, another key's, or bob's signature of another request: refused, and bob,
    his descriptor and the JSON messages he accepts are as they were."""
    bobs_key = Ed25519PrivateKey.generate()
    public = public_bytes(bobs_key)
    async with open_mode(tmp_path, secure=secure_mode) as s:
        await register_as_self(s, "alice")
        await register_as_self(s, "bob", key=public)
        before = (await agent_view(s, "bob"), await other_events(s))
        taken_over = descriptor(
            "bob",
            name="bob (mallory's)",
            capabilities=["exfiltrate"],
            modalities_supported=["image/png"],
            public_key=public,
        )
        hijack = pb.registry_pb2.RegisterAgentRequest(agent=taken_over)
        earlier = pb.registry_pb2.RegisterAgentRequest(agent=descriptor("bob", public_key=public))
        signatures = [
            None,
            Ed25519PrivateKey.generate().sign(hijack.SerializeToString(deterministic=True)),
            bobs_key.sign(earlier.SerializeToString(deterministic=True)),
        ]
        for signature in signatures:
            if secure_mode:
                await _refused_in_secure(s, hijack, _signed(signature))
            else:
                await _refused_in_dev(s, hijack, _signed(signature))
        assert (await agent_view(s, "bob"), await other_events(s)) == before
        await send(s, envelope("alice", {"still": "json"}), "bob")


async def test_dev_deregistering_a_keyed_agent_needs_its_signature_too(tmp_path: Path) -> None:
    """The way round the rule above: deregister bob (anonymous, claiming to be mallory), then
    register a descriptor of one's own under his id. Deregistering an agent that registered
    a key must meet the same rule as re-registering it."""
    bobs_key = Ed25519PrivateKey.generate()
    async with open_mode(tmp_path, secure=False) as dev:
        await register_as_self(dev, "alice")
        await register_as_self(dev, "bob", key=public_bytes(bobs_key))
        before = (await agent_view(dev, "bob"), await other_events(dev))
        stub = pb.registry_pb2_grpc.RegistryServiceStub(dev.channel)
        leave = pb.registry_pb2.DeregisterAgentRequest(agent_id="bob", reason="mallory says")
        refusal = await refused(stub.DeregisterAgent(leave, metadata=((AGENT_KEY, "mallory"),)))
        assert (refusal.status, refusal.code) == (
            grpc.StatusCode.PERMISSION_DENIED,
            "permission_denied",
        )
        assert refusal.message.startswith(
            "bob is registered with a public key: deregistering it must be signed by that key"
        )
        assert refusal.details == {"field": SIGNATURE_KEY, "agent_id": "bob"}
        assert (await agent_view(dev, "bob"), await other_events(dev)) == before


# --- 3. acting on another agent's state, buffer, activity and worktree --------------------------

HEARTBEAT = "/sw4rm.registry.RegistryService/Heartbeat"


async def _bobs_footprint(s: Secure) -> tuple[object, ...]:
    """bob as root reads him (registration, state, buffer, activity, worktree binding) and
    every event but the access decisions."""
    root = s.metadata("root")
    activity = pb.apiary_pb2_grpc.ActivityBufferServiceStub(s.channel)
    entries = await activity.List(apiary_pb2.ListActivityRequest(agent_id="bob"), metadata=root)
    bindings = pb.apiary_pb2_grpc.WorktreeBindingServiceStub(s.channel)
    binding = await bindings.Get(apiary_pb2.GetBindingRequest(agent_id="bob"), metadata=root)
    return (
        await agent_view(s, "bob"),
        [e.SerializeToString(deterministic=True) for e in entries.entries],
        binding.SerializeToString(deterministic=True),
        await other_events(s),
    )


def _as_bob() -> list[tuple[str, Message]]:
    """What mallory sends naming bob: each would change bob if it were let through."""
    common, reg, sched = pb.common_pb2, pb.registry_pb2, pb.scheduler_pb2
    wt = pb.worktree_pb2
    beats = [
        (HEARTBEAT, reg.HeartbeatRequest(agent_id="bob", state=state))
        for state in (common.FAILED_STATE, common.SUSPENDED, common.SHUTTING_DOWN)
    ]
    return [
        *beats,
        (
            "/apiary.v1.DiscoveryService/SetBufferCapacity",
            apiary_pb2.SetBufferCapacityRequest(agent_id="bob", capacity=1),
        ),
        (
            "/sw4rm.scheduler.SchedulerService/PurgeActivity",
            sched.PurgeActivityRequest(agent_id="bob", task_ids=["t-1"]),
        ),
        (
            "/sw4rm.scheduler.SchedulerService/PurgeActivity",
            sched.PurgeActivityRequest(agent_id="bob"),
        ),
        (
            "/apiary.v1.ActivityBufferService/Complete",
            apiary_pb2.CompleteActivityRequest(agent_id="bob", task_id="t-1", outcome="FAILED"),
        ),
        ("/sw4rm.worktree.WorktreeService/Unbind", wt.UnbindRequest(agent_id="bob")),
        (
            "/sw4rm.worktree.WorktreeService/Bind",
            wt.BindRequest(agent_id="bob", repo_id="api", worktree_id="mallory"),
        ),
        (
            "/apiary.v1.WorktreeBindingService/Bind",
            apiary_pb2.BindWorktreeRequest(agent_id="bob", repo_id="api", worktree_id="mallory"),
        ),
        (
            "/sw4rm.scheduler.SchedulerService/ShutdownAgent",
            sched.ShutdownAgentRequest(agent_id="bob"),
        ),
        (
            "/sw4rm.registry.RegistryService/DeregisterAgent",
            reg.DeregisterAgentRequest(agent_id="bob", reason="mallory says"),
        ),
    ]


async def test_secure_mallory_changes_nothing_of_bobs_state_buffer_activity_or_worktree(
    tmp_path: Path,
) -> None:
    repos = WorktreeSettings(repos=(RepoEntry("api", make_repo(tmp_path / "repos" / "api")),))
    async with open_mode(tmp_path / "data", secure=True, worktrees=repos) as s:
        await register_as_self(s, "bob", "mallory")
        beat = pb.registry_pb2.HeartbeatRequest(agent_id="bob", state=pb.common_pb2.RUNNABLE)
        assert (await s.call(method(HEARTBEAT), beat, "bob")).ok
        entry = apiary_pb2.ActivityRecord(agent_id="bob", task_id="t-1", description="resize")
        register = apiary_pb2.RegisterActivityRequest(entry=entry)
        await s.call(method("/apiary.v1.ActivityBufferService/Register"), register, "bob")
        bind = pb.worktree_pb2.BindRequest(agent_id="bob", repo_id="api", worktree_id="home")
        bound = await s.call(method("/sw4rm.worktree.WorktreeService/Bind"), bind, "bob")
        assert bound.ok, bound.reason
        before = await _bobs_footprint(s)
        for path, request in _as_bob():
            denied(await attack(s, path, request, "mallory"), MALLORY, path, NOT_AS_BOB)
        for verb in ("Suspend", "Resume"):
            path = f"/apiary.v1.AgentControlService/{verb}"
            request = apiary_pb2.AgentControlRequest(agent_id="bob", reason="mallory says")
            denied(
                await attack(s, path, request, "mallory"),
                MALLORY,
                path,
                f"{MALLORY} is not an operator (the role 'agents' needed)",
            )
        assert await _bobs_footprint(s) == before
        # The requests were sound: the refusals are the rules'. bob may do it himself.
        capacity = apiary_pb2.SetBufferCapacityRequest(agent_id="bob", capacity=1)
        mine = await s.call(
            method("/apiary.v1.DiscoveryService/SetBufferCapacity"), capacity, "bob"
        )
        assert mine.capacity == 1


# --- 4. cancelling another agent's tool call ----------------------------------------------------

CANCEL = "/sw4rm.tool.ToolService/Cancel"


@asynccontextmanager
async def open_provider(s: Secure, home: Path) -> AsyncIterator[RawProvider]:
    """The agent `counter` offering the tool `count`, whose calls the test answers by hand;
    it authenticates with a key of its own."""
    key = add_key(s, "counter", PrincipalKind.AGENT, "counter")
    credentials = ClientCredentials.load({"HOME": str(home)}, api_key=key)
    address = str(s.coordinator.grpc_address)
    agent = Agent("counter", coordinator=address, credentials=credentials)
    async with agent:
        provider = RawProvider(agent)
        await provider.start([Tool("count", never)])
        try:
            yield provider
        finally:
            await provider.stop()


def caller(s: Secure, agent_id: str, *, secure: bool) -> Metadata:
    """What a tool caller presents: its `sw4rm-agent-id`, and its key in secure mode."""
    return ((AGENT_KEY, agent_id), *(s.metadata(agent_id) if secure else ()))


async def _cancels_refused(s: Secure, call_id: str, *, secure: bool) -> None:
    """mallory (and, in secure mode, an operator without `tools`) cancel alice's call."""
    stub = pb.tool_pb2_grpc.ToolServiceStub(s.channel)
    request = pb.tool_pb2.ToolCall(call_id=call_id)

    async def as_(metadata: Metadata) -> Refusal:
        return await refused(stub.Cancel(request, metadata=metadata))

    if not secure:
        mine = "mallory does not own it (alice does)"
        denied(await as_(((AGENT_KEY, "mallory"),)), ANONYMOUS, CANCEL, mine)
        return
    denied(await as_(s.metadata("mallory")), MALLORY, CANCEL, f"{MALLORY} does not own it")
    posing = f"the call claims to be agent 'alice' but authenticates as {MALLORY}"
    denied(await as_((*s.metadata("mallory"), (AGENT_KEY, "alice"))), MALLORY, CANCEL, posing)
    denied(
        await as_(s.metadata("no-role")),
        "operator:olivia@default",
        CANCEL,
        "operator:olivia@default needs the operator role 'tools' (holds: none)",
    )


@pytest.mark.parametrize("secure_mode", MODES)
async def test_only_the_caller_or_a_tools_operator_cancels_a_running_tool_call(
    tmp_path: Path, secure_mode: bool
) -> None:
    async with open_mode(tmp_path / "data", secure=secure_mode) as s:
        add_key(s, "tools-operator", PrincipalKind.OPERATOR, "tina", ("tools",))
        tools = s.coordinator.tools
        assert tools is not None
        async with open_provider(s, tmp_path / "home") as provider:
            stub = pb.tool_pb2_grpc.ToolServiceStub(s.channel)
            running: dict[str, tuple[Any, Envelope]] = {}
            for call_id in ("alice-1", "alice-2"):
                request = pb.tool_pb2.ToolCall(
                    call_id=call_id, tool_name="count", args=b"{}",
                    content_type="application/json", stream=True,
                )  # fmt: skip
                stream = stub.CallStream(request, metadata=caller(s, "alice", secure=secure_mode))
                running[call_id] = (stream, (await provider.next_call())[0])
            events = await other_events(s)
            for call_id in running:
                await _cancels_refused(s, call_id, secure=secure_mode)
                call = tools.calls.get(call_id)
                assert call is not None
                assert (call.state, call.stop_requested.is_set()) == (ToolCallState.RUNNING, False)
            assert await other_events(s) == events  # no tool.cancel_requested
            assert provider.calls.empty()  # nobody asked the provider to stop
            for call_id, (stream, asked) in running.items():  # the calls run on
                await provider.result(asked, {"result": {"i": 0}, "final": False})
                frame = await asyncio.wait_for(stream.read(), WAIT_S)
                assert (frame.call_id, frame.final, json.loads(frame.data)) == (
                    call_id,
                    False,
                    {"i": 0},
                )
            alice_key = s.keys["alice"] if secure_mode else ""
            cancellers = {
                "alice-1": ToolClient(s.channel, agent_id="alice", token=alice_key),
                "alice-2": ToolClient(s.channel, token=s.keys["tools-operator"]),
            }
            for call_id, canceller in cancellers.items():
                assert await canceller.cancel(call_id) == (
                    "CANCELLED",
                    f"{call_id}: cancellation initiated (CANCELLING)",
                )
                _, stop = await provider.next_call()
                assert stop == {"action": "cancel", "call_id": call_id, "provider_id": "counter"}
                stream, asked = running[call_id]
                await provider.result(asked, {"final": True, "summary": {"cancelled": True}})
                final = await asyncio.wait_for(stream.read(), WAIT_S)
                assert final.final and json.loads(final.summary)["status"] == "CANCELLED"


# --- 5. operator surfaces by role ---------------------------------------------------------------

READ_EVENTS = "/apiary.v1.EventLogService/ReadEvents"
DEREGISTER = "/sw4rm.registry.RegistryService/DeregisterAgent"
DLQ = "/apiary.v1.DlqService/"


async def test_secure_dead_letters_events_and_deregistration_need_their_operator_role(
    tmp_path: Path,
) -> None:
    async with open_secure(tmp_path) as s:
        add_key(s, "dlq-operator", PrincipalKind.OPERATOR, "dana", ("dlq",))
        await register_as_self(s, "alice", "bob")
        broken = envelope("alice", {"n": 1})  # bob fails it: a dead letter
        await send(s, broken, "bob")
        ack = {"ack_for_message_id": broken.message_id, "ack_stage": AckStage.FAILED.name,
               "error_code": "internal_error"}  # fmt: skip
        await send(s, envelope("bob", ack, message_type=pb.common_pb2.ACKNOWLEDGEMENT))
        dlq = s.coordinator.store.dlq
        (letter,) = await dlq.list(limit=100)
        assert letter.message_id == broken.message_id
        before = (await dlq.list(limit=100), await agent_view(s, "bob"), await other_events(s))
        reads: list[tuple[str, Message]] = [
            (READ_EVENTS, apiary_pb2.ReadEventsRequest()),
            (DLQ + "List", apiary_pb2.ListDlqRequest()),
            (DLQ + "Get", apiary_pb2.GetDlqRequest(entry_id=letter.entry_id)),
            (DLQ + "Export", apiary_pb2.ExportDlqRequest(include_payloads=True)),
            (DLQ + "Requeue", apiary_pb2.RequeueDlqRequest(entry_ids=[letter.entry_id])),
        ]
        for who in ("alice", "bob"):
            label = f"agent:{who}@default"
            for path, read in reads:
                role = "events" if path == READ_EVENTS else "dlq"
                reason = f"{label} is not an operator (the role {role!r} needed)"
                denied(await attack(s, path, read, who), label, path, reason)
        leave = pb.registry_pb2.DeregisterAgentRequest(agent_id="bob", reason="revoked")
        for who, name, held in (("no-role", "olivia", "none"), ("dlq-operator", "dana", "dlq")):
            label = f"operator:{name}@default"
            reason = f"{label} needs the operator role 'agents' (holds: {held})"
            denied(await attack(s, DEREGISTER, leave, who), label, DEREGISTER, reason)
        assert (await dlq.list(limit=100), await agent_view(s, "bob"), await other_events(s)) == (
            before
        )
        # The dlq operator reads the dead letters, and not the event log.
        listed = await s.call(method(DLQ + "List"), apiary_pb2.ListDlqRequest(), "dlq-operator")
        assert [e.message_id for e in listed.entries] == [broken.message_id]
        denied(
            await attack(s, READ_EVENTS, apiary_pb2.ReadEventsRequest(), "dlq-operator"),
            "operator:dana@default",
            READ_EVENTS,
            "operator:dana@default needs the operator role 'events' (holds: dlq)",
        )


# --- 6. the HTTP surfaces: Host, Origin, credentials --------------------------------------------

EVENTS_STREAM = "/v1/events/stream"
WORKFLOWS = "/console/api/workflows"
EVIL = "evil.example"


@asynccontextmanager
async def open_http(s: Secure) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=f"http://{s.coordinator.http_address}") as http:
        yield http


async def get(
    http: aiohttp.ClientSession, path: str, headers: dict[str, str]
) -> tuple[int, str, Any]:
    """Status, content type and JSON body (None for another type: a stream is left unread)."""
    async with http.get(path, headers=headers) as resp:
        body = await resp.json() if resp.content_type == "application/json" else None
        return resp.status, resp.content_type, body


def bearer(s: Secure, who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {s.keys[who]}"}


async def _browser_attacks_refused(
    s: Secure, http: aiohttp.ClientSession, credential: dict[str, str]
) -> None:
    """A rebound DNS name and another site's page are refused on both routes, with a JSON
    error naming the Host or Origin, whatever the credential."""
    here = str(s.coordinator.http_address)
    origin = f"http://{EVIL}"
    for path in (EVENTS_STREAM, WORKFLOWS):
        status, kind, body = await get(http, path, {**credential, "Host": f"{EVIL}:80"})
        assert (status, kind, body["error"]["code"]) == (
            403,
            "application/json",
            "permission_denied",
        )
        assert body["error"]["message"].startswith(
            f"this loopback coordinator was reached as '{EVIL}:80' (DNS rebinding?)"
        )
        assert body["error"]["details"] == {"host": f"{EVIL}:80", "reason": "not_loopback_host"}
        status, kind, body = await get(http, path, {**credential, "Origin": origin})
        assert (status, kind, body["error"]["code"]) == (
            403,
            "application/json",
            "permission_denied",
        )
        assert (
            body["error"]["message"] == f"cross-site request from {origin} refused (this is {here})"
        )
        assert body["error"]["details"] == {"origin": origin, "reason": "cross_site"}


async def test_dev_a_foreign_host_or_origin_reads_no_events_or_workflows(tmp_path: Path) -> None:
    async with open_mode(tmp_path, secure=False) as dev, open_http(dev) as http:
        await _browser_attacks_refused(dev, http, {})
        await _browser_attacks_refused(dev, http, bearer(dev, "root"))
        # The same requests from loopback without an Origin: dev mode serves both.
        assert (await get(http, EVENTS_STREAM, {}))[:2] == (200, "text/event-stream")
        assert (await get(http, WORKFLOWS, {})) == (200, "application/json", {"workflows": []})


@pytest.mark.conformance("security.multitenant.log-access-decisions")
async def test_secure_events_and_workflows_need_an_events_operator(tmp_path: Path) -> None:
    async with open_secure(tmp_path) as s, open_http(s) as http:
        events = add_key(s, "events-operator", PrincipalKind.OPERATOR, "eve", ("events",))
        add_key(s, "dlq-operator", PrincipalKind.OPERATOR, "dana", ("dlq",))
        for path in (EVENTS_STREAM, WORKFLOWS):
            route = f"GET {path}"
            status, _, body = await get(http, path, {})
            assert (status, body["error"]["code"]) == (401, "unauthenticated")
            assert body["error"]["message"].startswith("this coordinator runs in secure mode")
            refusals = [
                ("mallory", MALLORY, f"{MALLORY} is not an operator (the role 'events' needed)"),
                (
                    "dlq-operator",
                    "operator:dana@default",
                    "operator:dana@default needs the operator role 'events' (holds: dlq)",
                ),
            ]
            for who, label, reason in refusals:
                status, _, body = await get(http, path, bearer(s, who))
                assert (status, body["error"]["code"]) == (403, "permission_denied")
                assert body["error"]["message"] == f"{label} may not call {route}: {reason}"
            logged = [
                (e.actor, e.details["allowed"], e.details["transport"])
                for e in await decisions(s, route)
            ]
            assert logged == [
                (ANONYMOUS, False, "http"),
                (MALLORY, False, "http"),
                ("operator:dana@default", False, "http"),
            ]
        await _browser_attacks_refused(s, http, bearer(s, "events-operator"))
        allowed = {"Authorization": f"Bearer {events}"}
        assert (await get(http, EVENTS_STREAM, allowed))[:2] == (200, "text/event-stream")
        assert (await get(http, WORKFLOWS, allowed)) == (200, "application/json", {"workflows": []})


# --- 7. forged credentials ------------------------------------------------------------------------

LIST_AGENTS = "/apiary.v1.DiscoveryService/ListAgents"


@dataclass(frozen=True)
class Forged:
    authorization: str
    message: str
    secret: str
    """What no answer or event may contain."""


def _secret(key: str) -> str:
    """The secret part of `apk_<key id>_<secret>`."""
    return key.split("_", 2)[2]


def _forgeries(s: Secure) -> dict[str, Forged]:
    ring = KeyRing(credentials_path(s.coordinator.config.data_dir))
    now = time.time()
    expired, expired_key = ring.create(
        PrincipalKind.AGENT, "bob", expires_at=now - 60, now=now - 3600
    )
    made, revoked_key = ring.create(PrincipalKind.AGENT, "bob", now=now)
    revoked = ring.revoke(made.key_id, now=now)
    assert expired.expires_at is not None and revoked.revoked_at is not None
    bobs_id = s.keys["bob"].split("_")[1]
    unknown_id = "q" * 12
    fix = "ask an operator for a key (apiary auth create)"
    return {
        "not bearer": Forged(
            f"Basic {s.keys['root']}",
            "authorization must be `Bearer <API key or operator token>`",
            _secret(s.keys["root"]),
        ),
        "malformed key": Forged(
            f"Bearer apk_{bobs_id}_tooShortSecret42",
            "malformed API key: expected apk_<12-character key id>_<secret> as "
            "`apiary auth create` printed it",
            "tooShortSecret42",
        ),
        "bob's key id, another secret": Forged(
            f"Bearer apk_{bobs_id}_{'W' * 43}", f"unknown API key {bobs_id}; {fix}", "W" * 43
        ),
        "unknown key": Forged(
            f"Bearer apk_{unknown_id}_{'S' * 43}", f"unknown API key {unknown_id}; {fix}", "S" * 43
        ),
        "expired key": Forged(
            f"Bearer {expired_key}",
            f"API key {expired.key_id} expired at {iso_utc(expired.expires_at)}; ask an operator "
            "for a new key",
            _secret(expired_key),
        ),
        "revoked key": Forged(
            f"Bearer {revoked_key}",
            f"API key {revoked.key_id} was revoked at {iso_utc(revoked.revoked_at)}",
            _secret(revoked_key),
        ),
        "unknown operator token": Forged(
            "Bearer let-me-in-token", "unknown operator token", "let-me-in-token"
        ),
    }


@pytest.mark.conformance("security.multitenant.log-access-decisions")
@pytest.mark.parametrize("secure_mode", MODES)
async def test_a_forged_credential_is_refused_and_its_secret_never_echoed(
    tmp_path: Path, secure_mode: bool
) -> None:
    """A credential presented that does not hold is refused in either mode (never taken for
    anonymous), over gRPC and HTTP, saying what is wrong; its secret is in no answer and in
    no `access.decided` event (read as root reads them)."""
    async with open_mode(tmp_path, secure=secure_mode) as s, open_http(s) as http:
        forgeries = _forgeries(s)
        discovery = pb.apiary_pb2_grpc.DiscoveryServiceStub(s.channel)
        answers: list[str] = []
        for name, forged in forgeries.items():
            metadata = (("authorization", forged.authorization),)
            refusal = await refused(
                discovery.ListAgents(apiary_pb2.ListAgentsRequest(), metadata=metadata)
            )
            assert (refusal.status, refusal.code, refusal.message) == (
                grpc.StatusCode.UNAUTHENTICATED,
                "unauthenticated",
                forged.message,
            ), name
            status, _, body = await get(http, WORKFLOWS, {"Authorization": forged.authorization})
            assert (status, body["error"]["code"], body["error"]["message"]) == (
                401,
                "unauthenticated",
                forged.message,
            ), name
            answers += [repr(refusal), json.dumps(body)]
        read = await s.call(
            method(READ_EVENTS),
            apiary_pb2.ReadEventsRequest(event_types=["access.decided"], limit=1000),
            "root",
        )
        actions = (LIST_AGENTS, f"GET {WORKFLOWS}")
        logged = [
            (e.actor.split(":")[0], d["action"], d["reason"], d["allowed"], d["refusal"])
            for e in read.events
            if (d := json.loads(e.details_json))["action"] in actions
        ]
        assert logged == [
            ("unauthenticated", action, forged.message, False, "unauthenticated")
            for forged in forgeries.values()
            for action in actions
        ]
        everything = "\n".join([*answers, str(read)])
        for name, forged in forgeries.items():
            assert forged.secret not in everything, name
