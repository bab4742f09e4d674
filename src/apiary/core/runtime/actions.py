"""Runtime actions (the contract's `action.required` / `respond_action`) as Apiary HITL
invocations: an invocation opened for a turn's task or an agent task's run is that turn's or
task's action, its invocation id the stable `actionId`. Pure: what the runtime stores of an
action and how an invocation reads as the contract's events.

An action is never approved by being left alone: until a decision it is `pending` (the turn
or task waits on it); at its deadline the HITL policy's timeout action decides (deny by
default), and the event says which way it went (`via`: operator, deadline, unavailable...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from apiary.core.dedup import iso_utc
from apiary.core.hitl.vocabulary import HitlAction
from apiary.core.records import HitlRecord

DEFAULT_DECISIONS: Final = tuple(a.value for a in HitlAction)
"""The decisions of an invocation that proposes none: approve, deny, modify, defer."""
_PROMPT_KEYS: Final = ("prompt", "question", "summary", "operation", "reason")
_SCOPE_KEYS: Final = ("task_id", "taskId")


class ActionState(StrEnum):
    PENDING = "pending"
    RESOLVED = "resolved"


class ActionKind(StrEnum):
    """What a HITL invocation the runtime follows is to the session."""

    ACTION = "action"
    """An invocation a turn or task waits on (`action.required`, `respond_action`)."""
    PERMISSION = "permission"
    """A permission `evaluate_permission` asked for (`permission.requested`,
    `resolve_permission`; core/runtime/permissions.py)."""


@dataclass(frozen=True, slots=True)
class ActionRecord:
    """An action the runtime reported: where it belongs, and how it was resolved."""

    action_id: str
    """The HITL invocation's id."""
    session_id: str
    state: str
    """An ActionState value."""
    created_at: float
    updated_at: float
    thread_id: str = ""
    turn_id: str = ""
    task_id: str = ""
    """The turn's task, or the agent task whose run asked."""
    run_id: str = ""
    decision: str = ""
    """The decision's action once resolved (approve, deny, modify; '' for a cancellation)."""
    via: str = ""
    """Who resolved it: operator (respond_action, the HITL inbox), deadline, unavailable,
    cancelled, ..."""
    kind: str = ActionKind.ACTION.value
    """An ActionKind value."""
    detail_json: str = "{}"
    """A permission's request and evaluation (JSON; '{}' for an action)."""


def candidate_tasks(record: HitlRecord) -> list[str]:
    """The Scheduler task ids an invocation names as its own: its subject's and context's
    `task_id`, its correlation id."""
    found: list[str] = []
    for doc in (record.subject, record.context):
        for key in _SCOPE_KEYS:
            value = doc.get(key)
            if isinstance(value, str) and value:
                found.append(value)
    if record.correlation_id:
        found.append(record.correlation_id)
    return list(dict.fromkeys(found))


def decisions(record: HitlRecord) -> list[str]:
    return list(record.proposed_actions) or list(DEFAULT_DECISIONS)


def required_payload(record: HitlRecord, scope: Mapping[str, str]) -> dict[str, Any]:
    """`action.required`'s payload: the action's type, scope ids, prompt (or schema), the
    decisions it takes, its approver policy and its timeout."""
    context = record.context
    prompt = next((str(context[k]) for k in _PROMPT_KEYS if context.get(k)), "")
    payload: dict[str, Any] = {
        "actionType": record.reason_type.lower(),
        "prompt": prompt or f"{record.reason_type.lower()} requested by {record.requested_by}",
        "decisions": decisions(record),
        "scope": {k: v for k, v in scope.items() if v},
        "policy": {
            "approverRoles": list(record.approver_roles),
            "timeoutAction": record.timeout_action,
            "unresolved": "never approved: at the deadline the timeout action decides",
        },
        "timeout": {
            "deadline": iso_utc(record.deadline),
            "timeoutS": max(record.deadline - record.created_at, 0.0),
        },
        "requestedBy": record.requested_by,
    }
    if isinstance(context.get("schema"), Mapping):
        payload["schema"] = dict(context["schema"])
    if record.suggested_action:
        payload["suggestedDecision"] = record.suggested_action
    return payload


def resolved_payload(record: HitlRecord) -> dict[str, Any]:
    """`action.resolved`'s payload: the decision, who made it and whether it approves."""
    decision = dict(record.decision)
    action = str(decision.get("action") or "")
    found: dict[str, Any] = {
        "decision": action or None,
        "approved": action == HitlAction.APPROVE.value,
        "via": str(decision.get("via") or record.state.lower()),
        "hitlState": record.state,
    }
    for key, name in (("rationale", "rationale"), ("decided_by", "decidedBy"), ("patch", "patch")):
        if decision.get(key):
            found[name] = decision[key]
    return found


def pending_request(action: ActionRecord, record: HitlRecord | None) -> dict[str, Any]:
    """A thread read's pending request for an open action."""
    found: dict[str, Any] = {"actionId": action.action_id, "kind": action.kind,
                             "requestedAt": iso_utc(action.created_at)}  # fmt: skip
    if action.kind == ActionKind.PERMISSION:
        found["permissionId"] = action.action_id
    if action.turn_id:
        found["turnId"] = action.turn_id
    if action.task_id:
        found["taskId"] = action.task_id
    if record is not None:
        found["actionType"] = record.reason_type.lower()
        found["decisions"] = decisions(record)
        found["deadline"] = iso_utc(record.deadline)
    return found
