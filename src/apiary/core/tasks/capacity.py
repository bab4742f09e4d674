"""How many tasks an agent holds at once, who takes a shared queue's next task, and which
held task a higher priority preempts (docs/scheduler.md, "Concurrency and prefetch").

An agent declares at registration how many tasks it runs at once (`task_concurrency`, 1 when
it declares nothing). The Scheduler keeps that many in flight to it, plus `prefetch` more
(`[scheduler] prefetch`) to an agent that declared its concurrency: those wait at the agent,
unread, so that the next task is already there when one ends. An agent that declared
nothing holds `task_concurrency` tasks only, one by default, as RFC 8 describes an agent: a
client that starts every DATA it reads must never find more there than it may run.

Which held tasks run: the agent starts them in the order they came, up to its concurrency;
the Scheduler counts a task as running once read (READ) and takes the earliest dispatched of
the others for the rest of the running slots (`split`). The others wait at the agent.

Preemption (RFC 7.1) with several tasks in hand: a task that cannot start at once (every
running slot taken) preempts the lowest-priority running task below it (the latest
dispatched among equals) that is not already being preempted, and recalls each waiting task
below it, so that it is the next to start (`victims`). A recalled task has not started: the
agent yields it at once and it goes back to its queue, keeping its place. The higher task
itself is not prefetched meanwhile: it goes to the agent once those have yielded
(`waits_for_yield`), as with no prefetch; a shared task is not prefetched to any of its
agents while one of them runs a task below it (`runs_below`).

A shared queue's next task goes to the least-loaded capable agent with room (held tasks over
concurrency), then to the one served longest ago, then by agent id (`fair_order`): round
robin among idle agents.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from apiary.core.preemption import should_preempt
from apiary.errors import ValidationError

TASK_CONCURRENCY: Final = "task_concurrency"
"""The stored descriptor's key for the concurrency an agent declared at registration (the
coordinator's record, from the registration's `apiary-task-concurrency` metadata; never a
field of the canonical descriptor)."""
TASK_CONCURRENCY_METADATA: Final = "apiary-task-concurrency"
"""RegisterAgent's call metadata (an HTTP header on the gateway) declaring the concurrency."""
MAX_TASK_CONCURRENCY: Final = 256
"""The most tasks one agent may declare to run at once."""
MAX_PREFETCH: Final = 64
PREFETCHED_RECEIVED_AFTER_S: Final = 1.0
"""How long a prefetched task waits at the SDK before it is acknowledged RECEIVED (one that
starts sooner has its READ stand for it)."""
PREFETCH_ACK_TIMEOUT_S: Final = 2 * PREFETCHED_RECEIVED_AFTER_S
"""The shortest router ACK deadline a prefetch works with: a prefetched task's first ACK
leaves PREFETCHED_RECEIVED_AFTER_S after it arrived, plus its way back."""


def check_task_concurrency(value: object, field: str = "task_concurrency") -> int:
    """A declared concurrency as an int in 1..MAX_TASK_CONCURRENCY (a decimal text too, as
    call metadata carries it); ValidationError naming `field` otherwise."""
    number: object = value
    if isinstance(value, str):
        number = int(value) if value.isascii() and value.isdigit() else None
    if isinstance(number, bool) or not isinstance(number, int):
        raise ValidationError.for_field(field, f"must be an integer, got {str(value)[:40]!r}")
    if not 1 <= number <= MAX_TASK_CONCURRENCY:
        raise ValidationError.for_field(
            field, f"must be between 1 and {MAX_TASK_CONCURRENCY}, got {number}"
        )
    return number


def declared_concurrency(descriptor: Mapping[str, Any]) -> int | None:
    """The concurrency a stored registration declared (`TASK_CONCURRENCY`), None for none
    (one not written by this coordinator counts as none)."""
    value = descriptor.get(TASK_CONCURRENCY)
    if value is None:
        return None
    try:
        return check_task_concurrency(value)
    except ValidationError:
        return None


def window(concurrency: int, prefetch: int, declared: bool) -> int:
    """How many tasks the Scheduler keeps in flight to an agent (see the module docstring)."""
    return concurrency + (prefetch if declared else 0)


