"""How swarm inbox and outbox entries map to rows of `swarm_inbox` and `swarm_outbox`, for
both SQL backends and the memory backend (which runs the same encoders, so that it refuses
what they refuse).

JSON columns (refs, attachments, metadata, wire) are text here; PostgreSQL casts them to
JSONB on the way in and psycopg hands them back parsed. `references` is an SQL keyword, so
the column is `refs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from apiary.core.swarm_mail import (
    INBOX_STATUSES,
    OUTBOX_STATUSES,
    InboxEntry,
    OutboxEntry,
    SwarmMail,
)
from apiary.store.json_codec import (
    dump_json,
    dump_json_list,
    json_list_of,
    json_object_of,
)

MAIL_COLUMNS = (
    "message_id, swarm_id, sender_id, recipient_id, message_type, content, sent_at,"
    " in_reply_to, thread_id, priority, expires_at, refs, attachments, metadata, wire"
)
MAIL_COLUMN_COUNT = 15
MAIL_JSON_COLUMNS = frozenset({"refs", "attachments", "metadata", "wire"})
INBOX_COLUMNS = f"{MAIL_COLUMNS}, received_at, status, read_at, deleted_at"
INBOX_COLUMN_COUNT = MAIL_COLUMN_COUNT + 4
OUTBOX_COLUMNS = (
    f"{MAIL_COLUMNS}, destination, created_at, status, attempts, updated_at, error, next_attempt_at"
)
OUTBOX_COLUMN_COUNT = MAIL_COLUMN_COUNT + 7


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


def mail_row(mail: SwarmMail) -> tuple[Any, ...]:
    """The values of MAIL_COLUMNS; ValueError for what no backend can store (NULs, non-JSON
    values)."""
    for name in ("message_id", "swarm_id", "sender_id", "recipient_id", "message_type"):
        if not _text(getattr(mail, name), name):
            raise ValueError(f"{name} must not be empty")
    json_texts = (
        dump_json_list(list(mail.references)), dump_json_list(list(mail.attachments)),
        dump_json(mail.metadata), dump_json(mail.wire),
    )  # fmt: skip
    _no_nul((mail.references, mail.attachments, mail.metadata, mail.wire))
    return (
        mail.message_id, mail.swarm_id, mail.sender_id, mail.recipient_id, mail.message_type,
        _text(mail.content, "content"), _text(mail.sent_at, "sent_at"),
        _optional(mail.in_reply_to, "in_reply_to"), _optional(mail.thread_id, "thread_id"),
        _text(mail.priority, "priority"), _optional(mail.expires_at, "expires_at"), *json_texts,
    )  # fmt: skip


def mail_from_row(row: Sequence[Any]) -> SwarmMail:
    (message_id, swarm_id, sender_id, recipient_id, message_type, content, sent_at,
     in_reply_to, thread_id, priority, expires_at, refs, attachments, metadata,
     wire) = row[:MAIL_COLUMN_COUNT]  # fmt: skip
    return SwarmMail(
        message_id=message_id, swarm_id=swarm_id, sender_id=sender_id,
        recipient_id=recipient_id, message_type=message_type, content=content, sent_at=sent_at,
        in_reply_to=in_reply_to, thread_id=thread_id, priority=priority, expires_at=expires_at,
        references=tuple(json_list_of(refs)), attachments=tuple(json_list_of(attachments)),
        metadata=json_object_of(metadata), wire=json_object_of(wire),
    )  # fmt: skip


def check_inbox_status(status: str) -> str:
    if status not in INBOX_STATUSES:
        raise ValueError(f"inbox status must be one of {INBOX_STATUSES}, not {status!r}")
    return status


def inbox_row(entry: InboxEntry) -> tuple[Any, ...]:
    check_inbox_status(entry.status)
    return (
        *mail_row(entry.mail), float(entry.received_at), entry.status,
        None if entry.read_at is None else float(entry.read_at),
        None if entry.deleted_at is None else float(entry.deleted_at),
    )  # fmt: skip


def inbox_from_row(row: Sequence[Any]) -> InboxEntry:
    received_at, status, read_at, deleted_at = row[MAIL_COLUMN_COUNT:]
    return InboxEntry(
        mail_from_row(row), float(received_at), status,
        None if read_at is None else float(read_at),
        None if deleted_at is None else float(deleted_at),
    )  # fmt: skip


def outbox_row(entry: OutboxEntry) -> tuple[Any, ...]:
    if entry.status not in OUTBOX_STATUSES:
        raise ValueError(f"outbox status must be one of {OUTBOX_STATUSES}, not {entry.status!r}")
    if not _text(entry.destination, "destination"):
        raise ValueError("destination must not be empty")
    return (
        *mail_row(entry.mail), entry.destination, float(entry.created_at), entry.status,
        int(entry.attempts), float(entry.updated_at), _text(entry.error, "error"),
        float(entry.next_attempt_at),
    )  # fmt: skip


def outbox_from_row(row: Sequence[Any]) -> OutboxEntry:
    destination, created_at, status, attempts, updated_at, error, due = row[MAIL_COLUMN_COUNT:]
    return OutboxEntry(
        mail_from_row(row), destination, float(created_at), status, int(attempts),
        float(updated_at), error, float(due),
    )  # fmt: skip


def status_filter(
    statuses: frozenset[str] | None, known: Sequence[str], placeholder: str, hidden: str = ""
) -> tuple[str, list[str]] | None:
    """A WHERE term on `status` for `statuses` ('' for no term); None when nothing can match.
    With no `statuses`, rows in the `hidden` status are left out (the inbox's deleted)."""
    if statuses is None:
        return (f"status <> {placeholder}", [hidden]) if hidden else ("", [])
    for status in statuses:
        if status not in known:
            raise ValueError(f"status must be one of {', '.join(known)}, not {status!r}")
    if not statuses:
        return None
    values = sorted(statuses)
    return f"status IN ({', '.join([placeholder] * len(values))})", values


def placeholders_for(columns: str, placeholder: str) -> str:
    """The VALUES markers of `columns`: JSON columns cast to JSONB where the dialect needs it
    (placeholder '%s' is PostgreSQL)."""
    marks = []
    for name in columns.split(", "):
        cast = placeholder == "%s" and name in MAIL_JSON_COLUMNS
        marks.append(f"{placeholder}::jsonb" if cast else placeholder)
    return ", ".join(marks)
