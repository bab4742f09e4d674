"""Agent lifecycles (RFC 8) in the engine: the pure machine with memory, timers and effects.

`apiary.core.agent_lifecycle` decides; this module remembers each agent's state, runs the
8.3 timers (engine/timers.py, as the router's deadlines), logs every transition as an
`agent.lifecycle` event (8.3: timeout-triggered ones MUST be logged; they carry
`timeout: true`), and performs the step's effects through `LifecycleHooks`, which the
Scheduler implements: this module knows nothing of envelopes, tasks or the registry.

Decisions beyond the machine:
- The new state, its timer and its event land before any hook is awaited, so that a hook
  (or anything it wakes) already sees the agent in its new state.
- A hook that raises is logged (`agent.lifecycle_effect_failed`) and the remaining effects
  still run: a failed notification must not leave resources unreleased (8.4 "complete
  cleanup").
- A deadline that has passed applies before any later input, whether or not the timer loop
  has fired it yet: an agent reporting ready at 61 s failed its start-up at 60 s, however
  busy the loop was. Outcomes do not depend on scheduling latency.
- Automatic recovery (8.1 "MAY attempt automatic recovery") is bounded: at most
  `max_auto_recoveries` attempts in a row, counted until the agent is RUNNABLE again, so an
  agent that cannot recover stays FAILED for an operator instead of cycling for ever
  (8.1: recovery "SHOULD follow established patterns for reliability").
- A step that ends the lifecycle (DEREGISTER) forgets the agent before its hooks run, so a
  deregistration the hooks cause comes back here as a no-op instead of a second step.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Protocol

from apiary.core.agent_lifecycle import (
    DEFAULT_TIMEOUTS,
    REPORTED_FAILURES,
    TIMEOUT_INPUTS,
    AgentInput,
    AgentLifecycleMachine,
    AgentLifecycleState,
    LifecycleEffect,
    LifecycleStep,
    LifecycleTimeouts,
    auto_recovery_allowed,
    deadline_for,
    input_for_report,
    shutdown_deadline,
)
from apiary.core.clock import Clock
from apiary.engine.deadlines import run_deadlines
from apiary.engine.eventlog import EventRecorder
from apiary.engine.timers import Timers
from apiary.errors import AgentShutdownError, NotFoundError, ValidationError

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]

_S = AgentLifecycleState
_I = AgentInput
_F = LifecycleEffect
_M = AgentLifecycleMachine
_TIMEOUT_EVENTS: Final = frozenset(TIMEOUT_INPUTS.values())
_COMMANDS: Final[Mapping[AgentLifecycleState, str]] = MappingProxyType({
    _S.SUSPENDED: "suspend",
    _S.RESUMED: "resume",
    _S.SHUTTING_DOWN: "shutdown",
    _S.RECOVERING: "recover",
    _S.FAILED: "failed",
})  # fmt: skip
"""The CONTROL command telling an agent of a state the Scheduler put it in."""
_READY: Final[Mapping[AgentLifecycleState, AgentInput]] = MappingProxyType({
    _S.INITIALIZING: _I.INITIALIZED,
    _S.RECOVERING: _I.RECOVERED,
})  # fmt: skip
COORDINATOR: Final = "coordinator"


class LifecycleHooks(Protocol):
    """What the lifecycle needs done outside itself; the Scheduler implements it.

    Hooks may be called for an agent that has no task or no resources: each must then do
    nothing. `deregister` is called for an agent whose lifecycle ended and must be
    idempotent (the agent may have deregistered itself, which is what ended it).
    """

    async def notify_agent(self, agent_id: str, command: str, body: dict[str, Any]) -> None:
        """Send the agent a CONTROL envelope: "suspend", "resume", "recover", "shutdown"
        ({"grace_period_ms": ...}) or "failed" ({"error_code": ...})."""
        ...

    async def stop_dispatch(self, agent_id: str) -> None:
        """Assign no new task to the agent; route its queued assignments elsewhere."""
        ...

    async def abandon_task(self, agent_id: str, error_code: str) -> None:
        """End the agent's current task, if any, reporting it incomplete with `error_code`."""
        ...

    async def release_resources(self, agent_id: str, reason: str) -> None:
        """Clean up everything held for the agent (RFC 8.4; see `engine.resources`)."""
        ...

    async def deregister(self, agent_id: str, reason: str) -> None:
        """Remove the agent's registration: its lifecycle is over."""
        ...

    async def escalate(self, agent_id: str, state: AgentLifecycleState, reason: str) -> None:
        """Open a HITL invocation about an agent stuck in `state` (RFC 8.3, WAITING)."""
        ...


