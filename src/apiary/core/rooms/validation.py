"""What a producer or a critic sends to a negotiation room, and the checks it must pass.

Drafts mirror the wire messages (NegotiationProposal, NegotiationVote) with raw values; the
checks turn them into records or raise an `ApiaryError` that names the offending field, with
the request's path (`proposal.artifact_type`, `vote.score`), so that a client knows exactly
what to fix. Identity is checked too: the caller (the `sw4rm-agent-id` of the call) may
leave producer_id/critic_id empty, but may not act under another agent's id.

Decisions Apiary makes where the RFC is silent:
- A proposal names at least one critic, each once, and not its own producer; it has a MIME
  content type and a non-empty artifact.
- Ids are at most 256 characters with no control characters and no surrounding spaces.
- Feedback lists (strengths, weaknesses, recommendations) hold at most 100 entries of at most
  4,000 characters each: the decision record carries them to HITL operators and the audit log.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from apiary.core.rooms.records import ARTIFACT_NUMBERS, ArtifactType, VoteRecord
from apiary.errors import PermissionDeniedError, ValidationError

MAX_ID_CHARS: Final = 256
MAX_FEEDBACK_ITEMS: Final = 100
MAX_FEEDBACK_CHARS: Final = 4000
DEFAULT_MAX_ARTIFACT_BYTES: Final = 16 * 1024 * 1024
_BY_NUMBER: Final = {number: kind for kind, number in ARTIFACT_NUMBERS.items()}


@dataclass(frozen=True, slots=True)
class ProposalDraft:
    """A SubmitProposal request's proposal, unchecked."""

    artifact_type: str | int
    artifact_id: str
    producer_id: str
    artifact: bytes
    artifact_content_type: str
    requested_critics: Sequence[str]
    negotiation_room_id: str


@dataclass(frozen=True, slots=True)
class VoteDraft:
    """A SubmitVote request's vote, unchecked."""

    artifact_id: str
    critic_id: str
    score: float
    confidence: float
    passed: bool
    strengths: Sequence[str] = ()
    weaknesses: Sequence[str] = ()
    recommendations: Sequence[str] = ()
    negotiation_room_id: str = ""


@dataclass(frozen=True, slots=True)
class CheckedProposal:
    """A proposal that passed every check; ids are filled in by the engine beforehand."""

    artifact_type: ArtifactType
    artifact_id: str
    producer_id: str
    artifact: bytes
    artifact_content_type: str
    requested_critics: tuple[str, ...]
    negotiation_room_id: str


def parse_artifact_type(value: object, field: str = "proposal.artifact_type") -> ArtifactType:
    """An artifact type by name (any case) or proto number 1..4; UNSPECIFIED is refused."""
    if isinstance(value, int) and not isinstance(value, bool):
        found = _BY_NUMBER.get(value)
    elif isinstance(value, str):
        found = ArtifactType._value2member_map_.get(value.strip().upper())  # type: ignore[assignment]
    else:
        found = None
    if not isinstance(found, ArtifactType):
        names = ", ".join(t.value for t in ArtifactType)
        raise ValidationError.for_field(field, f"must be one of {names}, got {value!r}")
    return found


def check_proposal(
    draft: ProposalDraft, *, caller: str, max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES
) -> CheckedProposal:
    """The checked proposal; ValidationError or PermissionDeniedError naming the field."""
    kind = parse_artifact_type(draft.artifact_type)
    artifact_id = identifier(draft.artifact_id, "proposal.artifact_id")
    room_id = identifier(draft.negotiation_room_id, "proposal.negotiation_room_id")
    producer = acting_as(draft.producer_id, caller, "proposal.producer_id", "producer")
    if not isinstance(draft.artifact, bytes | bytearray) or not draft.artifact:
        raise ValidationError.for_field("proposal.artifact", "is empty: there is nothing to review")
    if len(draft.artifact) > max_artifact_bytes:
        raise ValidationError.for_field(
            "proposal.artifact",
            f"is {len(draft.artifact)} bytes, over the limit of {max_artifact_bytes}",
        )
    content_type = draft.artifact_content_type
    if not isinstance(content_type, str) or "/" not in content_type.strip(" /"):
        raise ValidationError.for_field(
            "proposal.artifact_content_type",
            f"must be a MIME type such as application/json, got {content_type!r}",
        )
    critics = _critics(draft.requested_critics, producer)
    return CheckedProposal(
        kind, artifact_id, producer, bytes(draft.artifact), content_type.strip(), critics, room_id
    )


