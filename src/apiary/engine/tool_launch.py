"""Where tool processes start: the one seam between the tool service and the sandbox.

Command tools start through `Launcher.start` and MCP servers are spawned with the argv
`Launcher.wrap_argv` returns, so that every tool process runs under its ExecutionPolicy
(RFC 18.4, 18.5). The names and fields here are those of `apiary.sandbox` (SandboxSpec,
Outcome, SandboxResult, SandboxedProcess, start, wrap_argv), which the real launcher is.

`SubprocessLauncher` is the stand-in used until the sandbox is wired in: a plain
subprocess in its own process group, with the wall-clock budget (WALL_TIMEOUT) and
cancellation, but without the CPU budget, network or privilege enforcement that the sandbox
adds. The coordinator warns when it runs tools with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from apiary.core.tool_policy import ExecutionPolicy

CHUNK_BYTES = 64 * 1024
INHERITED_ENV = frozenset({"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ"})


class Outcome(StrEnum):
    OK = "OK"
    EXIT_NONZERO = "EXIT_NONZERO"
    WALL_TIMEOUT = "WALL_TIMEOUT"
    CPU_BUDGET_EXCEEDED = "CPU_BUDGET_EXCEEDED"
    CANCELLED = "CANCELLED"
    SPAWN_FAILED = "SPAWN_FAILED"


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """What to run, under which policy, where, with what environment and input."""

    argv: Sequence[str]
    policy: ExecutionPolicy
    cwd: Path | None = None
    env: Mapping[str, str] | None = None
    stdin: bytes = b""


@dataclass(frozen=True, slots=True)
class SandboxResult:
    outcome: Outcome
    exit_code: int | None
    signal: int | None
    stdout: bytes
    stderr: bytes
    cpu_ms: int
    wall_ms: int


class SandboxedProcess(Protocol):
    @property
    def pid(self) -> int: ...

    def chunks(self) -> AsyncIterator[bytes]:
        """Standard output as it comes."""
        ...

    async def wait(self) -> SandboxResult: ...

    async def cancel(self, grace_s: float = 2.0) -> None:
        """Terminate, then kill after `grace_s`; the result's outcome is CANCELLED."""
        ...


class Launcher(Protocol):
    """`apiary.sandbox` as the tool service uses it."""

    async def start(self, spec: SandboxSpec) -> SandboxedProcess: ...

    def wrap_argv(
        self, argv: Sequence[str], policy: ExecutionPolicy, *, cwd: Path | None = None
    ) -> list[str]:
        """`argv` behind the prefix that applies the policy to a process someone else spawns."""
        ...


class _Subprocess:
    def __init__(self, process: asyncio.subprocess.Process, spec: SandboxSpec) -> None:
        self._process = process
        self._started = time.monotonic()
        self._stdout = bytearray()
        self._stderr = b""
        self._outcome: Outcome | None = None
        self._stderr_task = asyncio.create_task(self._read_stderr())
        self._stdin_task = asyncio.create_task(self._write_stdin(spec.stdin))
        limit_ms = spec.policy.budget_wall_ms
        self._timer = (
            asyncio.get_running_loop().call_later(limit_ms / 1000, self._kill, Outcome.WALL_TIMEOUT)
            if limit_ms
            else None
        )

    @property
    def pid(self) -> int:
        return self._process.pid

    async def _write_stdin(self, data: bytes) -> None:
        stdin = self._process.stdin
        assert stdin is not None
        with contextlib.suppress(ConnectionError, BrokenPipeError):
            if data:
                stdin.write(data)
                await stdin.drain()
            stdin.close()

    async def _read_stderr(self) -> None:
        assert self._process.stderr is not None
        self._stderr = await self._process.stderr.read()

    def _kill(self, outcome: Outcome, sig: int = signal.SIGKILL) -> None:
        if self._process.returncode is not None:
            return
        self._outcome = self._outcome or outcome
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, sig)

    async def chunks(self) -> AsyncIterator[bytes]:
        stdout = self._process.stdout
        assert stdout is not None
        while chunk := await stdout.read(CHUNK_BYTES):
            self._stdout.extend(chunk)
            yield chunk

    async def wait(self) -> SandboxResult:
        assert self._process.stdout is not None
        rest = await self._process.stdout.read()
        self._stdout.extend(rest)
        code = await self._process.wait()
        if self._timer is not None:
            self._timer.cancel()
        await self._stderr_task
        await self._stdin_task
        outcome = self._outcome or (Outcome.OK if code == 0 else Outcome.EXIT_NONZERO)
        return SandboxResult(
            outcome=outcome,
            exit_code=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            stdout=bytes(self._stdout),
            stderr=self._stderr,
            cpu_ms=0,
            wall_ms=round((time.monotonic() - self._started) * 1000),
        )

    async def cancel(self, grace_s: float = 2.0) -> None:
        self._kill(Outcome.CANCELLED, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(self._process.wait()), grace_s)
        except TimeoutError:
            self._kill(Outcome.CANCELLED)
            await self._process.wait()


def _base_environment() -> dict[str, str]:
    """What a tool inherits when its spec names no environment: enough to find and run
    programs, none of the coordinator's own settings or secrets."""
    return {k: v for k, v in os.environ.items() if k in INHERITED_ENV}


class _SpawnFailed:
    def __init__(self, error: OSError) -> None:
        self._error = error

    @property
    def pid(self) -> int:
        return 0

    async def chunks(self) -> AsyncIterator[bytes]:
        return
        yield b""  # pragma: no cover - makes this an async generator

    async def wait(self) -> SandboxResult:
        message = f"{type(self._error).__name__}: {self._error}".encode()
        return SandboxResult(Outcome.SPAWN_FAILED, None, None, b"", message, 0, 0)

    async def cancel(self, grace_s: float = 2.0) -> None:
        return None


class SubprocessLauncher:
    """The interim launcher (module docstring): no isolation beyond a process group."""

    async def start(self, spec: SandboxSpec) -> SandboxedProcess:
        try:
            process = await asyncio.create_subprocess_exec(
                *spec.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=spec.cwd,
                env=dict(spec.env) if spec.env is not None else _base_environment(),
                start_new_session=True,
            )
        except OSError as exc:
            return _SpawnFailed(exc)
        return _Subprocess(process, spec)

    def wrap_argv(
        self, argv: Sequence[str], policy: ExecutionPolicy, *, cwd: Path | None = None
    ) -> list[str]:
        return list(argv)
