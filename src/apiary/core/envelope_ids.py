"""The three-ID model of RFC section 11.3: message_id, correlation_id, idempotency_token.

- message_id: a UUIDv4 per transmission attempt; every retry gets a new one; acks target it.
- correlation_id: required, stable across the whole flow; a response echoes the request's.
- idempotency_token: optional, constant across every retry of one logical operation.

`EnvelopeIds` carries these with the other identifying fields of an Envelope (producer_id,
sequence_number, retry_count). Construction does not validate, because an invalid inbound
envelope must still be representable to be NACKed; `validate_ids` does, raising
`ValidationError` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

from apiary.core.ids import is_uuid4
from apiary.core.limits import DEFAULT_LIMITS, Limits, check_id, quote
from apiary.errors import ValidationError

UINT32_MAX: Final = (1 << 32) - 1
UINT64_MAX: Final = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class EnvelopeIds:
    """The identifying fields of one Envelope. Empty strings mean "absent", as in proto3."""

    message_id: str
    idempotency_token: str
    correlation_id: str
    producer_id: str
    sequence_number: int
    retry_count: int = 0

    @property
    def has_idempotency_token(self) -> bool:
        """Whether deduplication goes by token rather than (producer_id, sequence_number)."""
        return self.idempotency_token != ""


@dataclass(frozen=True, slots=True)
class AckIds:
    """The ids of an acknowledgement: its own envelope and the message it acknowledges."""

    envelope: EnvelopeIds
    ack_for_message_id: str


def validate_ids(ids: EnvelopeIds, *, strict_correlation: bool = False) -> EnvelopeIds:
    """Check `ids` against RFC 11 and 11.3 and return them unchanged.

    Required: message_id (a UUIDv4), producer_id, correlation_id, sequence_number (uint64),
    retry_count (uint32). Optional: idempotency_token, whose `{producer}:{operation}:{hash}`
    format is only a SHOULD and so is not enforced. Their lengths and charsets are the
    limits' (`core.limits`), which envelope validation applies after these rules.

    correlation_id must be present, but it is held to UUIDv4 only with `strict_correlation`
    (`[router] strict_correlation_ids`): the RFC says "MUST be a UUIDv4" yet, in the same
    section, sets it to workflow_id and negotiation_id, which the other SDKs send as free
    strings ("workflow-123", "wf123"). docs/decisions.md, "Correlation ids".
    """
    _require_uuid4("message_id", ids.message_id)
    if not ids.producer_id:
        raise ValidationError.for_field("producer_id", "is required")
    if strict_correlation:
        _require_uuid4("correlation_id", ids.correlation_id)
    elif not ids.correlation_id:
        raise ValidationError.for_field("correlation_id", "is required")
    _require_uint("sequence_number", ids.sequence_number, UINT64_MAX)
    _require_uint("retry_count", ids.retry_count, UINT32_MAX)
    return ids


def check_flow_id(field: str, value: str, *, strict: bool, limits: Limits = DEFAULT_LIMITS) -> str:
    """`value`, an id that becomes the correlation_id of the messages of a flow (a task,
    workflow, negotiation, room or handoff id), unchanged; with strict correlation ids it
    must be a UUIDv4 (ValidationError naming `field`), and always a valid correlation_id
    (printable, within the limit). Empty passes: the caller generates a UUIDv4 or falls
    back to one."""
    if strict and value and not is_uuid4(value):
        raise ValidationError.for_field(
            field,
            f"must be a UUIDv4, got {quote(value)}: it becomes the correlation_id of the"
            " flow's messages, and strict correlation ids are on",
            value=value[:64],
        )
    return check_id(value, field, limits.correlation_id_bytes)


def for_retry(ids: EnvelopeIds, new_message_id: str) -> EnvelopeIds:
    """The ids of the next attempt of the same message (RFC 11.2, 11.3).

    A new message_id, retry_count + 1; token, correlation_id, producer_id and sequence_number
    unchanged. The sequence number stays because, without a token, (producer_id,
    sequence_number) is what deduplicates the retry against the first attempt.
    """
    _require_uuid4("message_id", new_message_id)
    if new_message_id.lower() == ids.message_id.lower():
        raise ValidationError.for_field("message_id", "a retry must use a new message_id")
    if ids.retry_count >= UINT32_MAX:
        raise ValidationError.for_field(
            "retry_count", f"is {ids.retry_count}, the uint32 maximum: no further attempt fits"
        )
    return replace(ids, message_id=new_message_id, retry_count=ids.retry_count + 1)


def for_reply(
    request: EnvelopeIds, *, message_id: str, producer_id: str, sequence_number: int
) -> EnvelopeIds:
    """The ids of a response to `request`: it echoes the request's correlation_id (RFC 11.3).

    The reply is a new message of its own producer's stream (its own message_id and
    sequence_number, retry_count 0) and carries no idempotency token: it is not a retry of
    the request's operation, and sharing the token would deduplicate it against the request.
    """
    if not request.correlation_id:
        raise ValidationError.for_field(
            "correlation_id", "the request has none for the reply to echo"
        )
    reply = EnvelopeIds(
        message_id=message_id,
        idempotency_token="",
        correlation_id=request.correlation_id,
        producer_id=producer_id,
        sequence_number=sequence_number,
        retry_count=0,
    )
    return validate_ids(reply)


def for_ack(
    original: EnvelopeIds, *, message_id: str, producer_id: str, sequence_number: int
) -> AckIds:
    """The ids of an ACK or NACK of `original`.

    ack_for_message_id is the original's message_id exactly as received, even when that id
    is malformed: a NACK must name the precipitating message (RFC 21), and a validation
    failure is often the reason for the NACK. The ack echoes the original's correlation_id;
    an original without one (itself invalid), or with one beyond the limits, gets the ack's own
    message_id as correlation, so the NACK starts a traceable flow of its own instead of
    being unsendable.
    """
    envelope = EnvelopeIds(
        message_id=message_id,
        idempotency_token="",
        correlation_id=_echoable(original.correlation_id) or message_id,
        producer_id=producer_id,
        sequence_number=sequence_number,
        retry_count=0,
    )
    return AckIds(envelope=validate_ids(envelope), ack_for_message_id=original.message_id)


def _echoable(correlation_id: str) -> str:
    """`correlation_id` when an ack may echo it; '' when it breaks the limits (the ack of a
    message refused for its correlation_id must not carry that id again)."""
    try:
        return check_id(correlation_id, "correlation_id", DEFAULT_LIMITS.correlation_id_bytes)
    except ValidationError:
        return ""


def _require_uuid4(field: str, value: str) -> None:
    if not value:
        raise ValidationError.for_field(field, "is required")
    if not is_uuid4(value):
        raise ValidationError.for_field(field, f"must be a UUIDv4, got {quote(value)}")


def _require_uint(field: str, value: int, maximum: int) -> None:
    # bool is an int subclass; True as a sequence number is a caller bug, not a value.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError.for_field(field, f"must be an integer, got {type(value).__name__}")
    if not 0 <= value <= maximum:
        raise ValidationError.for_field(field, f"must be in [0, {maximum}], got {value}")
