"""The handoff store: the `handoffs` table, one row per handoff; the snapshot is a
BLOB/BYTEA, the lists JSON arrays (text in SQLite, JSONB in PostgreSQL).

The rows are shared with the memory backend, which runs them so that it refuses what the
SQL backends refuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from apiary.core.events import EventDraft
from apiary.core.handoff import HandoffState
from apiary.core.records import HandoffRecord
from apiary.store.json_codec import dump_json_list, json_list_of
from apiary.store.sql.checks import check_limit, checked_int64, checked_strings
from apiary.store.sql.columns import Columns, Json
from apiary.store.sql.database import SqlDatabase
from apiary.store.sql.dialect import Dialect, by_dialect
from apiary.store.sql.events import SqlEventLog
from apiary.store.sql.statements import Execute, Query, QueryOne, Transaction
from apiary.store.sql.where import Where


class HandoffRow(NamedTuple):
    """A row of `handoffs`."""

    request_id: str
    from_agent: str
    to_agent: str
    state: str
    created_at: float
    updated_at: float
    deadline: float
    timeout_s: float
    requested_to: str
    reason: str
    context_snapshot: bytes
    snapshot_content_type: str
    capabilities_required: Json
    priority: int
    attempt: int
    tried: Json
    accepting_agent: str
    rejection_reason: str
    context_holders: Json


HANDOFFS = Columns(HandoffRow, json=("capabilities_required", "tried", "context_holders"))


def handoff_row(record: HandoffRecord) -> tuple[Any, ...]:
    """The values of the HANDOFFS columns for `record`, in their order.

    Raises ValueError when state is not a HandoffState value, when a list field is not a
    sequence of str, or when priority or attempt does not fit a signed 64-bit integer.
    """
    return (
        record.request_id,
        record.from_agent,
        record.to_agent,
        HandoffState(record.state).value,
        float(record.created_at),
        float(record.updated_at),
        float(record.deadline),
        float(record.timeout_s),
        record.requested_to,
        record.reason,
        bytes(record.context_snapshot),
        record.snapshot_content_type,
        _json_strings("capabilities_required", record.capabilities_required),
        checked_int64("priority", record.priority),
        checked_int64("attempt", record.attempt),
        _json_strings("tried", record.tried),
        record.accepting_agent,
        record.rejection_reason,
        _json_strings("context_holders", record.context_holders),
    )


def handoff_from_row(fetched: Sequence[Any]) -> HandoffRecord:
    """A record from its row."""
    row = HANDOFFS.of(fetched)
    return HandoffRecord(
        request_id=row.request_id,
        from_agent=row.from_agent,
        to_agent=row.to_agent,
        state=row.state,
        created_at=row.created_at,
        updated_at=row.updated_at,
        deadline=row.deadline,
        timeout_s=row.timeout_s,
        requested_to=row.requested_to,
        reason=row.reason,
        context_snapshot=bytes(row.context_snapshot),
        snapshot_content_type=row.snapshot_content_type,
        capabilities_required=_strings(row.capabilities_required),
        priority=row.priority,
        attempt=row.attempt,
        tried=_strings(row.tried),
        accepting_agent=row.accepting_agent,
        rejection_reason=row.rejection_reason,
        context_holders=_strings(row.context_holders),
    )


def _json_strings(name: str, values: tuple[str, ...]) -> str:
    return dump_json_list(checked_strings(name, values))


def _strings(value: Json) -> tuple[str, ...]:
    return tuple(str(item) for item in json_list_of(value))


_PUT = Execute(by_dialect(lambda d: d.upsert("handoffs", HANDOFFS, "request_id")))
_GET = QueryOne(f"SELECT {HANDOFFS.sql} FROM handoffs WHERE request_id = ?")


def put_handoff(d: Dialect, row: tuple[Any, ...]) -> Transaction[None]:
    """Insert or replace one handoff (`handoff_row`)."""
    yield from Execute(_PUT.sql, row)


class SqlHandoffStore:
    """`HandoffStore` in the `handoffs` table; events that commit with a record go through
    `log`."""

    def __init__(self, database: SqlDatabase, log: SqlEventLog) -> None:
        self._db = database
        self._log = log

    async def put(self, record: HandoffRecord, events: Sequence[EventDraft] = ()) -> None:
        """Insert or replace the record with this request_id, with `events` appended in the
        same transaction."""
        if events:
            await self._log.write_with(events, put_handoff, handoff_row(record))
        else:
            await self._db.write(_PUT, handoff_row(record))

    async def get(self, request_id: str) -> HandoffRecord | None:
        """The record, or None."""
        row = await self._db.read(_GET, (request_id,))
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
        None), created after `after_created`, oldest first (by created_at, then request_id:
        code point order, PostgreSQL's column is COLLATE "C"), at most `limit`."""
        check_limit(limit)
        where = (
            Where()
            .term("created_at > ?", float(after_created))
            .compare("from_agent =", from_agent)
            .compare("to_agent =", to_agent)
            .among("state", states)
        )
        if where.impossible:
            return []
        sql = (
            f"SELECT {HANDOFFS.sql} FROM handoffs WHERE {where.sql}"
            " ORDER BY created_at, request_id LIMIT ?"
        )
        rows = await self._db.read(Query(sql, [*where.params, limit]))
        return [handoff_from_row(row) for row in rows]
