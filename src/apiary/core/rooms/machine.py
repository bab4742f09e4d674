"""The negotiation room of RFC 17.5 as a pure, table-driven machine.

A producer's proposal opens OPEN: its requested critics are notified and the policy timeout
starts. Votes arrive; the last requested vote completes the set, and `room_policy.evaluate`
decides: APPROVED or REVISION_REQUESTED (the ends), or ESCALATED (to HITL). The policy
timeout before every vote is in escalates too. An escalated room ends with the human's
decision: approve -> APPROVED; deny or modify -> REVISION_REQUESTED (the producer iterates,
with the operator's patch as guidance); HITL's own fallbacks (deadline, unavailability) decide
the same way and say so.

`RoomMachine` takes records, an input and `now` and returns a `RoomStep`: the proposal's new
record, the effects the engine performs in order, the vote or decision to store, the HITL
escalation to open, and the events to log. An input the table has no row for raises
`IllegalTransitionError` and changes nothing; a bad request raises an `ApiaryError` naming
the field and changes nothing. A vote for a decided or escalated proposal is refused with
`AlreadyCompletedError` (ALREADY_COMPLETED).

Decisions Apiary makes where the RFC is silent:
- "Sufficient votes" means one from every requested critic; the set is evaluated when the
  last one arrives, never on a partial set before the policy timeout (a decision carries the
  complete vote list). At the timeout, the policy's quorum (core/quorum.py) says whether the
  votes in suffice: met, the room decides on them; not met, it escalates (fail_closed, the
  default, which requires every vote), decides on them (fail_with_available) or counts the
  missing critics as abstentions that did not pass (fail_with_abstain). No vote at all
  escalates whatever the quorum says: there is nothing to decide on.
- An escalation is a decision too (ESCALATED_TO_HITL, sequence 1, with the votes and the
  aggregate so far), so that GetDecision can show it; WaitForDecision waits for the final one.
- The HITL reason (RFC 15's enumeration has no NEGOTIATION_CONFLICT, which Appendix C.10
  draws): CONFLICT for the vote-based conditions (uncertainty, disagreement, a critic's
  request), DEBATE_DEADLOCK for the policy timeout (RFC 15.4 names it for negotiation
  timeouts). The invocation's context["score"] is weighted_mean / 10, so that HITL's
  AUTO_DECIDE_THRESHOLD fallback (RFC 15.4) compares it with its 0..1 threshold.
- A vote timer that fires before the deadline changes nothing and re-arms; one that fires
  when every vote is in (a restart between the last vote and its decision) evaluates them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Final

from apiary.core.dedup import iso_utc
from apiary.core.hitl.vocabulary import HitlReason
from apiary.core.machine import TransitionTable
from apiary.core.quorum import Action
from apiary.core.rooms.policy import RoomPolicy, Trigger, Verdict, evaluate
from apiary.core.rooms.records import (
    DecisionOutcome,
    DecisionRecord,
    ProposalRecord,
    RoomState,
    VoteRecord,
)
from apiary.core.rooms.validation import CheckedProposal, VoteDraft, check_vote
from apiary.core.vote_aggregation import aggregate
from apiary.errors import AlreadyCompletedError, AlreadyExistsError, PermissionDeniedError

ROOM_SERVICE: Final = "negotiation_room"
"""The room service as a participant: producer of its notifications, actor of the policy's
decisions and requester of its HITL invocations."""
HITL_ACTIONS: Final = ("approve", "deny", "modify")


class RoomInput(StrEnum):
    """Inputs of the table; the machine's methods choose one each."""

    VOTE = "VOTE"
    """A vote while others are still awaited."""
    APPROVE = "APPROVE"
    """The set of votes is complete and meets every auto-approval threshold."""
    REVISE = "REVISE"
    """The set is complete, no escalation condition holds, a threshold was missed."""
    ESCALATE = "ESCALATE"
    """The set is complete and an escalation condition holds."""
    VOTE_TIMEOUT = "VOTE_TIMEOUT"
    """The policy timeout expired before every vote was in."""
    HUMAN_APPROVE = "HUMAN_APPROVE"
    HUMAN_REVISE = "HUMAN_REVISE"


