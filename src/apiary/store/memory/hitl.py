"""The in-memory HITL records (part of `MemoryStore`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from apiary.core.events import EventDraft
from apiary.core.records import HitlRecord
from apiary.store.memory.copies import json_copy
from apiary.store.memory.events import MemoryEventLog
from apiary.store.sql.checks import check_limit
from apiary.store.sql.hitl import hitl_from_row, hitl_row


class MemoryHitlStore:
    """`HitlStore` over a dict keyed by invocation_id; events that commit with a record go
    to `log`."""

    def __init__(self, log: MemoryEventLog) -> None:
        self._records: dict[str, HitlRecord] = {}
        self._log = log

    async def put(self, record: HitlRecord, events: Sequence[EventDraft] = ()) -> None:
        """Insert or replace the record with this invocation_id, appending `events` with
        it."""
        # Through the SQL row and back: refuses what the SQL backends refuse, coerces as
        # they do, and detaches the stored record from the caller's (mutable) mappings.
        stored = hitl_from_row(hitl_row(record))
        drafts = self._log.checked(events)
        self._records[record.invocation_id] = stored
        self._log.append_now(drafts)

    async def get(self, invocation_id: str) -> HitlRecord | None:
        """The record, or None."""
        record = self._records.get(invocation_id)
        return None if record is None else self._copy(record)

    async def list(
        self, states: frozenset[str] | None = None, after_created: float = 0.0, limit: int = 100
    ) -> list[HitlRecord]:
        """Records in `states` (all when None) created after `after_created`, oldest first
        (by created_at, then invocation_id), at most `limit`."""
        check_limit(limit)
        found = sorted(
            (r.created_at, r.invocation_id, r)
            for r in self._records.values()
            if r.created_at > after_created and (states is None or r.state in states)
        )
        return [self._copy(r) for _, _, r in found[:limit]]

    @staticmethod
    def _copy(record: HitlRecord) -> HitlRecord:
        return dataclasses.replace(
            record,
            subject=json_copy(record.subject),
            context=json_copy(record.context),
            decision=json_copy(record.decision),
        )