@dataclass(frozen=True, slots=True)
class HeldTask:
    """A task an agent holds, as preemption sees it."""

    task_id: str
    priority: int
    started: bool
    """Read by the agent (RUNNING)."""
    order: int
    """Dispatch order among the agent's tasks: lower came first."""
    preemptible: bool = True
    """No preemption of it is under way (its record is RUNNING or NON_PREEMPTIBLE)."""


class Ranked(Protocol):
    """A held task as far as its priority goes (a HeldTask, or the task's record)."""

    @property
    def priority(self) -> int: ...


def any_below(held: Iterable[Ranked], incoming: int) -> bool:
    """Whether a task of priority `incoming` outranks one of `held` (RFC 7.1): the question
    before every other of preemption's, whose answer is nothing when this one is no."""
    return any(should_preempt(t.priority, incoming) for t in held)


def split(held: Sequence[HeldTask], concurrency: int) -> tuple[list[HeldTask], list[HeldTask]]:
    """(running, waiting): the tasks read first, then the earliest dispatched, fill the
    running slots; the rest wait at the agent."""
    ordered = sorted(held, key=lambda t: (not t.started, t.order))
    return ordered[:concurrency], ordered[concurrency:]


@dataclass(frozen=True, slots=True)
class Victims:
    """What a higher-priority task asks of an agent's held tasks."""

    preempt: str = ""
    """The running task to preempt ('' for none)."""
    recall: tuple[str, ...] = ()
    """Waiting tasks to take back (they have not started)."""
    busy: str = ""
    """The lowest-priority running task below the new one, when it is already being
    preempted (so nothing more is asked of it)."""


def victims(held: Sequence[HeldTask], concurrency: int, incoming: int) -> Victims:
    """What a task of priority `incoming` preempts among `held` (the module docstring);
    nothing while a running slot is free."""
    if len(held) < concurrency:
        return Victims()
    running, waiting = split(held, concurrency)
    below = [t for t in running if should_preempt(t.priority, incoming)]
    recall = tuple(
        t.task_id for t in waiting if t.preemptible and should_preempt(t.priority, incoming)
    )
    if not below:
        return Victims(recall=recall)
    lowest = max(below, key=lambda t: (t.priority, t.order))
    free = [t for t in below if t.preemptible]
    if not free:
        return Victims(recall=recall, busy=lowest.task_id)
    chosen = max(free, key=lambda t: (t.priority, t.order))
    return Victims(preempt=chosen.task_id, recall=recall)


def waits_for_yield(held: Sequence[Ranked], concurrency: int, incoming: int) -> bool:
    """Whether a task of priority `incoming` waits in its queue instead of going to the agent
    now: every running slot taken (it would be prefetched) and the agent holds a task below
    it, which it preempts or recalls (`victims`). It goes once those have yielded, as with
    no prefetch: never at the agent behind a task it displaces, and a preemption's events
    keep their order (the yield, then the dispatch of the task that asked for it)."""
    if len(held) < concurrency:
        return False
    return any_below(held, incoming)


def runs_below(held: Sequence[HeldTask], concurrency: int, incoming: int) -> bool:
    """Whether the agent runs a task below `incoming` (one it preempts, or is preempting):
    a shared task of that priority is not prefetched to another agent meanwhile, but waits
    for that one's running slot, as with no prefetch."""
    running, _ = split(held, concurrency)
    return any_below(running, incoming)


@dataclass(frozen=True, slots=True)
class Seat:
    """A capable agent with room, as the fair choice sees it."""

    agent_id: str
    held: int
    concurrency: int
    last_served: int
    """When it last took a shared task (a counter; -1 never)."""


def fair_order(seats: Sequence[Seat]) -> list[str]:
    """The agents in the order they are offered a shared task: least loaded first (held
    tasks over concurrency), then the one served longest ago, then by id."""
    ranked = sorted(seats, key=lambda s: (s.held / s.concurrency, s.last_served, s.agent_id))
    return [s.agent_id for s in ranked]
