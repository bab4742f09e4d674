"""Stop rules, deadlock handling, timeouts, HITL gates and HITL outcomes of the negotiation
machine (RFC 17, 17.2, 17.3, 15.4)."""

from __future__ import annotations

import base64

import pytest

from apiary.core.machine import IllegalTransitionError
from apiary.core.negotiation.hitl import escalation_for, pick_draft, translate_action
from apiary.core.negotiation.machine import NegotiationMachine
from apiary.core.negotiation.policy import HitlGate, NegotiationPolicy
from apiary.core.negotiation.vocabulary import DeadlockRule, Draft
from apiary.errors import AlreadyCompletedError, ValidationError
from tests.unit.negotiation_fixtures import T0, Room, doc, open_room

LOW = 0.3


def _below(room: Room, agent: str, other: str, payload: bytes, counter: bool = True) -> None:
    room.draft(agent, payload, counter=counter)
    room.vote(other, LOW)


@pytest.mark.conformance("negotiation.deadlock.handle")
def test_max_rounds_stops_and_escalates_with_debate_deadlock() -> None:
    room = open_room(policy=NegotiationPolicy(max_rounds=2, oscillation_limit=5))
    _below(room, "frontend", "graphql", doc(v=1), counter=False)
    assert room.state == "AWAITING_COUNTER"
    room.draft("graphql", doc(v=2), counter=True)
    room.vote("frontend", 0.6)
    assert room.state == "AWAITING_HITL"
    assert room.record.stop_reason == "max_rounds"
    step = room.steps[-1]
    assert step.event[0] == "negotiation.deadlocked"
    assert step.escalation is not None
    assert step.escalation.reason_type == "DEBATE_DEADLOCK"
    context = step.escalation.context
    assert context["suggested_version"] == "v2" and context["score"] == 0.6
    assert [c["version"] for c in context["candidates"]] == ["v1", "v2"]
    # No third draft while HITL decides.
    with pytest.raises(IllegalTransitionError):
        NegotiationMachine.submit(
            room.record, room.rounds, Draft("frontend", "application/json", doc(v=3), True),
            now=T0 + 99,
        )  # fmt: skip


def test_the_tie_break_rule_accepts_the_best_draft_instead() -> None:
    room = open_room(policy=NegotiationPolicy(max_rounds=2), rule=DeadlockRule.TIE_BREAK)
    room.draft("frontend", doc(v=1))
    room.vote("graphql", 0.7)
    room.draft("graphql", doc(v=2), counter=True)
    room.vote("frontend", 0.7)
    assert room.state == "DECIDED"
    decision = room.record.decision
    assert (decision["decided_by"], decision["stop_reason"], decision["version"]) == (
        "policy", "max_rounds", "v2",  # equal scores: the later draft
    )  # fmt: skip
    assert base64.b64decode(decision["result_b64"]) == doc(v=2)


@pytest.mark.parametrize("rule", list(DeadlockRule))
def test_a_stop_with_nothing_to_choose_aborts(rule: DeadlockRule) -> None:
    room = open_room(rule=rule)
    step = NegotiationMachine.timeout(room.record, [], now=T0 + 61, rule=rule)
    room.apply(step)
    assert room.state == "ABORTED"
    assert room.record.decision["stop_reason"] == "timeout"
    assert step is not None and step.fanout[0]["kind"] == "abort"


def test_score_reversals_beyond_the_oscillation_limit_stop_the_debate() -> None:
    room = open_room(policy=NegotiationPolicy(max_rounds=9, oscillation_limit=0))
    room.draft("frontend", doc(v=1))
    room.vote("graphql", 0.5)
    room.draft("graphql", doc(v=2), counter=True)
    room.vote("frontend", 0.7)
    assert room.state == "AWAITING_COUNTER"
    room.draft("frontend", doc(v=3), counter=True)
    room.vote("graphql", 0.4)  # up, then down: one reversal
    assert room.record.oscillations == 1
    assert (room.state, room.record.stop_reason) == ("AWAITING_HITL", "oscillation")


def test_returning_to_an_earlier_draft_counts_as_an_oscillation() -> None:
    room = open_room(policy=NegotiationPolicy(max_rounds=9, oscillation_limit=0))
    room.draft("frontend", doc(v="A"))
    room.draft("graphql", doc(v="B"), counter=True)
    assert room.record.oscillations == 0
    room.draft("frontend", doc(v="A"), counter=True)  # A, B, A
    assert room.record.oscillations == 1
    assert (room.state, room.record.stop_reason) == ("AWAITING_HITL", "oscillation")


