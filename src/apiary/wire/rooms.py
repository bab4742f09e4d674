"""Negotiation-room messages (sw4rm.negotiation_room, apiary.v1 room reads) <-> core records."""

from __future__ import annotations

import json

from apiary.core.rooms.records import (
    ARTIFACT_NUMBERS,
    OUTCOME_NUMBERS,
    ArtifactType,
    DecisionOutcome,
    DecisionRecord,
    PolicyVersionRecord,
    ProposalRecord,
    RoomState,
    VoteRecord,
)
from apiary.core.rooms.validation import ProposalDraft, VoteDraft
from apiary.core.vote_aggregation import AggregatedScore
from apiary.wire import pb
from apiary.wire.convert import float_to_timestamp

nr = pb.negotiation_room_pb2
a = pb.apiary_pb2


def proposal_draft(msg: nr.NegotiationProposal) -> ProposalDraft:
    """The proposal as sent; the room checks it (created_at is the server's to set)."""
    return ProposalDraft(
        artifact_type=int(msg.artifact_type),
        artifact_id=msg.artifact_id,
        producer_id=msg.producer_id,
        artifact=bytes(msg.artifact),
        artifact_content_type=msg.artifact_content_type,
        requested_critics=list(msg.requested_critics),
        negotiation_room_id=msg.negotiation_room_id,
    )


def vote_draft(msg: nr.NegotiationVote) -> VoteDraft:
    """The vote as sent; the room checks it (voted_at is the server's to set)."""
    return VoteDraft(
        artifact_id=msg.artifact_id,
        critic_id=msg.critic_id,
        score=msg.score,
        confidence=msg.confidence,
        passed=msg.passed,
        strengths=list(msg.strengths),
        weaknesses=list(msg.weaknesses),
        recommendations=list(msg.recommendations),
        negotiation_room_id=msg.negotiation_room_id,
    )


def proposal_to_proto(
    record: ProposalRecord, *, include_artifact: bool = True
) -> nr.NegotiationProposal:
    return nr.NegotiationProposal(
        artifact_type=ARTIFACT_NUMBERS[ArtifactType(record.artifact_type)],  # type: ignore[arg-type]
        artifact_id=record.artifact_id,
        producer_id=record.producer_id,
        artifact=record.artifact if include_artifact else b"",
        artifact_content_type=record.artifact_content_type,
        requested_critics=list(record.requested_critics),
        negotiation_room_id=record.negotiation_room_id,
        created_at=float_to_timestamp(record.created_at),
    )


def vote_to_proto(vote: VoteRecord) -> nr.NegotiationVote:
    return nr.NegotiationVote(
        artifact_id=vote.artifact_id,
        critic_id=vote.critic_id,
        score=vote.score,
        confidence=vote.confidence,
        passed=vote.passed,
        strengths=list(vote.strengths),
        weaknesses=list(vote.weaknesses),
        recommendations=list(vote.recommendations),
        negotiation_room_id=vote.negotiation_room_id,
        voted_at=float_to_timestamp(vote.voted_at),
    )


def scores_to_proto(scores: AggregatedScore) -> nr.AggregatedScore:
    return nr.AggregatedScore(
        mean=scores.mean,
        min_score=scores.min_score,
        max_score=scores.max_score,
        std_dev=scores.std_dev,
        weighted_mean=scores.weighted_mean,
        vote_count=scores.vote_count,
    )


def decision_to_proto(decision: DecisionRecord) -> nr.NegotiationDecision:
    msg = nr.NegotiationDecision(
        artifact_id=decision.artifact_id,
        outcome=OUTCOME_NUMBERS[DecisionOutcome(decision.outcome)],  # type: ignore[arg-type]
        votes=[vote_to_proto(v) for v in decision.votes],
        policy_version=decision.policy_version,
        reason=decision.reason,
        negotiation_room_id=decision.negotiation_room_id,
        decided_at=float_to_timestamp(decision.decided_at),
    )
    if decision.aggregated_score is not None:
        msg.aggregated_score.CopyFrom(scores_to_proto(decision.aggregated_score))
    return msg


_DECIDED = frozenset(s.value for s in RoomState if s.terminal)


def room_proposal(
    record: ProposalRecord, votes: list[VoteRecord], *, include_artifact: bool = False
) -> a.RoomProposal:
    """The apiary.v1 view of a proposal and where its review stands. A decided proposal has
    no vote deadline: nothing can come of it any more."""
    voted = {v.critic_id for v in votes}
    view = a.RoomProposal(
        proposal=proposal_to_proto(record, include_artifact=include_artifact),
        state=record.state,
        votes_received=len(votes),
        votes_required=len(record.requested_critics),
        pending_critics=[c for c in record.requested_critics if c not in voted],
        policy_version=record.policy_version,
        invocation_id=record.invocation_id,
        updated_at=float_to_timestamp(record.updated_at),
        artifact_size=len(record.artifact),
    )
    if record.state not in _DECIDED:
        view.vote_deadline.CopyFrom(float_to_timestamp(record.vote_deadline))
    return view


def room_decision(decision: DecisionRecord) -> a.RoomDecision:
    """The apiary.v1 view of a decision, with its audit fields."""
    return a.RoomDecision(
        decision=decision_to_proto(decision),
        sequence=decision.sequence,
        decided_by=decision.decided_by,
        via=decision.via,
        triggers=list(decision.triggers),
        invocation_id=decision.invocation_id,
        details_json=json.dumps(dict(decision.details), sort_keys=True),
    )


def room_policy(record: PolicyVersionRecord, current: str) -> a.RoomPolicyVersion:
    return a.RoomPolicyVersion(
        version=record.version,
        settings_json=json.dumps(dict(record.settings), sort_keys=True),
        created_at=float_to_timestamp(record.created_at),
        current=record.version == current,
    )
