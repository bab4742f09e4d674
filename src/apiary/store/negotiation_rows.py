"""How negotiation records map to rows of `negotiations`, `negotiation_rounds`,
`negotiation_policies` and `artifacts`, for both SQL backends (see sql_rows.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from apiary.core.negotiation.records import ArtifactRecord, NegotiationRecord, RoundRecord
from apiary.store.json_codec import (
    dump_json,
    dump_json_list,
    json_list_of,
    json_object_of,
)
from apiary.store.sql_rows import checked_strings

NEGOTIATION_COLUMNS = (
    "negotiation_id, correlation_id, topic, participants, intensity, state, created_at,"
    " updated_at, deadline, opened_by, profile, policy, validation, round_number,"
    " round_deadline, tokens_spent, oscillations, invocation_id, stop_reason, decision"
)
NEGOTIATION_COLUMN_COUNT = 20
NEGOTIATION_JSON_COLUMNS = frozenset({"participants", "policy", "validation", "decision"})
ROUND_COLUMNS = (
    "negotiation_id, round_number, kind, from_agent, content_type, payload, submitted_at,"
    " tokens, checks, delta, evaluations, llm_confidence, score"
)
ROUND_COLUMN_COUNT = 13
ROUND_JSON_COLUMNS = frozenset({"checks", "delta", "evaluations"})
ARTIFACT_COLUMNS = "negotiation_id, kind, version, content_type, content, created_at"
ARTIFACT_COLUMN_COUNT = 6
_INT64_MAX = (1 << 63) - 1


def negotiation_row(record: NegotiationRecord) -> tuple[Any, ...]:
    """The values of NEGOTIATION_COLUMNS; ValueError for non-JSON values or out-of-range
    integers (every backend refuses them alike)."""
    return (
        record.negotiation_id,
        record.correlation_id,
        record.topic,
        dump_json_list(checked_strings("participants", record.participants)),
        record.intensity,
        record.state,
        float(record.created_at),
        float(record.updated_at),
        float(record.deadline),
        record.opened_by,
        record.profile,
        dump_json(record.policy),
        dump_json(record.validation),
        _int64("round", record.round),
        float(record.round_deadline),
        _int64("tokens_spent", record.tokens_spent),
        _int64("oscillations", record.oscillations),
        record.invocation_id,
        record.stop_reason,
        dump_json(record.decision),
    )


def negotiation_from_row(row: Sequence[Any]) -> NegotiationRecord:
    nid, corr, topic, participants, intensity, state, created, updated, deadline = row[:9]
    opened_by, profile, policy, validation, number, round_deadline = row[9:15]
    tokens, oscillations, invocation_id, stop_reason, decision = row[15:]
    return NegotiationRecord(
        negotiation_id=nid,
        correlation_id=corr,
        topic=topic,
        participants=tuple(str(p) for p in json_list_of(participants)),
        intensity=intensity,
        state=state,
        created_at=created,
        updated_at=updated,
        deadline=deadline,
        opened_by=opened_by,
        profile=profile,
        policy=json_object_of(policy),
        validation=json_object_of(validation),
        round=number,
        round_deadline=round_deadline,
        tokens_spent=tokens,
        oscillations=oscillations,
        invocation_id=invocation_id,
        stop_reason=stop_reason,
        decision=json_object_of(decision),
    )


def round_row(record: RoundRecord) -> tuple[Any, ...]:
    return (
        record.negotiation_id,
        _int64("round", record.round),
        record.kind,
        record.from_agent,
        record.content_type,
        bytes(record.payload),
        float(record.submitted_at),
        _int64("tokens", record.tokens),
        dump_json(record.checks),
        dump_json(record.delta),
        dump_json(record.evaluations),
        None if record.llm_confidence is None else float(record.llm_confidence),
        None if record.score is None else float(record.score),
    )


def round_from_row(row: Sequence[Any]) -> RoundRecord:
    nid, number, kind, from_agent, content_type, payload, submitted_at = row[:7]
    tokens, checks, delta, evaluations, llm_confidence, score = row[7:]
    return RoundRecord(
        negotiation_id=nid,
        round=number,
        kind=kind,
        from_agent=from_agent,
        content_type=content_type,
        payload=bytes(payload),
        submitted_at=submitted_at,
        tokens=tokens,
        checks=json_object_of(checks),
        delta=json_object_of(delta),
        evaluations=json_object_of(evaluations),
        llm_confidence=llm_confidence,
        score=score,
    )


def artifact_row(record: ArtifactRecord) -> tuple[Any, ...]:
    return (
        record.negotiation_id,
        record.kind,
        record.version,
        record.content_type,
        bytes(record.content),
        float(record.created_at),
    )


def artifact_from_row(row: Sequence[Any]) -> ArtifactRecord:
    nid, kind, version, content_type, content, created_at = row
    return ArtifactRecord(nid, kind, version, content_type, bytes(content), created_at)


def policy_text(policy: Mapping[str, Any]) -> str:
    return dump_json(policy)


def policy_from_column(value: Any) -> dict[str, Any]:
    return json_object_of(value)


def negotiation_list_clauses(
    states: frozenset[str] | None, after_created: float, placeholder: str
) -> tuple[list[str], list[Any]] | None:
    """WHERE terms and parameters of a listing; None when nothing can match."""
    clauses = [f"created_at > {placeholder}"]
    params: list[Any] = [float(after_created)]
    if states is not None:
        if not states:
            return None
        values = sorted(states)
        clauses.append(f"state IN ({', '.join([placeholder] * len(values))})")
        params.extend(values)
    return clauses, params


def _int64(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _INT64_MAX:
        raise ValueError(f"{name} must be an integer in [0, 2**63), got {value!r}")
    return value
