"""The swarm store: the Agent Swarm Protocol's inbox and outbox, `swarm_inbox` and
`swarm_outbox` (`core/swarm_mail.py`).

Both tables lead with the mail's columns. JSON columns (refs, attachments, metadata, wire)
are JSON text (SQLite) or JSONB (PostgreSQL); `references` is an SQL keyword, so the column
is `refs`. The rows are shared with the memory backend, which runs them so that it refuses
what the SQL backends refuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from apiary.core.swarm_mail import (
    INBOX_STATUSES,
    OUTBOX_STATUSES,
    InboxEntry,
    OutboxEntry,
    SwarmMail,
    capped,
)
from apiary.store.json_codec import dump_json, dump_json_list, json_list_of, json_object_of
from apiary.store.sql.columns import Columns, Json
from apiary.store.sql.database import SqlDatabase
from apiary.store.sql.dialect import Dialect, by_dialect
from apiary.store.sql.statements import Execute, Query, QueryOne, Transaction
from apiary.store.sql.where import Where


class InboxRow(NamedTuple):
    """A row of `swarm_inbox`: the mail's columns, then the inbox's."""

    message_id: str
    swarm_id: str
    sender_id: str
    recipient_id: str
    message_type: str
    content: str
    sent_at: str
    in_reply_to: str | None
    thread_id: str | None
    priority: str
    expires_at: str | None
    refs: Json
    attachments: Json
    metadata: Json
    wire: Json
    received_at: float
    status: str
    read_at: float | None
    deleted_at: float | None


class OutboxRow(NamedTuple):
    """A row of `swarm_outbox`: the mail's columns, then the delivery to `destination`."""

    message_id: str
    swarm_id: str
    sender_id: str
    recipient_id: str
    message_type: str
    content: str
    sent_at: str
    in_reply_to: str | None
    thread_id: str | None
    priority: str
    expires_at: str | None
    refs: Json
    attachments: Json
    metadata: Json
    wire: Json
    destination: str
    created_at: float
    status: str
    attempts: int
    updated_at: float
    error: str
    next_attempt_at: float


_MAIL_JSON = ("refs", "attachments", "metadata", "wire")
INBOX = Columns(InboxRow, json=_MAIL_JSON)
OUTBOX = Columns(OutboxRow, json=_MAIL_JSON)


def _text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, not {type(value).__name__}")
    if "\x00" in value:
        raise ValueError(f"{name} must not contain NUL characters")
    return value


def _no_nul(value: object) -> None:
    """PostgreSQL's TEXT and JSONB cannot hold NUL: every backend refuses it alike."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("JSON fields must not contain NUL characters")
    elif isinstance(value, dict):
        for key, item in value.items():
            _no_nul(key)
            _no_nul(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _no_nul(item)


def _optional(value: object, name: str) -> str | None:
    return None if value is None else _text(value, name)


def mail_columns(mail: SwarmMail) -> dict[str, Any]:
    """The mail's columns by name, which both row types lead with; ValueError for what no
    backend can store (NULs, non-JSON values)."""
    for name in ("message_id", "swarm_id", "sender_id", "recipient_id", "message_type"):
        if not _text(getattr(mail, name), name):
            raise ValueError(f"{name} must not be empty")
    json_texts = {
        "refs": dump_json_list(list(mail.references)),
        "attachments": dump_json_list(list(mail.attachments)),
        "metadata": dump_json(mail.metadata),
        "wire": dump_json(mail.wire),
    }
    _no_nul((mail.references, mail.attachments, mail.metadata, mail.wire))
    return {
        "message_id": mail.message_id, "swarm_id": mail.swarm_id,
        "sender_id": mail.sender_id, "recipient_id": mail.recipient_id,
        "message_type": mail.message_type, "content": _text(mail.content, "content"),
        "sent_at": _text(mail.sent_at, "sent_at"),
        "in_reply_to": _optional(mail.in_reply_to, "in_reply_to"),
        "thread_id": _optional(mail.thread_id, "thread_id"),
        "priority": _text(mail.priority, "priority"),
        "expires_at": _optional(mail.expires_at, "expires_at"), **json_texts,
    }  # fmt: skip


def mail_from_row(row: InboxRow | OutboxRow) -> SwarmMail:
    """The mail of either row type."""
    return SwarmMail(
        message_id=row.message_id, swarm_id=row.swarm_id, sender_id=row.sender_id,
        recipient_id=row.recipient_id, message_type=row.message_type, content=row.content,
        sent_at=row.sent_at, in_reply_to=row.in_reply_to, thread_id=row.thread_id,
        priority=row.priority, expires_at=row.expires_at,
        references=tuple(json_list_of(row.refs)),
        attachments=tuple(json_list_of(row.attachments)),
        metadata=json_object_of(row.metadata), wire=json_object_of(row.wire),
    )  # fmt: skip


def check_inbox_status(status: str) -> str:
    """`status` when it is an inbox status; ValueError otherwise."""
    if status not in INBOX_STATUSES:
        raise ValueError(f"inbox status must be one of {INBOX_STATUSES}, not {status!r}")
    return status


def inbox_row(entry: InboxEntry) -> InboxRow:
    """The entry's row; ValueError as `mail_columns`, or for an unknown status."""
    check_inbox_status(entry.status)
    return InboxRow(
        **mail_columns(entry.mail),
        received_at=float(entry.received_at),
        status=entry.status,
        read_at=None if entry.read_at is None else float(entry.read_at),
        deleted_at=None if entry.deleted_at is None else float(entry.deleted_at),
    )


