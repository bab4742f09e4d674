"""WORKTREE_CONTROL payloads (RFC 16, message-types): every action, both spellings of a
switch, and a validation error naming the field for every bad input."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apiary.core.worktrees.control import ControlAction, ControlRequest, parse_control, status_body
from apiary.core.worktrees.records import WorktreeBinding
from apiary.errors import ValidationError

A = ControlAction


def parse(body: Any, sender: str = "agent-a") -> ControlRequest:
    return parse_control(json.dumps(body).encode(), sender)


@pytest.mark.conformance("worktree.control.operations")
def test_every_operation_of_rfc_16_parses() -> None:
    bind = parse({
        "action": "bind", "repo_id": "customer-service-api",
        "worktree_id": "feature-auth-improvements",
        "metadata": {"branch": "feat/oauth-integration", "commit_sha": "abc123def456",
                     "purpose": "security_audit", "isolation_level": "CONTAINER"},
    })  # fmt: skip
    assert bind == ControlRequest(
        A.BIND, "agent-a", "customer-service-api", "feature-auth-improvements",
        branch="feat/oauth-integration", commit_sha="abc123def456",
    )  # fmt: skip
    assert parse({"action": "UNBIND"}) == ControlRequest(A.UNBIND, "agent-a")
    assert parse({"action": "SWITCH_REQUEST", "target_worktree_id": "wt", "ttl_ms": 1500}) == (
        ControlRequest(A.SWITCH_REQUEST, "agent-a", "", "wt", ttl_s=1.5)
    )
    assert parse({"action": "switch_approve", "ttl_ms": 900000}).ttl_s == 900.0
    assert parse({"action": "Switch_Reject", "reason": "no"}) == ControlRequest(
        A.SWITCH_REJECT, "agent-a", reason="no"
    )
    assert parse({"action": "switch_revoke"}).action is A.SWITCH_REVOKE
    assert parse({"action": "status", "include_details": ["current_binding"]}) == ControlRequest(
        A.STATUS, "agent-a"
    )


def test_the_message_types_switch_spelling_is_a_switch_request() -> None:
    request = parse({
        "action": "switch", "new_repo_id": "payment-processor",
        "new_worktree_id": "hotfix-rate-limiting", "preserve_state": True,
        "migration_strategy": "COPY_ACTIVE_FILES",
    })  # fmt: skip
    assert request == ControlRequest(
        A.SWITCH_REQUEST, "agent-a", "payment-processor", "hotfix-rate-limiting"
    )
    assert parse(
        {"action": "switch", "worktree_id": "w", "requires_hitl": False}
    ).requires_hitl is (False)


def test_agent_id_defaults_to_the_sender() -> None:
    assert parse({"action": "status"}, sender="bob").agent_id == "bob"
    assert parse({"action": "status", "agent_id": "carol"}, sender="bob").agent_id == "carol"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "action"),
        ({"action": ""}, "action"),
        ({"action": 7}, "action"),
        ({"action": "teleport"}, "action"),
        ({"action": "bind", "worktree_id": "w"}, "repo_id"),
        ({"action": "bind", "repo_id": "r"}, "worktree_id"),
        ({"action": "bind", "repo_id": 5, "worktree_id": "w"}, "repo_id"),
        ({"action": "bind", "repo_id": "r", "worktree_id": "w", "metadata": []}, "metadata"),
        ({"action": "bind", "repo_id": "r", "worktree_id": "w", "metadata": {"branch": 1}},
         "metadata.branch"),
        ({"action": "switch_request"}, "worktree_id"),
        ({"action": "switch", "new_worktree_id": "w", "ttl_ms": "soon"}, "ttl_ms"),
        ({"action": "switch", "new_worktree_id": "w", "ttl_ms": -1}, "ttl_ms"),
        ({"action": "switch", "new_worktree_id": "w", "ttl_ms": True}, "ttl_ms"),
        ({"action": "switch", "new_worktree_id": "w", "requires_hitl": "yes"}, "requires_hitl"),
        ({"action": "switch_reject", "reason": ["x"]}, "reason"),
        ({"action": "status", "agent_id": 3}, "agent_id"),
    ],
)  # fmt: skip
def test_a_bad_field_is_named(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse(body)
    assert caught.value.details["field"] == field


@pytest.mark.parametrize("payload", [b"", b"not json", b"[1, 2]", b"\xff\xfe", b'"bind"'])
def test_a_payload_that_is_not_a_json_object_is_refused(payload: bytes) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_control(payload, "agent-a")
    assert caught.value.details["field"] == "payload"


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (b'{"action": "status", "x": ' + b"[" * 64 + b"]" * 64 + b"}", "deeper than 64 levels"),
        (b'{"action": "status", "x": "' + b"x" * (1 << 20) + b'"}', "bytes of JSON, more than"),
        (b'{"action": "switch_reject", "reason": "\\u0000"}', "NUL character"),
    ],
)
def test_a_payload_is_read_within_the_json_limits(payload: bytes, words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_control(payload, "agent-a")
    assert caught.value.details["field"] == "payload"
    assert caught.value.message.startswith("payload: ") and words in caught.value.message


def test_the_status_body_names_where_the_agent_works() -> None:
    record = WorktreeBinding(
        "a", state="BOUND_NON_HOME", repo_id="r", worktree_id="home", branch="home",
        current_repo_id="r", current_worktree_id="other", expires_at=1_700_000_900.0, version=4,
    )  # fmt: skip
    body = status_body(record, "/data/worktrees/r/other")
    assert body["state"] == "BOUND_NON_HOME"
    assert (body["repo_id"], body["worktree_id"], body["path"]) == (
        "r", "other", "/data/worktrees/r/other",
    )  # fmt: skip
    assert body["home"] == {"repo_id": "r", "worktree_id": "home", "branch": "home"}
    assert body["expires_at"] == "2023-11-14T22:28:20Z"
    assert "retry_at" not in body and "target" not in body
    unbound = status_body(WorktreeBinding("a"))
    assert (unbound["state"], unbound["repo_id"], unbound["worktree_id"]) == ("UNBOUND", "", "")
