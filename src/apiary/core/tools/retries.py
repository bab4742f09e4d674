"""When a failed tool call is tried again, and after how long (RFC 18.2, 18.3).

Callers SHOULD retry transient errors a bounded number of times and MUST NOT retry
non-idempotent tools: a call is tried again only when its tool is idempotent, its error is
transient (`TRANSIENT_CODES`: the tool or its wall clock timed out, the provider was
unavailable) and `policy.max_retries` allows another attempt. The pause before retry n
(1-based) follows `policy.backoff`.
"""

from __future__ import annotations

from typing import Final

from apiary.errors import ValidationError

BACKOFFS: Final = ("exponential", "linear", "constant", "none")
TRANSIENT_CODES: Final = frozenset(
    {"tool_timeout", "wall_timeout", "unavailable", "agent_unavailable", "ack_timeout",
     "buffer_full"}
)  # fmt: skip
"""Failures that may pass on their own (compared case-insensitively)."""


def parse_backoff(text: str) -> str:
    """'' -> exponential; case-insensitive; anything else names the field in the error."""
    value = text.strip().lower()
    if not value:
        return "exponential"
    if value not in BACKOFFS:
        raise ValidationError.for_field(
            "backoff", f"unknown value {text!r} (expected one of {', '.join(BACKOFFS)})"
        )
    return value


def is_transient(code: str) -> bool:
    return code.casefold() in TRANSIENT_CODES


def may_retry(code: str, *, idempotent: bool, retries_done: int, max_retries: int) -> bool:
    """Whether a call that failed with `code` after `retries_done` retries is tried again."""
    return idempotent and is_transient(code) and retries_done < max_retries


def backoff_delay(backoff: str, retry: int, base_s: float, cap_s: float) -> float:
    """Seconds to wait before retry number `retry` (1-based), at most `cap_s`."""
    if backoff == "none" or base_s <= 0:
        return 0.0
    if backoff == "constant":
        delay = base_s
    elif backoff == "linear":
        delay = base_s * retry
    else:
        delay = base_s * 2 ** (retry - 1)
    return min(delay, cap_s)
