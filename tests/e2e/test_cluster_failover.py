"""Failover of a three-replica cluster under load (docs/cluster.md; issue 27's tests): three
`apiary serve --cluster` processes on one PostgreSQL schema, SDK agents and producers each
on a different replica and given all three addresses (tests/e2e/cluster_load.py).

- One replica SIGKILLed mid-load: its partitions are taken over (the time it took is
  printed), its agents and producers move to the others on their own, and nothing accepted
  is lost, nothing refused is delivered, each producer's messages reach each agent in the
  order sent, and no idempotency token is run as two messages.
- A rolling restart (each replica in turn stopped with SIGTERM and started again) under
  load: the same checks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest

from apiary.sdk.connection import Connection
from tests.e2e.cluster_load import (
    LEASE_S,
    PARTITIONS,
    WAIT_S,
    Load,
    Replica,
    lapsed_or_held_by,
    owned_by,
    settle,
)

pytestmark = pytest.mark.postgres

REPLICAS = 3
PER_PAIR = 250
"""Messages per producer and agent in the SIGKILL test: 3 x 3 x 250 = 2250."""
TAKEOVER_BOUND_S = LEASE_S + 10.0
"""Generous: the keeper takes a dead replica's partitions over as its leases lapse, within
`lease_s` of its last renewal; the rest is for a loaded machine."""


@asynccontextmanager
async def _cluster(tmp_path: Path, dsn: str, schema: str) -> AsyncIterator[list[Replica]]:
    """Three replicas, each holding its share of the partitions."""
    url = f"{dsn}?apiary_schema={schema}"
    replicas = [Replica(tmp_path, url, f"r{i}") for i in range(REPLICAS)]
    try:
        await replicas[0].start()  # the first migrates the schema
        await asyncio.gather(*(replica.start() for replica in replicas[1:]))
        for replica in replicas:
            await _holds_its_share(dsn, schema, replica)
        yield replicas
    except BaseException:
        for replica in replicas:
            print(f"--- {replica.replica_id}'s log:\n{replica.log_tail()}")
        raise
    finally:
        for replica in replicas:
            await replica.close()


async def _holds_its_share(dsn: str, schema: str, replica: Replica) -> None:
    share = PARTITIONS // REPLICAS

    async def holds() -> bool:
        return await owned_by(dsn, schema, replica.replica_id) >= share

    await settle(holds, f"{replica.replica_id} holds {share} partitions")


def _addresses(replicas: list[Replica], first: int) -> str:
    """Every replica's address, `first`'s first."""
    order = replicas[first:] + replicas[:first]
    return ",".join(r.address for r in order)


@asynccontextmanager
async def _load(
    replicas: list[Replica], per_pair: int
) -> AsyncIterator[tuple[Load, asyncio.Future[list[None]]]]:
    """Agent a<i> on replica i, producer p<i> on replica i + 1; every producer sending to
    every agent. Yields the load and the future of the producers' work."""
    agents = [f"a{i}" for i in range(REPLICAS)]
    load = Load(per_pair)
    async with AsyncExitStack() as stack:
        consumers: list[asyncio.Task[None]] = []
        senders: list[Connection] = []
        for i in range(REPLICAS):
            agent = Connection(agents[i], coordinator=_addresses(replicas, i))
            producer = Connection(f"p{i}", coordinator=_addresses(replicas, (i + 1) % REPLICAS))
            for conn in (agent, producer):
                await conn.start()
                stack.push_async_callback(_closed, conn)
            consumers.append(asyncio.create_task(load.consume(agent)))
            senders.append(producer)
        producing = asyncio.gather(*(load.produce(s, a) for s in senders for a in agents))
        try:
            yield load, producing
        finally:
            producing.cancel()
            for task in consumers:
                task.cancel()
            await asyncio.gather(producing, *consumers, return_exceptions=True)


async def _closed(conn: Connection) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.stop(deregister=False), 5)


async def test_a_replica_killed_mid_load_loses_nothing_and_its_partitions_are_taken_over(
    tmp_path: Path, postgres_dsn: str, postgres_schema: str
) -> None:
    total = REPLICAS * REPLICAS * PER_PAIR
    async with (
        _cluster(tmp_path, postgres_dsn, postgres_schema) as replicas,
        _load(replicas, PER_PAIR) as (load, producing),
    ):
        await load.progress(total // 3)
        victim = replicas[0]  # hosts agent a0's stream and producer p2's calls
        victim.kill()
        assert victim.proc is not None
        await victim.proc.wait()

        async def taken_over() -> bool:
            return await lapsed_or_held_by(postgres_dsn, postgres_schema, "r0") == 0

        takeover_s = await settle(taken_over, "r0's partitions taken over")
        print(
            f"SIGKILL of r0: its partitions taken over after {takeover_s:.2f} s (lease_s {LEASE_S})"
        )
        await asyncio.wait_for(producing, WAIT_S * 2)
        states = await load.settled(postgres_dsn, postgres_schema)
        print(load.summary())
    assert load.answered == total
    assert not load.refused  # every send was answered accepted in the end
    load.check(states)
    assert takeover_s < TAKEOVER_BOUND_S


async def test_a_rolling_restart_under_load_loses_nothing_and_keeps_order(
    tmp_path: Path, postgres_dsn: str, postgres_schema: str
) -> None:
    async with (
        _cluster(tmp_path, postgres_dsn, postgres_schema) as replicas,
        _load(replicas, 100_000) as (load, producing),
    ):
        await load.progress(150)
        for replica in replicas:
            assert await replica.stop() == 0, replica.log_tail()
            await replica.start()
            await _holds_its_share(postgres_dsn, postgres_schema, replica)
            await load.progress(load.answered + 100)  # the load goes on meanwhile
        load.stop.set()
        await asyncio.wait_for(producing, WAIT_S)
        states = await load.settled(postgres_dsn, postgres_schema)
        print(load.summary())
    assert not load.refused, "\n".join(f"--- {r.replica_id}:\n{r.log_tail()}" for r in replicas)
    load.check(states)
