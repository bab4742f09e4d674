"""The HITL vocabulary, policy and payloads (core/hitl): parsing of actions, reasons and
policies, who may decide, and the shapes of the invocation and decision payloads."""

from __future__ import annotations

import ast
import base64
import json
import math
from pathlib import Path

import pytest

from apiary.core.hitl import machine as hitl
from apiary.core.hitl.machine import (
    HitlMachine,
)
from apiary.core.hitl.payloads import decision_payload, invocation_payload
from apiary.core.hitl.policy import HitlPolicy, authorize
from apiary.core.hitl.vocabulary import (
    HitlAction,
    HitlReason,
    HitlState,
    TimeoutAction,
    UnavailablePolicy,
    parse_action,
    parse_reason,
    parse_timeout_action,
    parse_unavailable_policy,
)
from apiary.errors import (
    PermissionDeniedError,
    UnauthenticatedError,
    ValidationError,
)
from tests.unit.hitl_fixtures import INTO, POLICY, ROLES, THRESHOLD, decide, opened

T0 = 1_754_000_000.0  # 2025-07-31T22:13:20Z

# --- parsing and policy ----------------------------------------------------------------------


@pytest.mark.parametrize("text", ["approve", "APPROVE", " Approve "])
def test_parse_action_accepts_any_case(text: str) -> None:
    assert parse_action(text) is HitlAction.APPROVE


@pytest.mark.parametrize("text", ["", "yes", None, 1])
def test_parse_action_names_the_field(text: object) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_action(text)
    assert caught.value.details["field"] == "action"
    assert caught.value.code == "validation_error"


def test_parse_reason_by_name_or_proto_number() -> None:
    assert [parse_reason(r.lower()) for r in HitlReason] == list(HitlReason)
    assert parse_reason(1) is HitlReason.CONFLICT
    assert parse_reason(8) is HitlReason.CONNECTOR_APPROVAL
    for bad in (0, 9, True, "UNSPECIFIED"):
        with pytest.raises(ValidationError):
            parse_reason(bad)


def test_parse_policies() -> None:
    assert parse_timeout_action("auto_resolve") is TimeoutAction.AUTO_RESOLVE
    assert parse_unavailable_policy("extend-timeout") is UnavailablePolicy.EXTEND_TIMEOUT
    with pytest.raises(ValidationError) as caught:
        parse_unavailable_policy("RETRY")
    assert caught.value.details["field"] == "hitl_unavailable_policy"


def test_policy_defaults_and_validation() -> None:
    assert POLICY.default_timeout_s == 300.0 and POLICY.max_extensions == 3
    assert POLICY.timeout_action is TimeoutAction.DENY
    assert POLICY.unavailable_policy is UnavailablePolicy.DENY_BY_DEFAULT
    assert (POLICY.auto_decide_threshold, POLICY.extend_s, POLICY.defer_s) == (0.8, None, None)
    assert POLICY.enabled
    coerced = HitlPolicy(unavailable_policy="extend_timeout")  # type: ignore[arg-type]
    assert coerced.unavailable_policy is UnavailablePolicy.EXTEND_TIMEOUT
    built = HitlPolicy.from_settings({"timeout_action": "auto_resolve", "max_extensions": 1})
    assert (built.timeout_action, built.max_extensions) == (TimeoutAction.AUTO_RESOLVE, 1)
    with pytest.raises(ValidationError) as caught:
        HitlPolicy.from_settings({"retries": 2})
    assert caught.value.details["field"] == "hitl.retries"
    for bad in (
        {"default_timeout_s": 0},
        {"extend_s": -1.0},
        {"defer_s": math.inf},
        {"max_extensions": -1},
        {"auto_decide_threshold": math.nan},
    ):
        with pytest.raises(ValidationError):
            HitlPolicy(**bad)


# --- payloads --------------------------------------------------------------------------------


