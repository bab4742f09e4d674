"""An agent's worktree binding as stored (RFC 16): its state, its home, where it works now,
a pending switch, its deadlines; and the ids a repository or worktree may have.

`core/worktrees/machine.py` changes a binding; the store, the wire and the engine read it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Final


class BindingState(StrEnum):
    """The five states of RFC 16.1 (the canonical StatusResponse spells them so)."""

    UNBOUND = "UNBOUND"
    BOUND_HOME = "BOUND_HOME"
    SWITCH_PENDING = "SWITCH_PENDING"
    BOUND_NON_HOME = "BOUND_NON_HOME"
    BIND_FAILED = "BIND_FAILED"


class BindingTimer(StrEnum):
    """The deadlines a binding can have, one of each at most."""

    RETRY = "retry"
    RECOVERY = "recovery"
    TTL = "ttl"


_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_ID_LENGTH: Final = 256
"""Longest id a record keeps (a failed BIND records what it was asked for, valid or not)."""


def valid_id(value: str) -> bool:
    """Whether `value` can name a repository or worktree: 1-128 of [A-Za-z0-9._-], starting
    with a letter or digit, no "..", not ending in "." or ".lock" (a path component and a git
    ref component both, so that an id can never escape the worktrees directory)."""
    return (
        _ID.fullmatch(value) is not None
        and ".." not in value
        and not value.endswith((".", ".lock"))
    )


@dataclass(frozen=True, slots=True)
class Location:
    """A worktree: (repo_id, worktree_id)."""

    repo_id: str
    worktree_id: str

    def __str__(self) -> str:
        return f"{self.repo_id}/{self.worktree_id}"


@dataclass(frozen=True, slots=True)
class WorktreeBinding:
    """One agent's binding, as stored.

    `repo_id`/`worktree_id`/`branch`/`commit_sha` are the home (in BIND_FAILED: the one the
    failing BIND asked for, which retries ask for again); `current_*` where the agent works
    when bound; `target_*` the worktree of a pending switch. `reason` is the error code of
    BIND_FAILED ("" in every other state) and `note` says what happened last. `attempts`
    counts failed bind attempts in BIND_FAILED. Deadlines are UTC seconds, 0.0 for none.
    `invocation_id` is the HITL invocation open about this binding (a switch's approval, or
    the bind recovery escalation). `version` increases by one with every stored change
    (optimistic concurrency).
    """

    agent_id: str
    state: str = BindingState.UNBOUND.value
    repo_id: str = ""
    worktree_id: str = ""
    branch: str = ""
    commit_sha: str = ""
    """Where the home branch starts when the BIND creates it ("": HEAD)."""
    current_repo_id: str = ""
    current_worktree_id: str = ""
    target_repo_id: str = ""
    target_worktree_id: str = ""
    reason: str = ""
    note: str = ""
    attempts: int = 0
    retry_at: float = 0.0
    recovery_at: float = 0.0
    expires_at: float = 0.0
    ttl_s: float = 0.0
    """The TTL a pending switch asked for (0.0: the approval's or the default)."""
    invocation_id: str = ""
    entered_at: float = 0.0
    updated_at: float = 0.0
    version: int = 0

    @property
    def home(self) -> Location | None:
        return Location(self.repo_id, self.worktree_id) if self.worktree_id else None

    @property
    def current(self) -> Location | None:
        return (
            Location(self.current_repo_id, self.current_worktree_id)
            if self.current_worktree_id
            else None
        )

    @property
    def target(self) -> Location | None:
        return (
            Location(self.target_repo_id, self.target_worktree_id)
            if self.target_worktree_id
            else None
        )

    def deadline(self, timer: BindingTimer) -> float:
        return {
            BindingTimer.RETRY: self.retry_at,
            BindingTimer.RECOVERY: self.recovery_at,
            BindingTimer.TTL: self.expires_at,
        }[timer]


def is_bound(state: str) -> bool:
    """Whether an agent in `state` has a worktree to work in. BIND_FAILED counts as unbound
    (16.3: treated like UNBOUND; no worktree-requiring work)."""
    return state in (
        BindingState.BOUND_HOME,
        BindingState.SWITCH_PENDING,
        BindingState.BOUND_NON_HOME,
    )


def working_location(binding: WorktreeBinding) -> Location | None:
    """Where the agent may work now: its current worktree when bound, None otherwise."""
    return binding.current if is_bound(binding.state) else None
