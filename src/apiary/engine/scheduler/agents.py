"""The Scheduler's side of the agent lifecycle (RFC 8): the effects engine/lifecycle.py asks
for, performed on tasks, envelopes, the registry and the agent's resources; and how task
changes drive an agent's lifecycle (`drive`; when, engine/scheduler/windows.py).

Lifecycle calls happen with the Scheduler's lock held (every entry point takes it first), so
these hooks never take it themselves.
"""

from __future__ import annotations

from typing import Any, Protocol

from apiary.core.agent_lifecycle import AgentInput, AgentLifecycleMachine, AgentLifecycleState
from apiary.engine.activity import Activity
from apiary.engine.eventlog import EventRecorder
from apiary.engine.hitl import Hitl
from apiary.engine.lifecycle import Lifecycles
from apiary.engine.notices import SCHEDULER, NoticeFactory
from apiary.engine.registry import Registry
from apiary.engine.resources import ResourceTracker
from apiary.engine.router.admission import Outbound
from apiary.engine.router.router import Router
from apiary.errors import AgentShutdownError

_I = AgentInput


class AgentTasks(Protocol):
    """Ending an agent's tasks, which the lifecycle asks for (the Scheduler does it)."""

    async def fail_agent_tasks(
        self, agent_id: str, code: str, *, queued: bool, running_too: bool = True
    ) -> int:
        """End the agent's tasks in hand (unless not `running_too`; shared ones go back to
        their queues while they have attempts left) and its queued ones (when `queued`)
        with `code`; returns how many ended."""
        ...

    async def recall_waiting(self, agent_id: str, reason: str) -> int:
        """Take back the shared tasks waiting at the agent, not started; returns how many."""
        ...


class SchedulerAgents:
    """`LifecycleHooks` for the Scheduler."""

    def __init__(
        self,
        tasks: AgentTasks,
        router: Router,
        envelopes: NoticeFactory,
        events: EventRecorder,
        registry: Registry,
        hitl: Hitl,
        activity: Activity,
        resources: ResourceTracker,
        hitl_timeout_s: float,
    ) -> None:
        self._tasks = tasks
        self._router = router
        self._envelopes = envelopes
        self._events = events
        self._registry = registry
        self._hitl = hitl
        self._activity = activity
        self._resources = resources
        self._hitl_timeout_s = hitl_timeout_s

    async def notify_agent(self, agent_id: str, command: str, body: dict[str, Any]) -> None:
        """A CONTROL command to the agent (lifecycle notices: shutdown, suspend, ...)."""
        env = self._envelopes.control({**body, "command": command})
        (outcome,) = await self._router.send_many([Outbound(env, agent_id, lane="PRIVILEGED")])
        await self._events.record(
            "agent.control", SCHEDULER, agent_id=agent_id, command=command,
            message_id=env.message_id, accepted=outcome.accepted, reason=outcome.reason,
        )  # fmt: skip

    async def stop_dispatch(self, agent_id: str) -> None:
        """RFC 8.4: no new task for a SHUTTING_DOWN agent; its queued ones cannot run, and the
        shared tasks waiting at it (prefetched, not started) go back to their queues for
        another agent. The running ones may still complete within the grace period."""
        await self._tasks.fail_agent_tasks(
            agent_id, AgentShutdownError.code, queued=True, running_too=False
        )
        await self._tasks.recall_waiting(agent_id, "recalled: the agent is shutting down")

    async def abandon_task(self, agent_id: str, error_code: str) -> None:
        await self._tasks.fail_agent_tasks(agent_id, error_code, queued=False)

    async def release_resources(self, agent_id: str, reason: str) -> None:
        await self._activity.purge(agent_id, None)
        await self._resources.release_all(agent_id, reason)

    async def deregister(self, agent_id: str, reason: str) -> None:
        await self._registry.deregister(agent_id, reason)

    async def escalate(self, agent_id: str, state: AgentLifecycleState, reason: str) -> None:
        await self._hitl.open(
            "TASK_ESCALATION", {"reason": reason, "state": state.value}, requested_by=SCHEDULER,
            subject={"agent_id": agent_id}, suggested_action="deny",
            proposed_actions=("approve", "deny"), timeout_s=self._hitl_timeout_s,
        )  # fmt: skip


async def drive(lifecycles: Lifecycles, agent_id: str, *inputs: AgentInput, code: str = "") -> None:
    """Apply the inputs the table allows from wherever the agent stands; skip the rest (the
    agent may have moved on by its own report, or be unknown to the lifecycle)."""
    for event in inputs:
        state = lifecycles.state(agent_id)
        if state is None or not AgentLifecycleMachine.allows(state, event):
            continue
        await lifecycles.apply(
            agent_id, event, error_code=code if event is _I.FAIL else "", note=SCHEDULER
        )