def test_the_total_token_budget_stops_instead_of_admitting_the_draft() -> None:
    room = open_room(policy=NegotiationPolicy(total_token_budget=10, token_budget_per_round=0))
    room.draft("frontend", doc(v=1))  # 2 tokens
    room.vote("graphql", LOW)
    step = room.draft("graphql", doc(text="x" * 60), counter=True, refused=True)
    assert step.refusal is not None and "total token budget of 10" in step.refusal.message
    assert (room.state, room.record.stop_reason, room.record.round) == (
        "AWAITING_HITL", "budget", 1,
    )  # fmt: skip


def test_a_spent_total_budget_stops_when_the_round_closes() -> None:
    room = open_room(policy=NegotiationPolicy(total_token_budget=5, token_budget_per_round=0))
    room.draft("frontend", doc(v=1))
    room.vote("graphql", LOW, notes="too expensive to continue")  # notes spend tokens too
    assert (room.state, room.record.stop_reason) == ("AWAITING_HITL", "budget")


@pytest.mark.conformance("negotiation.timeout.enforce")
def test_round_and_debate_timeouts_stop_and_stale_timers_change_nothing() -> None:
    room = open_room(policy=NegotiationPolicy(round_timeout_ms=10_000), debate_timeout_s=100)
    room.draft("frontend", doc(v=1))
    deadline = room.record.round_deadline
    assert deadline == room.now + 10
    assert NegotiationMachine.timeout(room.record, room.rounds, now=deadline - 0.001) is None
    step = NegotiationMachine.timeout(room.record, room.rounds, now=deadline)
    assert step is not None
    assert (step.record.state, step.record.stop_reason) == ("AWAITING_HITL", "timeout")
    assert step.event[1]["cause"] == "round_timeout"
    # The debate timeout applies even while rounds keep moving.
    debate = NegotiationMachine.timeout(room.record, room.rounds, now=T0 + 100)
    assert debate is not None and debate.event[1]["cause"] == "debate_timeout"
    waiting = step.record
    assert NegotiationMachine.timeout(waiting, room.rounds, now=T0 + 10_000) is None


def test_pause_between_rounds_waits_for_hitl_and_approve_goes_on() -> None:
    room = open_room(policy=NegotiationPolicy(hitl=HitlGate.PAUSE_BETWEEN_ROUNDS))
    room.draft("frontend", doc(v=1))
    room.vote("graphql", LOW)
    assert room.state == "PAUSED"
    step = room.steps[-1]
    assert step.escalation is not None
    assert (step.escalation.reason_type, step.escalation.gate) == ("MANUAL_OVERRIDE",
                                                                    "between_rounds")  # fmt: skip
    assert room.record.round_deadline == 0.0
    decision = {"action": "approve", "via": "operator", "decided_by": "olivia",
                "rationale": "go on"}  # fmt: skip
    room.apply(NegotiationMachine.hitl_decided(room.record, room.rounds, decision, now=T0 + 50))
    assert room.state == "AWAITING_COUNTER"
    assert room.record.round_deadline == T0 + 50 + 60
    assert room.steps[-1].event[0] == "negotiation.resumed"


def test_pause_on_final_accept_confirms_through_hitl() -> None:
    room = open_room(policy=NegotiationPolicy(hitl=HitlGate.PAUSE_ON_FINAL_ACCEPT))
    room.draft("frontend", doc(v=1))
    room.vote("graphql", 0.95)
    assert room.state == "AWAITING_HITL"
    assert room.steps[-1].event[0] == "negotiation.confirming"
    decision = {"action": "approve", "via": "operator", "decided_by": "olivia",
                "rationale": "ship it"}  # fmt: skip
    room.apply(NegotiationMachine.hitl_decided(room.record, room.rounds, decision, now=T0 + 9))
    assert room.state == "DECIDED"
    assert (room.record.decision["decided_by"], room.record.decision["stop_reason"]) == (
        "hitl", "threshold_met",
    )  # fmt: skip


def _deadlocked() -> Room:
    room = open_room(policy=NegotiationPolicy(max_rounds=2))
    room.draft("frontend", doc(v="A"))
    room.vote("graphql", 0.6)
    room.draft("graphql", doc(v="B"), counter=True)
    room.vote("frontend", 0.71)
    assert room.state == "AWAITING_HITL"
    return room


def test_a_hitl_modify_accepts_the_named_draft() -> None:
    room = _deadlocked()
    decision = {"action": "modify", "patch": {"accept": "frontend"}, "via": "operator",
                "decided_by": "olivia", "rationale": "A keeps the API stable"}  # fmt: skip
    room.apply(NegotiationMachine.hitl_decided(room.record, room.rounds, decision, now=T0 + 9,
                                               invocation_id="inv-1"))  # fmt: skip
    record = room.record
    assert (record.state, record.decision["version"], record.decision["decided_by"]) == (
        "DECIDED", "v1", "hitl",
    )  # fmt: skip
    assert record.decision["hitl"]["invocation_id"] == "inv-1"
    assert record.decision["stop_reason"] == "max_rounds"


