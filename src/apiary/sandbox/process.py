"""Run a program under an ExecutionPolicy: the sandbox's public API.

`start(spec)` spawns the launcher (`python -m apiary.sandbox.launch`), which confines the
program (network, filesystem, privileges; see docs/sandbox.md) and execs it. This module adds
what only the caller can do: the wall-clock and CPU budgets (a watcher that kills the whole
process tree), cancellation, the captured output and the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, Self

import apiary
from apiary.core.tools.policy import ExecutionPolicy
from apiary.errors import AlreadyCompletedError, InternalError, PermissionDeniedError
from apiary.sandbox.plan import LaunchPlan
from apiary.sandbox.proctree import TreeCpuMeter, kill_tree
from apiary.sandbox.result import Outcome, SandboxResult

LAUNCHER: Final = "apiary.sandbox.launch"
_DRAIN_AFTER_EXIT_S: Final = 2.0
_KILL_WAIT_S: Final = 2.0
_STREAM_CHUNK: Final = 65536


@dataclass(frozen=True)
class SandboxSpec:
    """One program to run and the policy to run it under."""

    argv: Sequence[str]
    policy: ExecutionPolicy
    cwd: Path | None = None
    """The worktree root for DEFAULT and above. With None, MINIMAL and DEFAULT work in a private
    empty tmpfs; ELEVATED and PRIVILEGED in a private temporary directory removed afterwards."""
    env: Mapping[str, str] | None = None
    """Default: PATH and LANG from the coordinator, HOME = the working directory."""
    stdin: bytes = b""
    keep_stdin: bool = False
    """Leave standard input open after `stdin` for `SandboxedProcess.write_stdin` (an
    interactive program); False: it is closed once `stdin` is written."""
    expose: tuple[str, ...] = ()
    """Directories MINIMAL and DEFAULT need to see beyond those the sandbox infers from the
    program (its interpreter, virtual environment, node_modules); read-only, absolute."""


def wrap_argv(
    argv: Sequence[str],
    policy: ExecutionPolicy,
    *,
    cwd: Path | None = None,
    expose: Sequence[str] = (),
) -> list[str]:
    """The command that runs `argv` under the network and privilege parts of `policy`, for a
    process someone else spawns (the MCP SDK's stdio client spawns MCP servers itself).

    Budgets are not applied (measure per-call CPU with `process_cpu_ms` deltas); the
    environment is whatever the spawner passes; the launcher exits as the program does.
    Raises PermissionDeniedError for an allowlist the sandbox cannot enforce, ValidationError
    for an `expose` entry that is relative or too broad (see SandboxSpec.expose).
    """
    plan = LaunchPlan.from_policy(
        policy, cwd=str(cwd) if cwd is not None else None, expose=tuple(expose)
    )
    return [sys.executable, "-m", LAUNCHER, plan.encode(), "--", *argv]


async def start(spec: SandboxSpec) -> SandboxedProcess:
    """Spawn `spec.argv` confined by `spec.policy`; returns once it runs.

    Raises PermissionDeniedError when the policy cannot be enforced here (never runs the
    program unconfined instead) and InternalError when the launcher itself cannot start. A
    program that cannot be executed yields a process whose result is SPAWN_FAILED.
    """
    policy = spec.policy
    cwd = str(spec.cwd) if spec.cwd is not None else None
    tempdir = None
    if cwd is None and not LaunchPlan(privilege=policy.privilege).confine_fs:
        tempdir = cwd = tempfile.mkdtemp(prefix="apiary-sandbox-")
    env = dict(spec.env) if spec.env is not None else _default_env(cwd)
    cpu_limit_s = math.ceil(policy.budget_cpu_ms / 1000) + 1 if policy.budget_cpu_ms else 0
    report_r, report_w = os.pipe()
    env_fd = os.memfd_create("apiary-sandbox-env")
    try:
        os.write(env_fd, json.dumps(env).encode())
        plan = LaunchPlan.from_policy(
            policy,
            cwd=cwd,
            env_fd=env_fd,
            cpu_limit_s=cpu_limit_s,
            report_fd=report_w,
            expose=spec.expose,
        )
        started_at = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", LAUNCHER, plan.encode(), "--", *spec.argv],
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            pass_fds=(report_w, env_fd),
            start_new_session=True,
            env=_launcher_env(),
        )
    except BaseException as exc:
        os.close(report_r)
        _remove(tempdir)
        if isinstance(exc, OSError):
            raise InternalError(f"cannot start the sandbox launcher: {exc}") from exc
        raise
    finally:
        os.close(report_w)
        os.close(env_fd)
    sandboxed = SandboxedProcess(proc, spec, started_at, report_r, tempdir)
    try:
        await sandboxed._until_started()
    except BaseException:
        await sandboxed.kill()
        raise
    return sandboxed


async def run(spec: SandboxSpec) -> SandboxResult:
    """start(spec) and wait for the result; cancelling the caller kills the process."""
    process = await start(spec)
    try:
        return await process.wait()
    except asyncio.CancelledError:
        await process.kill()
        raise


class SandboxedProcess:
    """A running sandboxed program. `pid` is the launcher's: the process group leader, which
    exits as the program does; the program runs below it."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        spec: SandboxSpec,
        started_at: float,
        report_fd: int,
        tempdir: str | None,
    ) -> None:
        self.pid: int = proc.pid
        self._proc = proc
        self._spec = spec
        self._started_at = started_at
        self._tempdir = tempdir
        self._verdict: Outcome | None = None
        self._stdout: list[bytes] = []
        self._stderr: list[bytes] = []
        self._stdout_eof = False
        self._stdout_changed = asyncio.Condition()
        self._cpu_ms = 0
        self._setup_error: dict[str, str] | None = None
        self._started = asyncio.Event()
        self._stdin_lock = asyncio.Lock()
        self._stdin_open = True
        self._exit = asyncio.ensure_future(proc.wait())
        self._io = [
            asyncio.ensure_future(self._read_stdout()),
            asyncio.ensure_future(_drain(proc.stderr, self._stderr)),
            asyncio.ensure_future(self._write_stdin()),
        ]
        self._reports = asyncio.ensure_future(self._read_reports(report_fd))
        self._watcher = asyncio.ensure_future(self._watch())
        self._result = asyncio.ensure_future(self._finish())

    # ---- public ---------------------------------------------------------------------------------

    async def chunks(self) -> AsyncIterator[bytes]:
        """Stdout as it arrives, from the first byte, until the program closes it."""
        index = 0
        while True:
            async with self._stdout_changed:
                while index >= len(self._stdout) and not self._stdout_eof:
                    await self._stdout_changed.wait()
                pending = self._stdout[index:]
            for chunk in pending:
                yield chunk
            index += len(pending)
            if not pending and self._stdout_eof:
                return

    async def wait(self) -> SandboxResult:
        """The result once the program and everything it started are gone."""
        return await asyncio.shield(self._result)

    @property
    def interactive(self) -> bool:
        """Whether the program was started interactive (SandboxSpec.keep_stdin)."""
        return self._spec.keep_stdin

    @property
    def takes_input(self) -> bool:
        """Whether `write_stdin` may still write: an interactive program (SandboxSpec.keep_stdin)
        whose standard input is open and which has not ended."""
        return self._spec.keep_stdin and self._stdin_open and not self._exit.done()

    async def write_stdin(self, data: bytes, *, eof: bool = False) -> None:
        """Write `data` to an interactive program's standard input (after SandboxSpec.stdin,
        in the order of the calls), then close it when `eof`; returns once the pipe took it.
        AlreadyCompletedError when the input is closed or the program has ended."""
        async with self._stdin_lock:
            stdin = self._proc.stdin
            assert stdin is not None
            if not self.takes_input:
                why = "has ended" if self._exit.done() else "has its standard input closed"
                raise AlreadyCompletedError(f"the program {why}")
            try:
                if data:
                    stdin.write(data)
                    await stdin.drain()
                if eof:
                    self._stdin_open = False
                    stdin.close()
            except ConnectionError as exc:  # it closed its end (exited, or closed fd 0)
                self._stdin_open = False
                raise AlreadyCompletedError("the program no longer reads its input") from exc

    async def cancel(self, grace_s: float = 2.0) -> None:
        """SIGTERM the program, SIGKILL its whole tree after `grace_s`; the result is CANCELLED
        (unless it had already ended) with the output produced so far. Returns once everything,
        temporary directory and relay included, is gone."""
        if self._exit.done():  # it ended on its own: its own outcome stands
            await asyncio.shield(self._result)
            return
        self._decide(Outcome.CANCELLED)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        await asyncio.wait({self._exit}, timeout=grace_s)
        if not self._exit.done():
            await self._kill_tree()
        await asyncio.shield(self._result)

    async def kill(self) -> None:
        """cancel() without a grace period."""
        await self.cancel(grace_s=0)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        """Leaving the block kills whatever is still running (structured lifetime)."""
        await self.kill()

    # ---- start-up -------------------------------------------------------------------------------

    async def _until_started(self) -> None:
        """Wait for the launcher's verdict; raise if it refused to run the program."""
        await self._started.wait()
        error = self._setup_error
        if error is None or error.get("code") == "spawn_failed":
            return
        await asyncio.shield(self._result)
        message = error.get("message", "the sandbox could not be set up")
        if error.get("code") == "permission_denied":
            policy = self._spec.policy
            raise PermissionDeniedError(
                message,
                {"privilege_level": str(policy.privilege), "network_policy": str(policy.network)},
            )
        raise InternalError(f"sandbox set-up failed: {message}")

    async def _read_reports(self, fd: int) -> None:
        reader = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0)
        )
        try:
            while line := await reader.readline():
                report = json.loads(line)
                if report["event"] == "error":
                    self._setup_error = {k: str(v) for k, v in report.items()}
                elif report["event"] == "exit":
                    self._cpu_ms = max(self._cpu_ms, int(report["cpu_ms"]))
                if report["event"] != "exit":
                    self._started.set()
        finally:
            self._started.set()
            transport.close()

    # ---- budgets --------------------------------------------------------------------------------

    async def _watch(self) -> None:
        policy = self._spec.policy
        cpu_budget, wall_ms = policy.budget_cpu_ms, policy.wall_limit_ms
        if not cpu_budget and not wall_ms:
            return
        deadline = self._started_at + wall_ms / 1000 if wall_ms else math.inf
        tick = min(max(cpu_budget / 20_000, 0.01), 0.1) if cpu_budget else math.inf
        meter = TreeCpuMeter(self.pid)
        while True:
            timeout = max(min(deadline - time.monotonic(), tick), 0)
            await asyncio.wait({self._exit}, timeout=timeout)
            if self._exit.done():
                return
            if cpu_budget:
                self._cpu_ms = max(self._cpu_ms, meter.sample())
                if self._cpu_ms >= cpu_budget:
                    self._decide(Outcome.CPU_BUDGET_EXCEEDED)
                    await self._kill_tree()
                    return
            if time.monotonic() >= deadline:
                self._decide(Outcome.WALL_TIMEOUT)
                await self._kill_tree()
                return

    async def _kill_tree(self) -> None:
        """SIGKILL the launcher and everything below it; return once all of it has exited."""
        loop = asyncio.get_running_loop()
        waits = []
        for pid in kill_tree(self.pid):
            try:
                pidfd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue  # already gone
            gone = loop.create_future()
            loop.add_reader(pidfd, _settle, gone)
            waits.append((pidfd, gone))
        try:
            if waits:
                await asyncio.wait([gone for _, gone in waits], timeout=_KILL_WAIT_S)
        finally:
            for pidfd, _ in waits:
                loop.remove_reader(pidfd)
                os.close(pidfd)

    def _decide(self, verdict: Outcome) -> None:
        if self._verdict is None:  # the first limit reached wins
            self._verdict = verdict

    # ---- output and result ----------------------------------------------------------------------

    async def _read_stdout(self) -> None:
        assert self._proc.stdout is not None
        try:
            while chunk := await self._proc.stdout.read(_STREAM_CHUNK):
                async with self._stdout_changed:
                    self._stdout.append(chunk)
                    self._stdout_changed.notify_all()
        finally:
            async with self._stdout_changed:
                self._stdout_eof = True
                self._stdout_changed.notify_all()

    async def _write_stdin(self) -> None:
        stdin = self._proc.stdin
        assert stdin is not None
        async with self._stdin_lock:
            with contextlib.suppress(ConnectionError):
                if self._spec.stdin:
                    stdin.write(self._spec.stdin)
                    await stdin.drain()
                if not self._spec.keep_stdin:
                    self._stdin_open = False
                    stdin.close()

    async def _finish(self) -> SandboxResult:
        try:
            returncode = await self._exit
            ended_at = time.monotonic()
            # Output and reports end when the last holder exits; the tree is gone, so this
            # is prompt. The bound only guards against a process that escaped the tree.
            await asyncio.wait([*self._io, self._reports], timeout=_DRAIN_AFTER_EXIT_S)
            self._watcher.cancel()
            return self._result_for(returncode, ended_at)
        finally:
            for task in [*self._io, self._reports, self._watcher]:
                task.cancel()
            self._stdin_open = False
            if self._proc.stdin is not None:  # an interactive program's, still open
                self._proc.stdin.close()
            _remove(self._tempdir)

    def _result_for(self, returncode: int, ended_at: float) -> SandboxResult:
        signum = -returncode if returncode < 0 else None
        exit_code = returncode if returncode >= 0 else None
        outcome = self._verdict
        if outcome is None:
            if self._setup_error and self._setup_error.get("code") == "spawn_failed":
                outcome, exit_code = Outcome.SPAWN_FAILED, None
            elif signum == signal.SIGXCPU and self._spec.policy.budget_cpu_ms:
                outcome = Outcome.CPU_BUDGET_EXCEEDED  # RLIMIT_CPU, the backstop, got there
            else:
                outcome = Outcome.OK if returncode == 0 else Outcome.EXIT_NONZERO
        stderr = b"".join(self._stderr)
        if outcome is Outcome.SPAWN_FAILED and self._setup_error:
            stderr = self._setup_error.get("message", "").encode()
        return SandboxResult(
            outcome=outcome,
            exit_code=exit_code,
            signal=signum,
            stdout=b"".join(self._stdout),
            stderr=stderr,
            cpu_ms=self._cpu_ms,
            wall_ms=round((ended_at - self._started_at) * 1000),
        )


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _drain(stream: asyncio.StreamReader | None, sink: list[bytes]) -> None:
    assert stream is not None
    while chunk := await stream.read(_STREAM_CHUNK):
        sink.append(chunk)


def _default_env(cwd: str | None) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
    }
    if cwd is not None:
        env["HOME"] = cwd
    return env


def _launcher_env() -> dict[str, str]:
    """The coordinator's environment, with apiary importable wherever it was loaded from."""
    env = dict(os.environ)
    source = str(Path(apiary.__file__).resolve().parent.parent)
    paths = env.get("PYTHONPATH", "").split(os.pathsep) if env.get("PYTHONPATH") else []
    if source not in paths:
        env["PYTHONPATH"] = os.pathsep.join([source, *paths])
    return env


def _remove(path: str | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
