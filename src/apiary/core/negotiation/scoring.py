"""Scoring of drafts (RFC 17.3): deterministic first, inference confidence blended by
llm_weight, the unanimity score of a round, oscillation, token estimates, tie-breaking.

- An evaluator's deterministic score is its own score (Evaluate.confidence_score or
  EvaluationReport.deterministic_score) times the draft's check score (schema and
  examples, computed by the coordinator when the draft arrived: that is the part that runs
  first, before any inference).
- The blended score is `(1 - llm_weight) * deterministic + llm_weight * confidence`, where
  confidence is the evaluator's own llm_confidence, else the coordinator's Inference Engine
  confidence for the round; with neither, or llm_weight 0, it is the deterministic score.
- Unanimity (RFC 17: "at minimum two-party unanimity"): every participant other than the
  draft's author evaluates it; the round's score is the lowest blended score, and the draft
  is accepted when that reaches score_threshold.
- An oscillation is a reversal in the direction of successive round scores (up then down,
  or down then up, by more than `OSCILLATION_EPSILON`), or a draft that repeats one from
  before the previous round (A, B, A).
- Tokens are estimated as one per four payload bytes, rounded up (drafts and notes).
- Tie-breaking picks the candidate with the highest score; among equal scores, the later
  draft (it has absorbed more of the debate).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from apiary.core.negotiation.records import RoundRecord

OSCILLATION_EPSILON: Final = 1e-6
_ACCEPT_SLACK: Final = 1e-9
"""Float noise never decides between accept and reject."""


def estimate_tokens(size: int) -> int:
    """Tokens of `size` bytes of text: one per four bytes, rounded up."""
    return math.ceil(size / 4)


def blend(deterministic: float, confidence: float | None, llm_weight: float) -> float:
    """The blended score (see the module docstring), rounded to 6 places."""
    if confidence is None or llm_weight <= 0:
        return round(deterministic, 6)
    return round((1 - llm_weight) * deterministic + llm_weight * confidence, 6)


def evaluators(participants: Sequence[str], author: str) -> tuple[str, ...]:
    """Who must evaluate a draft by `author`: every other participant."""
    return tuple(p for p in participants if p != author)


def unanimity_score(
    evaluations: Mapping[str, Mapping[str, Any]], required: Iterable[str]
) -> float | None:
    """The lowest blended score once every required evaluator voted; None before."""
    scores = []
    for agent in required:
        found = evaluations.get(agent)
        if found is None:
            return None
        scores.append(float(found["score"]))
    return min(scores) if scores else None


def meets(score: float, threshold: float) -> bool:
    return score + _ACCEPT_SLACK >= threshold


def reverses(scores: Sequence[float]) -> bool:
    """Whether the last of `scores` reverses the direction of the two before it."""
    if len(scores) < 3:
        return False
    first, second = scores[-2] - scores[-3], scores[-1] - scores[-2]
    if abs(first) <= OSCILLATION_EPSILON or abs(second) <= OSCILLATION_EPSILON:
        return False
    return (first > 0) != (second > 0)


def repeats(rounds: Sequence[RoundRecord], content_type: str, payload: bytes) -> bool:
    """Whether a new draft repeats one from before the latest round (A, B, A)."""
    return any(r.payload == payload and r.content_type == content_type for r in rounds[:-1])


def candidate_score(round_: RoundRecord) -> float | None:
    """A draft's standing: its unanimity score, else its lowest score so far, else None."""
    if round_.score is not None:
        return round_.score
    scores = [float(e["score"]) for e in round_.evaluations.values()]
    return min(scores) if scores else None


def best_candidate(rounds: Sequence[RoundRecord]) -> RoundRecord | None:
    """The tie-break winner among scored drafts (see the module docstring); None if none."""
    scored = [(candidate_score(r), r.round, r) for r in rounds]
    ranked = [(s, n, r) for s, n, r in scored if s is not None]
    if not ranked:
        return None
    return max(ranked, key=lambda item: (item[0], item[1]))[2]