def test_invocation_payload_shape() -> None:
    payload = invocation_payload(opened(suggested_action="approve", priority=2))
    assert payload == {
        "invocation_id": "hitl-001",
        "reason_type": "SECURITY_APPROVAL",
        "correlation_id": "corr-1",
        "subject": {"repo_id": "r", "worktree_id": "w", "task_id": "t"},
        "context": {"operation": "delete_sensitive_files", "risk_level": "HIGH"},
        "context_uri": "sw4rm://hitl/context/hitl-001",
        "suggested_action": "approve",
        "proposed_actions": [],
        "approver_roles": list(ROLES),
        "deadline_ts": "2025-07-31T22:18:20Z",
        "approval_required_by": "2025-07-31T22:18:20Z",
        "auto_timeout_action": "DENY",
        "priority": 2,
        "requested_by": "file-processor-001",
    }
    json.dumps(payload)


def test_decision_payload_shape() -> None:
    new = decide(opened(), "approve").record
    payload = decision_payload(new)
    assert {k: payload[k] for k in ("invocation_id", "decision", "rationale", "patch_b64")} == {
        "invocation_id": "hitl-001",
        "decision": "approve",
        "rationale": "Policy thresholds met; low risk",
        "patch_b64": None,
    }
    assert (payload["decided_by"], payload["via"], payload["policy"]) == ("alice", "operator", None)
    assert payload["decided_at"] == "2025-07-31T22:13:30Z"
    assert payload["state"] == "DECIDED"
    json.dumps(payload)


def test_decision_payload_carries_the_patch_in_both_forms() -> None:
    patch = {"b": 1, "a": [True, None]}
    payload = decision_payload(decide(opened(), "modify", patch=patch).record)
    assert payload["patch"] == patch
    assert json.loads(base64.b64decode(payload["patch_b64"])) == patch


def test_fallback_decision_payload_says_so() -> None:
    payload = decision_payload(HitlMachine.unavailable(opened(), THRESHOLD, T0, 0.1).record)
    assert (payload["decision"], payload["via"], payload["policy"], payload["fallback"]) == (
        "deny",
        "unavailable",
        "AUTO_DECIDE_THRESHOLD",
        True,
    )
    assert (payload["score"], payload["error_code"]) == (0.1, "hitl_unavailable")


def test_a_pending_invocation_has_no_decision_payload() -> None:
    with pytest.raises(ValueError, match="no decision"):
        decision_payload(opened())


def test_the_module_is_pure() -> None:
    tree = ast.parse(Path(hitl.__file__).read_text())
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    forbidden = {"asyncio", "time", "os", "random", "grpc", "sqlite3", "psycopg", "datetime"}
    assert not {name.split(".")[0] for name in imported} & forbidden


# --- authorization ---------------------------------------------------------------------------


@pytest.mark.parametrize("roles", [{"data_steward"}, {"security_admin", "x"}, {"admin"}])
def test_any_approver_role_or_admin_may_decide(roles: set[str]) -> None:
    assert decide(opened(), "approve", operator_roles=roles).record.state == HitlState.DECIDED


@pytest.mark.parametrize("roles", [set(), {"anything"}])
def test_no_approver_roles_means_any_operator(roles: set[str]) -> None:
    record = opened(approver_roles=())
    assert decide(record, "deny", operator_roles=roles).record.state == HitlState.DECIDED


def test_a_wrong_role_is_permission_denied_naming_the_roles() -> None:
    with pytest.raises(PermissionDeniedError) as caught:
        decide(opened(), "approve", operator_roles={"developer"})
    assert caught.value.code == "permission_denied"
    assert caught.value.details["missing_roles"] == "data_steward,security_admin"
    assert "data_steward" in caught.value.message and "security_admin" in caught.value.message


def test_authorization_comes_before_validation_and_state() -> None:
    with pytest.raises(PermissionDeniedError):
        decide(opened(), "approve", operator_roles={"developer"}, rationale="")
    with pytest.raises(PermissionDeniedError):
        decide(INTO[HitlState.DECIDED](), "approve", operator_roles={"developer"})


def test_an_anonymous_operator_is_unauthenticated() -> None:
    with pytest.raises(UnauthenticatedError):
        decide(opened(), "approve", operator="")


def test_authorize_treats_a_bare_string_as_one_role() -> None:
    authorize("admin", ("x",))
    authorize("x", "x")
    with pytest.raises(PermissionDeniedError):
        authorize("a", ("admin-ish",))
