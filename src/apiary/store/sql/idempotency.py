"""The idempotency cache: the `idempotency` table, one row per token; attempts are a JSON
array (text in SQLite, JSONB in PostgreSQL)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from apiary.core.records import IdempotencyRecord
from apiary.store.json_codec import dump_json_list, json_list_of
from apiary.store.sql.columns import Columns, Json
from apiary.store.sql.database import SqlDatabase
from apiary.store.sql.dialect import by_dialect
from apiary.store.sql.statements import Execute, QueryOne


class IdempotencyRow(NamedTuple):
    """A row of `idempotency`."""

    token: str
    producer_id: str
    original_message_id: str
    current_message_id: str
    status: str
    created_at: float
    updated_at: float
    outcome_at: float
    error_code: str
    result: str
    attempts: Json


IDEMPOTENCY = Columns(IdempotencyRow, json=("attempts",))


def idempotency_row(record: IdempotencyRecord) -> tuple[Any, ...]:
    """The values of the IDEMPOTENCY columns for `record`, in their order, its attempts as
    a JSON array; ValueError when an attempt is not a
    message id (str)."""
    return (
        record.token,
        record.producer_id,
        record.original_message_id,
        record.current_message_id,
        record.status,
        float(record.created_at),
        float(record.updated_at),
        float(record.outcome_at),
        record.error_code,
        record.result,
        dump_json_list(_attempt_ids(record.attempts)),
    )


def idempotency_from_row(fetched: Sequence[Any]) -> IdempotencyRecord:
    """A record from its row."""
    row = IDEMPOTENCY.of(fetched)
    return IdempotencyRecord(
        token=row.token,
        producer_id=row.producer_id,
        original_message_id=row.original_message_id,
        current_message_id=row.current_message_id,
        status=row.status,
        created_at=row.created_at,
        updated_at=row.updated_at,
        outcome_at=row.outcome_at,
        error_code=row.error_code,
        result=row.result,
        attempts=tuple(str(a) for a in json_list_of(row.attempts)),
    )


def _attempt_ids(attempts: Sequence[str]) -> list[str]:
    if isinstance(attempts, str) or not all(isinstance(a, str) for a in attempts):
        raise ValueError("attempts must be a sequence of message ids (str)")
    return list(attempts)


PUT_IDEMPOTENCY = Execute(by_dialect(lambda d: d.upsert("idempotency", IDEMPOTENCY, "token")))
"""Inserts or replaces one record (`idempotency_row`)."""
_GET = QueryOne(f"SELECT {IDEMPOTENCY.sql} FROM idempotency WHERE token = ?")
_PURGE = Execute("DELETE FROM idempotency WHERE updated_at < ?")


class SqlIdempotencyStore:
    """`IdempotencyStore` in the `idempotency` table."""

    def __init__(self, database: SqlDatabase) -> None:
        self._db = database

    async def get(self, token: str) -> IdempotencyRecord | None:
        """The record of `token`, or None."""
        row = await self._db.read(_GET, (token,))
        return None if row is None else idempotency_from_row(row)

    async def put(self, record: IdempotencyRecord) -> None:
        """Insert or replace the record for record.token."""
        await self._db.write(PUT_IDEMPOTENCY, idempotency_row(record))

    async def purge(self, before: float) -> int:
        """Delete records last updated before `before`; returns how many."""
        return await self._db.write(_PURGE, (float(before),))
