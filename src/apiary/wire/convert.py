"""Converters between canonical protobuf messages and core domain values.

Readers render defensively: whatever a stored value holds, converting it to a message for a
reply cannot fail (a timestamp outside what a Timestamp can show is shown at the nearest end
of its range; event details that are not JSON are shown as text), so that no stored value
can make a later read fail.
"""

from __future__ import annotations

import json
import math
from typing import Final

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.protobuf.timestamp_pb2 import Timestamp

from apiary.core.envelope import Ack, AckStage, Envelope, MessageType
from apiary.core.events import Event
from apiary.core.json_reader import JsonError, parse_json
from apiary.core.limits import DEFAULT_LIMITS, TIMESTAMP_MAX_S, check_id, check_text
from apiary.errors import (
    ValidationError,
    canonical_code,
    from_proto_error_code,
)
from apiary.wire import pb

JSON_CONTENT_TYPE = "application/json"
PROTOBUF_CONTENT_TYPES = frozenset({"application/protobuf", "application/x-protobuf"})
TIMESTAMP_MIN_S: Final = -62_135_596_800
"""0001-01-01T00:00:00Z: the first second a protobuf Timestamp (and RFC 3339 text) can show."""


def timestamp_to_float(ts: Timestamp) -> float:
    return ts.seconds + ts.nanos / 1e9


def float_to_timestamp(seconds: float) -> Timestamp:
    """`seconds` as a Timestamp that every reader can show: NaN is the epoch, anything
    before year 1 or after year 9999 the nearest end of that range (such a value was never
    accepted from a client; this keeps a stored one from failing every read of it)."""
    ts = Timestamp()
    if not seconds >= TIMESTAMP_MIN_S:  # also NaN
        seconds = TIMESTAMP_MIN_S if seconds < 0 else 0.0
    elif seconds > TIMESTAMP_MAX_S:
        seconds = TIMESTAMP_MAX_S
    whole = math.floor(seconds)
    nanos = round((seconds - whole) * 1e9)
    if nanos >= 1_000_000_000:  # rounding carried into the next second
        whole, nanos = whole + 1, 0
    ts.seconds = whole
    ts.nanos = nanos
    return ts


_MESSAGE_TYPES = {int(t): t for t in MessageType}
"""Message types by number (a dict lookup is several times cheaper than MessageType(n))."""


def envelope_from_proto(msg: pb.common_pb2.Envelope) -> Envelope:
    """The domain envelope; an unknown message_type number is a validation error."""
    message_type = _MESSAGE_TYPES.get(msg.message_type)
    if message_type is None:
        raise ValidationError(
            f"message_type {msg.message_type} is not a SW4RM message type",
            details={"field": "message_type"},
        )
    # Positional, in Envelope's field order (every envelope received comes here; keywords
    # cost a lookup each): message_id, producer_id, message_type, payload, content_type,
    # content_length, idempotency_token, correlation_id, sequence_number, retry_count,
    # repo_id, worktree_id, hlc_timestamp, ttl_ms, timestamp.
    return Envelope(
        msg.message_id, msg.producer_id, message_type, msg.payload, msg.content_type,
        msg.content_length, msg.idempotency_token, msg.correlation_id, msg.sequence_number,
        msg.retry_count, msg.repo_id, msg.worktree_id, msg.hlc_timestamp, msg.ttl_ms,
        timestamp_to_float(msg.timestamp) if msg.HasField("timestamp") else 0.0,
    )  # fmt: skip


def envelope_to_proto(env: Envelope) -> pb.common_pb2.Envelope:
    msg = pb.common_pb2.Envelope(
        message_id=env.message_id,
        idempotency_token=env.idempotency_token,
        producer_id=env.producer_id,
        correlation_id=env.correlation_id,
        sequence_number=env.sequence_number,
        retry_count=env.retry_count,
        message_type=int(env.message_type),  # type: ignore[arg-type]
        content_type=env.content_type,
        content_length=env.content_length,
        repo_id=env.repo_id,
        worktree_id=env.worktree_id,
        hlc_timestamp=env.hlc_timestamp,
        ttl_ms=env.ttl_ms,
        payload=env.payload,
    )
    if env.timestamp:
        msg.timestamp.CopyFrom(float_to_timestamp(env.timestamp))
    return msg


def ack_from_payload(content_type: str, payload: bytes) -> Ack:
    """Decode an ACKNOWLEDGEMENT payload: JSON (what other SDKs send) or a protobuf Ack."""
    if content_type.split(";", maxsplit=1)[0].strip() in PROTOBUF_CONTENT_TYPES:
        return _ack_from_protobuf(payload)
    return _ack_from_json(payload)


def _ack_from_protobuf(payload: bytes) -> Ack:
    msg = pb.common_pb2.Ack()
    try:
        msg.ParseFromString(payload)
    except DecodeError:
        raise ValidationError("ACK payload is not a protobuf Ack", {"field": "payload"}) from None
    return Ack(
        ack_for_message_id=_ack_target(msg.ack_for_message_id),
        ack_stage=_stage(int(msg.ack_stage)),
        error_code=from_proto_error_code(int(msg.error_code)) if msg.error_code else "",
        note=check_text(msg.note, "note", DEFAULT_LIMITS.text_bytes),
    )