@dataclass(frozen=True, slots=True)
class LifecycleSettings:
    """Lifecycle policy. `per_type` overrides `timeouts` by agent type, the descriptor's
    name (RFC 8.2: timeouts "configurable per Agent type")."""

    timeouts: LifecycleTimeouts = DEFAULT_TIMEOUTS
    per_type: Mapping[str, LifecycleTimeouts] = field(default_factory=dict)
    auto_recover: bool = True
    max_auto_recoveries: int = 3
    """Automatic recovery attempts in a row before a failed agent is left to an operator."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "per_type", MappingProxyType(dict(self.per_type)))
        count = self.max_auto_recoveries
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValidationError.for_field(
                "max_auto_recoveries", f"must be a non-negative integer, got {count!r}"
            )

    def timeouts_for(self, agent_type: str) -> LifecycleTimeouts:
        return self.per_type.get(agent_type, self.timeouts)


@dataclass(slots=True)
class _Agent:
    agent_type: str
    state: AgentLifecycleState
    entered_at: float
    error_code: str = ""
    grace_s: float | None = None
    """The grace of the shutdown in progress; None: the configured one."""
    deadline: float | None = None
    recoveries: int = 0
    """Automatic recovery attempts since the agent was last RUNNABLE."""


class Lifecycles:
    """Every registered agent's lifecycle state, timers and transitions."""

    def __init__(
        self,
        events: EventRecorder,
        clock: Clock,
        hooks: LifecycleHooks,
        settings: LifecycleSettings | None = None,
    ) -> None:
        self.settings = settings or LifecycleSettings()
        self._events = events
        self._clock = clock
        self._hooks = hooks
        self._agents: dict[str, _Agent] = {}
        self._timers = Timers()
        self.changed = self._timers.changed
        """Set when a deadline earlier than every other is armed (wakes `run`)."""

    # ------------------------------------------------------------------ queries

    def state(self, agent_id: str) -> AgentLifecycleState | None:
        agent = self._agents.get(agent_id)
        return None if agent is None else agent.state

    def entered_at(self, agent_id: str) -> float | None:
        """When the agent entered its current state (wall time); None for an unknown agent."""
        agent = self._agents.get(agent_id)
        return None if agent is None else agent.entered_at

    def error_code(self, agent_id: str) -> str | None:
        """The agent's error code: set in FAILED, "" otherwise; None for an unknown agent."""
        agent = self._agents.get(agent_id)
        return None if agent is None else agent.error_code

    def accepts_tasks(self, agent_id: str) -> bool:
        """Whether a task may be assigned to the agent now (RUNNABLE only; unknown: no)."""
        agent = self._agents.get(agent_id)
        return agent is not None and _M.allows(agent.state, _I.SCHEDULE)

    def snapshot(self) -> dict[str, AgentLifecycleState]:
        return {agent_id: agent.state for agent_id, agent in self._agents.items()}

    # ------------------------------------------------------------------ inputs

    async def registered(self, agent_id: str, agent_type: str) -> AgentLifecycleState:
        """An agent registered: a new one starts INITIALIZING with its init timer; a known
        one re-registering keeps its state and takes the new type (and its timeouts)."""
        agent = self._agents.get(agent_id)
        if agent is not None:
            if agent.agent_type != agent_type:
                agent.agent_type = agent_type
                if agent.deadline is not None:
                    due = deadline_for(agent.state, agent.entered_at, self._timeouts(agent))
                    self._arm(agent_id, agent, due)
            return agent.state
        now = self._clock.now()
        agent = _Agent(agent_type, _S.INITIALIZING, now)
        self._agents[agent_id] = agent
        due = deadline_for(_S.INITIALIZING, now, self._timeouts(agent))
        self._arm(agent_id, agent, due)
        details = _transition(None, agent, None, note="registered", deadline=due)
        await self._events.record("agent.lifecycle", COORDINATOR, agent_id=agent_id, **details)
        return agent.state

    async def ready(self, agent_id: str) -> LifecycleStep | None:
        """The agent indicated readiness (opened its stream, reported RUNNABLE): it finished
        its start-up or its recovery. In any other state this means nothing."""
        agent = await self._settled(agent_id)
        event = _READY.get(agent.state)
        if event is None:
            return None
        return await self._step(agent_id, agent, event, actor=agent_id, note="ready")

    async def report(
        self, agent_id: str, reported: AgentLifecycleState, *, error_code: str = ""
    ) -> LifecycleStep | None:
        """The agent reported its own state (Heartbeat): apply what that means, if anything
        (see `input_for_report`). `error_code` goes with a reported failure only."""
        agent = await self._settled(agent_id)
        event = input_for_report(agent.state, reported)
        if event is None:
            return None
        code = error_code if event in REPORTED_FAILURES else ""
        return await self._step(
            agent_id, agent, event, actor=agent_id, error_code=code, note="reported"
        )

    async def apply(
        self, agent_id: str, event: AgentInput, *, error_code: str = "", note: str = ""
    ) -> LifecycleStep:
        """Apply one input. IllegalTransitionError (nothing changed) when the agent's state
        has no row for it; NotFoundError for an agent not registered here."""
        agent = await self._settled(agent_id)
        return await self._step(agent_id, agent, event, error_code=error_code, note=note)

    async def shutdown(self, agent_id: str, grace_s: float | None) -> LifecycleStep:
        """Shut the agent down gracefully (RFC 8.4) within `grace_s` seconds (None: the
        configured grace); the grace holds until the agent leaves SHUTTING_DOWN."""
        if grace_s is not None:  # refuses a grace that is not a positive duration
            shutdown_deadline(self._clock.now(), grace_s)
        agent = await self._settled(agent_id)
        timeouts = self._timeouts(agent).with_grace(grace_s)
        step = _M.step(agent.state, _I.SHUTDOWN, self._clock.now(), entered_at=agent.entered_at,
                       timeouts=timeouts)  # fmt: skip
        agent.grace_s = grace_s
        await self._perform(agent_id, agent, step, COORDINATOR, note="shutdown requested")
        return step

    async def deregistered(self, agent_id: str) -> LifecycleStep | None:
        """The agent deregistered. From SHUTTING_DOWN that completes its shutdown (cleanup,
        then the lifecycle ends); from any other state its resources are released and it
        is forgotten. An unknown agent: nothing (deregistration is idempotent)."""
        if agent_id not in self._agents:
            return None
        agent = await self._settled(agent_id)
        last = agent.state
        if last is _S.SHUTTING_DOWN:
            step = await self._step(
                agent_id, agent, _I.SHUTDOWN_COMPLETE, actor=agent_id, note="deregistered"
            )
            await self._ended(agent_id, last, "shutdown_complete")
            return step
        self.forget(agent_id)
        await self._ended(agent_id, last, "deregistered")
        await self._hook(
            agent_id, _F.RELEASE_RESOURCES, self._hooks.release_resources(agent_id, "deregistered")
        )
        return None

    def forget(self, agent_id: str) -> None:
        """Drop the agent and its timer without any effect (its record is gone elsewhere)."""
        agent = self._agents.pop(agent_id, None)
        if agent is not None:
            agent.deadline = None
            self._timers.cancel(agent_id)

    # ------------------------------------------------------------------ time

    def next_deadline(self) -> float | None:
        """The earliest armed deadline (wall time), None when no agent is in a timed state."""
        return self._timers.next()

    async def fire_due(self) -> int:
        """Apply every timeout due at the clock's now; returns how many fired."""
        now = self._clock.now()
        fired = 0
        for agent_id in self._timers.due(now):
            if agent_id in self._agents and await self._fire(agent_id, now):
                fired += 1
        return fired

    async def run(self, sleep: Sleep) -> None:
        """Forever: wait for the earliest deadline (or an earlier one to appear), then fire.

        `sleep` is injected so that tests drive the loop with a fake clock.
        """
        await run_deadlines(self._timers, self._clock, self.fire_due, sleep)

    # ------------------------------------------------------------------ internals

    def _get(self, agent_id: str) -> _Agent:
        agent = self._agents.get(agent_id)
        if agent is None:
            raise NotFoundError(f"no lifecycle for agent {agent_id}", {"agent_id": agent_id})
        return agent

    def _timeouts(self, agent: _Agent) -> LifecycleTimeouts:
        return self.settings.timeouts_for(agent.agent_type).with_grace(agent.grace_s)

    def _arm(self, agent_id: str, agent: _Agent, deadline: float | None) -> None:
        """Make `deadline` the agent's only timer (None: no timer)."""
        agent.deadline = deadline
        if deadline is None:
            self._timers.cancel(agent_id)
        else:
            self._timers.arm(agent_id, deadline)

    async def _settled(self, agent_id: str) -> _Agent:
        """The agent after any timeout already due has applied."""
        agent = self._get(agent_id)
        now = self._clock.now()
        if agent.deadline is not None and agent.deadline <= now:
            await self._fire(agent_id, now)
            agent = self._get(agent_id)
        return agent

    async def _fire(self, agent_id: str, now: float) -> bool:
        agent = self._agents.get(agent_id)
        if agent is None:
            return False
        self._arm(agent_id, agent, None)
        timeouts = self._timeouts(agent)
        step = _M.timeout(agent.state, now, agent.entered_at, timeouts)
        if step is None:  # the deadline moved (the agent's type changed): wait for the new one
            self._arm(agent_id, agent, deadline_for(agent.state, agent.entered_at, timeouts))
            return False
        await self._perform(agent_id, agent, step, COORDINATOR)
        return True

    async def _step(
        self,
        agent_id: str,
        agent: _Agent,
        event: AgentInput,
        *,
        actor: str = COORDINATOR,
        error_code: str = "",
        note: str = "",
    ) -> LifecycleStep:
        step = _M.step(agent.state, event, self._clock.now(), entered_at=agent.entered_at,
                       timeouts=self._timeouts(agent), error_code=error_code)  # fmt: skip
        await self._perform(agent_id, agent, step, actor, note=note)
        return step

    async def _perform(
        self, agent_id: str, agent: _Agent, step: LifecycleStep, actor: str, *, note: str = ""
    ) -> None:
        """Land the step (state, timer, event), then run its hooks in the step's order."""
        before = agent.state
        if _F.DEREGISTER in step.effects:
            self.forget(agent_id)
        for effect in step.effects:
            if effect is _F.PERSIST:
                self._persist(agent_id, agent, step)
            elif effect is _F.CANCEL_TIMER:
                self._arm(agent_id, agent, None)
            elif effect is _F.START_TIMER:
                self._arm(agent_id, agent, step.deadline)
        if _F.EMIT_EVENT in step.effects or _F.PERSIST in step.effects:
            details = _transition(before, agent, step, note=note, deadline=step.deadline)
            await self._events.record("agent.lifecycle", actor, agent_id=agent_id, **details)
        reason = step.error_code or str(step.input or "").lower()
        for effect in step.effects:
            call = self._effect_call(agent_id, agent, step, effect, reason)
            if call is not None:
                await self._hook(agent_id, effect, call)
        if step.state is _S.FAILED and before is not _S.FAILED:
            await self._auto_recover(agent_id, agent, step)

    def _persist(self, agent_id: str, agent: _Agent, step: LifecycleStep) -> None:
        if step.state is not agent.state:
            self._arm(agent_id, agent, None)  # START_TIMER arms the new state's
        agent.state, agent.entered_at, agent.error_code = (
            step.state,
            step.entered_at,
            step.error_code,
        )
        if step.state is not _S.SHUTTING_DOWN:
            agent.grace_s = None
        if step.state is _S.RUNNABLE:
            agent.recoveries = 0

    def _effect_call(
        self, agent_id: str, agent: _Agent, step: LifecycleStep, effect: LifecycleEffect,
        reason: str,
    ) -> Awaitable[None] | None:  # fmt: skip
        hooks = self._hooks
        if effect is _F.STOP_DISPATCH:
            return hooks.stop_dispatch(agent_id)
        if effect is _F.ABANDON_TASK:
            # Without a failure code only a graceful shutdown ends a task (the agent left
            # holding one): agent_shutdown, since agent_shutdown_timeout MUST stay distinct.
            return hooks.abandon_task(agent_id, step.error_code or AgentShutdownError.code)
        if effect is _F.RELEASE_RESOURCES:
            return hooks.release_resources(agent_id, reason)
        if effect is _F.DEREGISTER:
            return hooks.deregister(agent_id, reason)
        if effect is _F.ESCALATE_TO_HITL:
            return hooks.escalate(agent_id, step.state, reason)
        if effect is _F.NOTIFY_AGENT and step.state in _COMMANDS:
            body: dict[str, Any] = {}
            if step.state is _S.SHUTTING_DOWN:
                grace = self._timeouts(agent).shutting_down
                body = {"grace_period_ms": round(grace * 1000)}
            elif step.state is _S.FAILED:
                body = {"error_code": step.error_code}
            return hooks.notify_agent(agent_id, _COMMANDS[step.state], body)
        return None

    async def _hook(self, agent_id: str, effect: LifecycleEffect, call: Awaitable[None]) -> None:
        try:
            await call
        except Exception as exc:
            log.exception("lifecycle effect %s for agent %s failed", effect, agent_id)
            await self._events.record(
                "agent.lifecycle_effect_failed", COORDINATOR, agent_id=agent_id,
                effect=str(effect), error=f"{type(exc).__name__}: {exc}",
            )  # fmt: skip

    async def _auto_recover(self, agent_id: str, agent: _Agent, failed: LifecycleStep) -> None:
        """Start recovery of an agent that just failed, when policy allows (RFC 8.1)."""
        if self._agents.get(agent_id) is not agent or agent.state is not _S.FAILED:
            return  # a hook moved or forgot the agent meanwhile
        if agent.entered_at != failed.entered_at:
            return
        limit = self.settings.max_auto_recoveries
        if not (self.settings.auto_recover and limit and auto_recovery_allowed(failed.error_code)):
            return
        if agent.recoveries >= limit:
            await self._events.record(
                "agent.auto_recovery_exhausted", COORDINATOR, agent_id=agent_id,
                attempts=agent.recoveries, error_code=failed.error_code,
            )  # fmt: skip
            return
        agent.recoveries += 1
        note = f"auto-recovery {agent.recoveries} of {limit} after {failed.error_code}"
        await self._step(agent_id, agent, _I.RECOVER, note=note)

    async def _ended(self, agent_id: str, state: AgentLifecycleState, reason: str) -> None:
        await self._events.record(
            "agent.lifecycle_ended", COORDINATOR, agent_id=agent_id, state=str(state),
            reason=reason,
        )  # fmt: skip


def _transition(
    before: AgentLifecycleState | None,
    agent: _Agent,
    step: LifecycleStep | None,
    *,
    note: str,
    deadline: float | None,
) -> dict[str, Any]:
    """The details of an `agent.lifecycle` event; `step` None: the agent just registered."""
    event = None if step is None else step.input
    return {
        "from": "" if before is None else str(before),
        "to": str(agent.state if step is None else step.state),
        "input": "" if event is None else str(event),
        "error_code": "" if step is None else step.error_code,
        "note": note,
        "timeout": event in _TIMEOUT_EVENTS,
        "agent_type": agent.agent_type,
        "deadline": deadline,
    }
