"""Converters between canonical protobuf messages and core domain values."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.protobuf.timestamp_pb2 import Timestamp

from apiary.core.envelope import Ack, AckStage, Envelope, MessageType
from apiary.core.events import Event
from apiary.core.json_scan import NOT_PLAIN, plain_value, scanner
from apiary.errors import (
    ValidationError,
    canonical_code,
    from_proto_error_code,
)
from apiary.wire import pb

JSON_CONTENT_TYPE = "application/json"
PROTOBUF_CONTENT_TYPES = frozenset({"application/protobuf", "application/x-protobuf"})


def timestamp_to_float(ts: Timestamp) -> float:
    return ts.seconds + ts.nanos / 1e9


def float_to_timestamp(seconds: float) -> Timestamp:
    ts = Timestamp()
    whole = int(seconds)
    ts.seconds = whole
    ts.nanos = round((seconds - whole) * 1e9)
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
        ack_for_message_id=msg.ack_for_message_id,
        ack_stage=_stage(int(msg.ack_stage)),
        error_code=from_proto_error_code(int(msg.error_code)) if msg.error_code else "",
        note=msg.note,
    )


def _ack_from_json(payload: bytes) -> Ack:
    try:
        doc = _json_text(payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValidationError("ACK payload is not valid JSON", {"field": "payload"}) from None
    if not isinstance(doc, dict):
        raise ValidationError("ACK payload must be a JSON object", {"field": "payload"})
    target = doc.get("ack_for_message_id")
    if not isinstance(target, str) or not target:
        raise ValidationError(
            "ACK payload needs ack_for_message_id", {"field": "ack_for_message_id"}
        )
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
    code = canonical_code(str(error)) if error else ""
    return Ack(target, stage_value, code, str(doc.get("note") or ""))


_STAGES_BY_NAME = {stage.name: stage for stage in AckStage}
"""AckStage[name] without the Enum machinery (a dict lookup)."""


_SCAN = scanner(json.JSONDecoder())


def _json_text(payload: bytes) -> Any:
    """The JSON value of a UTF-8 payload, as json.loads reads it (scanned at once when it
    is plainly one value, as every ACK of a stream is). Not sniffed for UTF-16 and UTF-32
    first: JSON payloads are UTF-8 (RFC 8259), as envelope validation requires."""
    text = payload.decode("utf-8")
    value = plain_value(text, _SCAN)
    return json.loads(text) if value is NOT_PLAIN else value


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
        details_json=json.dumps(event.details, separators=(",", ":"), sort_keys=True),
        hlc=event.hlc,
    )


def descriptor_to_dict(agent: pb.registry_pb2.AgentDescriptor) -> dict[str, object]:
    """The AgentDescriptor's fields as JSON values (bytes as base64, enums by name)."""
    return json_format.MessageToDict(
        agent, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def descriptor_from_dict(doc: dict[str, object]) -> pb.registry_pb2.AgentDescriptor:
    """The AgentDescriptor back from its stored JSON form (unknown keys ignored)."""
    return json_format.ParseDict(doc, pb.registry_pb2.AgentDescriptor(), ignore_unknown_fields=True)
