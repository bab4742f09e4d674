"""Handoff requests before they exist (RFC 17.6): field validation naming each field, the
snapshot's declared content type, target checks and the routing choice."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from apiary.core.handoff_request import (
    MAX_CAPABILITIES,
    MAX_REASON_CHARS,
    Candidate,
    HandoffDraft,
    HandoffPolicy,
    check_target,
    choose_target,
    missing_capabilities,
    validate_draft,
)
from apiary.errors import (
    ApiaryError,
    OversizePayloadError,
    UnsupportedMessageTypeError,
    ValidationError,
)

POLICY = HandoffPolicy()
DRAFT = HandoffDraft(
    request_id="h-1",
    from_agent="alice",
    to_agent="bob",
    reason="needs review",
    context_snapshot=b'{"k": 1}',
    snapshot_content_type="application/json",
    capabilities_required=("review", "python"),
)
BOB = Candidate("bob", ("review", "python", "go"), ("application/json",))


def refused(draft: HandoffDraft, policy: HandoffPolicy = POLICY) -> ApiaryError:
    with pytest.raises(ApiaryError) as caught:
        validate_draft(draft, policy)
    return caught.value


def test_a_valid_draft_gets_its_defaults() -> None:
    draft = validate_draft(replace(DRAFT, capabilities_required=("a", "b", "a")), POLICY)
    assert draft.timeout_s == POLICY.default_timeout_s
    assert draft.capabilities_required == ("a", "b")
    assert draft.priority == 0
    assert validate_draft(replace(DRAFT, timeout_s=2), POLICY).timeout_s == 2.0


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"request_id": ""}, "request_id"),
        ({"request_id": " h-1"}, "request_id"),
        ({"request_id": "x" * 201}, "request_id"),
        ({"from_agent": ""}, "from_agent"),
        ({"from_agent": "al\nice"}, "from_agent"),
        ({"to_agent": "alice"}, "to_agent"),
        ({"to_agent": "", "capabilities_required": ()}, "to_agent"),
        ({"reason": "r" * (MAX_REASON_CHARS + 1)}, "reason"),
        ({"capabilities_required": ("ok", "")}, "capabilities_required"),
        ({"capabilities_required": (" padded",)}, "capabilities_required"),
        ({"capabilities_required": tuple(f"c{i}" for i in range(65))}, "capabilities_required"),
        ({"priority": 21}, "priority"),
        ({"priority": -20}, "priority"),
        ({"timeout_s": 0.0}, "timeout"),
        ({"timeout_s": -1.0}, "timeout"),
        ({"timeout_s": POLICY.max_timeout_s + 1}, "timeout"),
        ({"timeout_s": float("nan")}, "timeout"),
        ({"snapshot_content_type": "json"}, "snapshot_content_type"),
        ({"snapshot_content_type": "application/*"}, "snapshot_content_type"),
        ({"snapshot_content_type": "; charset=utf-8"}, "snapshot_content_type"),
        ({"context_snapshot": b"{not json"}, "context_snapshot"),
        ({"context_snapshot": b"\xff", "snapshot_content_type": "text/plain"}, "context_snapshot"),
    ],
)
def test_every_bad_field_is_named(changes: dict[str, Any], field: str) -> None:
    error = refused(replace(DRAFT, **changes))
    assert isinstance(error, ValidationError), error
    assert error.details["field"] == field
    assert error.message.startswith(f"{field}: ")


def test_an_oversize_snapshot_is_refused_naming_it() -> None:
    error = refused(
        replace(DRAFT, context_snapshot=b"{}" + b" " * 9), HandoffPolicy(max_snapshot_bytes=10)
    )
    assert isinstance(error, OversizePayloadError)
    assert error.details == {"field": "context_snapshot", "size": "11", "limit": "10"}


def test_undeclared_snapshots_are_opaque_bytes() -> None:
    draft = validate_draft(
        replace(DRAFT, context_snapshot=b"\xff\x00", snapshot_content_type=""), POLICY
    )
    assert draft.context_snapshot == b"\xff\x00"
    check_target(draft, Candidate("bob", ("review", "python"), ("text/plain",)))


def test_capability_routing_needs_no_target() -> None:
    assert validate_draft(replace(DRAFT, to_agent=""), POLICY).to_agent == ""


@pytest.mark.parametrize(
    "values",
    [
        {"default_timeout_s": 0},
        {"max_timeout_s": float("inf")},
        {"default_timeout_s": 10, "max_timeout_s": 5},
        {"max_attempts": 0},
        {"max_attempts": True},
        {"max_snapshot_bytes": 0},
        {"reroute": "yes"},
    ],
)
def test_bad_policies_name_the_setting(values: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as caught:
        HandoffPolicy.from_settings(values)
    assert caught.value.details["field"].startswith("handoff.")


def test_unknown_policy_settings_are_refused() -> None:
    with pytest.raises(ValidationError) as caught:
        HandoffPolicy.from_settings({"retries": 3})
    assert caught.value.details["field"] == "handoff.retries"
    assert HandoffPolicy.from_settings({"max_attempts": 5}).max_attempts == 5


# --- targets ---------------------------------------------------------------------------------


def test_missing_capabilities_keep_the_required_order() -> None:
    assert missing_capabilities(("a", "b", "c"), ("c",)) == ("a", "b")
    assert missing_capabilities((), ("c",)) == ()


@pytest.mark.conformance("handoff.capabilities.target-must-possess")
def test_an_incapable_target_is_refused_naming_to_agent_and_what_it_lacks() -> None:
    draft = validate_draft(DRAFT, POLICY)
    check_target(draft, BOB)
    with pytest.raises(ValidationError) as caught:
        check_target(draft, Candidate("bob", ("review",), ("application/json",)))
    assert caught.value.details["field"] == "to_agent"
    assert caught.value.details["missing_capabilities"] == "python"
    assert "bob lacks the required capabilities: python" in caught.value.message


@pytest.mark.conformance("handoff.context.content-types", "patterns.handoff.context-content-types")
def test_a_target_must_take_the_snapshots_content_type() -> None:
    draft = validate_draft(DRAFT, POLICY)
    check_target(draft, replace(BOB, modalities=("application/*",)))
    check_target(draft, replace(BOB, modalities=()))  # implicit: JSON and protobuf
    with pytest.raises(UnsupportedMessageTypeError) as caught:
        check_target(draft, replace(BOB, modalities=("text/plain",)))
    assert caught.value.details["field"] == "snapshot_content_type"
    assert caught.value.details["agent_id"] == "bob"


def test_routing_picks_the_least_loaded_capable_available_agent() -> None:
    draft = validate_draft(replace(DRAFT, to_agent=""), POLICY)
    pool = [
        Candidate("alice", ("review", "python"), ()),  # the origin
        Candidate("dave", ("review",), ()),  # lacks python
        Candidate("erin", ("review", "python"), ("text/plain",)),  # no JSON
        Candidate("frank", ("review", "python"), (), state="UNAVAILABLE"),
        Candidate("carol", ("review", "python"), ()),
        Candidate("bob", ("review", "python"), ()),
    ]
    assert choose_target(draft, pool, {}) == "bob"
    assert choose_target(draft, pool, {"bob": 2, "carol": 1}) == "carol"
    assert choose_target(draft, pool, {}, exclude=("bob",)) == "carol"
    assert choose_target(draft, pool, {}, exclude=("bob", "carol")) is None
    assert choose_target(draft, [], {}) is None


def test_candidates_read_registry_descriptors() -> None:
    descriptor = {"capabilities": ["a", "b"], "modalities_supported": ["text/plain"]}
    found = Candidate.from_descriptor("x", descriptor, "SHUTTING_DOWN")
    assert found == Candidate("x", ("a", "b"), ("text/plain",), "SHUTTING_DOWN")
    assert not found.available
    assert Candidate.from_descriptor("y", {"capabilities": "a"}).capabilities == ()
    assert MAX_CAPABILITIES == 64
