"""The negotiation round machine (RFC 17, 17.1-17.3): the table over every (state, input)
pair, opening, drafts, evaluations and unanimity, every stop rule, gates and HITL outcomes."""

from __future__ import annotations

import base64
import itertools
import json
from dataclasses import replace

import pytest

from apiary.core.machine import IllegalTransitionError
from apiary.core.negotiation.events import decode_event, encode
from apiary.core.negotiation.machine import OPEN_ROW, NegotiationMachine, mermaid
from apiary.core.negotiation.policy import EffectivePolicy, NegotiationPolicy
from apiary.core.negotiation.validation import Example, ValidationRules
from apiary.core.negotiation.vocabulary import (
    DeadlockRule,
    NegotiationEffect,
    NegotiationInput,
    NegotiationState,
)
from apiary.errors import (
    AlreadyExistsError,
    PermissionDeniedError,
    ValidationError,
)
from tests.unit.negotiation_fixtures import JSON, T0, doc, open_room

S = NegotiationState
I = NegotiationInput  # noqa: E741
F = NegotiationEffect

EXPECTED = {
    S.OPEN: {I.PROPOSE: S.DELIBERATING, I.DECIDE: S.DECIDED, I.ABORT: S.ABORTED},
    S.DELIBERATING: {
        I.PROPOSE: S.DELIBERATING, I.COUNTER: S.DELIBERATING, I.EVALUATE: S.DELIBERATING,
        I.ACCEPT: S.DECIDED, I.CONFIRM: S.AWAITING_HITL, I.CONTINUE: S.AWAITING_COUNTER,
        I.PAUSE: S.PAUSED, I.DEADLOCK: S.AWAITING_HITL, I.TIE_BREAK: S.DECIDED,
        I.DECIDE: S.DECIDED, I.ABORT: S.ABORTED,
    },
    S.AWAITING_COUNTER: {
        I.PROPOSE: S.DELIBERATING, I.COUNTER: S.DELIBERATING, I.DEADLOCK: S.AWAITING_HITL,
        I.TIE_BREAK: S.DECIDED, I.DECIDE: S.DECIDED, I.ABORT: S.ABORTED,
    },
    S.PAUSED: {
        I.RESUME: S.AWAITING_COUNTER, I.HITL_ACCEPT: S.DECIDED, I.DECIDE: S.DECIDED,
        I.ABORT: S.ABORTED,
    },
    S.AWAITING_HITL: {I.HITL_ACCEPT: S.DECIDED, I.DECIDE: S.DECIDED, I.ABORT: S.ABORTED},
    S.DECIDED: {},
    S.ABORTED: {},
}  # fmt: skip


@pytest.mark.parametrize(("state", "event"), list(itertools.product(S, I)))
def test_every_state_and_input_pair_follows_the_table(
    state: NegotiationState, event: NegotiationInput
) -> None:
    expected = EXPECTED[state].get(event)
    assert NegotiationMachine.allows(state, event) == (expected is not None)
    if expected is None:
        with pytest.raises(IllegalTransitionError) as caught:
            NegotiationMachine.row(state, event)
        assert (caught.value.state, caught.value.event) == (state, event)
        return
    row = NegotiationMachine.row(state, event)
    assert row.state is expected
    assert row.event_type.startswith("negotiation.")
    assert F.EMIT_EVENT in row.effects
    # What ends a negotiation persists it, stops its timers and tells the participants.
    if expected.terminal:
        assert {F.PERSIST, F.CANCEL_TIMERS, F.APPEND_ARTIFACTS, F.FANOUT} <= set(row.effects)
    if expected in (S.AWAITING_HITL, S.PAUSED):
        assert {F.ESCALATE, F.CANCEL_TIMERS} <= set(row.effects)
    if event in (I.PROPOSE, I.COUNTER):
        assert {F.SAVE_ROUND, F.ARM_TIMERS, F.FANOUT, F.APPEND_ARTIFACTS} <= set(row.effects)


