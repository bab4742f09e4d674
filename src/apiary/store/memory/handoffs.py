"""The in-memory handoff store (part of `MemoryStore`)."""

from __future__ import annotations

from collections.abc import Sequence

from apiary.core.events import EventDraft
from apiary.core.records import HandoffRecord
from apiary.store.memory.events import MemoryEventLog
from apiary.store.sql.checks import check_limit
from apiary.store.sql.handoffs import handoff_from_row, handoff_row


class MemoryHandoffStore:
    """`HandoffStore` over a dict keyed by request_id; events that commit with a record go
    to `log`."""

    def __init__(self, log: MemoryEventLog) -> None:
        self._records: dict[str, HandoffRecord] = {}
        self._log = log

    async def put(self, record: HandoffRecord, events: Sequence[EventDraft] = ()) -> None:
        """Insert or replace the record with this request_id, appending `events` with it."""
        # Through the SQL row and back: refuses what the SQL backends refuse and coerces as
        # they do (an int created_at becomes a float, a bytearray snapshot bytes).
        stored = handoff_from_row(handoff_row(record))
        drafts = self._log.checked(events)
        self._records[record.request_id] = stored
        self._log.append_now(drafts)

    async def get(self, request_id: str) -> HandoffRecord | None:
        """The record, or None (records hold immutable values only: no copy needed)."""
        return self._records.get(request_id)

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
        found = sorted(
            (r.created_at, r.request_id, r)
            for r in self._records.values()
            if r.created_at > after_created
            and (states is None or r.state in states)
            and (from_agent is None or r.from_agent == from_agent)
            and (to_agent is None or r.to_agent == to_agent)
        )
        return [r for _, _, r in found[:limit]]
