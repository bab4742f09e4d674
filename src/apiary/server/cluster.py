"""Cluster mode's wiring on the server side (docs/cluster.md): the store's claim or the
replica's membership, and the cluster node over the PostgreSQL store's pool."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from apiary.engine.assembly import Engine, Runtime
from apiary.engine.cluster.node import ClusterNode, open_cluster_node
from apiary.engine.cluster.settings import ClusterSettings
from apiary.errors import ValidationError
from apiary.store.claim import Claim, Holder, claim_store
from apiary.store.postgres.cluster import PostgresClusterLeases
from apiary.store.postgres.cluster_leader import PostgresClusterLeader
from apiary.store.postgres.cluster_streams import PostgresStreamHolders
from apiary.store.postgres.cluster_work import PostgresClusterWork
from apiary.store.postgres.store import PostgresStore
from apiary.store.protocols import Store


def store_claim(
    store: Store, holder: Holder, settings: ClusterSettings
) -> AbstractAsyncContextManager[Claim]:
    """The store's exclusive claim (`apiary.store.claim`), except in cluster mode, where
    replicas share the store (their membership is the lease table's) and the claim is a
    plain record of the holder that no one takes."""
    if settings.enabled:
        return _shared(holder)
    return claim_store(store, holder)


@asynccontextmanager
async def _shared(holder: Holder) -> AsyncIterator[Claim]:
    yield Claim(holder)


@asynccontextmanager
async def open_replica(
    settings: ClusterSettings, store: Store, engine: Engine, runtime: Runtime, address: str
) -> AsyncIterator[ClusterNode | None]:
    """`engine` as a replica of the cluster on `store` for the duration of the block
    (`open_cluster_node`); None outside cluster mode."""
    if not settings.enabled:
        yield None
        return
    if not isinstance(store, PostgresStore):
        raise ValidationError(
            "[cluster] enabled needs a PostgreSQL store: replicas share one database server",
            {"field": "cluster.enabled"},
        )
    leases = PostgresClusterLeases(store.pool)
    work = PostgresClusterWork(store.pool, leases)
    async with open_cluster_node(
        engine, store.messages, leases, work, PostgresStreamHolders(store.pool), settings,
        runtime.clock, runtime.sleep, address=address, leader=PostgresClusterLeader(store.pool),
    ) as node:  # fmt: skip
        yield node
