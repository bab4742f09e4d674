"""The SW4RM envelope and acknowledgement as domain values (mirroring common.proto numbers).

Converted to and from the canonical protobuf messages in `apiary.wire.convert`.
"""

from __future__ import annotations

from enum import IntEnum

from apiary.core.value import value


class MessageType(IntEnum):
    MESSAGE_TYPE_UNSPECIFIED = 0
    CONTROL = 1
    DATA = 2
    HEARTBEAT = 3
    NOTIFICATION = 4
    ACKNOWLEDGEMENT = 5
    HITL_INVOCATION = 6
    WORKTREE_CONTROL = 7
    NEGOTIATION = 8
    TOOL_CALL = 9
    TOOL_RESULT = 10
    TOOL_ERROR = 11


class AckStage(IntEnum):
    ACK_STAGE_UNSPECIFIED = 0
    RECEIVED = 1
    READ = 2
    FULFILLED = 3
    REJECTED = 4
    FAILED = 5
    TIMED_OUT = 6


MESSAGE_TYPE_NAMES = {t: t.name for t in MessageType}
"""Each message type's name (Enum.name is a property, several times slower to read)."""
ACK_STAGE_NAMES = {s: s.name for s in AckStage}
"""Each ACK stage's name, for the same reason."""


@value
class Envelope:
    """One message attempt (RFC section 11.3: message_id is unique per attempt)."""

    message_id: str
    producer_id: str
    message_type: MessageType
    payload: bytes = b""
    content_type: str = ""
    content_length: int = 0
    idempotency_token: str = ""
    correlation_id: str = ""
    sequence_number: int = 0
    retry_count: int = 0
    repo_id: str = ""
    worktree_id: str = ""
    hlc_timestamp: str = ""
    ttl_ms: int = 0
    timestamp: float = 0.0
    """UTC seconds since the epoch; 0.0 when the producer left it unset."""


@value
class Ack:
    """An acknowledgement of one message at one lifecycle stage."""

    ack_for_message_id: str
    ack_stage: AckStage
    error_code: str = ""
    """Protocol error code string (see apiary.errors); empty when there is none."""
    note: str = ""
