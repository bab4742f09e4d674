"""How negotiation-room records map to table rows, for both SQL backends and the memory one.

Same conventions as `sql_rows`: one column list per table in both schemas, JSON fields as
JSON text (SQLite) or JSONB (PostgreSQL, handed back parsed), values coerced to the column's
Python type, and what one backend refuses refused by all of them before anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from apiary.core.rooms.records import (
    DecisionRecord,
    PolicyVersionRecord,
    ProposalRecord,
    RoomState,
    VoteRecord,
)
from apiary.core.vote_aggregation import AggregatedScore
from apiary.store.errors import StoreError
from apiary.store.json_codec import (
    dump_json,
    dump_json_list,
    json_list_of,
    json_object_of,
)
from apiary.store.sql_rows import checked_strings

POLICY_COLUMNS = "version, settings, created_at"
PROPOSAL_COLUMNS = (
    "artifact_id, negotiation_room_id, artifact_type, producer_id, artifact,"
    " artifact_content_type, requested_critics, created_at, state, updated_at, policy_version,"
    " vote_deadline, invocation_id"
)
PROPOSAL_COLUMN_COUNT = 13
VOTE_COLUMNS = (
    "artifact_id, critic_id, score, confidence, passed, strengths, weaknesses,"
    " recommendations, negotiation_room_id, voted_at"
)
VOTE_COLUMN_COUNT = 10
DECISION_COLUMNS = (
    "artifact_id, sequence, negotiation_room_id, outcome, votes, aggregated_score,"
    " policy_version, reason, decided_at, decided_by, via, triggers, invocation_id, details"
)
DECISION_COLUMN_COUNT = 14
JSON_COLUMNS = frozenset(
    {
        "settings", "requested_critics", "strengths", "weaknesses", "recommendations", "votes",
        "aggregated_score", "triggers", "details",
    }
)  # fmt: skip
"""Columns holding JSON (text in SQLite, JSONB in PostgreSQL)."""


def markers(columns: str, placeholder: str, json_cast: str = "") -> str:
    """The VALUES markers of `columns`, JSON ones with `json_cast` (PostgreSQL's ::jsonb)."""
    names = columns.split(", ")
    return ", ".join(
        f"{placeholder}{json_cast}" if n in JSON_COLUMNS else placeholder for n in names
    )


def policy_row(record: PolicyVersionRecord) -> tuple[Any, ...]:
    if not record.version:
        raise ValueError("a policy version needs a name")
    return (record.version, dump_json(record.settings), float(record.created_at))


def policy_from_row(row: Sequence[Any]) -> PolicyVersionRecord:
    version, settings, created_at = row
    return PolicyVersionRecord(version, json_object_of(settings), created_at)


def proposal_row(record: ProposalRecord) -> tuple[Any, ...]:
    """The values of PROPOSAL_COLUMNS; ValueError for a state that is not a RoomState."""
    return (
        record.artifact_id,
        record.negotiation_room_id,
        record.artifact_type,
        record.producer_id,
        bytes(record.artifact),
        record.artifact_content_type,
        dump_json_list(checked_strings("requested_critics", record.requested_critics)),
        float(record.created_at),
        RoomState(record.state).value,
        float(record.updated_at),
        record.policy_version,
        float(record.vote_deadline),
        record.invocation_id,
    )


def proposal_from_row(row: Sequence[Any]) -> ProposalRecord:
    artifact_id, room_id, artifact_type, producer_id, artifact, content_type = row[:6]
    critics, created_at, state, updated_at, version, deadline, invocation_id = row[6:]
    return ProposalRecord(
        artifact_id=artifact_id,
        negotiation_room_id=room_id,
        artifact_type=artifact_type,
        producer_id=producer_id,
        artifact=bytes(artifact),
        artifact_content_type=content_type,
        requested_critics=tuple(str(c) for c in json_list_of(critics)),
        created_at=created_at,
        state=state,
        updated_at=updated_at,
        policy_version=version,
        vote_deadline=deadline,
        invocation_id=invocation_id,
    )


def vote_row(vote: VoteRecord) -> tuple[Any, ...]:
    return (
        vote.artifact_id,
        vote.critic_id,
        float(vote.score),
        float(vote.confidence),
        bool(vote.passed),
        dump_json_list(checked_strings("strengths", vote.strengths)),
        dump_json_list(checked_strings("weaknesses", vote.weaknesses)),
        dump_json_list(checked_strings("recommendations", vote.recommendations)),
        vote.negotiation_room_id,
        float(vote.voted_at),
    )


def vote_from_row(row: Sequence[Any]) -> VoteRecord:
    artifact_id, critic_id, score, confidence, passed = row[:5]
    strengths, weaknesses, recommendations, room_id, voted_at = row[5:]
    return VoteRecord(
        artifact_id=artifact_id,
        critic_id=critic_id,
        score=score,
        confidence=confidence,
        passed=bool(passed),
        strengths=tuple(str(s) for s in json_list_of(strengths)),
        weaknesses=tuple(str(s) for s in json_list_of(weaknesses)),
        recommendations=tuple(str(s) for s in json_list_of(recommendations)),
        negotiation_room_id=room_id,
        voted_at=voted_at,
    )


def decision_row(decision: DecisionRecord) -> tuple[Any, ...]:
    """The values of DECISION_COLUMNS; the votes are kept with the decision as JSON."""
    if decision.sequence < 1:
        raise ValueError(f"a decision's sequence starts at 1, got {decision.sequence}")
    scores = decision.aggregated_score
    return (
        decision.artifact_id,
        int(decision.sequence),
        decision.negotiation_room_id,
        decision.outcome,
        dump_json_list([_vote_json(v) for v in decision.votes]),
        dump_json(scores.as_dict() if scores else {}),
        decision.policy_version,
        decision.reason,
        float(decision.decided_at),
        decision.decided_by,
        decision.via,
        dump_json_list(checked_strings("triggers", decision.triggers)),
        decision.invocation_id,
        dump_json(decision.details),
    )


def decision_from_row(row: Sequence[Any]) -> DecisionRecord:
    artifact_id, sequence, room_id, outcome, votes, scores, version, reason = row[:8]
    decided_at, decided_by, via, triggers, invocation_id, details = row[8:]
    found = json_object_of(scores)
    return DecisionRecord(
        artifact_id=artifact_id,
        sequence=sequence,
        negotiation_room_id=room_id,
        outcome=outcome,
        votes=tuple(_vote_from_json(v) for v in json_list_of(votes)),
        aggregated_score=_scores(found) if found else None,
        policy_version=version,
        reason=reason,
        decided_at=decided_at,
        decided_by=decided_by,
        via=via,
        triggers=tuple(str(t) for t in json_list_of(triggers)),
        invocation_id=invocation_id,
        details=json_object_of(details),
    )


def proposal_list_clauses(
    states: frozenset[str] | None, room_id: str | None, after_created: float, placeholder: str
) -> tuple[list[str], list[Any]] | None:
    """The WHERE terms and parameters of a proposal listing; None when nothing can match."""
    clauses = [f"created_at > {placeholder}"]
    params: list[Any] = [float(after_created)]
    if room_id is not None:
        clauses.append(f"negotiation_room_id = {placeholder}")
        params.append(room_id)
    if states is not None:
        if not states:
            return None
        values = sorted(states)
        clauses.append(f"state IN ({', '.join([placeholder] * len(values))})")
        params.extend(values)
    return clauses, params


def _scores(found: Mapping[str, Any]) -> AggregatedScore:
    return AggregatedScore(
        mean=float(found["mean"]),
        min_score=float(found["min_score"]),
        max_score=float(found["max_score"]),
        std_dev=float(found["std_dev"]),
        weighted_mean=float(found["weighted_mean"]),
        vote_count=int(found["vote_count"]),
    )


def _vote_json(vote: VoteRecord) -> dict[str, Any]:
    return {
        "artifact_id": vote.artifact_id,
        "critic_id": vote.critic_id,
        "score": float(vote.score),
        "confidence": float(vote.confidence),
        "passed": bool(vote.passed),
        "strengths": list(checked_strings("strengths", vote.strengths)),
        "weaknesses": list(checked_strings("weaknesses", vote.weaknesses)),
        "recommendations": list(checked_strings("recommendations", vote.recommendations)),
        "negotiation_room_id": vote.negotiation_room_id,
        "voted_at": float(vote.voted_at),
    }


def _vote_from_json(value: Any) -> VoteRecord:
    if not isinstance(value, dict):
        raise StoreError(f"a stored decision's vote is not a JSON object: {type(value).__name__}")
    return VoteRecord(
        artifact_id=str(value["artifact_id"]),
        critic_id=str(value["critic_id"]),
        score=float(value["score"]),
        confidence=float(value["confidence"]),
        passed=bool(value["passed"]),
        strengths=tuple(str(s) for s in value["strengths"]),
        weaknesses=tuple(str(s) for s in value["weaknesses"]),
        recommendations=tuple(str(s) for s in value["recommendations"]),
        negotiation_room_id=str(value["negotiation_room_id"]),
        voted_at=float(value["voted_at"]),
    )
