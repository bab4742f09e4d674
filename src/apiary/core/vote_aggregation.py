"""Aggregation of negotiation-room votes (RFC 17.5 "Vote Aggregation").

`aggregate` turns critics' (score, confidence) pairs into the `AggregatedScore` of the wire
(`sw4rm.negotiation_room.AggregatedScore`), exactly as the shared cross-SDK vectors
(spec/vectors/score_aggregation_vectors.json, contract "score-summary-v1") expect:

- mean, min_score, max_score: of the scores;
- std_dev: the population standard deviation (divide by n, not n - 1): it measures how far
  apart these critics are, not an estimate for a larger population of critics;
- weighted_mean: the confidence-weighted mean, sum(score * confidence) / sum(confidence),
  falling back to the arithmetic mean when every confidence is zero (nothing to weigh by);
- vote_count: how many votes were aggregated.

No votes is an error (ValidationError, "empty-votes"): a mean of nothing is not 0.
Sums use `math.fsum`, so the result does not depend on the order of the votes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from apiary.errors import ValidationError

EMPTY_VOTES = "empty-votes"
"""The vectors' name for the error of aggregating no votes (`details["reason"]`)."""


class Scored(Protocol):
    """What aggregation reads from a vote."""

    @property
    def score(self) -> float: ...

    @property
    def confidence(self) -> float: ...


@dataclass(frozen=True, slots=True)
class AggregatedScore:
    """The statistics of a set of votes, field for field the wire's AggregatedScore."""

    mean: float
    min_score: float
    max_score: float
    std_dev: float
    weighted_mean: float
    vote_count: int

    def as_dict(self) -> dict[str, float | int]:
        return {
            "mean": self.mean,
            "min_score": self.min_score,
            "max_score": self.max_score,
            "std_dev": self.std_dev,
            "weighted_mean": self.weighted_mean,
            "vote_count": self.vote_count,
        }


def aggregate(votes: Sequence[Scored]) -> AggregatedScore:
    """The AggregatedScore of `votes`; ValidationError (reason empty-votes) for none."""
    if not votes:
        raise ValidationError.for_field(
            "votes", "there are no votes to aggregate", reason=EMPTY_VOTES
        )
    scores = [float(v.score) for v in votes]
    weights = [float(v.confidence) for v in votes]
    count = len(scores)
    mean = math.fsum(scores) / count
    variance = math.fsum((s - mean) ** 2 for s in scores) / count
    # Weights are scaled by the largest first, so tiny (even subnormal) confidences do not
    # underflow to zero in the products: the ratio is the same, and stays within the scores.
    largest = max(weights)
    scaled = [w / largest for w in weights] if largest > 0 else weights
    total_weight = math.fsum(scaled)
    weighted = (
        math.fsum(s * w for s, w in zip(scores, scaled, strict=True)) / total_weight
        if total_weight > 0
        else mean
    )
    weighted = min(max(weighted, min(scores)), max(scores))  # rounding never leaves the range
    return AggregatedScore(
        mean=mean,
        min_score=min(scores),
        max_score=max(scores),
        std_dev=math.sqrt(variance),
        weighted_mean=weighted,
        vote_count=count,
    )


def average_confidence(votes: Sequence[Scored]) -> float:
    """The arithmetic mean of the votes' confidences (0.0 for no votes)."""
    return math.fsum(float(v.confidence) for v in votes) / len(votes) if votes else 0.0