class RoomEffect(StrEnum):
    """What the engine does after a step, in the order the step lists them."""

    PERSIST_PROPOSAL = "PERSIST_PROPOSAL"
    PERSIST_VOTE = "PERSIST_VOTE"
    ESCALATE_TO_HITL = "ESCALATE_TO_HITL"
    """Open the step's HITL invocation; its id goes into the records that follow."""
    RECORD_DECISION = "RECORD_DECISION"
    """Store the proposal's new state and the step's decision together."""
    START_TIMER = "START_TIMER"
    """(Re-)arm the vote timer at `proposal.vote_deadline`."""
    CANCEL_TIMER = "CANCEL_TIMER"
    NOTIFY_CRITICS = "NOTIFY_CRITICS"
    NOTIFY_PRODUCER = "NOTIFY_PRODUCER"
    RESOLVE = "RESOLVE"
    """Wake the producers waiting for the final decision (WaitForDecision)."""
    EMIT_EVENT = "EMIT_EVENT"


@dataclass(frozen=True, slots=True)
class RoomRow:
    state: RoomState
    effects: tuple[RoomEffect, ...]
    event_type: str


@dataclass(frozen=True, slots=True)
class Escalation:
    """The HITL invocation an escalation opens (RFC 15)."""

    reason_type: HitlReason
    triggers: tuple[str, ...]
    context: dict[str, Any]
    subject: dict[str, Any]
    approver_roles: tuple[str, ...]
    timeout_s: float
    """0: HITL's default window."""
    proposed_actions: tuple[str, ...] = HITL_ACTIONS


@dataclass(frozen=True, slots=True)
class RoomStep:
    """A transition's result. `events` are (event type, details) pairs for the event log;
    details name artifact_id, room, by (the actor), at, from_state and to_state."""

    proposal: ProposalRecord
    effects: tuple[RoomEffect, ...]
    events: tuple[tuple[str, dict[str, Any]], ...] = ()
    vote: VoteRecord | None = None
    decision: DecisionRecord | None = None
    escalation: Escalation | None = None


_S = RoomState
_F = RoomEffect
_I = RoomInput
OPEN_ROW: Final = RoomRow(
    _S.OPEN,
    (_F.PERSIST_PROPOSAL, _F.START_TIMER, _F.NOTIFY_CRITICS, _F.EMIT_EVENT),
    "room.proposed",
)
"""What a submission does: there is no state before OPEN, so this row is outside the table."""


def _table() -> dict[RoomState, dict[RoomInput, RoomRow]]:
    decided = (_F.RECORD_DECISION, _F.CANCEL_TIMER, _F.NOTIFY_PRODUCER, _F.RESOLVE, _F.EMIT_EVENT)
    escalated = (_F.ESCALATE_TO_HITL, _F.RECORD_DECISION)
    human = (_F.RECORD_DECISION, _F.NOTIFY_PRODUCER, _F.RESOLVE, _F.EMIT_EVENT)
    rows = {
        _S.OPEN: {
            _I.VOTE: RoomRow(_S.OPEN, (_F.PERSIST_VOTE, _F.EMIT_EVENT), "room.voted"),
            _I.APPROVE: RoomRow(_S.APPROVED, (_F.PERSIST_VOTE, *decided), "room.decided"),
            _I.REVISE: RoomRow(_S.REVISION_REQUESTED, (_F.PERSIST_VOTE, *decided), "room.decided"),
            _I.ESCALATE: RoomRow(
                _S.ESCALATED,
                (_F.PERSIST_VOTE, *escalated, _F.CANCEL_TIMER, _F.NOTIFY_PRODUCER, _F.EMIT_EVENT),
                "room.escalated",
            ),
            # The timer that fired is the one to cancel: nothing else is armed.
            _I.VOTE_TIMEOUT: RoomRow(
                _S.ESCALATED, (*escalated, _F.NOTIFY_PRODUCER, _F.EMIT_EVENT), "room.escalated"
            ),
        },
        _S.ESCALATED: {
            _I.HUMAN_APPROVE: RoomRow(_S.APPROVED, human, "room.decided"),
            _I.HUMAN_REVISE: RoomRow(_S.REVISION_REQUESTED, human, "room.decided"),
        },
    }
    return {state: rows.get(state, {}) for state in _S}


