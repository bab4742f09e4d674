"""Room vote aggregation (RFC 17.5 "Vote Aggregation") against the shared cross-SDK vectors,
and the properties every aggregate has whatever the votes."""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from apiary.core.vote_aggregation import EMPTY_VOTES, AggregatedScore, aggregate
from apiary.errors import ValidationError

# A copy of spec/vectors/score_aggregation_vectors.json, kept byte-identical.
VECTORS_FILE = Path(__file__).resolve().parents[1] / "vectors" / "score_aggregation_vectors.json"
VECTORS: list[dict[str, Any]] = json.loads(VECTORS_FILE.read_text())["vectors"]


@dataclass(frozen=True)
class Vote:
    score: float
    confidence: float


@pytest.mark.parametrize("vector", VECTORS, ids=[v["id"] for v in VECTORS])
def test_shared_vectors(vector: dict[str, Any]) -> None:
    votes = [Vote(v["score"], v["confidence"]) for v in vector["votes"]]
    if "error" in vector:
        with pytest.raises(ValidationError) as caught:
            aggregate(votes)
        assert caught.value.details == {"field": "votes", "reason": vector["error"]}
        assert vector["error"] == EMPTY_VOTES
        return
    found = aggregate(votes).as_dict()
    expected = vector["expected"]
    assert found.keys() == expected.keys()
    for key, value in expected.items():
        assert found[key] == pytest.approx(value, abs=1e-12), key
    assert type(found["vote_count"]) is int


def test_the_appendix_c10_example() -> None:
    """C.10: scores 8 (confidence 0.9) and 6 (0.7): weighted_mean ~7.2, std_dev 1.0."""
    found = aggregate([Vote(8, 0.9), Vote(6, 0.7)])
    assert found == AggregatedScore(7.0, 6.0, 8.0, 1.0, pytest.approx(7.125), 2)  # type: ignore[arg-type]


votes_strategy = st.lists(
    st.builds(
        Vote,
        st.floats(0, 10, allow_nan=False),
        st.floats(0, 1, allow_nan=False),
    ),
    min_size=1,
    max_size=30,
)


@given(votes_strategy, st.randoms(use_true_random=False))
@example(votes=[Vote(0.5, 5e-324)], rng=random.Random(0))  # a subnormal weight underflowed
def test_aggregates_are_bounded_and_order_free(votes: list[Vote], rng: Any) -> None:
    found = aggregate(votes)
    shuffled = list(votes)
    rng.shuffle(shuffled)
    again = aggregate(shuffled)
    for key, value in found.as_dict().items():
        assert again.as_dict()[key] == pytest.approx(value, rel=1e-12, abs=1e-12)
    tolerance = 1e-9
    assert found.vote_count == len(votes)
    assert found.min_score - tolerance <= found.mean <= found.max_score + tolerance
    assert found.min_score - tolerance <= found.weighted_mean <= found.max_score + tolerance
    assert 0 <= found.std_dev <= (found.max_score - found.min_score) / 2 + tolerance
    scores = [v.score for v in votes]
    assert found.std_dev == pytest.approx(statistics.pstdev(scores), abs=1e-9)


@given(votes_strategy, st.floats(0.01, 1))
def test_equal_confidences_weigh_nothing(votes: list[Vote], confidence: float) -> None:
    same = [Vote(v.score, confidence) for v in votes]
    found = aggregate(same)
    assert found.weighted_mean == pytest.approx(found.mean, rel=1e-9, abs=1e-9)


def test_a_more_confident_vote_pulls_the_weighted_mean() -> None:
    found = aggregate([Vote(2, 0.1), Vote(10, 0.9)])
    assert found.mean == 6
    assert found.weighted_mean == pytest.approx(9.2)
    assert math.isclose(found.std_dev, 4)
