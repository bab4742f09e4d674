"""Back-pressure counters of the router (RFC 13), read by the metrics endpoint at scrape."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Final

UNKNOWN_AGENT: Final = "(unregistered)"
"""The agent label of a refusal addressed to no registered agent (bounded label values)."""


@dataclass
class Timing:
    count: int = 0
    total_s: float = 0.0

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.total_s += max(seconds, 0.0)


@dataclass
class RouterStats:
    enqueue_rejects: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(agent_id, reason) -> rejects; agent_id is UNKNOWN_AGENT for a recipient not registered."""
    admission_refused: Counter[str] = field(default_factory=Counter)
    """error_code -> envelopes refused at admission (answered, logged, not dead-lettered)."""
    nacks: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(agent_id, error_code) -> NACKs emitted."""
    accepted: Counter[str] = field(default_factory=Counter)
    """agent_id -> messages admitted."""
    urgent_dispatches: Counter[str] = field(default_factory=Counter)
    urgent_overflows: Counter[str] = field(default_factory=Counter)
    """agent_id -> PRIVILEGED messages over the rate limit, served in STANDARD's share."""
    starvation_warned_at: dict[str, float] = field(default_factory=dict)
    enqueue_latency: dict[str, Timing] = field(default_factory=dict)
    """Receive (envelope timestamp, else arrival) to durable enqueue, per recipient."""
    dequeue_latency: dict[str, Timing] = field(default_factory=dict)
    """Enqueue to hand-out on the agent's stream."""
    process_time: dict[str, Timing] = field(default_factory=dict)
    """Hand-out to the agent's terminal acknowledgement."""
    dead_lettered: Counter[str] = field(default_factory=Counter)

    def timing(self, table: dict[str, Timing], agent_id: str) -> Timing:
        found = table.get(agent_id)
        if found is None:
            found = table[agent_id] = Timing()
        return found
