"""The idempotency cache: the `idempotency` table, one row per token; attempts are a JSON
array (text in SQLite, JSONB in PostgreSQL)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any, NamedTuple

from apiary.core.dedup import unchanged
from apiary.core.records import IdempotencyRecord
from apiary.store.errors import StoreError
from apiary.store.json_codec import dump_json_list, json_list_of
from apiary.store.sql.bulk import chunks, values_rows
from apiary.store.sql.columns import Columns, Json
from apiary.store.sql.database import SqlDatabase
from apiary.store.sql.dialect import Dialect, by_dialect, in_list
from apiary.store.sql.purge import chunk_delete_sql, purge_in_chunks
from apiary.store.sql.statements import Execute, ExecuteMany, Query, QueryOne, Transaction


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
_PURGE = Execute(
    by_dialect(lambda d: chunk_delete_sql(d, "idempotency", "token", "updated_at < ?"))
)


TokenClaim = tuple[int, tuple[Any, ...], IdempotencyRecord | None, bool]
"""A token's record written with a member's admission: the member's index, the record's
row (`idempotency_row`), the record its deduplication found (None: none) and whether the
write is forced (`core.records.AdmissionWrites`)."""


class TokenRacedError(StoreError):
    """A token's record that refused an insert was gone when read (deleted in between):
    the admission is tried again."""


def claim_tokens(
    d: Dialect, claims: Sequence[TokenClaim]
) -> Transaction[dict[int, IdempotencyRecord]]:
    """Write the records of `claims` that may be written (`core.dedup.unchanged`); the
    members refused, each with the record stored instead.

    A token whose deduplication found a record is read locked (PostgreSQL) and compared; one
    found with none is inserted unless a row exists, and the insert of a row another
    transaction is inserting waits for that one to end (the primary key): of two admissions
    of one new token at once, on two replicas, one inserts it and the other is refused with
    the first's record. Rows are taken in key order, so that admissions of the same tokens
    in two orders do not deadlock."""
    refused: dict[int, IdempotencyRecord] = {}
    checked = sorted(c[1][0] for c in claims if c[2] is not None and not c[3])
    stored = (yield from _read(d, checked, lock=True)) if checked else {}
    inserts: list[TokenClaim] = []
    puts: list[tuple[Any, ...]] = []
    for claim in claims:
        index, row, found, forced = claim
        record = stored.get(row[0])
        if forced or (record is not None and unchanged(record, found)):
            puts.append(row)
        elif record is None:
            inserts.append(claim)
        else:
            refused[index] = record
    if inserts:
        firsts: dict[str, TokenClaim] = {}  # a token claimed twice: the first member's
        for claim in inserts:
            firsts.setdefault(str(claim[1][0]), claim)
        added: set[str] = set()
        rows = [firsts[token][1] for token in sorted(firsts)]
        for count, params in chunks(d, rows, IDEMPOTENCY.count):
            added.update(str(r[0]) for r in (yield from Query(_insert_new_sql(d, count), params)))
        lost = [c for c in inserts if c[1][0] not in added or firsts[c[1][0]] is not c]
        now = (yield from _read(d, [str(c[1][0]) for c in lost], lock=False)) if lost else {}
        for index, row, _, _ in lost:
            if row[0] not in now:
                raise TokenRacedError(f"the record of token {row[0]!r} vanished")
            refused[index] = now[row[0]]
    if puts:
        yield from ExecuteMany(PUT_IDEMPOTENCY.sql, sorted(puts, key=lambda r: str(r[0])))
    return refused


def _read(
    d: Dialect, tokens: list[str], *, lock: bool
) -> Transaction[dict[str, IdempotencyRecord]]:
    """The stored records of `tokens` (fewer than a statement's parameters: a batch's),
    locked in key order when `lock` (PostgreSQL)."""
    unique = sorted(set(tokens))
    suffix = f" ORDER BY token{d.lock_rows}" if lock else ""
    sql = f"SELECT {IDEMPOTENCY.sql} FROM idempotency WHERE {in_list('token', len(unique))}"
    rows = yield from Query(sql + suffix, unique)
    return {str(row[0]): idempotency_from_row(row) for row in rows}


@lru_cache(maxsize=64)
def _insert_new_sql(d: Dialect, count: int) -> str:
    """Inserts `count` records, skipping each whose token is stored; returns the tokens
    inserted."""
    row = d.markers(IDEMPOTENCY.inserted, IDEMPOTENCY.json)
    names = ", ".join(IDEMPOTENCY.inserted)
    return (
        f"INSERT INTO idempotency ({names}) VALUES {values_rows(count, row)}"
        " ON CONFLICT (token) DO NOTHING RETURNING token"
    )


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
        return await purge_in_chunks(lambda limit: self._db.write(_PURGE, (float(before), limit)))
