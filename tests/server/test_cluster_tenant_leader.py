"""Every tenant's leader's components on the cluster's leader only (docs/cluster.md, "The
leader" and "Tenants"): three (or two) secure coordinators serving one PostgreSQL schema as
replicas, each with the engines of the tenants their key ring names (acme, and globex)
over their own schemas.

- A task of acme submitted through one follower runs once on acme's agent streaming on the
  other follower, its result read through the leader; only the leader's acme Scheduler
  holds it (the followers' relay), and its status is read through every replica; its
  agent's state, asked through a follower, is the leader's acme lifecycle (RUNNING).
- A leader that stops without releasing anything (as a killed process) is replaced; the
  new leader loads acme's tasks from acme's schema: the task running and the one waiting
  behind it both end, each run once.
- acme's HITL escalation opened through one follower is held by the leader's acme HITL
  and decided through the other.
- The forwarding path keeps each call in its tenant: acme's application reaches none of
  globex's tasks through a follower (answered as a task that does not exist, or refused
  for naming globex), and the leader refuses a forwarded call whose signed principal is
  acme's but which names globex.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

import apiary
from apiary.core.access.principal import TENANT_KEY, Mechanism, Principal, PrincipalKind
from apiary.core.cluster.forwarding import FORWARD_KEY, Forwarded, sign_forward
from apiary.engine.cluster.settings import ClusterSettings
from apiary.sdk.credentials import ClientCredentials
from apiary.server.auth.keys import KeyRing, credentials_path
from apiary.server.auth.settings import AuthSettings
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb
from tests.security.tenant_harness import (
    ACME,
    GLOBEX,
    PRINCIPALS,
    drop_schemas,
    refusal_of,
    tenant_schemas,
)
from tests.server.test_cluster_leader import (
    LEASE_S,
    PARTITIONS,
    SCOPE,
    WAIT_S,
    Holder,
    _role,
    _running,
    _until,
)

pytestmark = pytest.mark.postgres

GET_TASK = "/apiary.v1.TaskQueryService/GetTask"


def _scheduler(replica: Coordinator, tenant: str = ACME) -> Any:
    assert replica.tenancy is not None
    opened = replica.tenancy.opened(tenant)
    assert opened is not None, f"{tenant} is not open on a replica"
    return opened.engine.scheduler


@pytest.fixture
def url(postgres_dsn: str, postgres_schema: str) -> Iterator[str]:
    yield f"{postgres_dsn}?apiary_schema={postgres_schema}"
    drop_schemas(postgres_dsn, tenant_schemas(postgres_schema))


def _keys(data_dir: Path, tenants: tuple[str, ...]) -> dict[str, str]:
    """An API key for each principal of PRINCIPALS in `tenants` (a tenant named by no key
    is not opened: fewer connections to the shared server)."""
    ring = KeyRing(credentials_path(data_dir))
    return {
        who: ring.create(kind, name, tenant=tenant, roles=roles, now=time.time())[1]
        for who, (kind, name, tenant, roles) in PRINCIPALS.items()
        if tenant in tenants
    }


def _replica(data_dir: Path, url: str, name: str) -> Any:
    settings = ClusterSettings(True, name, LEASE_S, PARTITIONS)
    return open_test_coordinator(data_dir, url, cluster=settings, auth=AuthSettings(secure=True))


@asynccontextmanager
async def _cluster(
    tmp_path: Path, url: str, names: str = "abc", tenants: tuple[str, ...] = (ACME,)
) -> AsyncIterator[tuple[list[Coordinator], dict[str, str]]]:
    """Secure replicas (one per letter of `names`) sharing one key ring, which names
    `tenants`; the leader first, once it leads their components too; and the keys."""
    keys = _keys(tmp_path / names[0], tenants)
    for name in names[1:]:
        (tmp_path / name).mkdir()
        shutil.copy2(credentials_path(tmp_path / names[0]), credentials_path(tmp_path / name))
    async with AsyncExitStack() as stack:
        replicas = [
            await stack.enter_async_context(_replica(tmp_path / name, url, name)) for name in names
        ]
        await _until(
            lambda: (
                sum(_role(r).leads() for r in replicas) == 1
                and all(_role(r).lease.address for r in replicas)
            ),
            "one leader, seen by every replica",
        )
        replicas.sort(key=lambda r: not _role(r).leads())
        leader = _role(replicas[0])
        await _until(lambda: all(leader.leads(t) for t in tenants), "it leads the tenants")
        yield replicas, keys


def _as(keys: dict[str, str], who: str) -> ClientCredentials:
    return ClientCredentials(api_key=keys[who])


def _alice(replica: Coordinator, keys: dict[str, str]) -> Holder:
    """acme's agent alice, streaming on `replica`, holding each task until released."""
    return Holder(
        "alice", coordinator=str(replica.grpc_address), credentials=_as(keys, "alice@acme")
    )


