"""Negotiation artifacts (RFC 17.4) behind sw4rm.activity.ActivityService.

The negotiation engine appends contract_vN.json, diff_v{N-1}_to_vN.json, evaluation
(`score`) and `decision` reports; clients may append their own (`note`, ...). An artifact is
written once: appending the same (negotiation_id, kind, version) again with the same
content and type is accepted as a no-op, with other content it is refused. Its
`artifact.appended` event commits with it (the negotiation's own artifacts commit theirs
with the negotiation state they came with).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from apiary.core.clock import Clock
from apiary.core.events import EventDraft
from apiary.core.negotiation.records import ArtifactRecord
from apiary.engine.eventlog import EventRecorder
from apiary.errors import ValidationError
from apiary.store.protocols import ArtifactStore

KINDS: Final = ("contract", "diff", "decision", "score", "note")
"""The kinds activity.proto names."""
MAX_FIELD: Final = 256


@dataclass(frozen=True, slots=True)
class AppendOutcome:
    ok: bool
    reason: str = ""


class Artifacts:
    def __init__(
        self, store: ArtifactStore, events: EventRecorder, clock: Clock, max_bytes: int
    ) -> None:
        self._store = store
        self._events = events
        self._clock = clock
        self.max_bytes = max_bytes

    async def append(self, artifact: ArtifactRecord, by: str) -> AppendOutcome:
        """Validate and record one artifact (ValidationError naming the field when malformed;
        ok=False when another artifact holds its version)."""
        check(artifact, self.max_bytes)
        # Not through EventRecorder.commit: a refused append stores no event, so it cannot
        # carry the events noted before it.
        if await self._store.append(artifact, [self.appended(artifact, by)]):
            return AppendOutcome(True)
        held = await self._store.get(artifact.negotiation_id, artifact.kind, artifact.version)
        if held is not None and (held.content, held.content_type) == (
            artifact.content, artifact.content_type,
        ):  # fmt: skip
            return AppendOutcome(True, f"{artifact.name} was already recorded")
        return AppendOutcome(
            False, f"already_exists: {artifact.name} of {artifact.negotiation_id} holds other "
            "content; artifacts are written once, append a new version",
        )  # fmt: skip

    def appended(self, artifact: ArtifactRecord, by: str) -> EventDraft:
        """The `artifact.appended` event, for the store to commit with the artifact (here, or
        with the negotiation state it came with)."""
        return self._events.draft(
            "artifact.appended", by, correlation_id=artifact.negotiation_id,
            negotiation_id=artifact.negotiation_id, name=artifact.name, kind=artifact.kind,
            version=artifact.version, content_type=artifact.content_type,
            size=len(artifact.content),
        )  # fmt: skip

    def now(self) -> float:
        return self._clock.now()

    async def list(self, negotiation_id: str, kind: str = "") -> list[ArtifactRecord]:
        if not negotiation_id:
            raise ValidationError.for_field("negotiation_id", "is required")
        return await self._store.list(negotiation_id, kind or None)


def check(artifact: ArtifactRecord, max_bytes: int) -> None:
    for name in ("negotiation_id", "kind", "version"):
        value = getattr(artifact, name)
        if not value.strip():
            raise ValidationError.for_field(f"artifact.{name}", "is required")
        if name != "negotiation_id" and (len(value) > MAX_FIELD or "/" in value or "\\" in value):
            raise ValidationError.for_field(
                f"artifact.{name}", f"must be at most {MAX_FIELD} characters without / or \\"
            )
    if artifact.kind not in KINDS:
        raise ValidationError.for_field(
            "artifact.kind", f"must be one of {', '.join(KINDS)}, got {artifact.kind!r}"
        )
    if len(artifact.content) > max_bytes:
        raise ValidationError.for_field(
            "artifact.content", f"{len(artifact.content)} bytes exceed the limit of {max_bytes}"
        )
