"""Per-tenant quotas (RFC 6.5): a call that would take a tenant past a limit is refused with
quota_exceeded naming the limit, the use and the remedy, and changes nothing; calls that add
nothing (re-registering, reading) are not held by a full quota."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest

from apiary.server.auth.settings import AuthSettings, Quota
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb
from tests.server.wire_client import descriptor, envelope, error_detail, register

pytestmark = pytest.mark.conformance("security.multiuser.process-fs-quotas")


@asynccontextmanager
async def _quota(
    tmp_path: Path, quota: Quota, store: str = "memory://"
) -> AsyncIterator[tuple[Coordinator, grpc.aio.Channel]]:
    auth = AuthSettings(quotas={"*": quota})
    async with (
        open_test_coordinator(tmp_path, store, auth=auth) as coordinator,
        grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel,
    ):
        yield coordinator, channel


def _refused(caught: pytest.ExceptionInfo[grpc.aio.AioRpcError], limit: str) -> str:
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    detail = error_detail(caught.value)
    assert detail.error_code == "quota_exceeded"
    assert (detail.details["tenant"], detail.details["limit"]) == ("default", limit)
    return detail.message


async def test_a_tenant_registers_agents_up_to_its_quota(tmp_path: Path) -> None:
    async with _quota(tmp_path, Quota(agents=2)) as (coordinator, channel):
        await register(channel, "alice", "bob")
        registry = pb.registry_pb2_grpc.RegistryServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await registry.RegisterAgent(
                pb.registry_pb2.RegisterAgentRequest(agent=descriptor("carol"))
            )
        message = _refused(caught, "agents")
        assert "(2 of 2)" in message and "[auth.quotas.default] agents" in message
        assert sorted(a.agent_id for a in await coordinator.store.agents.list()) == [
            "alice",
            "bob",
        ]
        # Re-registering an agent adds none: allowed at the limit.
        await register(channel, "bob")
        # Room again once an agent leaves.
        await registry.DeregisterAgent(pb.registry_pb2.DeregisterAgentRequest(agent_id="bob"))
        await register(channel, "carol")


async def test_messages_queue_up_to_the_tenants_quota(tmp_path: Path) -> None:
    async with _quota(tmp_path, Quota(queued_messages=1)) as (coordinator, channel):
        await register(channel, "alice", "bob")
        router = pb.router_pb2_grpc.RouterServiceStub(channel)
        first = envelope("alice", {"n": 1})
        reply = await router.SendMessage(
            pb.router_pb2.SendMessageRequest(msg=first), metadata=(("sw4rm-recipient", "bob"),)
        )
        assert reply.accepted, reply.reason
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await router.SendMessage(
                pb.router_pb2.SendMessageRequest(msg=envelope("alice", {"n": 2})),
                metadata=(("sw4rm-recipient", "bob"),),
            )
        assert "(1 of 1)" in _refused(caught, "queued_messages")
        assert coordinator.router.queued() == 1


async def test_tasks_up_to_the_tenants_quota(tmp_path: Path) -> None:
    async with _quota(tmp_path, Quota(tasks=1)) as (coordinator, channel):
        await register(channel, "worker")
        scheduler = pb.scheduler_pb2_grpc.SchedulerServiceStub(channel)

        async def submit() -> pb.scheduler_pb2.SubmitTaskResponse:
            return await scheduler.SubmitTask(
                pb.scheduler_pb2.SubmitTaskRequest(
                    agent_id="worker", task_id=str(uuid.uuid4()), params=b"{}",
                    content_type="application/json", scope=f"resource:{uuid.uuid4()}",
                )
            )  # fmt: skip

        assert (await submit()).accepted
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await submit()
        _refused(caught, "tasks")
        # apiary.v1's SubmitTask (shared queues, assigned ids) counts against the same quota.
        tasks = pb.apiary_pb2_grpc.TaskQueryServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await tasks.SubmitTask(
                pb.apiary_pb2.SubmitTaskRequest(
                    capability="review", params=b"{}", content_type="application/json",
                    scope=f"resource:{uuid.uuid4()}",
                )
            )  # fmt: skip
        _refused(caught, "tasks")
        assert coordinator.scheduler is not None and coordinator.scheduler.open_tasks() == 1


async def test_a_submit_tasks_call_is_refused_whole_unless_all_its_items_fit(
    tmp_path: Path,
) -> None:
    async with _quota(tmp_path, Quota(tasks=3)) as (coordinator, channel):
        await register(channel, "worker")
        tasks = pb.apiary_pb2_grpc.TaskQueryServiceStub(channel)

        def batch(n: int) -> pb.apiary_pb2.SubmitTasksRequest:
            return pb.apiary_pb2.SubmitTasksRequest(
                items=[
                    pb.apiary_pb2.SubmitTaskRequest(
                        agent_id="worker",
                        params=b"{}",
                        content_type="application/json",
                        scope=f"resource:{uuid.uuid4()}",
                    )
                    for _ in range(n)
                ]
            )

        assert len((await tasks.SubmitTasks(batch(2))).outcomes) == 2
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await tasks.SubmitTasks(batch(2))
        message = _refused(caught, "tasks")
        assert "room for 1 more (2 of 3 used), not the 2 of this call" in message
        assert coordinator.scheduler is not None and coordinator.scheduler.open_tasks() == 2
        assert len((await tasks.SubmitTasks(batch(1))).outcomes) == 1
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await tasks.SubmitTasks(batch(1))
        assert "(3 of 3)" in _refused(caught, "tasks")
        assert coordinator.scheduler.open_tasks() == 3


async def test_a_store_over_its_size_takes_no_new_agents(tmp_path: Path) -> None:
    """Measured on SQLite: a limit below what the empty schema takes already refuses."""
    async with _quota(tmp_path, Quota(stored_bytes=1), store="") as (coordinator, channel):
        registry = pb.registry_pb2_grpc.RegistryServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await registry.RegisterAgent(
                pb.registry_pb2.RegisterAgentRequest(agent=descriptor("alice"))
            )
        assert "of 1)" in _refused(caught, "stored_bytes")
        assert await coordinator.store.agents.list() == []
        # Reading is never held by a quota.
        discovery = pb.apiary_pb2_grpc.DiscoveryServiceStub(channel)
        assert list((await discovery.ListAgents(pb.apiary_pb2.ListAgentsRequest())).agents) == []
