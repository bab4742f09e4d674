"""The SQLite swarm store: the `swarm_inbox` and `swarm_outbox` tables."""

from __future__ import annotations

import sqlite3
from typing import Any

from apiary.core.swarm_mail import InboxEntry, OutboxEntry, capped
from apiary.store.sqlite.database import SqliteDatabase
from apiary.store.swarm_rows import (
    check_inbox_status,
    inbox_from_row,
    inbox_row,
    outbox_from_row,
    outbox_row,
)
from apiary.store.swarm_sql import SwarmQueries

_SQL = SwarmQueries("?")


class SqliteSwarmStore:
    """`SwarmStore` in SQLite; JSON fields are JSON text."""

    def __init__(self, database: SqliteDatabase) -> None:
        self._db = database

    async def receive(self, entry: InboxEntry) -> bool:
        row = inbox_row(entry)
        inserted = await self._db.execute(_SQL.receive, row)
        return inserted > 0

    async def inbox_get(self, message_id: str) -> InboxEntry | None:
        row = await self._db.read(lambda c: c.execute(_SQL.inbox_get, (message_id,)).fetchone())
        return None if row is None else inbox_from_row(row)

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
        row = await self._db.call(_set_status, params, message_id)
        return None if row is None else inbox_from_row(row)

    async def thread_latest(self, key: str) -> InboxEntry | None:
        row = await self._db.read(lambda c: c.execute(_SQL.thread_latest, (key, key)).fetchone())
        return None if row is None else inbox_from_row(row)

    async def outbox_put(self, entry: OutboxEntry) -> None:
        row = outbox_row(entry)
        await self._db.execute(_SQL.outbox_put, row)

    async def outbox_get(self, message_id: str) -> list[OutboxEntry]:
        rows = await self._db.read(
            lambda conn: conn.execute(_SQL.outbox_get, (message_id,)).fetchall()
        )
        return [outbox_from_row(row) for row in rows]

    async def outbox_recent(
        self,
        swarm_id: str | None = None,
        limit: int = 50,
        statuses: frozenset[str] | None = None,
    ) -> list[OutboxEntry]:
        rows = await self._rows("swarm_outbox", swarm_id, limit, statuses)
        return [outbox_from_row(row) for row in rows]

    async def outbox_pending(self, limit: int = 100) -> list[OutboxEntry]:
        rows = await self._db.read(
            lambda conn: conn.execute(_SQL.outbox_pending, (capped(limit),)).fetchall()
        )
        return [outbox_from_row(row) for row in rows]

    async def _rows(
        self, table: str, swarm_id: str | None, limit: int, statuses: frozenset[str] | None
    ) -> list[Any]:
        query = _SQL.recent(table, swarm_id, capped(limit), statuses)
        if query is None:
            return []
        sql, params = query
        return await self._db.read(lambda conn: conn.execute(sql, params).fetchall())


def _set_status(conn: sqlite3.Connection, params: tuple[Any, ...], message_id: str) -> Any:
    conn.execute(_SQL.set_status, params)
    return conn.execute(_SQL.inbox_get, (message_id,)).fetchone()
