"""HandoffService and HandoffQueryService over real sockets (RFC 17.6): the canonical RPCs
with a generated client, errors naming their field in the trailer, the JSON gateway, the CLI,
and a coordinator restarted from its SQLite file whose pending offer still expires."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from typer.testing import CliRunner

from apiary.cli.main import app
from apiary.core.events import Event
from apiary.engine.assembly import Runtime
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.testing.clock import FakeClock
from apiary.testing.events import wait_for_event
from apiary.testing.ids import SequentialIds
from apiary.wire import pb
from apiary.wire.handoff import SNAPSHOT_CONTENT_TYPE_KEY, seconds_duration
from tests.server.wire_client import descriptor, error_detail

h = pb.handoff_pb2
a = pb.apiary_pb2
SNAPSHOT = b'{"ticket": 42, "done": ["triage"], "todo": ["patch", "test"]}'
WAIT_S = 10.0


def caller(agent: str, *extra: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    return (("sw4rm-agent-id", agent), *extra)


class Stubs:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.handoff = pb.handoff_pb2_grpc.HandoffServiceStub(channel)
        self.query = pb.apiary_pb2_grpc.HandoffQueryServiceStub(channel)
        self.registry = pb.registry_pb2_grpc.RegistryServiceStub(channel)

    async def register(self, agent_id: str, *capabilities: str, **fields: Any) -> None:
        agent = descriptor(agent_id, capabilities=list(capabilities), **fields)
        reply = await self.registry.RegisterAgent(pb.registry_pb2.RegisterAgentRequest(agent=agent))
        assert reply.accepted, reply.reason


@pytest.fixture
async def stubs(channel: grpc.aio.Channel) -> Stubs:
    found = Stubs(channel)
    await found.register("alice")
    await found.register("bob", "security-review")
    await found.register("carol", "security-review")
    return found


def request(**fields: Any) -> h.HandoffRequest:
    values: dict[str, Any] = {
        "request_id": "h-1",
        "from_agent": "alice",
        "to_agent": "bob",
        "reason": "needs a security review",
        "context_snapshot": SNAPSHOT,
        "capabilities_required": ["security-review"],
        "timeout": seconds_duration(60),
    }
    values.update(fields)
    return h.HandoffRequest(**values)


JSON_SNAPSHOT = ((SNAPSHOT_CONTENT_TYPE_KEY, "application/json"),)


async def failure(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


# --- the canonical service ------------------------------------------------------------------------


@pytest.mark.conformance("handoff.context.no-continue-after")
async def test_request_accept_complete_over_grpc_and_the_origin_loses_the_context(
    stubs: Stubs, coordinator: Coordinator
) -> None:
    await stubs.handoff.RequestHandoff(request(), metadata=caller("alice", *JSON_SNAPSHOT))
    pending = await stubs.handoff.GetPendingHandoffs(
        h.GetPendingHandoffsRequest(agent_id="bob"), metadata=caller("bob")
    )
    (offer,) = pending.pending_requests
    assert (offer.request_id, offer.from_agent, offer.to_agent) == ("h-1", "alice", "bob")
    assert offer.context_snapshot == SNAPSHOT
    assert list(offer.capabilities_required) == ["security-review"]
    assert offer.timeout.seconds == 60
    view = await stubs.query.GetHandoff(a.GetHandoffRequest(request_id="h-1"))
    assert view.status == h.PENDING and view.snapshot_content_type == "application/json"
    assert view.snapshot_size == len(SNAPSHOT) and view.request.context_snapshot == b""

    await stubs.handoff.AcceptHandoff(
        h.HandoffResponse(request_id="h-1", accepted=True), metadata=caller("bob")
    )
    done = await stubs.handoff.CompleteHandoff(
        h.CompleteHandoffRequest(request_id="h-1", status=h.COMPLETED), metadata=caller("alice")
    )
    assert done.success and "COMPLETED" in done.message

    barred = await failure(
        stubs.query.GetHandoff(
            a.GetHandoffRequest(request_id="h-1", include_snapshot=True), metadata=caller("alice")
        )
    )
    assert barred.code() is grpc.StatusCode.PERMISSION_DENIED
    assert error_detail(barred).error_code == "permission_denied"
    peeking = await failure(
        stubs.handoff.GetPendingHandoffs(
            h.GetPendingHandoffsRequest(agent_id="bob"), metadata=caller("alice")
        )
    )
    assert peeking.code() is grpc.StatusCode.PERMISSION_DENIED
    mine = await stubs.query.GetHandoff(
        a.GetHandoffRequest(request_id="h-1", include_snapshot=True), metadata=caller("bob")
    )
    assert mine.request.context_snapshot == SNAPSHOT
    assert mine.status == h.COMPLETED and list(mine.context_holders) == ["bob"]
    kinds = [e.event_type for e in await coordinator.events.read(limit=1000)]
    assert [k for k in kinds if k.startswith("handoff.")] == [
        "handoff.requested",
        "handoff.accepted",
        "handoff.completed",
        "handoff.context_revoked",
    ]


@pytest.mark.parametrize(
    ("rpc", "message", "metadata", "status", "field"),
    [
        ("RequestHandoff", request(from_agent=""), (), "INVALID_ARGUMENT", "from_agent"),
        ("RequestHandoff", request(to_agent="zoe"), (), "NOT_FOUND", "to_agent"),
        ("RequestHandoff", request(to_agent="alice"), (), "INVALID_ARGUMENT", "to_agent"),
        (
            "RequestHandoff",
            request(capabilities_required=["security-review", "rust"]),
            (),
            "INVALID_ARGUMENT",
            "to_agent",
        ),
        (
            "RequestHandoff",
            request(to_agent="", capabilities_required=[]),
            (),
            "INVALID_ARGUMENT",
            "to_agent",
        ),
        (
            "RequestHandoff",
            request(timeout=seconds_duration(-1)),
            (),
            "INVALID_ARGUMENT",
            "timeout",
        ),
        ("RequestHandoff", request(priority=50), (), "INVALID_ARGUMENT", "priority"),
        (
            "RequestHandoff",
            request(context_snapshot=b"\xff"),
            JSON_SNAPSHOT,
            "INVALID_ARGUMENT",
            "context_snapshot",
        ),
        (
            "RequestHandoff",
            request(),
            ((SNAPSHOT_CONTENT_TYPE_KEY, "image/png"),),
            "INVALID_ARGUMENT",
            "snapshot_content_type",
        ),
        ("RequestHandoff", request(), caller("bob"), "PERMISSION_DENIED", "from_agent"),
        ("AcceptHandoff", h.HandoffResponse(request_id="nope"), (), "NOT_FOUND", "request_id"),
        ("AcceptHandoff", h.HandoffResponse(), (), "INVALID_ARGUMENT", "request_id"),
        (
            "RejectHandoff",
            h.HandoffResponse(request_id="h-0", accepted=True, rejection_reason="x"),
            (),
            "INVALID_ARGUMENT",
            "accepted",
        ),
        (
            "RejectHandoff",
            h.HandoffResponse(request_id="h-0"),
            (),
            "INVALID_ARGUMENT",
            "rejection_reason",
        ),
        (
            "AcceptHandoff",
            h.HandoffResponse(request_id="h-0"),
            caller("carol"),
            "PERMISSION_DENIED",
            "accepting_agent",
        ),
        (
            "CompleteHandoff",
            h.CompleteHandoffRequest(request_id="h-0"),
            (),
            "INVALID_ARGUMENT",
            "status",
        ),
        (
            "CompleteHandoff",
            h.CompleteHandoffRequest(request_id="h-0", status=h.COMPLETED),
            (),
            "INVALID_ARGUMENT",
            "request_id",
        ),
        ("GetPendingHandoffs", h.GetPendingHandoffsRequest(), (), "INVALID_ARGUMENT", "agent_id"),
    ],
)
async def test_bad_requests_get_a_specific_error_naming_the_field(
    stubs: Stubs,
    rpc: str,
    message: Any,
    metadata: tuple[tuple[str, str], ...],
    status: str,
    field: str,
) -> None:
    await stubs.handoff.RequestHandoff(request(request_id="h-0"))
    error = await failure(getattr(stubs.handoff, rpc)(message, metadata=metadata))
    assert error.code() is getattr(grpc.StatusCode, status), error.details()
    detail = error_detail(error)
    assert detail.details["field"] == field, detail
    assert field in (error.details() or "")


async def test_an_image_snapshot_reaches_only_an_agent_that_takes_images(stubs: Stubs) -> None:
    await stubs.register("viewer", "security-review", modalities_supported=["image/png"])
    png = ((SNAPSHOT_CONTENT_TYPE_KEY, "image/png"),)
    error = await failure(
        stubs.handoff.RequestHandoff(request(context_snapshot=b"\x89PNG"), metadata=png)
    )
    assert error_detail(error).error_code == "unsupported_message_type"
    await stubs.handoff.RequestHandoff(
        request(to_agent="viewer", context_snapshot=b"\x89PNG"), metadata=png
    )


async def test_list_filters_by_status_and_agent(stubs: Stubs) -> None:
    await stubs.handoff.RequestHandoff(request())
    await stubs.handoff.RequestHandoff(request(request_id="h-2", to_agent="carol"))
    await stubs.handoff.AcceptHandoff(h.HandoffResponse(request_id="h-2"), metadata=caller("carol"))
    every = await stubs.query.ListHandoffs(a.ListHandoffsRequest())
    assert [v.request.request_id for v in every.handoffs] == ["h-1", "h-2"]
    accepted = await stubs.query.ListHandoffs(a.ListHandoffsRequest(statuses=[h.ACCEPTED]))
    assert [v.request.request_id for v in accepted.handoffs] == ["h-2"]
    to_bob = await stubs.query.ListHandoffs(a.ListHandoffsRequest(to_agent="bob"))
    assert [v.request.request_id for v in to_bob.handoffs] == ["h-1"]
    assert all(v.request.context_snapshot == b"" for v in every.handoffs)
    error = await failure(stubs.query.ListHandoffs(a.ListHandoffsRequest(statuses=[9])))  # type: ignore[list-item]
    assert error_detail(error).details["field"] == "statuses"


# --- the JSON gateway -----------------------------------------------------------------------------


async def test_the_json_gateway_serves_the_same_handlers(
    stubs: Stubs, coordinator: Coordinator
) -> None:
    base = f"http://{coordinator.http_address}/v1/sw4rm.handoff.HandoffService"
    body = {
        "request_id": "h-json",
        "from_agent": "alice",
        "capabilities_required": ["security-review"],
        "context_snapshot": base64.b64encode(b"plain notes").decode(),
        "timeout": "45s",
    }
    headers = {"sw4rm-agent-id": "alice", SNAPSHOT_CONTENT_TYPE_KEY: "text/plain"}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base}/RequestHandoff", json=body, headers=headers) as reply:
            assert reply.status == 200, await reply.text()
        async with session.post(
            f"{base}/GetPendingHandoffs",
            json={"agent_id": "bob"},
            headers={"sw4rm-agent-id": "bob"},
        ) as reply:
            found = await reply.json()
        (offer,) = found["pending_requests"]
        assert base64.b64decode(offer["context_snapshot"]) == b"plain notes"
        assert offer["timeout"] == "45s"
        async with session.post(
            f"{base}/CompleteHandoff", json={"request_id": "h-json", "status": "COMPLETED"}
        ) as reply:
            assert reply.status == 400
            error = (await reply.json())["error"]
    assert error["code"] == "validation_error" and error["details"]["field"] == "request_id"


# --- the CLI --------------------------------------------------------------------------------------


def _process(*args: str) -> subprocess.CompletedProcess[str]:
    """The real console entry point in its own process (slow: one such call proves it)."""
    return subprocess.run(
        [sys.executable, "-m", "apiary.cli.main", "handoff", *args],
        capture_output=True, text=True, timeout=60, check=False, env=dict(os.environ),
    )  # fmt: skip


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    """The same CLI in this process (its own thread and event loop), for speed."""
    result = CliRunner().invoke(app, ["handoff", *args])
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


async def cli(*args: str, process: bool = False) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(_process if process else _invoke, *args)


async def test_an_operator_drives_a_handoff_from_the_cli(
    stubs: Stubs, coordinator: Coordinator
) -> None:
    grpc_at = ("--grpc", str(coordinator.grpc_address))
    made = await cli(
        "request", "--from", "alice", "--to", "bob", "-c", "security-review", "--reason", "review",
        "--snapshot", '{"ticket": 7}', "--content-type", "application/json", "--id", "h-cli",
        "--timeout", "90", *grpc_at, process=True,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == "h-cli"
    listed = await cli("list", "--status", "pending", "--json", *grpc_at)
    assert listed.returncode == 0, listed.stderr
    (doc,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert (doc["request_id"], doc["state"], doc["to_agent"]) == ("h-cli", "PENDING", "bob")
    assert doc["timeout_s"] == 90.0 and doc["snapshot_content_type"] == "application/json"
    table = await cli("list", *grpc_at)
    assert "h-cli" in table.stdout and "PENDING" in table.stdout

    rejected = await cli("reject", "h-cli", "--as", "bob", "--reason", "on leave", *grpc_at)
    assert rejected.returncode == 0, rejected.stderr
    shown = json.loads((await cli("show", "h-cli", *grpc_at)).stdout)
    assert (shown["state"], shown["to_agent"], shown["attempt"]) == ("PENDING", "carol", 2)
    assert shown["tried"] == ["bob", "carol"]
    assert (await cli("accept", "h-cli", "--as", "carol", *grpc_at)).returncode == 0
    completed = await cli("complete", "h-cli", "--as", "alice", *grpc_at)
    assert completed.returncode == 0 and "COMPLETED" in completed.stdout

    denied = await cli("show", "h-cli", "--snapshot", "--as", "alice", *grpc_at)
    assert denied.returncode == 1
    assert "permission_denied" in denied.stderr
    allowed = await cli("show", "h-cli", "--snapshot", "--as", "carol", *grpc_at)
    assert json.loads(allowed.stdout)["snapshot"] == {"json": {"ticket": 7}}

    bad = await cli("request", "--from", "alice", "--to", "zoe", *grpc_at)
    assert bad.returncode == 1
    assert "no_route" in bad.stderr and "to_agent" in bad.stderr
    wrong = await cli("list", "--status", "LOST", *grpc_at)
    assert wrong.returncode == 2 and "--status" in wrong.stderr


# --- restart --------------------------------------------------------------------------------------


async def _event(coordinator: Coordinator, event_type: str) -> Event:
    return await wait_for_event(
        coordinator.events, lambda e: e.event_type == event_type, timeout_s=WAIT_S
    )


async def test_a_restarted_coordinator_still_expires_a_pending_offer(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'apiary.db'}"
    clock, ids = FakeClock(), SequentialIds()
    runtime = Runtime(clock=clock, ids=ids, sleep=clock.sleep)
    async with (
        open_test_coordinator(tmp_path, store, runtime=runtime) as first,
        grpc.aio.insecure_channel(str(first.grpc_address)) as channel,
    ):
        stubs = Stubs(channel)
        await stubs.register("alice")
        await stubs.register("bob")
        await stubs.handoff.RequestHandoff(request(capabilities_required=[]))
    clock.advance(30.0)
    async with (
        open_test_coordinator(tmp_path, store, runtime=runtime) as second,
        grpc.aio.insecure_channel(str(second.grpc_address)) as channel,
    ):
        stubs = Stubs(channel)
        pending = await stubs.handoff.GetPendingHandoffs(
            h.GetPendingHandoffsRequest(agent_id="bob")
        )
        assert [r.request_id for r in pending.pending_requests] == ["h-1"]
        assert second.handoffs is not None
        assert second.handoffs.timers.armed("h-1") == clock.now() + 30
        clock.advance(30.0)  # the background loop sleeps on this clock
        expired = await _event(second, "handoff.expired")
        assert expired.correlation_id == "h-1"
        view = await stubs.query.GetHandoff(a.GetHandoffRequest(request_id="h-1"))
        assert view.status == h.EXPIRED
        pending = await stubs.handoff.GetPendingHandoffs(
            h.GetPendingHandoffsRequest(agent_id="bob")
        )
        assert list(pending.pending_requests) == []


async def test_an_unset_or_zero_timeout_takes_the_default_window(stubs: Stubs) -> None:
    await stubs.handoff.RequestHandoff(request(timeout=seconds_duration(0)))
    unset = request(request_id="h-2")
    unset.ClearField("timeout")
    await stubs.handoff.RequestHandoff(unset)
    for request_id in ("h-1", "h-2"):
        view = await stubs.query.GetHandoff(a.GetHandoffRequest(request_id=request_id))
        assert view.deadline.seconds - view.created_at.seconds in (299, 300)
        assert view.request.timeout.seconds == 300
