"""The SQLite idempotency cache: the `idempotency` table, one row per token."""

from __future__ import annotations

from apiary.core.records import IdempotencyRecord
from apiary.store.sql_rows import (
    IDEMPOTENCY_COLUMN_COUNT,
    IDEMPOTENCY_COLUMNS,
    idempotency_from_row,
    idempotency_row,
)
from apiary.store.sqlite.database import SqliteDatabase, placeholders

_PUT = (
    f"INSERT OR REPLACE INTO idempotency ({IDEMPOTENCY_COLUMNS})"
    f" VALUES ({placeholders(IDEMPOTENCY_COLUMN_COUNT)})"
)


class SqliteIdempotencyStore:
    """`IdempotencyStore` in the `idempotency` table; attempts are a JSON array."""

    def __init__(self, database: SqliteDatabase) -> None:
        self._db = database

    async def get(self, token: str) -> IdempotencyRecord | None:
        """The record of `token`, or None."""
        sql = f"SELECT {IDEMPOTENCY_COLUMNS} FROM idempotency WHERE token = ?"
        row = await self._db.read(lambda conn: conn.execute(sql, (token,)).fetchone())
        return None if row is None else idempotency_from_row(row)

    async def put(self, record: IdempotencyRecord) -> None:
        """Insert or replace the record for record.token."""
        row = idempotency_row(record)
        await self._db.execute(_PUT, row)

    async def purge(self, before: float) -> int:
        """Delete records last updated before `before`; returns how many."""
        sql = "DELETE FROM idempotency WHERE updated_at < ?"
        return await self._db.execute(sql, (before,))
