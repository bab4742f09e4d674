"""The PostgreSQL backend: what several coordinator replicas share (DESIGN.md section 8).

Ordering across replicas comes from counter rows, not sequences: an event append increments
the single `event_sequence` row and an admission increments the recipient's `inbox_offsets`
row, both with a statement that row-locks the counter until the transaction ends. Concurrent
writers (any process) are thereby serialized on that counter, so numbers are gap-free (a
rollback undoes the increment, unlike a SEQUENCE) and commit in increasing order, which is
what lets a reader resume "after N" without ever skipping a late commit. DLQ entry ids are
the exception: an identity column, so they only grow but may skip numbers after a rollback,
which the DLQ allows.

The aggregates are the SQL stores of `store.sql`, written once for both databases over
`store.sql.postgres.PostgresSqlDatabase`; the pool and query helpers are in `pool`.

Each store lives in one schema (default `apiary`), created on first open; tests isolate
themselves with a fresh schema each. The schema is chosen by the `schema` argument or an
`apiary_schema=NAME` query parameter of a postgresql:// URL (removed before libpq sees it).

Details and descriptors are JSONB, which cannot hold the character U+0000 (nor can TEXT):
such a value is refused here with StoreError while SQLite would keep it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import unquote

from psycopg import sql

from apiary.store.migrations import load_migrations, pending_migrations
from apiary.store.postgres.pool import (
    Connection,
    PostgresPool,
    fetch_rows,
    set_search_path,
)
from apiary.store.sql.postgres import PostgresSqlDatabase
from apiary.store.sql.store import SqlStore

DEFAULT_SCHEMA = "apiary"
SCHEMA_PARAMETER = "apiary_schema"


class PostgresStore(SqlStore):
    """Every aggregate in one PostgreSQL schema (see `open_postgres_store`)."""

    backend = "postgresql"

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool
        super().__init__(PostgresSqlDatabase(pool))

    @property
    def schema(self) -> str:
        """The schema holding this store's tables."""
        return self._pool.schema

    @property
    def pool(self) -> PostgresPool:
        """The connection pool: further aggregates are built on it."""
        return self._pool


@asynccontextmanager
async def open_postgres_store(
    dsn: str, *, schema: str | None = None, pool_size: int = 4
) -> AsyncIterator[PostgresStore]:
    """Connect, create the schema and apply pending migrations; close the pool on exit.

    `dsn` is a libpq connection string or URL; an `apiary_schema` URL parameter names the
    schema unless `schema` is given. Raises SchemaVersionError when the schema was migrated
    by a newer Apiary, StoreError when the server cannot be reached.
    """
    conninfo, url_schema = split_schema_parameter(dsn)
    pool = PostgresPool(conninfo, schema or url_schema or DEFAULT_SCHEMA, size=pool_size)
    try:
        async with pool.connection() as conn:
            await migrate_postgres(conn, pool.schema)
        yield PostgresStore(pool)
    finally:
        await pool.close()


def split_schema_parameter(dsn: str) -> tuple[str, str | None]:
    """Remove `apiary_schema=NAME` from a URL's query; return (dsn for libpq, NAME or None).

    The other parameters are kept byte for byte (re-encoding could change what libpq reads).
    """
    base, separator, query = dsn.partition("?")
    if not separator:
        return dsn, None
    kept: list[str] = []
    schema: str | None = None
    for part in query.split("&"):
        key, _, value = part.partition("=")
        if unquote(key) == SCHEMA_PARAMETER:
            schema = unquote(value)
        elif part:
            kept.append(part)
    return (f"{base}?{'&'.join(kept)}" if kept else base), schema


async def migrate_postgres(
    conn: Connection, schema: str, *, target: int | None = None
) -> list[int]:
    """Create `schema` if needed and apply its pending migrations in one transaction.

    A transaction-level advisory lock keyed on the schema makes replicas that start together
    take turns. `target` stops at that version (tests build schemas of older versions with
    it). Returns the versions applied; raises SchemaVersionError (changing nothing) when the
    schema is newer than this code.
    """
    async with conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            [f"apiary.schema_migrations:{schema}"],
        )
        found = await fetch_rows(conn, "SELECT 1 FROM pg_namespace WHERE nspname = %s", [schema])
        if not found:  # only then: CREATE SCHEMA IF NOT EXISTS needs CREATE on the database
            await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        await set_search_path(conn, schema)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY,"
            " name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        rows = await fetch_rows(conn, "SELECT version FROM schema_migrations")
        applied = [row[0] for row in rows]
        todo = pending_migrations(load_migrations("postgres"), applied, target=target)
        for migration in todo:
            await conn.execute(migration.sql)  # no parameters: several statements allowed
            await conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                [migration.version, migration.name],
            )
    return [m.version for m in todo]
