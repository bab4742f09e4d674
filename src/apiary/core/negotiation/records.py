"""What the negotiation store keeps (RFC 17, 17.2-17.4): rooms, rounds and artifacts.

JSON-valued fields hold plain JSON objects; times are UTC seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class NegotiationRecord:
    """One negotiation (a "room": correlation_id = negotiation_id) and where it stands.

    `state` is a NegotiationState name (core/negotiation/machine.py).
    """

    negotiation_id: str
    correlation_id: str
    topic: str
    participants: tuple[str, ...]
    intensity: str
    """LOWEST, LOW, MEDIUM, HIGH or HIGHEST."""
    state: str
    created_at: float
    updated_at: float
    deadline: float
    """The debate timeout: created_at + the debate timeout (RFC 17)."""
    opened_by: str = ""
    profile: str = ""
    """The profile the policy came from (an intensity name or a SetPolicyProfiles name)."""
    policy: Mapping[str, Any] = field(default_factory=dict)
    """The EffectivePolicy as JSON ({"policy": ..., "applied": ...}), persisted per room."""
    validation: Mapping[str, Any] = field(default_factory=dict)
    """ValidationRules as JSON (schema, examples)."""
    round: int = 0
    """The current round (the number of the latest admitted draft); 0 before the first."""
    round_deadline: float = 0.0
    """When the current round times out; 0 while no round timer runs (HITL, terminal)."""
    tokens_spent: int = 0
    oscillations: int = 0
    invocation_id: str = ""
    """The HITL invocation the negotiation waits for (gates, DEBATE_DEADLOCK)."""
    stop_reason: str = ""
    decision: Mapping[str, Any] = field(default_factory=dict)
    """Once ended: the DecisionReport (decided_by, final_score, rationale, stop_reason) and,
    when decided, the result (version, content_type, result_b64); when aborted, the reason
    and error_code."""


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """One admitted draft (round N = draft vN) and the evaluations it received."""

    negotiation_id: str
    round: int
    kind: str
    """propose | counter"""
    from_agent: str
    content_type: str
    payload: bytes
    submitted_at: float
    tokens: int = 0
    checks: Mapping[str, Any] = field(default_factory=dict)
    """The deterministic checks (DraftCheck.to_json())."""
    delta: Mapping[str, Any] = field(default_factory=dict)
    """The DeltaSummary from the previous draft ({} for the first)."""
    evaluations: Mapping[str, Any] = field(default_factory=dict)
    """Evaluator agent id -> its EvaluationReport (as JSON) with the blended score."""
    llm_confidence: float | None = None
    """The Inference Engine's confidence for this round's draft, when consulted."""
    score: float | None = None
    """The round's unanimity score (the lowest blended score) once every evaluator voted."""


@dataclass(frozen=True, slots=True)
class ArtifactRecord:
    """`sw4rm.activity.Artifact`: one versioned record of a negotiation (RFC 17.4).

    (negotiation_id, kind, version) is unique; its file name is `{kind}_{version}.json`
    (contract_v3.json, diff_v2_to_v3.json).
    """

    negotiation_id: str
    kind: str
    version: str
    content_type: str
    content: bytes
    created_at: float

    @property
    def name(self) -> str:
        return f"{self.kind}_{self.version}.json"
