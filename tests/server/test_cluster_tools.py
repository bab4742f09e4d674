"""Tools and worktrees in cluster mode (docs/cluster.md, "The leader"): three coordinators
serving one PostgreSQL schema as replicas; the tool service and the worktree bindings run
on the leader, their calls made through any replica.

- A tool provider (an agent) connected through one follower serves a call made through
  the other, its TOOL_RESULT relayed to the leader; the catalogue reads the same through
  every replica.
- A worktree bound through one follower is seen and released through another; a switch's
  HITL approval is opened by the leader and decided through a third replica; a tool that
  needs a worktree, called through a follower, is given the caller's; WORKTREE_CONTROL
  through a follower reaches the leader, and what is malformed is refused there.
- When the leader stops, the provider (connected to it) moves to another replica, the new
  leader loads the catalogue from the store, and the provider serves calls again; a killed
  leader's successor does the same; with a shared `[worktrees] root` the next leader finds
  the worktrees the last one made.
- A caller without the right is refused by the follower it called, before anything is
  forwarded; the owner of a running call is known to the leader, which refuses another
  caller's Cancel.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

import apiary
from apiary.core.envelope import MessageType
from apiary.engine.cluster.settings import ClusterSettings
from apiary.engine.tools.mcp_bridge import McpProvider
from apiary.engine.worktrees.settings import RepoEntry, WorktreeSettings
from apiary.errors import ApiaryError
from apiary.sdk.tool_provider import Tool, ToolCallContext, ToolHost
from apiary.sdk.tools import ToolClient
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb
from apiary.wire.errordetail import error_from_trailers
from tests.gitrepo import make_repo
from tests.server.test_cluster_leader import (
    AUTH,
    LEASE_S,
    OPERATORS,
    PARTITIONS,
    TOKEN,
    WAIT_S,
    _role,
    _until,
)
from tests.server.test_worktree_service import _worktree_reply
from tests.server.tool_agents import never, raw_provider, tool_agent
from tests.server.wire_client import envelope, register

pytestmark = pytest.mark.postgres

ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
w = pb.worktree_pb2
a = pb.apiary_pb2


async def add(call: ToolCallContext) -> Any:
    return {"sum": call.args["a"] + call.args["b"]}


CALC = [Tool("add", add, input_schema=ADD, idempotent=True, side_effects="none")]


@dataclass
class Cluster:
    """Three replicas, the leader first; each may be stopped on its own (`stop`)."""

    replicas: list[Coordinator]
    stacks: dict[int, AsyncExitStack]

    async def stop(self, replica: Coordinator) -> None:
        """Stop `replica` cleanly (as SIGTERM: a leader releases its lease)."""
        await self.stacks[id(replica)].aclose()


@pytest.fixture
def repos(tmp_path: Path) -> WorktreeSettings:
    """One repository, `api`, at the same path for every replica (one machine)."""
    return WorktreeSettings(repos=(RepoEntry("api", make_repo(tmp_path / "repos" / "api")),))


@asynccontextmanager
async def _cluster(
    tmp_path: Path, url: str, worktrees: WorktreeSettings | None = None
) -> AsyncIterator[Cluster]:
    async with AsyncExitStack() as outer:
        replicas: list[Coordinator] = []
        stacks: dict[int, AsyncExitStack] = {}
        for name in "abc":
            stack = await outer.enter_async_context(AsyncExitStack())
            replica = await stack.enter_async_context(
                open_test_coordinator(
                    tmp_path / name, url, runtime=OPERATORS, worktrees=worktrees,
                    cluster=ClusterSettings(True, name, LEASE_S, PARTITIONS),
                )
            )  # fmt: skip
            replicas.append(replica)
            stacks[id(replica)] = stack
        await _until(lambda: sum(_role(r).leads() for r in replicas) == 1, "one leader")
        await _until(lambda: all(_role(r).lease.address for r in replicas), "every replica sees it")
        replicas.sort(key=lambda r: not _role(r).leads())
        yield Cluster(replicas, stacks)


async def test_a_provider_connected_through_one_follower_serves_a_call_made_through_another(
    tmp_path: Path, url: str
) -> None:
    async with _cluster(tmp_path, url) as cluster:
        leader, f1, f2 = cluster.replicas
        async with (
            tool_agent(str(f1.grpc_address), "calc", CALC),
            grpc.aio.insecure_channel(str(f2.grpc_address)) as channel,
        ):
            client = ToolClient(channel, agent_id="caller")
            result = await client.call("add", {"a": 2, "b": 3})
            assert result.json() == {"sum": 5}
            assert [p.provider_id for p in await client.providers()] == ["calc"]
            described = await client.describe("calc")
            assert [t.tool_name for t in described] == ["add"]
            frames = [frame async for frame in client.stream("add", {"a": 20, "b": 22})]
            assert frames[-1].final and frames[-1].json() == {"sum": 42}
            # The call ran on the leader: the followers' tool services hold nothing.
            assert leader.tools is not None and f2.tools is not None
            assert leader.tools.catalog.get("calc") is not None
            assert f2.tools.catalog.get("calc") is None
            # A killed leader's successor loads the catalogue from the store and calls it.
            assert leader.cluster is not None
            leader.cluster.halt()  # (as SIGKILL: nothing released, the lease lapses)
            await _until(lambda: _role(f1).leads() or _role(f2).leads(), "a new leader")
            assert (await client.call("add", {"a": 2, "b": 2})).json() == {"sum": 4}


async def test_a_worktree_bound_through_one_follower_is_seen_and_released_through_another(
    tmp_path: Path, url: str, repos: WorktreeSettings
) -> None:
    async with (
        _cluster(tmp_path, url, repos) as cluster,
        contextlib.AsyncExitStack() as stack,
    ):
        leader, f1, f2 = cluster.replicas
        one, two, three = [
            pb.worktree_pb2_grpc.WorktreeServiceStub(
                await stack.enter_async_context(grpc.aio.insecure_channel(str(r.grpc_address)))
            )
            for r in (f1, f2, leader)
        ]
        bound = await one.Bind(w.BindRequest(agent_id="dev", repo_id="api", worktree_id="front"))
        assert (bound.ok, bound.reason) == (True, "")
        status = await two.Status(w.StatusRequest(agent_id="dev"))
        assert (status.repo_id, status.worktree_id, status.state) == ("api", "front", "BOUND_HOME")
        # Made on the leader's disk (its data directory), and on no other replica's.
        assert (tmp_path / _name(leader) / "worktrees" / "api" / "front" / "README.md").is_file()
        assert not (tmp_path / _name(f1) / "worktrees").exists()
        # A switch asks HITL, on the leader; an operator decides through the third replica.
        asked = await two.RequestSwitch(
            w.SwitchRequest(agent_id="dev", target_worktree_id="hotfix", requires_hitl=True)
        )
        assert asked.state == "SWITCH_PENDING"
        operator = pb.apiary_pb2_grpc.HitlOperatorServiceStub(
            await stack.enter_async_context(grpc.aio.insecure_channel(str(leader.grpc_address)))
        )
        pending = await operator.List(a.ListInvocationsRequest(), metadata=AUTH)
        (invocation,) = [i for i in pending.invocations if i.reason_type == "WORKTREE_OVERRIDE"]
        await operator.Decide(
            a.DecideInvocationRequest(
                invocation_id=invocation.invocation_id, action="approve", rationale="ok"
            ),
            metadata=AUTH,
        )
        await _until_state(one, "dev", "BOUND_NON_HOME")
        revoked = pb.apiary_pb2_grpc.WorktreeBindingServiceStub(
            await stack.enter_async_context(grpc.aio.insecure_channel(str(f1.grpc_address)))
        )
        listed = await revoked.List(a.ListBindingsRequest())
        assert [(b.agent_id, b.state) for b in listed.bindings] == [("dev", "BOUND_NON_HOME")]
        assert (await two.Unbind(w.UnbindRequest(agent_id="dev"))).ok
        status = await three.Status(w.StatusRequest(agent_id="dev"))
        assert status.state == "UNBOUND"
        assert f1.worktrees is not None and f1.worktrees.list() == []  # (nothing held there)


async def test_a_worktree_tool_called_through_a_follower_runs_in_a_binding_made_through_another(
    tmp_path: Path, url: str, repos: WorktreeSettings
) -> None:
    """A tool that needs a worktree is given the caller's, which the leader bound."""
    roots: list[str] = []

    async def note(call: ToolCallContext) -> Any:
        roots.append(call.worktree_root)
        return "noted"

    async with _cluster(tmp_path, url, repos) as cluster:
        leader, f1, f2 = cluster.replicas
        async with (
            grpc.aio.insecure_channel(str(f1.grpc_address)) as one,
            grpc.aio.insecure_channel(str(f2.grpc_address)) as two,
            tool_agent(str(f2.grpc_address), "notes", [Tool("note", note, needs_worktree=True)]),
        ):
            bind = w.BindRequest(agent_id="dev", repo_id="api", worktree_id="w")
            assert (await pb.worktree_pb2_grpc.WorktreeServiceStub(one).Bind(bind)).ok
            with pytest.raises(ApiaryError) as unbound:
                await ToolClient(two, agent_id="stranger").call("note", {})
            assert unbound.value.code == "worktree_not_bound"
            done = await ToolClient(two, agent_id="dev").call("note", {})
            assert done.text() == "noted"
    assert roots == [str(tmp_path / _name(leader) / "worktrees" / "api" / "w")]


