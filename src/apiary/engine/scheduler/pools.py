"""Which agents the Scheduler may hand which tasks: each registered agent's shared queues
(its capabilities and its type, core/tasks/shared.py), its modalities and how many tasks it
takes at once (core/tasks/capacity.py), read from its registration; and the fairness
bookkeeping of shared queues (who was served last, which queues no agent has room for).

Called with the Scheduler's lock held.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from apiary.core.envelope_rules import check_modality
from apiary.core.records import AgentRecord
from apiary.core.tasks.capacity import declared_concurrency, window
from apiary.core.tasks.shared import queues_served
from apiary.engine.scheduler.wakeups import shared_target
from apiary.errors import ApiaryError


@dataclass(frozen=True, slots=True)
class Member:
    """A registered agent as the Scheduler's pools see it."""

    agent_id: str
    agent_type: str
    queues: tuple[str, ...]
    modalities: tuple[str, ...]
    concurrency: int = 1
    declared: bool = False
    """It declared its concurrency (so it takes prefetched tasks)."""


def member_of(record: AgentRecord) -> Member:
    """The pools' view of a registration."""
    descriptor = record.descriptor
    declared = declared_concurrency(descriptor)
    concurrency = 1 if declared is None else declared
    capabilities = descriptor.get("capabilities") or ()
    modalities = descriptor.get("modalities_supported") or ()
    return Member(
        record.agent_id, record.name,
        queues_served((str(c) for c in capabilities if isinstance(c, str)), record.name),
        tuple(str(m) for m in modalities), concurrency, declared is not None,
    )  # fmt: skip


class AgentPools:
    """The registered agents' shared queues and capacities (module docstring)."""

    def __init__(self, prefetch: int) -> None:
        self._prefetch = prefetch
        self._members: dict[str, Member] = {}
        self._by_queue: dict[str, set[str]] = {}
        self._served = 0
        self._last_served: dict[str, int] = {}
        self.saturated: set[str] = set()
        """Shared queues an offer found no agent with room for: not offered again until
        one of their agents frees a slot or comes (`unsaturate`)."""

    # ------------------------------------------------------------------ membership

    def join(self, record: AgentRecord) -> Member:
        """The agent registered (again): its queues and capacity as registered now."""
        self.leave(record.agent_id)
        member = self._members[record.agent_id] = member_of(record)
        for queue in member.queues:
            self._by_queue.setdefault(queue, set()).add(record.agent_id)
        self.unsaturate(record.agent_id)
        return member

    def leave(self, agent_id: str) -> None:
        """The agent deregistered."""
        member = self._members.pop(agent_id, None)
        if member is None:
            return
        for queue in member.queues:
            agents = self._by_queue.get(queue)
            if agents is not None:
                agents.discard(agent_id)
                if not agents:
                    del self._by_queue[queue]

    # ------------------------------------------------------------------ reads

    def member(self, agent_id: str) -> Member | None:
        return self._members.get(agent_id)

    def agents_for(self, queue: str) -> frozenset[str]:
        """The registered agents serving the shared queue."""
        return frozenset(self._by_queue.get(queue, ()))

    def queues_of(self, agent_id: str) -> tuple[str, ...]:
        member = self._members.get(agent_id)
        return member.queues if member is not None else ()

    def targets_of(self, agent_id: str) -> tuple[str, ...]:
        """The queues the agent takes tasks from: its own and its shared queues' targets."""
        return (agent_id, *(shared_target(q) for q in self.queues_of(agent_id)))

    def concurrency(self, agent_id: str) -> int:
        member = self._members.get(agent_id)
        return member.concurrency if member is not None else 1

    def window(self, agent_id: str) -> int:
        """How many tasks the agent may hold (its concurrency and, declared, the prefetch)."""
        member = self._members.get(agent_id)
        if member is None:
            return 1
        return window(member.concurrency, self._prefetch, member.declared)

    def takes(self, agent_id: str, content_type: str) -> bool:
        """Whether the agent's modalities admit a shared task's content type."""
        member = self._members.get(agent_id)
        if member is None:
            return False
        try:
            check_modality(content_type, member.modalities)
        except ApiaryError:
            return False
        return True

    def last_served(self, agent_id: str) -> int:
        """When the agent last took a shared task (a counter; -1 never)."""
        return self._last_served.get(agent_id, -1)

    # ------------------------------------------------------------------ fairness

    def served(self, agent_id: str) -> None:
        """The agent took a shared task now."""
        self._last_served[agent_id] = self._served
        self._served += 1

    def unsaturate(self, agent_id: str) -> None:
        """The agent may have room again: its queues are worth offering."""
        if self.saturated:
            self.saturated.difference_update(self.queues_of(agent_id))

    def unsaturate_all(self, queues: Iterable[str]) -> None:
        self.saturated.difference_update(queues)