def _ack_from_json(payload: bytes) -> Ack:
    try:
        doc = parse_json(payload, DEFAULT_LIMITS.json_depth)
    except JsonError as exc:
        raise ValidationError(
            f"ACK payload is not valid JSON: {exc}", {"field": "payload"}
        ) from None
    if not isinstance(doc, dict):
        raise ValidationError("ACK payload must be a JSON object", {"field": "payload"})
    target = doc.get("ack_for_message_id")
    if not isinstance(target, str) or not target:
        raise ValidationError(
            "ACK payload needs ack_for_message_id", {"field": "ack_for_message_id"}
        )
    _ack_target(target)
    stage = doc.get("ack_stage")
    if isinstance(stage, str):
        found = _STAGES_BY_NAME.get(stage.upper())
        if found is None:
            raise ValidationError(f"unknown ack_stage {stage!r}", {"field": "ack_stage"})
        stage_value = found
    elif isinstance(stage, int):
        stage_value = _stage(stage)
    else:
        raise ValidationError("ACK payload needs ack_stage", {"field": "ack_stage"})
    error = doc.get("error_code") or ""
    if isinstance(error, int):
        error = from_proto_error_code(error)
    elif not isinstance(error, str):
        raise ValidationError.for_field("error_code", "must be a string or a number")
    code = canonical_code(check_id(error, "error_code", DEFAULT_LIMITS.name_bytes)) if error else ""
    note = doc.get("note") or ""
    if not isinstance(note, str):
        raise ValidationError.for_field("note", f"must be a string, got {type(note).__name__}")
    if note:
        check_text(note, "note", DEFAULT_LIMITS.text_bytes)
    return Ack(target, stage_value, code, note)


_ID_BYTES: Final = DEFAULT_LIMITS.id_bytes


def _ack_target(target: str) -> str:
    """`target` when it is an id (printable, within the limit; checked plainly first: every
    ACK asks)."""
    if len(target) <= _ID_BYTES and target.isascii() and target.isprintable():
        return target
    return check_id(target, "ack_for_message_id", _ID_BYTES)


_STAGES_BY_NAME = {stage.name: stage for stage in AckStage}
"""AckStage[name] without the Enum machinery (a dict lookup)."""


def _stage(value: int) -> AckStage:
    try:
        return AckStage(value)
    except ValueError:
        raise ValidationError(f"unknown ack_stage {value}", {"field": "ack_stage"}) from None


def ack_to_json(ack: Ack) -> bytes:
    """The JSON ACK payload other SDKs understand."""
    doc = {
        "ack_for_message_id": ack.ack_for_message_id,
        "ack_stage": ack.ack_stage.name,
        "error_code": ack.error_code,
        "note": ack.note,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def event_to_proto(event: Event) -> pb.apiary_pb2.Event:
    return pb.apiary_pb2.Event(
        sequence=event.sequence,
        ts=float_to_timestamp(event.ts),
        event_type=event.event_type,
        actor=event.actor,
        correlation_id=event.correlation_id,
        agent_id=event.agent_id,
        details_json=details_json(event.details),
        hlc=event.hlc,
    )


def details_json(details: object, *, sort_keys: bool = True) -> str:
    """Compact JSON of stored details (keys sorted unless `sort_keys` is false), whatever
    they hold: a value JSON has no form for (NaN, infinity, bytes, other objects, nesting
    past 64 levels) is written as text, so that the answer is JSON every client reads."""
    try:
        return json.dumps(details, separators=(",", ":"), sort_keys=sort_keys, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return json.dumps(
            _jsonable(details, 0), separators=(",", ":"), sort_keys=sort_keys, allow_nan=False
        )


_JSONABLE_DEPTH: Final = 64


def _jsonable(value: object, depth: int) -> object:
    """`value` with everything JSON cannot hold as text (bounded depth: deeper is text)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict | list | tuple):
        if depth >= _JSONABLE_DEPTH:
            return f"<{type(value).__name__} nested deeper than {_JSONABLE_DEPTH}>"
        if isinstance(value, dict):
            return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
        return [_jsonable(v, depth + 1) for v in value]
    if isinstance(value, bytes | bytearray):
        return repr(bytes(value[:1000]))
    return f"<{type(value).__name__}>"


def descriptor_to_dict(agent: pb.registry_pb2.AgentDescriptor) -> dict[str, object]:
    """The AgentDescriptor's fields as JSON values (bytes as base64, enums by name)."""
    return json_format.MessageToDict(
        agent, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def descriptor_from_dict(doc: dict[str, object]) -> pb.registry_pb2.AgentDescriptor:
    """The AgentDescriptor back from its stored JSON form (unknown keys ignored). A stored
    form the descriptor cannot take is shown as its id and name alone, rather than failing
    every read of the agent."""
    try:
        return json_format.ParseDict(
            doc, pb.registry_pb2.AgentDescriptor(), ignore_unknown_fields=True
        )
    except (json_format.ParseError, ValueError, TypeError, RecursionError):
        agent_id, name = doc.get("agent_id"), doc.get("name")
        return pb.registry_pb2.AgentDescriptor(
            agent_id=agent_id if isinstance(agent_id, str) else "",
            name=name if isinstance(name, str) else "",
        )