def inbox_from_row(row: InboxRow) -> InboxEntry:
    """The entry of a row."""
    return InboxEntry(
        mail_from_row(row), float(row.received_at), row.status,
        None if row.read_at is None else float(row.read_at),
        None if row.deleted_at is None else float(row.deleted_at),
    )  # fmt: skip


def outbox_row(entry: OutboxEntry) -> OutboxRow:
    """The entry's row; ValueError as `mail_columns`, for an unknown status or an empty
    destination."""
    if entry.status not in OUTBOX_STATUSES:
        raise ValueError(f"outbox status must be one of {OUTBOX_STATUSES}, not {entry.status!r}")
    if not _text(entry.destination, "destination"):
        raise ValueError("destination must not be empty")
    return OutboxRow(
        **mail_columns(entry.mail),
        destination=entry.destination,
        created_at=float(entry.created_at),
        status=entry.status,
        attempts=int(entry.attempts),
        updated_at=float(entry.updated_at),
        error=_text(entry.error, "error"),
        next_attempt_at=float(entry.next_attempt_at),
    )


def outbox_from_row(row: OutboxRow) -> OutboxEntry:
    """The entry of a row."""
    return OutboxEntry(
        mail_from_row(row), row.destination, float(row.created_at), row.status,
        int(row.attempts), float(row.updated_at), row.error, float(row.next_attempt_at),
    )  # fmt: skip


def status_filter(statuses: frozenset[str] | None, known: Sequence[str], hidden: str = "") -> Where:
    """A WHERE clause on `status` for `statuses` (impossible for none); ValueError for a
    status not in `known`. With no `statuses`, rows in the `hidden` status are left out
    (the inbox's deleted)."""
    if statuses is None:
        return Where().term("status <> ?", hidden) if hidden else Where()
    for status in statuses:
        if status not in known:
            raise ValueError(f"status must be one of {', '.join(known)}, not {status!r}")
    return Where().among("status", statuses)


_RECEIVE = by_dialect(
    lambda d: d.insert("swarm_inbox", INBOX, " ON CONFLICT (message_id) DO NOTHING")
)
_INBOX_GET = f"SELECT {INBOX.sql} FROM swarm_inbox WHERE message_id = ?"
# Parameters: status, status, at, status, at, message_id.
_SET_STATUS = (
    "UPDATE swarm_inbox SET status = ?,"
    " read_at = CASE WHEN ? = 'read' AND read_at IS NULL THEN ? ELSE read_at END,"
    " deleted_at = CASE WHEN ? = 'deleted' THEN ? ELSE deleted_at END"
    " WHERE message_id = ?"
)
_THREAD_LATEST = (
    f"SELECT {INBOX.sql} FROM swarm_inbox WHERE message_id = ? OR thread_id = ?"
    " ORDER BY received_at DESC, message_id DESC LIMIT 1"
)
_OUTBOX_PUT = by_dialect(lambda d: d.upsert("swarm_outbox", OUTBOX, ("message_id", "destination")))
_OUTBOX_GET = f"SELECT {OUTBOX.sql} FROM swarm_outbox WHERE message_id = ? ORDER BY destination"
_OUTBOX_PENDING = (
    f"SELECT {OUTBOX.sql} FROM swarm_outbox WHERE status IN ('sent', 'retrying')"
    " ORDER BY next_attempt_at, created_at, message_id, destination LIMIT ?"
)


