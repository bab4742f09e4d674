"""Tool configuration: the `[tools]` table (docs/tools.md, "Configuration")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from apiary.core.tools.policy import (
    PRIVILEGE_RANK,
    ExecutionPolicy,
    HostPort,
    NetworkPolicy,
    PrivilegeLevel,
)
from apiary.engine.tools.command_tools import CommandToolSpec
from apiary.engine.tools.mcp_bridge import McpServerSpec

PREAPPROVAL_LEVELS: Final = ("ELEVATED", "PRIVILEGED", "FULL_ACCESS")


@dataclass(frozen=True, slots=True)
class ToolSettings:
    preapproved: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Per level (ELEVATED, PRIVILEGED, FULL_ACCESS): provider ids (all their tools) and
    `provider/tool` names that run at that level without asking HITL. PRIVILEGED covers
    ELEVATED."""
    commands: tuple[CommandToolSpec, ...] = ()
    mcp: tuple[McpServerSpec, ...] = ()
    allowlist: tuple[HostPort, ...] = ()
    """EGRESS_RESTRICTED's allowlist for tools whose own policy has none (RFC 18.5.2)."""
    max_retries: int = 5
    """The most retries any call gets, whatever its policy asks."""
    retry_base_s: float = 0.2
    retry_cap_s: float = 5.0
    cancel_grace_s: float = 5.0
    """How long a cancelled call's provider has to stop before the stream ends anyway."""
    hitl_timeout_s: float = 0.0
    """Deadline of TOOL_PRIVILEGE_ESCALATION invocations; 0: the [hitl] default."""
    hitl_approver_roles: tuple[str, ...] = ()
    """Who may approve a TOOL_PRIVILEGE_ESCALATION: operators holding one of these roles
    (or `admin`); empty: any operator."""
    acl: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Who may call what (RFC 18.2: providers run under the invoking agent's ACLs): agent id
    (or "*" for every agent) -> provider ids (all their tools) and `provider/tool` names.
    Empty: no ACL, every agent may call every tool (the development default)."""
    mcp_health_interval_s: float = 2.0
    log_dir: Path | None = None
    """Where MCP servers' standard error goes (mcp-<provider>.log); None: the coordinator's."""

    def permits(self, caller: str, provider_id: str, tool_name: str) -> bool:
        """Whether the ACL lets `caller` call `provider_id/tool_name` (always, without one)."""
        if not self.acl:
            return True
        grants = self.acl.get(caller, frozenset()) | self.acl.get("*", frozenset())
        return bool(grants & {provider_id, f"{provider_id}/{tool_name}"})

    def preapproves(self, policy: ExecutionPolicy, provider_id: str, tool_name: str) -> bool:
        """Whether configuration pre-approved every escalation `policy` asks for."""
        names = {provider_id, f"{provider_id}/{tool_name}"}
        wanted: list[tuple[str, ...]] = []
        rank = PRIVILEGE_RANK[policy.privilege]
        if rank >= PRIVILEGE_RANK[PrivilegeLevel.ELEVATED]:
            wanted.append(
                tuple(level.value for level in PRIVILEGE_RANK if PRIVILEGE_RANK[level] >= rank)
            )
        if policy.network is NetworkPolicy.FULL_ACCESS:
            wanted.append(("FULL_ACCESS",))
        return all(
            any(names & self.preapproved.get(level, frozenset()) for level in levels)
            for levels in wanted
        )
