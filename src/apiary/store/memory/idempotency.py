"""The in-memory idempotency records (part of `MemoryStore`)."""

from __future__ import annotations

import dataclasses

from apiary.core.records import IdempotencyRecord
from apiary.store.sql.idempotency import idempotency_row


class MemoryIdempotencyStore:
    """`IdempotencyStore` over a dict keyed by token."""

    def __init__(self) -> None:
        self._records: dict[str, IdempotencyRecord] = {}

    async def get(self, token: str) -> IdempotencyRecord | None:
        """The record of `token`, or None."""
        return self._records.get(token)

    def get_now(self, token: str) -> IdempotencyRecord | None:
        """The record of `token`, or None, at once (for a change that updates it in the same
        step, `MemoryMessageStore.apply`)."""
        return self._records.get(token)

    async def put(self, record: IdempotencyRecord) -> None:
        """Insert or replace the record for record.token."""
        self.put_now(self.checked(record))

    def checked(self, record: IdempotencyRecord) -> IdempotencyRecord:
        """`record` as stored; ValueError for what the SQL backends refuse."""
        idempotency_row(record)
        return dataclasses.replace(record, attempts=tuple(record.attempts))

    def put_now(self, record: IdempotencyRecord) -> None:
        """Store a `checked` record."""
        self._records[record.token] = record

    async def purge(self, before: float) -> int:
        """Delete records last updated before `before`; returns how many."""
        doomed = [t for t, r in self._records.items() if r.updated_at < before]
        for token in doomed:
            del self._records[token]
        return len(doomed)
