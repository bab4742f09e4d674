"""Cluster leases on the real PostgreSQL (docs/cluster.md): replicas racing for partitions,
expiry and takeover with an epoch bump, fenced writes refused once another replica took the
partition, and a takeover that waits for the writes of the term it ends. Lease time runs
on a FakeClock handed to the store (the database's clock otherwise)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import psycopg
import pytest
from psycopg import sql

from apiary.core.cluster.leases import Lease, Verdict
from apiary.store.cluster import (
    ClusterConfigError,
    FencedError,
    LeaseOutcome,
    Me,
    ReplicaEvictedError,
    ReplicaInUseError,
)
from apiary.store.postgres.cluster import CHANNEL, PostgresClusterLeases
from apiary.testing.clock import FakeClock
from tests.store.replica_pools import replica_stores

pytestmark = pytest.mark.postgres

L = 5.0
WAIT_S = 30
A, B, C = (Me(f"replica-{n}", f"inc-{n}", f"10.0.0.{i}:50051") for i, n in enumerate("abc"))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def stores(
    postgres_dsn: str, postgres_schema: str, clock: FakeClock
) -> AsyncIterator[list[PostgresClusterLeases]]:
    """Three replicas' lease tables: one schema, three connection pools."""
    async with replica_stores(postgres_dsn, postgres_schema, 3) as opened:
        yield [PostgresClusterLeases(store.pool, clock) for store in opened]


def _granted(outcomes: Sequence[LeaseOutcome]) -> dict[int, int]:
    return {o.lease.partition: o.lease.epoch for o in outcomes if o.verdict.granted}


async def test_join_seeds_the_partitions_once_and_refuses_another_count(
    stores: list[PostgresClusterLeases],
) -> None:
    view = await stores[0].join(A, 8, L)
    assert [lease.partition for lease in view.leases] == list(range(8))
    assert all(lease == Lease(lease.partition) for lease in view.leases)
    assert [r.replica_id for r in view.replicas] == [A.replica_id]
    assert view.replicas[0].address == A.address and view.replicas[0].live(view.now)
    await stores[1].join(B, 8, L)
    with pytest.raises(ClusterConfigError, match=r"partitions is 16.*has 8") as caught:
        await stores[2].join(C, 16, L)
    assert caught.value.field == "cluster.partitions"
    assert len((await stores[0].view()).replicas) == 2


async def test_replicas_racing_for_every_partition_get_one_owner_each(
    stores: list[PostgresClusterLeases], clock: FakeClock
) -> None:
    for store, me in zip(stores, (A, B, C), strict=True):
        await store.join(me, 16, L)
    for term in (1, 2, 3):
        results = await asyncio.gather(
            *(s.acquire(me, range(16), L) for s, me in zip(stores, (A, B, C), strict=True))
        )
        won = [_granted(r) for r in results]
        assert sorted(p for w in won for p in w) == list(range(16))  # each exactly once
        assert all(epoch == term for w in won for epoch in w.values())
        refused = {o.verdict for r in results for o in r if not o.verdict.granted}
        assert refused <= {Verdict.HELD_ELSEWHERE}
        view = await stores[0].view()
        owners = view.owners()
        for w, me in zip(won, (A, B, C), strict=True):
            assert all(owners[p] == me.replica_id for p in w)
        clock.advance(L)  # every lease lapses: the next round is a new term for each


async def test_a_lapsed_lease_is_taken_over_with_a_new_epoch(
    stores: list[PostgresClusterLeases], clock: FakeClock
) -> None:
    a, b = stores[0], stores[1]
    await a.join(A, 4, L)
    await b.join(B, 4, L)
    assert _granted(await a.acquire(A, [0, 1], L)) == {0: 1, 1: 1}
    clock.advance(L / 3)
    beat = await a.beat(A, L)  # renews 0 and 1 until L / 3 + L
    assert _granted(beat.renewed) == {0: 1, 1: 1}
    clock.advance(L - 0.001)
    refused = await b.acquire(B, [0, 1], L)
    assert [o.verdict for o in refused] == [Verdict.HELD_ELSEWHERE] * 2
    clock.advance(0.001)  # the instant they lapse
    taken = await b.acquire(B, [0, 1], L)
    assert [o.verdict for o in taken] == [Verdict.TOOK_OVER] * 2
    assert _granted(taken) == {0: 2, 1: 2}
    # The old owner finds out at its next beat: nothing renewed, it owns nothing.
    late = await a.beat(A, L)
    assert late.renewed == ()
    assert late.view.owners() == {0: B.replica_id, 1: B.replica_id}
    assert [o.verdict for o in await a.release(A, [0])] == [Verdict.NOT_OWNER]


