"""Deterministic checks (JSON Schema, executable examples) and scoring (RFC 17.3)."""

from __future__ import annotations

import pytest

from apiary.core.negotiation.policy import NegotiationPolicy
from apiary.core.negotiation.records import RoundRecord
from apiary.core.negotiation.scoring import (
    best_candidate,
    blend,
    estimate_tokens,
    reverses,
    unanimity_score,
)
from apiary.core.negotiation.validation import ValidationRules, check_draft, refusal
from apiary.errors import ValidationError

CONTRACT = b'{"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}'


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"schema": {"type": "nonsense"}}, "schema"),
        ({"schema": "object"}, "schema"),
        ({"examples": [{"name": "no instance"}]}, "examples[0]"),
        ({"examples": {"a": 1}}, "examples"),
        ({"schemas": {}}, "validation.schemas"),
    ],
)
def test_bad_validation_rules_name_the_field(doc: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ValidationRules.from_json(doc)
    assert caught.value.details["field"] == field


def test_examples_run_against_a_draft_that_is_a_json_schema() -> None:
    rules = ValidationRules.from_json({
        "examples": [{"name": "an order", "instance": {"id": 7}},
                     {"name": "no id", "instance": {}, "valid": False}],
    })  # fmt: skip
    good = check_draft(rules, "application/json", CONTRACT)
    assert (good.examples_passed, good.examples_total, good.score) == (2, 2, 1.0)
    loose = check_draft(rules, "application/json", b'{"type": "object"}')
    assert (loose.examples_passed, loose.score) == (1, 0.5)
    assert loose.errors == ("example 'no id': the draft should refuse it",)
    broken = check_draft(rules, "application/json", b'{"type": 12}')
    assert broken.examples_passed == 0 and "not a JSON Schema" in broken.errors[0]
    strict = NegotiationPolicy(require_examples_pass=True)
    assert refusal(loose, strict).startswith("1 of 2 examples failed")
    assert refusal(loose, NegotiationPolicy()) == ""


def test_schema_checks_report_where_the_draft_fails() -> None:
    rules = ValidationRules.from_json({"schema": {"type": "object", "required": ["id"]}})
    failed = check_draft(rules, "application/json", b'{"name": 1}')
    assert failed.schema_valid is False
    assert failed.errors == ("/: 'id' is a required property",)
    assert refusal(failed, NegotiationPolicy()).startswith("the draft does not satisfy")
    text = check_draft(rules, "text/plain", b"id=1")
    assert (text.is_json, text.parse_error, text.schema_valid) == (False, False, False)
    plain = check_draft(ValidationRules(), "text/plain", b"anything")
    assert (plain.score, plain.errors) == (1.0, ())
    assert check_draft(ValidationRules(), "", b"{").parse_error


def _round(n: int, score: float | None, evaluations: dict[str, float] | None = None) -> RoundRecord:
    votes = {a: {"score": s} for a, s in (evaluations or {}).items()}
    return RoundRecord("n", n, "propose", "a", "application/json", b"{}", 0.0,
                       evaluations=votes, score=score)  # fmt: skip


def test_scoring_helpers() -> None:
    assert blend(0.8, None, 0.5) == 0.8
    assert blend(0.8, 0.2, 0.0) == 0.8
    assert blend(0.8, 0.2, 0.5) == 0.5
    assert unanimity_score({"b": {"score": 0.9}}, ["b", "c"]) is None
    assert unanimity_score({"b": {"score": 0.9}, "c": {"score": 0.6}}, ["b", "c"]) == 0.6
    assert reverses([0.5, 0.7, 0.4]) and reverses([0.7, 0.5, 0.6])
    assert not reverses([0.5, 0.6, 0.7]) and not reverses([0.5, 0.5, 0.4])
    assert estimate_tokens(0) == 0 and estimate_tokens(1) == 1 and estimate_tokens(9) == 3
    rounds = [_round(1, 0.7), _round(2, None, {"b": 0.7}), _round(3, 0.6), _round(4, None)]
    assert best_candidate(rounds) is rounds[1]  # tie: the later draft
    assert best_candidate([_round(1, None)]) is None
