"""What the coordinator holds on an agent's behalf, so that its end can give it all back.

RFC 8.4: cleanup MUST be complete "regardless of shutdown method (graceful or timeout)" and
cover "temporary files, network connections, locks, and any other system resources"; it
SHOULD rest on resource tracking. Whoever acquires something for an agent tracks it here
with the callable that releases it, and `release_all` runs every one of them when the
lifecycle says so: a failing release is reported, never allowed to leave the rest held.

Releases run newest first, as an exit stack unwinds: a later acquisition may depend on an
earlier one (a lock taken on a file inside the agent's temporary directory), never the
other way round.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from apiary.engine.eventlog import EventRecorder
from apiary.errors import ValidationError

log = logging.getLogger(__name__)

Release = Callable[[], Awaitable[None]] | Callable[[], None]
"""Gives one resource back; may be a coroutine function (closing a connection) or plain."""


class ResourceKind(StrEnum):
    """The resource kinds RFC 8.4 names for cleanup."""

    TEMP_FILE = "TEMP_FILE"
    """A temporary file or directory (removed on release)."""
    CONNECTION = "CONNECTION"
    LOCK = "LOCK"
    OTHER = "OTHER"


@dataclass(frozen=True, slots=True)
class ResourceHandle:
    """One tracked resource; `serial` tells two resources of the same name apart."""

    agent_id: str
    kind: ResourceKind
    name: str
    serial: int


@dataclass(frozen=True, slots=True)
class ReleaseFailure:
    kind: ResourceKind
    name: str
    error: str
    """The exception's type and text, for the operator who has to clean up by hand."""


@dataclass(frozen=True, slots=True)
class ReleaseReport:
    """The outcome of `release_all`: every resource it tried, released or failed."""

    agent_id: str
    reason: str
    released: tuple[tuple[ResourceKind, str], ...]
    failures: tuple[ReleaseFailure, ...]

    @property
    def complete(self) -> bool:
        return not self.failures


_Entry = tuple[ResourceHandle, Release]


class ResourceTracker:
    """Per-agent resources and their releases; per-agent temporary directories under `root`.

    `root` holds one directory per agent (the coordinator passes `<data_dir>/agents`);
    without one there are no temporary directories (an in-memory deployment), and
    `temp_dir` says so rather than guessing a place on the filesystem.
    """

    def __init__(self, events: EventRecorder, root: Path | None = None) -> None:
        self._events = events
        self._root = root
        self._held: dict[str, dict[int, _Entry]] = {}
        self._temp_dirs: dict[str, ResourceHandle] = {}
        self._serials = itertools.count(1)

    def track(
        self, agent_id: str, kind: ResourceKind, name: str, release: Release
    ) -> ResourceHandle:
        """Remember that `agent_id` holds `name`; `release` gives it back at the agent's end."""
        handle = ResourceHandle(agent_id, ResourceKind(kind), name, next(self._serials))
        self._held.setdefault(agent_id, {})[handle.serial] = (handle, release)
        return handle

    def untrack(self, handle: ResourceHandle) -> bool:
        """Forget a resource its owner already gave back; False when it was not tracked."""
        held = self._held.get(handle.agent_id)
        if held is None or held.pop(handle.serial, None) is None:
            return False
        if not held:
            del self._held[handle.agent_id]
        return True

    def held(self, agent_id: str) -> list[tuple[ResourceKind, str]]:
        """(kind, name) of what `agent_id` holds, oldest first."""
        return [(h.kind, h.name) for h, _ in self._held.get(agent_id, {}).values()]

    async def release_all(self, agent_id: str, reason: str) -> ReleaseReport:
        """Release everything `agent_id` holds, newest first, and forget it.

        Every release runs even when others fail; failures are in the report and the
        `agent.resources_released` event, which is recorded even when nothing was held, so
        that the log shows the cleanup happened. A release interrupted by cancellation
        stays tracked, with those not yet run, for the next attempt.
        """
        claimed = self._held.pop(agent_id, {})
        pending = list(reversed(claimed.values()))
        released: list[tuple[ResourceKind, str]] = []
        failures: list[ReleaseFailure] = []
        try:
            while pending:
                handle, release = pending[0]
                try:
                    result = release()
                    if inspect.isawaitable(result):
                        await result
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    log.warning("releasing %s %s of %s failed: %s", handle.kind, handle.name,
                                agent_id, error)  # fmt: skip
                    failures.append(ReleaseFailure(handle.kind, handle.name, error))
                else:
                    released.append((handle.kind, handle.name))
                pending.pop(0)
        finally:
            if pending:
                back = self._held.setdefault(agent_id, {})
                back.update({h.serial: (h, r) for h, r in reversed(pending)})
        temp = self._temp_dirs.get(agent_id)
        if temp is not None and temp.serial not in self._held.get(agent_id, {}):
            del self._temp_dirs[agent_id]
        await self._events.record(
            "agent.resources_released", "coordinator", agent_id=agent_id, reason=reason,
            released=[{"kind": str(kind), "name": name} for kind, name in released],
            failures=[{"kind": str(f.kind), "name": f.name, "error": f.error} for f in failures],
        )  # fmt: skip
        return ReleaseReport(agent_id, reason, tuple(released), tuple(failures))

    def temp_dir(self, agent_id: str) -> Path:
        """The agent's private temporary directory, `<root>/<agent_id>/tmp`.

        Created (mode 0o700) and tracked as a TEMP_FILE on first use, so that `release_all`
        removes it with everything in it. Agent ids are free-form strings; one that would
        name another directory ("..", "a/b") is refused rather than escaped, so that a
        directory name always maps back to exactly one agent.
        """
        if self._root is None:
            raise RuntimeError(
                "no data directory is configured, so agents have no temporary directories"
            )
        _check_path_safe(agent_id)
        agent_dir = self._root / agent_id
        path = agent_dir / "tmp"
        if not path.resolve().is_relative_to(self._root.resolve()):
            raise ValidationError.for_field(
                "agent_id", f"leaves the agents' directory: {agent_id!r}"
            )
        agent_dir.parent.mkdir(parents=True, exist_ok=True)
        agent_dir.mkdir(mode=0o700, exist_ok=True)
        path.mkdir(mode=0o700, exist_ok=True)
        handle = self._temp_dirs.get(agent_id)
        if handle is None or handle.serial not in self._held.get(agent_id, {}):

            async def remove() -> None:
                await asyncio.to_thread(_remove_dir, path)

            self._temp_dirs[agent_id] = self.track(
                agent_id, ResourceKind.TEMP_FILE, str(path), remove
            )
        return path


def _check_path_safe(agent_id: str) -> None:
    if not agent_id:
        raise ValidationError.for_field("agent_id", "must not be empty")
    if agent_id in {".", ".."}:
        raise ValidationError.for_field("agent_id", f"must not be {agent_id!r}")
    for bad in ("/", "\\", "\x00"):
        if bad in agent_id:
            raise ValidationError.for_field("agent_id", f"must not contain {bad!r}")


def _remove_dir(path: Path) -> None:
    """Remove the agent's temporary directory, then its own directory if nothing else is in
    it (other parts of the coordinator may keep files there)."""
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)
    with contextlib.suppress(OSError):
        path.parent.rmdir()
