"""The in-memory dead-letter queue (part of `MemoryStore`)."""

from __future__ import annotations

import dataclasses

from apiary.core.records import DlqEntry, DlqFilter
from apiary.store.memory.copies import json_copy
from apiary.store.sql.checks import check_limit
from apiary.store.sql.dlq import dlq_row


class MemoryDlqStore:
    """`DlqStore` over a dict in entry_id order, numbered by a counter."""

    def __init__(self) -> None:
        self._entries: dict[int, DlqEntry] = {}
        self._last_id = 0

    async def add(self, entry: DlqEntry) -> DlqEntry:
        """Record an entry; returns it with its entry_id assigned (the given one ignored)."""
        dlq_row(entry)  # refuse what the SQL backends refuse
        attempts = tuple(json_copy(a) for a in entry.attempts)
        self._last_id += 1
        added = dataclasses.replace(
            entry, entry_id=self._last_id, attempts=attempts, envelope=bytes(entry.envelope)
        )
        self._entries[added.entry_id] = added
        return self._copy(added)

    async def get(self, entry_id: int) -> DlqEntry | None:
        """The entry, or None."""
        entry = self._entries.get(entry_id)
        return None if entry is None else self._copy(entry)

    async def list(
        self, where: DlqFilter | None = None, after_id: int = 0, limit: int = 100
    ) -> list[DlqEntry]:
        """Entries with entry_id > after_id matching `where`, ascending, at most `limit`."""
        check_limit(limit)
        found: list[DlqEntry] = []
        for entry_id, entry in self._entries.items():  # insertion order is id order
            if len(found) >= limit:
                break
            if entry_id > after_id and (where is None or where.matches(entry)):
                found.append(self._copy(entry))
        return found

    async def mark_requeued(self, entry_id: int, at: float, new_message_id: str) -> DlqEntry:
        """Record that the entry was requeued; LookupError for an unknown id."""
        entry = self._entries.get(entry_id)
        if entry is None:
            raise LookupError(f"no DLQ entry {entry_id}")
        changed = dataclasses.replace(entry, requeued_at=at, requeued_as=new_message_id)
        self._entries[entry_id] = changed
        return self._copy(changed)

    def requeue_now(self, entry_id: int, at: float, new_message_id: str) -> bool:
        """Mark the entry requeued as `new_message_id` unless it is already (or gone):
        whether it was marked (`AdmissionWrites.requeues`)."""
        entry = self._entries.get(entry_id)
        if entry is None or entry.requeued_as:
            return False
        self._entries[entry_id] = dataclasses.replace(
            entry, requeued_at=at, requeued_as=new_message_id
        )
        return True

    async def purge(self, before: float) -> int:
        """Delete entries that failed before `before`; returns how many."""
        doomed = [i for i, e in self._entries.items() if e.failed_at < before]
        for entry_id in doomed:
            del self._entries[entry_id]
        return len(doomed)

    @staticmethod
    def _copy(entry: DlqEntry) -> DlqEntry:
        return dataclasses.replace(entry, attempts=tuple(json_copy(a) for a in entry.attempts))
