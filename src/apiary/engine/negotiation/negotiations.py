"""Scheduler-mediated negotiations (RFC 17, 17.1-17.4): the imperative shell around the pure
round machine of core/negotiation/machine.py.

Every input (Open, Propose, Counter, Evaluate, SubmitEvaluation, Decide, Abort, a NEGOTIATION
envelope addressed to the Scheduler, a round or debate timer, a HITL decision) is applied
under the negotiation's lock: the machine decides, this module performs the effects in
order (store with artifacts and the events recording the change in one transaction, timers,
fanout to the participants, HITL escalation).
Open negotiations live in memory and in the store; `load()` after a restart re-arms their
timers and waits again for the HITL invocations they were waiting for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from apiary.core.clock import Clock
from apiary.core.dedup import iso_utc
from apiary.core.envelope import Envelope, MessageType
from apiary.core.events import EventDraft
from apiary.core.machine import IllegalTransitionError
from apiary.core.negotiation.events import decode_event, event
from apiary.core.negotiation.hitl import escalation_for, translate_action
from apiary.core.negotiation.machine import NegotiationMachine
from apiary.core.negotiation.policy import (
    AgentPreferences,
    EffectivePolicy,
    debate_timeout_s,
    derive_effective,
    parse_intensity,
)
from apiary.core.negotiation.records import NegotiationRecord, RoundRecord
from apiary.core.negotiation.validation import ValidationRules
from apiary.core.negotiation.vocabulary import (
    Draft,
    Escalation,
    NegotiationEffect,
    NegotiationState,
    NegotiationStep,
    member,
    policy_of,
)
from apiary.engine.artifacts import Artifacts
from apiary.engine.artifacts import check as check_artifact
from apiary.engine.eventlog import EventRecorder
from apiary.engine.hitl import Hitl
from apiary.engine.negotiation.fanout import Fanout
from apiary.engine.negotiation.inference import DebateInference, RuleDebateInference, consult
from apiary.engine.negotiation.policies import NegotiationSettings, PolicyBook
from apiary.engine.notices import SCHEDULER, NoticeFactory
from apiary.engine.registry import Registry
from apiary.engine.router.router import Router
from apiary.engine.timers import Timers
from apiary.errors import (
    AlreadyCompletedError,
    AlreadyExistsError,
    NotFoundError,
    PermissionDeniedError,
    ValidationError,
)
from apiary.store.protocols import Store

log = logging.getLogger("apiary.negotiations")
_F = NegotiationEffect
_WAITING = frozenset({NegotiationState.PAUSED.value, NegotiationState.AWAITING_HITL.value})
_OPEN = frozenset(s.value for s in NegotiationState if not s.terminal)


class Negotiations:
    def __init__(
        self,
        store: Store,
        router: Router,
        registry: Registry,
        notices: NoticeFactory,
        events: EventRecorder,
        clock: Clock,
        hitl: Hitl,
        settings: NegotiationSettings | None = None,
        inference: DebateInference | None = None,
    ) -> None:
        self.settings = settings or NegotiationSettings()
        self._store = store.negotiations
        self._registry = registry
        self._check_flow_id = router.check_flow_id
        self._events = events
        self._clock = clock
        self._hitl = hitl
        self.inference = inference or RuleDebateInference()
        self.policies = PolicyBook(store.negotiations, events, clock, self.settings)
        limit = router.settings.limits.limit_for(MessageType.DATA)
        self.artifacts = Artifacts(store.artifacts, events, clock, limit)
        self._fanout = Fanout(router, notices, events)
        self._open: dict[str, NegotiationRecord] = {}
        self._rounds: dict[str, list[RoundRecord]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._timers = Timers()
        self._background: set[asyncio.Future[None]] = set()

    # ------------------------------------------------------------------ start-up

    async def load(self) -> int:
        """Resume open negotiations after a (re)start; returns how many."""
        await self.policies.load()
        records = await self._store.list(_OPEN, limit=1 << 62)
        for record in records:
            rounds = await self._store.rounds(record.negotiation_id)
            self._open[record.negotiation_id] = record
            self._rounds[record.negotiation_id] = rounds
            self._sync_timer(record)
            if record.state in _WAITING:
                if record.invocation_id:
                    self._spawn(self._await_hitl(record.negotiation_id, record.invocation_id))
                else:  # stopped between the transition and the escalation
                    await self._escalate(record, escalation_for(record, rounds))
        return len(records)

    # ------------------------------------------------------------------ reads

    async def get(self, negotiation_id: str) -> NegotiationRecord:
        found = self._open.get(negotiation_id) or await self._store.get(negotiation_id)
        if found is None:
            raise NotFoundError(
                f"negotiation_id: no negotiation {negotiation_id!r}",
                {"field": "negotiation_id", "negotiation_id": negotiation_id},
            )
        return found

    async def rounds(self, negotiation_id: str) -> list[RoundRecord]:
        await self.get(negotiation_id)
        cached = self._rounds.get(negotiation_id)
        return list(cached) if cached is not None else await self._store.rounds(negotiation_id)

    async def list(
        self, states: frozenset[str] | None = None, limit: int = 100
    ) -> list[NegotiationRecord]:
        return await self._store.list(states, limit=limit)

    async def effective(self, negotiation_id: str) -> EffectivePolicy:
        return EffectivePolicy.from_json((await self.get(negotiation_id)).policy)

    # ------------------------------------------------------------------ inputs

    async def open(
        self,
        *,
        negotiation_id: str,
        topic: str,
        participants: Sequence[str],
        intensity: object,
        opened_by: str,
        debate_timeout: float = 0.0,
        correlation_id: str = "",
        profile: str = "",
        preferences: Mapping[str, AgentPreferences] | None = None,
        validation: Mapping[str, Any] | None = None,
    ) -> NegotiationRecord:
        """Open a negotiation (RFC 17): derive, persist and broadcast its EffectivePolicy."""
        self._check_flow_id("negotiation_id", negotiation_id)
        level = parse_intensity(intensity)
        name, base = self.policies.resolve(profile, level)
        prefs = dict(preferences or {})
        for agent in prefs:
            if agent not in participants:
                raise ValidationError.for_field(
                    f"preferences.{agent}", "names an agent that is not a participant"
                )
        for agent in participants:
            if isinstance(agent, str) and agent and self._registry.known(agent) is None:
                raise ValidationError.for_field(
                    "participants", f"{agent} is not a registered agent"
                )
        effective = derive_effective(base, prefs, self.policies.guardrails)
        timeout = debate_timeout_s(effective.policy, debate_timeout, self.policies.guardrails)
        rules = ValidationRules.from_json(validation)
        async with self._lock(negotiation_id):
            if negotiation_id and (
                negotiation_id in self._open or await self._store.get(negotiation_id)
            ):
                raise AlreadyExistsError(
                    f"negotiation_id: negotiation {negotiation_id!r} already exists",
                    {"field": "negotiation_id", "negotiation_id": negotiation_id},
                )
            step = NegotiationMachine.open(
                negotiation_id=negotiation_id, topic=topic, participants=participants,
                intensity=level, effective=effective, debate_timeout_s=timeout,
                now=self._clock.now(), correlation_id=correlation_id, profile=name,
                validation=rules, opened_by=opened_by,
            )  # fmt: skip
            self._rounds[negotiation_id] = []
            await self._perform(step)
            return step.record

    async def propose(
        self, negotiation_id: str, from_agent: str, content_type: str, payload: bytes, *,
        counter: bool = False,
    ) -> RoundRecord:  # fmt: skip
        """A proposal (or counter-proposal): validated first, refused without consuming a
        round when invalid (the refusal is raised after it is logged)."""
        async with self._lock(negotiation_id):
            record = await self._live(negotiation_id)
            rounds = self._rounds[negotiation_id]
            draft = Draft(from_agent, content_type or "application/json", payload, counter)
            step = self._apply(
                lambda: NegotiationMachine.submit(
                    record, rounds, draft, now=self._clock.now(), rule=self.settings.deadlock
                ),
                record,
            )
            await self._perform(step)
            if step.refusal is not None:
                raise step.refusal
            assert step.round is not None
            await self._consult(step.record)
            record = self._open.get(negotiation_id, step.record)
            if record.negotiation_id in self._open:
                await self._then(NegotiationMachine.after_draft(
                    record, self._rounds[negotiation_id], now=self._clock.now(),
                    rule=self.settings.deadlock,
                ))  # fmt: skip
            return self._round(negotiation_id, step.round.round) or step.round

    async def evaluate(
        self, negotiation_id: str, from_agent: str, score: float, notes: str = "", *,
        llm_confidence: float | None = None, score_field: str = "confidence_score",
    ) -> RoundRecord:  # fmt: skip
        """An evaluation of the current draft; closes the round once every evaluator voted."""
        async with self._lock(negotiation_id):
            record = await self._live(negotiation_id)
            rounds = self._rounds[negotiation_id]
            if not rounds:
                member(record, from_agent, "from_agent")
                raise ValidationError.for_field(
                    "negotiation_id", f"{negotiation_id} has no draft to evaluate yet"
                )
            step = self._apply(
                lambda: NegotiationMachine.evaluate(
                    record, rounds[-1], from_agent=from_agent, score=score, notes=notes,
                    now=self._clock.now(), llm_confidence=llm_confidence,
                    score_field=score_field,
                ),
                record,
            )  # fmt: skip
            await self._perform(step)
            await self._then(NegotiationMachine.close_round(
                step.record, self._rounds[negotiation_id], now=self._clock.now(),
                rule=self.settings.deadlock,
            ))  # fmt: skip
            assert step.round is not None
            return step.round

    async def decide(
        self, negotiation_id: str, *, by: str, decided_by: str, content_type: str,
        result: bytes, authorized: bool = False,
    ) -> NegotiationRecord:  # fmt: skip
        """An explicit decision by the negotiation's opener or an authenticated operator."""
        async with self._lock(negotiation_id):
            record = await self._live(negotiation_id)
            if not authorized and by != record.opened_by:
                raise PermissionDeniedError(
                    f"decided_by: only the opener ({record.opened_by or 'unknown'}) or an "
                    f"authenticated operator decides {negotiation_id}, not {by or 'anonymous'}",
                    {"field": "decided_by", "negotiation_id": negotiation_id},
                )
            step = self._apply(
                lambda: NegotiationMachine.decide(
                    record, self._rounds[negotiation_id], by=by, decided_by=decided_by,
                    content_type=content_type, result=result, now=self._clock.now(),
                ),
                record,
            )  # fmt: skip
            await self._perform(step)
            return step.record

    async def abort(
        self, negotiation_id: str, *, by: str, reason: str, authorized: bool = False
    ) -> NegotiationRecord:
        """Abort by a participant, the opener or an authenticated operator."""
        async with self._lock(negotiation_id):
            record = await self.get(negotiation_id)
            allowed = authorized or by == record.opened_by or by in record.participants
            if not allowed:
                raise PermissionDeniedError(
                    f"{by or 'anonymous'} may not abort {negotiation_id}: only its "
                    "participants, its opener or an operator",
                    {"field": "negotiation_id", "negotiation_id": negotiation_id},
                )
            step = NegotiationMachine.abort(record, by=by, reason=reason, now=self._clock.now())
            await self._perform(step)
            return step.record

    async def on_envelope(self, env: Envelope) -> None:
        """A NEGOTIATION envelope addressed to the Scheduler (RFC 17: participants exchange
        PROPOSAL/COUNTER/EVALUATION as NEGOTIATION messages): its JSON payload is a 17.1
        event (propose, counter, evaluate or abort) of the envelope's producer; the
        negotiation is its negotiation_id, else the envelope's correlation_id."""
        event = decode_event(env.payload)
        nid = event.negotiation_id or env.correlation_id
        sender = env.producer_id
        if event.sender and event.sender != sender:
            raise PermissionDeniedError(
                f"from: {sender} may not speak for {event.sender}", {"field": "from"}
            )
        if event.kind in ("propose", "counter"):
            await self.propose(nid, sender, event.content_type, event.payload(),
                               counter=event.kind == "counter")  # fmt: skip
        elif event.kind == "evaluate":
            if event.score is None:
                raise ValidationError.for_field("score", "is required (a number in [0, 1])")
            await self.evaluate(nid, sender, event.score, event.notes)
        elif event.kind == "abort":
            await self.abort(nid, by=sender, reason=event.reason or "aborted by a participant")
        else:
            raise ValidationError.for_field(
                "kind", f"participants send propose, counter, evaluate or abort, not {event.kind!r}"
            )

    async def hitl_action(
        self, negotiation_id: str, action: str
    ) -> tuple[str, str, dict[str, Any] | None]:
        """For SchedulerPolicyService.HitlAction: (invocation id, action, patch) deciding
        the invocation this negotiation waits for; "decide=v2" / "accept=agent" become a
        modify naming that draft (ValidationError naming `action` when it names none)."""
        record = await self.get(negotiation_id)
        if record.state not in _WAITING or not record.invocation_id:
            raise ValidationError.for_field(
                "negotiation_id",
                f"{negotiation_id} is {record.state}, not waiting for a HITL decision",
            )
        chosen, patch = translate_action(action, await self.rounds(negotiation_id))
        return record.invocation_id, chosen, patch

    # ------------------------------------------------------------------ time

    async def fire_due(self) -> int:
        """Apply every round and debate timeout that is due; returns how many fired."""
        fired = 0
        for negotiation_id in self._timers.due(self._clock.now()):
            async with self._lock(negotiation_id):
                record = self._open.get(negotiation_id)
                if record is None:
                    continue
                step = NegotiationMachine.timeout(
                    record, self._rounds[negotiation_id], now=self._clock.now(),
                    rule=self.settings.deadlock,
                )  # fmt: skip
                if step is None:
                    self._sync_timer(record)
                    continue
                await self._perform(step)
                fired += 1
        return fired

    def next_deadline(self) -> float | None:
        return self._timers.next()

    async def run(self, sleep: Any) -> None:
        """Forever: fire timers when due (woken when an earlier one is armed)."""
        while True:
            self._timers.changed.clear()
            await self.fire_due()
            at = self._timers.next()
            changed = asyncio.ensure_future(self._timers.changed.wait())
            timer = asyncio.ensure_future(sleep(max(0.0, at - self._clock.now()))) if at else None
            pending = {changed} | ({timer} if timer else set())
            try:
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for item in pending:
                    item.cancel()

    async def close(self) -> None:
        for job in list(self._background):
            job.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    # ------------------------------------------------------------------ effects

    async def _perform(self, step: NegotiationStep) -> None:
        record, effects = step.record, set(step.effects)
        nid = record.negotiation_id
        if _F.PERSIST in effects:
            round_ = step.round if _F.SAVE_ROUND in effects else None
            # The artifacts go with the state they came with, in one transaction: a reader
            # that sees DECIDED finds the decision report too.
            artifacts = step.artifacts if _F.APPEND_ARTIFACTS in effects else ()
            for artifact in artifacts:
                check_artifact(artifact, self.artifacts.max_bytes)
            # The step's event and the events of the artifacts added commit with the state.
            drafts = [self._draft(step)] if _F.EMIT_EVENT in effects else []
            appended = [self.artifacts.appended(a, SCHEDULER) for a in artifacts]
            await self._events.commit(
                drafts, lambda evs: self._store.save(record, round_, artifacts, evs, appended)
            )
            self._remember(record, round_)
        elif _F.EMIT_EVENT in effects:  # a refusal: nothing stored
            self._events.queue(self._draft(step))
        self._sync_timer(record)
        if _F.FANOUT in effects and step.fanout:
            await self._fanout.send(nid, record.participants, step.fanout)
        if _F.ESCALATE in effects and step.escalation is not None:
            await self._escalate(record, step.escalation)

    def _draft(self, step: NegotiationStep) -> EventDraft:
        event_type, details = step.event
        return self._events.draft(
            event_type, str(details.get("by") or SCHEDULER),
            correlation_id=step.record.negotiation_id, **details,
        )  # fmt: skip

    async def _then(self, step: NegotiationStep | None) -> None:
        if step is not None:
            await self._perform(step)

    def _remember(self, record: NegotiationRecord, round_: RoundRecord | None) -> None:
        nid = record.negotiation_id
        rounds = self._rounds.setdefault(nid, [])
        if round_ is not None:
            if rounds and rounds[-1].round == round_.round:
                rounds[-1] = round_
            else:
                rounds.append(round_)
        if NegotiationState(record.state).terminal:
            self._open.pop(nid, None)
            self._rounds.pop(nid, None)
        else:
            self._open[nid] = record

    def _sync_timer(self, record: NegotiationRecord) -> None:
        nid = record.negotiation_id
        if nid in self._open and NegotiationState(record.state).timed:
            due = [t for t in (record.deadline, record.round_deadline) if t]
            self._timers.arm(nid, min(due))
        else:
            self._timers.cancel(nid)

    async def _escalate(self, record: NegotiationRecord, escalation: Escalation) -> None:
        nid = record.negotiation_id
        invocation = await self._hitl.open(
            escalation.reason_type, escalation.context, requested_by=SCHEDULER,
            subject={"negotiation_id": nid, "gate": escalation.gate},
            suggested_action=escalation.suggested_action,
            proposed_actions=escalation.proposed_actions,
            timeout_s=self.settings.hitl_timeout_s, correlation_id=nid,
        )  # fmt: skip
        record = replace(record, invocation_id=invocation.invocation_id)
        escalated = self._events.draft(
            "negotiation.escalated", SCHEDULER, correlation_id=nid, negotiation_id=nid,
            invocation_id=invocation.invocation_id, reason_type=escalation.reason_type,
            gate=escalation.gate, hitl_state=invocation.state,
            hitl_available=self._hitl.available,
        )  # fmt: skip
        await self._events.commit([escalated], partial(self._store.save, record, None, ()))
        self._remember(record, None)
        self._spawn(self._await_hitl(nid, invocation.invocation_id))

    async def _await_hitl(self, negotiation_id: str, invocation_id: str) -> None:
        decided = await self._hitl.wait(invocation_id)
        async with self._lock(negotiation_id):
            record = self._open.get(negotiation_id)
            if record is None or record.invocation_id != invocation_id:
                return  # decided or aborted meanwhile
            step = NegotiationMachine.hitl_decided(
                record, self._rounds[negotiation_id], decided.decision, now=self._clock.now(),
                invocation_id=invocation_id,
            )  # fmt: skip
            await self._perform(step)

    async def _consult(self, record: NegotiationRecord) -> None:
        """The Inference Engine's confidence for the new draft against the previous one, after
        the deterministic checks (RFC 17.3), when the policy blends it (llm_weight > 0)."""
        nid = record.negotiation_id
        rounds = self._rounds.get(nid, [])
        policy = policy_of(record)
        if policy.llm_weight <= 0 or len(rounds) < 2 or record.negotiation_id not in self._open:
            return
        previous, current = rounds[-2], rounds[-1]
        verdict, why = await consult(
            self.inference, nid, previous.payload, current.payload, record.intensity,
            self.settings.inference_timeout_s,
        )  # fmt: skip
        if verdict is not None:
            current = replace(current, llm_confidence=verdict.confidence_score)
            consulted = self._events.draft(
                "negotiation.inference", SCHEDULER, correlation_id=nid, negotiation_id=nid,
                round=current.round, engine=self.inference.name,
                confidence_score=verdict.confidence_score, notes=verdict.notes,
            )  # fmt: skip
            await self._events.commit([consulted], partial(self._store.save, record, current, ()))
            self._remember(record, current)
            return
        await self._events.record(
            "negotiation.inference_unavailable", SCHEDULER, correlation_id=nid,
            negotiation_id=nid, round=current.round, reason=why,
        )  # fmt: skip
        if self.settings.shorten_without_inference and policy.max_rounds > record.round + 1:
            await self._shorten(record, record.round + 1)

    async def _shorten(self, record: NegotiationRecord, max_rounds: int) -> None:
        """RFC 20: with the Inference Engine unreachable, the debate ends after one more round."""
        effective = EffectivePolicy.from_json(record.policy)
        old = effective.policy.max_rounds
        effective = replace(effective, policy=replace(effective.policy, max_rounds=max_rounds))
        record = replace(record, policy=effective.to_json(), updated_at=self._clock.now())
        nid = record.negotiation_id
        shortened = self._events.draft(
            "negotiation.shortened", SCHEDULER, correlation_id=nid, negotiation_id=nid,
            from_max_rounds=old, to_max_rounds=max_rounds, reason="inference engine unavailable",
        )  # fmt: skip
        await self._events.commit([shortened], partial(self._store.save, record, None, ()))
        self._remember(record, None)
        doc = event("policy", iso_utc(self._clock.now()), negotiation_id=nid,
                    profile=record.profile, policy=effective.policy.to_json(),
                    applied=effective.to_json()["applied"])  # fmt: skip
        await self._fanout.send(nid, record.participants, [doc])

    # ------------------------------------------------------------------ helpers

    async def _live(self, negotiation_id: str) -> NegotiationRecord:
        record = self._open.get(negotiation_id)
        if record is not None:
            return record
        ended = await self.get(negotiation_id)
        raise AlreadyCompletedError(
            f"negotiation {negotiation_id} already ended {ended.state}",
            {"negotiation_id": negotiation_id, "state": ended.state},
        )

    def _apply(
        self, transition: Callable[[], NegotiationStep], record: NegotiationRecord
    ) -> NegotiationStep:
        """Run a machine transition; an input the table refuses in this state becomes a
        validation error naming the state."""
        try:
            step = transition()
        except IllegalTransitionError as exc:
            raise ValidationError.for_field(
                "negotiation_id",
                f"{record.negotiation_id} is {exc.state}: {exc.event} is not possible now",
                state=str(exc.state),
            ) from None
        return step

    def _round(self, negotiation_id: str, number: int) -> RoundRecord | None:
        return next((r for r in self._rounds.get(negotiation_id, []) if r.round == number), None)

    def _lock(self, negotiation_id: str) -> asyncio.Lock:
        found = self._locks.get(negotiation_id)
        if found is None:
            found = self._locks[negotiation_id] = asyncio.Lock()
        return found

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        job = asyncio.ensure_future(coro)
        self._background.add(job)
        job.add_done_callback(self._finished)

    def _finished(self, job: asyncio.Future[None]) -> None:
        self._background.discard(job)
        if not job.cancelled() and job.exception() is not None:
            log.error("a negotiation's HITL continuation failed", exc_info=job.exception())