def _app(replica: Coordinator, keys: dict[str, str]) -> apiary.Client:
    """acme's application, calling through `replica`."""
    return apiary.Client(str(replica.grpc_address), credentials=_as(keys, "app@acme"))


async def _state(replica: Coordinator, agent_id: str, keys: dict[str, str]) -> str:
    """The agent's state through `replica`'s DiscoveryService, asked by acme's application."""
    async with grpc.aio.insecure_channel(str(replica.grpc_address)) as channel:
        found = await pb.apiary_pb2_grpc.DiscoveryServiceStub(channel).GetAgent(
            pb.apiary_pb2.GetAgentRequest(agent_id=agent_id),
            metadata=(("authorization", f"Bearer {keys['app@acme']}"),),
        )
    return str(found.state)


async def test_a_tenants_task_submitted_through_a_follower_runs_once_dispatched_by_the_leader(
    tmp_path: Path, url: str
) -> None:
    async with _cluster(tmp_path, url) as ((leader, f1, f2), keys):
        agent = _alice(f1, keys)
        async with (
            _running(agent),
            _app(f2, keys) as submitter,
            _app(leader, keys) as waiter,
            _app(f1, keys) as other,
        ):
            handle = await submitter.submit_task("alice", {"n": 21}, scope=SCOPE, task_id="t-1")
            await asyncio.wait_for(agent.started.wait(), WAIT_S)
            # Only the leader's acme Scheduler holds the task; the followers' relay.
            assert _scheduler(leader).get("t-1") is not None
            for follower in (f1, f2):
                assert _scheduler(follower).get("t-1") is None
                assert _scheduler(follower).deputy is not None
            assert _scheduler(leader).deputy is None
            # Its agent's state, through any replica, is the leader's acme lifecycle.
            lifecycles = _scheduler(leader).lifecycles
            await _until(lambda: str(lifecycles.state("alice")) == "RUNNING", "alice runs")
            for replica in (f1, f2):
                assert _scheduler(replica).lifecycles.state("alice") is None
                assert await _state(replica, "alice", keys) == "RUNNING"
            agent.release.set()
            assert await waiter.task(handle.task_id).result(timeout=WAIT_S) == "held"
            for client in (submitter, other):
                status = await client.task("t-1").status()
                assert (status.state, status.agent_id) == ("COMPLETED", "alice")
        assert agent.ran == ["t-1"]
        # The default tenant's Scheduler knows nothing of it, on any replica.
        for replica in (leader, f1, f2):
            assert replica.scheduler is not None
            assert replica.scheduler.get("t-1") is None
            assert await replica.store.tasks.get("t-1") is None