async def _until_state(
    stub: pb.worktree_pb2_grpc.WorktreeServiceStub, agent_id: str, state: str
) -> None:
    loop = asyncio.get_running_loop()
    until = loop.time() + WAIT_S
    found = ""
    while found != state and loop.time() < until:
        found = (await stub.Status(w.StatusRequest(agent_id=agent_id))).state
        await asyncio.sleep(0.05)
    assert found == state


async def test_with_a_shared_root_a_worktree_bound_under_one_leader_is_the_next_ones(
    tmp_path: Path, url: str, repos: WorktreeSettings
) -> None:
    """Worktrees are directories: with `[worktrees] root` on storage every replica reaches
    (here one directory of one machine), the next leader loads the binding from the store
    and finds its worktree where the last one made it."""
    shared = replace(repos, root=tmp_path / "shared")
    async with _cluster(tmp_path, url, shared) as cluster:
        leader, f1, f2 = cluster.replicas
        async with grpc.aio.insecure_channel(str(f1.grpc_address)) as channel:
            stub = pb.worktree_pb2_grpc.WorktreeServiceStub(channel)
            bound = await stub.Bind(w.BindRequest(agent_id="dev", repo_id="api", worktree_id="f"))
            assert (bound.ok, bound.reason) == (True, "")
        home = tmp_path / "shared" / "api" / "f"
        (home / "work.txt").write_text("uncommitted\n")
        await cluster.stop(leader)
        await _until(lambda: _role(f1).leads() or _role(f2).leads(), "a new leader")
        (now,) = [r for r in (f1, f2) if _role(r).leads()]
        assert now.worktrees is not None
        assert now.worktrees.bound_root("dev") == home.resolve()
        async with grpc.aio.insecure_channel(str(f2.grpc_address)) as channel:
            stub = pb.worktree_pb2_grpc.WorktreeServiceStub(channel)
            status = await stub.Status(w.StatusRequest(agent_id="dev"))
            assert (status.worktree_id, status.state) == ("f", "BOUND_HOME")
            assert (await stub.Unbind(w.UnbindRequest(agent_id="dev"))).ok
        assert (home / "work.txt").read_text() == "uncommitted\n"  # (the same directory)


