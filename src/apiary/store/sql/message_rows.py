"""The `messages` table's rows: a message's columns (`MessageRow`, `MESSAGES`), its values as
written (`message_values`) and read back (`message_from_row`), and which of some ids are
stored (`existing_ids`); shared by the admission transactions (store/sql/admission.py) and
the message store (store/sql/messages.py).
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from apiary.core.records import MessageState, StoredMessage, state_text
from apiary.store.sql.checks import sequence_from_sql, sequence_to_sql
from apiary.store.sql.columns import Columns
from apiary.store.sql.dialect import Dialect, in_list
from apiary.store.sql.statements import Query, Row, Transaction


class MessageRow(NamedTuple):
    """A row of `messages`; inbox_offset comes last (the store assigns it)."""

    message_id: str
    recipient: str
    producer_id: str
    correlation_id: str
    message_type: int
    envelope: bytes
    state: str
    created_at: float
    updated_at: float
    error_code: str
    idempotency_token: str
    sequence_number: int
    lane: str
    ack_deadline: float
    expires_at: float
    deliveries: int
    last_delivered_at: float
    acked_stage: str
    signature: bytes
    inbox_offset: int


MESSAGES = Columns(MessageRow)
ID: Final = MESSAGES.names.index("message_id")
RECIPIENT: Final = MESSAGES.names.index("recipient")
ID_CHUNK: Final = 500
"""Message ids per `IN (...)` list, well under either database's limit on parameters."""


def message_values(message: StoredMessage) -> tuple[Any, ...]:
    """The values of `MessageRow` for `message` but the last, inbox_offset.

    A plain tuple in `MessageRow`'s field order: built once per admitted message, on the
    event loop, where a named tuple would cost half as much again. Raises ValueError for a
    sequence number that is not a uint64.
    """
    return (
        message.message_id,
        message.recipient,
        message.producer_id,
        message.correlation_id,
        int(message.message_type),
        bytes(message.envelope),
        state_text(message.state),
        float(message.created_at),
        float(message.updated_at),
        message.error_code,
        message.idempotency_token,
        sequence_to_sql(message.sequence_number),
        message.lane,
        float(message.ack_deadline),
        float(message.expires_at),
        int(message.deliveries),
        float(message.last_delivered_at),
        message.acked_stage,
        bytes(message.signature),
    )


def message_from_row(fetched: Row) -> StoredMessage:
    """A `StoredMessage` from a fetched row of `MESSAGES`."""
    row = MESSAGES.of(fetched)
    return StoredMessage(
        message_id=row.message_id,
        recipient=row.recipient,
        producer_id=row.producer_id,
        correlation_id=row.correlation_id,
        message_type=row.message_type,
        envelope=bytes(row.envelope),
        state=MessageState(row.state),
        created_at=row.created_at,
        updated_at=row.updated_at,
        offset=row.inbox_offset,
        error_code=row.error_code,
        idempotency_token=row.idempotency_token,
        sequence_number=sequence_from_sql(row.sequence_number),
        lane=row.lane,
        ack_deadline=row.ack_deadline,
        expires_at=row.expires_at,
        deliveries=row.deliveries,
        last_delivered_at=row.last_delivered_at,
        acked_stage=row.acked_stage,
        signature=bytes(row.signature),
    )


def existing_ids(d: Dialect, message_ids: list[str]) -> Transaction[set[str]]:
    unique = list(dict.fromkeys(message_ids))
    found: set[str] = set()
    for start in range(0, len(unique), ID_CHUNK):
        chunk = unique[start : start + ID_CHUNK]
        sql = f"SELECT message_id FROM messages WHERE {in_list('message_id', len(chunk))}"
        rows = yield from Query(sql, chunk)
        found.update(row[0] for row in rows)
    return found
