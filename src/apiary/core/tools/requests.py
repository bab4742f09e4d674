"""The execution policy a tool call runs under: what the caller asked, over the tool's
defaults (RFC 18.2, 18.5).

A `RequestedPolicy` holds the request's `sw4rm.tool.ExecutionPolicy` as sent: proto3 leaves
unset fields empty or zero, and those take the tool's default policy (a command tool's
configured policy, an MCP server's, or the RFC defaults) instead. A caller may ask for less
or more than the default; more (ELEVATED, PRIVILEGED, FULL_ACCESS) goes through `approval`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from apiary.core.tools.policy import (
    ExecutionPolicy,
    HostPort,
    parse_network_policy,
    parse_privilege_level,
)
from apiary.core.tools.retries import parse_backoff


@dataclass(frozen=True, slots=True)
class RequestedPolicy:
    """A request's policy fields as sent; empty or zero means "the tool's default"."""

    timeout_ms: int = 0
    max_retries: int = 0
    backoff: str = ""
    worktree_required: bool = False
    network_policy: str = ""
    privilege_level: str = ""
    budget_cpu_ms: int = 0
    budget_wall_ms: int = 0


def effective_policy(
    requested: RequestedPolicy,
    default: ExecutionPolicy,
    *,
    default_timeout_s: int = 0,
    needs_worktree: bool = False,
    allowlist: tuple[HostPort, ...] = (),
    max_retries_cap: int = 5,
) -> ExecutionPolicy:
    """The checked policy of one call. Unknown values raise ValidationError naming the field
    (network_policy, privilege_level, backoff); retries are capped at `max_retries_cap`."""
    network = (
        parse_network_policy(requested.network_policy)
        if requested.network_policy.strip()
        else default.network
    )
    privilege = (
        parse_privilege_level(requested.privilege_level)
        if requested.privilege_level.strip()
        else default.privilege
    )
    backoff = parse_backoff(requested.backoff) if requested.backoff.strip() else default.backoff
    timeout_ms = requested.timeout_ms or default.timeout_ms or default_timeout_s * 1000
    retries = requested.max_retries or default.max_retries
    return replace(
        default,
        timeout_ms=timeout_ms,
        max_retries=min(retries, max_retries_cap),
        backoff=backoff,
        worktree_required=requested.worktree_required or default.worktree_required
        or needs_worktree,
        network=network,
        privilege=privilege,
        budget_cpu_ms=requested.budget_cpu_ms or default.budget_cpu_ms,
        budget_wall_ms=requested.budget_wall_ms or default.budget_wall_ms,
        allowlist=default.allowlist or allowlist,
    )  # fmt: skip
