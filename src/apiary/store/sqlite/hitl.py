"""The SQLite HITL store: the `hitl` table, one row per invocation."""

from __future__ import annotations

from apiary.core.records import HitlRecord
from apiary.store.sql_rows import (
    HITL_COLUMN_COUNT,
    HITL_COLUMNS,
    check_limit,
    hitl_from_row,
    hitl_list_clauses,
    hitl_row,
)
from apiary.store.sqlite.database import SqliteDatabase, placeholders

_PUT = f"INSERT OR REPLACE INTO hitl ({HITL_COLUMNS}) VALUES ({placeholders(HITL_COLUMN_COUNT)})"


class SqliteHitlStore:
    """`HitlStore` in the `hitl` table; JSON fields are JSON text."""

    def __init__(self, database: SqliteDatabase) -> None:
        self._db = database

    async def put(self, record: HitlRecord) -> None:
        """Insert or replace the record with this invocation_id."""
        row = hitl_row(record)
        await self._db.execute(_PUT, row)

    async def get(self, invocation_id: str) -> HitlRecord | None:
        """The record, or None."""
        sql = f"SELECT {HITL_COLUMNS} FROM hitl WHERE invocation_id = ?"
        row = await self._db.read(lambda conn: conn.execute(sql, (invocation_id,)).fetchone())
        return None if row is None else hitl_from_row(row)

    async def list(
        self, states: frozenset[str] | None = None, after_created: float = 0.0, limit: int = 100
    ) -> list[HitlRecord]:
        """Records in `states` (all when None) created after `after_created`, oldest first
        (by created_at, then invocation_id), at most `limit`."""
        check_limit(limit)
        terms = hitl_list_clauses(states, after_created, "?")
        if terms is None:
            return []
        clauses, params = terms
        sql = (
            f"SELECT {HITL_COLUMNS} FROM hitl WHERE {' AND '.join(clauses)}"
            " ORDER BY created_at, invocation_id LIMIT ?"
        )
        params.append(limit)
        rows = await self._db.read(lambda conn: conn.execute(sql, params).fetchall())
        return [hitl_from_row(row) for row in rows]
