"""The resumable channel's rules (the contract's reconnect_channel and ack_events): pure
decisions over a channel's record, the time and the event log's last sequence.

A channel is an application's cursor over one session's event stream. It is resumed with its
id, its resume token (kept as a digest only) and a position: the sequence of the last event
the application holds, at least the last one it acknowledged. Acknowledging releases what
comes before: a position below the acknowledged sequence is expired, and so is a channel not
used within its time to live; either way the application recovers by opening a new channel,
whose snapshot is the session's whole state.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import replace

from apiary.core.dedup import iso_utc
from apiary.core.runtime.records import ChannelRecord
from apiary.errors import PermissionDeniedError, ResumeExpiredError, ValidationError

RECOVER = "open a new channel (reconnect_channel with the session_id and no channel_id): it answers the session's snapshot and the position to follow from"  # noqa: E501


def token_digest(token: str) -> str:
    """What the store keeps of a resume token."""
    return hashlib.sha256(token.encode()).hexdigest()


def opened(
    channel_id: str, session_id: str, owner: str, token: str, *, at: int, now: float, ttl_s: float
) -> ChannelRecord:
    """A new channel, acknowledged up to sequence `at` (what its first snapshot reflects)."""
    return ChannelRecord(
        channel_id, session_id, owner, token_digest(token), at, now, now, now + ttl_s
    )


def resume_position(
    channel: ChannelRecord, token: str, position: int | None, *, now: float, last: int
) -> int:
    """The sequence to replay after when the channel is resumed from `position` (None: its
    acknowledged sequence). A token that is not the channel's is permission_denied; an
    expired channel or a released position resume_expired (the message says how to
    recover); a position past the log's last sequence `last` validation_error."""
    if not hmac.compare_digest(token_digest(token), channel.token_digest):
        raise PermissionDeniedError(
            f"resume_token: not the token of channel {channel.channel_id}",
            {"field": "resume_token", "channel_id": channel.channel_id},
        )
    if now >= channel.expires_at:
        raise ResumeExpiredError(
            f"channel {channel.channel_id} expired at {iso_utc(channel.expires_at)} (unused "
            f"since {iso_utc(channel.updated_at)}); {RECOVER}",
            {"field": "channel_id", "reason": "channel_expired", "channel_id": channel.channel_id},
        )
    if position is None:
        return channel.acked_sequence
    if position < 0:
        raise ValidationError.for_field("last_acknowledged_sequence", "must not be negative")
    if position < channel.acked_sequence:
        raise ResumeExpiredError(
            f"last_acknowledged_sequence: {position} lies before {channel.acked_sequence}, "
            f"which channel {channel.channel_id} acknowledged (the events up to it were "
            f"released); resume from {channel.acked_sequence} or later, or {RECOVER}",
            {
                "field": "last_acknowledged_sequence", "reason": "position_released",
                "acknowledged_sequence": str(channel.acked_sequence),
            },
        )  # fmt: skip
    if position > last:
        raise ValidationError.for_field(
            "last_acknowledged_sequence", f"{position} lies past the last event ({last})"
        )
    return position


def acknowledged(
    channel: ChannelRecord, sequence: int, *, now: float, last: int, ttl_s: float
) -> ChannelRecord:
    """The channel once the application acknowledged every event up to `sequence`: its
    acknowledged sequence never goes back, and its time to live starts again."""
    if sequence < 0:
        raise ValidationError.for_field("sequence", "must not be negative")
    if sequence > last:
        raise ValidationError.for_field("sequence", f"{sequence} lies past the last event ({last})")
    return replace(
        channel, acked_sequence=max(channel.acked_sequence, sequence), updated_at=now,
        expires_at=now + ttl_s,
    )  # fmt: skip


def touched(channel: ChannelRecord, *, now: float, ttl_s: float) -> ChannelRecord:
    """The channel once resumed: its time to live starts again."""
    return replace(channel, updated_at=now, expires_at=now + ttl_s)
