"""The PostgreSQL idempotency cache: the `idempotency` table, one row per token."""

from __future__ import annotations

from apiary.core.records import IdempotencyRecord
from apiary.store.postgres.pool import PostgresPool, fetch_all
from apiary.store.sql_rows import IDEMPOTENCY_COLUMNS, idempotency_from_row, idempotency_row

_PUT = (
    f"INSERT INTO idempotency ({IDEMPOTENCY_COLUMNS})"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb)"
    " ON CONFLICT (token) DO UPDATE SET producer_id = EXCLUDED.producer_id,"
    " original_message_id = EXCLUDED.original_message_id,"
    " current_message_id = EXCLUDED.current_message_id, status = EXCLUDED.status,"
    " created_at = EXCLUDED.created_at, updated_at = EXCLUDED.updated_at,"
    " outcome_at = EXCLUDED.outcome_at, error_code = EXCLUDED.error_code,"
    " result = EXCLUDED.result, attempts = EXCLUDED.attempts"
)


class PostgresIdempotencyStore:
    """`IdempotencyStore` in the `idempotency` table; attempts are a JSONB array."""

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool

    async def get(self, token: str) -> IdempotencyRecord | None:
        """The record of `token`, or None."""
        query = f"SELECT {IDEMPOTENCY_COLUMNS} FROM idempotency WHERE token = %s"
        rows = await fetch_all(self._pool, query, [token])
        return idempotency_from_row(rows[0]) if rows else None

    async def put(self, record: IdempotencyRecord) -> None:
        """Insert or replace the record for record.token."""
        row = idempotency_row(record)
        async with self._pool.connection() as conn:
            await conn.execute(_PUT, row)

    async def purge(self, before: float) -> int:
        """Delete records last updated before `before`; returns how many."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                "DELETE FROM idempotency WHERE updated_at < %s", [float(before)]
            )
            return cursor.rowcount
