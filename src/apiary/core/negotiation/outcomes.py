"""How a negotiation ends or a draft is refused: the steps that decide, abort or refuse, with
the DecisionReport, the decision artifact and the decide/abort fanout events (RFC 17.1,
17.4)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Final

from apiary.core.dedup import iso_utc
from apiary.core.negotiation.events import b64, encode, event
from apiary.core.negotiation.policy import NegotiationPolicy
from apiary.core.negotiation.records import NegotiationRecord, RoundRecord
from apiary.core.negotiation.scoring import candidate_score
from apiary.core.negotiation.vocabulary import (
    Draft,
    NegotiationEffect,
    NegotiationStep,
    Row,
    StopReason,
    artifact_record,
    step_details,
    version,
)
from apiary.errors import ValidationError


def consensus_rationale(current: RoundRecord, policy: NegotiationPolicy) -> str:
    return (
        f"every evaluator scored {version(current.round)} at or above "
        f"{policy.score_threshold:g} (lowest {current.score:g})"
    )


def stop_rule(record: NegotiationRecord, policy: NegotiationPolicy) -> StopReason | None:
    if record.oscillations > policy.oscillation_limit:
        return StopReason.OSCILLATION
    if record.round >= policy.max_rounds:
        return StopReason.MAX_ROUNDS
    if policy.total_token_budget and record.tokens_spent >= policy.total_token_budget:
        return StopReason.BUDGET
    return None


REFUSED_EFFECTS: Final = (NegotiationEffect.EMIT_EVENT,)


def accept_step(
    row: Row, record: NegotiationRecord, chosen: RoundRecord, now: float, *, decided_by: str,
    stop: StopReason, rationale: str, hitl: Mapping[str, Any] | None = None,
    actor: str = "scheduler",
) -> NegotiationStep:  # fmt: skip
    decision: dict[str, Any] = {
        "decided_by": decided_by, "final_score": candidate_score(chosen),
        "stop_reason": stop.value, "rationale": rationale, "version": version(chosen.round),
        "content_type": chosen.content_type, "result_b64": b64(chosen.payload),
        "decided_at": now, "by": actor,
    }  # fmt: skip
    if hitl:
        decision["hitl"] = dict(hitl)
    record = replace(record, stop_reason=stop.value)
    return end_step(row, record, decision, now, actor, chosen.content_type, chosen.payload)


def closed_record(
    row: Row, record: NegotiationRecord, decision: dict[str, Any], now: float
) -> NegotiationRecord:
    return replace(
        record, state=row.state.value, updated_at=now, round_deadline=0.0, invocation_id="",
        decision=decision, stop_reason=decision["stop_reason"],
    )  # fmt: skip


def end_step(
    row: Row, record: NegotiationRecord, decision: dict[str, Any], now: float, actor: str,
    content_type: str, result: bytes,
) -> NegotiationStep:  # fmt: skip
    new = closed_record(row, record, decision, now)
    report = decision_report(decision)
    artifact = artifact_record(new, "decision", "final", "application/json", encode(report), now)
    fan = event(
        "decide", iso_utc(now), by=decision["decided_by"], ct=content_type,
        result_b64=b64(result), negotiation_id=new.negotiation_id, version=decision["version"],
        final_score=decision["final_score"], stop_reason=decision["stop_reason"],
    )  # fmt: skip
    details = step_details(record, new, actor, **{k: v for k, v in decision.items()
                                              if k not in ("result_b64", "by")})  # fmt: skip
    return NegotiationStep(new, row.effects, (row.event_type, details), None, (artifact,), (fan,))


def abort_step(
    row: Row, record: NegotiationRecord, now: float, *, by: str, reason: str,
    error_code: str = "", stop: str = "", hitl: Mapping[str, Any] | None = None,
) -> NegotiationStep:  # fmt: skip
    decision: dict[str, Any] = {
        "decided_by": "", "aborted": True, "reason": reason, "error_code": error_code,
        "stop_reason": stop or record.stop_reason, "final_score": None, "rationale": reason,
        "decided_at": now, "by": by,
    }  # fmt: skip
    if hitl:
        decision["hitl"] = dict(hitl)
    new = closed_record(row, record, decision, now)
    artifact = artifact_record(new, "decision", "final", "application/json",
                         encode(decision_report(decision)), now)  # fmt: skip
    fields: dict[str, Any] = {"negotiation_id": new.negotiation_id}
    if error_code:
        fields["error_code"] = error_code
    fan = event("abort", iso_utc(now), reason=reason, **fields)
    details = step_details(record, new, by, reason=reason, error_code=error_code,
                       stop_reason=decision["stop_reason"], hitl=decision.get("hitl"))  # fmt: skip
    return NegotiationStep(new, row.effects, (row.event_type, details), None, (artifact,), (fan,))


def refused_step(
    record: NegotiationRecord, draft: Draft, why: str, checks: Mapping[str, Any], now: float
) -> NegotiationStep:
    """An invalid draft: logged, answered with validation_error, no round consumed."""
    error = ValidationError.for_field("payload", why, negotiation_id=record.negotiation_id)
    kind = "counter" if draft.counter else "propose"
    details = step_details(record, record, draft.from_agent, reason=why, checks=dict(checks),
                       kind=kind, round=record.round)  # fmt: skip
    return NegotiationStep(record, REFUSED_EFFECTS, ("negotiation.draft_refused", details),
                           refusal=error)  # fmt: skip


def decision_report(decision: Mapping[str, Any]) -> dict[str, Any]:
    """The DecisionReport (policy.proto) with what Apiary adds."""
    return {
        "decided_by": decision["decided_by"], "final_score": decision.get("final_score"),
        "rationale": decision["rationale"], "stop_reason": decision["stop_reason"],
        **{k: v for k, v in decision.items()
           if k not in ("decided_by", "final_score", "rationale", "stop_reason", "result_b64")},
    }  # fmt: skip
