"""The PostgreSQL dead letter queue: the `dlq` table, numbered by its identity column."""

from __future__ import annotations

import dataclasses

from apiary.core.records import DlqEntry, DlqFilter
from apiary.store.json_codec import load_json_list
from apiary.store.postgres.pool import PostgresPool, fetch_all
from apiary.store.sql_rows import (
    DLQ_COLUMNS,
    DLQ_INSERT_COLUMNS,
    check_limit,
    dlq_filter_clauses,
    dlq_from_row,
    dlq_insert_row,
)

_MARKERS = ["%s::jsonb" if c == "attempts" else "%s" for c in DLQ_INSERT_COLUMNS.split(", ")]
_ATTEMPTS_INDEX = _MARKERS.index("%s::jsonb")
_ADD = f"INSERT INTO dlq ({DLQ_INSERT_COLUMNS}) VALUES ({', '.join(_MARKERS)}) RETURNING entry_id"


class PostgresDlqStore:
    """`DlqStore` in the `dlq` table; attempts are a JSONB array, the envelope BYTEA."""

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool

    async def add(self, entry: DlqEntry) -> DlqEntry:
        """Record an entry; returns it with its entry_id assigned (the given one ignored)."""
        row = dlq_insert_row(entry)
        ((entry_id,),) = await fetch_all(self._pool, _ADD, row)
        # The attempts as stored (detached from the caller's dicts), as `get` returns them.
        attempts = tuple(load_json_list(row[_ATTEMPTS_INDEX]))
        return dataclasses.replace(entry, entry_id=int(entry_id), attempts=attempts)

    async def get(self, entry_id: int) -> DlqEntry | None:
        """The entry, or None."""
        query = f"SELECT {DLQ_COLUMNS} FROM dlq WHERE entry_id = %s"
        rows = await fetch_all(self._pool, query, [entry_id])
        return dlq_from_row(rows[0]) if rows else None

    async def list(
        self, where: DlqFilter | None = None, after_id: int = 0, limit: int = 100
    ) -> list[DlqEntry]:
        """Entries with entry_id > after_id matching `where`, ascending, at most `limit`."""
        check_limit(limit)
        clauses, params = dlq_filter_clauses(where, after_id, "%s")
        query = (
            f"SELECT {DLQ_COLUMNS} FROM dlq WHERE {' AND '.join(clauses)}"
            " ORDER BY entry_id LIMIT %s"
        )
        params.append(limit)
        return [dlq_from_row(row) for row in await fetch_all(self._pool, query, params)]

    async def mark_requeued(self, entry_id: int, at: float, new_message_id: str) -> DlqEntry:
        """Record that the entry was requeued; LookupError for an unknown id."""
        query = (
            "UPDATE dlq SET requeued_at = %s, requeued_as = %s WHERE entry_id = %s"
            f" RETURNING {DLQ_COLUMNS}"
        )
        rows = await fetch_all(self._pool, query, [float(at), new_message_id, entry_id])
        if not rows:
            raise LookupError(f"no DLQ entry {entry_id}")
        return dlq_from_row(rows[0])

    async def purge(self, before: float) -> int:
        """Delete entries that failed before `before` (retention); returns how many."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute("DELETE FROM dlq WHERE failed_at < %s", [float(before)])
            return cursor.rowcount
