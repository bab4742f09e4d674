"""The permission and environment commands of `RuntimeClient` (sdk/runtime.py): whether a
thread's agent may call a tool, send a message or make a call, the approval of what needs
one, the tools it may call and where it works (docs/control-plane.md, "Permissions, tools
and the execution environment"), and its subagents (child threads bound to other agents).

    asked = await runtime.evaluate_permission(thread_id, tool_name="write_file",
                                              arguments={"path": "README.md"},
                                              privilege_level="ELEVATED")
    if asked["status"] == "pending":          # a HITL invocation decides it
        await runtime.resolve_permission(asked["permissionId"], "approve")

Answers are the commands' JSON objects: `decision` (allow, deny, ask), `status` (allowed,
denied, pending), `reason`, `permissionDecision` (every check), `permissionId`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class RuntimePermissionCommands:
    """The permission, inventory, environment and subagent commands, over `call`
    (RuntimeClient's)."""

    async def call(self, command: str, **params: Any) -> dict[str, Any]:
        raise NotImplementedError

    async def evaluate_permission(
        self, thread_id: str, *, action_type: str = "tool", tool_name: str = "",
        provider_id: str = "", arguments: Mapping[str, Any] | None = None,
        privilege_level: str = "", network_policy: str = "", message_type: str = "",
        recipient: str = "", method: str = "", subjects: Sequence[str] = (),
        object_id: str = "", turn_id: str = "", prompt: str = "",
        scope: Mapping[str, Any] | None = None, timeout_s: int | None = None,
        idempotency_key: str = "",
    ) -> dict[str, Any]:  # fmt: skip
        """Whether the thread's agent may do what is named: a tool call (`tool_name`, its
        `arguments` and the policy it asks for), a message (`action_type="message"`,
        `message_type`, `recipient`) or a call (`action_type="call"`, `method`: a gRPC
        method path or a runtime command). One that needs approval is pending until
        `resolve_permission` (or the HITL inbox, or its deadline: deny) decides it."""
        return await self.call(
            "evaluate_permission", thread_id=thread_id, action_type=action_type,
            tool_name=tool_name or None, provider_id=provider_id or None,
            arguments=dict(arguments) if arguments is not None else None,
            privilege_level=privilege_level or None, network_policy=network_policy or None,
            message_type=message_type or None, recipient=recipient or None,
            method=method or None, subjects=list(subjects) or None, object_id=object_id or None,
            turn_id=turn_id or None, prompt=prompt or None,
            scope=dict(scope) if scope is not None else None, timeout_s=timeout_s,
            idempotency_key=idempotency_key or None,
        )  # fmt: skip

    async def resolve_permission(
        self, permission_id: str, decision: str, *, rationale: str = "",
        idempotency_key: str = "",
    ) -> dict[str, Any]:  # fmt: skip
        """Decide a pending permission: approve (allow) or deny."""
        return await self.call(
            "resolve_permission", permission_id=permission_id, decision=decision,
            rationale=rationale or None, idempotency_key=idempotency_key or None,
        )  # fmt: skip

    async def get_tool_inventory(self, thread_id: str) -> dict[str, Any]:
        """The tools the thread's agent may call (`tools`: each tool's descriptor and whether
        it can run now), the name of that inventory (`toolInventoryRef`) and how many tools
        the tool ACL withholds (`withheld`)."""
        return await self.call("get_tool_inventory", thread_id=thread_id)

    async def get_execution_environment(self, thread_id: str) -> dict[str, Any]:
        """Where the thread's agent works and what its tool calls run under
        (`executionEnvironment`: cwd, workspaceRoots, worktree, sandbox, network,
        processLimits)."""
        return await self.call("get_execution_environment", thread_id=thread_id)

    async def spawn_subagent(
        self, thread_id: str, agent_id: str = "", *, subagent_id: str = "", turn_id: str = "",
        role: str = "", scope: str = "", input: Any = None, idempotency_key: str = "",
        capability: str = "",
    ) -> dict[str, Any]:  # fmt: skip
        """A child thread of `thread_id` bound to `agent_id` (or to the `capability` queue;
        its id `subagentId`), its first turn run with `input` when given."""
        return await self.call(
            "spawn_subagent", thread_id=thread_id, agent_id=agent_id or None,
            capability=capability or None,
            subagent_id=subagent_id or None, turn_id=turn_id or None, role=role or None,
            scope=scope or None, input=input, idempotency_key=idempotency_key or None,
        )  # fmt: skip

    async def send_subagent_input(
        self, subagent_id: str, input: Any, *, turn_id: str = "", idempotency_key: str = ""
    ) -> dict[str, Any]:
        """A turn on the subagent's thread with `input`."""
        return await self.call(
            "send_subagent_input", subagent_id=subagent_id, input=input,
            turn_id=turn_id or None, idempotency_key=idempotency_key or None,
        )  # fmt: skip

    async def wait_subagents(
        self, subagent_ids: Sequence[str] = (), *, thread_id: str = "", timeout_s: int = 0,
        mode: str = "all",
    ) -> dict[str, Any]:  # fmt: skip
        """The subagents once all (`mode="any"`: one) settled, or at `timeout_s`
        (`timedOut`); `thread_id` names every child of that thread."""
        return await self.call(
            "wait_subagents", subagent_ids=list(subagent_ids) or None,
            thread_id=thread_id or None, timeout_s=timeout_s or None, mode=mode,
        )  # fmt: skip

    async def close_subagent(
        self, subagent_id: str, *, reason: str = "", idempotency_key: str = ""
    ) -> dict[str, Any]:
        """Interrupt the subagent's work and close its thread to new turns."""
        return await self.call(
            "close_subagent", subagent_id=subagent_id, reason=reason or None,
            idempotency_key=idempotency_key or None,
        )  # fmt: skip

    async def list_subagents(self, *, thread_id: str = "", session_id: str = "") -> dict[str, Any]:
        """The parent-child graph of a session's (or a thread's) subagents."""
        return await self.call(
            "list_subagents", thread_id=thread_id or None, session_id=session_id or None
        )
