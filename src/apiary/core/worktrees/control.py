"""WORKTREE_CONTROL payloads (RFC 16; message-types "WORKTREE_CONTROL Messages"): parsing an
agent's request and building the coordinator's status reply.

A request is a JSON object with an `action`: bind, unbind, switch_request (the message-types
document spells it "switch"), switch_approve, switch_reject, switch_revoke or status, in any
case. Fields by action:

- bind: `repo_id`, `worktree_id` (required); `metadata.branch`, `metadata.commit_sha`.
- switch_request: `worktree_id` (or `target_worktree_id`, `new_worktree_id`; required);
  `repo_id` (or `target_repo_id`, `new_repo_id`; default: the home repository); `ttl_ms`;
  `requires_hitl`.
- switch_approve: `ttl_ms`; `target_worktree_id` (must be the pending target).
- switch_reject, switch_revoke: `reason`.
- unbind, status: nothing.

Every action may name `agent_id`; it defaults to the sender. Unknown fields are ignored (the
message-types examples carry `preserve_state`, `include_details`, `purpose`...). A field of
the wrong type is a ValidationError naming it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from apiary.core.dedup import iso_utc
from apiary.core.json_reader import read_json_object
from apiary.core.worktrees.records import WorktreeBinding, working_location
from apiary.errors import ValidationError


class ControlAction(StrEnum):
    """The WORKTREE_CONTROL operations of RFC 16."""

    BIND = "bind"
    UNBIND = "unbind"
    SWITCH_REQUEST = "switch_request"
    SWITCH_APPROVE = "switch_approve"
    SWITCH_REJECT = "switch_reject"
    SWITCH_REVOKE = "switch_revoke"
    STATUS = "status"


_ALIASES: Final = {"switch": ControlAction.SWITCH_REQUEST}
_TARGET_WORKTREE: Final = ("worktree_id", "target_worktree_id", "new_worktree_id")
_TARGET_REPO: Final = ("repo_id", "target_repo_id", "new_repo_id")


@dataclass(frozen=True, slots=True)
class ControlRequest:
    """One parsed WORKTREE_CONTROL request; fields an action does not take are empty."""

    action: ControlAction
    agent_id: str
    repo_id: str = ""
    worktree_id: str = ""
    branch: str = ""
    commit_sha: str = ""
    ttl_s: float = 0.0
    reason: str = ""
    requires_hitl: bool = True


def parse_control(payload: bytes, sender: str) -> ControlRequest:
    """The request in a WORKTREE_CONTROL payload sent by `sender`; a payload that is not a
    JSON object within the JSON reader's limits is a ValidationError naming `payload`."""
    doc = read_json_object(payload, "payload")
    action = _action(doc.get("action"))
    agent_id = _text(doc, "agent_id") or sender
    if action is ControlAction.BIND:
        metadata = doc.get("metadata", {})
        if not isinstance(metadata, dict):
            raise ValidationError.for_field("metadata", "must be a JSON object")
        return ControlRequest(
            action, agent_id, _required(doc, "repo_id"), _required(doc, "worktree_id"),
            branch=_text(metadata, "branch", "metadata."),
            commit_sha=_text(metadata, "commit_sha", "metadata."),
        )  # fmt: skip
    if action is ControlAction.SWITCH_REQUEST:
        worktree = _first(doc, _TARGET_WORKTREE)
        if not worktree:
            raise ValidationError.for_field("worktree_id", "is required (the switch's target)")
        requires = doc.get("requires_hitl", True)
        if not isinstance(requires, bool):
            raise ValidationError.for_field("requires_hitl", "must be true or false")
        return ControlRequest(
            action, agent_id, _first(doc, _TARGET_REPO), worktree, ttl_s=_ttl(doc),
            requires_hitl=requires,
        )  # fmt: skip
    if action is ControlAction.SWITCH_APPROVE:
        return ControlRequest(
            action, agent_id, worktree_id=_text(doc, "target_worktree_id"), ttl_s=_ttl(doc)
        )
    if action in (ControlAction.SWITCH_REJECT, ControlAction.SWITCH_REVOKE):
        return ControlRequest(action, agent_id, reason=_text(doc, "reason"))
    return ControlRequest(action, agent_id)


def _action(value: object) -> ControlAction:
    if not isinstance(value, str) or not value:
        raise ValidationError.for_field("action", "is required: one of " + _ACTION_NAMES)
    name = value.strip().lower()
    found = _ALIASES.get(name)
    if found is not None:
        return found
    try:
        return ControlAction(name)
    except ValueError:
        raise ValidationError.for_field(
            "action", f"{value!r} is not a WORKTREE_CONTROL action; one of {_ACTION_NAMES}"
        ) from None


_ACTION_NAMES: Final = ", ".join(a.value for a in ControlAction)


def _text(doc: Mapping[str, Any], name: str, prefix: str = "") -> str:
    value = doc.get(name, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValidationError.for_field(f"{prefix}{name}", "must be a string")
    return value


def _required(doc: Mapping[str, Any], name: str) -> str:
    value = _text(doc, name)
    if not value:
        raise ValidationError.for_field(name, "is required")
    return value


def _first(doc: Mapping[str, Any], names: tuple[str, ...]) -> str:
    """The first of `names` given (they are spellings of one field)."""
    for name in names:
        value = _text(doc, name)
        if value:
            return value
    return ""


def _ttl(doc: Mapping[str, Any]) -> float:
    value = doc.get("ttl_ms", 0)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError.for_field("ttl_ms", "must be a number of milliseconds")
    if value < 0:
        raise ValidationError.for_field("ttl_ms", "must not be negative")
    return float(value) / 1000.0


def status_body(binding: WorktreeBinding, root: str = "") -> dict[str, Any]:
    """The binding as the JSON object every coordinator WORKTREE_CONTROL reply carries.

    `root` is the agent's working directory on the coordinator's host ("" when unbound).
    Deadlines are ISO 8601 UTC (message-types rule 7), absent when not set.
    """
    where = working_location(binding)
    body: dict[str, Any] = {
        "agent_id": binding.agent_id,
        "state": binding.state,
        "repo_id": where.repo_id if where else "",
        "worktree_id": where.worktree_id if where else "",
        "home": {"repo_id": binding.repo_id, "worktree_id": binding.worktree_id,
                 "branch": binding.branch},
        "reason": binding.reason,
        "note": binding.note,
        "attempts": binding.attempts,
        "path": root,
        "version": binding.version,
    }  # fmt: skip
    if binding.target is not None:
        body["target"] = {
            "repo_id": binding.target_repo_id,
            "worktree_id": binding.target_worktree_id,
        }
    for name in ("retry_at", "recovery_at", "expires_at"):
        value = getattr(binding, name)
        if value:
            body[name] = iso_utc(value)
    if binding.invocation_id:
        body["invocation_id"] = binding.invocation_id
    return body
