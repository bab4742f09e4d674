"""The SQLite dead letter queue: the `dlq` table, numbered by its AUTOINCREMENT rowid."""

from __future__ import annotations

import dataclasses

from apiary.core.records import DlqEntry, DlqFilter
from apiary.store.json_codec import load_json_list
from apiary.store.sql_rows import (
    DLQ_COLUMNS,
    DLQ_INSERT_COLUMN_COUNT,
    DLQ_INSERT_COLUMNS,
    check_limit,
    dlq_filter_clauses,
    dlq_from_row,
    dlq_insert_row,
)
from apiary.store.sqlite.database import SqliteDatabase, placeholders
from apiary.store.sqlite.writer import execute_fetchall, execute_lastrowid

_ADD = f"INSERT INTO dlq ({DLQ_INSERT_COLUMNS}) VALUES ({placeholders(DLQ_INSERT_COLUMN_COUNT)})"
_ATTEMPTS_INDEX = DLQ_INSERT_COLUMNS.split(", ").index("attempts")


class SqliteDlqStore:
    """`DlqStore` in the `dlq` table; attempts are a JSON array, the envelope a BLOB."""

    def __init__(self, database: SqliteDatabase) -> None:
        self._db = database

    async def add(self, entry: DlqEntry) -> DlqEntry:
        """Record an entry; returns it with its entry_id assigned (the given one ignored)."""
        row = dlq_insert_row(entry)
        entry_id = await self._db.call(execute_lastrowid, _ADD, row)
        # The attempts as stored (detached from the caller's dicts), as `get` returns them.
        attempts = tuple(load_json_list(row[_ATTEMPTS_INDEX]))
        return dataclasses.replace(entry, entry_id=entry_id, attempts=attempts)

    async def get(self, entry_id: int) -> DlqEntry | None:
        """The entry, or None."""
        sql = f"SELECT {DLQ_COLUMNS} FROM dlq WHERE entry_id = ?"
        row = await self._db.read(lambda conn: conn.execute(sql, (entry_id,)).fetchone())
        return None if row is None else dlq_from_row(row)

    async def list(
        self, where: DlqFilter | None = None, after_id: int = 0, limit: int = 100
    ) -> list[DlqEntry]:
        """Entries with entry_id > after_id matching `where`, ascending, at most `limit`."""
        check_limit(limit)
        clauses, params = dlq_filter_clauses(where, after_id, "?")
        sql = (
            f"SELECT {DLQ_COLUMNS} FROM dlq WHERE {' AND '.join(clauses)} ORDER BY entry_id LIMIT ?"
        )
        params.append(limit)
        rows = await self._db.read(lambda conn: conn.execute(sql, params).fetchall())
        return [dlq_from_row(row) for row in rows]

    async def mark_requeued(self, entry_id: int, at: float, new_message_id: str) -> DlqEntry:
        """Record that the entry was requeued; LookupError for an unknown id."""
        sql = (
            "UPDATE dlq SET requeued_at = ?, requeued_as = ? WHERE entry_id = ?"
            f" RETURNING {DLQ_COLUMNS}"
        )
        params = (float(at), new_message_id, entry_id)
        rows = await self._db.call(execute_fetchall, sql, params)
        if not rows:
            raise LookupError(f"no DLQ entry {entry_id}")
        return dlq_from_row(rows[0])

    async def purge(self, before: float) -> int:
        """Delete entries that failed before `before` (retention); returns how many."""
        sql = "DELETE FROM dlq WHERE failed_at < ?"
        return await self._db.execute(sql, (before,))
