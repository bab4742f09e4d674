"""get_tool_inventory and get_execution_environment (core/runtime/inventory.py): what a
thread's agent may call and where it works, as Apiary knows it.

The inventory is the tool catalogue (ConnectorService.DescribeTools: agents' tools, command
tools, MCP servers) as the tool ACL lets the thread's agent see it: a tool the ACL withholds
is not listed (`withheld` counts them), and a tool that needs a worktree is listed as
unavailable while the agent is bound to none. Its content has a stable name
(`toolInventoryRef`); `tool.catalog.resolved` is written when a thread's inventory is first
resolved and whenever it changes.

The execution environment is the agent's worktree binding (RFC 16: its root is the cwd and
the workspace root of its tools), the thread's scope, and the sandbox its tool calls run
in (the default policy, the network allowlist, what is pre-approved, the limits)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from apiary.controlplane.binding import agent_of
from apiary.controlplane.facts import FactWriter
from apiary.controlplane.reads import Reads
from apiary.controlplane.requests import Params
from apiary.core.access.principal import Principal
from apiary.core.runtime.events import RuntimeEventType
from apiary.core.runtime.inventory import binding_view, inventory_ref, sandbox_view, tool_entry
from apiary.core.runtime.log import Fact
from apiary.core.runtime.records import RuntimeWrite, ThreadRecord
from apiary.core.worktrees.records import WorktreeBinding
from apiary.engine.tools.service import ToolService
from apiary.engine.worktrees.worktrees import Worktrees
from apiary.errors import UnavailableError


@dataclass(frozen=True, slots=True)
class ThreadQuery:
    """The parameters of a read about one thread."""

    thread_id: str
    session_id: str = ""

    @classmethod
    def read(cls, p: Params) -> ThreadQuery:
        return cls(p.id("thread_id", required=True), p.id("session_id"))


class Environment:
    """The inventory and environment reads of one control plane (module docstring)."""

    def __init__(
        self, facts: FactWriter, reads: Reads, tools: ToolService | None,
        worktrees: Worktrees | None, lock: asyncio.Lock,
    ) -> None:  # fmt: skip
        self._facts = facts
        self._reads = reads
        self._tools = tools
        self._worktrees = worktrees
        self._lock = lock
        self._refs: dict[str, str] = {}
        """The inventory last written per thread (since this control plane started)."""

    def _tools_of(self) -> ToolService:
        if self._tools is None:
            raise UnavailableError("this control plane has no tool service")
        return self._tools

    async def tool_inventory(self, caller: Principal, req: ThreadQuery) -> dict[str, Any]:
        """The tools the thread's agent may call (module docstring)."""
        tools = self._tools_of()
        async with self._lock:
            session, thread = await self._reads.thread(caller, req.thread_id, req.session_id)
            agent = agent_of(thread)
            bound = tools.worktrees.bound_root(agent) is not None
            entries, withheld = [], 0
            for entry in sorted(tools.catalog.entries(), key=lambda e: e.record.provider_id):
                record = entry.record
                for tool in record.tools:
                    if tools.settings.permits(agent, record.provider_id, tool.tool_name):
                        entries.append(tool_entry(record.provider_id, record.kind, tool,
                                                  bound=bound))  # fmt: skip
                    else:
                        withheld += 1
            ref = inventory_ref(entries)
            if self._refs.get(thread.thread_id) != ref:
                await self._resolved(caller, thread, ref, entries, withheld)
        return {
            "sessionId": session.session_id, "threadId": thread.thread_id, "agentId": agent,
            "toolInventoryRef": ref, "tools": entries, "withheld": withheld,
            "acl": bool(tools.settings.acl),
        }  # fmt: skip

    async def _resolved(
        self, caller: Principal, thread: ThreadRecord, ref: str,
        entries: list[dict[str, Any]], withheld: int,
    ) -> None:  # fmt: skip
        providers = sorted({str(e["providerId"]) for e in entries})
        fact = Fact(
            RuntimeEventType.TOOL_CATALOG_RESOLVED, thread.session_id, thread.thread_id,
            agent_id=thread.agent_id,
            payload={"agentId": thread.agent_id, "toolCount": len(entries),
                     "withheld": withheld, "providers": providers,
                     "tools": [e["toolId"] for e in entries]},
            extra={"refs": {"toolInventoryRef": ref}},
        )  # fmt: skip
        await self._facts.commit(RuntimeWrite(), [fact], caller.label)
        self._refs[thread.thread_id] = ref

    async def execution_environment(self, caller: Principal, req: ThreadQuery) -> dict[str, Any]:
        """Where the thread's agent works and what its tool calls run under."""
        session, thread = await self._reads.thread(caller, req.thread_id, req.session_id)
        agent = agent_of(thread)
        record = self._worktrees.binding(agent) if self._worktrees else WorktreeBinding(agent)
        tools = self._tools_of()
        root = tools.worktrees.bound_root(agent)  # where its tools run: the same answer
        settings = tools.settings
        environment: dict[str, Any] = {
            "agentId": agent, "scope": thread.scope,
            "cwd": str(root) if root is not None else None,
            "workspaceRoots": [str(root)] if root is not None else [],
            "worktree": binding_view(record, root),
            **sandbox_view(
                settings.allowlist, settings.preapproved, settings.max_retries,
                settings.cancel_grace_s, settings.hitl_timeout_s,
            ),
        }  # fmt: skip
        return {
            "sessionId": session.session_id, "threadId": thread.thread_id,
            "executionEnvironment": environment,
        }  # fmt: skip
