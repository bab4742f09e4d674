"""Human in the loop (RFC 15): the one escalation path every area uses.

`escalate(...)` opens an invocation and waits for its decision; operators decide through
`decide(...)` (authenticated, authorized against the invocation's approver roles); a
deadline applies the configured fallback; when no HITL component exists (RFC 15.3) or the
operators are unavailable (RFC 15.4) the configured policy decides, and the decision record
says so. Every transition is in the event log with who, when, why and what changed.
Pending invocations are stored and survive a restart with their deadlines.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from apiary.core.clock import Clock
from apiary.core.hitl.machine import HitlMachine, HitlStep
from apiary.core.hitl.payloads import invocation_payload
from apiary.core.hitl.policy import HitlPolicy
from apiary.core.hitl.vocabulary import HitlEffect, HitlState, parse_action
from apiary.core.ids import IdGenerator
from apiary.core.records import HitlRecord
from apiary.engine.eventlog import EventRecorder
from apiary.engine.notices import NoticeFactory
from apiary.engine.operators import Operator, OperatorEntry, Operators
from apiary.engine.registry import Registry
from apiary.engine.router.router import Router
from apiary.errors import NotFoundError, UnavailableError
from apiary.store.protocols import HitlStore

Sleep = Callable[[float], Awaitable[None]]
Notify = Callable[[str, HitlRecord], Awaitable[None]]
"""(event type, record) -> tell the HITL components (see HitlBroadcast)."""
CheckFlowId = Callable[[str, str], str]
"""(field, value) -> the value, or raises when it is not an acceptable correlation id."""
UNAVAILABLE_AFTER_S = 5.0
"""RFC 15.4: HITL unavailability is detected within this bound."""
HITL_CAPABILITY = "hitl"
"""Agents declaring this capability are HITL components: they receive HITL_INVOCATION
envelopes for new invocations and notifications of timeouts, fallbacks and cancellations."""


@dataclass(frozen=True, slots=True)
class HitlOpening:
    """An invocation to open, as `Hitl.open` takes it (what a replica that does not lead
    hands the leader: `HitlLeader.open`)."""

    reason_type: str
    context: Mapping[str, Any]
    requested_by: str
    subject: Mapping[str, Any]
    suggested_action: str
    proposed_actions: tuple[str, ...]
    approver_roles: tuple[str, ...]
    timeout_s: float
    correlation_id: str
    priority: int


class HitlLeader(Protocol):
    """How a replica of a cluster that does not lead reaches the leader's HITL
    (docs/cluster.md, "The leader"; `server.cluster_hitl`): each operation is the leader's,
    or refused `unavailable` when the cluster has no leader."""

    async def open(self, opening: HitlOpening) -> str:
        """The invocation opened on the leader: its id."""
        ...

    async def decide(
        self, invocation_id: str, action: str, operator: Operator, rationale: str,
        patch: Mapping[str, Any] | None,
    ) -> None:  # fmt: skip
        """The decision of `operator`, applied by the leader."""
        ...

    async def wait(self, invocation_id: str) -> HitlRecord:
        """The invocation once it is no longer pending (decided, timed out, cancelled)."""
        ...

    async def cancel(self, invocation_id: str, by: str, reason: str) -> None:
        """The invocation withdrawn: cancelled by the leader when it is still pending
        (handed over, not awaited)."""
        ...


class Hitl:
    def __init__(
        self,
        store: HitlStore,
        events: EventRecorder,
        clock: Clock,
        ids: IdGenerator,
        operators: Operators,
        policy: HitlPolicy | None = None,
        *,
        presence_required: bool = False,
        presence_window_s: float = 30.0,
        notify: Notify | None = None,
        check_flow_id: CheckFlowId | None = None,
    ) -> None:
        self.policy = policy or HitlPolicy()
        self.presence_required = presence_required
        """When set, HITL counts as available only while an operator has been active (a
        watch stream, a list or a decision) within `presence_window_s`."""
        self.presence_window_s = presence_window_s
        self.operators = operators
        self._store = store
        self._events = events
        self._clock = clock
        self._ids = ids
        self._waiters: dict[str, list[asyncio.Future[HitlRecord]]] = {}
        self._pending: dict[str, HitlRecord] = {}
        self._extended: set[str] = set()
        self._notify = notify
        self._check_flow_id: CheckFlowId = check_flow_id or _any_flow_id
        """Checks a requester's correlation_id, which the invocation's notices carry (the
        engine passes the router's `check_flow_id`: strict correlation ids)."""
        self.changed = asyncio.Condition()
        """Notified on every new invocation and every decision (operator watch streams)."""
        self.version = 0
        self.leading = True
        """False on a replica of a cluster that does not lead (docs/cluster.md, "The
        leader"): invocations are opened and decided on the leader only, whose memory holds
        their waiters; here they are handed to `leader`."""
        self.leader: HitlLeader | None = None
        """How this replica reaches the leader's HITL while it does not lead (cluster mode)."""

    def _elsewhere(self) -> HitlLeader | None:
        """The leader to hand an operation to: None while this replica leads (or is no
        replica); unavailable when it does not lead and cannot reach the leader."""
        if self.leading:
            return None
        if self.leader is None:
            raise UnavailableError(
                "this replica does not lead the cluster: HITL invocations are opened and "
                "decided on the leader",
                {"component": "hitl"},
            )
        return self.leader

    # ------------------------------------------------------------------ lifecycle

    async def load(self) -> int:
        """Re-arm every pending invocation after a (re)start; returns how many."""
        pending = await self._store.list(frozenset({HitlState.PENDING.value}), limit=10_000)
        self._pending = {r.invocation_id: r for r in pending}
        return len(pending)

    @property
    def available(self) -> bool:
        """Whether a HITL component can decide now (RFC 15.3/15.4)."""
        if not self.policy.enabled or not self.operators.configured:
            return False
        if not self.presence_required:
            return True
        return self._clock.now() - self.operators.last_seen() <= self.presence_window_s

    def now(self) -> float:
        return self._clock.now()

    # ------------------------------------------------------------------ escalation

    async def open(
        self,
        reason_type: str,
        context: Mapping[str, Any],
        *,
        requested_by: str,
        subject: Mapping[str, Any] | None = None,
        suggested_action: str = "",
        proposed_actions: Sequence[str] = (),
        approver_roles: Sequence[str] = (),
        timeout_s: float = 0.0,
        correlation_id: str = "",
        priority: int = 0,
    ) -> HitlRecord:
        leader = self._elsewhere()
        if leader is not None:
            opening = HitlOpening(
                reason_type, dict(context), requested_by, dict(subject or {}),
                suggested_action, tuple(proposed_actions), tuple(approver_roles), timeout_s,
                correlation_id, priority,
            )  # fmt: skip
            return await self.get(await leader.open(opening))
        self._check_flow_id("correlation_id", correlation_id)
        now = self._clock.now()
        step = HitlMachine.open(
            invocation_id=self._ids.new_id(), reason_type=reason_type, context=dict(context),
            requested_by=requested_by, subject=dict(subject or {}),
            suggested_action=suggested_action, proposed_actions=tuple(proposed_actions),
            approver_roles=tuple(approver_roles), policy=self.policy,
            deadline=now + (timeout_s or self.policy.default_timeout_s),
            correlation_id=correlation_id, priority=priority, now=now,
        )  # fmt: skip
        await self._perform(step)
        if step.record.state == HitlState.PENDING.value and not self.operators.configured:
            # RFC 15.3: with no HITL component, decide now by policy; never block.
            step = HitlMachine.absent(step.record, self.policy, now)
            await self._perform(step)
        return self._pending.get(step.record.invocation_id, step.record)

    async def escalate(
        self, reason_type: str, context: Mapping[str, Any], **options: Any
    ) -> HitlRecord:
        """Open an invocation and wait for its decision (operator, deadline or fallback)."""
        record = await self.open(reason_type, context, **options)
        return await self.wait(record.invocation_id)

    async def wait(self, invocation_id: str) -> HitlRecord:
        leader = self._elsewhere()
        if leader is not None:  # (its waiters are the leader's: the decision is stored)
            return await leader.wait(invocation_id)
        record = await self.get(invocation_id)
        if record.state != HitlState.PENDING.value:
            return record
        future: asyncio.Future[HitlRecord] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(invocation_id, []).append(future)
        return await future

    # ------------------------------------------------------------------ decisions

    async def decide(
        self,
        invocation_id: str,
        action: str,
        operator: Operator,
        rationale: str,
        patch: Mapping[str, Any] | None = None,
    ) -> HitlRecord:
        leader = self._elsewhere()
        if leader is not None:
            await leader.decide(invocation_id, action, operator, rationale, patch)
            return await self.get(invocation_id)
        record = await self.get(invocation_id)
        now = self._clock.now()
        self.operators.seen(operator, now)
        step = HitlMachine.decide(
            record, parse_action(action), operator=operator.name,
            operator_roles=operator.roles, rationale=rationale, patch=patch, now=now,
            policy=self.policy,
        )  # fmt: skip
        await self._perform(step)
        return step.record

    async def cancel(self, invocation_id: str, by: str, reason: str) -> HitlRecord:
        """Withdraw a pending invocation. On a replica that does not lead the leader cancels
        it a moment later: the record answered is the invocation as stored now."""
        leader = self._elsewhere()
        if leader is not None:
            await leader.cancel(invocation_id, by, reason)
            return await self.get(invocation_id)
        record = await self.get(invocation_id)
        step = HitlMachine.cancel(record, by=by, reason=reason, now=self._clock.now())
        await self._perform(step)
        return step.record

    async def get(self, invocation_id: str) -> HitlRecord:
        record = self._pending.get(invocation_id) or await self._store.get(invocation_id)
        if record is None:
            raise NotFoundError(
                f"no HITL invocation {invocation_id}", {"invocation_id": invocation_id}
            )
        return record

    async def list(self, *, include_decided: bool = False, limit: int = 100) -> list[HitlRecord]:
        if include_decided:
            return await self._store.list(None, limit=limit)
        return sorted(self._pending.values(), key=lambda r: (r.created_at, r.invocation_id))[:limit]

    # ------------------------------------------------------------------ time

    async def tick(self) -> None:
        """Apply passed deadlines, and the unavailability policy (RFC 15.4) to invocations
        that have waited longer than the detection bound with no HITL available. An
        invocation extended for unavailability (EXTEND_TIMEOUT) is retried at its new
        deadline: if HITL is still unavailable then, it is extended again or, once the
        extensions are used up, decided by the fallback."""
        now = self._clock.now()
        unavailable = not self.available
        for record in list(self._pending.values()):
            extended = record.invocation_id in self._extended
            if record.deadline <= now:
                if extended and unavailable:
                    step = HitlMachine.unavailable(record, self.policy, now, _score(record))
                else:
                    step = HitlMachine.deadline_passed(record, self.policy, now)
            elif unavailable and not extended and now - record.created_at >= UNAVAILABLE_AFTER_S:
                step = HitlMachine.unavailable(record, self.policy, now, _score(record))
            else:
                continue
            await self._perform(step)
            if step.record.state == HitlState.PENDING.value:
                self._extended.add(record.invocation_id)
            else:
                self._extended.discard(record.invocation_id)

    async def run(self, sleep: Sleep) -> None:
        """Forever: check every second (the unavailability bound is 5 s)."""
        while True:
            await sleep(1.0)
            await self.tick()

    # ------------------------------------------------------------------ effects

    async def _perform(self, step: HitlStep) -> None:
        record = step.record
        effects = set(step.effects)
        event = None
        if HitlEffect.EMIT_EVENT in effects and step.event is not None:
            event_type, details = step.event
            event = self._events.draft(
                event_type, str(details.get("by") or "coordinator"),
                correlation_id=record.correlation_id, agent_id=record.requested_by, **details,
            )  # fmt: skip
        if HitlEffect.PERSIST in effects:
            # The audit event commits with the record: never one without the other.
            events = [] if event is None else [event]
            await self._events.commit(events, partial(self._store.put, record))
        else:
            self._events.queue(event)
        if record.state == HitlState.PENDING.value:
            self._pending[record.invocation_id] = record
        else:
            self._pending.pop(record.invocation_id, None)
        if HitlEffect.NOTIFY_OPERATORS in effects and self._notify is not None:
            await self._notify(step.event[0] if step.event else "hitl.changed", record)
        if HitlEffect.RESOLVE in effects:
            for future in self._waiters.pop(record.invocation_id, []):
                if not future.done():
                    future.set_result(record)
        async with self.changed:
            self.version += 1
            self.changed.notify_all()


def _any_flow_id(_field: str, value: str) -> str:
    return value


def _score(record: HitlRecord) -> float | None:
    value = record.context.get("score", record.context.get("confidence_score"))
    return float(value) if isinstance(value, int | float) else None


@dataclass(frozen=True, slots=True)
class HitlSettings:
    """HITL configuration: TOML table [hitl] and its [[hitl.operators]] entries."""

    policy: HitlPolicy = field(default_factory=HitlPolicy)
    operators: tuple[OperatorEntry, ...] = ()
    operators_elsewhere: bool = False
    """Operators authenticate by other means too (API keys, client certificates: the
    coordinator says so in secure mode or when its key ring holds operator keys), so a HITL
    component exists even without [[hitl.operators]]."""
    presence_required: bool = False
    presence_window_s: float = 30.0


def build_hitl(
    settings: HitlSettings,
    store: HitlStore,
    events: EventRecorder,
    clock: Clock,
    ids: IdGenerator,
    *,
    notify: Notify | None = None,
    check_flow_id: CheckFlowId | None = None,
) -> Hitl:
    """The HITL component of `settings`; `notify` tells the HITL components of changes,
    `check_flow_id` checks requesters' correlation ids (both: none without them)."""
    return Hitl(
        store, events, clock, ids,
        Operators(settings.operators, elsewhere=settings.operators_elsewhere), settings.policy,
        presence_required=settings.presence_required,
        presence_window_s=settings.presence_window_s, notify=notify,
        check_flow_id=check_flow_id,
    )  # fmt: skip


class HitlBroadcast:
    """Delivers HITL_INVOCATION envelopes (and, for later steps, notifications) to every
    registered agent that declared the `hitl` capability (RFC 15: "the Scheduler MUST issue
    HITL_INVOCATION messages"; 15.4: alert operators on unavailability)."""

    def __init__(self, registry: Registry, router: Router, notices: NoticeFactory) -> None:
        self._registry = registry
        self._router = router
        self._notices = notices

    async def __call__(self, event_type: str, record: HitlRecord) -> None:
        if event_type == "hitl.opened":
            env = self._notices.hitl_invocation(invocation_payload(record), record.correlation_id)
        else:
            body = {"event": event_type, "invocation_id": record.invocation_id,
                    "state": record.state, "decision": dict(record.decision)}  # fmt: skip
            env = self._notices.notification(body, record.correlation_id)
        for agent in await self._registry.list():
            if HITL_CAPABILITY in agent.descriptor.get("capabilities", []):
                await self._router.notify(agent.agent_id, env)
