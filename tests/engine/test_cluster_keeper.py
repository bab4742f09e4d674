"""The lease keeper on the real PostgreSQL (docs/cluster.md): two replicas in one process
share the partitions fairly; one stopped without releasing anything (as SIGKILL would stop
it) has its partitions taken over by the other within lease_s, under new epochs; one that
stops cleanly hands them over at once. Lease time is virtual (a FakeClock handed to the
keepers and their stores) except in the last test, which runs on the database's clock."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack

import psycopg
import pytest

from apiary.engine.cluster.keeper import LeaseKeeper, open_lease_keeper
from apiary.engine.cluster.settings import ClusterSettings
from apiary.store.postgres.cluster import PostgresClusterLeases
from apiary.store.postgres.store import PostgresStore, open_postgres_store
from apiary.system import SystemClock
from apiary.testing.clock import FakeClock

pytestmark = pytest.mark.postgres

WAIT_S = 30
PARTITIONS = 8


def _settings(replica_id: str, lease_s: float = 3.0) -> ClusterSettings:
    return ClusterSettings(True, replica_id, lease_s, PARTITIONS)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def pools(postgres_dsn: str, postgres_schema: str) -> AsyncIterator[list[PostgresStore]]:
    """Two replicas' stores on one schema (each replica has its own pool)."""
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                open_postgres_store(postgres_dsn, schema=postgres_schema)
            )
            for _ in range(2)
        ]


def _keeper(store: PostgresStore, replica_id: str, clock: FakeClock) -> LeaseKeeper:
    leases = PostgresClusterLeases(store.pool, clock)
    return LeaseKeeper(leases, _settings(replica_id), clock, clock.sleep, address=replica_id)


async def _until(keeper: LeaseKeeper, done: Callable[[LeaseKeeper], bool]) -> None:
    await asyncio.wait_for(keeper.wait_until(done), WAIT_S)


async def _step(clock: FakeClock, seconds: float, *running: LeaseKeeper) -> None:
    """Advance the clock, then wait until each running keeper has ticked at the new time
    (every keeper sleeps at most renew_s, so a step of renew_s wakes each of them)."""
    clock.advance(seconds)
    for keeper in running:
        await _until(keeper, lambda k: k.view is not None and k.view.now >= clock.now())


@contextlib.asynccontextmanager
async def _running(keeper: LeaseKeeper) -> AsyncIterator[asyncio.Task[None]]:
    await keeper.join()
    task = asyncio.create_task(keeper.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_killed_replicas_partitions_are_taken_over_within_lease_s(
    pools: list[PostgresStore], clock: FakeClock
) -> None:
    a, b = _keeper(pools[0], "replica-a", clock), _keeper(pools[1], "replica-b", clock)
    renew = a.settings.renew_s
    async with _running(a) as a_task, _running(b):
        await _until(a, lambda k: k.ticks > 0)
        await _until(b, lambda k: k.ticks > 0)
        for _ in range(3):  # a took everything first; it hands b its share
            await _step(clock, renew, a, b)
        assert (len(a.owned()), len(b.owned())) == (4, 4)
        assert a.owned().keys().isdisjoint(b.owned().keys())
        lost = a.owned()

        a_task.cancel()  # as SIGKILL: nothing released, the leases run out
        with contextlib.suppress(asyncio.CancelledError):
            await a_task
        killed_at = clock.monotonic()
        while clock.monotonic() - killed_at < a.settings.lease_s:
            await _step(clock, renew, b)
        assert clock.monotonic() - killed_at == pytest.approx(a.settings.lease_s)
        assert b.owned().keys() == set(range(PARTITIONS))
        assert {p: b.owned()[p] for p in lost} == {p: e + 1 for p, e in lost.items()}
        assert b.takeovers == 4
        assert b.view is not None and b.view.live_replicas() == ("replica-b",)
        assert a.owned() == {}  # its own terms ran out locally too


async def test_a_clean_stop_hands_the_partitions_over_at_its_next_tick(
    pools: list[PostgresStore], clock: FakeClock
) -> None:
    b = _keeper(pools[1], "replica-b", clock)
    leases = PostgresClusterLeases(pools[0].pool, clock)
    async with _running(b):  # b does not listen: it finds the releases by polling
        async with open_lease_keeper(
            leases, _settings("replica-a"), clock, clock.sleep, address="a:1"
        ) as a:
            await _until(b, lambda k: k.ticks > 0)
            for _ in range(3):
                await _step(clock, b.settings.renew_s, a, b)
            assert len(a.owned()) == len(b.owned()) == 4
        assert a.owned() == {}
        await _step(clock, b.settings.renew_s, b)  # the next tick, well before any expiry
        assert b.owned().keys() == set(range(PARTITIONS))
        assert b.takeovers == 0


async def test_a_release_notified_wakes_the_other_replica_at_once(
    pools: list[PostgresStore], clock: FakeClock, postgres_dsn: str
) -> None:
    """LISTEN/NOTIFY as the hint: b takes a's partitions while the clock stands still."""
    settings = _settings("replica-b")
    b_leases = PostgresClusterLeases(pools[1].pool, clock)
    async with open_lease_keeper(b_leases, settings, clock, clock.sleep) as b:
        await _until_listening(postgres_dsn)
        a = _keeper(pools[0], "replica-a", clock)
        async with _running(a):
            await _until(a, lambda k: k.ticks > 0)
            for _ in range(3):
                await _step(clock, settings.renew_s, a, b)
            assert len(a.owned()) == len(b.owned()) == 4
        ticks = b.ticks
        await a.leave()  # notifies; no clock advance from here on
        await _until(b, lambda k: len(k.owned()) == PARTITIONS)
        assert b.ticks == ticks + 1 and b.takeovers == 0


async def _until_listening(dsn: str) -> None:
    """Return once a session of this database has run LISTEN (bounded)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for _ in range(WAIT_S * 20):
            cursor = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND query LIKE 'LISTEN %%'"
            )
            row = await cursor.fetchone()
            if row is not None and row[0] > 0:
                return
            await asyncio.sleep(0.05)
    raise AssertionError("nobody listens for lease releases")


async def test_takeover_on_the_databases_clock(postgres_dsn: str, postgres_schema: str) -> None:
    """The same takeover in real time, lease time read from PostgreSQL's clock."""
    clock = SystemClock()
    async with AsyncExitStack() as stack:
        stores = [
            await stack.enter_async_context(
                open_postgres_store(postgres_dsn, schema=postgres_schema)
            )
            for _ in range(2)
        ]
        a = LeaseKeeper(
            PostgresClusterLeases(stores[0].pool), _settings("a", 1.0), clock, asyncio.sleep
        )
        b_settings = _settings("b", 1.0)
        async with _running(a) as a_task:
            b = await stack.enter_async_context(
                open_lease_keeper(PostgresClusterLeases(stores[1].pool), b_settings, clock)
            )
            await _until(b, lambda k: len(k.owned()) == 4 and len(a.owned()) == 4)
            a_task.cancel()
        await _until(b, lambda k: len(k.owned()) == PARTITIONS)
        assert b.takeovers == 4
