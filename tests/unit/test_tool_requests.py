"""A call's effective policy, retry rules, backoff, argv templates and pre-approval."""

from __future__ import annotations

import pytest

from apiary.core.tools.argv import render_argv, template_fields
from apiary.core.tools.policy import ExecutionPolicy, HostPort, NetworkPolicy, PrivilegeLevel
from apiary.core.tools.requests import RequestedPolicy, effective_policy
from apiary.core.tools.retries import backoff_delay, is_transient, may_retry, parse_backoff
from apiary.engine.tools.settings import ToolSettings
from apiary.errors import ValidationError

DEFAULT = ExecutionPolicy(
    timeout_ms=0, max_retries=2, backoff="linear", network=NetworkPolicy.EGRESS_RESTRICTED,
    privilege=PrivilegeLevel.DEFAULT, budget_cpu_ms=100, budget_wall_ms=1000,
)  # fmt: skip


@pytest.mark.conformance("tool.policy.fields-supported")
def test_request_fields_override_the_tool_default_and_empty_ones_keep_it() -> None:
    kept = effective_policy(RequestedPolicy(), DEFAULT, default_timeout_s=30)
    assert kept.timeout_ms == 30_000  # the descriptor's default_timeout_s
    assert (kept.network, kept.privilege) == (
        NetworkPolicy.EGRESS_RESTRICTED,
        PrivilegeLevel.DEFAULT,
    )
    assert (kept.budget_cpu_ms, kept.budget_wall_ms, kept.max_retries) == (100, 1000, 2)
    asked = effective_policy(
        RequestedPolicy(timeout_ms=500, max_retries=9, backoff="NONE", network_policy="deny_all",
                        privilege_level="privileged", budget_cpu_ms=7, budget_wall_ms=8),
        DEFAULT, max_retries_cap=4,
    )  # fmt: skip
    assert (asked.timeout_ms, asked.max_retries, asked.backoff) == (500, 4, "none")
    assert (asked.network, asked.privilege) == (NetworkPolicy.DENY_ALL, PrivilegeLevel.PRIVILEGED)
    assert (asked.budget_cpu_ms, asked.budget_wall_ms) == (7, 8)
    assert effective_policy(RequestedPolicy(), ExecutionPolicy()).network is NetworkPolicy.DENY_ALL
    allow = (HostPort("example.com", 443),)
    assert (
        effective_policy(RequestedPolicy(), ExecutionPolicy(), allowlist=allow).allowlist == allow
    )
    assert effective_policy(
        RequestedPolicy(), ExecutionPolicy(), needs_worktree=True
    ).worktree_required


@pytest.mark.parametrize("field", ["network_policy", "privilege_level", "backoff"])
def test_unknown_values_name_the_field(field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        effective_policy(RequestedPolicy(**{field: "bogus"}), ExecutionPolicy())
    assert caught.value.details["field"] == field


def test_only_transient_failures_of_idempotent_tools_are_retried() -> None:
    assert parse_backoff("") == "exponential"
    for code in (
        "TOOL_TIMEOUT",
        "tool_timeout",
        "WALL_TIMEOUT",
        "unavailable",
        "agent_unavailable",
    ):
        assert is_transient(code)
    for code in ("validation_error", "permission_denied", "CPU_BUDGET_EXCEEDED", "TOOL_FAILED"):
        assert not is_transient(code)
    assert may_retry("WALL_TIMEOUT", idempotent=True, retries_done=1, max_retries=2)
    assert not may_retry("WALL_TIMEOUT", idempotent=True, retries_done=2, max_retries=2)
    assert not may_retry("WALL_TIMEOUT", idempotent=False, retries_done=0, max_retries=5)


def test_backoff_delays() -> None:
    assert [backoff_delay("exponential", n, 0.1, 0.5) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.4, 0.5]
    assert [backoff_delay("linear", n, 0.1, 1.0) for n in (1, 2, 3)] == pytest.approx(
        [0.1, 0.2, 0.3]
    )
    assert backoff_delay("constant", 5, 0.1, 1.0) == 0.1
    assert backoff_delay("none", 5, 0.1, 1.0) == 0.0


def test_argv_templates_fill_whole_arguments() -> None:
    template = ["grep", "-n", "{pattern}", "--", "{path}", "{{literal}}"]
    assert template_fields(template) == ("pattern", "path")
    argv = render_argv(template, {"pattern": "a b; $(x)", "path": "f.txt"})
    assert argv == ["grep", "-n", "a b; $(x)", "--", "f.txt", "{literal}"]
    assert render_argv(["echo", "{n}", "{flag}"], {"n": 2.5, "flag": True}) == [
        "echo",
        "2.5",
        "true",
    ]
    with pytest.raises(ValidationError) as missing:
        render_argv(template, {"pattern": "x"})
    assert missing.value.details["field"] == "args.path"
    with pytest.raises(ValidationError) as nested:
        render_argv(["x", "{p}"], {"p": {"deep": 1}})
    assert nested.value.details["field"] == "args.p"
    for bad in (["{a.b}"], ["{0}"], ["{a!r}"], ["{"]):
        with pytest.raises(ValueError):
            template_fields(bad)


def test_pre_approval_covers_every_escalation_a_policy_asks_for() -> None:
    settings = ToolSettings(preapproved={
        "ELEVATED": frozenset({"fs"}),
        "PRIVILEGED": frozenset({"ops/reboot"}),
        "FULL_ACCESS": frozenset({"web"}),
    })  # fmt: skip
    elevated = ExecutionPolicy(privilege=PrivilegeLevel.ELEVATED)
    privileged = ExecutionPolicy(privilege=PrivilegeLevel.PRIVILEGED)
    full = ExecutionPolicy(network=NetworkPolicy.FULL_ACCESS)
    assert settings.preapproves(elevated, "fs", "write")
    assert not settings.preapproves(privileged, "fs", "write")
    assert settings.preapproves(privileged, "ops", "reboot")
    assert settings.preapproves(elevated, "ops", "reboot")  # PRIVILEGED covers ELEVATED
    assert not settings.preapproves(elevated, "ops", "halt")
    assert settings.preapproves(full, "web", "fetch")
    both = ExecutionPolicy(privilege=PrivilegeLevel.ELEVATED, network=NetworkPolicy.FULL_ACCESS)
    assert not settings.preapproves(both, "fs", "write")  # FULL_ACCESS is not pre-approved
    assert settings.preapproves(ExecutionPolicy(), "anyone", "anything")  # nothing to approve
