"""The Scheduler's side of the agent lifecycle (RFC 8): the effects engine/lifecycle.py asks
for, performed on tasks, envelopes, the registry and the agent's resources.

Lifecycle calls happen with the Scheduler's lock held (every entry point takes it first), so
these hooks never take it themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from apiary.core.agent_lifecycle import AgentInput, AgentLifecycleMachine, AgentLifecycleState
from apiary.engine.notices import SCHEDULER
from apiary.errors import AgentShutdownError

if TYPE_CHECKING:
    from apiary.engine.scheduler.scheduler import Scheduler

_S = AgentLifecycleState
_I = AgentInput

FINISH_INPUTS: dict[AgentLifecycleState, tuple[AgentInput, ...]] = {
    _S.SCHEDULED: (_I.START, _I.COMPLETE, _I.REPORTED),
    _S.RUNNING: (_I.COMPLETE, _I.REPORTED),
    _S.WAITING: (_I.INPUT_RECEIVED, _I.COMPLETE, _I.REPORTED),
    _S.WAITING_RESOURCES: (_I.RESOURCES_AVAILABLE, _I.COMPLETE, _I.REPORTED),
    _S.RESUMED: (_I.RESTORED, _I.COMPLETE, _I.REPORTED),
    _S.COMPLETED: (_I.REPORTED,),
    _S.SHUTTING_DOWN: (_I.COMPLETE,),
}
"""How an agent whose task ended (its FULFILLED or FAILED ACK is the result report, RFC 8.1
COMPLETED) gets back to RUNNABLE from where it stood."""


class SchedulerAgents:
    """`LifecycleHooks` for the Scheduler."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    async def notify_agent(self, agent_id: str, command: str, body: dict[str, Any]) -> None:
        await self._scheduler.send_control(agent_id, {**body, "command": command})

    async def stop_dispatch(self, agent_id: str) -> None:
        """RFC 8.4: no new task for a SHUTTING_DOWN agent; its queued ones cannot run. The
        running one may still complete within the grace period."""
        await self._scheduler.fail_agent_tasks(
            agent_id, AgentShutdownError.code, queued=True, running_too=False
        )

    async def abandon_task(self, agent_id: str, error_code: str) -> None:
        await self._scheduler.fail_agent_tasks(agent_id, error_code, queued=False)

    async def release_resources(self, agent_id: str, reason: str) -> None:
        scheduler = self._scheduler
        await scheduler.activity_purge(agent_id)
        await scheduler.resources.release_all(agent_id, reason)

    async def deregister(self, agent_id: str, reason: str) -> None:
        await self._scheduler.deregister(agent_id, reason)

    async def escalate(self, agent_id: str, state: AgentLifecycleState, reason: str) -> None:
        await self._scheduler.escalate_agent(agent_id, state.value, reason)


async def drive(scheduler: Scheduler, agent_id: str, *inputs: AgentInput, code: str = "") -> None:
    """Apply the inputs the table allows from wherever the agent stands; skip the rest (the
    agent may have moved on by its own report, or be unknown to the lifecycle)."""
    lifecycles = scheduler.lifecycles
    for event in inputs:
        state = lifecycles.state(agent_id)
        if state is None or not AgentLifecycleMachine.allows(state, event):
            continue
        await lifecycles.apply(
            agent_id, event, error_code=code if event is _I.FAIL else "", note=SCHEDULER
        )


async def finished(scheduler: Scheduler, agent_id: str) -> None:
    """The agent's task ended: back to RUNNABLE (or as far as its state allows)."""
    state = scheduler.lifecycles.state(agent_id)
    if state is not None:
        await drive(scheduler, agent_id, *FINISH_INPUTS.get(state, ()))
