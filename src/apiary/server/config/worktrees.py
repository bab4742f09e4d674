"""The [worktrees] table and its [[worktrees.repos]] (WorktreeSettings; docs/worktrees.md)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from apiary.core.worktrees.machine import BindingPolicy
from apiary.core.worktrees.records import valid_id
from apiary.engine.worktrees.settings import RepoEntry, WorktreeSettings
from apiary.errors import ValidationError
from apiary.server.config.values import built, check_known, typed, typed_fields

_WORKTREE_POLICY: dict[str, type] = {
    "retry_base_s": float,
    "max_retries": int,
    "recovery_timeout_s": float,
    "default_ttl_s": float,
    "max_ttl_s": float,
}


def _repo_entries(values: Any, source: str, base: Path) -> tuple[RepoEntry, ...]:
    if not isinstance(values, list):
        raise ValidationError(
            f"{source}: repos must be [[worktrees.repos]] tables", {"field": "repos"}
        )
    entries: dict[str, RepoEntry] = {}
    for i, entry in enumerate(values):
        where = f"{source} repos[{i}]"
        if not isinstance(entry, dict):
            raise ValidationError(f"{where}: must be a table", {"field": "repos"})
        check_known(entry, {"id", "path"}, "repos.", where)
        repo_id, path = entry.get("id"), entry.get("path")
        if not isinstance(repo_id, str) or not valid_id(repo_id):
            raise ValidationError(
                f"{where}: id must be 1-128 of A-Z a-z 0-9 . _ - (not {repo_id!r})",
                {"field": "repos.id"},
            )
        if not isinstance(path, str) or not path:
            raise ValidationError(f"{where}: path must be a string", {"field": "repos.path"})
        if repo_id in entries:
            raise ValidationError(f"{where}: repository {repo_id!r} is configured twice",
                                  {"field": "repos.id"})  # fmt: skip
        entries[repo_id] = RepoEntry(repo_id, (base / Path(path).expanduser()).resolve())
    return tuple(entries.values())


def worktree_settings(values: Mapping[str, Any], source: str, base: Path) -> WorktreeSettings:
    """WorktreeSettings from the [worktrees] table: policy keys, `hitl_timeout_s`, `root`
    and the [[worktrees.repos]] tables (`id`, `path`; a relative path, of a repository or
    the root, is taken from `base`, the configuration file's directory)."""
    scalars = {k: v for k, v in values.items() if k not in ("repos", "hitl_timeout_s", "root")}
    policy = typed_fields(scalars, _WORKTREE_POLICY, "", source)
    changes: dict[str, Any] = {"policy": built(BindingPolicy, source, **policy)}
    if "hitl_timeout_s" in values:
        timeout = typed(values["hitl_timeout_s"], float, "hitl_timeout_s", source)
        if timeout < 0:
            raise ValidationError(
                f"{source}: hitl_timeout_s must be >= 0 (0: the [hitl] default)",
                {"field": "hitl_timeout_s"},
            )
        changes["hitl_timeout_s"] = timeout
    if "root" in values:
        root = values["root"]
        if not isinstance(root, str) or not root:
            raise ValidationError(
                f"{source}: root must be a directory's path (a string)", {"field": "root"}
            )
        changes["root"] = (base / Path(root).expanduser()).resolve()
    if "repos" in values:
        changes["repos"] = _repo_entries(values["repos"], source, base)
    return WorktreeSettings(**changes)