class RoomMachine:
    """The room transition table and the transitions that validate and apply it."""

    TABLE: dict[RoomState, dict[RoomInput, RoomRow]] = _table()
    TRANSITIONS: TransitionTable[RoomState, RoomInput, RoomRow] = TransitionTable(
        TABLE, "negotiation-room"
    )

    @classmethod
    def row(cls, state: RoomState | str, event: RoomInput) -> RoomRow:
        """The table's row for (state, event); IllegalTransitionError when there is none."""
        return cls.TRANSITIONS.step(RoomState(state), event)

    @classmethod
    def allows(cls, state: RoomState | str, event: RoomInput) -> bool:
        return cls.TRANSITIONS.allows(RoomState(state), event)

    @classmethod
    def open(cls, checked: CheckedProposal, *, now: float, policy: RoomPolicy) -> RoomStep:
        """Open a room for a checked proposal (room_validation.check_proposal)."""
        proposal = ProposalRecord(
            artifact_id=checked.artifact_id,
            negotiation_room_id=checked.negotiation_room_id,
            artifact_type=checked.artifact_type.value,
            producer_id=checked.producer_id,
            artifact=checked.artifact,
            artifact_content_type=checked.artifact_content_type,
            requested_critics=checked.requested_critics,
            created_at=now,
            state=_S.OPEN.value,
            updated_at=now,
            policy_version=policy.policy_version,
            vote_deadline=now + policy.vote_timeout_s,
        )
        details = {
            **_base(proposal, checked.producer_id, now, None),
            "artifact_type": proposal.artifact_type,
            "artifact_content_type": proposal.artifact_content_type,
            "artifact_size": len(proposal.artifact),
            "requested_critics": list(proposal.requested_critics),
            "policy_version": proposal.policy_version,
            "vote_deadline": iso_utc(proposal.vote_deadline),
        }
        return RoomStep(proposal, OPEN_ROW.effects, ((OPEN_ROW.event_type, details),))

    @classmethod
    def vote(
        cls,
        proposal: ProposalRecord,
        votes: Sequence[VoteRecord],
        draft: VoteDraft,
        *,
        caller: str,
        now: float,
        policy: RoomPolicy,
    ) -> RoomStep:
        """A critic's vote. Checks in order: the vote's fields and the caller
        (validation_error, permission_denied), that the critic was requested
        (permission_denied), that the room still takes votes (ALREADY_COMPLETED), that the
        critic has not voted (already_exists)."""
        vote = check_vote(draft, caller=caller, now=now, room_id=proposal.negotiation_room_id)
        if vote.critic_id not in proposal.requested_critics:
            raise PermissionDeniedError(
                f"{vote.critic_id!r} is not a requested critic of {proposal.artifact_id!r} "
                f"(requested: {', '.join(proposal.requested_critics)})",
                {"field": "vote.critic_id", "artifact_id": proposal.artifact_id},
            )
        if proposal.state != _S.OPEN:
            raise AlreadyCompletedError(
                f"artifact {proposal.artifact_id!r} takes no more votes: {_status(proposal)}",
                {"artifact_id": proposal.artifact_id, "state": proposal.state},
            )
        if any(v.critic_id == vote.critic_id for v in votes):
            raise AlreadyExistsError(
                f"{vote.critic_id!r} already voted on {proposal.artifact_id!r}",
                {"artifact_id": proposal.artifact_id, "critic_id": vote.critic_id},
            )
        complete = [*votes, vote]
        voted = ("room.voted", _vote_details(proposal, vote, len(complete), now))
        if len(complete) < len(proposal.requested_critics):
            row = cls.row(proposal.state, _I.VOTE)
            step = replace(proposal, updated_at=now)
            return RoomStep(step, row.effects, (voted,), vote=vote)
        return _judged(proposal, complete, policy, now, vote=vote, first=voted)

    @classmethod
    def complete(
        cls,
        proposal: ProposalRecord,
        votes: Sequence[VoteRecord],
        *,
        now: float,
        policy: RoomPolicy,
    ) -> RoomStep:
        """Decide an OPEN proposal whose votes are all in but undecided (a restart between
        the last vote and its decision)."""
        cls.row(proposal.state, _I.APPROVE)  # only OPEN decides on votes
        if len(votes) < len(proposal.requested_critics):
            raise ValueError(f"{proposal.artifact_id}: {len(votes)} votes are not all of them")
        return _judged(proposal, votes, policy, now)

    @classmethod
    def deadline_passed(
        cls,
        proposal: ProposalRecord,
        votes: Sequence[VoteRecord],
        *,
        now: float,
        policy: RoomPolicy,
    ) -> RoomStep:
        """The vote timer fired: escalate (RFC 17.5: the policy timeout before sufficient
        votes). Early, it changes nothing and re-arms."""
        row = cls.row(proposal.state, _I.VOTE_TIMEOUT)
        if now < proposal.vote_deadline:
            return RoomStep(proposal, (_F.START_TIMER,))
        if len(votes) >= len(proposal.requested_critics):
            return cls.complete(proposal, votes, now=now, policy=policy)
        missing = [c for c in proposal.requested_critics if c not in {v.critic_id for v in votes}]
        quorum = policy.quorum.decide(proposal.requested_critics, [v.critic_id for v in votes])
        late = (
            f"no vote from {', '.join(missing)} by {iso_utc(proposal.vote_deadline)} "
            f"({len(votes)} of {len(proposal.requested_critics)} votes"
        )
        extra = {"missing_critics": missing, "quorum": quorum.as_dict()}
        if votes and quorum.action is not Action.ESCALATE_HITL:
            rule = policy.quorum.rule
            why = "met" if quorum.met else f"not met, {policy.quorum.on_failure.value}"
            return _judged(
                proposal, votes, policy, now, abstained=quorum.abstained, extra=extra,
                lead=f"{late}, quorum {rule.kind.value} {rule.value} {why}): ",
            )  # fmt: skip
        return _escalated(
            proposal, row, votes, policy, now, (Trigger.VOTE_TIMEOUT.value,),
            f"escalated to HITL: {late})", HitlReason.DEBATE_DEADLOCK, extra=extra,
        )  # fmt: skip

    @classmethod
    def human_decision(
        cls,
        proposal: ProposalRecord,
        votes: Sequence[VoteRecord],
        decision: Mapping[str, Any],
        *,
        now: float,
    ) -> RoomStep:
        """The HITL invocation's decision becomes the room's (RFC 15.1: applied at once)."""
        action = str(decision.get("action", "deny")).lower()
        event = _I.HUMAN_APPROVE if action == "approve" else _I.HUMAN_REVISE
        row = cls.row(proposal.state, event)
        who = str(decision.get("decided_by") or "unknown")
        fallback = bool(decision.get("fallback"))
        rationale = str(decision.get("rationale") or "")
        outcome = (
            DecisionOutcome.APPROVED
            if row.state is _S.APPROVED
            else DecisionOutcome.REVISION_REQUESTED
        )
        reason = f"HITL {proposal.invocation_id}: {action} by {who}"
        reason += f" ({decision.get('via')})" if fallback else ""
        reason += f": {rationale}" if rationale else ""
        record = DecisionRecord(
            artifact_id=proposal.artifact_id,
            sequence=2,
            negotiation_room_id=proposal.negotiation_room_id,
            outcome=outcome.value,
            votes=tuple(votes),
            aggregated_score=aggregate(votes) if votes else None,
            policy_version=proposal.policy_version,
            reason=reason,
            decided_at=now,
            decided_by=who,
            via="hitl_fallback" if fallback else "hitl",
            triggers=(action,),
            invocation_id=proposal.invocation_id,
            details=dict(decision),
        )
        return _decided(proposal, row, record, now)