async def test_a_killed_leader_is_replaced_and_the_next_runs_the_tenants_pending_tasks(
    tmp_path: Path, url: str
) -> None:
    async with _cluster(tmp_path, url) as ((leader, f1, f2), keys):
        agent = _alice(f1, keys)
        async with (
            _running(agent),
            _app(f2, keys) as client,
        ):
            running = await client.submit_task("alice", {"n": 1}, scope=SCOPE, task_id="t-k")
            await asyncio.wait_for(agent.started.wait(), WAIT_S)
            waiting = await client.submit_task("alice", {"n": 2}, scope=SCOPE, task_id="t-p")
            # Pending: queued, or prefetched at alice (dispatched, not started).
            assert (await waiting.status()).state in ("QUEUED", "DISPATCHED")
            assert leader.cluster is not None
            leader.cluster.halt()  # (as SIGKILL: nothing released)
            started = time.monotonic()
            await _until(
                lambda: _role(f1).leads(ACME) or _role(f2).leads(ACME), "a new leader of acme"
            )
            print(f"acme led again after {time.monotonic() - started:.2f} s (lease_s {LEASE_S})")
            successor = f1 if _role(f1).leads(ACME) else f2
            assert _scheduler(successor).get("t-p") is not None  # (loaded from acme's schema)
            agent.release.set()
            assert await running.result(timeout=WAIT_S) == "held"
            assert await waiting.result(timeout=WAIT_S) == "held"
            after = await client.submit_task("alice", {"n": 3}, scope=SCOPE, task_id="t-l")
            assert await after.result(timeout=WAIT_S) == "held"
        assert agent.ran == ["t-k", "t-p", "t-l"]


def _forwarded(key: str, principal: Principal) -> str:
    forwarded = Forwarded(principal, "x", int(time.time() * 1000), secrets.token_hex(8))
    return sign_forward(key, GET_TASK, forwarded)


