"""A round of a negotiation (RFC 17.1-17.3): the step that admits a draft (its round record,
the contract and diff artifacts, the fanout event) and the step that records one evaluation
of it (the blended score, the round's unanimity score, the score artifact).

`NegotiationMachine.submit` and `.evaluate` check the input and pick the row; these build
what the row does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from apiary.core.dedup import iso_utc
from apiary.core.negotiation.delta import NO_CHANGE, Delta, diff_document
from apiary.core.negotiation.events import b64, encode, event
from apiary.core.negotiation.policy import NegotiationPolicy
from apiary.core.negotiation.records import NegotiationRecord, RoundRecord
from apiary.core.negotiation.scoring import (
    blend,
    estimate_tokens,
    evaluators,
    repeats,
    unanimity_score,
)
from apiary.core.negotiation.validation import DraftCheck
from apiary.core.negotiation.vocabulary import (
    Draft,
    NegotiationStep,
    Row,
    artifact_record,
    policy_of,
    step_details,
    version,
)


def admitted_step(
    row: Row,
    record: NegotiationRecord,
    rounds: Sequence[RoundRecord],
    draft: Draft,
    check: DraftCheck,
    tokens: int,
    delta: Delta | None,
    now: float,
    policy: NegotiationPolicy,
) -> NegotiationStep:
    """A checked draft takes the next round; `delta` is its change from the previous draft
    (None for the first)."""
    n = record.round + 1
    oscillations = record.oscillations + repeats(rounds, draft.content_type, draft.payload)
    summary = delta.summary if delta else NO_CHANGE
    new_round = RoundRecord(
        negotiation_id=record.negotiation_id, round=n,
        kind="counter" if draft.counter else "propose", from_agent=draft.from_agent,
        content_type=draft.content_type, payload=draft.payload, submitted_at=now,
        tokens=tokens, checks=check.to_json(), delta=summary.to_json() if delta else {},
    )  # fmt: skip
    new = replace(
        record, state=row.state.value, updated_at=now, round=n,
        round_deadline=now + policy.round_timeout_ms / 1000,
        tokens_spent=record.tokens_spent + tokens, oscillations=oscillations,
    )  # fmt: skip
    artifacts = [
        artifact_record(new, "contract", version(n), draft.content_type, draft.payload, now)
    ]
    if delta is not None:
        doc = diff_document(delta, version(n - 1), version(n))
        artifacts.append(
            artifact_record(new, "diff", f"{version(n - 1)}_to_{version(n)}",
                            "application/json", encode(doc), now)
        )  # fmt: skip
    kind = new_round.kind
    fan = event(
        kind, iso_utc(now), **{"from": draft.from_agent}, ct=draft.content_type,
        payload_b64=b64(draft.payload), negotiation_id=new.negotiation_id, round=n,
        version=version(n), delta=new_round.delta, checks=new_round.checks,
    )  # fmt: skip
    details = step_details(
        record,
        new,
        draft.from_agent,
        round=n,
        kind=kind,
        version=version(n),
        tokens=tokens,
        delta=new_round.delta,
        check_score=check.score,
        repeated=oscillations > record.oscillations,
    )
    return NegotiationStep(new, row.effects, (row.event_type, details), new_round,
                           tuple(artifacts), (fan,))  # fmt: skip


def evaluation_step(
    row: Row,
    record: NegotiationRecord,
    current: RoundRecord,
    from_agent: str,
    own: float,
    llm_confidence: float | None,
    notes: str,
    now: float,
) -> NegotiationStep:
    """`from_agent`'s checked score `own` of the current draft, blended with the draft's
    check score and the LLM confidence."""
    policy = policy_of(record)
    check_score = float(current.checks.get("check_score", 1.0))
    deterministic = round(own * check_score, 6)
    confidence = llm_confidence if llm_confidence is not None else current.llm_confidence
    blended = blend(deterministic, confidence, policy.llm_weight)
    report = {
        "from_agent": from_agent, "deterministic_score": deterministic,
        "llm_confidence": confidence, "notes": notes, "delta": dict(current.delta),
        "score": blended, "submitted_score": own, "check_score": check_score,
        "at": now,
    }  # fmt: skip
    evaluations = {**current.evaluations, from_agent: report}
    required = evaluators(record.participants, current.from_agent)
    scored = replace(current, evaluations=evaluations, score=unanimity_score(evaluations, required))
    tokens = estimate_tokens(len(notes.encode("utf-8")))
    new = replace(record, updated_at=now, tokens_spent=record.tokens_spent + tokens)
    n = current.round
    artifact = artifact_record(new, "score", f"{version(n)}.{from_agent}", "application/json",
                               encode({"round": n, **report}), now)  # fmt: skip
    fan = event(
        "evaluate", iso_utc(now), **{"from": from_agent}, score=blended, notes=notes,
        negotiation_id=record.negotiation_id, round=n, version=version(n),
        deterministic_score=deterministic, llm_confidence=confidence,
    )  # fmt: skip
    details = step_details(record, new, from_agent, round=n, version=version(n), score=blended,
                           deterministic_score=deterministic, llm_confidence=confidence,
                           round_score=scored.score)  # fmt: skip
    return NegotiationStep(new, row.effects, (row.event_type, details), scored,
                           (artifact,), (fan,))  # fmt: skip
