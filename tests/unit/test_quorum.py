"""Negotiation quorum (INTEROP.md, contract quorum-v1) against the shared cross-SDK vectors,
and the rules' checks at and past their limits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.quorum import (
    Action,
    OnFailure,
    QuorumRule,
    RuleKind,
    decide,
    parse_on_failure,
    rule_from,
)
from apiary.errors import ValidationError

# A copy of spec/vectors/quorum_vectors.json, kept byte-identical.
VECTORS_FILE = Path(__file__).resolve().parents[1] / "vectors" / "quorum_vectors.json"
VECTORS: list[dict[str, Any]] = json.loads(VECTORS_FILE.read_text())["vectors"]


@pytest.mark.conformance("interop.quorum.vectors")
@pytest.mark.parametrize("vector", VECTORS, ids=[v["id"] for v in VECTORS])
def test_shared_vectors(vector: dict[str, Any]) -> None:
    found = decide(
        vector["requested"],
        [vote["critic_id"] for vote in vector["votes"]],
        rule_from(vector["rule"]),
        parse_on_failure(vector["on_failure"]),
    )
    expected = vector["expected"]
    assert {
        "met": found.met,
        "received": found.received,
        "expected": found.expected,
        "threshold": found.threshold,
        "action": found.action.value,
        "injected": list(found.abstained),
        "all_vote_count": len(found.all_votes),
    } == expected


def test_the_vectors_cover_every_rule_and_failure_mode() -> None:
    assert {v["rule"]["kind"] for v in VECTORS} == {k.value for k in RuleKind}
    assert {v["on_failure"] for v in VECTORS} == {f.value for f in OnFailure}


@pytest.mark.parametrize(
    ("fraction", "expected", "threshold"),
    [(0.1, 30, 3), (0.5, 3, 2), (0.5, 2, 1), (1.0, 7, 7), (0.0, 5, 0), (2 / 3, 3, 2), (0.7, 10, 7)],
)
def test_fractions_round_up_exactly(fraction: float, expected: int, threshold: int) -> None:
    """The fraction of the requested voters, rounded up, without the float product's error
    (0.1 x 30 is 3.0000000000000004 in floats: 4 if rounded up naively)."""
    assert QuorumRule(RuleKind.MINIMUM_FRACTION, fraction).threshold(expected) == threshold


def test_abstentions_follow_the_roster_order_and_appear_once() -> None:
    found = decide(
        ["c", "a", "b", "a"], ["a"], QuorumRule(RuleKind.REQUIRE_ALL, True),
        OnFailure.FAIL_WITH_ABSTAIN,
    )  # fmt: skip
    assert found.abstained == ("c", "b")
    assert found.all_votes == ("a", "c", "b")
    assert found.as_dict()["action"] == "decided_with_abstains"


@given(
    st.lists(st.sampled_from("abcdefg"), max_size=10),
    st.lists(st.sampled_from("abcdefghij"), max_size=15),
    st.integers(0, 12),
    st.sampled_from(list(OnFailure)),
)
def test_met_exactly_when_enough_distinct_requested_voters_voted(
    requested: list[str], voters: list[str], minimum: int, on_failure: OnFailure
) -> None:
    found = decide(requested, voters, QuorumRule(RuleKind.MINIMUM_VOTES, minimum), on_failure)
    distinct = set(requested) & set(voters)
    assert found.received == len(distinct)
    assert found.met is (len(distinct) >= minimum)
    assert (found.action is Action.NONE) is found.met
    assert found.all_votes[: len(voters)] == tuple(voters)
    if found.action is not Action.DECIDED_WITH_ABSTAINS:
        assert found.abstained == ()
    else:
        assert set(found.abstained) == set(requested) - distinct


@pytest.mark.parametrize(
    ("kind", "value", "field", "says"),
    [
        ("most", 1, "quorum.kind", "must be one of minimum_votes"),
        (None, 1, "quorum.kind", "must be one of"),
        ("minimum_votes", -1, "quorum.value", "whole number from 0"),
        ("minimum_votes", 1.5, "quorum.value", "whole number"),
        ("minimum_votes", 1_000_001, "quorum.value", "whole number from 0 to 1000000"),
        ("minimum_votes", True, "quorum.value", "must be a number"),
        ("minimum_votes", "2", "quorum.value", "must be a number"),
        ("minimum_fraction", 1.0000001, "quorum.value", "fraction from 0 to 1"),
        ("minimum_fraction", -0.1, "quorum.value", "fraction from 0 to 1"),
        ("minimum_fraction", float("nan"), "quorum.value", "fraction from 0 to 1"),
        ("require_all", 1, "quorum.value", "true or false"),
    ],
)
def test_bad_rules_are_refused_naming_the_field(
    kind: object, value: object, field: str, says: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        QuorumRule.parse(kind, value)
    assert caught.value.details["field"] == field
    assert says in str(caught.value)


def test_limits_are_accepted_at_the_boundary() -> None:
    assert QuorumRule.parse("minimum_votes", 1_000_000).value == 1_000_000
    assert QuorumRule.parse("minimum_votes", 0).threshold(3) == 0
    assert QuorumRule.parse("minimum_fraction", 1).threshold(3) == 3
    assert QuorumRule.parse("minimum_fraction", 0).threshold(3) == 0


def test_an_unknown_failure_mode_is_refused() -> None:
    with pytest.raises(ValidationError) as caught:
        parse_on_failure("fail_open")
    assert caught.value.details["field"] == "quorum.on_failure"
