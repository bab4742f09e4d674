"""The HITL side of negotiations (RFC 15, 15.4, 17): the gates' and the deadlock's
escalations (what they tell operators), which draft an operator's decision accepts, and how
SchedulerPolicyService.HitlAction actions name a draft ("decide=v2", "accept=frontend").

Decisions this module makes where the RFC is silent:
- A deadlock escalation suggests "approve": accept the best-scored draft (the tie-break
  winner). Its context carries that draft's score as "score", so the RFC 15.4
  AUTO_DECIDE_THRESHOLD fallback accepts it when the score reaches the auto-approve
  threshold and aborts otherwise; DENY_BY_DEFAULT aborts with hitl_unavailable.
- Gates escalate with reason MANUAL_OVERRIDE (the RFC has no gate reason): approve goes on
  (PauseBetweenRounds) or accepts the draft that met the threshold (PauseOnFinalAccept).
- "modify" with the patch {"accept": "v2"} (a version) or {"accept": "frontend"} (that
  agent's latest draft) accepts that draft; anything else aborts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Final

from apiary.core.negotiation.records import NegotiationRecord, RoundRecord
from apiary.core.negotiation.scoring import best_candidate, candidate_score
from apiary.core.negotiation.vocabulary import (
    Escalation,
    NegotiationState,
    NegotiationStep,
    Row,
    StopReason,
    policy_of,
    step_details,
    version,
)
from apiary.errors import ValidationError

PREVIEW_BYTES: Final = 2048
"""How much of each draft a deadlock escalation shows (the whole draft is an artifact)."""
CHOOSING_ACTIONS: Final = ("decide", "accept")


def pick_draft(rounds: Sequence[RoundRecord], choice: object) -> RoundRecord | None:
    """The draft `choice` names: a version ("v2", "2", 2) or an agent (its latest draft)."""
    if isinstance(choice, bool) or choice is None:
        return None
    text = str(choice).strip()
    number = text[1:] if text[:1] in ("v", "V") else text
    if number.isdigit():
        return next((r for r in rounds if r.round == int(number)), None)
    return next((r for r in reversed(rounds) if r.from_agent == text), None)


def gated_draft(record: NegotiationRecord, rounds: Sequence[RoundRecord]) -> RoundRecord | None:
    """What an approve accepts: the current draft after the final-accept gate, else the
    best candidate (deadlock)."""
    if record.stop_reason in ("", StopReason.THRESHOLD_MET):
        return rounds[-1] if rounds else None
    return best_candidate(rounds)


def translate_action(
    action: str, rounds: Sequence[RoundRecord]
) -> tuple[str, dict[str, Any] | None]:
    """An operator's HitlAction as (HITL action, patch): "decide=v2", "accept=v2" and
    "accept:frontend" become modify {"accept": "v2"}; other actions pass unchanged."""
    text = action.strip()
    key, sep, value = text.replace(":", "=", 1).partition("=")
    if not sep:
        return text, None
    if key.strip().lower() not in CHOOSING_ACTIONS:
        raise ValidationError.for_field(
            "action", f"use approve, deny, defer, or decide=<version or agent>, not {action!r}"
        )
    chosen = pick_draft(rounds, value)
    if chosen is None:
        known = ", ".join(f"{version(r.round)} ({r.from_agent})" for r in rounds) or "none"
        raise ValidationError.for_field(
            "action", f"{value.strip()!r} names no draft of this negotiation (drafts: {known})"
        )
    return "modify", {"accept": version(chosen.round)}


def base_context(record: NegotiationRecord) -> dict[str, Any]:
    return {"negotiation_id": record.negotiation_id, "topic": record.topic,
            "participants": list(record.participants), "round": record.round}  # fmt: skip


def deadlock_context(
    record: NegotiationRecord, rounds: Sequence[RoundRecord], why: str, best: RoundRecord | None
) -> dict[str, Any]:
    """What an operator needs to break the deadlock; "score" is the best candidate's (RFC
    15.4 AUTO_DECIDE_THRESHOLD compares it with the auto-approve threshold)."""
    candidates = [
        {"version": version(r.round), "from": r.from_agent, "kind": r.kind,
         "score": candidate_score(r), "content_type": r.content_type,
         "preview": r.payload[:PREVIEW_BYTES].decode("utf-8", "replace")}
        for r in rounds
    ]  # fmt: skip
    return {
        **base_context(record), "gate": "deadlock", "stop_reason": record.stop_reason,
        "cause": why, "candidates": candidates,
        "score": candidate_score(best) if best else None,
        "suggested_version": version(best.round) if best else "",
    }  # fmt: skip


def gate_context(record: NegotiationRecord, current: RoundRecord, gate: str) -> dict[str, Any]:
    return {**base_context(record), "gate": gate, "version": version(current.round),
            "score": current.score, "suggested_version": version(current.round)}  # fmt: skip


def escalation_for(record: NegotiationRecord, rounds: Sequence[RoundRecord]) -> Escalation:
    """The escalation a negotiation waiting for HITL needs (again, after a restart that
    came between its transition and its invocation)."""
    current = rounds[-1] if rounds else None
    if record.state == NegotiationState.PAUSED and current is not None:
        context = gate_context(record, current, "between_rounds")
        return Escalation("MANUAL_OVERRIDE", "between_rounds", context)
    if record.stop_reason == StopReason.THRESHOLD_MET and current is not None:
        return Escalation("MANUAL_OVERRIDE", "final_accept",
                          gate_context(record, current, "final_accept"))  # fmt: skip
    best = best_candidate(rounds)
    context = deadlock_context(record, rounds, record.stop_reason, best)
    return Escalation("DEBATE_DEADLOCK", "deadlock", context)


def hitl_audit(decision: Mapping[str, Any], invocation_id: str) -> dict[str, Any]:
    """What the negotiation's decision record keeps of a HITL decision (RFC 15.4: whether a
    fallback decided, the policy applied and when)."""
    keys = ("action", "decided_by", "decided_at", "via", "fallback", "policy", "applied",
            "error_code", "rationale")  # fmt: skip
    return {"invocation_id": invocation_id, **{k: decision.get(k) for k in keys}}


def final_gate_step(
    row: Row, record: NegotiationRecord, current: RoundRecord, now: float
) -> NegotiationStep:
    """PauseOnFinalAccept: the draft met the threshold; HITL confirms it."""
    new = replace(record, state=row.state.value, updated_at=now, round_deadline=0.0,
                  stop_reason=StopReason.THRESHOLD_MET.value)  # fmt: skip
    context = gate_context(new, current, "final_accept")
    details = step_details(record, new, "scheduler", round=current.round, score=current.score)
    escalation = Escalation("MANUAL_OVERRIDE", "final_accept", context)
    return NegotiationStep(new, row.effects, (row.event_type, details), escalation=escalation)


def pause_step(
    row: Row, record: NegotiationRecord, current: RoundRecord, now: float
) -> NegotiationStep:
    """PauseBetweenRounds: the round closed below the threshold; HITL lets it go on."""
    new = replace(record, state=row.state.value, updated_at=now, round_deadline=0.0)
    context = gate_context(new, current, "between_rounds")
    details = step_details(record, new, "scheduler", round=current.round, score=current.score)
    escalation = Escalation("MANUAL_OVERRIDE", "between_rounds", context)
    return NegotiationStep(new, row.effects, (row.event_type, details), escalation=escalation)


def resume_step(
    row: Row, record: NegotiationRecord, now: float, who: str, audit: Mapping[str, Any]
) -> NegotiationStep:
    policy = policy_of(record)
    new = replace(record, state=row.state.value, updated_at=now, invocation_id="",
                  round_deadline=now + policy.round_timeout_ms / 1000)  # fmt: skip
    details = step_details(record, new, who, hitl=dict(audit))
    return NegotiationStep(new, row.effects, (row.event_type, details))