def test_the_diagram_shows_every_row() -> None:
    text = mermaid()
    for state, row in NegotiationMachine.TABLE.items():
        for event, found in row.items():
            assert f"{state} --> {found.state}: {event}" in text
    assert f"[*] --> {OPEN_ROW.state}: OPEN" in text
    assert text.count("--> [*]") == 2


@pytest.mark.conformance(
    "negotiation.mediated.negotiation-id", "negotiation.mediated.correlation-equals-id",
    "negotiation.open.required-fields", "negotiation.policy.broadcast",
    "negotiation.policy.include-in-broadcast", "patterns.policy.broadcast",
    "patterns.policy.include-in-broadcast",
)  # fmt: skip
def test_opening_broadcasts_open_and_the_effective_policy() -> None:
    room = open_room(policy=NegotiationPolicy(max_rounds=3))
    (opened,) = room.steps
    assert room.state == "OPEN"
    assert room.record.correlation_id == "neg-1"
    assert room.record.deadline == T0 + 600
    assert room.record.round_deadline == T0 + 60
    assert opened.effects == OPEN_ROW.effects
    open_event, policy_event = opened.fanout
    assert (open_event["kind"], open_event["topic"], open_event["corr"]) == (
        "open", "/api/v3/orders", "neg-1",
    )  # fmt: skip
    assert policy_event["kind"] == "policy"
    assert policy_event["negotiation_id"] == "neg-1"
    assert policy_event["policy"]["max_rounds"] == 3
    assert policy_event["profile"] == "HIGH"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"topic": ""}, "topic"),
        ({"participants": ["frontend"]}, "participants"),
        ({"participants": ["frontend", "frontend"]}, "participants"),
        ({"participants": "frontend,graphql"}, "participants"),
        ({"intensity": "EXTREME"}, "intensity"),
        ({"intensity": 0}, "intensity"),
        ({"negotiation_id": " "}, "negotiation_id"),
        ({"correlation_id": "other"}, "correlation_id"),
    ],
)
def test_a_bad_open_names_the_field(changes: dict[str, object], field: str) -> None:
    values: dict[str, object] = {
        "negotiation_id": "neg-1", "topic": "t", "participants": ["a", "b"],
        "intensity": "LOW", "effective": EffectivePolicy(NegotiationPolicy()),
        "debate_timeout_s": 60.0, "now": T0, **changes,
    }  # fmt: skip
    with pytest.raises(ValidationError) as caught:
        NegotiationMachine.open(**values)  # type: ignore[arg-type]
    assert caught.value.details["field"] == field


@pytest.mark.conformance(
    "negotiation.messages.kinds", "negotiation.events.preserve-payload",
    "patterns.events.preserve-payload", "negotiation.reports.contract-diff-artifacts",
    "patterns.reports.contract-diff-artifacts", "negotiation.diff.delta-summary",
    "patterns.diff.delta-summary",
)  # fmt: skip
def test_drafts_take_rounds_with_artifacts_and_a_delta() -> None:
    room = open_room()
    first = doc(path="/orders", fields=["id", "total"])
    step = room.draft("frontend", first)
    assert room.state == "DELIBERATING"
    assert room.record.round == 1
    assert [a.name for a in step.artifacts] == ["contract_v1.json"]
    assert step.artifacts[0].content == first
    (fan,) = step.fanout
    event = decode_event(encode(fan))
    assert (event.kind, event.sender, event.content_type) == ("propose", "frontend", JSON)
    assert event.payload() == first
    second = doc(path="/orders", fields=["id", "total", "currency"])
    step = room.draft("graphql", second, counter=True)
    assert room.record.round == 2
    assert [a.name for a in step.artifacts] == ["contract_v2.json", "diff_v1_to_v2.json"]
    diff = json.loads(step.artifacts[1].content)
    assert (diff["from"], diff["to"], diff["changed_paths"]) == ("v1", "v2", ["/fields/2"])
    assert 0 < diff["magnitude"] < 1
    assert step.round is not None
    assert step.round.delta["changed_paths"] == ["/fields/2"]
    assert step.fanout[0]["kind"] == "counter"
    assert room.events() == ["negotiation.opened", "negotiation.proposed", "negotiation.countered"]


