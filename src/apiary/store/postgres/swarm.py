"""The PostgreSQL swarm store: the `swarm_inbox` and `swarm_outbox` tables."""

from __future__ import annotations

from typing import Any

from apiary.core.swarm_mail import InboxEntry, OutboxEntry, capped
from apiary.store.postgres.pool import PostgresPool, fetch_all, fetch_rows
from apiary.store.swarm_rows import (
    check_inbox_status,
    inbox_from_row,
    inbox_row,
    outbox_from_row,
    outbox_row,
)
from apiary.store.swarm_sql import SwarmQueries

_SQL = SwarmQueries("%s")


class PostgresSwarmStore:
    """`SwarmStore` in PostgreSQL; JSON fields are JSONB."""

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool

    async def receive(self, entry: InboxEntry) -> bool:
        row = inbox_row(entry)
        async with self._pool.connection() as conn:
            cursor = await conn.execute(_SQL.receive, row)
            return cursor.rowcount > 0

    async def inbox_get(self, message_id: str) -> InboxEntry | None:
        rows = await fetch_all(self._pool, _SQL.inbox_get, [message_id])
        return inbox_from_row(rows[0]) if rows else None

    async def list_recent(
        self,
        swarm_id: str | None = None,
        limit: int = 50,
        statuses: frozenset[str] | None = None,
    ) -> list[InboxEntry]:
        rows = await self._rows("swarm_inbox", swarm_id, limit, statuses)
        return [inbox_from_row(row) for row in rows]

    async def set_status(self, message_id: str, status: str, at: float) -> InboxEntry | None:
        check_inbox_status(status)
        params = (status, status, float(at), status, float(at), message_id)
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(_SQL.set_status, params)
            rows = await fetch_rows(conn, _SQL.inbox_get, [message_id])
        return inbox_from_row(rows[0]) if rows else None

    async def thread_latest(self, key: str) -> InboxEntry | None:
        rows = await fetch_all(self._pool, _SQL.thread_latest, [key, key])
        return inbox_from_row(rows[0]) if rows else None

    async def outbox_put(self, entry: OutboxEntry) -> None:
        row = outbox_row(entry)
        async with self._pool.connection() as conn:
            await conn.execute(_SQL.outbox_put, row)

    async def outbox_get(self, message_id: str) -> list[OutboxEntry]:
        return [
            outbox_from_row(r) for r in await fetch_all(self._pool, _SQL.outbox_get, [message_id])
        ]

    async def outbox_recent(
        self,
        swarm_id: str | None = None,
        limit: int = 50,
        statuses: frozenset[str] | None = None,
    ) -> list[OutboxEntry]:
        rows = await self._rows("swarm_outbox", swarm_id, limit, statuses)
        return [outbox_from_row(row) for row in rows]

    async def outbox_pending(self, limit: int = 100) -> list[OutboxEntry]:
        rows = await fetch_all(self._pool, _SQL.outbox_pending, [capped(limit)])
        return [outbox_from_row(row) for row in rows]

    async def _rows(
        self, table: str, swarm_id: str | None, limit: int, statuses: frozenset[str] | None
    ) -> list[Any]:
        query = _SQL.recent(table, swarm_id, capped(limit), statuses)
        if query is None:
            return []
        sql, params = query
        return await fetch_all(self._pool, sql, params)
