"""What every tool provider offers the tool service, whatever runs its tools (RFC 18).

Three kinds implement `ToolProvider`: agents answering TOOL_CALL envelopes
(`engine/tools/agent_tools.py`), commands from the configuration run in the sandbox
(`engine/tools/command_tools.py`) and MCP stdio servers (`engine/tools/mcp_bridge.py`). The service
(`engine/tools/service.py`) validates, approves, times, retries and counts; a provider only runs one
attempt of one call and reports frames or an `ApiaryError`.

A provider's `call` yields frames and ends with exactly one `final` frame when it completed;
it raises `CallCancelledError` when it stopped because `cancel` asked it to, and any other
`ApiaryError` when the attempt failed. Closing the iterator early (the service gave up on it)
must release whatever the attempt holds.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from apiary.core.tools.descriptor import ProviderKind, ToolDescriptor
from apiary.core.tools.policy import ExecutionPolicy

READY: Final = "READY"
STARTING: Final = "STARTING"
RESTARTING: Final = "RESTARTING"
OFFLINE: Final = "OFFLINE"
"""An agent provider whose agent is not registered now."""
STOPPED: Final = "STOPPED"


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame a provider produced (`ToolFrame` without the coordinator's numbering)."""

    data: bytes = b""
    content_type: str = ""
    final: bool = False
    summary: Mapping[str, Any] = field(default_factory=dict)
    """The provider's own summary (final frames): exit code, CPU time, ..."""


@dataclass(frozen=True, slots=True)
class Invocation:
    """One attempt of one call, as its provider sees it."""

    call_id: str
    provider_id: str
    tool: ToolDescriptor
    args: bytes
    """The arguments as the caller sent them."""
    arguments: Any
    """The decoded JSON arguments (None for non-JSON arguments)."""
    content_type: str
    policy: ExecutionPolicy
    stream: bool
    caller: str
    """The invoking agent ('' when the caller did not say)."""
    correlation_id: str
    attempt: int = 1
    cwd: Path | None = None
    """The caller's bound worktree root, for tools that need one."""


class ToolProvider(Protocol):
    """A source of tools: describe them, run a call, stop a call."""

    @property
    def provider_id(self) -> str: ...

    @property
    def kind(self) -> ProviderKind: ...

    @property
    def state(self) -> str:
        """READY, STARTING, RESTARTING, OFFLINE or STOPPED."""
        ...

    async def describe(self) -> tuple[ToolDescriptor, ...]:
        """The provider's tools as it knows them now."""
        ...

    def call(self, invocation: Invocation) -> AsyncGenerator[Frame, None]:
        """Run one attempt; frames end with one final frame (module docstring)."""
        ...

    async def cancel(self, call_id: str) -> None:
        """Ask the running call to stop (best effort, RFC 18.6); never raises for an unknown
        or finished call."""
        ...

    async def close(self) -> None:
        """Stop what the provider runs (an MCP server) and release it."""
        ...


class WorktreeBindings(Protocol):
    """Which worktree an agent is bound to (RFC 16): what needs_worktree tools run in.

    The engine's worktree manager implements it; the tool service needs this one method.
    """

    def bound_root(self, agent_id: str) -> Path | None:
        """The root directory of the agent's bound worktree, None when it is not bound."""
        ...


class NoWorktrees:
    """No worktree manager: no agent is ever bound, so needs_worktree tools always fail
    with worktree_not_bound."""

    def bound_root(self, agent_id: str) -> Path | None:
        return None
