"""Message access control lists (core/acl.py): grants, deny unless allowed, the field a refusal
names, and the `[router.acl]` table's errors."""

from __future__ import annotations

from typing import Any

import pytest

from apiary.core.acl import AclPolicy, MessageGrant, acl_policy
from apiary.core.envelope import MessageType
from apiary.errors import PermissionDeniedError, ValidationError

POLICY = AclPolicy(
    messages=(
        MessageGrant(("planner",), ("DATA", "NOTIFICATION"), ("coder-*",)),
        MessageGrant(("coder-*",), ("*",), ("reviewer",)),
    ),
)


def _denied(call: Any) -> dict[str, str]:
    with pytest.raises(PermissionDeniedError) as caught:
        call()
    assert caught.value.code == "permission_denied"
    assert "access control list" in caught.value.message
    return dict(caught.value.details)


@pytest.mark.parametrize(
    ("producer", "message_type", "recipient"),
    [
        ("planner", MessageType.DATA, "coder-1"),
        ("planner", MessageType.NOTIFICATION, "coder-22"),
        ("coder-1", MessageType.TOOL_CALL, "reviewer"),
        ("coder-1", MessageType.DATA, "reviewer"),
        # ACKs are never refused: every recipient must be able to answer.
        ("stranger", MessageType.ACKNOWLEDGEMENT, "planner"),
    ],
)
def test_grants_let_their_agents_send_their_types_to_their_recipients(
    producer: str, message_type: MessageType, recipient: str
) -> None:
    POLICY.check_message(producer, message_type, recipient)


def test_a_type_no_grant_of_the_producer_names_is_refused_naming_message_type() -> None:
    details = _denied(lambda: POLICY.check_message("planner", MessageType.CONTROL, "coder-1"))
    assert details == {
        "field": "message_type", "producer": "planner", "message_type": "CONTROL",
        "recipient": "coder-1",
    }  # fmt: skip


def test_a_recipient_outside_the_grant_is_refused_naming_recipient() -> None:
    details = _denied(lambda: POLICY.check_message("planner", MessageType.DATA, "reviewer"))
    assert details["field"] == "recipient"
    # Patterns match the whole name: coder-* does not cover "xcoder-1".
    assert _denied(lambda: POLICY.check_message("planner", MessageType.DATA, "xcoder-1"))


def test_an_agent_no_grant_matches_may_send_nothing() -> None:
    details = _denied(lambda: POLICY.check_message("stranger", MessageType.DATA, "coder-1"))
    assert details["field"] == "message_type"


def test_without_grants_everything_is_open() -> None:
    AclPolicy().check_message("anyone", MessageType.CONTROL, "anybody")


def test_the_table_builds_the_policy() -> None:
    table = {
        "messages": [
            {"agents": ["planner"], "types": ["DATA", "NOTIFICATION"], "to": ["coder-*"]},
            {"agents": ["coder-*"], "types": ["*"], "to": ["reviewer"]},
        ],
    }
    assert acl_policy(table) == POLICY
    # `to` defaults to any recipient.
    (grant,) = acl_policy({"messages": [{"agents": ["a"], "types": ["DATA"]}]}).messages
    assert grant.to == ("*",)


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ({"message": []}, "acl.message"),
        ({"messages": {"agents": ["a"]}}, "acl.messages"),
        ({"messages": [{"agents": ["a"], "types": ["DATA"], "from": ["b"]}]},
         "acl.messages[0].from"),
        ({"messages": [{"types": ["DATA"]}]}, "acl.messages[0].agents"),
        ({"messages": [{"agents": [], "types": ["DATA"]}]}, "acl.messages[0].agents"),
        ({"messages": [{"agents": ["a"], "types": ["DATUM"]}]}, "acl.messages[0].types"),
        ({"messages": [{"agents": ["a"], "types": ["DATA"], "to": "b"}]}, "acl.messages[0].to"),
        ({"tools": []}, "acl.tools"),  # tool ACLs are [tools.acl]
        ({"messages": [{"agents": [" "], "types": ["DATA"]}]}, "acl.messages[0].agents"),
    ],
)  # fmt: skip
def test_bad_tables_are_refused_naming_the_field(table: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        acl_policy(table)
    assert caught.value.details["field"] == field