def check_vote(draft: VoteDraft, *, caller: str, now: float, room_id: str) -> VoteRecord:
    """The vote as a record at `now` in `room_id`; ValidationError naming the field when it is
    malformed (the proposal-dependent checks are the machine's)."""
    artifact_id = identifier(draft.artifact_id, "vote.artifact_id")
    critic = acting_as(draft.critic_id, caller, "vote.critic_id", "critic")
    score = _number(draft.score, "vote.score", 0.0, 10.0)
    confidence = _number(draft.confidence, "vote.confidence", 0.0, 1.0)
    if not isinstance(draft.passed, bool):
        raise ValidationError.for_field("vote.passed", "must be true or false")
    if draft.negotiation_room_id and draft.negotiation_room_id != room_id:
        raise ValidationError.for_field(
            "vote.negotiation_room_id",
            f"artifact {artifact_id!r} is in room {room_id!r}, not {draft.negotiation_room_id!r}",
        )
    return VoteRecord(
        artifact_id=artifact_id,
        critic_id=critic,
        score=score,
        confidence=confidence,
        passed=draft.passed,
        strengths=_feedback(draft.strengths, "vote.strengths"),
        weaknesses=_feedback(draft.weaknesses, "vote.weaknesses"),
        recommendations=_feedback(draft.recommendations, "vote.recommendations"),
        negotiation_room_id=room_id,
        voted_at=now,
    )


def identifier(value: object, field: str) -> str:
    """A non-empty id of at most 256 characters, no control characters, no outer spaces."""
    if not isinstance(value, str) or not value:
        raise ValidationError.for_field(field, "is required")
    if len(value) > MAX_ID_CHARS:
        raise ValidationError.for_field(field, f"is longer than {MAX_ID_CHARS} characters")
    if value != value.strip() or not value.isprintable():
        raise ValidationError.for_field(
            field, "must not contain control characters or start or end with spaces"
        )
    return value


def acting_as(claimed: str, caller: str, field: str, role: str) -> str:
    """Who acts: `claimed`, else the caller; refused when both are given and differ."""
    if claimed and caller and claimed != caller:
        raise PermissionDeniedError(
            f"{caller!r} may not act as {role} {claimed!r}", {"field": field, "caller": caller}
        )
    if not claimed and not caller:
        raise ValidationError.for_field(
            field, f"is required: name the {role}, or call with sw4rm-agent-id metadata"
        )
    return identifier(claimed or caller, field)


def _critics(values: Sequence[str], producer: str) -> tuple[str, ...]:
    field = "proposal.requested_critics"
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise ValidationError.for_field(field, "must be a list of critic agent ids")
    if not values:
        raise ValidationError.for_field(field, "must name at least one critic")
    critics = tuple(identifier(v, field) for v in values)
    repeated = sorted({c for c in critics if critics.count(c) > 1})
    if repeated:
        raise ValidationError.for_field(field, f"names {', '.join(repeated)} more than once")
    if producer in critics:
        raise ValidationError.for_field(
            field, f"the producer {producer!r} cannot review its own artifact"
        )
    return critics


def _number(value: object, field: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError.for_field(field, f"must be a number, got {value!r}")
    amount = float(value)
    if not (math.isfinite(amount) and low <= amount <= high):
        raise ValidationError.for_field(
            field, f"must be between {low:g} and {high:g}, got {value!r}"
        )
    return amount


def _feedback(values: Sequence[str], field: str) -> tuple[str, ...]:
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise ValidationError.for_field(field, "must be a list of strings")
    if len(values) > MAX_FEEDBACK_ITEMS:
        raise ValidationError.for_field(field, f"has more than {MAX_FEEDBACK_ITEMS} entries")
    for item in values:
        if not isinstance(item, str):
            raise ValidationError.for_field(field, "must be a list of strings")
        if len(item) > MAX_FEEDBACK_CHARS:
            raise ValidationError.for_field(
                field, f"has an entry longer than {MAX_FEEDBACK_CHARS} characters"
            )
    return tuple(values)
