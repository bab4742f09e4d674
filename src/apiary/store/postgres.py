"""The PostgreSQL backend: what several coordinator replicas share (DESIGN.md section 8).

Ordering across replicas comes from counter rows, not sequences: an event append increments
the single `event_sequence` row and an admission increments the recipient's `inbox_offsets`
row, both with a statement that row-locks the counter until the transaction ends. Concurrent
writers (any process) are thereby serialized on that counter, so numbers are gap-free (a
rollback undoes the increment, unlike a SEQUENCE) and commit in increasing order, which is
what lets a reader resume "after N" without ever skipping a late commit.

Each store lives in one schema (default `apiary`), created on first open; tests isolate
themselves with a fresh schema each. The schema is chosen by the `schema` argument or an
`apiary_schema=NAME` query parameter of a postgresql:// URL (removed before libpq sees it).

Details and descriptors are JSONB, which cannot hold the character U+0000 (nor can TEXT):
such a value is refused here with StoreError while SQLite would keep it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import unquote

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from apiary.core.events import Event, EventDraft, EventFilter
from apiary.core.records import AgentRecord, MessageState, StoredMessage
from apiary.store.errors import DuplicateMessageError
from apiary.store.json_codec import dump_json
from apiary.store.migrations import load_migrations, pending_migrations
from apiary.store.postgres_pool import Connection, PostgresPool, set_search_path
from apiary.store.sql_rows import (
    AGENT_COLUMNS,
    EVENT_COLUMNS,
    MESSAGE_COLUMNS,
    agent_from_row,
    agent_row,
    check_limit,
    event_from_row,
    message_from_row,
    message_row,
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
            first = await _scalar(cursor) - len(drafts) + 1
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
        clauses = ["sequence > %s"]
        params: list[Any] = [after]
        if where is not None:
            if where.correlation_id is not None:
                clauses.append("correlation_id = %s")
                params.append(where.correlation_id)
            if where.agent_id is not None:
                clauses.append("agent_id = %s")
                params.append(where.agent_id)
            if where.event_types is not None:
                if not where.event_types:
                    return []
                clauses.append("event_type = ANY(%s)")
                params.append(sorted(where.event_types))
        query = (
            f"SELECT {EVENT_COLUMNS} FROM events WHERE {' AND '.join(clauses)}"
            " ORDER BY sequence LIMIT %s"
        )
        params.append(limit)
        rows = await _fetch_all(self._pool, query, params)
        return [event_from_row(row) for row in rows]

    async def last_sequence(self) -> int:
        """The highest sequence appended so far (0 for an empty log)."""
        async with self._pool.connection() as conn:
            return await _scalar(await conn.execute("SELECT last_sequence FROM event_sequence"))


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
        rows = await _fetch_all(self._pool, query, [agent_id])
        return agent_from_row(rows[0]) if rows else None

    async def list(self) -> list[AgentRecord]:
        """All agents, ordered by agent_id (code point order: the column is COLLATE "C")."""
        rows = await _fetch_all(
            self._pool, f"SELECT {AGENT_COLUMNS} FROM agents ORDER BY agent_id", []
        )
        return [agent_from_row(row) for row in rows]

    async def delete(self, agent_id: str) -> bool:
        """Remove the agent; False when it was not there."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute("DELETE FROM agents WHERE agent_id = %s", [agent_id])
            return cursor.rowcount > 0


