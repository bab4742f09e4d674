"""The SQLite handoff store: the `handoffs` table, one row per handoff."""

from __future__ import annotations

from apiary.core.records import HandoffRecord
from apiary.store.handoff_rows import (
    HANDOFF_COLUMN_COUNT,
    HANDOFF_COLUMNS,
    handoff_from_row,
    handoff_list_clauses,
    handoff_row,
)
from apiary.store.sql_rows import check_limit
from apiary.store.sqlite.database import SqliteDatabase, placeholders

_PUT = (
    f"INSERT OR REPLACE INTO handoffs ({HANDOFF_COLUMNS})"
    f" VALUES ({placeholders(HANDOFF_COLUMN_COUNT)})"
)


class SqliteHandoffStore:
    """`HandoffStore` in the `handoffs` table; the snapshot is a BLOB, lists JSON text."""

    def __init__(self, database: SqliteDatabase) -> None:
        self._db = database

    async def put(self, record: HandoffRecord) -> None:
        """Insert or replace the record with this request_id."""
        row = handoff_row(record)
        await self._db.execute(_PUT, row)

    async def get(self, request_id: str) -> HandoffRecord | None:
        """The record, or None."""
        sql = f"SELECT {HANDOFF_COLUMNS} FROM handoffs WHERE request_id = ?"
        row = await self._db.read(lambda conn: conn.execute(sql, (request_id,)).fetchone())
        return None if row is None else handoff_from_row(row)

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
        None), created after `after_created`, oldest first (by created_at, then
        request_id), at most `limit`."""
        check_limit(limit)
        terms = handoff_list_clauses(states, from_agent, to_agent, after_created, "?")
        if terms is None:
            return []
        clauses, params = terms
        sql = (
            f"SELECT {HANDOFF_COLUMNS} FROM handoffs WHERE {' AND '.join(clauses)}"
            " ORDER BY created_at, request_id LIMIT ?"
        )
        params.append(limit)
        rows = await self._db.read(lambda conn: conn.execute(sql, params).fetchall())
        return [handoff_from_row(row) for row in rows]
