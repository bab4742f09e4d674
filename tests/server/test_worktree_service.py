"""Worktree binding over real sockets (RFC 16): the canonical WorktreeService, the apiary.v1
WorktreeBindingService, WORKTREE_CONTROL through the router, the JSON gateway, and the
`apiary worktree` CLI; bad input gets the specific error code and the field it names."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from click.testing import Result
from typer.testing import CliRunner

from apiary.cli.main import app
from apiary.core.worktrees.records import BindingState
from apiary.engine.assembly import Runtime
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.engine.worktrees.settings import RepoEntry, WorktreeSettings
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.testing.clock import FakeClock
from apiary.wire import pb
from tests.gitrepo import README, make_repo
from tests.server.wire_client import WAIT_S, envelope, error_detail, register

TOKEN = "worktree-operator-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
HITL = HitlSettings(operators=(OperatorEntry("olivia", token_digest(TOKEN), ("admin",)),))
w = pb.worktree_pb2
a = pb.apiary_pb2


@dataclass
class Served:
    coordinator: Coordinator
    channel: grpc.aio.Channel
    data: Path
    clock: FakeClock

    @property
    def canonical(self) -> pb.worktree_pb2_grpc.WorktreeServiceStub:
        return pb.worktree_pb2_grpc.WorktreeServiceStub(self.channel)

    @property
    def bindings(self) -> pb.apiary_pb2_grpc.WorktreeBindingServiceStub:
        return pb.apiary_pb2_grpc.WorktreeBindingServiceStub(self.channel)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    settings = WorktreeSettings(
        repos=(
            RepoEntry("api", make_repo(tmp_path / "repos" / "api")),
            RepoEntry("docs", make_repo(tmp_path / "repos" / "docs")),
        )
    )
    clock = FakeClock()
    runtime = Runtime(clock=clock, sleep=clock.sleep, hitl=HITL)
    data = tmp_path / "data"
    async with (
        open_test_coordinator(data, runtime=runtime, worktrees=settings) as coordinator,
        grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel,
    ):
        yield Served(coordinator, channel, data, clock)


async def refused(call: Any) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    """The status, protocol error code and details of a call that must fail."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    detail = error_detail(caught.value)
    return caught.value.code(), detail.error_code, dict(detail.details)


@pytest.mark.conformance("worktree.binding.single-home")
async def test_bind_status_and_unbind_over_the_canonical_service(served: Served) -> None:
    bound = await served.canonical.Bind(
        w.BindRequest(agent_id="agent-a", repo_id="api", worktree_id="frontend")
    )
    assert (bound.ok, bound.reason) == (True, "")
    status = await served.canonical.Status(w.StatusRequest(agent_id="agent-a"))
    assert (status.repo_id, status.worktree_id, status.state) == ("api", "frontend", "BOUND_HOME")
    home = served.data / "worktrees" / "api" / "frontend"
    assert (home / "README.md").read_text() == README
    again = await refused(
        served.canonical.Bind(w.BindRequest(agent_id="agent-a", repo_id="api", worktree_id="x"))
    )
    assert again[:2] == (grpc.StatusCode.ALREADY_EXISTS, "already_exists")
    assert (await served.canonical.Unbind(w.UnbindRequest(agent_id="agent-a"))).ok
    status = await served.canonical.Status(w.StatusRequest(agent_id="agent-a"))
    assert (status.repo_id, status.worktree_id, status.state) == ("", "", "UNBOUND")


@pytest.mark.conformance("worktree.bind-failed.record-reason")
async def test_a_failed_bind_answers_with_its_reason(served: Served) -> None:
    reply = await served.canonical.Bind(
        w.BindRequest(agent_id="agent-a", repo_id="nowhere", worktree_id="frontend")
    )
    assert not reply.ok
    assert reply.reason.startswith("worktree_not_found: ")
    status = await served.canonical.Status(w.StatusRequest(agent_id="agent-a"))
    assert (status.repo_id, status.worktree_id, status.state) == (
        "nowhere", "frontend", "BIND_FAILED",
    )  # fmt: skip
    view = await served.bindings.Get(a.GetBindingRequest(agent_id="agent-a"))
    assert (view.reason, view.attempts, view.path) == ("worktree_not_found", 1, "")
    assert view.retry_at.seconds and view.recovery_at.seconds