def mermaid() -> str:
    """The state diagram of the table, for the docs."""
    ended = (s for s in RoomState if s.terminal)
    return RoomMachine.TRANSITIONS.mermaid(
        (OPEN_ROW.state,), ended, lambda row: row.state, loops=True, entry="SUBMIT"
    )


# --- transitions ------------------------------------------------------------------------------


def _judged(
    proposal: ProposalRecord,
    votes: Sequence[VoteRecord],
    policy: RoomPolicy,
    now: float,
    *,
    vote: VoteRecord | None = None,
    first: tuple[str, dict[str, Any]] | None = None,
    abstained: Sequence[str] = (),
    extra: Mapping[str, Any] | None = None,
    lead: str = "",
) -> RoomStep:
    """Evaluate the votes the quorum accepted (every one, before the timeout) and take the
    row the verdict picks; `lead` opens the reason, `extra` joins the decision's details."""
    verdict = evaluate(votes, policy, len(abstained))
    verdict = replace(verdict, reason=lead + verdict.reason)
    extra = {**dict(extra or {}), **({"abstained": list(abstained)} if abstained else {})}
    if verdict.outcome is DecisionOutcome.ESCALATED_TO_HITL:
        row = RoomMachine.row(proposal.state, _I.ESCALATE)
        step = _escalated(
            proposal, row, votes, policy, now, verdict.triggers, verdict.reason,
            HitlReason.CONFLICT, verdict=verdict, extra=extra,
        )  # fmt: skip
    else:
        event = _I.APPROVE if verdict.outcome is DecisionOutcome.APPROVED else _I.REVISE
        row = RoomMachine.row(proposal.state, event)
        decision = _policy_decision(proposal, votes, verdict, now)
        decision = replace(decision, details={**decision.details, **extra})
        step = _decided(proposal, row, decision, now)
    if vote is None:  # nothing new to store: the votes are on record already
        effects = tuple(e for e in step.effects if e is not _F.PERSIST_VOTE)
        step = replace(step, effects=effects)
    return replace(step, vote=vote, events=((first,) if first else ()) + step.events)


