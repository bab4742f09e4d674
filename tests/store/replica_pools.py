"""Several replicas' views of one PostgreSQL schema in the cluster store tests: a store (its
own connection pool) each."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from apiary.store.postgres.store import PostgresStore, open_postgres_store


@asynccontextmanager
async def replica_stores(dsn: str, schema: str, count: int) -> AsyncIterator[list[PostgresStore]]:
    """`count` stores over `schema`, one connection pool each, closed on exit."""
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(open_postgres_store(dsn, schema=schema))
            for _ in range(count)
        ]
