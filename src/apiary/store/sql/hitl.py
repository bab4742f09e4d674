"""The HITL store: the `hitl` table, one row per invocation; JSON fields are JSON text
(SQLite) or JSONB (PostgreSQL)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from apiary.core.events import EventDraft
from apiary.core.records import HitlRecord
from apiary.store.json_codec import dump_json, dump_json_list, json_list_of, json_object_of
from apiary.store.sql.checks import check_limit, checked_int64, checked_strings
from apiary.store.sql.columns import Columns, Json
from apiary.store.sql.database import SqlDatabase
from apiary.store.sql.dialect import Dialect, by_dialect
from apiary.store.sql.events import SqlEventLog
from apiary.store.sql.statements import Execute, Query, QueryOne, Transaction
from apiary.store.sql.where import Where


class HitlRow(NamedTuple):
    """A row of `hitl`."""

    invocation_id: str
    reason_type: str
    state: str
    created_at: float
    updated_at: float
    deadline: float
    requested_by: str
    correlation_id: str
    subject: Json
    context: Json
    suggested_action: str
    proposed_actions: Json
    approver_roles: Json
    timeout_action: str
    priority: int
    extensions: int
    decision: Json


HITL = Columns(
    HitlRow, json=("subject", "context", "proposed_actions", "approver_roles", "decision")
)


def hitl_row(record: HitlRecord) -> tuple[Any, ...]:
    """The values of the HITL columns for `record`, in their order, JSON fields as text.

    Raises ValueError when subject, context or decision is not a JSON object of JSON
    values, when an action or role is not a str, or when priority or extensions does not
    fit the 64-bit integer both databases store.
    """
    return (
        record.invocation_id,
        record.reason_type,
        record.state,
        float(record.created_at),
        float(record.updated_at),
        float(record.deadline),
        record.requested_by,
        record.correlation_id,
        dump_json(record.subject),
        dump_json(record.context),
        record.suggested_action,
        dump_json_list(checked_strings("proposed_actions", record.proposed_actions)),
        dump_json_list(checked_strings("approver_roles", record.approver_roles)),
        record.timeout_action,
        checked_int64("priority", record.priority),
        checked_int64("extensions", record.extensions),
        dump_json(record.decision),
    )


def hitl_from_row(fetched: Sequence[Any]) -> HitlRecord:
    """A record from its row."""
    row = HITL.of(fetched)
    return HitlRecord(
        invocation_id=row.invocation_id,
        reason_type=row.reason_type,
        state=row.state,
        created_at=row.created_at,
        updated_at=row.updated_at,
        deadline=row.deadline,
        requested_by=row.requested_by,
        correlation_id=row.correlation_id,
        subject=json_object_of(row.subject),
        context=json_object_of(row.context),
        suggested_action=row.suggested_action,
        proposed_actions=tuple(str(a) for a in json_list_of(row.proposed_actions)),
        approver_roles=tuple(str(r) for r in json_list_of(row.approver_roles)),
        timeout_action=row.timeout_action,
        priority=row.priority,
        extensions=row.extensions,
        decision=json_object_of(row.decision),
    )


_PUT = Execute(by_dialect(lambda d: d.upsert("hitl", HITL, "invocation_id")))
_GET = QueryOne(f"SELECT {HITL.sql} FROM hitl WHERE invocation_id = ?")


def put_hitl(d: Dialect, row: tuple[Any, ...]) -> Transaction[None]:
    """Insert or replace one invocation (`hitl_row`)."""
    yield from Execute(_PUT.sql, row)


class SqlHitlStore:
    """`HitlStore` in the `hitl` table; events that commit with a record go through
    `log`."""

    def __init__(self, database: SqlDatabase, log: SqlEventLog) -> None:
        self._db = database
        self._log = log

    async def put(self, record: HitlRecord, events: Sequence[EventDraft] = ()) -> None:
        """Insert or replace the record with this invocation_id, with `events` appended in
        the same transaction."""
        if events:
            await self._log.write_with(events, put_hitl, hitl_row(record))
        else:
            await self._db.write(_PUT, hitl_row(record))

    async def get(self, invocation_id: str) -> HitlRecord | None:
        """The record, or None."""
        row = await self._db.read(_GET, (invocation_id,))
        return None if row is None else hitl_from_row(row)

    async def list(
        self, states: frozenset[str] | None = None, after_created: float = 0.0, limit: int = 100
    ) -> list[HitlRecord]:
        """Records in `states` (all when None) created after `after_created`, oldest first
        (by created_at, then invocation_id: code point order, PostgreSQL's column is
        COLLATE "C"), at most `limit`."""
        check_limit(limit)
        where = Where().term("created_at > ?", float(after_created)).among("state", states)
        if where.impossible:
            return []
        sql = (
            f"SELECT {HITL.sql} FROM hitl WHERE {where.sql}"
            " ORDER BY created_at, invocation_id LIMIT ?"
        )
        rows = await self._db.read(Query(sql, [*where.params, limit]))
        return [hitl_from_row(row) for row in rows]
