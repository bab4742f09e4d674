"""The PostgreSQL backend: what several coordinator replicas share (DESIGN.md section 8).

Ordering across replicas comes from counter rows, not sequences: an event append increments
the single `event_sequence` row and an admission increments the recipient's `inbox_offsets`
row, both with a statement that row-locks the counter until the transaction ends. Concurrent
writers (any process) are thereby serialized on that counter, so numbers are gap-free (a
rollback undoes the increment, unlike a SEQUENCE) and commit in increasing order, which is
what lets a reader resume "after N" without ever skipping a late commit. DLQ entry ids are
the exception: an identity column, so they only grow but may skip numbers after a rollback,
which the DLQ allows.

The event log and the registry are here; the other aggregates are in `postgres_messages`,
`postgres_idempotency`, `postgres_dlq`, `postgres_hitl`, `postgres_tasks` and
`postgres_handoffs`, `postgres_worktrees`, the pool and query helpers in `postgres_pool`.
`postgres_tools`, the pool and query helpers in `postgres_pool`.
`postgres_swarm`, the pool and query helpers in `postgres_pool`.

Each store lives in one schema (default `apiary`), created on first open; tests isolate
themselves with a fresh schema each. The schema is chosen by the `schema` argument or an
`apiary_schema=NAME` query parameter of a postgresql:// URL (removed before libpq sees it).

Details and descriptors are JSONB, which cannot hold the character U+0000 (nor can TEXT):
such a value is refused here with StoreError while SQLite would keep it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from urllib.parse import unquote

from psycopg import sql

from apiary.core.events import Event, EventDraft, EventFilter
from apiary.core.records import AgentRecord
from apiary.store.json_codec import dump_json
from apiary.store.migrations import load_migrations, pending_migrations
from apiary.store.postgres.dlq import PostgresDlqStore
from apiary.store.postgres.handoffs import PostgresHandoffStore
from apiary.store.postgres.hitl import PostgresHitlStore
from apiary.store.postgres.idempotency import PostgresIdempotencyStore
from apiary.store.postgres.messages import PostgresMessageStore
from apiary.store.postgres.negotiations import (
    PostgresArtifactStore,
    PostgresNegotiationStore,
)
from apiary.store.postgres.pool import (
    Connection,
    PostgresPool,
    fetch_all,
    fetch_rows,
    scalar,
    set_search_path,
)
from apiary.store.postgres.rooms import PostgresRoomStore
from apiary.store.postgres.swarm import PostgresSwarmStore
from apiary.store.postgres.tasks import PostgresTaskStore
from apiary.store.postgres.tools import PostgresToolStore
from apiary.store.postgres.workflows import PostgresWorkflowStore
from apiary.store.postgres.worktrees import PostgresWorktreeStore
from apiary.store.sql_rows import (
    AGENT_COLUMNS,
    EVENT_COLUMNS,
    agent_from_row,
    agent_row,
    check_limit,
    event_filter_clauses,
    event_from_row,
)

DEFAULT_SCHEMA = "apiary"
SCHEMA_PARAMETER = "apiary_schema"


class PostgresEventLog:
    """`EventLog` in the `events` table, numbered through the `event_sequence` row."""

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool

    async def append(self, drafts: Sequence[EventDraft]) -> list[Event]:
        """Append the drafts atomically, in order; return them with their sequences."""
        if not drafts:
            return []
        details = [dump_json(d.details) for d in drafts]
        async with self._pool.connection() as conn, conn.transaction():
            cursor = await conn.execute(
                "UPDATE event_sequence SET last_sequence = last_sequence + %s"
                " RETURNING last_sequence",
                [len(drafts)],
            )
            first = await scalar(cursor) - len(drafts) + 1
            rows = [
                (first + i, d.event_type, d.actor, d.ts, d.correlation_id, d.agent_id, text, d.hlc)
                for i, (d, text) in enumerate(zip(drafts, details, strict=True))
            ]
            async with conn.cursor() as insert:
                await insert.executemany(
                    f"INSERT INTO events ({EVENT_COLUMNS})"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s)",
                    rows,
                )
        return [Event.from_draft(first + i, draft) for i, draft in enumerate(drafts)]

    async def read(
        self, after: int = 0, limit: int = 500, where: EventFilter | None = None
    ) -> list[Event]:
        """Events with sequence > `after` that match `where`, ascending, at most `limit`."""
        check_limit(limit)
        terms = event_filter_clauses(where, after, "%s")
        if terms is None:
            return []
        clauses, params = terms
        query = (
            f"SELECT {EVENT_COLUMNS} FROM events WHERE {' AND '.join(clauses)}"
            " ORDER BY sequence LIMIT %s"
        )
        params.append(limit)
        rows = await fetch_all(self._pool, query, params)
        return [event_from_row(row) for row in rows]

    async def last_sequence(self) -> int:
        """The highest sequence appended so far (0 for an empty log)."""
        async with self._pool.connection() as conn:
            return await scalar(await conn.execute("SELECT last_sequence FROM event_sequence"))


class PostgresAgentStore:
    """`AgentStore` in the `agents` table."""

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool

    async def put(self, agent: AgentRecord) -> None:
        """Insert or replace the agent with this agent_id."""
        row = agent_row(agent)
        async with self._pool.connection() as conn:
            await conn.execute(
                f"INSERT INTO agents ({AGENT_COLUMNS})"
                " VALUES (%s, %s, %s, %s, %s, %s::jsonb)"
                " ON CONFLICT (agent_id) DO UPDATE SET name = EXCLUDED.name,"
                " state = EXCLUDED.state, registered_at = EXCLUDED.registered_at,"
                " last_heartbeat_at = EXCLUDED.last_heartbeat_at,"
                " descriptor = EXCLUDED.descriptor",
                row,
            )

    async def get(self, agent_id: str) -> AgentRecord | None:
        """The agent, or None."""
        query = f"SELECT {AGENT_COLUMNS} FROM agents WHERE agent_id = %s"
        rows = await fetch_all(self._pool, query, [agent_id])
        return agent_from_row(rows[0]) if rows else None

    async def list(self) -> list[AgentRecord]:
        """All agents, ordered by agent_id (code point order: the column is COLLATE "C")."""
        rows = await fetch_all(
            self._pool, f"SELECT {AGENT_COLUMNS} FROM agents ORDER BY agent_id", []
        )
        return [agent_from_row(row) for row in rows]

    async def delete(self, agent_id: str) -> bool:
        """Remove the agent; False when it was not there."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute("DELETE FROM agents WHERE agent_id = %s", [agent_id])
            return cursor.rowcount > 0


class PostgresStore:
    """Every aggregate in one PostgreSQL schema (see `open_postgres_store`)."""

    backend = "postgresql"

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool
        self.events = PostgresEventLog(pool)
        self.agents = PostgresAgentStore(pool)
        self.messages = PostgresMessageStore(pool)
        self.idempotency = PostgresIdempotencyStore(pool)
        self.dlq = PostgresDlqStore(pool)
        self.hitl = PostgresHitlStore(pool)
        self.tasks = PostgresTaskStore(pool)
        self.workflows = PostgresWorkflowStore(pool)
        self.handoffs = PostgresHandoffStore(pool)
        self.worktrees = PostgresWorktreeStore(pool)
        self.rooms = PostgresRoomStore(pool)
        self.tools = PostgresToolStore(pool)
        self.negotiations = PostgresNegotiationStore(pool)
        self.artifacts = PostgresArtifactStore(pool)
        self.swarm = PostgresSwarmStore(pool)

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
