"""The execution policy's values, defaults and approval rule (RFC 18.5)."""

from __future__ import annotations

import pytest

from apiary.core.tools.policy import (
    ExecutionPolicy,
    HostPort,
    NetworkPolicy,
    PrivilegeLevel,
    approval,
    parse_host_port,
    parse_network_policy,
    parse_privilege_level,
)
from apiary.errors import ValidationError


@pytest.mark.conformance("tool.network.values", "tool.network.default-deny-all")
def test_network_policy_values_and_default() -> None:
    assert parse_network_policy("") is NetworkPolicy.DENY_ALL
    assert parse_network_policy("egress_restricted") is NetworkPolicy.EGRESS_RESTRICTED
    assert parse_network_policy(" Egress-Unrestricted ") is NetworkPolicy.EGRESS_UNRESTRICTED
    assert parse_network_policy("FULL_ACCESS") is NetworkPolicy.FULL_ACCESS
    with pytest.raises(ValidationError) as caught:
        parse_network_policy("open")
    assert caught.value.details["field"] == "network_policy"
    assert "DENY_ALL" in caught.value.message


@pytest.mark.conformance("tool.privilege.values", "tool.privilege.default-minimal")
def test_privilege_level_values_and_default() -> None:
    assert parse_privilege_level("") is PrivilegeLevel.MINIMAL
    assert parse_privilege_level("default") is PrivilegeLevel.DEFAULT
    assert parse_privilege_level("ELEVATED") is PrivilegeLevel.ELEVATED
    assert parse_privilege_level("privileged") is PrivilegeLevel.PRIVILEGED
    with pytest.raises(ValidationError) as caught:
        parse_privilege_level("root")
    assert caught.value.details["field"] == "privilege_level"


def test_host_port_entries() -> None:
    assert parse_host_port("example.com:443") == HostPort("example.com", 443)
    assert parse_host_port("10.0.0.1") == HostPort("10.0.0.1", 0)
    assert parse_host_port("[::1]:8080") == HostPort("::1", 8080)
    for bad in ("", "host:http", "host:70000", "[::1]x"):
        with pytest.raises(ValidationError) as caught:
            parse_host_port(bad)
        assert caught.value.details["field"] == "allowlist"


def test_wall_limit_is_the_tighter_of_timeout_and_budget() -> None:
    assert ExecutionPolicy().wall_limit_ms == 0
    assert ExecutionPolicy(timeout_ms=5000).wall_limit_ms == 5000
    assert ExecutionPolicy(timeout_ms=5000, budget_wall_ms=200).wall_limit_ms == 200
    assert ExecutionPolicy(budget_wall_ms=300).wall_limit_ms == 300


def test_approval_rule() -> None:
    plain = approval(ExecutionPolicy(privilege=PrivilegeLevel.DEFAULT))
    assert (plain.hitl, plain.log_level, plain.reasons) == (False, "info", ())
    elevated = approval(ExecutionPolicy(privilege=PrivilegeLevel.ELEVATED))
    assert (elevated.hitl, elevated.log_level) == (True, "info")
    assert elevated.reasons == ("privilege_level=ELEVATED",)
    privileged = approval(ExecutionPolicy(privilege=PrivilegeLevel.PRIVILEGED))
    assert (privileged.hitl, privileged.log_level) == (True, "warning")
    full = approval(ExecutionPolicy(network=NetworkPolicy.FULL_ACCESS))
    assert (full.hitl, full.log_level) == (True, "warning")
    assert full.reasons == ("network_policy=FULL_ACCESS",)
    pre = approval(ExecutionPolicy(privilege=PrivilegeLevel.PRIVILEGED), preapproved=True)
    assert (pre.hitl, pre.log_level) == (False, "warning")
