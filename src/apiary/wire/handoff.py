"""Converters between the handoff messages (sw4rm.handoff, apiary.v1.HandoffView) and the
core's handoff values."""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration

from apiary.core.handoff import to_proto
from apiary.core.handoff_request import HandoffDraft
from apiary.core.records import HandoffRecord
from apiary.wire import pb
from apiary.wire.convert import float_to_timestamp

SNAPSHOT_CONTENT_TYPE_KEY = "apiary-snapshot-content-type"
"""Request metadata (an HTTP header through the gateway) declaring the media type of a
RequestHandoff's context_snapshot: the canonical HandoffRequest has no field for it."""

h = pb.handoff_pb2


def duration_seconds(duration: Duration) -> float:
    return duration.seconds + duration.nanos / 1e9


def seconds_duration(seconds: float) -> Duration:
    duration = Duration()
    duration.FromNanoseconds(round(seconds * 1e9))
    return duration


def draft_from_proto(request: h.HandoffRequest, snapshot_content_type: str = "") -> HandoffDraft:
    """A draft of a RequestHandoff; an unset or zero timeout means the policy's default
    (clients that always fill the field send 0 for "no preference")."""
    timeout = duration_seconds(request.timeout) if request.HasField("timeout") else 0.0
    return HandoffDraft(
        request_id=request.request_id,
        from_agent=request.from_agent,
        to_agent=request.to_agent,
        reason=request.reason,
        context_snapshot=bytes(request.context_snapshot),
        snapshot_content_type=snapshot_content_type,
        capabilities_required=tuple(request.capabilities_required),
        priority=request.priority,
        timeout_s=timeout or None,
    )


def draft_to_proto(draft: HandoffDraft) -> h.HandoffRequest:
    request = h.HandoffRequest(
        request_id=draft.request_id, from_agent=draft.from_agent, to_agent=draft.to_agent,
        reason=draft.reason, context_snapshot=draft.context_snapshot,
        capabilities_required=list(draft.capabilities_required), priority=draft.priority,
    )  # fmt: skip
    if draft.timeout_s is not None:
        request.timeout.CopyFrom(seconds_duration(draft.timeout_s))
    return request


def request_to_proto(record: HandoffRecord, *, include_snapshot: bool) -> h.HandoffRequest:
    """The handoff as a HandoffRequest to its current target (with its snapshot when asked)."""
    request = h.HandoffRequest(
        request_id=record.request_id, from_agent=record.from_agent, to_agent=record.to_agent,
        reason=record.reason, capabilities_required=list(record.capabilities_required),
        priority=record.priority, timeout=seconds_duration(record.timeout_s),
    )  # fmt: skip
    if include_snapshot:
        request.context_snapshot = record.context_snapshot
    return request


def handoff_view(record: HandoffRecord, *, include_snapshot: bool) -> pb.apiary_pb2.HandoffView:
    return pb.apiary_pb2.HandoffView(
        request=request_to_proto(record, include_snapshot=include_snapshot),
        status=to_proto(record.state),  # type: ignore[arg-type]
        snapshot_content_type=record.snapshot_content_type,
        snapshot_size=len(record.context_snapshot), requested_to=record.requested_to,
        attempt=record.attempt, tried=list(record.tried),
        accepting_agent=record.accepting_agent, rejection_reason=record.rejection_reason,
        created_at=float_to_timestamp(record.created_at),
        updated_at=float_to_timestamp(record.updated_at),
        deadline=float_to_timestamp(record.deadline),
        context_holders=list(record.context_holders),
    )  # fmt: skip