async def test_worktree_control_and_tool_results_through_a_follower_reach_the_leader(
    tmp_path: Path, url: str, repos: WorktreeSettings
) -> None:
    """The `worktrees` and `tools` endpoints are the leader's: a follower relays what is
    sent to them, after refusing what the leader would refuse without its memory (a
    malformed request, another agent's binding) as one coordinator does."""
    async with (
        _cluster(tmp_path, url, repos) as cluster,
        grpc.aio.insecure_channel(str(cluster.replicas[1].grpc_address)) as channel,
    ):
        await register(channel, "dev")
        router = pb.router_pb2_grpc.RouterServiceStub(channel)
        inbound = pb.apiary_pb2_grpc.RouterStreamServiceStub(channel).Inbound(
            a.InboundRequest(agent_id="dev")
        )
        to_worktrees = (("sw4rm-recipient", "worktrees"),)
        control = pb.common_pb2.WORKTREE_CONTROL
        request = envelope(
            "dev", {"action": "bind", "repo_id": "api", "worktree_id": "w"}, message_type=control
        )
        sent = await router.SendMessage(
            pb.router_pb2.SendMessageRequest(msg=request), metadata=to_worktrees
        )
        assert sent.accepted, sent.reason
        reply = await asyncio.wait_for(_worktree_reply(inbound), WAIT_S)
        assert (reply["in_reply_to"], reply["state"]) == (request.message_id, "BOUND_HOME")
        inbound.cancel()
        for body, code in (
            ({"action": "bind", "repo_id": "api"}, grpc.StatusCode.INVALID_ARGUMENT),
            ({"action": "unbind", "agent_id": "someone"}, grpc.StatusCode.PERMISSION_DENIED),
        ):
            bad = envelope("dev", body, message_type=control)
            refusal = await _refused(
                router.SendMessage(pb.router_pb2.SendMessageRequest(msg=bad), metadata=to_worktrees)
            )
            assert refusal[0] == code, (body, refusal)
        result = envelope("dev", {"status": "OK"}, message_type=pb.common_pb2.TOOL_RESULT)
        assert await _refused(
            router.SendMessage(
                pb.router_pb2.SendMessageRequest(msg=result),
                metadata=(("sw4rm-recipient", "tools"),),
            )
        ) == (grpc.StatusCode.INVALID_ARGUMENT, "validation_error")  # (no call_id)


