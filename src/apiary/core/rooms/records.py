"""Stored records of negotiation rooms (RFC 17.5), shared by the core, the engine and stores.

A room (`negotiation_room_id`) holds proposals; a proposal is one artifact, keyed by its
`artifact_id` (unique across rooms, as the other SW4RM SDKs key it). Critics' votes and the
coordinator's decisions hang off the artifact. Policy versions are kept for audit: every
proposal names the version it is decided under, and that version's settings stay on record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from apiary.core.vote_aggregation import AggregatedScore


class ArtifactType(StrEnum):
    """Artifact categories (RFC 17.5), named and numbered as `sw4rm.negotiation_room`."""

    REQUIREMENTS = "REQUIREMENTS"
    PLAN = "PLAN"
    CODE = "CODE"
    DEPLOYMENT = "DEPLOYMENT"


class DecisionOutcome(StrEnum):
    """Decision outcomes (RFC 17.5), named and numbered as `sw4rm.negotiation_room`."""

    APPROVED = "APPROVED"
    REVISION_REQUESTED = "REVISION_REQUESTED"
    ESCALATED_TO_HITL = "ESCALATED_TO_HITL"


class RoomState(StrEnum):
    """Where a proposal stands: collecting votes, with HITL, or decided (the two ends)."""

    OPEN = "OPEN"
    ESCALATED = "ESCALATED"
    APPROVED = "APPROVED"
    REVISION_REQUESTED = "REVISION_REQUESTED"

    @property
    def terminal(self) -> bool:
        return self in (RoomState.APPROVED, RoomState.REVISION_REQUESTED)


ARTIFACT_NUMBERS: Final = {t: n for n, t in enumerate(ArtifactType, start=1)}
"""`sw4rm.negotiation_room.ArtifactType` numbers; 0 is UNSPECIFIED and names no type."""
OUTCOME_NUMBERS: Final = {o: n for n, o in enumerate(DecisionOutcome, start=1)}
"""`sw4rm.negotiation_room.DecisionOutcome` numbers; 0 is UNSPECIFIED."""


@dataclass(frozen=True, slots=True)
class ProposalRecord:
    """An artifact submitted for review, and where its review stands."""

    artifact_id: str
    negotiation_room_id: str
    artifact_type: str
    """An ArtifactType value."""
    producer_id: str
    artifact: bytes
    artifact_content_type: str
    requested_critics: tuple[str, ...]
    created_at: float
    state: str
    """A RoomState value."""
    updated_at: float
    policy_version: str
    """The policy the proposal is decided under (fixed at submission)."""
    vote_deadline: float
    """The policy timeout: without every requested vote by then, the room escalates."""
    invocation_id: str = ""
    """The HITL invocation, once escalated."""


@dataclass(frozen=True, slots=True)
class VoteRecord:
    """One critic's vote on one artifact (at most one per critic)."""

    artifact_id: str
    critic_id: str
    score: float
    """0..10; 10 is excellent."""
    confidence: float
    """0..1."""
    passed: bool
    strengths: tuple[str, ...] = ()
    weaknesses: tuple[str, ...] = ()
    recommendations: tuple[str, ...] = ()
    negotiation_room_id: str = ""
    voted_at: float = 0.0


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """A decision on an artifact, with what it was based on (RFC 17.5: "the complete vote
    list, aggregated score, policy version, and human-readable rationale for audit").

    An artifact has at most two: the policy's (APPROVED, REVISION_REQUESTED or
    ESCALATED_TO_HITL) and, after an escalation, the human's (APPROVED or REVISION_REQUESTED).
    `sequence` numbers them from 1.
    """

    artifact_id: str
    sequence: int
    negotiation_room_id: str
    outcome: str
    """A DecisionOutcome value."""
    votes: tuple[VoteRecord, ...]
    aggregated_score: AggregatedScore | None
    """None when there were no votes to aggregate (a policy timeout with none)."""
    policy_version: str
    reason: str
    decided_at: float
    decided_by: str
    """The coordinator's room service for policy decisions, the operator for human ones."""
    via: str
    """policy (thresholds), hitl (an operator) or hitl_fallback (HITL's deadline or
    unavailability policy decided)."""
    triggers: tuple[str, ...] = ()
    """Why: the escalation conditions that held, or the thresholds that were missed."""
    invocation_id: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
    """JSON: the human decision record for via hitl (action, rationale, patch...)."""


@dataclass(frozen=True, slots=True)
class PolicyVersionRecord:
    """One version of the room policy: a name for a fixed set of settings (audit, rollback)."""

    version: str
    settings: Mapping[str, Any]
    created_at: float