def _policy_decision(
    proposal: ProposalRecord, votes: Sequence[VoteRecord], verdict: Verdict, now: float
) -> DecisionRecord:
    return DecisionRecord(
        artifact_id=proposal.artifact_id,
        sequence=1,
        negotiation_room_id=proposal.negotiation_room_id,
        outcome=verdict.outcome.value,
        votes=tuple(votes),
        aggregated_score=verdict.aggregated,
        policy_version=proposal.policy_version,
        reason=verdict.reason,
        decided_at=now,
        decided_by=ROOM_SERVICE,
        via="policy",
        triggers=verdict.triggers,
        details={
            "average_confidence": verdict.average_confidence,
            "pass_ratio": verdict.pass_ratio,
        },
    )


def _decided(
    proposal: ProposalRecord,
    row: RoomRow,
    decision: DecisionRecord,
    now: float,
    **extra: Any,
) -> RoomStep:
    new = replace(proposal, state=row.state.value, updated_at=now)
    details = {
        **_base(proposal, decision.decided_by, now, row.state),
        **_decision_details(decision),
        **extra,
    }
    return RoomStep(new, row.effects, ((row.event_type, details),), decision=decision)


def _escalated(
    proposal: ProposalRecord,
    row: RoomRow,
    votes: Sequence[VoteRecord],
    policy: RoomPolicy,
    now: float,
    triggers: tuple[str, ...],
    reason: str,
    reason_type: HitlReason,
    *,
    verdict: Verdict | None = None,
    extra: Mapping[str, Any] | None = None,
) -> RoomStep:
    scores = verdict.aggregated if verdict else (aggregate(votes) if votes else None)
    decision = DecisionRecord(
        artifact_id=proposal.artifact_id,
        sequence=1,
        negotiation_room_id=proposal.negotiation_room_id,
        outcome=DecisionOutcome.ESCALATED_TO_HITL.value,
        votes=tuple(votes),
        aggregated_score=scores,
        policy_version=proposal.policy_version,
        reason=reason,
        decided_at=now,
        decided_by=ROOM_SERVICE,
        via="policy",
        triggers=triggers,
        details={**(_tally(verdict) if verdict else {}), **dict(extra or {})},
    )
    escalation = Escalation(
        reason_type=reason_type,
        triggers=triggers,
        context=_hitl_context(proposal, decision),
        subject={
            "artifact_id": proposal.artifact_id,
            "negotiation_room_id": proposal.negotiation_room_id,
            "producer_id": proposal.producer_id,
        },
        approver_roles=policy.hitl_approver_roles,
        timeout_s=policy.hitl_timeout_s,
    )
    step = _decided(proposal, row, decision, now, hitl_reason=reason_type.value)
    return replace(step, escalation=escalation)


