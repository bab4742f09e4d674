"""Idempotency tokens (profile "sw4rm-idempotency-bytes-v1") and the deduplication window.

RFC 11.2 asks tokens to look like `{producer_id}:{operation_type}:{deterministic_hash}`; the
other SDKs fix the hash (spec/INTEROP.md):

    f"{producer}:{operation}:" + sha256(producer + "\\n" + operation + "\\n" + canonical_bytes)
                                   .hexdigest()[:16]

with producer and operation UTF-8 encoded. A line feed in producer or operation would let two
different inputs hash the same bytes, so it is refused. Making `canonical_bytes` canonical
(key order, encoding) is the caller's job: the profile hashes whatever bytes it is given.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Final, TypeAlias

from apiary.errors import ValidationError

PROFILE: Final = "sw4rm-idempotency-bytes-v1"
DIGEST_HEX_LENGTH: Final = 16
DEFAULT_DEDUP_WINDOW_S: Final = 3600.0
"""RFC 11.2 and 20: tokens map to terminal outcomes for at least this long (persisted)."""

_DIGEST: Final = re.compile(r"[0-9a-f]{16}")
BytesLike: TypeAlias = bytes | bytearray | memoryview
_FIELD_SEPARATOR: Final = b"\n"


@dataclass(frozen=True, slots=True)
class ParsedToken:
    """The parts of a profile token."""

    producer: str
    operation: str
    digest: str


def idempotency_token(producer: str, operation: str, canonical_bytes: BytesLike) -> str:
    """The bytes-v1 token of one logical operation; the same inputs give the same token.

    Raises ValidationError naming `producer` or `operation` when it is empty, holds a line
    feed, or is not encodable as UTF-8.
    """
    material = b"".join(
        (
            _encode_field("producer", producer),
            _FIELD_SEPARATOR,
            _encode_field("operation", operation),
            _FIELD_SEPARATOR,
            bytes(canonical_bytes),
        )
    )
    digest = hashlib.sha256(material).hexdigest()[:DIGEST_HEX_LENGTH]
    return f"{producer}:{operation}:{digest}"


def verify_token(token: str, producer: str, operation: str, canonical_bytes: BytesLike) -> bool:
    """Whether `token` is exactly the bytes-v1 token of these inputs.

    Inputs the profile refuses cannot have produced any token, so they verify as False.
    """
    try:
        return token == idempotency_token(producer, operation, canonical_bytes)
    except ValidationError:
        return False


def parse_token(token: str, producer: str | None = None) -> ParsedToken:
    """Split a bytes-v1 token into producer, operation and digest.

    The profile escapes nothing, so a colon inside producer or operation makes the split
    ambiguous (the shared vectors use the operation "tool:call"). Without `producer` the
    split is at the first colon, which is right whenever producer ids hold no colon; pass the
    known producer (e.g. the authenticated one) to split exactly, which also checks that the
    token belongs to it. Tokens outside the profile (the RFC only says SHOULD) raise
    ValidationError, as does a token that does not start with the given producer.
    """
    head, sep, digest = token.rpartition(":")
    if not sep or _DIGEST.fullmatch(digest) is None:
        raise _bad_token("does not end in ':' and 16 lowercase hex digits")
    if producer is not None:
        prefix = producer + ":"
        if not producer or not head.startswith(prefix):
            raise _bad_token("does not belong to the given producer")
        parsed = ParsedToken(producer, head[len(prefix) :], digest)
    else:
        found, sep, operation = head.partition(":")
        if not sep:
            raise _bad_token("has no producer:operation prefix")
        parsed = ParsedToken(found, operation, digest)
    for name, value in (("producer", parsed.producer), ("operation", parsed.operation)):
        if not value or "\n" in value:
            raise _bad_token(f"has an empty or multi-line {name}")
    return parsed


def window_expiry(cached_at: float, window: float = DEFAULT_DEDUP_WINDOW_S) -> float:
    """The last instant at which an outcome cached at `cached_at` must still deduplicate."""
    for name, value in (("cached_at", cached_at), ("window", window)):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
    if window <= 0:
        raise ValueError(f"window must be positive, got {window!r}")
    return cached_at + window


def is_within_window(cached_at: float, now: float, window: float = DEFAULT_DEDUP_WINDOW_S) -> bool:
    """Whether an outcome cached at `cached_at` still deduplicates at `now`.

    Inclusive at the boundary, because the RFC keeps outcomes "for at least" the window. A
    `cached_at` later than `now` (a wall clock stepped back) counts as within: keeping a
    duplicate out is the safe side. Times are seconds on one clock; non-finite values and a
    non-positive window raise ValueError.
    """
    if not math.isfinite(now):
        raise ValueError(f"now must be finite, got {now!r}")
    return now <= window_expiry(cached_at, window)


def _encode_field(name: str, value: str) -> bytes:
    if not value:
        raise ValidationError.for_field(name, "is required")
    if "\n" in value:
        raise ValidationError.for_field(
            name, f"must not contain a line feed, the {PROFILE} field separator"
        )
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValidationError.for_field(name, "is not encodable as UTF-8") from exc


def _bad_token(problem: str) -> ValidationError:
    return ValidationError.for_field("idempotency_token", f"not a {PROFILE} token: {problem}")
