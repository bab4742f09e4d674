"""The agents' lifecycles as their windows of tasks change (core/agent_window.py): the task
machine's SCHEDULE_AGENT, START_AGENT and FREE_AGENT effects, and the end of the
Scheduler's turn (`settle`), where an agent whose window emptied during the turn with a task
waiting for it goes back to RUNNABLE unless a task was handed to it meanwhile.

A turn is one hold of the Scheduler's lock; the entry points that end tasks drain their
dispatches before they let the lock go, and `SchedulerDispatch.drain` settles last (the
start-up and an agent's readiness settle without a drain). One that does neither (the
effects of a joint ACK write found committed after all) leaves the agent woken, as every
task end does, and the Scheduler's loop drains, and so settles, right after. An agent
whose window emptied counts as free to the dispatch until it is settled (`takes_tasks`).

Called with the Scheduler's lock held.
"""

from __future__ import annotations

from apiary.core.agent_lifecycle import AgentInput
from apiary.core.agent_window import settled, takes_tasks, task_ended
from apiary.core.records import TaskState
from apiary.engine.lifecycle import Lifecycles
from apiary.engine.scheduler.agents import drive
from apiary.engine.scheduler.live import LiveTasks
from apiary.engine.scheduler.pools import AgentPools


class AgentWindows:
    """Steps each agent's lifecycle when its window of tasks changes (module docstring)."""

    def __init__(self, live: LiveTasks, pools: AgentPools, lifecycles: Lifecycles) -> None:
        self._live = live
        self._pools = pools
        self._lifecycles = lifecycles
        self._emptied: set[str] = set()
        """Agents whose window emptied in this turn, still in their state until `settle`."""

    def takes_tasks(self, agent_id: str) -> bool:
        """Whether the agent's lifecycle lets it take one more task (below its window)."""
        state = self._lifecycles.state(agent_id)
        if state is None:
            return False
        return takes_tasks(state, self._live.count(agent_id), agent_id in self._emptied)

    async def assigned(self, agent_id: str) -> None:
        """A task was dispatched to the agent: SCHEDULED when it was RUNNABLE; an agent
        already RUNNING stays so."""
        await drive(self._lifecycles, agent_id, AgentInput.SCHEDULE)

    async def started(self, agent_id: str) -> None:
        """The agent read a task: RUNNING when it was SCHEDULED."""
        await drive(self._lifecycles, agent_id, AgentInput.START)

    async def freed(self, agent_id: str) -> None:
        """One of the agent's tasks ended by its own doing (its result, a yield, a
        termination): step it as core/agent_window.py `task_ended` says."""
        state = self._lifecycles.state(agent_id)
        if state is None:
            return
        held = self._live.holding(agent_id)
        running = any(task.state == TaskState.RUNNING for task in held)
        waiting = any(self._live.ready(self._pools.targets_of(agent_id)).values())
        step = task_ended(state, len(held), running, waiting)
        if step.at_turn_end:
            self._emptied.add(agent_id)
        await drive(self._lifecycles, agent_id, *step.inputs)

    async def settle(self) -> None:
        """The end of the turn: each agent whose window emptied in it and holds nothing
        still goes back to RUNNABLE (COMPLETE, REPORTED)."""
        while self._emptied:
            agent_id = self._emptied.pop()
            state = self._lifecycles.state(agent_id)
            if state is not None:
                await drive(self._lifecycles, agent_id, *settled(state, self._live.count(agent_id)))