@pytest.mark.conformance("worktree.binding.non-home-forbidden")
async def test_a_switch_needs_an_operator_to_approve_it(served: Served) -> None:
    await served.canonical.Bind(
        w.BindRequest(agent_id="agent-a", repo_id="api", worktree_id="home")
    )
    pending = await served.canonical.RequestSwitch(
        w.SwitchRequest(agent_id="agent-a", target_worktree_id="shared", requires_hitl=True)
    )
    assert (pending.state, pending.worktree_id) == ("SWITCH_PENDING", "home")
    approve = w.SwitchApprove(agent_id="agent-a", target_worktree_id="shared", ttl_ms=60_000)
    code, error, _ = await refused(served.canonical.ApproveSwitch(approve))
    assert (code, error) == (grpc.StatusCode.UNAUTHENTICATED, "unauthenticated")
    switched = await served.canonical.ApproveSwitch(approve, metadata=AUTH)
    assert (switched.state, switched.repo_id, switched.worktree_id) == (
        "BOUND_NON_HOME", "api", "shared",
    )  # fmt: skip
    view = await served.bindings.Get(a.GetBindingRequest(agent_id="agent-a"))
    assert view.path.endswith("/worktrees/api/shared") and view.expires_at.seconds
    back = await served.bindings.Revoke(a.RevokeSwitchRequest(agent_id="agent-a", reason="done"))
    assert (back.state, back.current_worktree_id) == ("BOUND_HOME", "home")
    # A rejected request leaves the agent home.
    await served.bindings.RequestSwitch(
        a.SwitchWorktreeRequest(agent_id="agent-a", target_repo_id="docs",
                                target_worktree_id="hotfix", ttl_ms=5000)
    )  # fmt: skip
    rejected = await served.canonical.RejectSwitch(w.SwitchReject(agent_id="agent-a", reason="no"))
    assert (rejected.state, rejected.worktree_id) == ("BOUND_HOME", "home")


async def test_list_and_bind_with_metadata_over_the_apiary_service(served: Served) -> None:
    view = await served.bindings.Bind(
        a.BindWorktreeRequest(agent_id="agent-b", repo_id="docs", worktree_id="w1", branch="feat/x")
    )
    assert (view.state, view.branch, view.version) == ("BOUND_HOME", "feat/x", 1)
    await served.bindings.Bind(a.BindWorktreeRequest(agent_id="agent-a", repo_id="api",
                                                     worktree_id="w2"))  # fmt: skip
    await served.bindings.Bind(a.BindWorktreeRequest(agent_id="agent-c", repo_id="x",
                                                     worktree_id="w3"))  # fmt: skip
    every = await served.bindings.List(a.ListBindingsRequest())
    assert [(b.agent_id, b.state) for b in every.bindings] == [
        ("agent-a", "BOUND_HOME"), ("agent-b", "BOUND_HOME"), ("agent-c", "BIND_FAILED"),
    ]  # fmt: skip
    failed = await served.bindings.List(a.ListBindingsRequest(states=["BIND_FAILED"]))
    assert [b.agent_id for b in failed.bindings] == ["agent-c"]
    docs = await served.bindings.List(a.ListBindingsRequest(repo_id="docs"))
    assert [b.agent_id for b in docs.bindings] == ["agent-b"]
    code, error, details = await refused(
        served.bindings.List(a.ListBindingsRequest(states=["bound"]))
    )
    assert (code, error, details["field"]) == (
        grpc.StatusCode.INVALID_ARGUMENT, "validation_error", "states",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("method", "request_", "status", "error", "field"),
    [
        ("Bind", w.BindRequest(repo_id="api", worktree_id="x"),
         grpc.StatusCode.INVALID_ARGUMENT, "validation_error", "agent_id"),
        ("Bind", w.BindRequest(agent_id="agent-a", worktree_id="x"),
         grpc.StatusCode.INVALID_ARGUMENT, "validation_error", "repo_id"),
        ("Bind", w.BindRequest(agent_id="worktrees", repo_id="api", worktree_id="x"),
         grpc.StatusCode.INVALID_ARGUMENT, "validation_error", "agent_id"),
        ("Unbind", w.UnbindRequest(agent_id="agent-a"),
         grpc.StatusCode.FAILED_PRECONDITION, "worktree_not_bound", ""),
        ("RequestSwitch", w.SwitchRequest(agent_id="agent-a", target_worktree_id="x"),
         grpc.StatusCode.FAILED_PRECONDITION, "worktree_not_bound", ""),
        ("RejectSwitch", w.SwitchReject(agent_id="agent-a"),
         grpc.StatusCode.FAILED_PRECONDITION, "worktree_not_bound", ""),
        ("Status", w.StatusRequest(),
         grpc.StatusCode.INVALID_ARGUMENT, "validation_error", "agent_id"),
    ],
)  # fmt: skip
async def test_bad_requests_get_their_specific_error(
    served: Served, method: str, request_: Any, status: grpc.StatusCode, error: str, field: str
) -> None:
    code, found, details = await refused(getattr(served.canonical, method)(request_))
    assert (code, found) == (status, error)
    if field:
        assert details["field"] == field


