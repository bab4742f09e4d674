"""Records and steps of the HITL machine that its tests share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apiary.core.hitl.machine import (
    HitlMachine,
    HitlStep,
)
from apiary.core.hitl.policy import HitlPolicy
from apiary.core.hitl.vocabulary import (
    HitlEffect,
    HitlInput,
    HitlState,
    UnavailablePolicy,
)
from apiary.core.records import HitlRecord

T0 = 1_754_000_000.0  # 2025-07-31T22:13:20Z
POLICY = HitlPolicy()
EXTEND = HitlPolicy(unavailable_policy=UnavailablePolicy.EXTEND_TIMEOUT)
THRESHOLD = HitlPolicy(unavailable_policy=UnavailablePolicy.AUTO_DECIDE_THRESHOLD)
ROLES = ("security_admin", "data_steward")
F = HitlEffect


def opened(policy: HitlPolicy = POLICY, **fields: Any) -> HitlRecord:
    fields.setdefault("approver_roles", ROLES)
    fields.setdefault("context", {"operation": "delete_sensitive_files", "risk_level": "HIGH"})
    step = HitlMachine.open(
        invocation_id="hitl-001",
        reason_type="SECURITY_APPROVAL",
        requested_by="file-processor-001",
        now=T0,
        policy=policy,
        correlation_id="corr-1",
        subject={"repo_id": "r", "worktree_id": "w", "task_id": "t"},
        **fields,
    )
    return step.record


def decide(record: HitlRecord, action: str, **kw: Any) -> HitlStep:
    kw.setdefault("operator", "alice")
    kw.setdefault("operator_roles", {"security_admin"})
    kw.setdefault("rationale", "Policy thresholds met; low risk")
    kw.setdefault("now", T0 + 10)
    kw.setdefault("policy", POLICY)
    return HitlMachine.decide(record, action, **kw)


APPLY: dict[HitlInput, Callable[[HitlRecord], HitlStep]] = {
    HitlInput.DECIDE: lambda r: decide(r, "approve"),
    HitlInput.DEFER: lambda r: decide(r, "defer"),
    HitlInput.DEADLINE: lambda r: HitlMachine.deadline_passed(r, POLICY, r.deadline),
    HitlInput.EXTEND: lambda r: HitlMachine.unavailable(r, EXTEND, T0 + 10),
    HitlInput.FALLBACK: lambda r: HitlMachine.unavailable(r, POLICY, T0 + 10),
    HitlInput.CANCEL: lambda r: HitlMachine.cancel(r, by="file-processor-001", reason="x", now=T0),
}
INTO: dict[HitlState, Callable[[], HitlRecord]] = {
    HitlState.PENDING: opened,
    HitlState.DECIDED: lambda: APPLY[HitlInput.DECIDE](opened()).record,
    HitlState.TIMED_OUT: lambda: APPLY[HitlInput.DEADLINE](opened()).record,
    HitlState.FALLBACK_APPLIED: lambda: APPLY[HitlInput.FALLBACK](opened()).record,
    HitlState.CANCELLED: lambda: APPLY[HitlInput.CANCEL](opened()).record,
}
