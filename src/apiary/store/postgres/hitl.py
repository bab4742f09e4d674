"""The PostgreSQL HITL store: the `hitl` table, one row per invocation."""

from __future__ import annotations

from apiary.core.records import HitlRecord
from apiary.store.postgres.pool import PostgresPool, fetch_all
from apiary.store.sql_rows import (
    HITL_COLUMNS,
    HITL_JSON_COLUMNS,
    check_limit,
    hitl_from_row,
    hitl_list_clauses,
    hitl_row,
)

_NAMES = HITL_COLUMNS.split(", ")
_MARKERS = ["%s::jsonb" if c in HITL_JSON_COLUMNS else "%s" for c in _NAMES]
_PUT = (
    f"INSERT INTO hitl ({HITL_COLUMNS}) VALUES ({', '.join(_MARKERS)})"
    " ON CONFLICT (invocation_id) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in _NAMES if c != "invocation_id")
)


class PostgresHitlStore:
    """`HitlStore` in the `hitl` table; JSON fields are JSONB."""

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool

    async def put(self, record: HitlRecord) -> None:
        """Insert or replace the record with this invocation_id."""
        row = hitl_row(record)
        async with self._pool.connection() as conn:
            await conn.execute(_PUT, row)

    async def get(self, invocation_id: str) -> HitlRecord | None:
        """The record, or None."""
        query = f"SELECT {HITL_COLUMNS} FROM hitl WHERE invocation_id = %s"
        rows = await fetch_all(self._pool, query, [invocation_id])
        return hitl_from_row(rows[0]) if rows else None

    async def list(
        self, states: frozenset[str] | None = None, after_created: float = 0.0, limit: int = 100
    ) -> list[HitlRecord]:
        """Records in `states` (all when None) created after `after_created`, oldest first
        (by created_at, then invocation_id: code point order, the column is COLLATE "C"),
        at most `limit`."""
        check_limit(limit)
        terms = hitl_list_clauses(states, after_created, "%s")
        if terms is None:
            return []
        clauses, params = terms
        query = (
            f"SELECT {HITL_COLUMNS} FROM hitl WHERE {' AND '.join(clauses)}"
            " ORDER BY created_at, invocation_id LIMIT %s"
        )
        params.append(limit)
        return [hitl_from_row(row) for row in await fetch_all(self._pool, query, params)]