async def test_switch_errors_name_the_field_and_leave_the_binding(served: Served) -> None:
    await served.canonical.Bind(
        w.BindRequest(agent_id="agent-a", repo_id="api", worktree_id="home")
    )
    code, error, details = await refused(
        served.canonical.RequestSwitch(
            w.SwitchRequest(agent_id="agent-a", target_worktree_id="home")
        )
    )
    assert (code, error, details["field"]) == (
        grpc.StatusCode.INVALID_ARGUMENT, "validation_error", "target_worktree_id",
    )  # fmt: skip
    code, error, _ = await refused(
        served.canonical.ApproveSwitch(w.SwitchApprove(agent_id="agent-a"), metadata=AUTH)
    )
    assert (code, error) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    await served.canonical.RequestSwitch(
        w.SwitchRequest(agent_id="agent-a", target_worktree_id="s")
    )
    too_long = w.SwitchApprove(agent_id="agent-a", ttl_ms=10**12)
    code, error, details = await refused(served.canonical.ApproveSwitch(too_long, metadata=AUTH))
    assert (code, error, details["field"]) == (
        grpc.StatusCode.INVALID_ARGUMENT, "validation_error", "ttl_ms",
    )  # fmt: skip
    status = await served.canonical.Status(w.StatusRequest(agent_id="agent-a"))
    assert status.state == "SWITCH_PENDING"


@pytest.mark.conformance("worktree.control.operations")
async def test_an_agent_binds_by_worktree_control_message_and_reads_the_reply(
    served: Served,
) -> None:
    await register(served.channel, "agent-a")
    router = pb.router_pb2_grpc.RouterServiceStub(served.channel)
    inbound = pb.apiary_pb2_grpc.RouterStreamServiceStub(served.channel).Inbound(
        a.InboundRequest(agent_id="agent-a")
    )
    body = {"action": "bind", "repo_id": "api", "worktree_id": "frontend"}
    request = envelope("agent-a", body, message_type=pb.common_pb2.WORKTREE_CONTROL)
    sent = await router.SendMessage(
        pb.router_pb2.SendMessageRequest(msg=request), metadata=(("sw4rm-recipient", "worktrees"),)
    )
    assert sent.accepted, sent.reason
    reply = await asyncio.wait_for(_worktree_reply(inbound), WAIT_S)
    assert (reply["in_reply_to"], reply["state"], reply["event"]) == (
        request.message_id, "BOUND_HOME", "bind_ok",
    )  # fmt: skip
    bad = envelope("agent-a", {"action": "bind", "repo_id": "api"},
                   message_type=pb.common_pb2.WORKTREE_CONTROL)  # fmt: skip
    code, error, details = await refused(
        router.SendMessage(
            pb.router_pb2.SendMessageRequest(msg=bad), metadata=(("sw4rm-recipient", "worktrees"),)
        )
    )
    assert (code, error, details["field"]) == (
        grpc.StatusCode.INVALID_ARGUMENT, "validation_error", "worktree_id",
    )  # fmt: skip
    inbound.cancel()


async def _worktree_reply(call: Any) -> dict[str, Any]:
    while True:
        batch = await call.read()
        assert batch is not grpc.aio.EOF
        for delivery in batch.deliveries:
            if delivery.msg.message_type == pb.common_pb2.WORKTREE_CONTROL:
                doc: dict[str, Any] = json.loads(delivery.msg.payload)
                return doc


async def test_the_json_gateway_serves_the_worktree_service(served: Served) -> None:
    base = f"http://{served.coordinator.http_address}/v1/sw4rm.worktree.WorktreeService"
    async with aiohttp.ClientSession() as http:
        body = {"agent_id": "agent-a", "repo_id": "api", "worktree_id": "frontend"}
        async with http.post(f"{base}/Bind", json=body) as resp:
            assert resp.status == 200
            assert (await resp.json())["ok"] is True
        async with http.post(f"{base}/Bind", json={"agent_id": "agent-b"}) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["details"]["field"] == "repo_id"


