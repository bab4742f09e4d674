"""The Activity Buffer (RFC 10, 10.1): a bounded, queryable view of in-flight work.

Agents register an `ActivityEntry` before a task starts and complete it when the task ends;
the Scheduler reconciles the buffer against the task states it knows and purges the entries
of tasks that are COMPLETED, FAILED or unknown. Finished entries move to a short history for
troubleshooting, bounded by count and by age (RFC 10.1's eviction policies).

Limits (RFC 10.1): at most `max_entries` active entries in all and `per_agent` per agent. A
registration past either limit is refused with `ActivityBufferFullError`
(`activity_buffer_full`) and leaves the buffer exactly as it was: nothing is ever dropped to
make room. `over_warning` says when utilization exceeds `warn_ratio` (80 %) so the engine can
emit the warning metric.

`ActivityBuffer` is pure: time is an argument and nothing here performs I/O. Each method
returns the entries it changed, which is what a caller needs to publish a mutation feed
(RFC 10's optional streaming feed). Reads take an optional `now`; without one they evict
the history at the latest time the buffer was given.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Final

from apiary.core.descriptor import MAX_DESCRIPTION_WORDS, word_count
from apiary.errors import ActivityBufferFullError, ValidationError


class ActivityOutcome(StrEnum):
    """How an entry left the active buffer; an active entry's outcome is ""."""

    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    PURGED = "PURGED"


ACTIVE: Final = ""
"""The outcome of an entry that is still active."""
PURGE_STATES: Final = frozenset({"COMPLETED", "FAILED"})
"""Task states whose entries reconciliation purges (RFC 10); unknown tasks are purged too."""
_COMPLETE_OUTCOMES: Final = frozenset({ActivityOutcome.COMPLETED, ActivityOutcome.FAILED})
_OUTCOMES: Final = frozenset({ACTIVE, *ActivityOutcome})


def _check_text(value: object, name: str, *, required: bool = False) -> None:
    if not isinstance(value, str):
        raise ValidationError.for_field(name, "must be a string")
    if required and not value:
        raise ValidationError.for_field(name, "is required")
    if "\x00" in value:
        raise ValidationError.for_field(name, "must not contain NUL characters")


