"""sw4rm.activity.ActivityService: AppendArtifact and ListArtifacts (RFC 17.4)."""

from __future__ import annotations

import datetime as dt

from apiary.core.dedup import iso_utc
from apiary.core.envelope_rules import is_json_type
from apiary.core.json_reader import check_nesting
from apiary.core.limits import quote
from apiary.core.negotiation.records import ArtifactRecord
from apiary.engine.artifacts import Artifacts
from apiary.errors import ValidationError
from apiary.server.context import CallContext
from apiary.server.services.request_checks import DEFAULT_CHECKS, RequestChecks, checked
from apiary.wire import pb

act = pb.activity_pb2
FIELD = "artifact.created_at"


def _when(text: str, now: float, checks: RequestChecks) -> float:
    """The time an ISO-8601 `created_at` names (now when empty), within the clock-skew
    window like every timestamp a client sends."""
    if not text:
        return now
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValidationError.for_field(
            FIELD, f"must be ISO-8601 (e.g. 2025-08-08T14:03:22Z), got {quote(text)}"
        ) from None
    try:
        seconds = (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()
    except (OverflowError, ValueError):
        seconds = -1.0  # before the epoch in some zone: refused below
    return checks.timestamp(seconds, FIELD)


def artifact_to_proto(item: ArtifactRecord) -> act.Artifact:
    return act.Artifact(
        negotiation_id=item.negotiation_id, kind=item.kind, version=item.version,
        content_type=item.content_type, content=item.content,
        created_at=iso_utc(item.created_at),
    )  # fmt: skip


@checked
class ArtifactsHandler:
    def __init__(self, artifacts: Artifacts, checks: RequestChecks = DEFAULT_CHECKS) -> None:
        self._artifacts = artifacts
        self._checks = checks

    async def append_artifact(
        self, req: act.AppendArtifactRequest, ctx: CallContext
    ) -> act.AppendArtifactResponse:
        if not req.HasField("artifact"):
            raise ValidationError.for_field("artifact", "is required")
        a = req.artifact
        if a.content and is_json_type(a.content_type):
            check_nesting(a.content, "artifact.content", self._checks.limits.json_depth)
        record = ArtifactRecord(
            negotiation_id=a.negotiation_id, kind=a.kind, version=a.version,
            content_type=a.content_type or "application/octet-stream", content=a.content,
            created_at=_when(a.created_at, self._artifacts.now(), self._checks),
        )  # fmt: skip
        outcome = await self._artifacts.append(record, ctx.agent_id() or ctx.peer)
        return act.AppendArtifactResponse(ok=outcome.ok, reason=outcome.reason)

    async def list_artifacts(
        self, req: act.ListArtifactsRequest, ctx: CallContext
    ) -> act.ListArtifactsResponse:
        items = await self._artifacts.list(req.negotiation_id, req.kind)
        return act.ListArtifactsResponse(items=[artifact_to_proto(i) for i in items])
