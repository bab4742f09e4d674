"""The MCP bridge: MCP stdio servers as tool providers (RFC 18: MCP compatibility).

The coordinator starts each server with the official SDK's stdio client, its command line
wrapped by the sandbox (`Launcher.wrap_argv`) under the server's execution policy, lists
its tools and turns the manifest into descriptors: `inputSchema`/`outputSchema` become the
schemas, `annotations.idempotentHint` or `readOnlyHint` make a tool idempotent, `readOnlyHint`
gives side effects `none` and `openWorldHint` adds `network`. Calls are `tools/call`
requests under the same checks as every other tool (the service's), with the call's wall
budget; a result's `structuredContent` is returned as JSON, otherwise its text (or its
content blocks as JSON); `isError` results are TOOL_FAILED with the server's text.

The SDK is used through `engine/tools/mcp_session.py`. One task per server owns the SDK's context
managers (anyio scopes, which must be left in the task that entered them); calls run beside
it on the same session. A ping every
`health_interval_s` notices a server that died; it is started again with backoff, and calls
made meanwhile wait for it up to the server's startup timeout (then `unavailable`, which
idempotent tools retry). `close` ends the session, which stops the server (stdin closed,
then SIGTERM, then SIGKILL, by the SDK).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TextIO

from apiary.core.tools.descriptor import ProviderKind, ToolDescriptor
from apiary.core.tools.policy import ExecutionPolicy, parse_network_policy, parse_privilege_level
from apiary.engine.eventlog import EventRecorder
from apiary.engine.tools.launch import Launcher
from apiary.engine.tools.providers import READY, RESTARTING, STARTING, STOPPED, Frame, Invocation
from apiary.errors import CallCancelledError, UnavailableError, ValidationError
from apiary.stopping import stop_tasks

if TYPE_CHECKING:
    from apiary.engine.tools.mcp_session import McpSession

log = logging.getLogger("apiary.tools")
RESTART_DELAYS_S: Final = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
CLOSE_TIMEOUT_S: Final = 10.0
OnTools = Callable[[str, tuple[ToolDescriptor, ...]], Awaitable[None]]
"""(provider_id, descriptors) -> record the manifest a server listed."""


def _session_opener() -> Callable[..., contextlib.AbstractAsyncContextManager[McpSession]]:
    """`mcp_session.open_session`, imported here: only coordinators that run MCP servers
    pay for the SDK's import, and (called in a worker thread) not in the event loop, which
    half a second of import would stall (a cluster's leader renewing its lease, say)."""
    from apiary.engine.tools.mcp_session import open_session  # noqa: PLC0415

    return open_session


@dataclass(frozen=True, slots=True)
class McpServerSpec:
    """One MCP stdio server: `[[tools.mcp]]` or RegisterMcpServer."""

    provider_id: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    """Added to the SDK's safe default environment (PATH, HOME, ...)."""
    cwd: str = ""
    policy: ExecutionPolicy = field(default_factory=ExecutionPolicy)
    startup_timeout_s: float = 30.0
    expose: tuple[str, ...] = ()
    """Read-only directories the server needs that the sandbox cannot infer from its
    command (a uvx or npx cache, a data directory); see docs/tools.md."""
    source: str = "config"
    """'config' (the configuration file) or 'runtime' (registered through the RPC)."""

    def config(self) -> dict[str, Any]:
        """What the tool store keeps to start the server again after a restart."""
        return {
            "command": self.command, "args": list(self.args), "env": dict(self.env),
            "cwd": self.cwd, "startup_timeout_s": self.startup_timeout_s, "source": self.source,
            "expose": list(self.expose),
            "network_policy": str(self.policy.network),
            "privilege_level": str(self.policy.privilege),
            "budget_cpu_ms": self.policy.budget_cpu_ms,
            "budget_wall_ms": self.policy.budget_wall_ms,
        }  # fmt: skip

    @classmethod
    def from_config(cls, provider_id: str, config: Mapping[str, Any]) -> McpServerSpec:
        """The spec `config()` stored (a server registered at runtime, after a restart)."""
        policy = ExecutionPolicy(
            network=parse_network_policy(str(config.get("network_policy", ""))),
            privilege=parse_privilege_level(str(config.get("privilege_level", ""))),
            budget_cpu_ms=int(config.get("budget_cpu_ms", 0)),
            budget_wall_ms=int(config.get("budget_wall_ms", 0)),
        )
        return cls(
            provider_id=provider_id,
            command=str(config.get("command", "")),
            args=tuple(str(a) for a in config.get("args", [])),
            env={str(k): str(v) for k, v in dict(config.get("env", {})).items()},
            cwd=str(config.get("cwd", "")),
            policy=policy,
            startup_timeout_s=float(config.get("startup_timeout_s", 30.0)),
            expose=tuple(str(p) for p in config.get("expose", [])),
            source=str(config.get("source", "runtime")),
        )

    @property
    def command_line(self) -> str:
        return " ".join([self.command, *self.args])


class McpProvider:
    """One MCP server, started and kept running by its own task."""

    def __init__(
        self,
        spec: McpServerSpec,
        launcher: Launcher,
        events: EventRecorder,
        on_tools: OnTools,
        *,
        tools: tuple[ToolDescriptor, ...] = (),
        health_interval_s: float = 2.0,
        log_dir: Path | None = None,
    ) -> None:
        self.spec = spec
        self._launcher = launcher
        self._events = events
        self._on_tools = on_tools
        self._tools = tools
        self._health_interval_s = health_interval_s
        self._log_dir = log_dir
        self._state = STARTING
        self.detail = spec.command_line
        self._session: McpSession | None = None
        self._ready = asyncio.Event()
        self._stopping = asyncio.Event()
        self._broken = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._calls: dict[str, asyncio.Task[Frame]] = {}
        self._cancelled: set[str] = set()
        self.starts = 0
        """How many times the server was started (1 + restarts)."""

    @property
    def provider_id(self) -> str:
        return self.spec.provider_id

    @property
    def kind(self) -> ProviderKind:
        return ProviderKind.MCP

    @property
    def state(self) -> str:
        return self._state

    async def describe(self) -> tuple[ToolDescriptor, ...]:
        return self._tools

    # ------------------------------------------------------------------ lifetime

    def start(self) -> None:
        if self._runner is None:
            self._runner = asyncio.create_task(self._run(), name=f"apiary-mcp-{self.provider_id}")

    async def wait_ready(self, timeout_s: float) -> McpSession:
        """The live session, waiting up to `timeout_s` for the server to be up."""
        try:
            async with asyncio.timeout(timeout_s):
                while self._session is None:
                    if self._stopping.is_set():
                        raise UnavailableError(f"MCP server {self.provider_id!r} is stopped")
                    await self._ready.wait()
        except TimeoutError:
            raise UnavailableError(
                f"MCP server {self.provider_id!r} is not up ({self._state}: {self.detail})",
                {"provider_id": self.provider_id},
            ) from None
        return self._session

    async def close(self) -> None:
        self._stopping.set()
        for task in self._calls.values():
            task.cancel()
        runner, self._runner = self._runner, None
        if runner is not None:
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await asyncio.shield(runner)
            except TimeoutError:
                await stop_tasks([runner], f"MCP server {self.provider_id}")
        self._state = STOPPED

    async def _run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            self._state = STARTING if self.starts == 0 else RESTARTING
            self.starts += 1
            try:
                await self._serve_once()
                failures = 0
            except Exception as exc:  # a server that cannot start or breaks: start it again
                self.detail = _describe(exc)
                log.warning("MCP server %s failed: %s", self.provider_id, self.detail)
            if self._stopping.is_set():
                break
            delay = RESTART_DELAYS_S[min(failures, len(RESTART_DELAYS_S) - 1)]
            failures += 1
            self._state = RESTARTING
            await self._events.record(
                "tool.mcp_restarting", "coordinator", provider_id=self.provider_id,
                delay_s=delay, detail=self.detail,
            )  # fmt: skip
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stopping.wait()
        self._state = STOPPED

    async def _serve_once(self) -> None:
        open_session = await asyncio.to_thread(_session_opener)
        spec = self.spec
        cwd = Path(spec.cwd) if spec.cwd else None
        path = (spec.env or {}).get("PATH", os.environ.get("PATH", os.defpath))
        if shutil.which(spec.command, path=path) is None:
            # The sandbox's launcher would start and then fail to exec it: say so plainly.
            raise FileNotFoundError(f"command not found: {spec.command}")
        argv = self._launcher.wrap_argv(
            [spec.command, *spec.args], spec.policy, cwd=cwd, expose=spec.expose
        )
        with self._errlog() as errlog:
            opened = open_session(
                self.provider_id, argv, spec.env, cwd, errlog, spec.startup_timeout_s
            )
            async with opened as session:
                async with asyncio.timeout(spec.startup_timeout_s):
                    tools = await session.list_tools()
                self._tools = tools
                await self._on_tools(self.provider_id, tools)
                self._broken.clear()
                self._session, self._state, self.detail = session, READY, spec.command_line
                self._ready.set()
                await self._events.record(
                    "tool.mcp_ready", "coordinator", provider_id=self.provider_id,
                    tools=[t.tool_name for t in tools], starts=self.starts,
                )  # fmt: skip
                try:
                    await self._watch(session)
                finally:
                    self._session = None
                    self._ready.clear()

    async def _watch(self, session: McpSession) -> None:
        """Until closing, or the server stops answering (a ping fails): then restart."""
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._health_interval_s):
                    await _first(self._stopping.wait(), self._broken.wait())
            if self._stopping.is_set():
                return
            try:
                async with asyncio.timeout(self._health_interval_s):
                    await session.ping()
            except (UnavailableError, TimeoutError) as exc:
                self.detail = str(exc) or "the server stopped answering pings"
                return
            if self._broken.is_set():
                return

    @contextlib.contextmanager
    def _errlog(self) -> Iterator[TextIO]:
        if self._log_dir is None:
            yield sys.stderr
            return
        self._log_dir.mkdir(parents=True, exist_ok=True)
        with (self._log_dir / f"mcp-{self.provider_id}.log").open("a") as file:
            yield file

    # ------------------------------------------------------------------ calls

    async def call(self, invocation: Invocation) -> AsyncGenerator[Frame, None]:
        arguments = invocation.arguments
        if not isinstance(arguments, dict):
            raise ValidationError.for_field("args", "an MCP tool takes a JSON object")
        session = await self.wait_ready(self.spec.startup_timeout_s)
        call_id = invocation.call_id
        task = asyncio.ensure_future(session.call(invocation.tool.tool_name, arguments))
        self._calls[call_id] = task
        try:
            frame = await task
        except asyncio.CancelledError:
            if _cancelling():
                raise  # the service stopped waiting (its deadline, or the caller left)
            if call_id in self._cancelled:
                raise CallCancelledError("the MCP call was cancelled on request") from None
            raise UnavailableError(f"MCP server {self.provider_id!r} is shutting down") from None
        except UnavailableError as exc:
            if exc.details.get("connection") == "closed":
                self._broken.set()
            raise
        finally:
            self._calls.pop(call_id, None)
            self._cancelled.discard(call_id)
            if not task.done():
                task.cancel()
        yield frame

    async def cancel(self, call_id: str) -> None:
        task = self._calls.get(call_id)
        if task is not None and not task.done():
            self._cancelled.add(call_id)
            task.cancel()


def _cancelling() -> bool:
    """Whether the current task itself is being cancelled (not only the call it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _first(*waits: Awaitable[Any]) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


def _describe(exc: BaseException) -> str:
    """The innermost error of a task group's exception group, as 'Type: message'."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"