def _check_time(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError.for_field(name, "must be a finite number")
    if value < 0:
        raise ValidationError.for_field(name, "must not be negative")
    return float(value)


@dataclass(frozen=True, slots=True)
class ActivityEntry:
    """One agent's in-flight (or recently finished) task: RFC 10's activity entry.

    `started_at` 0 asks `ActivityBuffer.register` to stamp the registration time.
    `finished_at` is 0 and `outcome` "" while the entry is active; a finished entry carries
    its finish time and an `ActivityOutcome` value. Validation on construction: agent_id and
    task_id required; strings free of NUL; description at most 200 words; times finite and
    not negative; an active entry has no finish time.
    """

    agent_id: str
    task_id: str
    repo_id: str = ""
    worktree_id: str = ""
    branch: str = ""
    description: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    outcome: str = ACTIVE

    def __post_init__(self) -> None:
        _check_text(self.agent_id, "agent_id", required=True)
        _check_text(self.task_id, "task_id", required=True)
        for name in ("repo_id", "worktree_id", "branch", "description"):
            _check_text(getattr(self, name), name)
        words = word_count(self.description)
        if words > MAX_DESCRIPTION_WORDS:
            raise ValidationError.for_field(
                "description",
                f"has {words} words; at most {MAX_DESCRIPTION_WORDS} are allowed",
                words=str(words),
            )
        object.__setattr__(self, "started_at", _check_time(self.started_at, "started_at"))
        object.__setattr__(self, "finished_at", _check_time(self.finished_at, "finished_at"))
        if self.outcome not in _OUTCOMES:
            raise ValidationError.for_field(
                "outcome", f"must be empty or one of {', '.join(ActivityOutcome)}"
            )
        if self.outcome == ACTIVE and self.finished_at:
            raise ValidationError.for_field("finished_at", "must be 0 while the entry is active")

    @property
    def key(self) -> tuple[str, str]:
        """The entry's identity in the buffer: (agent_id, task_id)."""
        return (self.agent_id, self.task_id)

    @property
    def active(self) -> bool:
        """Whether the task is still in flight."""
        return self.outcome == ACTIVE


@dataclass(frozen=True, slots=True)
class ActivityLimits:
    """The buffer's bounds (RFC 10.1 defaults): 10,000 entries, 100 per agent, warn at 80 %.

    `history` bounds how many finished entries are kept (0 keeps none) and `history_ttl_s`
    how long each is kept after it finished.
    """

    max_entries: int = 10_000
    per_agent: int = 100
    warn_ratio: float = 0.8
    history: int = 1_000
    history_ttl_s: float = 3600.0

    def __post_init__(self) -> None:
        for name, least in (("max_entries", 1), ("per_agent", 1), ("history", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValidationError.for_field(name, f"must be an integer >= {least}")
        ratio = self.warn_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio <= 1:
            raise ValidationError.for_field("warn_ratio", "must be a number in (0, 1]")
        ttl = self.history_ttl_s
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < math.inf:
            raise ValidationError.for_field("history_ttl_s", "must be a finite number > 0")


def _matches(
    entry: ActivityEntry,
    agent_id: str | None,
    repo_id: str | None,
    worktree_id: str | None,
    task_id: str | None,
) -> bool:
    return (
        (agent_id is None or entry.agent_id == agent_id)
        and (repo_id is None or entry.repo_id == repo_id)
        and (worktree_id is None or entry.worktree_id == worktree_id)
        and (task_id is None or entry.task_id == task_id)
    )


def _by_start(entry: ActivityEntry) -> tuple[float, str, str]:
    return (entry.started_at, entry.agent_id, entry.task_id)


class ActivityBuffer:
    """Active entries keyed by (agent_id, task_id), plus a bounded history of finished ones.

    Mutations take `now` (seconds, the caller's clock) and evict expired history first; a
    refused registration changes nothing, history included.
    """

    def __init__(self, limits: ActivityLimits | None = None) -> None:
        self.limits: Final = limits or ActivityLimits()
        self._by_agent: dict[str, dict[str, ActivityEntry]] = {}
        self._count = 0
        self._history: deque[ActivityEntry] = deque(maxlen=self.limits.history)
        self._now = 0.0

    # --- mutations ----------------------------------------------------------------------------

    def register(self, entry: ActivityEntry, now: float) -> ActivityEntry:
        """Add `entry` as active, or update the entry of the same (agent, task); returns it.

        A `started_at` of 0 means `now` for a new entry and "keep the original" for an
        update. An update never counts against the limits. A new entry past the total or the
        agent's limit raises ActivityBufferFullError (`details["limit"]` is "total" or
        "per_agent") and the buffer is left unchanged. A finished entry is a ValidationError.
        """
        now = _check_time(now, "now")
        if not entry.active:
            raise ValidationError.for_field("outcome", "a registered entry must be active")
        tasks = self._by_agent.get(entry.agent_id, {})
        previous = tasks.get(entry.task_id)
        if previous is None:
            self._check_room(entry, len(tasks))
        started = entry.started_at or (previous.started_at if previous is not None else now)
        stored = replace(entry, started_at=started)
        self._advance(now)
        self._by_agent.setdefault(entry.agent_id, {})[entry.task_id] = stored
        if previous is None:
            self._count += 1
        return stored

    def complete(
        self, agent_id: str, task_id: str, outcome: str, now: float
    ) -> ActivityEntry | None:
        """Finish the agent's entry for `task_id` with outcome COMPLETED or FAILED.

        Returns the finished entry (now in the history), or None when there was no such
        active entry. Any other outcome is a ValidationError naming `outcome`.
        """
        now = _check_time(now, "now")
        if outcome not in _COMPLETE_OUTCOMES:
            raise ValidationError.for_field("outcome", "must be COMPLETED or FAILED")
        self._advance(now)
        entry = self._take(agent_id, task_id)
        return None if entry is None else self._finish(entry, ActivityOutcome(outcome), now)

    def reconcile(self, known_states: Mapping[str, str], now: float) -> list[ActivityEntry]:
        """Purge entries whose task is COMPLETED, FAILED or unknown (RFC 10).

        `known_states` maps task_id to the task's state as the Scheduler knows it; a task
        missing from it is unknown. Purged entries go to the history with outcome PURGED and
        are returned in started_at order.
        """
        now = _check_time(now, "now")
        self._advance(now)
        stale = [
            entry
            for tasks in self._by_agent.values()
            for entry in tasks.values()
            if entry.task_id not in known_states or known_states[entry.task_id] in PURGE_STATES
        ]
        return self._purge_all(sorted(stale, key=_by_start), now)

    def purge_entries(
        self, agent_id: str, task_ids: Iterable[str] | None, now: float
    ) -> list[ActivityEntry]:
        """Remove the agent's entries for `task_ids` (all of them when None); returns them.

        Removed entries go to the history with outcome PURGED; ids with no entry are ignored.
        """
        now = _check_time(now, "now")
        self._advance(now)
        tasks = self._by_agent.get(agent_id, {})
        wanted: Collection[str] = list(tasks) if task_ids is None else set(task_ids)
        chosen = [tasks[task_id] for task_id in wanted if task_id in tasks]
        return self._purge_all(sorted(chosen, key=_by_start), now)

    def purge(self, agent_id: str, task_ids: Iterable[str] | None, now: float) -> int:
        """The PurgeActivity RPC: `purge_entries`, answering how many entries were removed."""
        return len(self.purge_entries(agent_id, task_ids, now))

    # --- reads --------------------------------------------------------------------------------

    def get(self, agent_id: str, task_id: str) -> ActivityEntry | None:
        """The active entry of (agent_id, task_id), or None."""
        return self._by_agent.get(agent_id, {}).get(task_id)

    def active(
        self,
        agent_id: str | None = None,
        repo_id: str | None = None,
        worktree_id: str | None = None,
        task_id: str | None = None,
        *,
        now: float | None = None,
    ) -> list[ActivityEntry]:
        """Active entries matching every filter given (None matches all), by started_at."""
        self._read_at(now)
        pools = (
            self._by_agent.values()
            if agent_id is None
            else [self._by_agent.get(agent_id, {})]  # one agent: skip the others
        )
        found = [
            entry
            for tasks in pools
            for entry in tasks.values()
            if _matches(entry, agent_id, repo_id, worktree_id, task_id)
        ]
        return sorted(found, key=_by_start)

    def history(
        self,
        agent_id: str | None = None,
        repo_id: str | None = None,
        worktree_id: str | None = None,
        task_id: str | None = None,
        *,
        now: float | None = None,
    ) -> list[ActivityEntry]:
        """Recently finished entries matching every filter given, oldest finish first.

        Expired entries are evicted first (at `now`, or the latest time the buffer saw).
        """
        self._read_at(now)
        horizon = self._now - self.limits.history_ttl_s
        found = [
            e
            for e in self._history
            if e.finished_at > horizon and _matches(e, agent_id, repo_id, worktree_id, task_id)
        ]
        return sorted(found, key=lambda e: e.finished_at)

    @property
    def utilization(self) -> float:
        """Active entries as a fraction of `max_entries` (0.0 to 1.0)."""
        return self._count / self.limits.max_entries

    @property
    def over_warning(self) -> bool:
        """Whether the buffer exceeds `warn_ratio` of its capacity (RFC 10.1: > 80 %)."""
        return self._count > self.limits.warn_ratio * self.limits.max_entries

    def __len__(self) -> int:
        """The number of active entries."""
        return self._count

    # --- internals ----------------------------------------------------------------------------

    def _check_room(self, entry: ActivityEntry, agent_count: int) -> None:
        limits = self.limits
        if self._count >= limits.max_entries:
            limit, bound, what = "total", limits.max_entries, "the activity buffer"
        elif agent_count >= limits.per_agent:
            limit, bound, what = "per_agent", limits.per_agent, f"agent {entry.agent_id!r}"
        else:
            return
        raise ActivityBufferFullError(
            f"{what} holds its limit of {bound} active entries",
            {
                "limit": limit,
                "max": str(bound),
                "agent_id": entry.agent_id,
                "task_id": entry.task_id,
            },
        )

    def _take(self, agent_id: str, task_id: str) -> ActivityEntry | None:
        tasks = self._by_agent.get(agent_id)
        if tasks is None or task_id not in tasks:
            return None
        entry = tasks.pop(task_id)
        if not tasks:
            del self._by_agent[agent_id]
        self._count -= 1
        return entry

    def _finish(self, entry: ActivityEntry, outcome: ActivityOutcome, now: float) -> ActivityEntry:
        done = replace(entry, finished_at=now, outcome=outcome)
        if self._history.maxlen:
            self._history.append(done)  # a full deque drops its oldest: count eviction
        return done

    def _purge_all(self, entries: list[ActivityEntry], now: float) -> list[ActivityEntry]:
        out: list[ActivityEntry] = []
        for entry in entries:
            if self._take(entry.agent_id, entry.task_id) is not None:
                out.append(self._finish(entry, ActivityOutcome.PURGED, now))
        return out

    def _read_at(self, now: float | None) -> None:
        self._advance(self._now if now is None else _check_time(now, "now"))

    def _advance(self, now: float) -> None:
        # Age eviction from the oldest end. Finish times follow the caller's clock, so an
        # expired entry may sit behind a newer one until that one goes; reads skip it.
        self._now = max(self._now, now)
        horizon = self._now - self.limits.history_ttl_s
        while self._history and self._history[0].finished_at <= horizon:
            self._history.popleft()
