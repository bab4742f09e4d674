"""Converters between sw4rm.policy / apiary.v1 negotiation messages and core values.

The proto's `float` fields are 32-bit: 0.8 arrives as 0.800000011920929. Values read from
the wire are rounded to 6 decimal places, so that a policy set as 0.8 is compared, stored
and shown as 0.8.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from apiary.core.negotiation.policy import (
    PREFERENCE_FIELDS,
    AgentPreferences,
    EffectivePolicy,
    NegotiationPolicy,
    parse_gate,
)
from apiary.core.negotiation.records import NegotiationRecord, RoundRecord
from apiary.core.negotiation.vocabulary import NegotiationState
from apiary.errors import ValidationError
from apiary.wire import pb
from apiary.wire.convert import float_to_timestamp

p = pb.policy_pb2
_FLOATS = frozenset({"score_threshold", "diff_tolerance", "llm_weight"})


def _wire_float(value: float) -> float:
    return round(float(value), 6)


def policy_from_proto(msg: p.NegotiationPolicy, prefix: str = "policy") -> NegotiationPolicy:
    """A policy from the wire; ValidationError naming `prefix.<field>` when out of range."""
    gate = parse_gate(msg.hitl.mode, f"{prefix}.hitl.mode")
    values: dict[str, Any] = {
        "max_rounds": msg.max_rounds,
        "score_threshold": _wire_float(msg.score_threshold),
        "diff_tolerance": _wire_float(msg.diff_tolerance),
        "round_timeout_ms": msg.round_timeout_ms,
        "token_budget_per_round": msg.token_budget_per_round,
        "total_token_budget": msg.total_token_budget,
        "oscillation_limit": msg.oscillation_limit,
        "hitl": {"mode": gate.value},
        "scoring": {
            "require_schema_valid": msg.scoring.require_schema_valid,
            "require_examples_pass": msg.scoring.require_examples_pass,
            "llm_weight": _wire_float(msg.scoring.llm_weight),
        },
    }
    return NegotiationPolicy.from_json(values, prefix)


def policy_to_proto(policy: NegotiationPolicy) -> p.NegotiationPolicy:
    return p.NegotiationPolicy(
        max_rounds=policy.max_rounds,
        score_threshold=policy.score_threshold,
        diff_tolerance=policy.diff_tolerance,
        round_timeout_ms=policy.round_timeout_ms,
        token_budget_per_round=policy.token_budget_per_round,
        total_token_budget=policy.total_token_budget,
        oscillation_limit=policy.oscillation_limit,
        hitl=p.NegotiationPolicy.Hitl(mode=policy.hitl.value),
        scoring=p.NegotiationPolicy.Scoring(
            require_schema_valid=policy.require_schema_valid,
            require_examples_pass=policy.require_examples_pass,
            llm_weight=policy.llm_weight,
        ),
    )


def preferences_from_proto(msg: p.AgentPreferences, prefix: str) -> AgentPreferences:
    """Preferences from the wire: proto3 cannot tell 0 from unset, so 0 means "no
    preference" for every field."""
    values: dict[str, Any] = {}
    for name in PREFERENCE_FIELDS:
        value = getattr(msg, name)
        if value:
            values[name] = _wire_float(value) if name in _FLOATS else value
    return AgentPreferences.from_json(values, prefix)


def preferences_to_proto(prefs: AgentPreferences) -> p.AgentPreferences:
    return p.AgentPreferences(**prefs.to_json())


def effective_to_proto(effective: EffectivePolicy) -> p.EffectivePolicy:
    out = p.EffectivePolicy(policy=policy_to_proto(effective.policy))
    for agent, prefs in effective.applied.items():
        out.applied[agent].CopyFrom(preferences_to_proto(prefs))
    return out


def delta_to_proto(delta: Mapping[str, Any]) -> p.DeltaSummary:
    return p.DeltaSummary(
        magnitude=float(delta.get("magnitude", 0.0)),
        changed_paths=[str(path) for path in delta.get("changed_paths", [])],
    )


def report_to_proto(report: Mapping[str, Any]) -> p.EvaluationReport:
    return p.EvaluationReport(
        from_agent=str(report.get("from_agent", "")),
        deterministic_score=float(report.get("deterministic_score") or 0.0),
        llm_confidence=float(report.get("llm_confidence") or 0.0),
        notes=str(report.get("notes", "")),
        delta=delta_to_proto(report.get("delta") or {}),
    )


def decision_to_proto(decision: Mapping[str, Any]) -> p.DecisionReport:
    return p.DecisionReport(
        decided_by=str(decision.get("decided_by") or ""),
        final_score=float(decision.get("final_score") or 0.0),
        rationale=str(decision.get("rationale") or ""),
        stop_reason=str(decision.get("stop_reason") or ""),
    )


def check_unit(value: float, name: str) -> float:
    """A [0, 1] score from the wire (rounded as above); ValidationError naming `name`."""
    rounded = _wire_float(value)
    if not 0.0 <= rounded <= 1.0:
        raise ValidationError.for_field(name, f"must be a number in [0, 1], got {value:g}")
    return rounded


def round_to_proto(round_: RoundRecord) -> pb.apiary_pb2.NegotiationRound:
    return pb.apiary_pb2.NegotiationRound(
        round=round_.round, kind=round_.kind, from_agent=round_.from_agent,
        content_type=round_.content_type, payload=round_.payload,
        submitted_at=float_to_timestamp(round_.submitted_at), tokens=round_.tokens,
        checks_json=_json(round_.checks), delta=delta_to_proto(round_.delta),
        evaluations=[report_to_proto(r) for r in round_.evaluations.values()],
        scored=round_.score is not None, score=round_.score or 0.0,
    )  # fmt: skip


_ENDED = frozenset(s.value for s in NegotiationState if s.terminal)


def view(
    record: NegotiationRecord, rounds: list[RoundRecord] | None = None
) -> pb.apiary_pb2.NegotiationView:
    effective = EffectivePolicy.from_json(record.policy)
    out = pb.apiary_pb2.NegotiationView(
        negotiation_id=record.negotiation_id, correlation_id=record.correlation_id,
        topic=record.topic, participants=list(record.participants),
        intensity=record.intensity, state=record.state,
        created_at=float_to_timestamp(record.created_at),
        updated_at=float_to_timestamp(record.updated_at),
        opened_by=record.opened_by,
        profile=record.profile, effective=effective_to_proto(effective),
        round=record.round, tokens_spent=record.tokens_spent,
        oscillations=record.oscillations, invocation_id=record.invocation_id,
        stop_reason=record.stop_reason,
        decision_json=_json(record.decision) if record.decision else "",
        validation_json=_json(record.validation) if record.validation else "",
        rounds=[round_to_proto(r) for r in rounds or []],
    )  # fmt: skip
    if record.state not in _ENDED:  # a decided or aborted negotiation waits for nothing
        out.deadline.CopyFrom(float_to_timestamp(record.deadline))
        if record.round_deadline:
            out.round_deadline.CopyFrom(float_to_timestamp(record.round_deadline))
    if record.decision:
        out.decision.CopyFrom(decision_to_proto(record.decision))
    return out


def _json(value: Mapping[str, Any]) -> str:
    return json.dumps(dict(value), sort_keys=True)
