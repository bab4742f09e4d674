"""Agent handoffs (RFC 17.6): the engine that performs the handoff machine's steps.

`request` validates a RequestHandoff against the registry (an unknown or incapable target,
or a snapshot type the target does not take, is refused naming the field), routes it by
capability when it names no target, and offers it; `accept`, `reject` and `complete` apply
the answers; an expiry timer per pending offer (engine/timers.py, on the injected clock)
expires it; a rejected or expired handoff is rerouted to an alternative capable agent while
the policy allows. Every step is stored, in the event log (with a `handoff.context_revoked`
event for each agent whose access to the snapshot ended), and notified to the parties as
coordinator NOTIFICATION envelopes through the router. `load` re-arms the timers of the
pending offers after a restart.

Callers identify themselves with `caller` (the `sw4rm-agent-id` call metadata). A caller
that does not is taken to act for the party the call is for (the target for accept and
reject, the origin for complete), as the canonical messages carry no identity; one that
does may act only as itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial
from typing import Any, Final

from apiary.core.clock import Clock
from apiary.core.dedup import iso_utc
from apiary.core.events import EventDraft
from apiary.core.handoff import (
    COORDINATOR,
    HandoffEffect,
    HandoffMachine,
    HandoffState,
    HandoffStep,
    check_read,
    refusal,
)
from apiary.core.handoff_request import (
    Candidate,
    HandoffDraft,
    HandoffPolicy,
    check_target,
    choose_target,
    validate_draft,
)
from apiary.core.ids import IdGenerator
from apiary.core.machine import IllegalTransitionError
from apiary.core.records import HandoffRecord
from apiary.engine.deadlines import Sleep, run_deadlines
from apiary.engine.eventlog import EventRecorder
from apiary.engine.notices import NoticeFactory
from apiary.engine.registry import Registry
from apiary.engine.router.router import Router
from apiary.engine.timers import Timers
from apiary.errors import (
    AlreadyExistsError,
    NoRouteError,
    NotFoundError,
    PermissionDeniedError,
    ValidationError,
)
from apiary.store.protocols import HandoffStore

log = logging.getLogger("apiary.handoff")

ALL: Final = 1_000_000
"""A listing limit meaning "every one": open handoffs are few next to this."""
_PENDING: Final = frozenset({HandoffState.PENDING.value})
_OPEN: Final = frozenset({s.value for s in HandoffState if s.open})
_F = HandoffEffect


class Handoffs:
    """The handoff service's engine over one store, registry and router."""

    def __init__(
        self,
        store: HandoffStore,
        registry: Registry,
        router: Router,
        notices: NoticeFactory,
        events: EventRecorder,
        clock: Clock,
        ids: IdGenerator,
        policy: HandoffPolicy | None = None,
    ) -> None:
        self.policy = policy or HandoffPolicy()
        self.timers = Timers()
        """One expiry timer per pending offer, keyed by request_id."""
        self._store = store
        self._registry = registry
        self._router = router
        self._notices = notices
        self._events = events
        self._clock = clock
        self._ids = ids
        # One transition at a time: an answer and the expiry of the same offer must not race.
        self._lock = asyncio.Lock()

    async def load(self) -> int:
        """Re-arm the expiry timer of every pending offer (at start-up); returns how many.
        Offers whose deadline passed while the coordinator was down expire at the next
        `fire_due`."""
        pending = await self._store.list(_PENDING, limit=ALL)
        for record in pending:
            self.timers.arm(record.request_id, record.deadline)
        return len(pending)

    # ------------------------------------------------------------------ requests

    async def request(self, draft: HandoffDraft, *, caller: str = "") -> HandoffRecord:
        """Validate and offer a handoff (RFC 17.6 RequestHandoff); returns it PENDING.

        Without a request_id the coordinator assigns one (the origin learns it from the
        `handoff.requested` notification). The same request again is answered with the
        stored handoff; another request under a taken request_id is already_exists.
        """
        if not draft.request_id:
            draft = replace(draft, request_id=self._ids.new_id())
        self._router.check_flow_id("request_id", draft.request_id)
        draft = validate_draft(draft, self.policy)
        _same_agent(caller, draft.from_agent, "from_agent", "hand off for")
        async with self._lock:
            existing = await self._store.get(draft.request_id)
            if existing is not None:
                if _same_request(existing, draft):
                    return existing
                raise AlreadyExistsError(
                    f"request_id: handoff {draft.request_id} exists already",
                    {"field": "request_id", "request_id": draft.request_id},
                )
            if self._registry.known(draft.from_agent) is None:
                raise NotFoundError(
                    f"from_agent: no registered agent {draft.from_agent!r}",
                    {"field": "from_agent", "agent_id": draft.from_agent},
                )
            target = await self._target(draft)
            step = HandoffMachine.open(draft, to_agent=target, now=self._clock.now())
            await self._perform(step)
        return step.record

    async def _target(self, draft: HandoffDraft) -> str:
        """The named target once checked, or the capability-based choice."""
        if draft.to_agent:
            agent = self._registry.known(draft.to_agent)
            if agent is None:
                raise NoRouteError(
                    f"to_agent: no registered agent {draft.to_agent!r}",
                    {"field": "to_agent", "agent_id": draft.to_agent},
                )
            check_target(draft, Candidate.from_descriptor(agent.agent_id, agent.descriptor))
            return draft.to_agent
        chosen = choose_target(draft, await self._candidates(), await self._open_load())
        if chosen is None:
            wanted = ", ".join(draft.capabilities_required)
            raise NoRouteError(
                f"capabilities_required: no available agent has every one of: {wanted}"
                + _typed(draft.snapshot_content_type),
                {"field": "capabilities_required", "capabilities_required": wanted},
            )
        return chosen

    # ------------------------------------------------------------------ answers

    async def accept(
        self, request_id: str, *, accepting_agent: str = "", caller: str = ""
    ) -> HandoffRecord:
        """The target takes the work (AcceptHandoff)."""
        return await self._answer(
            request_id,
            lambda r, now: HandoffMachine.accept(
                r, by=_actor(caller, accepting_agent, r.to_agent, "accepting_agent"), now=now
            ),
        )

    async def reject(
        self, request_id: str, reason: str, *, rejecting_agent: str = "", caller: str = ""
    ) -> HandoffRecord:
        """The target declines with a reason (RejectHandoff); the handoff may be rerouted."""
        return await self._answer(
            request_id,
            lambda r, now: HandoffMachine.reject(
                r, by=_actor(caller, rejecting_agent, r.to_agent, "accepting_agent"),
                reason=reason, now=now,
            ),
        )  # fmt: skip

    async def complete(
        self, request_id: str, status: HandoffState | str, *, caller: str = ""
    ) -> HandoffRecord:
        """The context was transferred (CompleteHandoff with status COMPLETED): the origin's
        access to it ends."""
        if status != HandoffState.COMPLETED:
            raise ValidationError.for_field(
                "status",
                f"must be COMPLETED, got {status or 'HANDOFF_STATUS_UNSPECIFIED'}: the other "
                "states are reached by RequestHandoff, AcceptHandoff, RejectHandoff and expiry",
            )
        return await self._answer(
            request_id,
            lambda r, now: HandoffMachine.complete(r, by=caller or r.from_agent, now=now),
        )

    async def _answer(
        self, request_id: str, transition: Callable[[HandoffRecord, float], HandoffStep]
    ) -> HandoffRecord:
        async with self._lock:
            record = await self._get(request_id)
            try:
                step = transition(record, self._clock.now())
            except IllegalTransitionError as exc:
                raise refusal(exc, record) from None
            await self._perform(step)
            return step.record

    # ------------------------------------------------------------------ reads

    async def pending(self, agent_id: str, *, caller: str = "") -> list[HandoffRecord]:
        """The offers waiting for `agent_id`'s answer (GetPendingHandoffs), most urgent
        first (priority, then age). Only the agent itself may read them: they carry the
        context snapshots."""
        if not agent_id:
            raise ValidationError.for_field("agent_id", "is required")
        _same_agent(caller, agent_id, "agent_id", "read the pending handoffs of")
        now = self._clock.now()
        found = await self._store.list(_PENDING, to_agent=agent_id, limit=ALL)
        offers = [r for r in found if r.deadline > now]  # expired, whatever the timer says
        for record in offers:
            check_read(record, agent_id)
        return sorted(offers, key=lambda r: (r.priority, r.created_at, r.request_id))

    async def get(
        self, request_id: str, *, caller: str = "", include_snapshot: bool = False
    ) -> HandoffRecord:
        """One handoff; with `include_snapshot` only for an agent that may read the context
        (permission_denied otherwise: the origin after completion, a rejecting target)."""
        record = await self._get(request_id)
        if include_snapshot:
            check_read(record, caller)
        return record

    async def search(
        self,
        states: Iterable[HandoffState] | None = None,
        *,
        from_agent: str | None = None,
        to_agent: str | None = None,
        limit: int = 100,
    ) -> list[HandoffRecord]:
        """Handoffs in `states` (all when None) from/to the agents given, oldest first."""
        wanted = None if states is None else frozenset(s.value for s in states)
        return await self._store.list(wanted, from_agent=from_agent, to_agent=to_agent, limit=limit)

    async def _get(self, request_id: str) -> HandoffRecord:
        if not request_id:
            raise ValidationError.for_field("request_id", "is required")
        record = await self._store.get(request_id)
        if record is None:
            raise NotFoundError(
                f"request_id: no handoff {request_id!r}",
                {"field": "request_id", "request_id": request_id},
            )
        return record

    # ------------------------------------------------------------------ time

    async def fire_due(self) -> int:
        """Expire the offers whose deadline passed; returns how many timers fired."""
        fired = 0
        async with self._lock:
            for request_id in self.timers.due(self._clock.now()):
                fired += 1
                record = await self._store.get(request_id)
                if record is None or record.state != HandoffState.PENDING:
                    continue
                await self._perform(HandoffMachine.expire(record, now=self._clock.now()))
        return fired

    async def run(self, sleep: Sleep) -> None:
        """Forever: expire offers when their deadlines come (`sleep` from the runtime)."""
        await run_deadlines(self.timers, self._clock, self.fire_due, sleep)

    # ------------------------------------------------------------------ effects

    async def _perform(self, step: HandoffStep) -> None:
        record = step.record
        # The step's events (EMIT_EVENT, REVOKE_CONTEXT) commit with its record: never one
        # without the other. A step that stores nothing appends them by the flusher.
        events = [draft for effect in step.effects for draft in self._drafts(step, effect)]
        if _F.PERSIST not in step.effects:
            for draft in events:
                self._events.queue(draft)
        for effect in step.effects:
            if effect is _F.PERSIST:
                await self._events.commit(events, partial(self._store.put, record))
            elif effect is _F.START_TIMER:
                self.timers.arm(record.request_id, record.deadline)
            elif effect is _F.CANCEL_TIMER:
                self.timers.cancel(record.request_id)
            elif effect is _F.NOTIFY_TARGET:
                await self._notify(step.target, step, record)
            elif effect is _F.NOTIFY_ORIGIN:
                await self._notify(record.from_agent, step, record)
            elif effect is _F.REROUTE:
                await self._reroute(record)

    def _drafts(self, step: HandoffStep, effect: HandoffEffect) -> list[EventDraft]:
        """The events of one of the step's effects: its transition's, or one
        `handoff.context_revoked` per agent whose access to the snapshot ended."""
        record = step.record
        if effect is _F.EMIT_EVENT and step.event is not None:
            kind, details = step.event
            return [
                self._events.draft(
                    kind, details["by"], correlation_id=record.request_id,
                    agent_id=record.from_agent, **details,
                )
            ]  # fmt: skip
        if effect is _F.REVOKE_CONTEXT:
            return [
                self._events.draft(
                    "handoff.context_revoked", COORDINATOR, correlation_id=record.request_id,
                    agent_id=agent_id, request_id=record.request_id, state=record.state,
                    holders=list(record.context_holders),
                )
                for agent_id in step.revoked
            ]  # fmt: skip
        return []

    async def _notify(self, agent_id: str, step: HandoffStep, record: HandoffRecord) -> None:
        """A NOTIFICATION about this step; nobody is told what they did themselves."""
        if not agent_id or agent_id == step.actor or step.event is None:
            return
        env = self._notices.notification(notice_body(step.event[0], record), record.request_id)
        outcome = await self._router.notify(agent_id, env)
        if not outcome.accepted:
            log.info("handoff %s: %s not notified: %s", record.request_id, agent_id, outcome.reason)

    async def _reroute(self, record: HandoffRecord) -> None:
        """Offer a rejected or expired handoff to an alternative capable agent, if the policy
        allows and one exists; otherwise its state is final: recorded (with why) and told to
        the origin as `handoff.not_rerouted`."""
        why = ""
        target = None
        if not self.policy.reroute:
            why = "rerouting is off"
        elif not record.capabilities_required:
            why = "no capabilities_required to choose an alternative by"
        elif record.attempt >= self.policy.max_attempts:
            why = f"all {self.policy.max_attempts} attempts used"
        else:
            draft = _draft_of(record)
            target = choose_target(
                draft, await self._candidates(), await self._open_load(), exclude=record.tried
            )
            why = "no other available agent has the required capabilities"
        if target is None:
            await self._events.record(
                "handoff.not_rerouted", COORDINATOR, correlation_id=record.request_id,
                agent_id=record.from_agent, request_id=record.request_id, state=record.state,
                attempt=record.attempt, why=why,
            )  # fmt: skip
            # The origin learns that REJECTED or EXPIRED is final (a reroute says otherwise).
            body = {**notice_body("handoff.not_rerouted", record), "why": why}
            env = self._notices.notification(body, record.request_id)
            await self._router.notify(record.from_agent, env)
            return
        step = HandoffMachine.reroute(
            record, to_agent=target, now=self._clock.now(), max_attempts=self.policy.max_attempts
        )
        await self._perform(step)

    async def _candidates(self) -> list[Candidate]:
        return [
            Candidate.from_descriptor(a.agent_id, a.descriptor, a.state)
            for a in await self._registry.list()
        ]

    async def _open_load(self) -> Counter[str]:
        return Counter(r.to_agent for r in await self._store.list(_OPEN, limit=ALL))


