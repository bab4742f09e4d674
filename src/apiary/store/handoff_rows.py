"""How handoff records map to rows of the `handoffs` table, for both SQL backends (and the
memory backend, which runs the same encoder so that it refuses what they refuse)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from apiary.core.handoff import HandoffState
from apiary.core.records import HandoffRecord
from apiary.store.json_codec import dump_json_list, load_json_list
from apiary.store.sql_rows import checked_int64, checked_strings

HANDOFF_COLUMNS = (
    "request_id, from_agent, to_agent, state, created_at, updated_at, deadline, timeout_s,"
    " requested_to, reason, context_snapshot, snapshot_content_type, capabilities_required,"
    " priority, attempt, tried, accepting_agent, rejection_reason, context_holders"
)
HANDOFF_COLUMN_COUNT = 19
HANDOFF_JSON_COLUMNS = frozenset({"capabilities_required", "tried", "context_holders"})
"""The columns that hold JSON arrays (text in SQLite, JSONB in PostgreSQL)."""

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def handoff_row(record: HandoffRecord) -> tuple[Any, ...]:
    """The values of HANDOFF_COLUMNS for `record`.

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
        dump_json_list(checked_strings("capabilities_required", record.capabilities_required)),
        checked_int64("priority", record.priority),
        checked_int64("attempt", record.attempt),
        dump_json_list(checked_strings("tried", record.tried)),
        record.accepting_agent,
        record.rejection_reason,
        dump_json_list(checked_strings("context_holders", record.context_holders)),
    )


def handoff_from_row(row: Sequence[Any]) -> HandoffRecord:
    """A `HandoffRecord` from a row of HANDOFF_COLUMNS."""
    request_id, from_agent, to_agent, state, created_at, updated_at, deadline = row[:7]
    timeout_s, requested_to, reason, snapshot, content_type, capabilities = row[7:13]
    priority, attempt, tried, accepting_agent, rejection_reason, holders = row[13:]
    return HandoffRecord(
        request_id=request_id,
        from_agent=from_agent,
        to_agent=to_agent,
        state=state,
        created_at=created_at,
        updated_at=updated_at,
        deadline=deadline,
        timeout_s=timeout_s,
        requested_to=requested_to,
        reason=reason,
        context_snapshot=bytes(snapshot),
        snapshot_content_type=content_type,
        capabilities_required=_listed(capabilities),
        priority=priority,
        attempt=attempt,
        tried=_listed(tried),
        accepting_agent=accepting_agent,
        rejection_reason=rejection_reason,
        context_holders=_listed(holders),
    )


def handoff_list_clauses(
    states: frozenset[str] | None,
    from_agent: str | None,
    to_agent: str | None,
    after_created: float,
    placeholder: str,
) -> tuple[list[str], list[Any]] | None:
    """The WHERE terms and parameters of a handoff listing; None when nothing can match (an
    empty set of states)."""
    clauses = [f"created_at > {placeholder}"]
    params: list[Any] = [float(after_created)]
    for column, value in (("from_agent", from_agent), ("to_agent", to_agent)):
        if value is not None:
            clauses.append(f"{column} = {placeholder}")
            params.append(value)
    if states is not None:
        if not states:
            return None
        values = sorted(states)
        clauses.append(f"state IN ({', '.join([placeholder] * len(values))})")
        params.extend(values)
    return clauses, params


def _listed(value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, list) else load_json_list(value)  # JSONB: parsed
    return tuple(str(item) for item in items)