async def test_a_fenced_write_is_refused_once_another_replica_took_the_partition(
    stores: list[PostgresClusterLeases],
    clock: FakeClock,
    postgres_dsn: str,
    postgres_schema: str,
) -> None:
    a, b = stores[0], stores[1]
    await a.join(A, 2, L)
    await b.join(B, 2, L)
    (held,) = await a.acquire(A, [1], L)
    epoch = held.lease.epoch
    async with a.fenced(A, 1, epoch) as conn:
        await conn.execute("CREATE TABLE work (writer TEXT, epoch BIGINT)")
        await conn.execute("INSERT INTO work VALUES ('a', %s)", [epoch])
    clock.advance(L)
    (taken,) = await b.acquire(B, [1], L)
    assert taken.verdict is Verdict.TOOK_OVER
    with pytest.raises(FencedError, match="epoch 1, the lease is at epoch 2 held by replica-b"):
        async with a.fenced(A, 1, epoch) as conn:
            await conn.execute("INSERT INTO work VALUES ('a-late', %s)", [epoch])
    with pytest.raises(FencedError):  # B's term, but not A's even with B's epoch
        async with a.fenced(A, 1, taken.lease.epoch):
            pass
    async with b.fenced(B, 1, taken.lease.epoch) as conn:
        await conn.execute("INSERT INTO work VALUES ('b', %s)", [taken.lease.epoch])
    await b.release(B, [1])
    with pytest.raises(FencedError, match="held by nobody"):
        async with b.fenced(B, 1, taken.lease.epoch):
            pass
    async with await psycopg.AsyncConnection.connect(postgres_dsn) as conn:
        cursor = await conn.execute(
            sql.SQL("SELECT writer, epoch FROM {}.work ORDER BY epoch").format(
                sql.Identifier(postgres_schema)
            )
        )
        assert await cursor.fetchall() == [("a", 1), ("b", 2)]


async def test_a_takeover_waits_for_the_writes_of_the_term_it_ends(
    stores: list[PostgresClusterLeases], clock: FakeClock, postgres_dsn: str
) -> None:
    a, b = stores[0], stores[1]
    await a.join(A, 1, L)
    await b.join(B, 1, L)
    (held,) = await a.acquire(A, [0], L)
    clock.advance(L)  # lapsed, but A's write decided under its term is under way
    async with a.fenced(A, 0, held.lease.epoch) as conn:
        await conn.execute("CREATE TABLE work (writer TEXT)")
        takeover = asyncio.create_task(b.acquire(B, [0], L))
        await _until_waiting_on_a_lock(postgres_dsn)
        assert not takeover.done()
        await conn.execute("INSERT INTO work VALUES ('a')")
    (taken,) = await asyncio.wait_for(takeover, WAIT_S)
    assert (taken.verdict, taken.lease.epoch) == (Verdict.TOOK_OVER, 2)
    with pytest.raises(FencedError):
        async with a.fenced(A, 0, held.lease.epoch):
            pass


async def _until_waiting_on_a_lock(dsn: str) -> None:
    """Return once some session of this database waits on a row lock (bounded)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for _ in range(WAIT_S * 20):
            cursor = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND query LIKE '%%partition_leases%%'"
            )
            row = await cursor.fetchone()
            if row is not None and row[0] > 0:
                return
            await asyncio.sleep(0.05)
    raise AssertionError("the takeover never waited on the fenced write's lock")


async def test_a_replica_id_in_use_is_refused_until_its_heartbeat_lapses(
    stores: list[PostgresClusterLeases], clock: FakeClock
) -> None:
    a, again = stores[0], stores[1]
    await a.join(A, 2, L)
    await a.acquire(A, [0, 1], L)
    restarted = Me(A.replica_id, "inc-a-2", A.address)
    with pytest.raises(ReplicaInUseError, match="replica_id 'replica-a' is in use") as caught:
        await again.join(restarted, 2, L)
    assert caught.value.field == "cluster.replica_id"
    assert caught.value.remaining_s == pytest.approx(L)
    clock.advance(L)
    view = await again.join(restarted, 2, L)
    # The predecessor's leases are free: the restarted replica's are new terms.
    assert [(lease.owner, lease.epoch) for lease in view.leases] == [(None, 1), (None, 1)]
    assert _granted(await again.acquire(restarted, [0, 1], L)) == {0: 2, 1: 2}
    # The predecessor, were it only paused, can do nothing more under the id.
    with pytest.raises(ReplicaEvictedError, match="another start of the same replica_id"):
        await a.beat(A, L)
    with pytest.raises(ReplicaEvictedError):
        await a.acquire(A, [0], L)
    with pytest.raises(ReplicaEvictedError):
        await a.release(A, [0])
    await a.leave(A)  # a no-op: the leases are the new start's
    view = await a.view()
    assert [(lease.owner, lease.epoch) for lease in view.leases] == [(A.replica_id, 2)] * 2
    assert [r.replica_id for r in view.replicas] == [A.replica_id]


async def test_leave_releases_everything_and_notifies(
    stores: list[PostgresClusterLeases], postgres_dsn: str, postgres_schema: str
) -> None:
    a = stores[0]
    await a.join(A, 3, L)
    await a.acquire(A, [0, 1, 2], L)
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as listener:
        await listener.execute(f"LISTEN {CHANNEL}")
        await a.leave(A)
        note = await asyncio.wait_for(anext(aiter(listener.notifies())), WAIT_S)
    assert note.payload == postgres_schema
    view = await a.view()
    assert view.replicas == ()
    assert [(lease.owner, lease.epoch) for lease in view.leases] == [(None, 1)] * 3
