"""Command tools: programs declared in the configuration (`[[tools.commands]]`), run in the
sandbox under each call's execution policy (RFC 18.4, 18.5).

A call fills the command's argv template from its JSON arguments (`core/tools/argv.py`) and,
with `stdin = "args"` (the default), writes the arguments' JSON to the command's standard
input and closes it; with `stdin = "none"` it writes nothing. With `stdin = "stream"` the
command is interactive: its standard input stays open while it runs, and what
`write_stdin` is given goes to it (the runtime control plane's write_process_stdin). Standard
output streams back as frames; the final frame carries the exit code and the times. A tool
that needs a worktree runs with the caller's bound worktree root as its working directory.

Outcomes: a non-zero exit is TOOL_FAILED (with the exit code and the end of standard
error), the wall budget WALL_TIMEOUT, the CPU budget CPU_BUDGET_EXCEEDED, a cancellation
CANCELLED, a program that cannot start `unavailable`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

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
    AlreadyInProgressError,
    ApiaryError,
    CallCancelledError,
    CpuBudgetExceededError,
    ToolFailedError,
    UnavailableError,
    ValidationError,
    WallTimeoutError,
)

log = logging.getLogger("apiary.tools")
STDERR_TAIL = 2000
CANCEL_GRACE_S = 2.0
STDIN_MODES: Final = ("args", "none", "stream")


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
    """'args': the arguments' JSON on standard input; 'none': nothing; 'stream': nothing at
    first, and standard input stays open for `CommandToolProvider.write_stdin`."""
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
        self._launching: dict[str, asyncio.Event] = {}
        """Calls whose process is being started (write_stdin waits for it)."""

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
        stdin = json.dumps(invocation.arguments).encode() if spec.stdin == "args" else b""
        launched = self._launching[invocation.call_id] = asyncio.Event()
        try:
            process = await self._launcher.start(
                SandboxSpec(argv, invocation.policy, cwd=invocation.cwd, env=spec.env,
                            stdin=stdin, keep_stdin=spec.stdin == "stream")
            )  # fmt: skip
            self._running[invocation.call_id] = process
        finally:
            del self._launching[invocation.call_id]
            launched.set()
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

    async def write_stdin(self, call_id: str, data: bytes, *, eof: bool = False) -> None:
        """Write to the standard input of the running call `call_id` (a `stdin = "stream"`
        tool's); AlreadyCompletedError when its process has ended or closed its input,
        ValidationError when its tool takes no input, AlreadyInProgressError when its process
        is not running (ended, or between attempts)."""
        launching = self._launching.get(call_id)
        if launching is not None:  # its process starts: the input is for it
            await launching.wait()
        process = self._running.get(call_id)
        if process is None:
            raise AlreadyInProgressError(
                f"tool call {call_id} has no running process now (between attempts, or ended)",
                {"call_id": call_id},
            )
        if not process.interactive:
            raise ValidationError.for_field(
                "call_id", f"{call_id} runs a command whose standard input is not open "
                '(its tool is not configured with stdin = "stream")',
            )  # fmt: skip
        await process.write_stdin(data, eof=eof)

    async def cancel(self, call_id: str) -> None:
        process = self._running.get(call_id)
        if process is not None:
            await process.cancel(CANCEL_GRACE_S)

    async def close(self) -> None:
        for process in list(self._running.values()):
            await process.cancel(0.0)