@pytest.mark.conformance(
    "negotiation.validation.early", "negotiation.validation.invalid-no-round",
    "patterns.validation.early", "patterns.validation.invalid-no-round",
)  # fmt: skip
def test_invalid_drafts_are_refused_without_consuming_a_round() -> None:
    schema = {"type": "object", "required": ["path"], "properties": {"path": {"type": "string"}}}
    example = Example("a GET", {"method": "GET"})
    room = open_room(validation=ValidationRules(schema, (example,)),
                     policy=NegotiationPolicy(require_examples_pass=True))  # fmt: skip
    before = room.record
    for payload, why in (
        (b"{not json", "not valid JSON"),
        (doc(verb="GET"), "schema"),
        (doc(path=7), "schema"),
        (doc(path="/orders", type="object", properties={"method": {"enum": ["POST"]}}),
         "examples failed"),
    ):  # fmt: skip
        step = room.draft("frontend", payload, refused=True)
        assert step.refusal is not None and step.refusal.details["field"] == "payload"
        assert why in step.refusal.message
        assert step.effects == (F.EMIT_EVENT,)
        assert step.event[0] == "negotiation.draft_refused"
        assert room.record == before  # nothing changed: no round, no tokens, no timer
    accepted = doc(path="/orders", type="object", properties={"method": {"enum": ["GET"]}})
    assert room.draft("frontend", accepted).refusal is None
    assert room.record.round == 1


def test_failed_checks_that_are_not_required_only_lower_the_score() -> None:
    rules = ValidationRules({"type": "object", "required": ["path"]})
    room = open_room(validation=rules, policy=NegotiationPolicy(require_schema_valid=False))
    step = room.draft("frontend", doc(verb="GET"))
    assert step.refusal is None
    assert step.round is not None
    assert step.round.checks["schema_valid"] is False
    assert step.round.checks["check_score"] == 0.0
    room.vote("graphql", 0.9)
    assert room.rounds[-1].evaluations["graphql"]["deterministic_score"] == 0.0


def test_a_counter_beyond_the_diff_tolerance_and_an_oversized_draft_are_refused() -> None:
    room = open_room(policy=NegotiationPolicy(diff_tolerance=0.3, token_budget_per_round=10))
    room.draft("frontend", doc(a=1, b=2, c=3))
    step = room.draft("graphql", doc(x=1), counter=True, refused=True)
    assert step.refusal is not None and "diff_tolerance 0.3" in step.refusal.message
    # A new proposal is a fresh alternative: the tolerance bounds counters only.
    assert room.draft("graphql", doc(x=1)).refusal is None
    big = room.draft("frontend", doc(text="x" * 100), refused=True)
    assert big.refusal is not None and "per-round token budget of 10" in big.refusal.message
    assert room.record.round == 2


@pytest.mark.conformance(
    "negotiation.protocol.two-party-unanimity", "negotiation.scoring.follow-effective-policy",
    "patterns.scoring.follow-effective-policy", "negotiation.reports.evaluation-decision",
    "patterns.reports.evaluation-decision",
)  # fmt: skip
def test_two_party_unanimity_accepts_when_the_other_party_meets_the_threshold() -> None:
    room = open_room(policy=NegotiationPolicy(score_threshold=0.8))
    draft = doc(path="/orders")
    room.draft("frontend", draft)
    vote = room.vote("graphql", 0.85, "fine by me")
    assert [a.name for a in vote.artifacts] == ["score_v1.graphql.json"]
    assert room.state == "DECIDED"
    decision = room.record.decision
    assert (decision["decided_by"], decision["stop_reason"], decision["final_score"]) == (
        "consensus", "threshold_met", 0.85,
    )  # fmt: skip
    assert base64.b64decode(decision["result_b64"]) == draft
    final = room.steps[-1]
    assert [a.name for a in final.artifacts] == ["decision_final.json"]
    report = json.loads(final.artifacts[0].content)
    assert set(report) >= {"decided_by", "final_score", "rationale", "stop_reason"}
    (fan,) = final.fanout
    assert fan["kind"] == "decide" and base64.b64decode(fan["result_b64"]) == draft


