"""The negotiation-room machine (RFC 17.5): the table over every (state, input) pair, each
transition's records and effects, and every refusal naming its field."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from apiary.core.hitl.vocabulary import HitlReason
from apiary.core.machine import IllegalTransitionError
from apiary.core.quorum import Quorum
from apiary.core.rooms import machine as negotiation_room
from apiary.core.rooms.machine import (
    OPEN_ROW,
    ROOM_SERVICE,
    RoomEffect,
    RoomInput,
    RoomMachine,
    RoomStep,
)
from apiary.core.rooms.policy import RoomPolicy
from apiary.core.rooms.records import ArtifactType, ProposalRecord, RoomState, VoteRecord
from apiary.core.rooms.validation import ProposalDraft, VoteDraft, check_proposal
from apiary.errors import (
    AlreadyCompletedError,
    AlreadyExistsError,
    ApiaryError,
    PermissionDeniedError,
    ValidationError,
)

T0 = 1_754_000_000.0
POLICY = RoomPolicy(vote_timeout_s=60.0)
F = RoomEffect


def draft(**fields: Any) -> ProposalDraft:
    values: dict[str, Any] = {
        "artifact_type": "PLAN",
        "artifact_id": "plan-1",
        "producer_id": "producer",
        "artifact": b'{"steps": ["migrate", "deploy"]}',
        "artifact_content_type": "application/json",
        "requested_critics": ["c1", "c2"],
        "negotiation_room_id": "room-1",
    }
    values.update(fields)
    return ProposalDraft(**values)


def opened(critics: tuple[str, ...] = ("c1", "c2"), **fields: Any) -> ProposalRecord:
    checked = check_proposal(draft(requested_critics=list(critics), **fields), caller="")
    return RoomMachine.open(checked, now=T0, policy=POLICY).proposal


def ballot(critic: str, score: float = 8.0, confidence: float = 0.9, **fields: Any) -> VoteDraft:
    return VoteDraft("plan-1", critic, score, confidence, fields.pop("passed", True), **fields)


def cast(proposal: ProposalRecord, votes: list[VoteRecord], vote: VoteDraft) -> RoomStep:
    return RoomMachine.vote(proposal, votes, vote, caller="", now=T0 + 5, policy=POLICY)


def first_vote(proposal: ProposalRecord) -> list[VoteRecord]:
    step = cast(proposal, [], ballot("c1"))
    assert step.vote is not None
    return [step.vote]


def escalated() -> ProposalRecord:
    proposal = opened()
    step = cast(proposal, first_vote(proposal), ballot("c2", confidence=0.1))
    return replace(step.proposal, invocation_id="hitl-1")


# How to reach each state, and how to apply each input to a record in any state.
INTO: dict[RoomState, Callable[[], ProposalRecord]] = {
    RoomState.OPEN: opened,
    RoomState.ESCALATED: escalated,
    RoomState.APPROVED: lambda: replace(opened(), state=RoomState.APPROVED.value),
    RoomState.REVISION_REQUESTED: lambda: replace(opened(), state="REVISION_REQUESTED"),
}
APPLY: dict[RoomInput, Callable[[ProposalRecord], RoomStep]] = {
    RoomInput.VOTE: lambda p: cast(replace(p, requested_critics=("c1", "c2", "c3")), [],
                                   ballot("c1")),
    RoomInput.APPROVE: lambda p: cast(p, first_vote(opened()), ballot("c2")),
    RoomInput.REVISE: lambda p: cast(p, first_vote(opened()), ballot("c2", score=4.0)),
    RoomInput.ESCALATE: lambda p: cast(p, first_vote(opened()), ballot("c2", confidence=0.2)),
    RoomInput.VOTE_TIMEOUT: lambda p: RoomMachine.deadline_passed(
        p, [], now=p.vote_deadline, policy=POLICY
    ),
    RoomInput.HUMAN_APPROVE: lambda p: RoomMachine.human_decision(
        p, [], {"action": "approve", "decided_by": "olivia", "via": "operator"}, now=T0 + 9
    ),
    RoomInput.HUMAN_REVISE: lambda p: RoomMachine.human_decision(
        p, [], {"action": "deny", "decided_by": "olivia", "via": "operator"}, now=T0 + 9
    ),
}  # fmt: skip
VOTE_INPUTS = {RoomInput.VOTE, RoomInput.APPROVE, RoomInput.REVISE, RoomInput.ESCALATE}


@pytest.mark.parametrize(("state", "event"), list(itertools.product(RoomState, RoomInput)))
def test_every_pair_applies_its_row_or_is_refused(state: RoomState, event: RoomInput) -> None:
    record = INTO[state]()
    assert record.state == state
    if RoomMachine.allows(state, event):
        step = APPLY[event](record)
        row = RoomMachine.row(state, event)
        assert step.proposal.state == row.state
        assert step.effects == row.effects
        assert step.events[-1][0] == row.event_type
        assert step.events[-1][1]["to_state"] == row.state
        return
    with pytest.raises(IllegalTransitionError):
        RoomMachine.row(state, event)
    before = replace(record)
    # A vote in a room that takes none is the peer's mistake, with its own error code.
    expected: type[Exception] = (
        AlreadyCompletedError if event in VOTE_INPUTS else IllegalTransitionError
    )
    with pytest.raises(expected):
        APPLY[event](record)
    assert record == before


def test_terminal_states_have_no_rows() -> None:
    for state in RoomState:
        assert (not RoomMachine.TABLE[state]) is state.terminal


@pytest.mark.conformance("room.artifact-types")
@pytest.mark.parametrize("kind", list(ArtifactType))
def test_every_artifact_type_is_accepted_by_name_and_number(kind: ArtifactType) -> None:
    number = list(ArtifactType).index(kind) + 1
    for given in (kind.value, kind.value.lower(), number):
        step = RoomMachine.open(check_proposal(draft(artifact_type=given), caller=""),
                                now=T0, policy=POLICY)  # fmt: skip
        assert step.proposal.artifact_type == kind.value


def test_opening_persists_arms_the_timer_and_notifies_the_critics() -> None:
    step = RoomMachine.open(check_proposal(draft(), caller=""), now=T0, policy=POLICY)
    assert step.effects == OPEN_ROW.effects
    assert step.effects == (F.PERSIST_PROPOSAL, F.START_TIMER, F.NOTIFY_CRITICS, F.EMIT_EVENT)
    proposal = step.proposal
    assert (proposal.state, proposal.created_at, proposal.vote_deadline) == ("OPEN", T0, T0 + 60)
    assert proposal.policy_version == POLICY.policy_version
    ((event_type, details),) = step.events
    assert event_type == "room.proposed"
    assert details["requested_critics"] == ["c1", "c2"]
    assert (details["by"], details["from_state"], details["to_state"]) == ("producer", None, "OPEN")


def test_a_vote_before_the_last_keeps_the_room_open() -> None:
    proposal = opened()
    step = cast(proposal, [], ballot("c1", strengths=["clear"], recommendations=["add tests"]))
    assert step.proposal.state == "OPEN"
    assert step.effects == (F.PERSIST_VOTE, F.EMIT_EVENT)
    assert step.vote is not None and step.decision is None
    assert (step.vote.voted_at, step.vote.negotiation_room_id) == (T0 + 5, "room-1")
    assert step.vote.recommendations == ("add tests",)
    ((event_type, details),) = step.events
    assert (event_type, details["votes_received"], details["votes_required"]) == (
        "room.voted", 1, 2,
    )  # fmt: skip


@pytest.mark.conformance("room.decision.policy-version", "patterns.room.decision.policy-version")
def test_the_last_vote_decides_with_votes_aggregate_policy_version_and_rationale() -> None:
    proposal = opened()
    votes = first_vote(proposal)
    step = cast(proposal, votes, ballot("c2", score=6.0, confidence=0.7))
    decision = step.decision
    assert decision is not None
    assert step.proposal.state == "APPROVED"
    assert [v.critic_id for v in decision.votes] == ["c1", "c2"]
    assert decision.aggregated_score is not None
    assert decision.aggregated_score.weighted_mean == pytest.approx(7.125)
    assert decision.policy_version == POLICY.policy_version != ""
    assert decision.reason.startswith("approved:")
    assert (decision.sequence, decision.decided_by, decision.via) == (1, ROOM_SERVICE, "policy")
    assert [e for e, _ in step.events] == ["room.voted", "room.decided"]
    assert step.effects[:2] == (F.PERSIST_VOTE, F.RECORD_DECISION)
    assert F.RESOLVE in step.effects and F.NOTIFY_PRODUCER in step.effects


@pytest.mark.conformance("room.escalate.low-confidence", "patterns.room.escalate.low-confidence")
def test_an_escalation_opens_hitl_with_the_conflict_reason_and_the_votes() -> None:
    proposal = opened()
    step = cast(proposal, first_vote(proposal), ballot("c2", confidence=0.2))
    assert step.proposal.state == "ESCALATED"
    assert step.decision is not None and step.decision.outcome == "ESCALATED_TO_HITL"
    assert step.escalation is not None
    assert step.escalation.reason_type is HitlReason.CONFLICT
    assert step.escalation.triggers == ("low_confidence",)
    context = step.escalation.context
    assert [v["critic_id"] for v in context["votes"]] == ["c1", "c2"]
    assert context["score"] == pytest.approx(step.decision.aggregated_score.weighted_mean / 10)  # type: ignore[union-attr]
    assert step.escalation.subject == {
        "artifact_id": "plan-1", "negotiation_room_id": "room-1", "producer_id": "producer",
    }  # fmt: skip
    # The invocation is opened before the decision is recorded (it carries its id); waiters
    # keep waiting for the human.
    effects = step.effects
    assert effects.index(F.ESCALATE_TO_HITL) < effects.index(F.RECORD_DECISION)
    assert F.RESOLVE not in effects
    assert step.events[-1][1]["hitl_reason"] == "CONFLICT"


@pytest.mark.conformance("room.escalate.vote-timeout", "patterns.room.escalate.vote-timeout")
def test_the_policy_timeout_before_every_vote_escalates_as_a_deadlock() -> None:
    proposal = opened(critics=("c1", "c2", "c3"))
    votes = first_vote(proposal)
    early = RoomMachine.deadline_passed(proposal, votes, now=T0 + 59.9, policy=POLICY)
    assert early == RoomStep(proposal, (F.START_TIMER,))
    step = RoomMachine.deadline_passed(proposal, votes, now=T0 + 60, policy=POLICY)
    assert step.proposal.state == "ESCALATED"
    assert step.escalation is not None
    assert step.escalation.reason_type is HitlReason.DEBATE_DEADLOCK
    assert step.escalation.context["missing_critics"] == ["c2", "c3"]
    assert step.decision is not None
    assert step.decision.triggers == ("vote_timeout",)
    assert "no vote from c2, c3" in step.decision.reason
    assert [v.critic_id for v in step.decision.votes] == ["c1"]
    # No vote at all: nothing to aggregate.
    empty = RoomMachine.deadline_passed(proposal, [], now=T0 + 61, policy=POLICY)
    assert empty.decision is not None and empty.decision.aggregated_score is None
    assert empty.escalation is not None and "score" not in empty.escalation.context


def quorum_policy(kind: str, value: float | bool, on_failure: str) -> RoomPolicy:
    quorum = Quorum.from_mapping({"kind": kind, "value": value, "on_failure": on_failure})
    return RoomPolicy(vote_timeout_s=60.0, quorum=quorum)


def two_of_three(proposal: ProposalRecord, *, passed: bool = True) -> list[VoteRecord]:
    votes = first_vote(proposal)
    return [*votes, replace(votes[0], critic_id="c3", passed=passed)]


@pytest.mark.conformance("room.quorum.policy")
def test_a_met_quorum_decides_at_the_timeout_on_the_votes_in() -> None:
    proposal = opened(critics=("c1", "c2", "c3"))
    policy = quorum_policy("minimum_votes", 2, "fail_closed")
    votes = two_of_three(proposal)
    # Before the timeout a met quorum decides nothing: the room waits for every critic.
    assert RoomMachine.deadline_passed(proposal, votes, now=T0 + 59, policy=policy).proposal == (
        proposal
    )
    step = RoomMachine.deadline_passed(proposal, votes, now=T0 + 60, policy=policy)
    assert step.proposal.state == "APPROVED"
    assert step.escalation is None and step.decision is not None
    assert [v.critic_id for v in step.decision.votes] == ["c1", "c3"]
    assert step.decision.details["quorum"] == {
        "met": True, "received": 2, "expected": 3, "threshold": 2, "action": "none",
        "abstained": [],
    }  # fmt: skip
    assert step.decision.details["missing_critics"] == ["c2"]
    assert step.decision.reason.startswith("no vote from c2 by ")
    assert "quorum minimum_votes 2 met): approved: " in step.decision.reason


@pytest.mark.conformance("room.quorum.policy")
@pytest.mark.parametrize(
    ("on_failure", "state", "pass_ratio", "abstained"),
    [
        ("fail_closed", "ESCALATED", None, []),
        ("fail_with_available", "APPROVED", 1.0, []),
        # The missing critic abstains: 2 passes of 3 is below min_pass_ratio 0.8.
        ("fail_with_abstain", "REVISION_REQUESTED", 2 / 3, ["c2"]),
    ],
)
def test_an_unmet_quorum_does_what_on_failure_says(
    on_failure: str, state: str, pass_ratio: float | None, abstained: list[str]
) -> None:
    proposal = opened(critics=("c1", "c2", "c3"))
    policy = quorum_policy("require_all", True, on_failure)
    step = RoomMachine.deadline_passed(proposal, two_of_three(proposal), now=T0 + 60, policy=policy)
    assert step.proposal.state == state
    assert step.decision is not None
    quorum = step.decision.details["quorum"]
    assert (quorum["met"], quorum["threshold"], quorum["abstained"]) == (False, 3, abstained)
    if pass_ratio is None:
        assert step.escalation is not None
        assert step.escalation.reason_type is HitlReason.DEBATE_DEADLOCK
        assert step.decision.triggers == ("vote_timeout",)
    else:
        assert step.escalation is None
        assert step.decision.details["pass_ratio"] == pytest.approx(pass_ratio)
        assert step.decision.details.get("abstained", []) == abstained


@pytest.mark.conformance("room.quorum.policy")
def test_no_vote_at_all_escalates_whatever_the_quorum() -> None:
    proposal = opened(critics=("c1", "c2"))
    for policy in (
        quorum_policy("minimum_votes", 0, "fail_closed"),
        quorum_policy("require_all", True, "fail_with_available"),
    ):
        step = RoomMachine.deadline_passed(proposal, [], now=T0 + 60, policy=policy)
        assert step.proposal.state == "ESCALATED"
        assert step.decision is not None and step.decision.aggregated_score is None


def test_a_fraction_quorum_rounds_up() -> None:
    """0.5 of three critics is two: one vote of three does not meet it."""
    proposal = opened(critics=("c1", "c2", "c3"))
    policy = quorum_policy("minimum_fraction", 0.5, "fail_closed")
    one = RoomMachine.deadline_passed(proposal, first_vote(proposal), now=T0 + 60, policy=policy)
    assert one.proposal.state == "ESCALATED"
    two = RoomMachine.deadline_passed(proposal, two_of_three(proposal), now=T0 + 60, policy=policy)
    assert two.proposal.state == "APPROVED"


def test_a_timer_finding_every_vote_in_decides_them() -> None:
    proposal = opened()
    votes = [*first_vote(proposal), replace(first_vote(proposal)[0], critic_id="c2")]
    step = RoomMachine.deadline_passed(proposal, votes, now=T0 + 60, policy=POLICY)
    assert step.proposal.state == "APPROVED"
    assert F.PERSIST_VOTE not in step.effects  # the votes are on record already
    assert step.vote is None


@pytest.mark.parametrize(
    ("decision", "state", "via"),
    [
        ({"action": "approve", "decided_by": "olivia", "via": "operator", "rationale": "ok"},
         "APPROVED", "hitl"),
        ({"action": "modify", "decided_by": "olivia", "via": "operator", "rationale": "fix",
          "patch": {"steps": ["migrate", "verify", "deploy"]}}, "REVISION_REQUESTED", "hitl"),
        ({"action": "deny", "decided_by": "apiary", "via": "deadline", "fallback": True},
         "REVISION_REQUESTED", "hitl_fallback"),
    ],
)  # fmt: skip
def test_the_human_decision_becomes_the_rooms_with_the_operator(
    decision: dict[str, Any], state: str, via: str
) -> None:
    proposal = escalated()
    step = RoomMachine.human_decision(proposal, [], decision, now=T0 + 100)
    record = step.decision
    assert record is not None
    assert (step.proposal.state, record.outcome, record.via) == (state, state, via)
    assert (record.sequence, record.decided_by, record.invocation_id) == (
        2, decision["decided_by"], "hitl-1",
    )  # fmt: skip
    assert record.reason.startswith(f"HITL hitl-1: {decision['action']} by")
    assert record.details == decision
    assert F.RESOLVE in step.effects
    assert step.events[0][1]["by"] == decision["decided_by"]


BAD_VOTES = [
    (ballot("c1", score=-0.1), "vote.score"),
    (ballot("c1", score=10.01), "vote.score"),
    (ballot("c1", score=math.nan), "vote.score"),
    (ballot("c1", score=math.inf), "vote.score"),
    (ballot("c1", confidence=1.5), "vote.confidence"),
    (ballot("c1", confidence=-0.01), "vote.confidence"),
    (ballot("c1", confidence=math.nan), "vote.confidence"),
    (replace(ballot("c1"), artifact_id=""), "vote.artifact_id"),
    (replace(ballot("c1"), passed=1), "vote.passed"),
    (ballot("c1", negotiation_room_id="room-9"), "vote.negotiation_room_id"),
    (ballot("c1", strengths=["x"] * 101), "vote.strengths"),
    (ballot("c1", weaknesses=["x" * 4001]), "vote.weaknesses"),
    (ballot("c1", recommendations="escalate"), "vote.recommendations"),
    (replace(ballot("c1"), critic_id=" c1"), "vote.critic_id"),
]


@pytest.mark.parametrize(("bad", "field"), BAD_VOTES)
def test_a_malformed_vote_names_its_field(bad: VoteDraft, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        cast(opened(), [], bad)
    assert caught.value.details["field"] == field
    assert caught.value.message.startswith(f"{field}: ")


def test_votes_are_refused_by_who_and_when() -> None:
    proposal = opened()
    with pytest.raises(PermissionDeniedError, match="not a requested critic"):
        cast(proposal, [], ballot("c9"))
    with pytest.raises(PermissionDeniedError, match="may not act as critic"):
        RoomMachine.vote(proposal, [], ballot("c1"), caller="c2", now=T0, policy=POLICY)
    # The caller may leave critic_id empty: it votes as itself.
    step = RoomMachine.vote(proposal, [], ballot(""), caller="c2", now=T0, policy=POLICY)
    assert step.vote is not None and step.vote.critic_id == "c2"
    with pytest.raises(ValidationError, match=r"vote\.critic_id"):
        cast(proposal, [], ballot(""))
    votes = first_vote(proposal)
    with pytest.raises(AlreadyExistsError, match="already voted"):
        cast(proposal, votes, ballot("c1"))
    decided = cast(proposal, votes, ballot("c2")).proposal
    with pytest.raises(AlreadyCompletedError) as caught:
        cast(decided, [], ballot("c2"))
    assert caught.value.code == "ALREADY_COMPLETED"
    assert "decided APPROVED" in caught.value.message
    with pytest.raises(AlreadyCompletedError, match="escalated to HITL"):
        cast(escalated(), [], ballot("c2"))


BAD_PROPOSALS: list[tuple[dict[str, Any], str]] = [
    ({"artifact_type": 0}, "proposal.artifact_type"),
    ({"artifact_type": 5}, "proposal.artifact_type"),
    ({"artifact_type": "SPREADSHEET"}, "proposal.artifact_type"),
    ({"artifact_id": ""}, "proposal.artifact_id"),
    ({"artifact_id": "a" * 257}, "proposal.artifact_id"),
    ({"artifact_id": "plan\n1"}, "proposal.artifact_id"),
    ({"negotiation_room_id": ""}, "proposal.negotiation_room_id"),
    ({"producer_id": ""}, "proposal.producer_id"),
    ({"artifact": b""}, "proposal.artifact"),
    ({"artifact": b"x" * 101}, "proposal.artifact"),
    ({"artifact_content_type": ""}, "proposal.artifact_content_type"),
    ({"artifact_content_type": "json"}, "proposal.artifact_content_type"),
    ({"requested_critics": []}, "proposal.requested_critics"),
    ({"requested_critics": ["c1", "c1"]}, "proposal.requested_critics"),
    ({"requested_critics": ["c1", "producer"]}, "proposal.requested_critics"),
    ({"requested_critics": ["c1", ""]}, "proposal.requested_critics"),
    ({"requested_critics": "c1"}, "proposal.requested_critics"),
]


@pytest.mark.parametrize(("fields", "field"), BAD_PROPOSALS)
def test_a_malformed_proposal_names_its_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        check_proposal(draft(**fields), caller="", max_artifact_bytes=100)
    assert caught.value.details["field"] == field


def test_a_producer_proposes_as_itself() -> None:
    assert check_proposal(draft(producer_id=""), caller="p2").producer_id == "p2"
    assert check_proposal(draft(), caller="producer").producer_id == "producer"
    with pytest.raises(PermissionDeniedError) as caught:
        check_proposal(draft(), caller="someone-else")
    assert caught.value.details["field"] == "proposal.producer_id"


def test_errors_are_apiary_errors_with_codes() -> None:
    for bad, _ in BAD_VOTES:
        with pytest.raises(ApiaryError) as caught:
            cast(opened(), [], bad)
        assert caught.value.code == "validation_error"


def test_the_diagram_shows_every_row() -> None:
    text = negotiation_room.mermaid()
    assert text.startswith("stateDiagram-v2\n    [*] --> OPEN: SUBMIT\n")
    for state, rows in RoomMachine.TABLE.items():
        for event, row in rows.items():
            assert f"    {state} --> {row.state}: {event}\n" in text
    assert "    APPROVED --> [*]\n" in text and "    REVISION_REQUESTED --> [*]\n" in text