class PostgresMessageStore:
    """`MessageStore` in the `messages` table, offsets counted in `inbox_offsets`."""

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool

    async def admit(self, message: StoredMessage) -> StoredMessage:
        """Durably record a new message with the recipient's next inbox offset."""
        async with self._pool.connection() as conn, conn.transaction():
            offset = await _next_offset(conn, message.recipient)
            cursor = await conn.execute(
                f"INSERT INTO messages ({MESSAGE_COLUMNS})"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (message_id) DO NOTHING RETURNING inbox_offset",
                message_row(message, offset),
            )
            if await cursor.fetchone() is None:
                # Raising inside the transaction rolls back the offset increment too.
                raise DuplicateMessageError(message.message_id)
        return dataclasses.replace(message, offset=offset)

    async def get(self, message_id: str) -> StoredMessage | None:
        """The message, or None."""
        query = f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE message_id = %s"
        rows = await _fetch_all(self._pool, query, [message_id])
        return message_from_row(rows[0]) if rows else None

    async def set_state(
        self, message_id: str, state: MessageState, at: float, error_code: str = ""
    ) -> StoredMessage:
        """Record a state change; raises LookupError for an unknown message_id."""
        query = (
            "UPDATE messages SET state = %s, updated_at = %s, error_code = %s"
            f" WHERE message_id = %s RETURNING {MESSAGE_COLUMNS}"
        )
        rows = await _fetch_all(self._pool, query, [state.value, at, error_code, message_id])
        if not rows:
            raise LookupError(f"no message {message_id!r}")
        return message_from_row(rows[0])

    async def inbox(
        self,
        recipient: str,
        after_offset: int = 0,
        limit: int = 100,
        states: frozenset[MessageState] | None = None,
    ) -> list[StoredMessage]:
        """The recipient's messages with offset > after_offset (ascending), optionally
        only those in `states`."""
        check_limit(limit)
        clauses = ["recipient = %s", "inbox_offset > %s"]
        params: list[Any] = [recipient, after_offset]
        if states is not None:
            if not states:
                return []
            clauses.append("state = ANY(%s)")
            params.append(sorted(s.value for s in states))
        query = (
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE {' AND '.join(clauses)}"
            " ORDER BY inbox_offset LIMIT %s"
        )
        params.append(limit)
        return [message_from_row(row) for row in await _fetch_all(self._pool, query, params)]

    async def count(self, recipient: str, states: frozenset[MessageState]) -> int:
        """How many of the recipient's messages are in one of `states`."""
        if not states:
            return 0
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT count(*) FROM messages WHERE recipient = %s AND state = ANY(%s)",
                [recipient, sorted(s.value for s in states)],
            )
            return await _scalar(cursor)


class PostgresStore:
    """Every aggregate in one PostgreSQL schema (see `open_postgres_store`)."""

    backend = "postgresql"

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool
        self.events = PostgresEventLog(pool)
        self.agents = PostgresAgentStore(pool)
        self.messages = PostgresMessageStore(pool)

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


async def migrate_postgres(conn: Connection, schema: str) -> list[int]:
    """Create `schema` if needed and apply its pending migrations in one transaction.

    A transaction-level advisory lock keyed on the schema makes replicas that start together
    take turns. Returns the versions applied; raises SchemaVersionError (changing nothing)
    when the schema is newer than this code.
    """
    async with conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            [f"apiary.schema_migrations:{schema}"],
        )
        found = await _fetch_rows(conn, "SELECT 1 FROM pg_namespace WHERE nspname = %s", [schema])
        if not found:  # only then: CREATE SCHEMA IF NOT EXISTS needs CREATE on the database
            await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        await set_search_path(conn, schema)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY,"
            " name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        rows = await _fetch_rows(conn, "SELECT version FROM schema_migrations")
        applied = [row[0] for row in rows]
        todo = pending_migrations(load_migrations("postgres"), applied)
        for migration in todo:
            await conn.execute(migration.sql)  # no parameters: several statements allowed
            await conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                [migration.version, migration.name],
            )
    return [m.version for m in todo]


async def _fetch_rows(
    conn: Connection, query: str, params: Sequence[Any] = ()
) -> list[tuple[Any, ...]]:
    cursor = await conn.execute(query, params)
    return await cursor.fetchall()


async def _fetch_all(
    pool: PostgresPool, query: str, params: Sequence[Any]
) -> list[tuple[Any, ...]]:
    async with pool.connection() as conn:
        return await _fetch_rows(conn, query, params)


async def _scalar(cursor: psycopg.AsyncCursor[TupleRow]) -> int:
    row = await cursor.fetchone()
    if row is None:
        raise RuntimeError("query returned no row")
    return int(row[0])


async def _next_offset(conn: Connection, recipient: str) -> int:
    cursor = await conn.execute(
        "INSERT INTO inbox_offsets AS o (recipient, last_offset) VALUES (%s, 1)"
        " ON CONFLICT (recipient) DO UPDATE SET last_offset = o.last_offset + 1"
        " RETURNING last_offset",
        [recipient],
    )
    return await _scalar(cursor)