def test_unanimity_waits_for_every_other_participant_and_takes_the_lowest_score() -> None:
    room = open_room(("a", "b", "c"), policy=NegotiationPolicy(score_threshold=0.8))
    room.draft("a", doc(v=1))
    room.vote("b", 0.95)
    assert room.state == "DELIBERATING"
    assert room.rounds[-1].score is None
    room.vote("c", 0.7)
    assert room.rounds[-1].score == 0.7
    assert room.state == "AWAITING_COUNTER"


@pytest.mark.parametrize(
    ("score", "field", "error"),
    [(1.5, "confidence_score", ValidationError), (-0.1, "confidence_score", ValidationError)],
)
def test_a_score_outside_zero_to_one_names_the_field(
    score: float, field: str, error: type[Exception]
) -> None:
    room = open_room()
    room.draft("frontend", doc(v=1))
    with pytest.raises(error) as caught:
        room.vote("graphql", score)
    assert caught.value.details["field"] == field  # type: ignore[attr-defined]


def test_who_may_evaluate() -> None:
    room = open_room()
    room.draft("frontend", doc(v=1))
    with pytest.raises(ValidationError, match="frontend wrote v1"):
        room.vote("frontend", 0.9)
    with pytest.raises(PermissionDeniedError, match="not a participant"):
        room.vote("mallory", 0.9)
    room.rule = DeadlockRule.ESCALATE
    room.record = replace(room.record, participants=("frontend", "graphql", "rest"))
    room.vote("graphql", 0.9)
    with pytest.raises(AlreadyExistsError):
        room.vote("graphql", 0.9)
    with pytest.raises(PermissionDeniedError):
        room.draft("mallory", doc(v=2))


@pytest.mark.conformance(
    "negotiation.scoring.deterministic-first", "patterns.scoring.deterministic-first"
)
def test_inference_confidence_is_blended_by_llm_weight() -> None:
    room = open_room(policy=NegotiationPolicy(llm_weight=0.25, score_threshold=0.8))
    room.draft("frontend", doc(v=1))
    room.rounds[-1] = replace(room.rounds[-1], llm_confidence=0.4)  # the engine's consult
    room.vote("graphql", 1.0)
    report = room.rounds[-1].evaluations["graphql"]
    assert (report["deterministic_score"], report["llm_confidence"]) == (1.0, 0.4)
    assert report["score"] == pytest.approx(0.75 * 1.0 + 0.25 * 0.4)
    assert room.state == "DECIDED"


def test_an_evaluators_own_llm_confidence_wins_and_weight_zero_ignores_it() -> None:
    room = open_room(("a", "b", "c"), policy=NegotiationPolicy(llm_weight=0.5))
    room.draft("a", doc(v=1))
    room.rounds[-1] = replace(room.rounds[-1], llm_confidence=0.9)
    room.vote("b", 0.8, llm_confidence=0.2, score_field="report.deterministic_score")
    assert room.rounds[-1].evaluations["b"]["score"] == pytest.approx(0.5)
    plain = open_room(policy=NegotiationPolicy(llm_weight=0.0, score_threshold=0.8))
    plain.draft("frontend", doc(v=1))
    plain.vote("graphql", 0.8, llm_confidence=0.0)
    assert plain.rounds[-1].evaluations["graphql"]["score"] == 0.8
    assert plain.state == "DECIDED"
