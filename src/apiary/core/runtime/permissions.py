"""Permissions (the contract's evaluate_permission / resolve_permission): whether a thread's
agent may do something, asked of Apiary's own decisions rather than a second policy.

What is asked is one of three kinds:

- `tool`: a tool call, checked as the tool service checks it (engine/tools/service.py
  `prepare`: the tool ACL, the effective execution policy, the worktree a tool needs) and
  approved by `core.tools.policy.approval` (ELEVATED, PRIVILEGED, FULL_ACCESS ask HITL
  unless pre-approved);
- `message`: a message the agent would send, checked by the message ACLs (core/acl.py);
- `call`: a gRPC method or runtime command the agent would call, decided by the one access
  decision (core/access/decision.py) under its rule (core/access/table.py).

Each check answers allow, deny or ask; the evaluation is deny when any check denies, ask
when any asks, else allow. An `ask` opens a HITL invocation (the runtime stores it as a
permission, core/runtime/actions.py `ActionKind.PERMISSION`) that `resolve_permission` or
the HITL inbox decides; until then the permission is pending, and pending is never allowed:
at its deadline the HITL timeout action decides (deny unless AUTO_RESOLVE). Pure: the
control plane gathers the checks and performs what follows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from apiary.core.access.decision import Decision
from apiary.core.access.rules import Rule
from apiary.core.access.table import METHOD_RULES, RUNTIME_RULES, STANDARD_RULES
from apiary.core.hitl.vocabulary import HitlAction
from apiary.core.records import HitlRecord
from apiary.core.runtime.actions import resolved_payload
from apiary.core.tools.policy import Approval

PERMISSION_DECISIONS: Final = (HitlAction.APPROVE.value, HitlAction.DENY.value)
"""What a permission's invocation proposes: allow (approve) or deny."""


class PermissionType(StrEnum):
    """What a permission asks about (the module docstring)."""

    TOOL = "tool"
    MESSAGE = "message"
    CALL = "call"


class Verdict(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    ASK = "ask"
    """Needs approval: a HITL invocation decides."""

    @property
    def status(self) -> str:
        """The permission's status with this verdict."""
        return {"allow": "allowed", "deny": "denied", "ask": "pending"}[self.value]


@dataclass(frozen=True, slots=True)
class Check:
    """One decision an evaluation asked: which (`rule`, `tool_acl`, `tool_policy`,
    `worktree`, `message_acl`), its verdict and why."""

    name: str
    verdict: Verdict
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"check": self.name, "verdict": self.verdict.value, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Evaluation:
    verdict: Verdict
    reason: str
    checks: tuple[Check, ...]

    @property
    def status(self) -> str:
        return self.verdict.status

    def to_json(self) -> dict[str, Any]:
        """The contract's `permissionDecision` object."""
        return {
            "decision": self.verdict.value, "status": self.status, "reason": self.reason,
            "checks": [c.to_json() for c in self.checks],
        }  # fmt: skip


def evaluate(checks: Sequence[Check]) -> Evaluation:
    """Deny when any check denies, ask when any asks, else allow; the reason is the first
    deciding check's."""
    for verdict in (Verdict.DENY, Verdict.ASK):
        deciding = next((c for c in checks if c.verdict is verdict), None)
        if deciding is not None:
            return Evaluation(verdict, f"{deciding.name}: {deciding.reason}", tuple(checks))
    return Evaluation(Verdict.ALLOW, "every check allows", tuple(checks))


def access_check(decision: Decision) -> Check:
    """The access decision's answer as a check."""
    return Check("rule", Verdict.ALLOW if decision.allowed else Verdict.DENY, decision.reason)


def approval_check(approval: Approval, preapproved: bool) -> Check:
    """The tool policy's approval (core.tools.policy.approval) as a check."""
    if approval.hitl:
        return Check("tool_policy", Verdict.ASK, "the call asks for " + ", ".join(approval.reasons))
    if approval.reasons:
        why = ", ".join(approval.reasons)
        return Check("tool_policy", Verdict.ALLOW, f"{why}: pre-approved by configuration"
                     if preapproved else why)  # fmt: skip
    return Check("tool_policy", Verdict.ALLOW, "no escalation")


def rule_for(method: str) -> Rule | None:
    """The rule of a gRPC method path (`/sw4rm.router.RouterService/SendMessage`) or a
    runtime command name (`submit_turn`); None when the table has none."""
    if method.startswith("/"):
        return METHOD_RULES.get(method) or STANDARD_RULES.get(method)
    return RUNTIME_RULES.get(method)


def resolution(record: HitlRecord) -> dict[str, Any]:
    """`permission.resolved`'s payload: how the invocation ended and whether it allows.
    Only an approval allows: a denial, a deadline's fallback, a cancellation do not."""
    found = resolved_payload(record)
    found["allowed"] = bool(found["approved"])
    found["status"] = "allowed" if found["allowed"] else "denied"
    return found


def prompt_of(kind: PermissionType, request: Mapping[str, Any], agent_id: str) -> str:
    """What the HITL invocation asks, when the caller gave no prompt."""
    if kind is PermissionType.TOOL:
        return f"Allow {agent_id} to call {request.get('toolName')}?"
    if kind is PermissionType.MESSAGE:
        return (
            f"Allow {agent_id} to send {request.get('messageType')} to {request.get('recipient')}?"
        )
    return f"Allow {agent_id} to call {request.get('method')}?"
