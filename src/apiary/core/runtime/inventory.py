"""The contract's tool inventory and execution environment as Apiary knows them, in the
contract's camelCase shapes (get_tool_inventory, get_execution_environment). Pure: the
control plane hands over the catalogue's descriptors, the tool ACL's answers, the agent's
worktree binding and the tool settings."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from apiary.core.tools.descriptor import ToolDescriptor, parse_schema
from apiary.core.tools.policy import ExecutionPolicy, HostPort
from apiary.core.worktrees.records import WorktreeBinding

DEFAULT_POLICY: Final = ExecutionPolicy()
"""What a tool runs under when neither it nor the call asks for more (RFC 18.5)."""


def tool_entry(provider_id: str, kind: str, tool: ToolDescriptor, *, bound: bool) -> dict[str, Any]:
    """One tool the agent may call: its descriptor, and whether it can run now (a tool that
    needs a worktree cannot while the agent is not bound to one)."""
    found: dict[str, Any] = {
        "toolId": f"{provider_id}/{tool.tool_name}", "providerId": provider_id,
        "providerKind": kind, "toolName": tool.tool_name, "description": tool.description,
        "idempotent": tool.idempotent, "needsWorktree": tool.needs_worktree,
        "sideEffects": list(tool.effect_classes), "capabilities": list(tool.capabilities),
        "defaultTimeoutS": tool.default_timeout_s, "maxConcurrency": tool.max_concurrency,
        "available": bound or not tool.needs_worktree,
    }  # fmt: skip
    for key, text in (("inputSchema", tool.input_schema), ("outputSchema", tool.output_schema)):
        schema = parse_schema(text)
        if schema is not None:
            found[key] = schema
    if not found["available"]:
        found["unavailableReason"] = "worktree_not_bound"
    return found


def inventory_ref(entries: Sequence[Mapping[str, Any]]) -> str:
    """A stable name of an inventory's content: equal refs, equal inventories."""
    text = json.dumps(list(entries), sort_keys=True, separators=(",", ":"))
    return "tools:sha256:" + hashlib.sha256(text.encode()).hexdigest()[:32]


def binding_view(record: WorktreeBinding, root: Path | None) -> dict[str, Any]:
    """An agent's worktree binding (RFC 16) as the environment shows it."""
    found: dict[str, Any] = {"state": record.state, "bound": root is not None}
    for key, value in (
        ("repoId", record.repo_id), ("worktreeId", record.worktree_id),
        ("branch", record.branch), ("currentRepoId", record.current_repo_id),
        ("currentWorktreeId", record.current_worktree_id),
        ("targetWorktreeId", record.target_worktree_id), ("note", record.note),
    ):  # fmt: skip
        if value:
            found[key] = value
    if root is not None:
        found["root"] = str(root)
    return found


def sandbox_view(
    allowlist: Sequence[HostPort], preapproved: Mapping[str, Collection[str]], max_retries: int,
    cancel_grace_s: float, approval_timeout_s: float,
) -> dict[str, Any]:  # fmt: skip
    """The sandbox every tool call runs in, as the configuration sets it (docs/tools.md)."""
    return {
        "sandbox": {
            "kind": "apiary.sandbox", "confinement": "worktree",
            "defaultPrivilegeLevel": DEFAULT_POLICY.privilege.value,
            "escalation": "ELEVATED, PRIVILEGED and FULL_ACCESS ask HITL unless pre-approved",
            "preapproved": {level: sorted(names) for level, names in preapproved.items()},
        },
        "network": {
            "defaultPolicy": DEFAULT_POLICY.network.value,
            "allowlist": [str(entry) for entry in allowlist],
        },
        "processLimits": {
            "maxRetries": max_retries, "cancelGraceS": cancel_grace_s,
            "approvalTimeoutS": approval_timeout_s or None,
            "budgets": "per tool and call: timeout_ms, budget_cpu_ms, budget_wall_ms",
        },
    }  # fmt: skip
