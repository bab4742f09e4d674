"""WORKTREE_CONTROL envelopes to the reserved `worktrees` endpoint (RFC 16, message-types):
agents bind, switch, revoke and ask for their status by message, and every change of their
binding reaches them as a WORKTREE_CONTROL status."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from apiary.core.envelope import MessageType
from apiary.engine.notices import RESERVED_IDS
from apiary.errors import ApiaryError, PermissionDeniedError, ValidationError
from apiary.testing.engine import EngineHarness
from tests.engine.test_worktrees import OLIVIA, S, settle, world
from tests.gitrepo import README

WC = MessageType.WORKTREE_CONTROL


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[EngineHarness]:
    async with world(tmp_path) as harness:
        await harness.register("agent-a")
        await harness.register("agent-b")
        yield harness


async def control(h: EngineHarness, body: dict[str, Any], sender: str = "agent-a") -> str:
    """Send a WORKTREE_CONTROL request to `worktrees`; its message id."""
    outcome = await h.send(sender, "worktrees", body, message_type=WC)
    assert outcome.accepted, outcome.reason
    return outcome.message_id


async def statuses(h: EngineHarness, agent: str = "agent-a") -> list[dict[str, Any]]:
    """The WORKTREE_CONTROL envelopes the agent received, oldest first."""
    found = []
    for handout in await h.take(agent, notices=True):
        env = h.engine.router.codec.decode(handout.message.envelope)
        if env.message_type is WC:
            assert env.producer_id == "coordinator"
            found.append(json.loads(env.payload))
    return found


@pytest.mark.conformance("worktree.control.operations")
async def test_an_agent_binds_switches_and_returns_by_message(h: EngineHarness) -> None:
    bind = await control(h, {
        "action": "bind", "repo_id": "api", "worktree_id": "frontend",
        "metadata": {"branch": "feat/oauth", "purpose": "security_audit"},
    })  # fmt: skip
    (reply,) = await statuses(h)
    assert (reply["action"], reply["event"], reply["in_reply_to"]) == ("status", "bind_ok", bind)
    assert (reply["ok"], reply["state"], reply["repo_id"], reply["worktree_id"]) == (
        True, "BOUND_HOME", "api", "frontend",
    )  # fmt: skip
    assert reply["home"]["branch"] == "feat/oauth"
    assert (Path(reply["path"]) / "README.md").read_text() == README
    status = await control(h, {"action": "STATUS", "include_details": ["current_binding"]})
    (reply,) = await statuses(h)
    assert (reply["event"], reply["in_reply_to"], reply["state"]) == (
        "status",
        status,
        "BOUND_HOME",
    )
    # The message-types "switch" spelling, to another repository.
    switch = await control(h, {
        "action": "switch", "new_repo_id": "docs", "new_worktree_id": "hotfix",
        "preserve_state": True, "ttl_ms": 60_000,
    })  # fmt: skip
    (reply,) = await statuses(h)
    assert (reply["event"], reply["in_reply_to"], reply["state"]) == (
        "switch_request", switch, "SWITCH_PENDING",
    )  # fmt: skip
    assert reply["target"] == {"repo_id": "docs", "worktree_id": "hotfix"}
    # The operator's approval reaches the agent without a request of its own.
    await h.engine.hitl.decide(reply["invocation_id"], "approve", OLIVIA, "ok")
    await settle(h, "agent-a", S.BOUND_NON_HOME)
    (reply,) = await statuses(h)
    assert (reply["event"], reply["in_reply_to"], reply["state"]) == (
        "switch_approve",
        "",
        "BOUND_NON_HOME",
    )
    assert (reply["repo_id"], reply["worktree_id"]) == ("docs", "hotfix")
    assert reply["expires_at"].endswith("Z")
    assert reply["path"].endswith("/data/worktrees/docs/hotfix")
    assert reply["path"] == str(h.engine.worktrees.bound_root("agent-a"))
    revoke = await control(h, {"action": "switch_revoke", "reason": "done"})
    (reply,) = await statuses(h)
    assert (reply["event"], reply["in_reply_to"], reply["state"]) == (
        "switch_revoke",
        revoke,
        "BOUND_HOME",
    )
    unbind = await control(h, {"action": "unbind"})
    (reply,) = await statuses(h)
    assert (reply["event"], reply["in_reply_to"], reply["state"]) == ("unbind", unbind, "UNBOUND")
    assert reply["path"] == ""


async def test_a_failed_bind_is_answered_with_its_reason(h: EngineHarness) -> None:
    await control(h, {"action": "bind", "repo_id": "nowhere", "worktree_id": "x"})
    (reply,) = await statuses(h)
    assert (reply["ok"], reply["error_code"], reply["state"]) == (
        False, "worktree_not_found", "BIND_FAILED",
    )  # fmt: skip
    assert reply["attempts"] == 1 and "retry_at" in reply and "recovery_at" in reply
    # The automatic retry's outcome reaches the agent too.
    h.clock.advance(1)
    await h.engine.worktrees.fire_due()
    (reply,) = await statuses(h)
    assert (reply["event"], reply["attempts"]) == ("retry_error", 2)


async def test_an_agent_withdraws_its_own_pending_switch(h: EngineHarness) -> None:
    await control(h, {"action": "bind", "repo_id": "api", "worktree_id": "frontend"})
    await control(h, {"action": "switch_request", "worktree_id": "shared"})
    invocation = h.engine.worktrees.binding("agent-a").invocation_id
    await control(h, {"action": "switch_reject"})
    assert h.engine.worktrees.binding("agent-a").state == "BOUND_HOME"
    assert (await h.engine.hitl.get(invocation)).state == "CANCELLED"
    replies = await statuses(h)
    assert [r["event"] for r in replies] == ["bind_ok", "switch_request", "switch_reject"]
    assert "withdrawn by the agent" in replies[-1]["note"]


@pytest.mark.parametrize(
    ("body", "error", "field"),
    [
        ({"action": "teleport"}, ValidationError, "action"),
        ({"worktree_id": "x"}, ValidationError, "action"),
        ({"action": "bind", "worktree_id": "x"}, ValidationError, "repo_id"),
        ({"action": "bind", "repo_id": "api", "worktree_id": 3}, ValidationError, "worktree_id"),
        ({"action": "switch", "new_worktree_id": "x", "ttl_ms": "1h"}, ValidationError, "ttl_ms"),
        ({"action": "switch_approve"}, PermissionDeniedError, "action"),
        ({"action": "unbind", "agent_id": "agent-b"}, PermissionDeniedError, "agent_id"),
    ],
)
async def test_bad_requests_are_rejected_with_the_field_named(
    h: EngineHarness, body: dict[str, Any], error: type[ApiaryError], field: str
) -> None:
    with pytest.raises(error) as caught:
        await h.send("agent-a", "worktrees", body, message_type=WC)
    assert caught.value.details["field"] == field
    assert await statuses(h) == []
    assert h.engine.worktrees.binding("agent-a").version == 0
    assert h.engine.worktrees.binding("agent-b").version == 0


async def test_an_illegal_operation_is_rejected_with_its_error(h: EngineHarness) -> None:
    with pytest.raises(ApiaryError) as caught:
        await h.send("agent-a", "worktrees", {"action": "switch_revoke"}, message_type=WC)
    assert caught.value.code == "worktree_not_bound"
    with pytest.raises(ValidationError) as wrong_type:
        await h.send("agent-a", "worktrees", {"action": "status"})  # a DATA envelope
    assert wrong_type.value.details["field"] == "message_type"


async def test_worktrees_is_a_reserved_participant(h: EngineHarness) -> None:
    assert "worktrees" in RESERVED_IDS
    with pytest.raises(ApiaryError):
        await h.register("worktrees")
