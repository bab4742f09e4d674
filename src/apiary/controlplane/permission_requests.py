"""The parameters of evaluate_permission and resolve_permission, read as
controlplane/requests.py reads every command's. Both take an `idempotency_key`
(controlplane/command_keys.py). What a permission asks about is `action_type` (tool,
message, call: core/runtime/permissions.py) with that type's parameters; another type's
parameter is refused by name."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

from apiary.controlplane.requests import Params
from apiary.controlplane.task_requests import Keyed, ids, obj
from apiary.core.envelope import MessageType
from apiary.core.runtime.permissions import PERMISSION_DECISIONS, PermissionType
from apiary.core.tools.policy import NetworkPolicy, PrivilegeLevel
from apiary.errors import ValidationError

ARGUMENTS_BYTES: Final = 1024 * 1024
"""A tool call's arguments at most (a TOOL_CALL payload's limit)."""
MAX_TIMEOUT_S: Final = 7 * 24 * 3600
_TYPED: Final = {
    PermissionType.TOOL: ("tool_name", "provider_id", "arguments", "privilege_level",
                          "network_policy"),
    PermissionType.MESSAGE: ("message_type", "recipient"),
    PermissionType.CALL: ("method", "subjects", "object_id"),
}  # fmt: skip
_MESSAGE_TYPES: Final = tuple(
    t.name for t in MessageType if t is not MessageType.MESSAGE_TYPE_UNSPECIFIED
)


@dataclass(frozen=True, slots=True)
class EvaluatePermission(Keyed):
    thread_id: str
    action_type: str
    """A PermissionType value."""
    session_id: str = ""
    turn_id: str = ""
    tool_name: str = ""
    provider_id: str = ""
    arguments_json: str = ""
    """The call's arguments as JSON text ('': none, an empty object)."""
    privilege_level: str = ""
    network_policy: str = ""
    message_type: str = ""
    recipient: str = ""
    method: str = ""
    subjects: tuple[str, ...] = ()
    """The agents the call would name (default: the thread's agent)."""
    object_id: str = ""
    """The object whose owner an OWNER rule asks for (a task or a tool call)."""
    prompt: str = ""
    scope: dict[str, Any] = field(default_factory=dict)
    """What the approver is shown of where the action applies (`{"path": "README.md"}`)."""
    timeout_s: int = 0

    @property
    def kind(self) -> PermissionType:
        return PermissionType(self.action_type)

    @classmethod
    def read(cls, p: Params) -> EvaluatePermission:
        kind = PermissionType(
            p.choice("action_type", tuple(PermissionType), PermissionType.TOOL.value)
        )
        for other, names in _TYPED.items():
            for name in names:
                if other is not kind and p.has(name):
                    raise ValidationError.for_field(
                        name, f"is not a parameter of a {kind.value} permission"
                    )
        found = cls(
            idempotency_key=p.id("idempotency_key"),
            thread_id=p.id("thread_id", required=True),
            action_type=kind.value,
            session_id=p.id("session_id"),
            turn_id=p.id("turn_id"),
            prompt=p.text("prompt"),
            scope=obj(p, "scope") or {},
            timeout_s=p.integer("timeout_s", minimum=1, maximum=MAX_TIMEOUT_S) or 0,
            **_typed(p, kind),
        )
        return found


def _typed(p: Params, kind: PermissionType) -> dict[str, Any]:
    if kind is PermissionType.TOOL:
        arguments = ""
        if p.has("arguments"):
            arguments = p.json_value("arguments", ARGUMENTS_BYTES)
            if not isinstance(json.loads(arguments), dict):
                raise ValidationError.for_field("arguments", "must be a JSON object")
        return {
            "tool_name": p.id("tool_name", required=True),
            "provider_id": p.id("provider_id"),
            "arguments_json": arguments,
            "privilege_level": p.choice("privilege_level", tuple(PrivilegeLevel), ""),
            "network_policy": p.choice("network_policy", tuple(NetworkPolicy), ""),
        }
    if kind is PermissionType.MESSAGE:
        message_type = p.id("message_type", required=True).upper()
        if message_type not in _MESSAGE_TYPES:
            raise ValidationError.for_field(
                "message_type", f"must be one of: {', '.join(_MESSAGE_TYPES)}"
            )
        return {"message_type": message_type, "recipient": p.id("recipient", required=True)}
    return {
        "method": p.id("method", required=True),
        "subjects": ids(p, "subjects"),
        "object_id": p.id("object_id"),
    }


@dataclass(frozen=True, slots=True)
class ResolvePermission(Keyed):
    permission_id: str
    decision: str
    """approve or deny (`allow` is approve)."""
    rationale: str = ""

    @classmethod
    def read(cls, p: Params) -> ResolvePermission:
        decision = p.id("decision", required=True).lower()
        decision = {"allow": "approve"}.get(decision, decision)
        if decision not in PERMISSION_DECISIONS:
            raise ValidationError.for_field(
                "decision", f"must be one of: {', '.join(PERMISSION_DECISIONS)} (or allow)"
            )
        return cls(
            idempotency_key=p.id("idempotency_key"),
            permission_id=p.id("permission_id", required=True),
            decision=decision,
            rationale=p.text("rationale"),
        )
