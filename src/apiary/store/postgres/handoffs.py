"""The PostgreSQL handoff store: the `handoffs` table, one row per handoff."""

from __future__ import annotations

from apiary.core.records import HandoffRecord
from apiary.store.handoff_rows import (
    HANDOFF_COLUMNS,
    HANDOFF_JSON_COLUMNS,
    handoff_from_row,
    handoff_list_clauses,
    handoff_row,
)
from apiary.store.postgres.pool import PostgresPool, fetch_all
from apiary.store.sql_rows import check_limit

_NAMES = HANDOFF_COLUMNS.split(", ")
_MARKERS = ["%s::jsonb" if c in HANDOFF_JSON_COLUMNS else "%s" for c in _NAMES]
_PUT = (
    f"INSERT INTO handoffs ({HANDOFF_COLUMNS}) VALUES ({', '.join(_MARKERS)})"
    " ON CONFLICT (request_id) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in _NAMES if c != "request_id")
)


class PostgresHandoffStore:
    """`HandoffStore` in the `handoffs` table; the snapshot is BYTEA, lists JSONB."""

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool

    async def put(self, record: HandoffRecord) -> None:
        """Insert or replace the record with this request_id."""
        row = handoff_row(record)
        async with self._pool.connection() as conn:
            await conn.execute(_PUT, row)

    async def get(self, request_id: str) -> HandoffRecord | None:
        """The record, or None."""
        query = f"SELECT {HANDOFF_COLUMNS} FROM handoffs WHERE request_id = %s"
        rows = await fetch_all(self._pool, query, [request_id])
        return handoff_from_row(rows[0]) if rows else None

    async def list(
        self,
        states: frozenset[str] | None = None,
        *,
        from_agent: str | None = None,
        to_agent: str | None = None,
        after_created: float = 0.0,
        limit: int = 100,
    ) -> list[HandoffRecord]:
        """Records in `states` (all when None), from `from_agent` and to `to_agent` (any when
        None), created after `after_created`, oldest first (by created_at, then request_id:
        code point order, the column is COLLATE "C"), at most `limit`."""
        check_limit(limit)
        terms = handoff_list_clauses(states, from_agent, to_agent, after_created, "%s")
        if terms is None:
            return []
        clauses, params = terms
        query = (
            f"SELECT {HANDOFF_COLUMNS} FROM handoffs WHERE {' AND '.join(clauses)}"
            " ORDER BY created_at, request_id LIMIT %s"
        )
        params.append(limit)
        return [handoff_from_row(row) for row in await fetch_all(self._pool, query, params)]
