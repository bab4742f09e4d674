"""Negotiation policy (RFC 17, 17.2): intensity guardrails, validation of every field,
clamping of agent preferences and the EffectivePolicy."""

from __future__ import annotations

import itertools

import pytest

from apiary.core.negotiation.policy import (
    AgentPreferences,
    Bounds,
    EffectivePolicy,
    Guardrails,
    HitlGate,
    Intensity,
    NegotiationPolicy,
    debate_timeout_s,
    derive_effective,
    intensity_policy,
    parse_gate,
    parse_intensity,
)
from apiary.errors import ValidationError

BASE = NegotiationPolicy()
RAILS = Guardrails()


@pytest.mark.conformance("negotiation.intensity.guardrails")
def test_each_intensity_maps_to_round_time_and_threshold_guardrails() -> None:
    policies = [intensity_policy(BASE, level, RAILS) for level in Intensity]
    assert intensity_policy(BASE, Intensity.MEDIUM, RAILS) == BASE
    for lower, higher in itertools.pairwise(policies):
        assert lower.max_rounds < higher.max_rounds
        assert lower.round_timeout_ms < higher.round_timeout_ms
        assert lower.score_threshold < higher.score_threshold
    lowest, highest = policies[0], policies[-1]
    assert (lowest.max_rounds, highest.max_rounds) == (2, 12)
    assert debate_timeout_s(lowest, 0, RAILS) < debate_timeout_s(highest, 0, RAILS)
    # Scaled values never leave the guardrails.
    tight = Guardrails(max_rounds=Bounds(1, 8), score_threshold=Bounds(0.5, 0.85))
    assert intensity_policy(BASE, Intensity.HIGHEST, tight).max_rounds == 8
    assert intensity_policy(BASE, Intensity.HIGHEST, tight).score_threshold == 0.85


def test_intensities_parse_by_name_or_proto_number() -> None:
    assert parse_intensity("high") is Intensity.HIGH
    assert parse_intensity(5) is Intensity.HIGHEST
    for bad in (0, 6, "EXTREME", None, True):
        with pytest.raises(ValidationError) as caught:
            parse_intensity(bad)
        assert caught.value.details["field"] == "intensity"
    assert parse_gate("") is HitlGate.NONE
    assert parse_gate("pausebetweenrounds") is HitlGate.PAUSE_BETWEEN_ROUNDS


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"max_rounds": 0}, "policy.max_rounds"),
        ({"max_rounds": 2.5}, "policy.max_rounds"),
        ({"score_threshold": 1.5}, "policy.score_threshold"),
        ({"diff_tolerance": -0.1}, "policy.diff_tolerance"),
        ({"llm_weight": float("nan")}, "policy.llm_weight"),
        ({"round_timeout_ms": 0}, "policy.round_timeout_ms"),
        ({"token_budget_per_round": -1}, "policy.token_budget_per_round"),
        ({"oscillation_limit": True}, "policy.oscillation_limit"),
        ({"hitl": "Sometimes"}, "policy.hitl.mode"),
        ({"require_schema_valid": "yes"}, "policy.scoring.require_schema_valid"),
    ],
)
def test_every_bad_policy_field_is_named(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        NegotiationPolicy(**changes)  # type: ignore[arg-type]
    assert caught.value.details["field"] == field


def test_policies_round_trip_through_json_and_unknown_fields_are_named() -> None:
    policy = NegotiationPolicy(max_rounds=3, hitl=HitlGate.PAUSE_ON_FINAL_ACCEPT, llm_weight=0.2)
    assert NegotiationPolicy.from_json(policy.to_json()) == policy
    with pytest.raises(ValidationError) as caught:
        NegotiationPolicy.from_json({"max_round": 3}, "profiles[0].policy")
    assert caught.value.details["field"] == "profiles[0].policy.max_round"
    with pytest.raises(ValidationError) as nested:
        NegotiationPolicy.from_json({"scoring": {"llm_weight": 2}}, "base")
    assert nested.value.details["field"] == "base.llm_weight"


@pytest.mark.conformance(
    "negotiation.policy.derive-effective", "patterns.policy.derive-effective",
)  # fmt: skip
def test_preferences_are_clamped_to_the_guardrails_and_only_tighten_the_policy() -> None:
    base = NegotiationPolicy(max_rounds=6, score_threshold=0.8, round_timeout_ms=60_000,
                             token_budget_per_round=0, total_token_budget=0)  # fmt: skip
    prefs = {
        # asks for more rounds (ignored: preferences only tighten) and a lower threshold
        "frontend": AgentPreferences(max_rounds=40, score_threshold=0.6, round_timeout_ms=500),
        # asks for a threshold beyond the guardrails and fewer rounds
        "graphql": AgentPreferences(max_rounds=4, score_threshold=1.0, total_token_budget=900),
    }
    rails = Guardrails(score_threshold=Bounds(0.5, 0.95))
    effective = derive_effective(base, prefs, rails)
    policy = effective.policy
    assert policy.max_rounds == 4
    assert policy.score_threshold == 0.95
    assert policy.round_timeout_ms == 1_000  # 500 clamped up to the guardrail's 1 s
    assert policy.total_token_budget == 900  # 0 was "no budget"
    assert policy.token_budget_per_round == 0
    assert effective.applied["frontend"] == AgentPreferences(
        max_rounds=40, score_threshold=0.6, round_timeout_ms=1_000
    )
    assert effective.applied["graphql"].score_threshold == 0.95
    assert EffectivePolicy.from_json(effective.to_json()) == effective


def test_without_preferences_the_policy_is_the_effective_one() -> None:
    assert derive_effective(BASE, {}, RAILS) == EffectivePolicy(BASE, {})


def test_preferences_and_guardrails_name_bad_fields() -> None:
    with pytest.raises(ValidationError) as caught:
        AgentPreferences.from_json({"score_threshold": 3}, "preferences.frontend")
    assert caught.value.details["field"] == "preferences.frontend.score_threshold"
    with pytest.raises(ValidationError) as unknown:
        AgentPreferences.from_json({"hitl": "None"}, "preferences.frontend")
    assert unknown.value.details["field"] == "preferences.frontend.hitl"
    assert RAILS.violation(NegotiationPolicy(max_rounds=51)) == (
        "policy.max_rounds: 51 is outside the guardrails [1, 50]"
    )
    assert RAILS.violation(NegotiationPolicy(total_token_budget=0)) == ""


def test_the_debate_timeout_defaults_to_every_round_and_respects_the_guardrail() -> None:
    policy = NegotiationPolicy(max_rounds=4, round_timeout_ms=30_000)
    assert debate_timeout_s(policy, 0, RAILS) == 120.0
    assert debate_timeout_s(policy, 45.5, RAILS) == 45.5
    with pytest.raises(ValidationError) as caught:
        debate_timeout_s(policy, 100_000, RAILS)
    assert caught.value.details["field"] == "debate_timeout"