def _name(replica: Coordinator) -> str:
    return _role(replica).lease.me.replica_id


class Calculator(apiary.Agent):
    """A tool provider that registers its tools at each start and answers TOOL_CALLs; its
    stream reconnects (to the next replica it was given) when its replica stops."""

    agent_id = "calc"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.served: list[str] = []

    async def setup(self) -> None:
        await ToolHost(self, CALC).register()

    async def on_tool_call(self, msg: apiary.Message) -> str:
        doc = msg.json()
        if doc.get("action") != "call":
            return "ignored"
        self.served.append(doc["call_id"])
        args = doc["args"]
        answer = {
            "call_id": doc["call_id"],
            "status": "OK",
            "result": {"sum": args["a"] + args["b"]},
        }
        env = self.envelope(
            answer, message_type=MessageType.TOOL_RESULT, correlation_id=msg.correlation_id
        )
        await self.send_envelope(env, to="tools")
        return "answered"


async def test_when_the_leader_stops_the_provider_moves_and_the_next_leader_calls_it(
    tmp_path: Path, url: str
) -> None:
    async with _cluster(tmp_path, url) as cluster:
        leader, f1, f2 = cluster.replicas
        agent = Calculator(coordinator=f"{leader.grpc_address},{f1.grpc_address}")
        job = asyncio.create_task(agent.run())
        try:
            await _until(lambda: leader.router.streaming("calc"), "calc streams on the leader")
            async with grpc.aio.insecure_channel(str(f2.grpc_address)) as channel:
                client = ToolClient(channel, agent_id="caller")
                first = await client.call("add", {"a": 1, "b": 2}, call_id="before")
                assert first.json() == {"sum": 3}
                await cluster.stop(leader)  # (its lease released: the next leads at once)
                await _until(lambda: _role(f1).leads() or _role(f2).leads(), "a new leader")
                await _until(lambda: f1.router.streaming("calc"), "calc streams on f1")
                again = await client.call("add", {"a": 4, "b": 5}, call_id="after")
                assert again.json() == {"sum": 9}
        finally:
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await job
        assert agent.served == ["before", "after"]