def _cli(address: str, *args: str) -> Result:
    """`apiary worktree ARGS` in this process (its own event loop, in a worker thread)."""
    return CliRunner().invoke(
        app, ["worktree", *args, "--grpc", address],
        env={"APIARY_TOKEN": TOKEN, "COLUMNS": "200"},
    )  # fmt: skip


async def _cli_json(address: str, *args: str) -> Any:
    done = await asyncio.to_thread(_cli, address, *args, "--json")
    assert done.exit_code == 0, done.stderr
    return json.loads(done.stdout)


async def test_an_operator_session_with_the_cli(served: Served) -> None:
    address = str(served.coordinator.grpc_address)
    bound = await _cli_json(address, "bind", "agent-a", "api", "frontend", "--branch", "feat/cli")
    assert (bound["state"], bound["branch"]) == ("BOUND_HOME", "feat/cli")
    assert bound["path"] == str(served.data / "worktrees" / "api" / "frontend")
    assert (served.data / "worktrees" / "api" / "frontend" / "README.md").read_text() == README
    pending = await _cli_json(
        address, "switch", "agent-a", "hotfix", "--repo", "docs", "--ttl", "30"
    )
    assert (pending["state"], pending["target_worktree_id"]) == ("SWITCH_PENDING", "hotfix")
    away = await _cli_json(address, "approve", "agent-a")
    assert (away["state"], away["current_repo_id"]) == ("BOUND_NON_HOME", "docs")
    listed = await _cli_json(address, "list", "--state", "bound_non_home")
    assert [b["agent_id"] for b in listed] == ["agent-a"]
    table = await asyncio.to_thread(_cli, address, "list")
    assert table.exit_code == 0
    assert "BOUND_NON_HOME" in table.stdout and "docs/hotfix" in table.stdout
    back = await _cli_json(address, "revoke", "agent-a", "--reason", "finished")
    assert back["state"] == "BOUND_HOME"
    shown = await asyncio.to_thread(_cli, address, "status", "agent-a")
    assert shown.exit_code == 0 and "api/frontend" in shown.stdout
    gone = await _cli_json(address, "unbind", "agent-a")
    assert gone["state"] == "UNBOUND"
    failed = await asyncio.to_thread(_cli, address, "bind", "agent-b", "nowhere", "x", "--json")
    assert failed.exit_code == 1
    assert json.loads(failed.stdout)["reason"] == "worktree_not_found"
    refused_ = await asyncio.to_thread(_cli, address, "unbind", "agent-b-never-bound")
    assert refused_.exit_code == 1
    assert "worktree_not_bound" in refused_.stderr


async def test_the_coordinators_timer_loop_ends_a_non_home_binding(served: Served) -> None:
    worktrees = served.coordinator.worktrees
    assert worktrees is not None
    await served.canonical.Bind(
        w.BindRequest(agent_id="agent-a", repo_id="api", worktree_id="home")
    )
    await served.canonical.RequestSwitch(
        w.SwitchRequest(agent_id="agent-a", target_worktree_id="shared")
    )
    clock = served.clock
    sleeping = clock.pending_sleepers  # the other loops'; the worktree loop has no deadline yet
    approve = w.SwitchApprove(agent_id="agent-a", ttl_ms=5_000)
    assert (await served.canonical.ApproveSwitch(approve, metadata=AUTH)).state == "BOUND_NON_HOME"
    # Once the worktree loop sleeps until the TTL, five virtual seconds end it.
    await asyncio.wait_for(_until(lambda: clock.pending_sleepers > sleeping), WAIT_S)
    clock.advance(5)
    back = await asyncio.wait_for(worktrees.wait_for("agent-a", BindingState.BOUND_HOME), WAIT_S)
    assert back.current is not None and back.current.worktree_id == "home"
    status = await served.canonical.Status(w.StatusRequest(agent_id="agent-a"))
    assert (status.state, status.worktree_id) == ("BOUND_HOME", "home")


async def _until(condition: Callable[[], bool]) -> None:
    """Yield to the event loop until `condition` holds (callers bound the wait)."""
    while not condition():  # noqa: ASYNC110 - the fake clock's counters have no event
        await asyncio.sleep(0)