class SqlSwarmStore:
    """`SwarmStore` in `swarm_inbox` and `swarm_outbox`."""

    def __init__(self, database: SqlDatabase) -> None:
        self._db = database

    async def receive(self, entry: InboxEntry) -> bool:
        """Keep a received message; False when its message_id is already kept."""
        return await self._db.write(Execute(_RECEIVE, inbox_row(entry))) > 0

    async def inbox_get(self, message_id: str) -> InboxEntry | None:
        """The received message, or None."""
        row = await self._db.read(QueryOne(_INBOX_GET, (message_id,)))
        return None if row is None else inbox_from_row(INBOX.of(row))

    async def list_recent(
        self,
        swarm_id: str | None = None,
        limit: int = 50,
        statuses: frozenset[str] | None = None,
    ) -> list[InboxEntry]:
        """Received messages, newest first (deleted ones only when asked for)."""
        term = status_filter(statuses, INBOX_STATUSES, hidden="deleted")
        rows = await self._recent("swarm_inbox", term, swarm_id, limit)
        return [inbox_from_row(INBOX.of(row)) for row in rows]

    async def set_status(self, message_id: str, status: str, at: float) -> InboxEntry | None:
        """Change a received message's status at `at`; the entry after, or None."""
        check_inbox_status(status)
        params = (status, status, float(at), status, float(at), message_id)
        row = await self._db.write(_set_status, params, message_id)
        return None if row is None else inbox_from_row(INBOX.of(row))

    async def thread_latest(self, key: str) -> InboxEntry | None:
        """The newest received message that is `key` or of thread `key`, or None."""
        row = await self._db.read(QueryOne(_THREAD_LATEST, (key, key)))
        return None if row is None else inbox_from_row(INBOX.of(row))

    async def outbox_put(self, entry: OutboxEntry) -> None:
        """Insert or replace the delivery of the message to the entry's destination."""
        await self._db.write(Execute(_OUTBOX_PUT, outbox_row(entry)))

    async def outbox_get(self, message_id: str) -> list[OutboxEntry]:
        """The message's deliveries, by destination."""
        rows = await self._db.read(Query(_OUTBOX_GET, (message_id,)))
        return [outbox_from_row(OUTBOX.of(row)) for row in rows]

    async def outbox_recent(
        self,
        swarm_id: str | None = None,
        limit: int = 50,
        statuses: frozenset[str] | None = None,
    ) -> list[OutboxEntry]:
        """Deliveries, newest first."""
        term = status_filter(statuses, OUTBOX_STATUSES)
        rows = await self._recent("swarm_outbox", term, swarm_id, limit)
        return [outbox_from_row(OUTBOX.of(row)) for row in rows]

    async def outbox_pending(self, limit: int = 100) -> list[OutboxEntry]:
        """Deliveries still to be attempted, the earliest due first."""
        rows = await self._db.read(Query(_OUTBOX_PENDING, (capped(limit),)))
        return [outbox_from_row(OUTBOX.of(row)) for row in rows]

    async def _recent(
        self, table: str, where: Where, swarm_id: str | None, limit: int
    ) -> list[tuple[Any, ...]]:
        """A newest-first listing of `table` (swarm_inbox or swarm_outbox) filtered by
        `where` (a status filter) and `swarm_id`."""
        if where.impossible:
            return []
        where.compare("swarm_id =", swarm_id)
        inbox = table == "swarm_inbox"
        columns = INBOX.sql if inbox else OUTBOX.sql
        order = (
            "received_at DESC, message_id DESC" if inbox
            else "created_at DESC, message_id DESC, destination DESC"
        )  # fmt: skip
        sql = f"SELECT {columns} FROM {table} WHERE {where.sql} ORDER BY {order} LIMIT ?"
        return await self._db.read(Query(sql, [*where.params, capped(limit)]))


def _set_status(
    d: Dialect, params: tuple[Any, ...], message_id: str
) -> Transaction[tuple[Any, ...] | None]:
    yield from Execute(_SET_STATUS, params)
    return (yield from QueryOne(_INBOX_GET, (message_id,)))
