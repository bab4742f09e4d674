"""The cluster's leader on the real PostgreSQL (docs/cluster.md, "The leader"): the leader's
lease under the partitions' rules (one holder per term, a takeover of a lapsed lease with a
new epoch, a release for the next at once), the forwarding key seeded once, and the relay:
read in the order stored, deleted once applied, by the current term only. Lease time runs
on a FakeClock handed to the store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest

from apiary.core.cluster.leases import LeaseAction, Verdict
from apiary.store.cluster import ENVELOPE, READY, FencedError, Me, Relayed
from apiary.store.open import tenant_schema
from apiary.store.postgres.cluster_leader import PostgresClusterLeader
from apiary.store.postgres.pool import fetch_rows
from apiary.store.postgres.store import open_postgres_store
from apiary.testing.clock import FakeClock
from tests.security.tenant_harness import drop_schemas
from tests.store.replica_pools import replica_stores

pytestmark = pytest.mark.postgres

L = 5.0
A, B = Me("replica-a", "inc-a", "10.0.0.1:50051"), Me("replica-b", "inc-b", "10.0.0.2:50051")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def stores(
    postgres_dsn: str, postgres_schema: str, clock: FakeClock
) -> AsyncIterator[list[PostgresClusterLeader]]:
    """Two replicas' views of the leader's row: one schema, two connection pools."""
    async with replica_stores(postgres_dsn, postgres_schema, 2) as opened:
        yield [PostgresClusterLeader(store.pool, clock) for store in opened]


async def test_the_first_key_is_everyones_and_one_replica_leads_per_term(
    stores: list[PostgresClusterLeader], clock: FakeClock
) -> None:
    a, b = stores
    first = await a.seed("key-a")
    assert (await b.seed("key-b")).forward_key == first.forward_key == "key-a"
    assert first.leader() is None
    outcomes = await asyncio.gather(
        a.step(A, LeaseAction.ACQUIRE, L, A.address), b.step(B, LeaseAction.ACQUIRE, L, B.address)
    )
    assert sorted(o.verdict for o in outcomes) == [Verdict.ACQUIRED, Verdict.HELD_ELSEWHERE]
    winner = A if outcomes[0].verdict is Verdict.ACQUIRED else B
    found = await a.read()
    assert (found.leader(), found.address, found.lease.epoch) == (
        winner.replica_id,
        winner.address,
        1,
    )
    clock.advance(L / 2)
    me, store = (A, a) if winner is A else (B, b)
    assert (await store.step(me, LeaseAction.RENEW, L)).verdict is Verdict.RENEWED
    # The holder stops renewing: once the lease lapsed the other takes it over, epoch 2.
    other, other_store = (B, b) if winner is A else (A, a)
    clock.advance(L)
    took = await other_store.step(other, LeaseAction.ACQUIRE, L, other.address)
    assert (took.verdict, took.lease.epoch) == (Verdict.TOOK_OVER, 2)
    assert (await store.step(me, LeaseAction.RENEW, L)).verdict is Verdict.LOST
    assert (await a.read()).address == other.address
    # A release lets the next acquire at once, as a new term.
    assert (await other_store.step(other, LeaseAction.RELEASE, L)).verdict is Verdict.RELEASED
    again = await store.step(me, LeaseAction.ACQUIRE, L, me.address)
    assert (again.verdict, again.lease.epoch) == (Verdict.ACQUIRED, 3)


async def test_the_relay_is_read_in_order_by_the_current_term_only(
    stores: list[PostgresClusterLeader], clock: FakeClock
) -> None:
    a, b = stores
    await a.seed("key")
    assert (await a.step(A, LeaseAction.ACQUIRE, L, A.address)).lease.epoch == 1
    await b.relay(B, [Relayed(READY, "bob"), Relayed(ENVELOPE, "bob", "scheduler", b"\x01")])
    await b.relay(B, [Relayed(READY, "carol")])
    items = await a.relayed(A, 1, 10)
    assert [(i.kind, i.agent_id, i.detail, i.envelope) for i in items] == [
        (READY, "bob", "", b""), (ENVELOPE, "bob", "scheduler", b"\x01"), (READY, "carol", "", b"")
    ]  # fmt: skip
    assert [i.seq for i in items] == sorted(i.seq for i in items)
    await a.applied(A, 1, [items[0].seq])
    assert [i.agent_id for i in await a.relayed(A, 1, 10)] == ["bob", "carol"]
    # Another replica takes the lease over: the old term reads and deletes nothing more.
    clock.advance(L)
    assert (await b.step(B, LeaseAction.ACQUIRE, L, B.address)).lease.epoch == 2
    with pytest.raises(FencedError):
        await a.relayed(A, 1, 10)
    with pytest.raises(FencedError):
        await a.applied(A, 1, [items[1].seq])
    assert [i.agent_id for i in await b.relayed(B, 2, 10)] == ["bob", "carol"]


async def test_a_tenants_relay_is_its_schemas_and_read_under_the_clusters_leader_lease(
    postgres_dsn: str, postgres_schema: str, stores: list[PostgresClusterLeader], clock: FakeClock
) -> None:
    """Another tenant's relay (docs/cluster.md, "Tenants"): rows in the tenant's schema,
    read and deleted under the term of the cluster's one leader's lease (the leader's row
    of the cluster's schema, locked from the tenant's connection), never under a lease of
    the tenant's schema's own."""
    a, b = stores
    schema = tenant_schema(postgres_schema, "acme")
    try:
        async with AsyncExitStack() as stack:
            pools = [
                (
                    await stack.enter_async_context(
                        open_postgres_store(postgres_dsn, schema=schema)
                    )
                ).pool
                for _ in range(2)
            ]
            ta, tb = (
                PostgresClusterLeader(p, clock, cluster_schema=postgres_schema) for p in pools
            )
            await a.seed("key")
            assert (await a.step(A, LeaseAction.ACQUIRE, L, A.address)).lease.epoch == 1
            assert (await ta.read()).leader() == A.replica_id  # (the cluster's row)
            await tb.relay(B, [Relayed(READY, "bob")])
            await b.relay(B, [Relayed(READY, "carol")])
            assert [i.agent_id for i in await ta.relayed(A, 1, 10)] == ["bob"]
            assert [i.agent_id for i in await a.relayed(A, 1, 10)] == ["carol"]
            with pytest.raises(FencedError):
                await tb.relayed(B, 1, 10)  # (b does not lead)
            clock.advance(L)
            assert (await b.step(B, LeaseAction.ACQUIRE, L, B.address)).lease.epoch == 2
            with pytest.raises(FencedError):
                await ta.relayed(A, 1, 10)
            (item,) = await tb.relayed(B, 2, 10)
            await tb.applied(B, 2, [item.seq])
            assert await tb.relayed(B, 2, 10) == []
            async with pools[0].connection() as conn:
                rows = await fetch_rows(conn, "SELECT count(*) FROM cluster_leader")
            assert rows == [(0,)]  # (the tenant's schema's own row: never made)
    finally:
        drop_schemas(postgres_dsn, [schema])
