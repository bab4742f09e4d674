"""The negotiation round machine (RFC 17, 17.1-17.3) as a pure, table-driven machine.

A negotiation opens OPEN (waiting for the first proposal). Each admitted draft starts a
round: DELIBERATING while the other participants evaluate it or counter it. When every
evaluator voted, the round closes: accepted (DECIDED, or AWAITING_HITL under the
PauseOnFinalAccept gate), or not, and then either a stop rule fires (max_rounds,
oscillation, budget) or the negotiation waits for a counter (AWAITING_COUNTER; PAUSED under
the PauseBetweenRounds gate until HITL lets it go on). Round and debate timeouts are stop
rules too. A stop without acceptance is a deadlock: escalated to HITL with reason
DEBATE_DEADLOCK (AWAITING_HITL), or settled by the tie-break rule, or aborted when there is
no draft to choose from. Abort and an explicit Decide end any open negotiation.

Every method returns a `NegotiationStep`: the new record, the effects the engine performs in
order, one event for the log, and what the effects need (the round, artifacts, fanout
events, the HITL escalation). An input the table has no row for raises
`IllegalTransitionError` and changes nothing; bad input raises an `ApiaryError` naming the
field. An invalid draft is refused without consuming a round: its step changes nothing but
logs `negotiation.draft_refused`, and `step.refusal` is the error to answer with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Final

from apiary.core.dedup import iso_utc
from apiary.core.machine import TransitionTable
from apiary.core.negotiation.delta import diff
from apiary.core.negotiation.events import b64, event
from apiary.core.negotiation.hitl import (
    deadlock_context,
    final_gate_step,
    gated_draft,
    hitl_audit,
    pause_step,
    pick_draft,
    resume_step,
)
from apiary.core.negotiation.outcomes import (
    abort_step,
    accept_step,
    consensus_rationale,
    end_step,
    refused_step,
    stop_rule,
)
from apiary.core.negotiation.policy import (
    EffectivePolicy,
    HitlGate,
    parse_intensity,
)
from apiary.core.negotiation.records import NegotiationRecord, RoundRecord
from apiary.core.negotiation.rounds import admitted_step, evaluation_step
from apiary.core.negotiation.scoring import (
    best_candidate,
    candidate_score,
    estimate_tokens,
    meets,
    reverses,
)
from apiary.core.negotiation.validation import ValidationRules, check_draft, refusal
from apiary.core.negotiation.vocabulary import (
    DECIDED_BY,
    DeadlockRule,
    Draft,
    Escalation,
    NegotiationEffect,
    NegotiationInput,
    NegotiationState,
    NegotiationStep,
    Row,
    StopReason,
    member,
    policy_of,
    step_details,
    version,
)
from apiary.errors import (
    AlreadyCompletedError,
    AlreadyExistsError,
    ValidationError,
)

_S = NegotiationState
_I = NegotiationInput
_F = NegotiationEffect
OPEN_ROW: Final = Row(
    _S.OPEN, (_F.PERSIST, _F.ARM_TIMERS, _F.FANOUT, _F.EMIT_EVENT), "negotiation.opened"
)
"""What opening does: there is no state before OPEN, so this row is outside the table."""


def _table() -> dict[NegotiationState, dict[NegotiationInput, Row]]:
    draft = (_F.PERSIST, _F.SAVE_ROUND, _F.APPEND_ARTIFACTS, _F.ARM_TIMERS, _F.FANOUT,
             _F.EMIT_EVENT)  # fmt: skip
    voted = (_F.PERSIST, _F.SAVE_ROUND, _F.APPEND_ARTIFACTS, _F.FANOUT, _F.EMIT_EVENT)
    ended = (_F.PERSIST, _F.CANCEL_TIMERS, _F.APPEND_ARTIFACTS, _F.FANOUT, _F.EMIT_EVENT)
    hitl = (_F.PERSIST, _F.CANCEL_TIMERS, _F.ESCALATE, _F.EMIT_EVENT)
    waiting = (_F.PERSIST, _F.ARM_TIMERS, _F.EMIT_EVENT)
    decided = Row(_S.DECIDED, ended, "negotiation.decided")
    aborted = Row(_S.ABORTED, ended, "negotiation.aborted")
    proposed = Row(_S.DELIBERATING, draft, "negotiation.proposed")
    countered = Row(_S.DELIBERATING, draft, "negotiation.countered")
    deadlocked = Row(_S.AWAITING_HITL, hitl, "negotiation.deadlocked")
    tie_break = Row(_S.DECIDED, ended, "negotiation.decided")
    return {
        _S.OPEN: {_I.PROPOSE: proposed, _I.DECIDE: decided, _I.ABORT: aborted},
        _S.DELIBERATING: {
            _I.PROPOSE: proposed, _I.COUNTER: countered,
            _I.EVALUATE: Row(_S.DELIBERATING, voted, "negotiation.evaluated"),
            _I.ACCEPT: decided,
            _I.CONFIRM: Row(_S.AWAITING_HITL, hitl, "negotiation.confirming"),
            _I.CONTINUE: Row(_S.AWAITING_COUNTER, waiting, "negotiation.round_closed"),
            _I.PAUSE: Row(_S.PAUSED, hitl, "negotiation.paused"),
            _I.DEADLOCK: deadlocked, _I.TIE_BREAK: tie_break, _I.DECIDE: decided,
            _I.ABORT: aborted,
        },
        _S.AWAITING_COUNTER: {
            _I.PROPOSE: proposed, _I.COUNTER: countered, _I.DEADLOCK: deadlocked,
            _I.TIE_BREAK: tie_break, _I.DECIDE: decided, _I.ABORT: aborted,
        },
        _S.PAUSED: {
            _I.RESUME: Row(_S.AWAITING_COUNTER, waiting, "negotiation.resumed"),
            _I.HITL_ACCEPT: decided, _I.DECIDE: decided, _I.ABORT: aborted,
        },
        _S.AWAITING_HITL: {_I.HITL_ACCEPT: decided, _I.DECIDE: decided, _I.ABORT: aborted},
        _S.DECIDED: {},
        _S.ABORTED: {},
    }  # fmt: skip


class NegotiationMachine:
    """The transition table and the transitions that validate and apply it."""

    TABLE: dict[NegotiationState, dict[NegotiationInput, Row]] = _table()
    TRANSITIONS: TransitionTable[NegotiationState, NegotiationInput, Row] = TransitionTable(
        TABLE, "negotiation"
    )

    @classmethod
    def row(cls, state: NegotiationState | str, event_: NegotiationInput) -> Row:
        """The table's row for (state, event); IllegalTransitionError when there is none."""
        return cls.TRANSITIONS.step(NegotiationState(state), event_)

    @classmethod
    def allows(cls, state: NegotiationState | str, event_: NegotiationInput) -> bool:
        return cls.TRANSITIONS.allows(NegotiationState(state), event_)

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        *,
        negotiation_id: str,
        topic: str,
        participants: Sequence[str],
        intensity: object,
        effective: EffectivePolicy,
        debate_timeout_s: float,
        now: float,
        correlation_id: str = "",
        profile: str = "",
        validation: ValidationRules | None = None,
        opened_by: str = "",
    ) -> NegotiationStep:
        """Validate an Open (RFC 17: topic, participants, intensity) and open the room."""
        nid = _required(negotiation_id, "negotiation_id")
        if correlation_id and correlation_id != nid:
            raise ValidationError.for_field(
                "correlation_id",
                f"must equal negotiation_id {nid!r} (room semantics), got {correlation_id!r}",
            )
        members = _participants(participants)
        level = parse_intensity(intensity)
        rules = validation or ValidationRules()
        policy = effective.policy
        record = NegotiationRecord(
            negotiation_id=nid, correlation_id=nid, topic=_required(topic, "topic"),
            participants=members, intensity=level.value, state=_S.OPEN.value,
            created_at=now, updated_at=now, deadline=now + debate_timeout_s,
            opened_by=opened_by, profile=profile or level.value, policy=effective.to_json(),
            validation=rules.to_json(), round_deadline=now + policy.round_timeout_ms / 1000,
        )  # fmt: skip
        ts = iso_utc(now)
        fanout = (
            event("open", ts, topic=record.topic, corr=nid, negotiation_id=nid,
                  participants=list(members), intensity=level.value,
                  debate_timeout_ms=round(debate_timeout_s * 1000)),
            event("policy", ts, negotiation_id=nid, profile=record.profile,
                  policy=policy.to_json(), applied=effective.to_json()["applied"]),
        )  # fmt: skip
        details = {
            "negotiation_id": nid, "by": opened_by, "from_state": None, "to_state": _S.OPEN.value,
            "topic": record.topic, "participants": list(members), "intensity": level.value,
            "profile": record.profile, "policy": record.policy,
            "debate_timeout_s": debate_timeout_s, "validation": bool(record.validation),
        }  # fmt: skip
        return NegotiationStep(record, OPEN_ROW.effects, (OPEN_ROW.event_type, details),
                               fanout=fanout)  # fmt: skip

    # ------------------------------------------------------------------ drafts

    @classmethod
    def submit(
        cls,
        record: NegotiationRecord,
        rounds: Sequence[RoundRecord],
        draft: Draft,
        *,
        now: float,
        rule: DeadlockRule = DeadlockRule.ESCALATE,
    ) -> NegotiationStep:
        """A proposal or counter-proposal. Checks in order: participant (permission_denied),
        the table (IllegalTransitionError), rounds left, the content checks, the per-round
        token budget and the diff tolerance (refused without consuming a round), then the
        total token budget (a stop: the draft is not admitted)."""
        member(record, draft.from_agent, "from_agent")
        input_ = _I.COUNTER if draft.counter else _I.PROPOSE
        row = cls.row(record.state, input_)
        policy = policy_of(record)
        if record.round >= policy.max_rounds:
            raise ValidationError.for_field(
                "negotiation_id",
                f"no round left: max_rounds {policy.max_rounds} reached; evaluate "
                f"{version(record.round)}",
            )
        rules = ValidationRules.from_json(record.validation)
        check = check_draft(rules, draft.content_type, draft.payload)
        tokens = estimate_tokens(len(draft.payload))
        previous = rounds[-1] if rounds else None
        delta = (
            diff(previous.content_type, previous.payload, draft.content_type, draft.payload)
            if previous else None
        )  # fmt: skip
        why = refusal(check, policy)
        if not why and policy.token_budget_per_round and tokens > policy.token_budget_per_round:
            why = (f"about {tokens} tokens exceed the per-round token budget of "
                   f"{policy.token_budget_per_round}")  # fmt: skip
        magnitude = delta.summary.magnitude if delta else 0.0
        if not why and draft.counter and magnitude > policy.diff_tolerance:
            why = (f"the counter-proposal changes {magnitude:g} of {version(record.round)}, "
                   f"more than diff_tolerance {policy.diff_tolerance:g}")  # fmt: skip
        if why:
            return refused_step(record, draft, why, check.to_json(), now)
        total = policy.total_token_budget
        if total and record.tokens_spent + tokens > total:
            error = ValidationError.for_field(
                "payload", f"the total token budget of {total} is exhausted "
                f"({record.tokens_spent} spent, the draft needs about {tokens}); the "
                "negotiation stopped (budget)",
            )  # fmt: skip
            step = cls.stop(record, rounds, StopReason.BUDGET, now=now, rule=rule)
            return replace(step, refusal=error)
        return admitted_step(row, record, rounds, draft, check, tokens, delta, now, policy)

    @classmethod
    def after_draft(
        cls, record: NegotiationRecord, rounds: Sequence[RoundRecord], *, now: float,
        rule: DeadlockRule = DeadlockRule.ESCALATE,
    ) -> NegotiationStep | None:  # fmt: skip
        """The stop rule a just-admitted draft may trigger: too many oscillations."""
        policy = policy_of(record)
        if record.oscillations > policy.oscillation_limit:
            return cls.stop(record, rounds, StopReason.OSCILLATION, now=now, rule=rule)
        return None

    # ------------------------------------------------------------------ evaluations

    @classmethod
    def evaluate(
        cls,
        record: NegotiationRecord,
        current: RoundRecord,
        *,
        from_agent: str,
        score: float,
        notes: str,
        now: float,
        llm_confidence: float | None = None,
        score_field: str = "confidence_score",
    ) -> NegotiationStep:
        """An evaluation of the current draft by a participant other than its author."""
        member(record, from_agent, "from_agent")
        row = cls.row(record.state, _I.EVALUATE)
        if from_agent == current.from_agent:
            raise ValidationError.for_field(
                "from_agent", f"{from_agent} wrote {version(current.round)}; the other "
                "participants evaluate it",
            )  # fmt: skip
        if from_agent in current.evaluations:
            raise AlreadyExistsError(
                f"{from_agent} already evaluated {version(current.round)}",
                {"negotiation_id": record.negotiation_id, "from_agent": from_agent},
            )
        own = _unit(score, score_field)
        if llm_confidence is not None:
            llm_confidence = _unit(llm_confidence, "llm_confidence")
        if not isinstance(notes, str):
            raise ValidationError.for_field("notes", "must be a string")
        return evaluation_step(row, record, current, from_agent, own, llm_confidence, notes, now)

    @classmethod
    def close_round(
        cls,
        record: NegotiationRecord,
        rounds: Sequence[RoundRecord],
        *,
        now: float,
        rule: DeadlockRule = DeadlockRule.ESCALATE,
    ) -> NegotiationStep | None:
        """The round's outcome once every evaluator voted on the latest draft (None before):
        accept (or confirm), a stop rule, a pause, or wait for a counter."""
        current = rounds[-1] if rounds else None
        if current is None or current.score is None or current.round != record.round:
            return None
        policy = policy_of(record)
        if meets(current.score, policy.score_threshold):
            if policy.hitl is HitlGate.PAUSE_ON_FINAL_ACCEPT:
                return final_gate_step(cls.row(record.state, _I.CONFIRM), record, current, now)
            return accept_step(cls.row(record.state, _I.ACCEPT), record, current, now,
                           decided_by="consensus", stop=StopReason.THRESHOLD_MET,
                           rationale=consensus_rationale(current, policy))  # fmt: skip
        scores = [r.score for r in rounds if r.score is not None]
        if reverses(scores):
            record = replace(record, oscillations=record.oscillations + 1)
        stop = stop_rule(record, policy)
        if stop is not None:
            return cls.stop(record, rounds, stop, now=now, rule=rule)
        if policy.hitl is HitlGate.PAUSE_BETWEEN_ROUNDS:
            return pause_step(cls.row(record.state, _I.PAUSE), record, current, now)
        row = cls.row(record.state, _I.CONTINUE)
        new = replace(record, state=row.state.value, updated_at=now,
                      round_deadline=now + policy.round_timeout_ms / 1000)  # fmt: skip
        details = step_details(
            record,
            new,
            "scheduler",
            round=current.round,
            score=current.score,
            threshold=policy.score_threshold,
            oscillations=new.oscillations,
        )
        return NegotiationStep(new, row.effects, (row.event_type, details))

    # ------------------------------------------------------------------ stops and time

    @classmethod
    def timeout(
        cls,
        record: NegotiationRecord,
        rounds: Sequence[RoundRecord],
        *,
        now: float,
        rule: DeadlockRule = DeadlockRule.ESCALATE,
    ) -> NegotiationStep | None:
        """A round or debate timer fired: stop with `timeout` (RFC 17: the Scheduler enforces
        debate_timeout), or None when nothing is due (a stale timer)."""
        if not _S(record.state).timed:
            return None
        debate = now >= record.deadline
        round_due = bool(record.round_deadline) and now >= record.round_deadline
        if not (debate or round_due):
            return None
        which = "debate_timeout" if debate else "round_timeout"
        return cls.stop(record, rounds, StopReason.TIMEOUT, now=now, rule=rule, which=which)

    @classmethod
    def stop(
        cls,
        record: NegotiationRecord,
        rounds: Sequence[RoundRecord],
        reason: StopReason,
        *,
        now: float,
        rule: DeadlockRule = DeadlockRule.ESCALATE,
        which: str = "",
    ) -> NegotiationStep:
        """A stop rule fired without acceptance: deadlock handling (RFC 17)."""
        best = best_candidate(rounds)
        why = which or reason.value
        stopped = replace(record, stop_reason=reason.value)
        if best is None and (rule is DeadlockRule.TIE_BREAK or not rounds):
            return abort_step(cls.row(record.state, _I.ABORT), stopped, now, by="scheduler",
                          reason=f"stopped ({why}) with no scored draft to choose",
                          stop=reason.value)  # fmt: skip
        if rule is DeadlockRule.TIE_BREAK and best is not None:
            return accept_step(cls.row(record.state, _I.TIE_BREAK), stopped, best, now,
                           decided_by="policy", stop=reason,
                           rationale=f"stopped ({why}); tie-break: {version(best.round)} has "
                           f"the best score {candidate_score(best)}")  # fmt: skip
        row = cls.row(record.state, _I.DEADLOCK)
        new = replace(stopped, state=row.state.value, updated_at=now, round_deadline=0.0)
        context = deadlock_context(new, rounds, why, best)
        details = step_details(
            record,
            new,
            "scheduler",
            stop_reason=reason.value,
            cause=why,
            suggested=context["suggested_version"],
            score=context["score"],
        )
        escalation = Escalation("DEBATE_DEADLOCK", "deadlock", context)
        return NegotiationStep(new, row.effects, (row.event_type, details),
                               escalation=escalation)  # fmt: skip

    # ------------------------------------------------------------------ HITL and overrides

    @classmethod
    def hitl_decided(
        cls,
        record: NegotiationRecord,
        rounds: Sequence[RoundRecord],
        decision: Mapping[str, Any],
        *,
        now: float,
        invocation_id: str = "",
    ) -> NegotiationStep:
        """Apply the decision of the HITL invocation the negotiation waits for: approve
        (go on, or accept the suggested draft), modify with {"accept": version or agent}
        (accept that draft), anything else (deny) aborts."""
        action = str(decision.get("action", "deny")).lower()
        audit = hitl_audit(decision, invocation_id)
        by = "hitl" if decision.get("via") == "operator" else "policy"
        who = str(decision.get("decided_by") or "hitl")
        why = str(decision.get("rationale", ""))
        chosen: RoundRecord | None = None
        if action == "modify":
            chosen = pick_draft(rounds, (decision.get("patch") or {}).get("accept"))
        elif action == "approve":
            if record.state == _S.PAUSED:
                return resume_step(cls.row(record.state, _I.RESUME), record, now, who, audit)
            chosen = gated_draft(record, rounds)
        if chosen is None:
            error = str(decision.get("error_code") or "")
            reason = f"HITL {action} by {who}: {why}" if action != "modify" else (
                f"HITL modify by {who} names no draft of this negotiation: {why}")  # fmt: skip
            return abort_step(cls.row(record.state, _I.ABORT), record, now, by=who, reason=reason,
                          error_code=error, stop=record.stop_reason, hitl=audit)  # fmt: skip
        stop = StopReason(record.stop_reason) if record.stop_reason else StopReason.THRESHOLD_MET
        return accept_step(cls.row(record.state, _I.HITL_ACCEPT), record, chosen, now,
                       decided_by=by, stop=stop, rationale=f"HITL {action} by {who}: {why}",
                       hitl=audit, actor=who)  # fmt: skip

    @classmethod
    def decide(
        cls,
        record: NegotiationRecord,
        rounds: Sequence[RoundRecord],
        *,
        by: str,
        decided_by: str,
        content_type: str,
        result: bytes,
        now: float,
    ) -> NegotiationStep:
        """An explicit Decide (the opener or an operator): the result given, or, when it is
        empty, the latest draft."""
        row = cls.row(record.state, _I.DECIDE)
        label = decided_by or "policy"
        if label not in DECIDED_BY:
            raise ValidationError.for_field(
                "decided_by", f"must be one of {', '.join(DECIDED_BY)}, got {decided_by!r}"
            )
        if not result:
            if not rounds:
                raise ValidationError.for_field("result", "is required before any draft")
            latest = rounds[-1]
            content_type, result, chosen = latest.content_type, latest.payload, latest.round
        else:
            chosen = next((r.round for r in reversed(rounds) if r.payload == result), 0)
        current = next((r for r in rounds if r.round == chosen), None)
        score = candidate_score(current) if current else None
        stop = record.stop_reason or "decided"
        decision = {
            "decided_by": label, "final_score": score, "stop_reason": stop,
            "rationale": f"decided by {by}", "version": version(chosen) if chosen else "",
            "content_type": content_type, "result_b64": b64(result), "decided_at": now,
            "by": by,
        }  # fmt: skip
        return end_step(row, record, decision, now, by, content_type, result)

    @classmethod
    def abort(
        cls, record: NegotiationRecord, *, by: str, reason: str, now: float, error_code: str = ""
    ) -> NegotiationStep:
        """Abort (a participant, the opener or an operator)."""
        if NegotiationState(record.state).terminal:
            raise AlreadyCompletedError(
                f"negotiation {record.negotiation_id} already ended {record.state}",
                {"negotiation_id": record.negotiation_id, "state": record.state},
            )
        row = cls.row(record.state, _I.ABORT)
        return abort_step(row, record, now, by=_required(by, "by"),
                      reason=_required(reason, "reason"), error_code=error_code)  # fmt: skip


# --- helpers ----------------------------------------------------------------------------------


def _participants(values: Sequence[str]) -> tuple[str, ...]:
    if isinstance(values, str):
        raise ValidationError.for_field("participants", "must be a list of agent ids")
    members = tuple(values)
    for agent in members:
        _required(agent, "participants")
    if len(set(members)) != len(members):
        raise ValidationError.for_field("participants", "lists an agent twice")
    if len(members) < 2:
        raise ValidationError.for_field("participants", "a negotiation needs at least two")
    return members


def _required(value: object, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValidationError.for_field(name, "is required")
    return value


def _unit(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValidationError.for_field(name, f"must be a number in [0, 1], got {value!r}")
    return float(value)


def mermaid() -> str:
    """The state diagram of the table, for the docs."""
    ended = (s for s in NegotiationState if s.terminal)
    return NegotiationMachine.TRANSITIONS.mermaid(
        (OPEN_ROW.state,), ended, lambda row: row.state, loops=True, entry="OPEN"
    )
