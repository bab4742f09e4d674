"""Worktree configuration (TOML [worktrees] and [[worktrees.repos]]; docs/worktrees.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from apiary.core.worktrees.machine import DEFAULT_POLICY, BindingPolicy


@dataclass(frozen=True, slots=True)
class RepoEntry:
    """A repository agents may bind worktrees of: `[[worktrees.repos]]` id and path."""

    repo_id: str
    path: Path


@dataclass(frozen=True, slots=True)
class WorktreeSettings:
    """Worktree configuration: TOML table [worktrees] and its [[worktrees.repos]] entries."""

    policy: BindingPolicy = DEFAULT_POLICY
    repos: tuple[RepoEntry, ...] = ()
    hitl_timeout_s: float = 0.0
    """Deadline of the HITL invocations of switches and escalations; 0: the [hitl] default."""
    root: Path | None = None
    """Where worktrees are made; None: `<data_dir>/worktrees`. In cluster mode, storage
    every replica that may lead reaches at this path (docs/cluster.md, "The leader")."""

    def repo_paths(self) -> dict[str, Path]:
        return {r.repo_id: r.path for r in self.repos}
