"""Tenants besides the default in cluster mode (docs/cluster.md, "Tenants"): two
coordinators serving one PostgreSQL schema as replicas, each with the engine of tenant
`acme` over acme's own schema. An agent of acme streaming on replica A receives what a
producer of acme sent through replica B, and the ACK reaches the producer's stream on B; a
message of acme whose TTL runs out is failed once, by the owner of its recipient's
partition in the cluster's one lease table, which opened acme's engine because another
replica did (the cluster's list of tenants); acme's objects stay out of reach of the
default tenant and of another tenant on either replica."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from pathlib import Path

import grpc
import psycopg
import pytest
from psycopg import sql

from apiary.core.cluster.partitions import partition_of
from apiary.core.envelope import AckStage
from apiary.core.records import MessageState
from apiary.engine.router.admission import Outbound
from apiary.errors import NoRouteError
from apiary.server.auth.keys import credentials_path
from apiary.server.auth.settings import AuthSettings
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.server.tenancy import TenantEngine
from apiary.store.open import tenant_schema
from apiary.wire import pb
from tests.security.tenant_harness import Tenants, create_keys, items_until
from tests.security.test_tenants import register, send
from tests.server.test_cluster_replicas import (
    PARTITIONS,
    _ack,
    _envelope,
    _keeper,
    _read,
    _register,
    _send,
    _settings,
    _stop,
    _until,
)

pytestmark = pytest.mark.postgres

TENANT = "acme"
OTHER = "globex"


@asynccontextmanager
async def _replica(tmp_path: Path, url: str, replica_id: str) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(
        tmp_path / replica_id, url, cluster=_settings(replica_id), auth=AuthSettings(secure=True)
    ) as coordinator:  # fmt: skip
        yield coordinator


@asynccontextmanager
async def _two(tmp_path: Path, url: str) -> AsyncIterator[tuple[Coordinator, Coordinator]]:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(_replica(tmp_path, url, "a"))
        b = await stack.enter_async_context(_replica(tmp_path, url, "b"))
        a_keeper, b_keeper = _keeper(a), _keeper(b)
        await _until(
            lambda: len(a_keeper.owned()) == len(b_keeper.owned()) == PARTITIONS // 2,
            "the partitions shared between the two replicas",
        )
        yield a, b


async def _tenant(replica: Coordinator, tenant: str) -> TenantEngine:
    assert replica.tenancy is not None
    return await replica.tenancy.engine(tenant)


@pytest.fixture
def url(postgres_dsn: str, postgres_schema: str) -> Iterator[str]:
    yield f"{postgres_dsn}?apiary_schema={postgres_schema}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for tenant in (TENANT, OTHER):
            schema = tenant_schema(postgres_schema, tenant)
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


async def test_an_agent_of_a_tenant_on_a_receives_what_a_producer_of_it_sent_through_b(
    tmp_path: Path, url: str
) -> None:
    async with _two(tmp_path, url) as (a, b):
        acme_a, acme_b = await _tenant(a, TENANT), await _tenant(b, TENANT)
        assert a.cluster is not None and TENANT in a.cluster.tenants
        on_a, on_b = acme_a.engine, acme_b.engine
        await _register(on_a, "bob")  # type: ignore[arg-type]
        await _register(on_b, "alice")  # type: ignore[arg-type]
        await _until(lambda: on_b.registry.known("bob") is not None, "B's acme knows bob")
        await _until(lambda: on_a.registry.known("alice") is not None, "A's acme knows alice")
        bob, alice = _read(on_a, "bob"), _read(on_b, "alice")  # type: ignore[arg-type]
        await _until(
            lambda: on_a.router.streaming("bob") and on_b.router.streaming("alice"), "streams"
        )

        sent = [await _send(on_b, "alice", "bob", {"n": n}) for n in range(3)]  # type: ignore[arg-type]
        await _until(lambda: len(bob.messages) == 3, "bob's stream on A receives them")
        assert [m.message_id for m in bob.messages] == sent
        await _ack(on_a, "bob", sent[0], AckStage.FULFILLED)  # type: ignore[arg-type]
        await _until(lambda: len(alice.acks) == 1, "the ACK reaches alice's stream on B")
        assert alice.acks[0].ack_for_message_id == sent[0]
        stored = await acme_b.store.messages.get(sent[0])
        assert stored is not None and stored.state is MessageState.FULFILLED

        # acme's objects are out of reach of the default tenant and of another tenant, on
        # either replica: unknown agents, messages not in their stores.
        globex = await _tenant(a, OTHER)
        for engine, store in ((a, a.store), (b, b.store), (globex.engine, globex.store)):
            assert engine.registry.known("bob") is None
            assert await store.messages.get(sent[0]) is None
            with pytest.raises(NoRouteError):
                await engine.router.send(Outbound(_envelope("alice", {"n": 9}), "bob"))
        for reader in (bob, alice):
            await _stop(reader)


async def test_a_tenant_opened_on_one_replica_is_opened_on_the_other_whose_partitions_it_times(
    tmp_path: Path, url: str
) -> None:
    async with _two(tmp_path, url) as (a, b):
        # acme is opened on B only; A, the owner of carol's partition, opens it from the
        # cluster's list of tenants and fires the TTL of acme's message for carol, once.
        acme_b = await _tenant(b, TENANT)
        assert a.tenancy is not None
        tenancy = a.tenancy
        await _until(lambda: tenancy.opened(TENANT) is not None, "A opens acme too")
        owned_by_a = _keeper(a).owned()
        carol = next(
            f"carol-{n}"
            for n in range(1000)
            if partition_of(f"carol-{n}", PARTITIONS) in owned_by_a
        )
        await _register(acme_b.engine, carol)  # type: ignore[arg-type]
        await _register(acme_b.engine, "alice")  # type: ignore[arg-type]
        env = replace(_envelope("alice", {"n": 1}), ttl_ms=200)
        outcome = await acme_b.engine.router.send(Outbound(env, carol))
        assert outcome.accepted, outcome.reason

        assert a.cluster is not None and b.cluster is not None
        on_a, on_b = a.cluster.tenants[TENANT].timers, b.cluster.tenants[TENANT].timers
        await _until(lambda: on_a.fired == 1, "A, the owner of carol's partition, fires it")
        stored = await acme_b.store.messages.get(env.message_id)
        assert stored is not None
        assert (stored.state, stored.error_code) == (MessageState.FAILED, "ttl_expired")
        failed = [
            e for e in await acme_b.engine.events.read(limit=10_000)
            if e.event_type == "message.state" and e.details.get("message_id") == env.message_id
            and e.details.get("to") == "FAILED"
        ]  # fmt: skip
        assert len(failed) == 1
        assert on_b.fired == 0
        assert a.cluster.timers.fired == b.cluster.timers.fired == 0  # (the default tenant's)


async def test_over_grpc_each_tenants_agent_on_a_receives_only_its_tenants_messages_sent_through_b(
    tmp_path: Path, url: str
) -> None:
    """The same across replicas over real gRPC, each caller's credential naming its
    tenant (tests/security/test_tenants.py on one coordinator): alice of acme and alice of
    globex stream on A; acme's application and globex's bob send to "alice" through B."""
    keys = create_keys(tmp_path / "a")
    (tmp_path / "b").mkdir()
    shutil.copy2(credentials_path(tmp_path / "a"), credentials_path(tmp_path / "b"))
    async with (
        _two(tmp_path, url) as (a, b),
        grpc.aio.insecure_channel(str(a.grpc_address)) as to_a,
        grpc.aio.insecure_channel(str(b.grpc_address)) as to_b,
    ):
        on_a, on_b = Tenants(a, to_a, keys), Tenants(b, to_b, keys)
        await register(on_a, "alice@acme", capabilities=["acme-secret"])
        await register(on_a, "alice@globex", capabilities=["globex-only"])
        await register(on_b, "bob@globex")
        # B's view of each tenant's registry is read again at each poll and note (a lookup
        # is not read through; routing is): GetAgent through B once B has seen them.
        b_tenancy = b.tenancy
        assert b_tenancy is not None
        await _until(
            lambda: all(
                (opened := b_tenancy.opened(tenant)) is not None
                and opened.engine.registry.known("alice") is not None
                for tenant in (TENANT, OTHER)
            ),
            "B knows both alices",
        )
        for who, capability in (("alice@acme", "acme-secret"), ("alice@globex", "globex-only")):
            request = pb.apiary_pb2.GetAgentRequest(agent_id="alice")
            found = await on_b.call("DiscoveryService/GetAgent", request, who)
            assert list(found.descriptor.capabilities) == [capability]

        inbox = pb.router_pb2.StreamRequest(agent_id="alice")
        in_acme = on_a.stream("RouterService/StreamIncoming", inbox, "alice@acme")
        in_globex = on_a.stream("RouterService/StreamIncoming", inbox, "alice@globex")
        try:
            tenancy = a.tenancy
            assert tenancy is not None
            await _until(
                lambda: all(
                    (opened := tenancy.opened(tenant)) is not None
                    and opened.engine.router.streaming("alice")
                    for tenant in (TENANT, OTHER)
                ),
                "both alices stream on A",
            )
            secret, answer = await send(on_b, "app@acme", "alice")
            assert answer.accepted, answer.reason
            marker, answer = await send(on_b, "bob@globex", "alice")
            assert answer.accepted, answer.reason
            # An inbox is FIFO: had acme's message reached globex's alice, it would come first.
            delivered = await items_until(in_globex, marker.message_id)
            assert [item.msg.message_id for item in delivered] == [marker.message_id]
            (got,) = await items_until(in_acme, secret.message_id)
            assert (got.msg.producer_id, got.msg.payload) == ("app", secret.payload)
        finally:
            in_acme.cancel()
            in_globex.cancel()