def _tally(verdict: Verdict) -> dict[str, float]:
    return {"average_confidence": verdict.average_confidence, "pass_ratio": verdict.pass_ratio}


def _hitl_context(proposal: ProposalRecord, decision: DecisionRecord) -> dict[str, Any]:
    """What the operator sees (RFC 15: case facts): why, the artifact, every vote, the
    aggregate, and `score` (weighted_mean / 10) for HITL's AUTO_DECIDE_THRESHOLD fallback."""
    scores = decision.aggregated_score
    context: dict[str, Any] = {
        "reason": decision.reason,
        "triggers": list(decision.triggers),
        "artifact_type": proposal.artifact_type,
        "artifact_content_type": proposal.artifact_content_type,
        "artifact_size": len(proposal.artifact),
        "requested_critics": list(proposal.requested_critics),
        "policy_version": proposal.policy_version,
        "votes": [_vote_summary(v) for v in decision.votes],
        "aggregated_score": scores.as_dict() if scores else None,
        **dict(decision.details),
    }
    if scores is not None:
        context["score"] = scores.weighted_mean / 10.0
    return context


def _status(proposal: ProposalRecord) -> str:
    if proposal.state == _S.ESCALATED:
        return f"it was escalated to HITL (invocation {proposal.invocation_id or 'pending'})"
    return f"it was decided {proposal.state}"


def _base(
    proposal: ProposalRecord, by: str, now: float, to_state: RoomState | None
) -> dict[str, Any]:
    return {
        "artifact_id": proposal.artifact_id,
        "negotiation_room_id": proposal.negotiation_room_id,
        "producer_id": proposal.producer_id,
        "by": by,
        "at": now,
        "from_state": None if to_state is None else proposal.state,
        "to_state": (to_state or _S.OPEN).value,
    }


def _vote_details(
    proposal: ProposalRecord, vote: VoteRecord, count: int, now: float
) -> dict[str, Any]:
    return {
        **_base(proposal, vote.critic_id, now, RoomState(proposal.state)),
        **_vote_summary(vote),
        "votes_received": count,
        "votes_required": len(proposal.requested_critics),
    }


def _vote_summary(vote: VoteRecord) -> dict[str, Any]:
    return {
        "critic_id": vote.critic_id,
        "score": vote.score,
        "confidence": vote.confidence,
        "passed": vote.passed,
        "recommendations": list(vote.recommendations),
    }


def _decision_details(decision: DecisionRecord) -> dict[str, Any]:
    scores = decision.aggregated_score
    return {
        "outcome": decision.outcome,
        "reason": decision.reason,
        "policy_version": decision.policy_version,
        "via": decision.via,
        "triggers": list(decision.triggers),
        "aggregated_score": scores.as_dict() if scores else None,
        "vote_count": len(decision.votes),
        "decision_sequence": decision.sequence,
    }