async def test_an_mcp_server_registered_through_a_follower_runs_on_the_leader_and_the_next(
    tmp_path: Path, url: str
) -> None:
    """Processes of tools are the leader's: an MCP server an operator registers through a
    follower is started by the leader, and by the next leader as it loads the catalogue."""
    server = (sys.executable, "-m", "mcp_server_time")
    async with _cluster(tmp_path, url) as cluster:
        leader, f1, f2 = cluster.replicas
        async with (
            grpc.aio.insecure_channel(str(f1.grpc_address)) as one,
            grpc.aio.insecure_channel(str(f2.grpc_address)) as two,
        ):
            info = await ToolClient(one, token=TOKEN).register_mcp_server(
                "clock", server[0], server[1:], startup_timeout_s=int(WAIT_S)
            )
            assert (info.state, info.registered_by) == ("READY", "olivia")
            assert leader.tools is not None and f1.tools is not None
            assert leader.tools.catalog.get("clock") is not None
            assert f1.tools.catalog.get("clock") is None  # (no process here)
            frame = await ToolClient(two).call("get_current_time", {"timezone": "UTC"})
            assert frame.json()["timezone"] == "UTC"
            assert leader.cluster is not None
            leader.cluster.halt()
            await _until(lambda: _role(f1).leads() or _role(f2).leads(), "a new leader")
            (now,) = [r for r in (f1, f2) if _role(r).leads()]
            assert now.tools is not None
            entry = now.tools.catalog.get("clock")
            assert entry is not None and isinstance(entry.provider, McpProvider)
            await entry.provider.wait_ready(WAIT_S)
            frame = await ToolClient(two).call("get_current_time", {"timezone": "UTC"})
            assert frame.json()["timezone"] == "UTC"
            assert await ToolClient(one, token=TOKEN).remove_provider("clock")


async def test_a_caller_without_the_right_is_refused_by_the_follower_before_forwarding(
    tmp_path: Path, url: str
) -> None:
    async with _cluster(tmp_path, url) as cluster:
        leader, f1, f2 = cluster.replicas
        register = "/apiary.v1.ToolProviderService/RegisterMcpServer"
        async with grpc.aio.insecure_channel(str(f1.grpc_address)) as channel:
            stub = pb.apiary_pb2_grpc.ToolProviderServiceStub(channel)
            request = a.RegisterMcpServerRequest(provider_id="fs", command="/bin/true")
            assert await _refused(stub.RegisterMcpServer(request)) == (
                grpc.StatusCode.UNAUTHENTICATED,
                "unauthenticated",
            )  # fmt: skip (operators are configured: one of them, with the role `tools`)
        # The follower decided (its guard counted the refusal); the leader saw nothing.
        assert await _denied(f1, register) == 1
        assert await _denied(leader, register) == 0
        # Who made a running call is the leader's to know: another caller's Cancel through
        # a follower is refused there, and the call runs on.
        async with (
            raw_provider(str(f1.grpc_address), "counter", [Tool("count", never)]) as provider,
            grpc.aio.insecure_channel(str(f2.grpc_address)) as channel,
        ):
            tools = pb.tool_pb2_grpc.ToolServiceStub(channel)
            running = asyncio.create_task(
                ToolClient(channel, agent_id="alice").call("count", {}, call_id="alice-1")
            )
            env, _ = await provider.next_call()
            cancel = tools.Cancel(
                pb.tool_pb2.ToolCall(call_id="alice-1"), metadata=(("sw4rm-agent-id", "mallory"),)
            )
            assert await _refused(cancel) == (
                grpc.StatusCode.PERMISSION_DENIED,
                "permission_denied",
            )
            assert await _denied(leader, "/sw4rm.tool.ToolService/Cancel") == 1
            await provider.result(env, {"result": {"n": 1}})
            assert (await asyncio.wait_for(running, WAIT_S)).json() == {"n": 1}


async def _refused(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    found = error_from_trailers(caught.value.trailing_metadata() or ())
    assert found is not None
    return caught.value.code(), found.code


async def _denied(replica: Coordinator, action: str) -> float:
    """How many calls of `action` the replica's access guard refused (its /metrics)."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://{replica.http_address}/metrics") as response,
    ):
        text = await response.text()
    prefix = "apiary_access_denied_total{"
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix) and f'action="{action}"' in line
    )
