"""The agents' stream holder rows in PostgreSQL (`apiary.store.postgres.cluster_streams`;
docs/cluster.md, "One stream per agent"): the store decides which replica's stream of an
agent is live, with the holder's liveness read from the replicas' heartbeats."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from apiary.core.cluster.streams import StreamVerdict
from apiary.core.records import MessageState, StoredMessage
from apiary.store.cluster import FencedError, Me
from apiary.store.postgres.cluster import PostgresClusterLeases
from apiary.store.postgres.cluster_streams import PostgresStreamHolders
from apiary.store.postgres.cluster_work import PostgresClusterWork
from apiary.store.postgres.store import open_postgres_store

pytestmark = pytest.mark.postgres

A, B = Me("a", "a1"), Me("b", "b1")


async def test_a_live_replicas_stream_is_refused_without_proof_superseded_with_it(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        leases, holders = PostgresClusterLeases(store.pool), PostgresStreamHolders(store.pool)
        await leases.join(A, 4, 60.0)
        await leases.join(B, 4, 60.0)
        first = await holders.claim(A, "bob", take_over=False)
        assert (first.verdict, first.holder.generation) == (StreamVerdict.GRANTED, 1)
        refused = await holders.claim(B, "bob", take_over=False)
        assert refused.verdict is StreamVerdict.REFUSED
        assert refused.holder.replica_id == "a"
        took = await holders.claim(B, "bob", take_over=True)
        assert (took.verdict, took.holder.generation) == (StreamVerdict.SUPERSEDES, 2)
        # A's release of its older generation frees nothing: B's stream holds the row.
        assert not await holders.release(A, "bob", 1)
        assert (await holders.holders(["bob"]))["bob"].replica_id == "b"
        assert await holders.release(B, "bob", 2)
        assert (await holders.holders(["bob", "carol"]))["bob"].replica_id == ""


async def test_a_gone_replicas_stream_is_no_obstacle(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        leases, holders = PostgresClusterLeases(store.pool), PostgresStreamHolders(store.pool)
        await leases.join(A, 4, 60.0)
        await leases.join(B, 4, 60.0)
        await holders.claim(A, "bob", take_over=False)
        await leases.leave(A)  # (as a replica whose heartbeat expired: no row that beats)
        claim = await holders.claim(B, "bob", take_over=False)
        assert (claim.verdict, claim.holder.replica_id) == (StreamVerdict.GRANTED, "b")


async def test_claims_of_one_agent_at_once_are_serialized_on_its_row(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        leases, holders = PostgresClusterLeases(store.pool), PostgresStreamHolders(store.pool)
        await leases.join(A, 4, 60.0)
        await leases.join(B, 4, 60.0)
        claims = await asyncio.gather(
            *(holders.claim(me, "bob", take_over=False) for me in (A, B, A, B))
        )
        granted = [c for c in claims if c.granted]
        # The first claim is granted; the other replica's are refused, the same replica's
        # granted again (its own streams decided): generations never repeat.
        generations = sorted(c.holder.generation for c in granted)
        assert generations == list(range(1, len(granted) + 1))
        winner = next(c for c in claims if c.holder.generation == 1).holder.replica_id
        assert all(c.holder.replica_id == winner for c in claims)


async def test_a_message_past_the_maximum_age_is_aged_only_while_its_agent_streams_nowhere(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        leases, holders = PostgresClusterLeases(store.pool), PostgresStreamHolders(store.pool)
        work = PostgresClusterWork(store.pool, leases)
        await leases.join(A, 1, 60.0)
        (lease,) = await leases.acquire(A, [0], 60.0)
        old = StoredMessage("m-old", "bob", "alice", "c", 2, b"x", MessageState.RECEIVED, 1.0, 1.0)
        await store.messages.admit_many([
            old,
            replace(old, message_id="m-new", created_at=50.0),
            replace(old, message_id="m-note", producer_id="coordinator"),
            replace(old, message_id="m-read", state=MessageState.READ, acked_stage="READ"),
        ])  # fmt: skip
        assert [m.message_id for m in await work.aged(10.0, 10)] == ["m-old"]
        epoch = lease.lease.epoch
        claimed = await work.claim_aged(A, 0, epoch, "m-old", 10.0)
        assert claimed is not None and claimed.message_id == "m-old"
        # Bob streams on A (a live replica): nothing of his ages out.
        await holders.claim(A, "bob", take_over=False)
        assert await work.aged(10.0, 10) == []
        assert await work.claim_aged(A, 0, epoch, "m-old", 10.0) is None
        with pytest.raises(FencedError):
            await work.claim_aged(A, 0, epoch + 1, "m-old", 10.0)