def notice_body(event_type: str, record: HandoffRecord) -> dict[str, Any]:
    """The JSON payload of a handoff NOTIFICATION: what the parties need to act, without the
    snapshot (a target reads it with GetPendingHandoffs or GetHandoff)."""
    return {
        "event": event_type,
        "request_id": record.request_id,
        "from_agent": record.from_agent,
        "to_agent": record.to_agent,
        "state": record.state,
        "attempt": record.attempt,
        "reason": record.reason,
        "capabilities_required": list(record.capabilities_required),
        "priority": record.priority,
        "snapshot_content_type": record.snapshot_content_type,
        "snapshot_size": len(record.context_snapshot),
        "deadline": iso_utc(record.deadline),
        "accepting_agent": record.accepting_agent,
        "rejection_reason": record.rejection_reason,
        "tried": list(record.tried),
    }


def _actor(caller: str, named: str, default: str, field: str) -> str:
    """Who acts: the identified caller, else the agent the request names, else `default`."""
    if caller and named and caller != named:
        raise PermissionDeniedError(
            f"{field}: the caller {caller} cannot answer as {named}",
            {"field": field, "agent_id": caller},
        )
    return caller or named or default


def _same_agent(caller: str, named: str, field: str, what: str) -> None:
    if caller and caller != named:
        raise PermissionDeniedError(
            f"{field}: {caller} cannot {what} {named}", {"field": field, "agent_id": caller}
        )


def _same_request(record: HandoffRecord, draft: HandoffDraft) -> bool:
    return (
        record.from_agent, record.requested_to, record.reason, record.context_snapshot,
        record.snapshot_content_type, record.capabilities_required, record.priority,
        record.timeout_s,
    ) == (
        draft.from_agent, draft.to_agent, draft.reason, draft.context_snapshot,
        draft.snapshot_content_type, draft.capabilities_required, draft.priority,
        draft.timeout_s,
    )  # fmt: skip


def _draft_of(record: HandoffRecord) -> HandoffDraft:
    """The request a stored handoff was made from, routed by capability."""
    return HandoffDraft(
        request_id=record.request_id, from_agent=record.from_agent, reason=record.reason,
        context_snapshot=record.context_snapshot,
        snapshot_content_type=record.snapshot_content_type,
        capabilities_required=record.capabilities_required, priority=record.priority,
        timeout_s=record.timeout_s,
    )  # fmt: skip


def _typed(content_type: str) -> str:
    return f" and takes {content_type}" if content_type else ""
