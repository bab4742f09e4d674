"""Tool execution policy (RFC 18.5): the values, their defaults and the approval rule.

Pure: parses the string fields of `sw4rm.tool.ExecutionPolicy` into checked values and
decides what a policy needs before a tool may run. The sandbox enforces the result on a real
subprocess; the tool service asks HITL when `approval` says so.

- network_policy: DENY_ALL (the default when empty, 18.5.2), EGRESS_RESTRICTED (only the
  allowlist), EGRESS_UNRESTRICTED, FULL_ACCESS (HITL unless pre-approved).
- privilege_level: MINIMAL (the default when empty, 18.5.3), DEFAULT, ELEVATED (logged; HITL
  unless pre-approved), PRIVILEGED (logged at WARN; HITL unless pre-approved).
- budget_cpu_ms / budget_wall_ms: 0 means no limit; the first limit reached wins (18.5.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from apiary.errors import ValidationError


class NetworkPolicy(StrEnum):
    DENY_ALL = "DENY_ALL"
    EGRESS_RESTRICTED = "EGRESS_RESTRICTED"
    EGRESS_UNRESTRICTED = "EGRESS_UNRESTRICTED"
    FULL_ACCESS = "FULL_ACCESS"


class PrivilegeLevel(StrEnum):
    MINIMAL = "MINIMAL"
    DEFAULT = "DEFAULT"
    ELEVATED = "ELEVATED"
    PRIVILEGED = "PRIVILEGED"


PRIVILEGE_RANK: dict[PrivilegeLevel, int] = {
    level: rank for rank, level in enumerate(PrivilegeLevel)
}


@dataclass(frozen=True, slots=True)
class HostPort:
    """One allowlist entry: a host name or IP address and a port (0 = any port)."""

    host: str
    port: int = 0

    def __str__(self) -> str:
        return f"{self.host}:{self.port}" if self.port else self.host


@dataclass(frozen=True, slots=True)
class ExecutionPolicy:
    """A checked execution policy; every field has the RFC's default."""

    timeout_ms: int = 0
    max_retries: int = 0
    backoff: str = "exponential"
    worktree_required: bool = False
    network: NetworkPolicy = NetworkPolicy.DENY_ALL
    privilege: PrivilegeLevel = PrivilegeLevel.MINIMAL
    budget_cpu_ms: int = 0
    budget_wall_ms: int = 0
    allowlist: tuple[HostPort, ...] = ()

    @property
    def wall_limit_ms(self) -> int:
        """The tighter of the call timeout and the wall budget (0 = none)."""
        limits = [ms for ms in (self.timeout_ms, self.budget_wall_ms) if ms > 0]
        return min(limits) if limits else 0


def _normalise(text: str) -> str:
    return text.strip().upper().replace("-", "_")


def parse_network_policy(text: str) -> NetworkPolicy:
    """'' -> DENY_ALL; case-insensitive; anything else names the field in the error."""
    value = _normalise(text)
    if not value:
        return NetworkPolicy.DENY_ALL
    try:
        return NetworkPolicy(value)
    except ValueError:
        allowed = ", ".join(NetworkPolicy)
        raise ValidationError.for_field(
            "network_policy", f"unknown value {text!r} (expected one of {allowed})"
        ) from None


def parse_privilege_level(text: str) -> PrivilegeLevel:
    """'' -> MINIMAL; case-insensitive; anything else names the field in the error."""
    value = _normalise(text)
    if not value:
        return PrivilegeLevel.MINIMAL
    try:
        return PrivilegeLevel(value)
    except ValueError:
        allowed = ", ".join(PrivilegeLevel)
        raise ValidationError.for_field(
            "privilege_level", f"unknown value {text!r} (expected one of {allowed})"
        ) from None


def parse_host_port(text: str) -> HostPort:
    """'example.com:443', '10.0.0.1' or '[::1]:8080' -> HostPort; bad ports name the field."""
    entry = text.strip()
    if not entry:
        raise ValidationError.for_field("allowlist", "empty entry")
    host, port = entry, "0"
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise ValidationError.for_field("allowlist", f"bad entry {text!r}")
            port = rest[1:]
    elif entry.count(":") == 1:
        host, port = entry.split(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValidationError.for_field("allowlist", f"bad entry {text!r} (expected host[:port])")
    return HostPort(host, int(port))


@dataclass(frozen=True, slots=True)
class Approval:
    """What a policy needs before its tool may run."""

    hitl: bool
    """Ask a human (reason TOOL_PRIVILEGE_ESCALATION) before running."""
    log_level: str
    """'info' for ordinary runs and ELEVATED, 'warning' for PRIVILEGED and FULL_ACCESS."""
    reasons: tuple[str, ...]
    """Why: 'privilege_level=ELEVATED', 'network_policy=FULL_ACCESS', ..."""


def approval(policy: ExecutionPolicy, *, preapproved: bool = False) -> Approval:
    """ELEVATED, PRIVILEGED and FULL_ACCESS go to HITL unless policy pre-approved them."""
    reasons: list[str] = []
    if PRIVILEGE_RANK[policy.privilege] >= PRIVILEGE_RANK[PrivilegeLevel.ELEVATED]:
        reasons.append(f"privilege_level={policy.privilege}")
    if policy.network is NetworkPolicy.FULL_ACCESS:
        reasons.append(f"network_policy={policy.network}")
    warn = policy.privilege is PrivilegeLevel.PRIVILEGED or (
        policy.network is NetworkPolicy.FULL_ACCESS
    )
    return Approval(
        hitl=bool(reasons) and not preapproved,
        log_level="warning" if warn else "info",
        reasons=tuple(reasons),
    )
