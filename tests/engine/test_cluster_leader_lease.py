"""The leader's lease as one replica keeps it (engine/cluster/leader.py), on the real
PostgreSQL with lease time on a FakeClock: a term that runs past its local deadline stops
the leader's work; renewed late, or its lapsed lease taken again with the very next epoch
(nobody led meanwhile), it goes on; once another replica's term began, this replica has
lost the leadership for good."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest

from apiary.engine.cluster.leader import LeaderLease, LeadershipLostError
from apiary.store.cluster import Me
from apiary.store.postgres.cluster_leader import PostgresClusterLeader
from apiary.store.postgres.store import open_postgres_store
from apiary.testing.clock import FakeClock

pytestmark = pytest.mark.postgres

L = 3.0
A, B = Me("replica-a", "inc-a", "10.0.0.1:50051"), Me("replica-b", "inc-b", "10.0.0.2:50051")


async def _no_sleep(_seconds: float) -> None:
    return None


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def leases(
    postgres_dsn: str, postgres_schema: str, clock: FakeClock
) -> AsyncIterator[tuple[LeaderLease, LeaderLease, list[str]]]:
    """Two replicas' leader leases on one schema, and what their callbacks saw."""
    seen: list[str] = []
    async with AsyncExitStack() as stack:
        made = []
        for me in (A, B):
            store = await stack.enter_async_context(
                open_postgres_store(postgres_dsn, schema=postgres_schema)
            )
            leader = PostgresClusterLeader(store.pool, clock)
            await leader.seed("key")
            lease = LeaderLease(leader, me, L, clock, _no_sleep)
            name = me.replica_id[-1]

            async def lead(epoch: int, name: str = name) -> None:
                seen.append(f"{name} leads {epoch}")

            async def suspend(name: str = name) -> None:
                seen.append(f"{name} suspended")

            async def resume(name: str = name) -> None:
                seen.append(f"{name} resumed")

            lease.on_lead, lease.on_suspend, lease.on_resume = lead, suspend, resume
            made.append(lease)
        yield made[0], made[1], seen


async def test_a_term_renewed_late_goes_on_and_one_taken_over_is_lost(
    leases: tuple[LeaderLease, LeaderLease, list[str]], clock: FakeClock
) -> None:
    a, b, seen = leases
    await a.tick()
    await b.tick()
    assert (a.epoch(), b.epoch(), seen) == (1, None, ["a leads 1"])
    assert b.address == A.address  # (b forwards to a)
    # a's term runs past its local deadline (and the lease lapses): its work stops ...
    clock.advance(L)
    await a.check_term()
    assert (a.leads(), seen[-1]) == (False, "a suspended")
    # ... and nobody took the lease meanwhile: taken again at epoch 2, the term goes on.
    await a.tick()
    assert (a.epoch(), seen[-1]) == (2, "a resumed")
    # Now it lapses and b takes it over before a comes back: a has lost it for good.
    clock.advance(L)
    await a.check_term()
    await b.tick()
    assert (b.epoch(), seen[-2:]) == (3, ["a suspended", "b leads 3"])
    with pytest.raises(LeadershipLostError, match="another term began"):
        await a.tick()
    assert a.epoch() is None