async def _get_task(address: str, task_id: str, metadata: list[tuple[str, str]]) -> Any:
    """GetTask's answer, or its refusal."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb.apiary_pb2_grpc.TaskQueryServiceStub(channel)
        try:
            return await stub.GetTask(
                pb.apiary_pb2.GetTaskRequest(task_id=task_id), metadata=metadata
            )
        except grpc.aio.AioRpcError as exc:
            return refusal_of(exc)


async def test_the_forwarding_path_keeps_a_call_in_its_principals_tenant(
    tmp_path: Path, url: str
) -> None:
    async with _cluster(tmp_path, url, "ab", (ACME, GLOBEX)) as ((leader, f1), keys):
        async with apiary.Client(
            str(f1.grpc_address), credentials=_as(keys, "bob@globex")
        ) as globex:
            await globex.submit_task(capability="review", scope=SCOPE, task_id="t-globex")
        assert _scheduler(leader, GLOBEX).get("t-globex") is not None
        acme = [("authorization", f"Bearer {keys['app@acme']}")]
        bob = [("authorization", f"Bearer {keys['bob@globex']}")]
        for replica in (f1, leader):
            address = str(replica.grpc_address)
            # globex's submitter reads its task through either; acme's application finds
            # none, exactly as for a task that does not exist.
            found = await _get_task(address, "t-globex", bob)
            assert found.task_id == "t-globex"
            hidden = await _get_task(address, "t-globex", acme)
            missing = await _get_task(address, "t-nothing", acme)
            assert hidden.naming("t-globex") == missing.naming("t-nothing")
            assert hidden.status is grpc.StatusCode.NOT_FOUND
            # Naming globex is refused to acme's application.
            named = await _get_task(address, "t-globex", [*acme, (TENANT_KEY, GLOBEX)])
            assert (named.status, named.details.get("field")) == (
                grpc.StatusCode.PERMISSION_DENIED,
                TENANT_KEY,
            )
        # A forwarded call is in its signed principal's tenant on the leader too: acme's
        # principal naming globex is refused there, and finds no globex task without it.
        app = Principal(PrincipalKind.APPLICATION, "app", ACME, mechanism=Mechanism.API_KEY)
        key, address = _role(leader).forward_key, str(leader.grpc_address)
        signed = [(FORWARD_KEY, _forwarded(key, app)), (TENANT_KEY, GLOBEX)]
        named = await _get_task(address, "t-globex", signed)
        assert named.status is grpc.StatusCode.PERMISSION_DENIED
        plain = await _get_task(address, "t-globex", [(FORWARD_KEY, _forwarded(key, app))])
        assert plain.status is grpc.StatusCode.NOT_FOUND


async def test_a_tenants_escalation_opened_through_one_follower_is_decided_through_another(
    tmp_path: Path, url: str
) -> None:
    """acme's HITL runs on the leader: an invocation opened by acme's operator through one
    follower is held by the leader's acme HITL only, listed and decided through the other
    follower."""
    a = pb.apiary_pb2
    async with (
        _cluster(tmp_path, url) as ((leader, f1, f2), keys),
        grpc.aio.insecure_channel(str(f1.grpc_address)) as one,
        grpc.aio.insecure_channel(str(f2.grpc_address)) as two,
    ):
        ops = (("authorization", f"Bearer {keys['ops@acme']}"),)
        opened = await pb.apiary_pb2_grpc.HitlOperatorServiceStub(one).Escalate(
            a.EscalateRequest(reason_type="SECURITY_APPROVAL", requested_by="planner"),
            metadata=ops,
        )
        assert leader.tenancy is not None and f1.tenancy is not None
        on_leader = leader.tenancy.opened(ACME)
        on_f1 = f1.tenancy.opened(ACME)
        assert on_leader is not None and on_f1 is not None
        held = {r.invocation_id for r in await on_leader.engine.hitl.list()}
        assert opened.invocation_id in held
        assert opened.invocation_id not in {r.invocation_id for r in await on_f1.engine.hitl.list()}
        waiting = asyncio.create_task(on_leader.engine.hitl.wait(opened.invocation_id))
        listed = await pb.apiary_pb2_grpc.HitlOperatorServiceStub(two).List(
            a.ListInvocationsRequest(), metadata=ops
        )
        assert opened.invocation_id in {i.invocation_id for i in listed.invocations}
        await pb.apiary_pb2_grpc.HitlOperatorServiceStub(two).Decide(
            a.DecideInvocationRequest(
                invocation_id=opened.invocation_id, action="approve", rationale="ok"
            ),
            metadata=ops,
        )
        decided = await asyncio.wait_for(waiting, WAIT_S)
        assert decided.state != "PENDING"


async def _runtime(replica: Coordinator, key: str, command: str, **params: object) -> Any:
    """RuntimeControlService.Call through `replica` with `key`: its result, decoded."""
    async with grpc.aio.insecure_channel(str(replica.grpc_address)) as channel:
        answer = await pb.apiary_pb2_grpc.RuntimeControlServiceStub(channel).Call(
            pb.apiary_pb2.RuntimeCommandRequest(
                command=command, params_json=json.dumps(params).encode()
            ),
            metadata=(("authorization", f"Bearer {key}"),),
        )
    return json.loads(answer.result_json)


async def test_a_tenants_turn_submitted_through_a_follower_is_run_by_the_leader(
    tmp_path: Path, url: str
) -> None:
    async with _cluster(tmp_path, url) as ((leader, f1, f2), keys):
        agent = _alice(f1, keys)
        app = keys["app@acme"]
        async with _running(agent):
            submitted = await _runtime(
                f2, app, "submit_turn", agent_id="alice", turn_id="turn-1", input={"n": 1}
            )
            assert submitted["created"]
            await asyncio.wait_for(agent.started.wait(), WAIT_S)
            # The leader's acme control plane follows the turn; the followers' none.
            control = leader.control_planes.opened(ACME) if leader.control_planes else None
            assert control is not None and control.turns.following() == 1
            for follower in (f1, f2):
                assert follower.control_planes is not None
                opened = follower.control_planes.opened(ACME)
                assert opened is None or opened.turns.following() == 0
            agent.release.set()

            async def ended() -> bool:
                got = await _runtime(f1, app, "get_task", task_id=submitted["taskId"])
                return bool(got["task"]["status"] == "completed")

            await _until_async(ended, "the turn's task completed, read through a follower")
        got = await _runtime(f2, app, "get_task", task_id=submitted["taskId"])
        assert got["task"]["result"] == "held"
        assert agent.ran == [submitted["taskId"]]


async def _until_async(check: Any, what: str) -> None:
    loop = asyncio.get_running_loop()
    until = loop.time() + WAIT_S
    while not await check():
        assert loop.time() < until, f"never: {what}"
        await asyncio.sleep(0.05)
