"""What a thread runs on: one registered agent (`agent_id`), or a capability queue
(`capability`, core/tasks/shared.py) whose tasks any capable agent takes. A new thread names
exactly one; the capability must be one a registered agent offers (its descriptor's
`capabilities`, as the Scheduler's pools read it)."""

from __future__ import annotations

from typing import Any

from apiary.core.runtime.records import ThreadRecord
from apiary.core.tasks.shared import queue_name
from apiary.engine.registry import Registry
from apiary.engine.scheduler.pools import member_of
from apiary.errors import NotFoundError, ValidationError


async def check_agent(registry: Registry, agent_id: str, field: str) -> None:
    """Refuse an agent that is not registered, naming `field` (in cluster mode once the
    store was asked too: it may have registered on another replica a moment ago)."""
    try:
        await registry.get(agent_id)
    except NotFoundError:
        raise NotFoundError(f"no agent {agent_id!r} is registered", {"field": field}) from None


async def check_binding(registry: Registry, agent_id: str, capability: str) -> None:
    """Refuse a binding that names neither or both, an agent that is not registered, a
    capability no registered agent offers (each naming its field)."""
    if not (agent_id or capability):
        raise ValidationError.for_field(
            "agent_id", "is required to start a thread (the agent its turns run on), or "
            "capability (a queue any capable agent takes them from)",
        )  # fmt: skip
    queue = queue_name(agent_id=agent_id, capability=capability)
    if agent_id:
        await check_agent(registry, agent_id, "agent_id")
        return
    if not any(queue in member_of(agent).queues for agent in await registry.list()):
        raise NotFoundError(
            f"no registered agent offers capability {capability!r}",
            {"field": "capability", "capability": capability},
        )


def bound_to(agent_id: str, capability: str) -> str:
    """How messages name a binding: the agent, or "capability 'review'"."""
    return agent_id or f"capability {capability!r}"


def binding_of(thread: ThreadRecord) -> dict[str, Any]:
    """The thread's binding as events carry it: `agentId`, or `capability`."""
    if thread.capability:
        return {"capability": thread.capability}
    return {"agentId": thread.agent_id}


def agent_of(thread: ThreadRecord) -> str:
    """The one agent the thread is bound to; a capability thread has none (its turns run
    on whichever capable agent takes them): ValidationError naming `thread_id`."""
    if not thread.agent_id:
        raise ValidationError.for_field(
            "thread_id", f"thread {thread.thread_id} is bound to capability "
            f"{thread.capability!r}, not to one agent: ask of an agent's thread",
        )  # fmt: skip
    return thread.agent_id