@pytest.mark.conformance(
    "hitl.unavailable.deny-aborts", "hitl.unavailable.audit-fallback",
)  # fmt: skip
def test_a_fallback_deny_aborts_with_its_error_code_and_keeps_the_audit() -> None:
    room = _deadlocked()
    decision = {"action": "deny", "via": "unavailable", "fallback": True,
                "policy": "DENY_BY_DEFAULT", "applied": "DENY_BY_DEFAULT",
                "error_code": "hitl_unavailable", "decided_by": "apiary", "decided_at": T0 + 5,
                "rationale": "HITL unavailable"}  # fmt: skip
    step = NegotiationMachine.hitl_decided(room.record, room.rounds, decision, now=T0 + 9)
    room.apply(step)
    assert room.state == "ABORTED"
    assert room.record.decision["error_code"] == "hitl_unavailable"
    audit = room.record.decision["hitl"]
    assert (audit["fallback"], audit["policy"], audit["decided_at"]) == (
        True, "DENY_BY_DEFAULT", T0 + 5,
    )  # fmt: skip
    assert step.fanout[0] == {"kind": "abort", "ts": step.fanout[0]["ts"],
                              "reason": room.record.decision["reason"], "negotiation_id": "neg-1",
                              "error_code": "hitl_unavailable"}  # fmt: skip


def test_a_fallback_approve_accepts_the_best_draft_as_policy() -> None:
    room = _deadlocked()
    decision = {"action": "approve", "via": "unavailable", "fallback": True,
                "policy": "AUTO_DECIDE_THRESHOLD", "score": 0.71, "threshold": 0.7,
                "decided_by": "apiary", "rationale": "auto"}  # fmt: skip
    room.apply(NegotiationMachine.hitl_decided(room.record, room.rounds, decision, now=T0 + 9))
    assert (room.record.decision["decided_by"], room.record.decision["version"]) == ("policy", "v2")


def test_escalations_can_be_rebuilt_after_a_restart() -> None:
    room = _deadlocked()
    escalation = escalation_for(room.record, room.rounds)
    assert (escalation.reason_type, escalation.context["suggested_version"]) == (
        "DEBATE_DEADLOCK", "v2",
    )  # fmt: skip


def test_operators_name_drafts_by_version_or_agent() -> None:
    room = _deadlocked()
    assert pick_draft(room.rounds, "v1") is room.rounds[0]
    assert pick_draft(room.rounds, 2) is room.rounds[1]
    assert pick_draft(room.rounds, "graphql") is room.rounds[1]
    assert pick_draft(room.rounds, "v7") is None
    assert translate_action("decide=graphql", room.rounds) == ("modify", {"accept": "v2"})
    assert translate_action("accept:v1", room.rounds) == ("modify", {"accept": "v1"})
    assert translate_action("deny", room.rounds) == ("deny", None)
    with pytest.raises(ValidationError) as caught:
        translate_action("decide=v9", room.rounds)
    assert caught.value.details["field"] == "action"
    assert "v1 (frontend), v2 (graphql)" in caught.value.message
    with pytest.raises(ValidationError, match="decide=<version or agent>"):
        translate_action("frobnicate=v1", room.rounds)


def test_an_explicit_decide_and_abort_end_the_negotiation() -> None:
    room = open_room()
    room.draft("frontend", doc(v=1))
    with pytest.raises(ValidationError) as caught:
        NegotiationMachine.decide(room.record, room.rounds, by="scheduler", decided_by="vote",
                                  content_type="", result=b"", now=T0 + 5)  # fmt: skip
    assert caught.value.details["field"] == "decided_by"
    step = NegotiationMachine.decide(room.record, room.rounds, by="scheduler",
                                     decided_by="policy", content_type="", result=b"",
                                     now=T0 + 5)  # fmt: skip
    assert step.record.decision["version"] == "v1"
    assert base64.b64decode(step.record.decision["result_b64"]) == doc(v=1)
    ended = step.record
    with pytest.raises(AlreadyCompletedError):
        NegotiationMachine.abort(ended, by="frontend", reason="late", now=T0 + 6)
    with pytest.raises(ValidationError) as missing:
        NegotiationMachine.abort(room.record, by="frontend", reason=" ", now=T0 + 6)
    assert missing.value.details["field"] == "reason"
