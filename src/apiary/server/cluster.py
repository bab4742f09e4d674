"""Cluster mode's wiring on the server side (docs/cluster.md): the store's claim or the
replica's membership, the cluster node over the PostgreSQL store's pool, and the parts of
the replica for each other tenant's engine, over its schema (`tenant_replicas`)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Final

from apiary.engine.assembly import Engine, Runtime
from apiary.engine.cluster.node import (
    ClusterNode,
    EngineReplica,
    open_cluster_node,
    open_engine_replica,
)
from apiary.engine.cluster.settings import ClusterSettings
from apiary.engine.deadlines import Sleep
from apiary.errors import ApiaryError, ValidationError
from apiary.server.cluster_forward import Forwarder
from apiary.server.cluster_hitl import ForwardedHitl
from apiary.store.claim import Claim, Holder, claim_store
from apiary.store.errors import StoreError
from apiary.store.postgres.cluster import PostgresClusterLeases, qualified
from apiary.store.postgres.cluster_leader import PostgresClusterLeader
from apiary.store.postgres.cluster_streams import PostgresStreamHolders
from apiary.store.postgres.cluster_tenants import PostgresClusterTenants
from apiary.store.postgres.cluster_work import PostgresClusterWork
from apiary.store.postgres.store import PostgresStore
from apiary.store.protocols import Store

log = logging.getLogger("apiary.cluster")

TENANTS_POLL_S: Final = 1.0
"""How often a replica reads the cluster's list of tenants (`follow_tenants`)."""


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
        # The leader's components write under its term only (docs/cluster.md, "The leader").
        store.leader_writes.fence = node.leader
        yield node


TenantReplicas = Callable[[str, Store, Engine], AbstractAsyncContextManager[EngineReplica]]
"""Opens a tenant's engine's parts of this replica (`tenant_replicas`)."""


def tenant_replicas(
    node: ClusterNode, cluster: Store, runtime: Runtime, forwarder: Forwarder | None = None
) -> TenantReplicas:
    """How another tenant's engine becomes part of the replica `node` (the default tenant's,
    on `cluster`): over the tenant's schema (its messages, its stream holders, its notes,
    its relay to the leader), its deadlines fired by the owner of the agent's partition in
    the one lease table, fenced by it, and its leader's components run by the one leader,
    under its lease (`EngineReplica.leader`, which joins the terms once the tenant's engine
    is loaded; docs/cluster.md, "Tenants"). The tenant is recorded in the cluster's list,
    for the other replicas to open it too (`follow_tenants`)."""
    assert isinstance(cluster, PostgresStore)
    leases = PostgresClusterLeases(cluster.pool)
    roster = PostgresClusterTenants(cluster.pool)

    @asynccontextmanager
    async def replicate(tenant: str, store: Store, engine: Engine) -> AsyncIterator[EngineReplica]:
        if not isinstance(store, PostgresStore):
            raise ValidationError(
                f"tenant {tenant[:64]!r} in cluster mode needs a PostgreSQL store",
                {"field": "cluster.enabled"},
            )
        work = PostgresClusterWork(store.pool, leases)
        holders = PostgresStreamHolders(store.pool, leases.schema)
        name = f"apiary-cluster-{node.keeper.replica_id}-t-{tenant[:32]}"
        async with open_engine_replica(
            engine, store.messages, work, holders, node.keeper, runtime.clock, runtime.sleep,
            name=name,
        ) as part:  # fmt: skip
            if node.leader is not None:
                relay = PostgresClusterLeader(store.pool, cluster_schema=leases.schema)
                part.leader = node.leader.tenant_part(tenant, relay, engine)
                # Its leader's components write under the cluster's leader's term, and
                # its own components' HITL invocations are the leader's (in the tenant).
                store.leader_writes.fence = node.leader
                store.leader_writes.table = qualified(leases.schema, "cluster_leader")
                if forwarder is not None:
                    engine.hitl.leader = ForwardedHitl(
                        forwarder, part.leader.relay, engine.hitl.get, tenant
                    )
            node.tenants[tenant] = part
            await roster.add(tenant)  # every replica opens it too (`follow_tenants`)
            try:
                yield part
            finally:
                node.tenants.pop(tenant, None)
                if part.leader is not None and node.leader is not None:
                    if not part.halted:
                        await part.leader.leave()
                    node.leader.forget(tenant)

    return replicate


async def follow_tenants(
    cluster: Store, opened: Callable[[str], object | None],
    open_tenant: Callable[[str], Awaitable[object]], sleep: Sleep,
    poll_s: float = TENANTS_POLL_S,
) -> None:  # fmt: skip
    """Until cancelled: every `poll_s`, open the engine of each tenant in the cluster's list
    (another replica opened it) that is not `opened` here, so that this replica runs the
    deadlines of its messages in the partitions it owns and follows its agents' streams.
    A tenant that cannot be opened now is tried again at the next poll."""
    assert isinstance(cluster, PostgresStore)
    roster = PostgresClusterTenants(cluster.pool)
    while True:
        for tenant in await roster.names():
            if opened(tenant) is not None:
                continue
            try:
                await open_tenant(tenant)
            except (ApiaryError, StoreError) as exc:
                log.warning("cluster: cannot open tenant %s yet: %s", tenant[:64], exc)
        await sleep(poll_s)
