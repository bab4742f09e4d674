"""Each engine's share of the leadership (engine/cluster/leader_part.py; docs/cluster.md,
"Tenants"): the one leader's lease, on the real PostgreSQL with lease time on a FakeClock,
drives the default tenant's share and every other tenant's. A tenant's share relays until
it joins; joined while this replica leads, it loads its components and serves at once;
the term's suspension stops every share, its renewal resumes them, and a share that joined
while the term was suspended is loaded then; a share that leaves relays again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from apiary.engine.assembly import Engine, Runtime, build_engine
from apiary.engine.cluster.leader_part import LeaderPart
from apiary.engine.cluster.leader_role import LeaderRole
from apiary.engine.settings import RouterSettings
from apiary.store.cluster import Me
from apiary.store.memory.store import MemoryStore
from apiary.store.postgres.cluster_leader import PostgresClusterLeader
from apiary.store.postgres.store import open_postgres_store
from apiary.testing.clock import FakeClock

pytestmark = pytest.mark.postgres

L = 3.0
A = Me("replica-a", "inc-a", "10.0.0.1:50051")
WAIT_S = 10.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def leader(
    postgres_dsn: str, postgres_schema: str, clock: FakeClock
) -> AsyncIterator[PostgresClusterLeader]:
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        yield PostgresClusterLeader(store.pool, clock)


def _engine(clock: FakeClock) -> Engine:
    return build_engine(MemoryStore(), RouterSettings(), Runtime(clock=clock))


def _counted(engine: Engine, name: str, loads: list[str]) -> Engine:
    """`engine`, each load of its Scheduler (the leader's components' loading) noted."""
    load = engine.scheduler.load

    async def counted() -> int:
        loads.append(name)
        return await load()

    engine.scheduler.load = counted  # type: ignore[method-assign]
    return engine


def _relays(engine: Engine, part: LeaderPart) -> bool:
    """Whether the engine's leader's components hand their inputs to the relay."""
    return engine.scheduler.deputy is part.relay and not engine.hitl.leading


async def _loaded(*parts: LeaderPart) -> None:
    for part in parts:
        await asyncio.wait_for(part.loaded.wait(), WAIT_S)


async def test_each_tenants_share_follows_the_one_term(
    leader: PostgresClusterLeader, clock: FakeClock
) -> None:
    loads: list[str] = []
    default, acme, late = (_counted(_engine(clock), n, loads) for n in ("default", "acme", "late"))
    role = LeaderRole(leader, A, L, default, clock, asyncio.sleep)
    await role.seed()
    try:
        shared = role.tenant_part("acme", leader, acme)
        assert _relays(acme, shared) and not role.leads("acme")
        await role.lease.tick()  # (the term begins: the default tenant's share loads)
        await _loaded(role.part)
        assert role.leads() and not shared.loaded.is_set() and _relays(acme, shared)
        await shared.join()  # (the tenant's engine opened on the leader: loaded at once)
        await _loaded(shared)
        assert role.leads("acme") and acme.scheduler.deputy is None and acme.hitl.leading
        # The term runs past its local deadline: every share stops and relays.
        clock.advance(L)
        await role.lease.check_term()
        assert not role.leads() and not role.leads("acme") and _relays(acme, shared)
        joined_late = role.tenant_part("late", leader, late)
        await joined_late.join()
        assert not joined_late.loaded.is_set() and _relays(late, joined_late)
        # Taken again with the next epoch: every share goes on, the late one loaded now.
        await role.lease.tick()
        await _loaded(role.part, shared, joined_late)
        assert role.leads("late") and late.scheduler.deputy is None
        assert loads == ["default", "acme", "late"]  # (each once; none loaded twice)
        await joined_late.leave()
        role.forget("late")
        assert "late" not in role.parts and _relays(late, joined_late)
        assert role.leads("acme")
    finally:
        role.halt()
        for task in role.tasks:
            task.cancel()
        await asyncio.gather(*role.tasks, return_exceptions=True)
