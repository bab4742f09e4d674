"""The dead letter queue: the `dlq` table, numbered by the database (SQLite's AUTOINCREMENT
rowid, PostgreSQL's identity column); attempts are a JSON array, the envelope a BLOB/BYTEA."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from apiary.core.records import DlqEntry, DlqFilter
from apiary.store.errors import StoreError
from apiary.store.json_codec import dump_json_list, json_list_of, load_json_list
from apiary.store.sql.checks import check_limit
from apiary.store.sql.columns import Columns, Json
from apiary.store.sql.database import SqlDatabase
from apiary.store.sql.dialect import by_dialect
from apiary.store.sql.purge import chunk_delete_sql, purge_in_chunks
from apiary.store.sql.statements import Execute, Query, QueryOne, Transaction
from apiary.store.sql.where import Where


class DlqRow(NamedTuple):
    """A row of `dlq`."""

    entry_id: int
    message_id: str
    producer_id: str
    recipient: str
    correlation_id: str
    message_type: int
    error_code: str
    reason: str
    created_at: float
    failed_at: float
    content_type: str
    payload_size: int
    envelope: bytes
    attempts: Json
    route: str
    requeued_at: float
    requeued_as: str
    signature: bytes


DLQ = Columns(DlqRow, json=("attempts",), generated=("entry_id",))


def dlq_row(entry: DlqEntry) -> tuple[Any, ...]:
    """The values of the DLQ columns for `entry`, in their order (its entry_id is not
    written: the database assigns one).

    Raises ValueError when an attempt is not a JSON object of JSON values.
    """
    return (
        0,  # entry_id: assigned by the database
        entry.message_id,
        entry.producer_id,
        entry.recipient,
        entry.correlation_id,
        int(entry.message_type),
        entry.error_code,
        entry.reason,
        float(entry.created_at),
        float(entry.failed_at),
        entry.content_type,
        int(entry.payload_size),
        bytes(entry.envelope),
        dump_json_list(_attempt_objects(entry.attempts)),
        entry.route,
        float(entry.requeued_at),
        entry.requeued_as,
        bytes(entry.signature),
    )


def dlq_from_row(fetched: Sequence[Any]) -> DlqEntry:
    """An entry from its row."""
    row = DLQ.of(fetched)
    return DlqEntry(
        entry_id=row.entry_id,
        message_id=row.message_id,
        producer_id=row.producer_id,
        recipient=row.recipient,
        correlation_id=row.correlation_id,
        message_type=row.message_type,
        error_code=row.error_code,
        reason=row.reason,
        created_at=row.created_at,
        failed_at=row.failed_at,
        content_type=row.content_type,
        payload_size=row.payload_size,
        envelope=bytes(row.envelope),
        attempts=tuple(_attempt_object(a) for a in json_list_of(row.attempts)),
        route=row.route,
        requeued_at=row.requeued_at,
        requeued_as=row.requeued_as,
        signature=bytes(row.signature),
    )


def _attempt_objects(attempts: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    if not all(isinstance(a, Mapping) for a in attempts):
        raise ValueError("attempts must be a sequence of JSON objects")
    return list(attempts)


def _attempt_object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise StoreError(f"a stored DLQ attempt is not a JSON object: {type(value).__name__}")
    return value


_ADD = Query(by_dialect(lambda d: d.insert("dlq", DLQ, " RETURNING entry_id")))
_GET = QueryOne(f"SELECT {DLQ.sql} FROM dlq WHERE entry_id = ?")
_REQUEUED = Query(
    f"UPDATE dlq SET requeued_at = ?, requeued_as = ? WHERE entry_id = ? RETURNING {DLQ.sql}"
)
_PURGE = Execute(by_dialect(lambda d: chunk_delete_sql(d, "dlq", "entry_id", "failed_at < ?")))
_REQUEUED_ONCE = (
    "UPDATE dlq SET requeued_at = ?, requeued_as = ? WHERE entry_id = ? AND requeued_as = ''"
)

DlqMark = tuple[int, float, str, int]
"""A requeue marked with its admission: the member's index, the time, the requeued
message's id and the entry's id (`core.records.AdmissionWrites.requeues`)."""


def mark_requeued_once(marks: Sequence[DlqMark]) -> Transaction[set[int]]:
    """Mark each entry requeued as its message unless a requeue marked it before (or it is
    gone); the members refused. The update locks the entry's row: a concurrent requeue of
    it waits for this transaction and then finds it marked."""
    refused: set[int] = set()
    for index, at, message_id, entry_id in sorted(marks, key=lambda m: m[3]):
        if (yield from Execute(_REQUEUED_ONCE, (float(at), message_id, entry_id))) != 1:
            refused.add(index)
    return refused


class SqlDlqStore:
    """`DlqStore` in the `dlq` table."""

    def __init__(self, database: SqlDatabase) -> None:
        self._db = database

    async def add(self, entry: DlqEntry) -> DlqEntry:
        """Record an entry; returns it with its entry_id assigned (the given one ignored)."""
        row = DLQ.of(dlq_row(entry))
        ((entry_id,),) = await self._db.write(_ADD, DLQ.insert_values(row))
        # The attempts as stored (detached from the caller's dicts), as `get` returns them.
        attempts = tuple(load_json_list(row.attempts))
        return dataclasses.replace(entry, entry_id=int(entry_id), attempts=attempts)

    async def get(self, entry_id: int) -> DlqEntry | None:
        """The entry, or None."""
        row = await self._db.read(_GET, (entry_id,))
        return None if row is None else dlq_from_row(row)

    async def list(
        self, where: DlqFilter | None = None, after_id: int = 0, limit: int = 100
    ) -> list[DlqEntry]:
        """Entries with entry_id > after_id matching `where`, ascending, at most `limit`."""
        check_limit(limit)
        terms = Where().term("entry_id > ?", after_id)
        if where is not None:
            terms.compare("failed_at >=", where.since).compare("failed_at <=", where.until)
            terms.compare("error_code =", where.error_code).compare("recipient =", where.recipient)
            terms.compare("producer_id =", where.producer_id)
            if not where.include_requeued:
                terms.term("requeued_as = ''")
        sql = f"SELECT {DLQ.sql} FROM dlq WHERE {terms.sql} ORDER BY entry_id LIMIT ?"
        rows = await self._db.read(Query(sql, [*terms.params, limit]))
        return [dlq_from_row(row) for row in rows]

    async def mark_requeued(self, entry_id: int, at: float, new_message_id: str) -> DlqEntry:
        """Record that the entry was requeued; LookupError for an unknown id."""
        params = (float(at), new_message_id, entry_id)
        rows = await self._db.write(_REQUEUED, params)
        if not rows:
            raise LookupError(f"no DLQ entry {entry_id}")
        return dlq_from_row(rows[0])

    async def purge(self, before: float) -> int:
        """Delete entries that failed before `before` (retention); returns how many."""
        return await purge_in_chunks(lambda limit: self._db.write(_PURGE, (float(before), limit)))
