"""The negotiation-room policy (RFC 17.5 "Policy-Based Auto-Approval"): defaults, each
threshold at its boundary, mandatory escalation, escalation requests, policy versions."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from apiary.core.rooms.policy import (
    ESCALATE_CONFIDENCE_BELOW,
    ESCALATE_STD_DEV_ABOVE,
    RoomPolicy,
    Shortfall,
    Trigger,
    evaluate,
    requests_escalation,
)
from apiary.core.rooms.records import DecisionOutcome, VoteRecord
from apiary.errors import ValidationError

DEFAULT = RoomPolicy()


def votes(
    *specs: tuple[float, float, bool], recommendations: tuple[str, ...] = ()
) -> list[VoteRecord]:
    return [
        VoteRecord("a-1", f"c{i}", score, confidence, passed,
                   recommendations=recommendations if i == 0 else ())
        for i, (score, confidence, passed) in enumerate(specs)
    ]  # fmt: skip


@pytest.mark.conformance(
    "room.threshold.min-score-default-7", "room.threshold.min-confidence-default-0-7",
    "room.threshold.min-pass-ratio-default-0-8", "room.threshold.max-std-dev-default-2",
)  # fmt: skip
def test_the_recommended_defaults() -> None:
    assert (
        DEFAULT.min_score_threshold,
        DEFAULT.min_confidence_threshold,
        DEFAULT.min_pass_ratio,
        DEFAULT.max_std_dev,
    ) == (7.0, 0.7, 0.8, 2.0)
    assert (ESCALATE_CONFIDENCE_BELOW, ESCALATE_STD_DEV_ABOVE) == (0.3, 3.0)


@pytest.mark.conformance(
    "room.auto-approval.all-conditions", "patterns.room.auto-approval.all-conditions"
)
def test_the_appendix_c10_votes_are_approved() -> None:
    verdict = evaluate(votes((8, 0.9, True), (6, 0.7, True)), DEFAULT)
    assert verdict.outcome is DecisionOutcome.APPROVED
    assert verdict.aggregated.weighted_mean == pytest.approx(7.125)
    assert verdict.aggregated.std_dev == 1.0
    assert (verdict.average_confidence, verdict.pass_ratio) == (pytest.approx(0.8), 1.0)
    assert verdict.triggers == ()
    assert verdict.reason.startswith("approved: weighted_mean 7.12 >= 7")


# Each row meets every threshold but one, which it misses by a hair (or meets exactly).
BOUNDARIES = [
    # weighted_mean is the statistic min_score_threshold applies to, not the plain mean:
    # mean 7.2 >= 7 but weighted 6.99 < 7.
    (Shortfall.SCORE, [(8.4, 0.7, True), (6.0, 1.0, True)]),
    (Shortfall.CONFIDENCE, [(8, 0.69, True), (8, 0.7, True)]),
    (Shortfall.PASS_RATIO, [(8, 0.9, True)] * 3 + [(8, 0.9, False)] * 2),
    (Shortfall.STD_DEV, [(9.5, 0.9, True), (5.3, 0.9, True)]),
]


@pytest.mark.parametrize(("missed", "specs"), BOUNDARIES, ids=[b[0].value for b in BOUNDARIES])
@pytest.mark.conformance(
    "room.auto-approval.all-conditions", "patterns.room.auto-approval.all-conditions"
)
def test_one_missed_threshold_asks_for_revision(
    missed: Shortfall, specs: list[tuple[float, float, bool]]
) -> None:
    verdict = evaluate(votes(*specs), DEFAULT)
    assert verdict.outcome is DecisionOutcome.REVISION_REQUESTED
    assert verdict.triggers == (missed.value,)
    assert f"not {'<=' if missed is Shortfall.STD_DEV else '>='}" in verdict.reason


def test_every_threshold_holds_at_its_exact_value() -> None:
    exact = RoomPolicy(min_score_threshold=8, min_confidence_threshold=0.5, min_pass_ratio=0.5,
                       max_std_dev=1.0)  # fmt: skip
    verdict = evaluate(votes((9, 0.5, True), (7, 0.5, False)), exact)
    assert (verdict.aggregated.weighted_mean, verdict.average_confidence) == (8, 0.5)
    assert (verdict.pass_ratio, verdict.aggregated.std_dev) == (0.5, 1.0)
    assert verdict.outcome is DecisionOutcome.APPROVED


def test_every_missed_threshold_is_named() -> None:
    verdict = evaluate(votes((2, 0.4, False), (7.5, 0.4, True)), DEFAULT)
    assert verdict.outcome is DecisionOutcome.REVISION_REQUESTED
    assert verdict.triggers == tuple(s.value for s in Shortfall)
    for part in ("weighted_mean 4.75 not >= 7", "average confidence 0.40 not >= 0.7",
                 "pass ratio 0.50 not >= 0.8", "std_dev 2.75 not <= 2"):  # fmt: skip
        assert part in verdict.reason


@pytest.mark.conformance(
    "room.threshold.min-score", "room.threshold.min-confidence", "room.threshold.min-pass-ratio",
    "room.threshold.max-std-dev", "room.auto-approval.configurable",
    "patterns.room.auto-approval.configurable",
)  # fmt: skip
@pytest.mark.parametrize(
    ("setting", "value", "specs"),
    [
        ("min_score_threshold", 6.0, [(6.5, 0.9, True), (6.5, 0.9, True)]),
        ("min_confidence_threshold", 0.4, [(8, 0.45, True), (8, 0.45, True)]),
        ("min_pass_ratio", 0.5, [(8, 0.9, True), (8, 0.9, False)]),
        ("max_std_dev", 2.5, [(9.5, 0.9, True), (5, 0.9, True)]),
    ],
)
def test_each_threshold_is_configurable(
    setting: str, value: float, specs: list[tuple[float, float, bool]]
) -> None:
    assert evaluate(votes(*specs), DEFAULT).outcome is DecisionOutcome.REVISION_REQUESTED
    configured = RoomPolicy.from_settings({setting: value})
    assert getattr(configured, setting) == value
    assert evaluate(votes(*specs), configured).outcome is DecisionOutcome.APPROVED


@pytest.mark.conformance("room.escalate.low-confidence", "patterns.room.escalate.low-confidence")
def test_a_vote_below_0_3_confidence_escalates_whatever_the_rest() -> None:
    unsure = evaluate(votes((9, 0.95, True), (9, 0.95, True), (9, 0.29, True)), DEFAULT)
    assert unsure.outcome is DecisionOutcome.ESCALATED_TO_HITL
    assert unsure.triggers == (Trigger.LOW_CONFIDENCE.value,)
    assert "c2 0.29" in unsure.reason
    sure = evaluate(votes((9, 0.95, True), (9, 0.95, True), (9, 0.3, True)), DEFAULT)
    assert sure.outcome is DecisionOutcome.APPROVED


@pytest.mark.conformance("room.escalate.std-dev-over-3", "patterns.room.escalate.std-dev-over-3")
def test_a_std_dev_over_3_escalates_even_when_the_policy_allows_more() -> None:
    loose = RoomPolicy(max_std_dev=5.0, min_score_threshold=0.0, min_pass_ratio=0.0)
    apart = votes((10, 0.9, True), (3.9, 0.9, True))  # std_dev 3.05
    verdict = evaluate(apart, loose)
    assert verdict.outcome is DecisionOutcome.ESCALATED_TO_HITL
    assert verdict.triggers == (Trigger.EXTREME_DISAGREEMENT.value,)
    at_limit = votes((10, 0.9, True), (4, 0.9, True))  # exactly 3.0: not "over 3"
    assert evaluate(at_limit, loose).outcome is DecisionOutcome.APPROVED


@pytest.mark.conformance("room.escalate.critic-request", "patterns.room.escalate.critic-request")
def test_a_critic_asking_for_escalation_escalates_an_approvable_artifact() -> None:
    good = votes((9, 0.95, True), (9, 0.95, True), recommendations=("ESCALATE_TO_HITL: licence",))
    verdict = evaluate(good, DEFAULT)
    assert verdict.outcome is DecisionOutcome.ESCALATED_TO_HITL
    assert verdict.triggers == (Trigger.CRITIC_REQUEST.value,)
    assert "escalation requested by c0" in verdict.reason


def test_all_escalation_conditions_are_reported_together() -> None:
    verdict = evaluate(
        votes((10, 0.1, True), (2, 0.9, False), recommendations=("escalate",)), DEFAULT
    )
    assert verdict.triggers == ("low_confidence", "extreme_disagreement", "critic_request")


@pytest.mark.parametrize(
    ("text", "asks"),
    [
        ("ESCALATE", True),
        ("escalate", True),
        ("  Escalate to HITL: licence unclear", True),
        ("escalate-to-human", True),
        ("ESCALATE_TO_HITL:", True),
        ("Escalate the log level to DEBUG", False),
        ("Please escalate", False),
        ("add tests; escalate later", False),
        ("", False),
    ],
)
def test_what_counts_as_an_escalation_request(text: str, asks: bool) -> None:
    assert requests_escalation(text) is asks


@pytest.mark.conformance("room.policy.versioning", "room.decision.policy-version")
def test_policy_versions_name_settings() -> None:
    assert DEFAULT.policy_version.startswith("auto-")
    assert RoomPolicy().policy_version == DEFAULT.policy_version
    # Integers and floats of the same value are the same settings, hence the same version.
    assert RoomPolicy.from_settings({"vote_timeout_s": 300}).policy_version == (
        DEFAULT.policy_version
    )
    stricter = RoomPolicy(min_score_threshold=8.0)
    assert stricter.policy_version != DEFAULT.policy_version
    assert RoomPolicy(version="2026-01").policy_version == "2026-01"
    # A stored version gives back exactly its policy (audit, rollback).
    record = stricter.record(1.0)
    assert record.version == stricter.policy_version
    assert RoomPolicy.from_record(record) == replace(stricter, version=stricter.policy_version)
    assert RoomPolicy.from_record(record).settings() == stricter.settings()


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"min_score_threshold": 10.5}, "rooms.min_score_threshold"),
        ({"min_score_threshold": "7"}, "rooms.min_score_threshold"),
        ({"min_confidence_threshold": -0.1}, "rooms.min_confidence_threshold"),
        ({"min_pass_ratio": 1.01}, "rooms.min_pass_ratio"),
        ({"max_std_dev": float("nan")}, "rooms.max_std_dev"),
        ({"vote_timeout_s": 0}, "rooms.vote_timeout_s"),
        ({"vote_timeout_s": float("inf")}, "rooms.vote_timeout_s"),
        ({"hitl_timeout_s": -1}, "rooms.hitl_timeout_s"),
        ({"hitl_approver_roles": "admin"}, "rooms.hitl_approver_roles"),
        ({"version": " v1"}, "rooms.version"),
        ({"min_score": 7}, "rooms.min_score"),
        ({"min_pass_ratio": True}, "rooms.min_pass_ratio"),
    ],
)
def test_bad_settings_name_the_setting(values: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        RoomPolicy.from_settings(values)
    assert caught.value.details["field"] == field
