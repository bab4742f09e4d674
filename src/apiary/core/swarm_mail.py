"""Swarm messages as stored (Agent Swarm Protocol 0.1.0, "Message Persistence"): the inbox of
messages received from peers and the outbox of messages sent to them.

Inbox statuses move forward only: unread -> read -> archived -> deleted, any step may be
skipped, and a move to the current status changes nothing. A deleted message stays in the
table (so that a replay of its message_id is still recognised) but is left out of listings.
Outbox rows are per destination: a broadcast to three members is three rows with one
message_id, each sent -> delivered or sent -> failed with its own attempt count. A destination
that could not be reached (no answer, 5xx, 429) is `retrying` until `next_attempt_at`, and
tried again in the background until it answers or the courier gives up (failed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

INBOX_STATUSES: Final = ("unread", "read", "archived", "deleted")
OUTBOX_STATUSES: Final = ("sent", "retrying", "delivered", "failed")
PENDING_STATUSES: Final = ("sent", "retrying")
"""Outbox rows whose delivery has not ended."""
RECENT_LIMIT: Final = 100
"""list_recent never returns more than this many messages (the protocol's cap)."""


class IllegalStatusError(ValueError):
    """An inbox status that does not exist, or a move backwards."""


def inbox_move(current: str, wanted: str) -> str:
    """The status after asking to move a message from `current` to `wanted`."""
    if wanted not in INBOX_STATUSES:
        raise IllegalStatusError(
            f"status must be one of {', '.join(INBOX_STATUSES)}, not {wanted!r}"
        )
    if INBOX_STATUSES.index(wanted) < INBOX_STATUSES.index(current):
        raise IllegalStatusError(f"a {current} message cannot become {wanted} again")
    return wanted


def capped(limit: int) -> int:
    """`limit` for a recent-messages listing: at most RECENT_LIMIT; negative refused."""
    if limit < 0:
        raise ValueError(f"limit must not be negative: {limit}")
    return min(limit, RECENT_LIMIT)


@dataclass(frozen=True, slots=True)
class SwarmMail:
    """One swarm message's stored fields. `wire` is the whole message as it travelled
    (signature and unknown fields included); the other fields are its indexed parts."""

    message_id: str
    swarm_id: str
    sender_id: str
    recipient_id: str
    """An agent_id or "broadcast"."""
    message_type: str
    """message, system or notification."""
    content: str
    sent_at: str = ""
    """The sender's timestamp, as sent."""
    in_reply_to: str | None = None
    thread_id: str | None = None
    priority: str = "normal"
    expires_at: str | None = None
    references: tuple[dict[str, Any], ...] = ()
    attachments: tuple[dict[str, Any], ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)
    wire: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class InboxEntry:
    mail: SwarmMail
    received_at: float
    status: str = "unread"
    read_at: float | None = None
    """When it was first marked read."""
    deleted_at: float | None = None


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    mail: SwarmMail
    destination: str
    """The member this row is the delivery to."""
    created_at: float
    status: str = "sent"
    attempts: int = 0
    updated_at: float = 0.0
    error: str = ""
    """Why the last attempt failed."""
    next_attempt_at: float = 0.0
    """When a `retrying` row is tried again."""
