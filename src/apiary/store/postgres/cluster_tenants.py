"""The tenants a cluster serves besides the default, in PostgreSQL (docs/cluster.md,
"Tenants"): the `cluster_tenants` table of the cluster's schema (schema version 29). A
replica that opens a tenant's engine adds the tenant; every replica reads the list and
opens the engines it lacks, so that each partition's owner runs the deadlines of every
tenant's messages. Errors arrive as StoreError (the pool's)."""

from __future__ import annotations

from apiary.store.postgres.pool import PostgresPool, fetch_all


class PostgresClusterTenants:
    """The cluster's list of tenants, on the pool of the cluster's schema."""

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool

    async def add(self, tenant: str) -> None:
        """Record that the cluster serves `tenant` (nothing if it is recorded already)."""
        async with self._pool.connection() as conn:
            await conn.execute(
                "INSERT INTO cluster_tenants (tenant, opened_at)"
                " VALUES (%s, extract(epoch FROM clock_timestamp())::float8)"
                " ON CONFLICT DO NOTHING",
                [tenant],
            )

    async def names(self) -> list[str]:
        """The tenants recorded, in name order."""
        rows = await fetch_all(self._pool, "SELECT tenant FROM cluster_tenants ORDER BY 1")
        return [str(row[0]) for row in rows]
