"""The vocabulary of the negotiation round machine (core/negotiation/machine.py): states,
inputs, effects, stop reasons, deadlock rules, the step a transition returns, and small
helpers every part of the machine shares."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from apiary.core.negotiation.policy import EffectivePolicy, NegotiationPolicy
from apiary.core.negotiation.records import ArtifactRecord, NegotiationRecord, RoundRecord
from apiary.errors import ApiaryError, PermissionDeniedError, ValidationError


class NegotiationState(StrEnum):
    OPEN = "OPEN"
    DELIBERATING = "DELIBERATING"
    AWAITING_COUNTER = "AWAITING_COUNTER"
    PAUSED = "PAUSED"
    AWAITING_HITL = "AWAITING_HITL"
    DECIDED = "DECIDED"
    ABORTED = "ABORTED"

    @property
    def terminal(self) -> bool:
        return self in (NegotiationState.DECIDED, NegotiationState.ABORTED)

    @property
    def timed(self) -> bool:
        """Whether round and debate timers run in this state."""
        return self in _TIMED


class NegotiationInput(StrEnum):
    PROPOSE = "PROPOSE"
    COUNTER = "COUNTER"
    EVALUATE = "EVALUATE"
    ACCEPT = "ACCEPT"
    """The round closed with every score at or above the threshold."""
    CONFIRM = "CONFIRM"
    """As ACCEPT, under the PauseOnFinalAccept gate: HITL confirms first."""
    CONTINUE = "CONTINUE"
    """The round closed below the threshold with no stop rule firing."""
    PAUSE = "PAUSE"
    """As CONTINUE, under the PauseBetweenRounds gate."""
    RESUME = "RESUME"
    DEADLOCK = "DEADLOCK"
    """A stop rule fired without acceptance: escalate with DEBATE_DEADLOCK."""
    TIE_BREAK = "TIE_BREAK"
    HITL_ACCEPT = "HITL_ACCEPT"
    DECIDE = "DECIDE"
    ABORT = "ABORT"


class NegotiationEffect(StrEnum):
    PERSIST = "PERSIST"
    SAVE_ROUND = "SAVE_ROUND"
    APPEND_ARTIFACTS = "APPEND_ARTIFACTS"
    ARM_TIMERS = "ARM_TIMERS"
    """(Re-)arm the round timer at record.round_deadline and the debate timer."""
    CANCEL_TIMERS = "CANCEL_TIMERS"
    ESCALATE = "ESCALATE"
    """Open the step's HITL invocation and wait for its decision."""
    FANOUT = "FANOUT"
    """Deliver the step's NEGOTIATION events to every participant, in order."""
    EMIT_EVENT = "EMIT_EVENT"


class StopReason(StrEnum):
    """DecisionReport.stop_reason values (policy.proto)."""

    THRESHOLD_MET = "threshold_met"
    MAX_ROUNDS = "max_rounds"
    OSCILLATION = "oscillation"
    BUDGET = "budget"
    TIMEOUT = "timeout"


class DeadlockRule(StrEnum):
    """What a stop without acceptance does (`[negotiation] deadlock`)."""

    ESCALATE = "escalate"
    """HITL with reason DEBATE_DEADLOCK (its unavailability policies apply, RFC 15.4)."""
    TIE_BREAK = "tie_break"
    """Accept the best-scored draft (decided_by "policy"); abort when none was scored."""


DECIDED_BY: Final = ("consensus", "hitl", "policy")


@dataclass(frozen=True, slots=True)
class Row:
    state: NegotiationState
    effects: tuple[NegotiationEffect, ...]
    event_type: str


@dataclass(frozen=True, slots=True)
class Draft:
    """A proposal or counter-proposal as submitted."""

    from_agent: str
    content_type: str
    payload: bytes
    counter: bool = False


@dataclass(frozen=True, slots=True)
class Escalation:
    """The HITL invocation an ESCALATE effect opens."""

    reason_type: str
    gate: str
    """deadlock | between_rounds | final_accept"""
    context: Mapping[str, Any]
    suggested_action: str = "approve"
    proposed_actions: tuple[str, ...] = ("approve", "deny", "modify")


@dataclass(frozen=True, slots=True)
class NegotiationStep:
    record: NegotiationRecord
    effects: tuple[NegotiationEffect, ...]
    event: tuple[str, dict[str, Any]]
    round: RoundRecord | None = None
    artifacts: tuple[ArtifactRecord, ...] = ()
    fanout: tuple[dict[str, Any], ...] = ()
    escalation: Escalation | None = None
    refusal: ApiaryError | None = None
    """Set when the input was refused (nothing changed but the log): answer with it."""


_TIMED: Final = frozenset(
    {NegotiationState.OPEN, NegotiationState.DELIBERATING, NegotiationState.AWAITING_COUNTER}
)


def policy_of(record: NegotiationRecord) -> NegotiationPolicy:
    """The negotiation's effective NegotiationPolicy (persisted with the room)."""
    return EffectivePolicy.from_json(record.policy).policy


def version(n: int) -> str:
    return f"v{n}"


def member(record: NegotiationRecord, agent: str, name: str) -> None:
    """PermissionDeniedError unless `agent` is a participant (naming the field)."""
    if not isinstance(agent, str) or not agent:
        raise ValidationError.for_field(name, "is required")
    if agent not in record.participants:
        raise PermissionDeniedError(
            f"{name}: {agent} is not a participant of negotiation {record.negotiation_id}",
            {"field": name, "negotiation_id": record.negotiation_id},
        )


def step_details(
    old: NegotiationRecord, new: NegotiationRecord, by: str, **extra: Any
) -> dict[str, Any]:
    return {"negotiation_id": old.negotiation_id, "by": by, "from_state": old.state,
            "to_state": new.state, **extra}  # fmt: skip


def artifact_record(
    record: NegotiationRecord, kind: str, ver: str, content_type: str, content: bytes, now: float
) -> ArtifactRecord:
    return ArtifactRecord(record.negotiation_id, kind, ver, content_type, content, now)
