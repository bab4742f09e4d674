"""How records map to table rows, for both SQL backends (the column lists and tuples).

Both schemas use the same column names and order; only the placeholders and the JSON types
differ (SQLite keeps JSON as text, PostgreSQL as JSONB, which psycopg hands back parsed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from apiary.core.events import Event
from apiary.core.records import AgentRecord, MessageState, StoredMessage
from apiary.store.json_codec import dump_json, load_json_object

EVENT_COLUMNS = "sequence, event_type, actor, ts, correlation_id, agent_id, details, hlc"
AGENT_COLUMNS = "agent_id, name, state, registered_at, last_heartbeat_at, descriptor"
MESSAGE_COLUMNS = (
    "message_id, recipient, producer_id, correlation_id, message_type, envelope, state,"
    " created_at, updated_at, inbox_offset, error_code"
)


def check_limit(limit: int) -> None:
    """Refuse a negative LIMIT (SQLite would read it as "no limit", PostgreSQL fails)."""
    if limit < 0:
        raise ValueError(f"limit must not be negative: {limit}")


def event_from_row(row: Sequence[Any]) -> Event:
    """An `Event` from a row of EVENT_COLUMNS."""
    sequence, event_type, actor, ts, correlation_id, agent_id, details, hlc = row
    return Event(
        sequence=sequence,
        event_type=event_type,
        actor=actor,
        ts=ts,
        correlation_id=correlation_id,
        agent_id=agent_id,
        details=_json_object(details),
        hlc=hlc,
    )


def agent_row(agent: AgentRecord) -> tuple[Any, ...]:
    """The values of AGENT_COLUMNS for `agent`, its descriptor as JSON text."""
    return (
        agent.agent_id,
        agent.name,
        agent.state,
        agent.registered_at,
        agent.last_heartbeat_at,
        dump_json(agent.descriptor),
    )


def agent_from_row(row: Sequence[Any]) -> AgentRecord:
    """An `AgentRecord` from a row of AGENT_COLUMNS."""
    agent_id, name, state, registered_at, last_heartbeat_at, descriptor = row
    return AgentRecord(
        agent_id=agent_id,
        name=name,
        state=state,
        registered_at=registered_at,
        last_heartbeat_at=last_heartbeat_at,
        descriptor=_json_object(descriptor),
    )


def message_row(message: StoredMessage, offset: int) -> tuple[Any, ...]:
    """The values of MESSAGE_COLUMNS for `message` admitted at `offset`."""
    return (
        message.message_id,
        message.recipient,
        message.producer_id,
        message.correlation_id,
        message.message_type,
        bytes(message.envelope),
        message.state.value,
        message.created_at,
        message.updated_at,
        offset,
        message.error_code,
    )


def message_from_row(row: Sequence[Any]) -> StoredMessage:
    """A `StoredMessage` from a row of MESSAGE_COLUMNS."""
    message_id, recipient, producer_id, correlation_id, message_type, envelope, state = row[:7]
    created_at, updated_at, offset, error_code = row[7:]
    return StoredMessage(
        message_id=message_id,
        recipient=recipient,
        producer_id=producer_id,
        correlation_id=correlation_id,
        message_type=message_type,
        envelope=bytes(envelope),
        state=MessageState(state),
        created_at=created_at,
        updated_at=updated_at,
        offset=offset,
        error_code=error_code,
    )


def _json_object(value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return dict(value)  # already parsed by the driver (JSONB)
    return load_json_object(value)
