"""The control plane's limits and windows."""

from __future__ import annotations

from dataclasses import dataclass

from apiary.core.limits import KIB, MIB


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    max_input_bytes: int = 1 * MIB
    """A turn's input (its JSON text) at most."""
    max_queued_turns: int = 100
    """Turns waiting in one thread's queue at most (buffer_full past it)."""
    turns_shown: int = 20
    """A snapshot's last turns per thread (every open turn is shown besides)."""
    tasks_listed: int = 200
    """list_tasks: the tasks of each thread's last turns at most."""
    replay_limit: int = 500
    """Events one reconnect_channel answer replays at most (more: `more` is true)."""
    channel_ttl_s: float = 24 * 3600.0
    """A channel unused (no reconnect, no ack) this long expires."""
    text_bytes: int = 16 * KIB
    """Free text (reasons, titles) at most."""
    max_job_items: int = 1000
    """create_job: items (tasks) one job holds at most."""
