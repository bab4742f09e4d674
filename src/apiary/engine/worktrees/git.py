"""Real `git worktree`s for bindings (RFC 16): create or reuse one per (repo_id, worktree_id).

A worktree lives at `<root>/<repo_id>/<worktree_id>` (root: `<data_dir>/worktrees`) on the
branch named after the worktree unless the BIND names one. Failures are the errors of RFC
16.3, each with git's own words in the message:
- worktree_not_found: the repository is not configured or not a git repository, an id or the
  branch name is not valid, the start commit does not exist;
- worktree_locked: the worktree is locked (`git worktree lock`), or its branch is checked out
  in another worktree;
- permission_denied: the operating system refused (EACCES, EPERM), in Python or in git;
- filesystem_error: anything else (the path is taken by something that is not this
  repository's worktree, git failed otherwise, git took too long).

Git commands run as subprocesses without a shell, with `LC_ALL=C` (their messages are matched)
and no terminal prompts; one repository runs one command at a time (git's own locks would
otherwise fail concurrent `worktree add`s).
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from apiary.core.worktrees.records import valid_id
from apiary.errors import (
    ApiaryError,
    FilesystemError,
    PermissionDeniedError,
    WorktreeLockedError,
    WorktreeNotFoundError,
)

GIT_TIMEOUT_S: Final = 30.0
_PERMISSION_ERRNOS: Final = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
_LOCKED_WORDS: Final = ("is already checked out", "is already used by worktree", "is locked")
_MISSING_WORDS: Final = ("invalid reference", "not a valid", "unknown revision", "not a commit")


@dataclass(frozen=True, slots=True)
class GitWorktree:
    """One entry of `git worktree list --porcelain`."""

    path: Path
    branch: str = ""
    locked: bool = False
    lock_reason: str = ""
    prunable: bool = False


def classify_os_error(exc: OSError, doing: str) -> ApiaryError:
    """The 16.3 reason for an operating-system failure while `doing` something."""
    text = f"{doing}: {exc.strerror or exc}"
    if exc.errno in _PERMISSION_ERRNOS or isinstance(exc, PermissionError):
        return PermissionDeniedError(text)
    return FilesystemError(text)


def classify_git_failure(stderr: str, doing: str) -> ApiaryError:
    """The 16.3 reason for a failed git command, from its (LC_ALL=C) message."""
    text = stderr.strip().splitlines()
    message = f"{doing}: {'; '.join(text[-3:]) if text else 'git failed'}"
    lowered = stderr.lower()
    if "permission denied" in lowered or "operation not permitted" in lowered:
        return PermissionDeniedError(message)
    if any(word in lowered for word in _LOCKED_WORDS):
        return WorktreeLockedError(message)
    if any(word in lowered for word in _MISSING_WORDS):
        return WorktreeNotFoundError(message)
    return FilesystemError(message)


def parse_worktree_list(porcelain: str) -> list[GitWorktree]:
    """The entries of `git worktree list --porcelain` (blank-line separated records)."""
    found: list[GitWorktree] = []
    for block in porcelain.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, _, value = line.partition(" ")
            fields[key] = value
        if "worktree" not in fields:
            continue
        found.append(
            GitWorktree(
                path=Path(fields["worktree"]),
                branch=fields.get("branch", "").removeprefix("refs/heads/"),
                locked="locked" in fields,
                lock_reason=fields.get("locked", ""),
                prunable="prunable" in fields,
            )
        )
    return found


class GitWorktrees:
    """Creates and finds the worktrees under `root`; `repos` maps repo_id to its path."""

    def __init__(self, root: Path | None, repos: Mapping[str, Path], git: str = "git") -> None:
        self.root = None if root is None else root.resolve()
        self.repos = dict(repos)
        self._git = git
        self._locks: dict[str, asyncio.Lock] = {}

    def path_for(self, repo_id: str, worktree_id: str) -> Path | None:
        """Where the worktree lives; None when there is no root or an id is not valid."""
        if self.root is None or not (valid_id(repo_id) and valid_id(worktree_id)):
            return None
        return self.root / repo_id / worktree_id

    def repository(self, repo_id: str) -> Path:
        """The configured repository's path; worktree_not_found for an unknown or bad id."""
        path = self.repos.get(repo_id) if valid_id(repo_id) else None
        if path is None:
            raise WorktreeNotFoundError(
                f"no repository {repo_id!r} is configured ([[worktrees.repos]])",
                {"repo_id": repo_id},
            )
        return path

    async def ensure(
        self, repo_id: str, worktree_id: str, branch: str = "", start: str = ""
    ) -> Path:
        """The worktree's directory, created (with its branch, from `start` or HEAD) unless
        it exists already; raises the 16.3 error that describes a failure."""
        repo = self.repository(repo_id)
        if not valid_id(worktree_id):
            raise WorktreeNotFoundError(
                f"{worktree_id!r} cannot name a worktree", {"worktree_id": worktree_id}
            )
        target = self.path_for(repo_id, worktree_id)
        if target is None:
            raise FilesystemError("the coordinator has no data directory for worktrees")
        lock = self._locks.setdefault(repo_id, asyncio.Lock())
        async with lock:
            await self._check_repository(repo)
            known = {w.path: w for w in await self.list(repo_id)}
            found = known.get(await asyncio.to_thread(target.resolve))
            if found is not None and found.locked:
                reason = f" ({found.lock_reason})" if found.lock_reason else ""
                raise WorktreeLockedError(
                    f"worktree {repo_id}/{worktree_id} is locked{reason}",
                    {"repo_id": repo_id, "worktree_id": worktree_id},
                )
            if found is not None and await asyncio.to_thread(target.is_dir):
                return target
            if found is not None:  # registered, directory gone: let git forget it first
                await self._run(repo, "worktree", "prune", doing="git worktree prune")
            await self._create(repo, target, branch or worktree_id, start)
            return target

    async def list(self, repo_id: str) -> list[GitWorktree]:
        """The repository's worktrees as git reports them (paths resolved)."""
        repo = self.repository(repo_id)
        out = await self._run(repo, "worktree", "list", "--porcelain", doing="git worktree list")
        return [
            GitWorktree(w.path.resolve(), w.branch, w.locked, w.lock_reason, w.prunable)
            for w in parse_worktree_list(out)
        ]

    async def _check_repository(self, repo: Path) -> None:
        if not await asyncio.to_thread(repo.is_dir):
            raise WorktreeNotFoundError(f"repository {repo} does not exist")
        try:
            await self._run(repo, "rev-parse", "--git-dir", doing=f"open repository {repo}")
        except FilesystemError as exc:
            raise WorktreeNotFoundError(exc.message) from None

    async def _create(self, repo: Path, target: Path, branch: str, start: str) -> None:
        if start.startswith("-"):
            raise WorktreeNotFoundError(f"{start!r} is not a commit")
        await asyncio.to_thread(_make_room, repo, target)
        if branch.startswith("-") or not await self._succeeds(
            repo, "check-ref-format", "--branch", branch
        ):
            raise WorktreeNotFoundError(f"{branch!r} is not a valid branch name")
        ref = f"refs/heads/{branch}"
        exists = await self._succeeds(repo, "rev-parse", "--verify", "--quiet", ref)
        if exists:
            args = ["worktree", "add", str(target), branch]
        else:
            args = ["worktree", "add", "-b", branch, str(target), start or "HEAD"]
        await self._run(repo, *args, doing=f"git worktree add {target.name}")

    async def _succeeds(self, repo: Path, *args: str) -> bool:
        code, _, _ = await self._exec(repo, args)
        return code == 0

    async def _run(self, repo: Path, *args: str, doing: str) -> str:
        code, out, err = await self._exec(repo, args)
        if code != 0:
            raise classify_git_failure(err or out, doing)
        return out

    async def _exec(self, repo: Path, args: tuple[str, ...]) -> tuple[int, str, str]:
        env = {**os.environ, "LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0"}
        try:
            proc = await asyncio.create_subprocess_exec(
                self._git, "-C", str(repo), *args, env=env, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
        except OSError as exc:
            raise classify_os_error(exc, f"run {self._git}") from None
        try:
            async with asyncio.timeout(GIT_TIMEOUT_S):
                out, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise FilesystemError(f"git {args[0]} took longer than {GIT_TIMEOUT_S:.0f} s") from None
        return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


def _make_room(repo: Path, target: Path) -> None:
    """Create the worktree's parent directory; refuse a target path already taken."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise classify_os_error(exc, f"create {target.parent}") from None
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FilesystemError(f"{target} exists and is not a worktree of {repo}")
