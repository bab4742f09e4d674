"""What the Scheduler's background loop has to do: the agents to try dispatching to again (and
the shared queues to offer to their agents), the timer heap (preemption deadlines, dispatch
retries after a full buffer, the activity reconciliation), with the event that wakes the loop.

Agents are woken from anywhere (a task ended, a worktree was bound, a conflict decided);
the Scheduler drains them under its lock at the end of each entry point and in its loop. A
woken target is an agent id, or a shared queue's `shared_target` (no agent id starts with a
control character, core/descriptor.py).
"""

from __future__ import annotations

import asyncio

from apiary.engine.timers import Timers

SEP = "\x1f"
"""Joins the parts of the Scheduler's queue and timer keys."""
RECONCILE_KEY = f"reconcile{SEP}"
SHARED = "\x1e"
"""Starts a shared queue's target."""


def shared_target(queue: str) -> str:
    """The wake-up (and queue-key) target of a shared queue (core/tasks/shared.py)."""
    return f"{SHARED}{queue}"


def shared_queue(target: str) -> str:
    """The shared queue a target names; '' for an agent's."""
    return target[1:] if target.startswith(SHARED) else ""


def preempt_key(task_id: str) -> str:
    """The task's preemption deadline on the timer heap."""
    return f"preempt{SEP}{task_id}"


def retry_key(agent_id: str) -> str:
    """The agent's dispatch retry after a full buffer, on the timer heap."""
    return f"retry{SEP}{agent_id}"


class Wakeups:
    """Agents to dispatch to from the background loop, and the Scheduler's timers."""

    __slots__ = ("agents", "loop", "timers")

    def __init__(self) -> None:
        self.timers = Timers()
        self.loop = asyncio.Event()
        """Set when the loop has something to do (an agent woken, an earlier deadline)."""
        self.agents: set[str] = set()
        """Targets to try dispatching to (agents, shared queues); the loop itself adds to it
        without `wake`, as it drains them right after."""

    def wake(self, target: str) -> None:
        """Try to dispatch to `target` (an agent, or a shared queue's `shared_target`) from
        the background loop."""
        self.agents.add(target)
        self.loop.set()

    def arm(self, key: str, at: float) -> None:
        """Arm the timer `key` at `at` and let the loop see its deadline."""
        self.timers.arm(key, at)
        self.loop.set()
