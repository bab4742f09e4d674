"""The [rooms] table: room policy and service settings from TOML, with named errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from apiary.core.rooms.policy import RoomPolicy
from apiary.engine.negotiation.rooms import RoomSettings
from apiary.errors import ValidationError
from apiary.server.config.loader import load_config


@pytest.mark.conformance(
    "room.auto-approval.configurable", "patterns.room.auto-approval.configurable"
)
def test_the_rooms_table_sets_policy_and_service_settings(tmp_path: Path) -> None:
    file = tmp_path / "apiary.toml"
    file.write_text(
        "[rooms]\n"
        "min_score_threshold = 8\nmin_confidence_threshold = 0.6\nmin_pass_ratio = 1.0\n"
        "max_std_dev = 1.5\nvote_timeout_s = 120\nhitl_timeout_s = 600\n"
        'hitl_approver_roles = ["architect"]\nversion = "2026-q1"\n'
        "max_artifact_bytes = 1048576\ninline_artifact_bytes = 0\n"
        "wait_default_s = 30\nwait_max_s = 600\n"
    )
    rooms = load_config(file, {}, {}).rooms
    assert rooms.policy == RoomPolicy(
        min_score_threshold=8.0, min_confidence_threshold=0.6, min_pass_ratio=1.0,
        max_std_dev=1.5, vote_timeout_s=120.0, hitl_timeout_s=600.0,
        hitl_approver_roles=("architect",), version="2026-q1",
    )  # fmt: skip
    assert rooms.policy.policy_version == "2026-q1"
    assert (rooms.max_artifact_bytes, rooms.inline_artifact_bytes) == (1 << 20, 0)
    assert (rooms.wait_default_s, rooms.wait_max_s) == (30, 600)


@pytest.mark.conformance("room.quorum.policy")
def test_the_rooms_quorum_table_sets_the_quorum(tmp_path: Path) -> None:
    file = tmp_path / "apiary.toml"
    file.write_text(
        '[rooms.quorum]\nkind = "minimum_fraction"\nvalue = 0.6\non_failure = "fail_with_abstain"\n'
    )
    policy = load_config(file, {}, {}).rooms.policy
    assert policy.quorum.as_dict() == {
        "kind": "minimum_fraction", "value": 0.6, "on_failure": "fail_with_abstain"
    }  # fmt: skip
    # The quorum is part of the policy version: stored, it comes back the same.
    stored = RoomPolicy.from_record(policy.record(0.0))
    assert (stored.quorum, stored.policy_version) == (policy.quorum, policy.policy_version)
    assert policy.policy_version != RoomPolicy().policy_version


def test_rooms_defaults_when_the_table_is_absent(tmp_path: Path) -> None:
    file = tmp_path / "apiary.toml"
    file.write_text('[server]\nstore = "memory://"\n')
    assert load_config(file, {}, {}).rooms == RoomSettings()
    assert load_config(None, {}, {}).rooms == RoomSettings()


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ("min_score_threshold = 11", "rooms.min_score_threshold"),
        ("min_pass_ratio = 'high'", "rooms.min_pass_ratio"),
        ("vote_timeout_s = 0", "rooms.vote_timeout_s"),
        ("max_artifact_bytes = -1", "rooms.max_artifact_bytes"),
        ("wait_max_s = 0", "rooms.wait_max_s"),
        ("auto_approve = true", "rooms.auto_approve"),
        ('hitl_approver_roles = "admin"', "rooms.hitl_approver_roles"),
        ('quorum = "most"', "rooms.quorum"),
        ('quorum = {kind = "most", value = 1}', "rooms.quorum.kind"),
        ('quorum = {kind = "minimum_fraction", value = 1.5}', "rooms.quorum.value"),
        (
            'quorum = {kind = "require_all", value = true, on_failure = "open"}',
            "rooms.quorum.on_failure",
        ),
        ('quorum = {kind = "require_all", value = true, when = 1}', "rooms.quorum.when"),
    ],
)
def test_bad_room_settings_name_the_field(tmp_path: Path, table: str, field: str) -> None:
    file = tmp_path / "apiary.toml"
    file.write_text(f"[rooms]\n{table}\n")
    with pytest.raises(ValidationError) as caught:
        load_config(file, {}, {})
    assert caught.value.details["field"] == field
    assert str(file) in caught.value.message
