"""Where tool processes start: the one seam between the tool service and the sandbox.

Command tools start through `Launcher.start` and MCP servers are spawned with the argv
`Launcher.wrap_argv` returns, so that every tool process runs under its ExecutionPolicy
(RFC 18.4, 18.5): budgets, network namespace, privilege level, confinement to the worktree
(docs/sandbox.md). `SandboxLauncher` is `apiary.sandbox` behind this protocol; tests may pass
another implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from apiary import sandbox
from apiary.core.tools.policy import ExecutionPolicy
from apiary.sandbox.process import SandboxedProcess, SandboxSpec
from apiary.sandbox.result import Outcome, SandboxResult

__all__ = [
    "Launcher",
    "Outcome",
    "SandboxLauncher",
    "SandboxResult",
    "SandboxSpec",
    "SandboxedProcess",
]


class Launcher(Protocol):
    """`apiary.sandbox` as the tool service uses it."""

    async def start(self, spec: SandboxSpec) -> SandboxedProcess: ...

    def wrap_argv(
        self,
        argv: Sequence[str],
        policy: ExecutionPolicy,
        *,
        cwd: Path | None = None,
        expose: Sequence[str] = (),
    ) -> list[str]:
        """`argv` behind the prefix that applies the policy to a process someone else spawns;
        `expose`: read-only directories it needs beyond those inferred from its program."""
        ...


class SandboxLauncher:
    """The real launcher: every tool process confined by `apiary.sandbox`."""

    async def start(self, spec: SandboxSpec) -> SandboxedProcess:
        return await sandbox.start(spec)

    def wrap_argv(
        self,
        argv: Sequence[str],
        policy: ExecutionPolicy,
        *,
        cwd: Path | None = None,
        expose: Sequence[str] = (),
    ) -> list[str]:
        return sandbox.wrap_argv(argv, policy, cwd=cwd, expose=expose)
