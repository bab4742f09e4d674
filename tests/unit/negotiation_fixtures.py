"""Builders shared by the negotiation machine's unit tests."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from apiary.core.negotiation.machine import NegotiationMachine
from apiary.core.negotiation.policy import EffectivePolicy, NegotiationPolicy
from apiary.core.negotiation.records import NegotiationRecord, RoundRecord
from apiary.core.negotiation.validation import ValidationRules
from apiary.core.negotiation.vocabulary import DeadlockRule, Draft, NegotiationStep

T0 = 1_754_000_000.0
JSON = "application/json"


def doc(**fields: Any) -> bytes:
    return json.dumps(fields, sort_keys=True).encode()


@dataclass
class Room:
    """A negotiation driven through the pure machine, keeping its rounds as the engine does."""

    record: NegotiationRecord
    rounds: list[RoundRecord] = field(default_factory=list)
    now: float = T0
    rule: DeadlockRule = DeadlockRule.ESCALATE
    steps: list[NegotiationStep] = field(default_factory=list)

    def apply(self, step: NegotiationStep | None) -> NegotiationStep | None:
        if step is None:
            return None
        self.steps.append(step)
        self.record = step.record
        if step.round is not None:
            if self.rounds and self.rounds[-1].round == step.round.round:
                self.rounds[-1] = step.round
            else:
                self.rounds.append(step.round)
        return step

    def draft(self, agent: str, payload: bytes, *, counter: bool = False, ct: str = JSON,
              refused: bool = False) -> NegotiationStep:  # fmt: skip
        """Submit a draft; a refusal raises unless `refused` (the test expects one)."""
        self.now += 1
        step = NegotiationMachine.submit(
            self.record, self.rounds, Draft(agent, ct, payload, counter), now=self.now,
            rule=self.rule,
        )  # fmt: skip
        self.apply(step)
        if step.refusal is not None and not refused:
            raise step.refusal
        if step.refusal is None and step.round is not None:
            self.apply(NegotiationMachine.after_draft(
                self.record, self.rounds, now=self.now, rule=self.rule))  # fmt: skip
        return step

    def vote(self, agent: str, score: float, notes: str = "", **options: Any) -> NegotiationStep:
        self.now += 1
        step = NegotiationMachine.evaluate(
            self.record, self.rounds[-1], from_agent=agent, score=score, notes=notes,
            now=self.now, **options,
        )  # fmt: skip
        self.apply(step)
        self.apply(NegotiationMachine.close_round(
            self.record, self.rounds, now=self.now, rule=self.rule))  # fmt: skip
        return step

    @property
    def state(self) -> str:
        return self.record.state

    def events(self) -> list[str]:
        return [s.event[0] for s in self.steps]


def open_room(
    participants: Sequence[str] = ("frontend", "graphql"),
    *,
    policy: NegotiationPolicy | None = None,
    validation: ValidationRules | None = None,
    debate_timeout_s: float = 600.0,
    rule: DeadlockRule = DeadlockRule.ESCALATE,
) -> Room:
    step = NegotiationMachine.open(
        negotiation_id="neg-1", topic="/api/v3/orders", participants=participants,
        intensity="HIGH", effective=EffectivePolicy(policy or NegotiationPolicy()),
        debate_timeout_s=debate_timeout_s, now=T0, validation=validation, opened_by="scheduler",
    )  # fmt: skip
    room = Room(step.record, rule=rule)
    room.steps.append(step)
    return room
