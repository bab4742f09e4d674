"""sw4rm.activity.ActivityService: AppendArtifact and ListArtifacts (RFC 17.4)."""

from __future__ import annotations

import datetime as dt

from apiary.core.dedup import iso_utc
from apiary.core.negotiation.records import ArtifactRecord
from apiary.engine.artifacts import Artifacts
from apiary.errors import ValidationError
from apiary.server.context import CallContext
from apiary.wire import pb

act = pb.activity_pb2


def _when(text: str, now: float) -> float:
    if not text:
        return now
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValidationError.for_field(
            "artifact.created_at", f"must be ISO-8601 (e.g. 2025-08-08T14:03:22Z), got {text!r}"
        ) from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


def artifact_to_proto(item: ArtifactRecord) -> act.Artifact:
    return act.Artifact(
        negotiation_id=item.negotiation_id, kind=item.kind, version=item.version,
        content_type=item.content_type, content=item.content,
        created_at=iso_utc(item.created_at),
    )  # fmt: skip


class ArtifactsHandler:
    def __init__(self, artifacts: Artifacts) -> None:
        self._artifacts = artifacts

    async def append_artifact(
        self, req: act.AppendArtifactRequest, ctx: CallContext
    ) -> act.AppendArtifactResponse:
        if not req.HasField("artifact"):
            raise ValidationError.for_field("artifact", "is required")
        a = req.artifact
        record = ArtifactRecord(
            negotiation_id=a.negotiation_id, kind=a.kind, version=a.version,
            content_type=a.content_type or "application/octet-stream", content=a.content,
            created_at=_when(a.created_at, self._artifacts.now()),
        )  # fmt: skip
        outcome = await self._artifacts.append(record, ctx.agent_id() or ctx.peer)
        return act.AppendArtifactResponse(ok=outcome.ok, reason=outcome.reason)

    async def list_artifacts(
        self, req: act.ListArtifactsRequest, ctx: CallContext
    ) -> act.ListArtifactsResponse:
        items = await self._artifacts.list(req.negotiation_id, req.kind)
        return act.ListArtifactsResponse(items=[artifact_to_proto(i) for i in items])
