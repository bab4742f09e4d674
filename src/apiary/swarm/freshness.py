"""Whether a signed message is still good to process at `now` (pure: time is an argument).

The protocol has `expires_at` but no replay rule. Apiary adds a window on the sender's
`timestamp`: a message stamped more than `max_age_s` ago (default 15 minutes) or more than
`max_skew_s` ahead (default 5 minutes of clock skew) is refused, so that a captured message
cannot be replayed later than that; inside the window a replay carries a message_id already
in the inbox and is answered like the original without being processed again. The window
bounds nothing else: every message_id ever received stays known in the inbox.
"""

from __future__ import annotations

from dataclasses import dataclass

from apiary.swarm.errors import SwarmError
from apiary.swarm.wire import SwarmMessage, parse_timestamp


@dataclass(frozen=True, slots=True)
class Window:
    max_age_s: float = 900.0
    max_skew_s: float = 300.0

    def __post_init__(self) -> None:
        if self.max_age_s <= 0 or self.max_skew_s < 0:
            raise ValueError(f"a freshness window needs max_age_s > 0 and max_skew_s >= 0: {self}")


def check_fresh(message: SwarmMessage, now: float, window: Window = Window()) -> None:
    """400 MESSAGE_EXPIRED (field expires_at) or STALE_MESSAGE (field timestamp)."""
    if message.expires_at is not None:
        expires = parse_timestamp(message.expires_at, "expires_at")
        if expires <= now:
            raise SwarmError(
                400, "MESSAGE_EXPIRED", f"message {message.message_id} expired at "
                f"{message.expires_at}", field="expires_at",
            )  # fmt: skip
    sent = parse_timestamp(message.timestamp, "timestamp")
    if sent < now - window.max_age_s:
        raise SwarmError(
            400, "STALE_MESSAGE", f"timestamp {message.timestamp} is more than "
            f"{window.max_age_s:g} s old: refused as a possible replay", field="timestamp",
        )  # fmt: skip
    if sent > now + window.max_skew_s:
        raise SwarmError(
            400, "STALE_MESSAGE", f"timestamp {message.timestamp} is more than "
            f"{window.max_skew_s:g} s in the future", field="timestamp",
        )  # fmt: skip
