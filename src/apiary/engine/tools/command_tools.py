"""Command tools: programs declared in the configuration (`[[tools.commands]]`), run in the
sandbox under each call's execution policy (RFC 18.4, 18.5).

A call fills the command's argv template from its JSON arguments (`core/tools/argv.py`) and,
unless `stdin = "none"`, writes the arguments' JSON to the command's standard input. Standard
output streams back as frames; the final frame carries the exit code and the times. A tool
that needs a worktree runs with the caller's bound worktree root as its working directory.

Outcomes: a non-zero exit is TOOL_FAILED (with the exit code and the end of standard
error), the wall budget WALL_TIMEOUT, the CPU budget CPU_BUDGET_EXCEEDED, a cancellation
CANCELLED, a program that cannot start `unavailable`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field

from apiary.core.tools.argv import render_argv
from apiary.core.tools.descriptor import ProviderKind, ToolDescriptor
from apiary.core.tools.policy import ExecutionPolicy
from apiary.engine.tools.launch import (
    Launcher,
    Outcome,
    SandboxedProcess,
    SandboxResult,
    SandboxSpec,
)
from apiary.engine.tools.providers import READY, Frame, Invocation
from apiary.errors import (
    ApiaryError,
    CallCancelledError,
    CpuBudgetExceededError,
    ToolFailedError,
    UnavailableError,
    WallTimeoutError,
)

log = logging.getLogger("apiary.tools")
STDERR_TAIL = 2000
CANCEL_GRACE_S = 2.0


@dataclass(frozen=True, slots=True)
class CommandToolSpec:
    """One `[[tools.commands]]` entry."""

    provider_id: str
    descriptor: ToolDescriptor
    argv: tuple[str, ...]
    policy: ExecutionPolicy = field(default_factory=ExecutionPolicy)
    """The tool's default execution policy; a call's own policy fields override it."""
    env: Mapping[str, str] | None = None
    """The command's whole environment; None: the sandbox's default."""
    stdin: str = "args"
    """'args': the arguments' JSON on standard input; 'none': nothing."""
    content_type: str = "text/plain"
    """The content type of the command's output."""


def _failure(result: SandboxResult) -> ApiaryError:
    stderr = result.stderr[-STDERR_TAIL:].decode("utf-8", "replace").strip()
    if result.outcome is Outcome.WALL_TIMEOUT:
        return WallTimeoutError(
            f"the command ran out of its wall-clock budget after {result.wall_ms} ms",
            {"wall_ms": str(result.wall_ms)},
        )
    if result.outcome is Outcome.CPU_BUDGET_EXCEEDED:
        return CpuBudgetExceededError(
            f"the command used its CPU budget ({result.cpu_ms} ms)", {"cpu_ms": str(result.cpu_ms)}
        )
    if result.outcome is Outcome.CANCELLED:
        return CallCancelledError("the command was stopped on request")
    if result.outcome is Outcome.SPAWN_FAILED:
        return UnavailableError(f"the command could not start: {stderr}")
    how = (
        f"exit code {result.exit_code}"
        if result.exit_code is not None
        else f"signal {result.signal}"
    )
    return ToolFailedError(
        f"the command failed ({how})" + (f": {stderr}" if stderr else ""),
        {"exit_code": str(result.exit_code if result.exit_code is not None else "")},
    )


class CommandToolProvider:
    """The tools of one configured provider id; every call is its own sandboxed process."""

    def __init__(
        self, provider_id: str, specs: Sequence[CommandToolSpec], launcher: Launcher
    ) -> None:
        self._provider_id = provider_id
        self._specs = {s.descriptor.tool_name: s for s in specs}
        self._launcher = launcher
        self._running: dict[str, SandboxedProcess] = {}

    @property
    def provider_id(self) -> str:
        return self._provider_id

    @property
    def kind(self) -> ProviderKind:
        return ProviderKind.COMMAND

    @property
    def state(self) -> str:
        return READY

    def spec(self, tool_name: str) -> CommandToolSpec:
        return self._specs[tool_name]

    async def describe(self) -> tuple[ToolDescriptor, ...]:
        return tuple(s.descriptor for s in self._specs.values())

    async def call(self, invocation: Invocation) -> AsyncGenerator[Frame, None]:
        spec = self._specs[invocation.tool.tool_name]
        argv = render_argv(spec.argv, invocation.arguments)
        stdin = b"" if spec.stdin == "none" else json.dumps(invocation.arguments).encode()
        process = await self._launcher.start(
            SandboxSpec(argv, invocation.policy, cwd=invocation.cwd, env=spec.env, stdin=stdin)
        )
        self._running[invocation.call_id] = process
        done = False
        try:
            async for chunk in process.chunks():
                yield Frame(chunk, spec.content_type)
            result = await process.wait()
            done = True
        finally:
            self._running.pop(invocation.call_id, None)
            if not done:
                # The service stopped listening (a deadline, the caller left): the process
                # must not outlive the call.
                await process.cancel(0.0)
                await process.wait()
        if result.outcome is not Outcome.OK:
            raise _failure(result)
        summary = {
            "exit_code": result.exit_code,
            "cpu_ms": result.cpu_ms,
            "wall_ms": result.wall_ms,
        }
        yield Frame(b"", spec.content_type, final=True, summary=summary)

    async def cancel(self, call_id: str) -> None:
        process = self._running.get(call_id)
        if process is not None:
            await process.cancel(CANCEL_GRACE_S)

    async def close(self) -> None:
        for process in list(self._running.values()):
            await process.cancel(0.0)
