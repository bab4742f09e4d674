"""Worktree bindings through the engine (RFC 16), against real git repositories made in
tmp_path, with timers in virtual time (FakeClock) and HITL decided by an operator."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from apiary.core.worktrees.machine import BindingPolicy
from apiary.core.worktrees.records import BindingState, WorktreeBinding
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import Operator, OperatorEntry, token_digest
from apiary.engine.worktrees.settings import RepoEntry, WorktreeSettings
from apiary.engine.worktrees.worktrees import Worktrees
from apiary.errors import (
    AlreadyExistsError,
    ApiaryError,
    NotFoundError,
    ValidationError,
    WorktreeNotBoundError,
)
from apiary.testing.clock import FakeClock
from apiary.testing.engine import EngineHarness, open_test_engine
from apiary.testing.ids import SequentialIds
from tests.gitrepo import README, git, make_repo

S = BindingState
OLIVIA = Operator("olivia", frozenset({"admin"}))
WITH_OPERATOR = HitlSettings(operators=(OperatorEntry("olivia", token_digest("t"), ("admin",)),))
WAIT_S = 10.0


@asynccontextmanager
async def world(
    tmp_path: Path,
    *,
    store_url: str = "memory://",
    hitl: HitlSettings = WITH_OPERATOR,
    policy: BindingPolicy | None = None,
    clock: FakeClock | None = None,
    ids: SequentialIds | None = None,
) -> AsyncIterator[EngineHarness]:
    """An engine with repository `api` (and `docs`) under tmp_path/repos, data in tmp_path/data."""
    repos = tmp_path / "repos"
    if not (repos / "api").exists():
        make_repo(repos / "api")
        make_repo(repos / "docs")
    settings = WorktreeSettings(
        policy=policy or BindingPolicy(),
        repos=(RepoEntry("api", repos / "api"), RepoEntry("docs", repos / "docs")),
    )
    async with open_test_engine(
        store_url=store_url, data_dir=tmp_path / "data", hitl=hitl, worktrees=settings,
        clock=clock, ids=ids,
    ) as harness:  # fmt: skip
        yield harness


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[EngineHarness]:
    async with world(tmp_path) as harness:
        yield harness


def wt(h: EngineHarness) -> Worktrees:
    return h.engine.worktrees


def root(tmp_path: Path, worktree_id: str, repo_id: str = "api") -> Path:
    return (tmp_path / "data" / "worktrees" / repo_id / worktree_id).resolve()


async def transitions(h: EngineHarness, agent_id: str = "agent-a") -> list[tuple[str, str, str]]:
    return [
        (e.details["input"], e.details["from"], e.details["to"])
        for e in await h.events("worktree.binding")
        if e.agent_id == agent_id
    ]


async def settle(h: EngineHarness, agent_id: str, *states: S) -> WorktreeBinding:
    return await asyncio.wait_for(wt(h).wait_for(agent_id, *states), WAIT_S)


# --- BIND and UNBIND with real worktrees ----------------------------------------------------


@pytest.mark.conformance(
    "worktree.binding.single-home", "worktree.transition.unbound-to-bound-home",
    "worktree.machine.log-transitions", "observability.log.repo-worktree-negotiation",
)  # fmt: skip
async def test_bind_makes_a_real_worktree_with_the_repositorys_files(
    h: EngineHarness, tmp_path: Path
) -> None:
    record = await wt(h).bind("agent-a", "api", "frontend")
    assert record.state == "BOUND_HOME"
    assert (record.home, record.current) == (record.home, record.home)
    where = wt(h).bound_root("agent-a")
    assert where is not None and where.resolve() == root(tmp_path, "frontend")
    assert (where / "README.md").read_text() == README
    assert (where / "src" / "app.py").is_file()
    assert git(where, "rev-parse", "--abbrev-ref", "HEAD") == "frontend"
    listed = git(tmp_path / "repos" / "api", "worktree", "list", "--porcelain")
    assert f"worktree {root(tmp_path, 'frontend')}" in listed
    stored = await h.store.worktrees.get("agent-a")
    assert stored == record == wt(h).binding("agent-a")
    (event,) = await h.events("worktree.binding")
    assert event.agent_id == "agent-a"
    details = event.details
    assert (details["from"], details["to"], details["input"]) == (
        "UNBOUND",
        "BOUND_HOME",
        "BIND_OK",
    )
    assert (details["repo_id"], details["worktree_id"], details["version"]) == (
        "api",
        "frontend",
        1,
    )


async def test_bind_takes_the_branch_and_start_commit_of_its_metadata(
    h: EngineHarness, tmp_path: Path
) -> None:
    api = tmp_path / "repos" / "api"
    first = git(api, "rev-list", "--max-parents=0", "HEAD")
    record = await wt(h).bind("agent-a", "api", "audit", branch="feat/oauth", commit_sha=first)
    where = wt(h).bound_root("agent-a")
    assert where is not None
    assert (record.branch, record.commit_sha) == ("feat/oauth", first)
    assert git(where, "rev-parse", "--abbrev-ref", "HEAD") == "feat/oauth"
    assert git(where, "rev-parse", "HEAD") == first
    assert not (where / "CHANGELOG.md").exists()  # the second commit is not there


@pytest.mark.conformance("worktree.transition.bound-home-to-unbound")
async def test_unbind_and_bind_again_reuse_the_worktree(h: EngineHarness) -> None:
    await wt(h).bind("agent-a", "api", "frontend")
    where = wt(h).bound_root("agent-a")
    assert where is not None
    (where / "work.txt").write_text("in progress")
    record = await wt(h).unbind("agent-a")
    assert record.state == "UNBOUND" and record.home is None
    assert wt(h).bound_root("agent-a") is None
    assert (where / "work.txt").exists()  # UNBIND leaves the worktree on disk
    await wt(h).bind("agent-a", "api", "frontend")
    assert wt(h).bound_root("agent-a") == where
    assert (where / "work.txt").read_text() == "in progress"
    assert [t[0] for t in await transitions(h)] == ["BIND_OK", "UNBIND", "BIND_OK"]


@pytest.mark.conformance("worktree.binding.single-home")
async def test_one_home_per_agent_and_one_agent_per_home(h: EngineHarness, tmp_path: Path) -> None:
    first = await wt(h).bind("agent-a", "api", "frontend")
    with pytest.raises(AlreadyExistsError) as caught:
        await wt(h).bind("agent-a", "api", "backend")
    assert caught.value.details == {"agent_id": "agent-a", "state": "BOUND_HOME"}
    assert wt(h).binding("agent-a") == first
    assert not root(tmp_path, "backend").exists()  # refused before any git work
    # Another agent cannot take agent-a's home.
    other = await wt(h).bind("agent-b", "api", "frontend")
    assert (other.state, other.reason) == ("BIND_FAILED", "worktree_locked")
    assert "home worktree of agent agent-a" in other.note


# --- BIND_FAILED (16.3) ------------------------------------------------------------------------


@pytest.mark.conformance(
    "worktree.bind-failed.record-reason", "worktree.bind-failed.retry-backoff",
    "worktree.transition.unbound-to-bind-failed", "worktree.transition.bind-failed-to-bound-home",
)  # fmt: skip
async def test_a_locked_worktree_fails_then_a_retry_with_backoff_binds_it(
    h: EngineHarness, tmp_path: Path
) -> None:
    api, target = tmp_path / "repos" / "api", root(tmp_path, "frontend")
    target.parent.mkdir(parents=True)
    git(api, "worktree", "add", "-b", "frontend", str(target))
    git(api, "worktree", "lock", "--reason", "maintenance", str(target))
    t0 = h.clock.now()
    failed = await wt(h).bind("agent-a", "api", "frontend")
    assert (failed.state, failed.reason, failed.attempts) == ("BIND_FAILED", "worktree_locked", 1)
    assert "maintenance" in failed.note
    assert (failed.retry_at, failed.recovery_at) == (t0 + 1, t0 + 60)
    assert wt(h).bound_root("agent-a") is None  # BIND_FAILED is unbound
    h.clock.advance(1)
    assert await wt(h).fire_due() == 1
    assert (wt(h).binding("agent-a").attempts, wt(h).binding("agent-a").retry_at) == (2, t0 + 3)
    git(api, "worktree", "unlock", str(target))
    h.clock.advance(1.999)
    assert await wt(h).fire_due() == 0  # the second retry is 2 s after the second failure
    h.clock.advance(0.001)
    assert await wt(h).fire_due() == 1
    bound = wt(h).binding("agent-a")
    assert (bound.state, bound.reason, bound.attempts, bound.retry_at) == ("BOUND_HOME", "", 0, 0)
    assert wt(h).bound_root("agent-a") == target
    assert [t[0] for t in await transitions(h)] == ["BIND_ERROR", "RETRY_ERROR", "RETRY_OK"]
    # Nothing is armed any more: the recovery deadline went with BIND_FAILED.
    assert wt(h).next_deadline() is None


@pytest.mark.conformance(
    "worktree.bind-failed.escalate-operator", "worktree.bind-failed.recovery-timeout-60s",
    "worktree.bind-failed.retry-backoff",
)  # fmt: skip
async def test_three_retries_then_the_recovery_timeout_asks_an_operator(
    h: EngineHarness, tmp_path: Path
) -> None:
    api, target = tmp_path / "repos" / "api", root(tmp_path, "frontend")
    target.parent.mkdir(parents=True)
    git(api, "worktree", "add", "-b", "frontend", str(target))
    git(api, "worktree", "lock", str(target))
    t0 = h.clock.now()
    await wt(h).bind("agent-a", "api", "frontend")
    for gap in (1, 2, 4):
        h.clock.advance(gap)
        assert await wt(h).fire_due() == 1
    record = wt(h).binding("agent-a")
    assert (record.attempts, record.retry_at) == (4, 0.0)  # the three retries are used up
    assert await h.engine.hitl.list() == []
    h.clock.advance(t0 + 60 - h.clock.now() - 0.001)
    assert await wt(h).fire_due() == 0
    h.clock.advance(0.001)
    assert await wt(h).fire_due() == 1
    (invocation,) = await h.engine.hitl.list()
    assert invocation.reason_type == "WORKTREE_OVERRIDE"
    assert invocation.subject == {
        "agent_id": "agent-a",
        "repo_id": "api",
        "worktree_id": "frontend",
    }
    assert invocation.context["error_code"] == "worktree_locked"
    escalated = wt(h).binding("agent-a")
    assert (escalated.state, escalated.invocation_id) == ("BIND_FAILED", invocation.invocation_id)
    assert escalated.recovery_at == 0.0  # escalated once
    # The operator fixes the lock and approves: the BIND is retried at once.
    git(api, "worktree", "unlock", str(target))
    await h.engine.hitl.decide(invocation.invocation_id, "approve", OLIVIA, "unlocked it")
    bound = await settle(h, "agent-a", S.BOUND_HOME)
    assert bound.current is not None and bound.current.worktree_id == "frontend"
    assert [t[0] for t in await transitions(h)][-2:] == ["RECOVERY_TIMEOUT", "BIND_OK"]
    (decided,) = await h.events("worktree.escalation_decided")
    assert (decided.actor, decided.details["action"]) == ("olivia", "approve")


@pytest.mark.conformance("worktree.transition.bind-failed-to-unbound")
async def test_a_denied_escalation_leaves_bind_failed_until_an_explicit_unbind(
    tmp_path: Path,
) -> None:
    # No HITL component: the escalation is decided by the deny-by-default fallback at once.
    async with world(tmp_path, hitl=HitlSettings(), policy=BindingPolicy(max_retries=0)) as h:
        failed = await wt(h).bind("agent-a", "nowhere", "frontend")
        assert (failed.reason, failed.retry_at) == ("worktree_not_found", 0.0)
        h.clock.advance(60)
        await wt(h).fire_due()
        (invocation,) = await h.engine.hitl.list(include_decided=True)
        assert invocation.state == "FALLBACK_APPLIED"
        assert wt(h).binding("agent-a").state == "BIND_FAILED"
        cleared = await wt(h).unbind("agent-a", actor="olivia")
        assert (cleared.state, cleared.reason, cleared.home) == ("UNBOUND", "", None)
        assert [t[:2] for t in await transitions(h)] == [
            ("BIND_ERROR", "UNBOUND"),
            ("RECOVERY_TIMEOUT", "BIND_FAILED"),
            ("UNBIND", "BIND_FAILED"),
        ]


@pytest.mark.conformance("worktree.bind-failed.record-reason")
@pytest.mark.parametrize(
    ("repo_id", "worktree_id", "reason"),
    [
        ("nowhere", "frontend", "worktree_not_found"),
        ("api", "../../escape", "worktree_not_found"),
        ("api", "bad id", "worktree_not_found"),
        ("../api", "frontend", "worktree_not_found"),
    ],
)
async def test_a_missing_repository_or_a_bad_id_is_worktree_not_found(
    h: EngineHarness, tmp_path: Path, repo_id: str, worktree_id: str, reason: str
) -> None:
    failed = await wt(h).bind("agent-a", repo_id, worktree_id)
    assert (failed.state, failed.reason) == ("BIND_FAILED", reason)
    assert (failed.repo_id, failed.worktree_id) == (repo_id, worktree_id)
    assert not (tmp_path / "escape").exists() and not (tmp_path / "data" / "escape").exists()


async def test_a_missing_start_commit_or_bad_branch_is_worktree_not_found(
    h: EngineHarness,
) -> None:
    failed = await wt(h).bind("agent-a", "api", "x", commit_sha="0" * 40)
    assert (failed.state, failed.reason) == ("BIND_FAILED", "worktree_not_found")
    await wt(h).unbind("agent-a")
    failed = await wt(h).bind("agent-a", "api", "y", branch="no..dots")
    assert (failed.state, failed.reason) == ("BIND_FAILED", "worktree_not_found")


async def test_a_path_taken_by_other_files_is_a_filesystem_error(
    h: EngineHarness, tmp_path: Path
) -> None:
    squatter = root(tmp_path, "frontend")
    squatter.mkdir(parents=True)
    (squatter / "notes.txt").write_text("not a worktree")
    failed = await wt(h).bind("agent-a", "api", "frontend")
    assert (failed.state, failed.reason) == ("BIND_FAILED", "filesystem_error")
    assert (squatter / "notes.txt").read_text() == "not a worktree"


async def test_a_repository_that_is_not_git_is_worktree_not_found(tmp_path: Path) -> None:
    async with world(tmp_path) as h:
        wt(h).git.repos["plain"] = tmp_path / "plain"
        (tmp_path / "plain").mkdir()
        failed = await wt(h).bind("agent-a", "plain", "x")
        assert (failed.reason, failed.state) == ("worktree_not_found", "BIND_FAILED")


async def test_permission_problems_are_permission_denied(h: EngineHarness, tmp_path: Path) -> None:
    parent = tmp_path / "data" / "worktrees" / "api"
    parent.parent.mkdir(parents=True)
    if os.geteuid() == 0:
        # root ignores file modes; /sys refuses new directories to everyone (EPERM).
        if not os.path.isdir("/sys/kernel"):  # noqa: ASYNC240 - a one-off check in a test
            pytest.skip("needs a non-root user or /sys/kernel to provoke a permission error")
        parent.symlink_to("/sys/kernel")
    else:
        parent.mkdir()
        parent.chmod(0o500)
    try:
        failed = await wt(h).bind("agent-a", "api", "frontend")
    finally:
        if not parent.is_symlink():
            parent.chmod(0o700)
    assert (failed.state, failed.reason) == ("BIND_FAILED", "permission_denied")


async def test_requests_without_their_ids_are_refused_and_change_nothing(h: EngineHarness) -> None:
    for args, field in [(("", "x"), "repo_id"), (("api", ""), "worktree_id")]:
        with pytest.raises(ValidationError) as caught:
            await wt(h).bind("agent-a", *args)
        assert caught.value.details["field"] == field
    for agent in ("", "worktrees", "coordinator"):
        with pytest.raises(ValidationError) as caught:
            await wt(h).bind(agent, "api", "x")
        assert caught.value.details["field"] == "agent_id"
    assert await h.store.worktrees.list() == []
    assert await h.events("worktree.binding") == []


# --- switches --------------------------------------------------------------------------------


async def _home(h: EngineHarness) -> Path:
    await wt(h).bind("agent-a", "api", "frontend")
    home = wt(h).bound_root("agent-a")
    assert home is not None
    return home


@pytest.mark.conformance(
    "worktree.binding.non-home-forbidden", "worktree.transition.bound-home-to-switch-pending",
    "worktree.transition.switch-pending-to-bound-non-home",
    "worktree.transition.bound-non-home-to-bound-home",
)  # fmt: skip
async def test_a_switch_approved_through_hitl_ends_with_its_ttl(
    h: EngineHarness, tmp_path: Path
) -> None:
    home = await _home(h)
    pending = await wt(h).request_switch("agent-a", "shared", ttl_s=60)
    assert pending.state == "SWITCH_PENDING"
    assert wt(h).bound_root("agent-a") == home  # not switched before the approval
    assert not root(tmp_path, "shared").exists()
    (invocation,) = await h.engine.hitl.list()
    assert invocation.invocation_id == pending.invocation_id
    assert invocation.reason_type == "WORKTREE_OVERRIDE"
    assert invocation.subject == {"agent_id": "agent-a", "repo_id": "api", "worktree_id": "shared"}
    assert invocation.suggested_action == "deny"
    await h.engine.hitl.decide(invocation.invocation_id, "approve", OLIVIA, "needed for the proto")
    away = await settle(h, "agent-a", S.BOUND_NON_HOME)
    approved_at = h.clock.now()
    assert away.expires_at == approved_at + 60
    assert "approve by olivia" in away.note
    shared = wt(h).bound_root("agent-a")
    assert shared is not None and shared.resolve() == root(tmp_path, "shared")
    assert (shared / "README.md").read_text() == README
    h.clock.advance(59.999)
    assert await wt(h).fire_due() == 0
    assert wt(h).bound_root("agent-a") == shared
    h.clock.advance(0.001)
    # The TTL is enforced even before the timer loop has run.
    assert wt(h).bound_root("agent-a") == home
    assert await wt(h).fire_due() == 1
    back = wt(h).binding("agent-a")
    assert (back.state, back.current, back.expires_at) == ("BOUND_HOME", back.home, 0.0)
    assert [t[0] for t in await transitions(h)] == [
        "BIND_OK", "SWITCH_REQUEST", "SWITCH_APPROVE", "TTL_EXPIRED",
    ]  # fmt: skip
    events = [e for e in await h.events("worktree.binding") if e.details["input"] != "BIND_OK"]
    assert [(e.details["repo_id"], e.details["worktree_id"]) for e in events] == [
        ("api", "shared"), ("api", "shared"), ("api", "shared"),
    ]  # fmt: skip


@pytest.mark.conformance("worktree.transition.switch-pending-to-bound-home")
async def test_a_switch_denied_through_hitl_stays_home(h: EngineHarness) -> None:
    home = await _home(h)
    pending = await wt(h).request_switch("agent-a", "shared")
    await h.engine.hitl.decide(pending.invocation_id, "deny", OLIVIA, "not now")
    back = await settle(h, "agent-a", S.BOUND_HOME)
    assert back.target is None and "deny by olivia" in back.note
    assert wt(h).bound_root("agent-a") == home


async def test_without_a_hitl_component_a_switch_is_denied_by_default(tmp_path: Path) -> None:
    async with world(tmp_path, hitl=HitlSettings()) as h:
        await _home(h)
        record = await wt(h).request_switch("agent-a", "shared")
        # Decided by the fallback while it was opened: applied before the request returns.
        assert record.state == "BOUND_HOME"
        assert "(absent)" in record.note
        assert [t[0] for t in await transitions(h)] == [
            "BIND_OK",
            "SWITCH_REQUEST",
            "SWITCH_REJECT",
        ]


async def test_a_modify_decision_sets_the_ttl(h: EngineHarness) -> None:
    await _home(h)
    pending = await wt(h).request_switch("agent-a", "shared", ttl_s=600)
    await h.engine.hitl.decide(pending.invocation_id, "modify", OLIVIA, "shorter", {"ttl_ms": 5000})
    away = await settle(h, "agent-a", S.BOUND_NON_HOME)
    assert away.expires_at == h.clock.now() + 5


@pytest.mark.conformance(
    "worktree.transition.bound-non-home-to-bound-home",
    "worktree.transition.bound-non-home-to-unbound",
)  # fmt: skip
async def test_a_direct_approval_closes_the_invocation_then_revoke_and_unbind(
    h: EngineHarness,
) -> None:
    home = await _home(h)
    pending = await wt(h).request_switch("agent-a", "shared", repo_id="docs")
    away = await wt(h).approve_switch("agent-a", ttl_s=120, actor="olivia")
    assert away.state == "BOUND_NON_HOME" and away.current is not None
    assert (away.current.repo_id, away.current.worktree_id) == ("docs", "shared")
    invocation = await h.engine.hitl.get(pending.invocation_id)
    assert invocation.state == "CANCELLED"
    revoked = await wt(h).revoke_switch("agent-a", "done early")
    assert revoked.state == "BOUND_HOME" and wt(h).bound_root("agent-a") == home
    assert wt(h).next_deadline() is None  # the TTL timer went with it
    await wt(h).request_switch("agent-a", "shared", repo_id="docs")
    await wt(h).approve_switch("agent-a")
    unbound = await wt(h).unbind("agent-a")
    assert unbound.state == "UNBOUND" and wt(h).bound_root("agent-a") is None
    assert [t[0] for t in await transitions(h)][-3:] == [
        "SWITCH_REQUEST",
        "SWITCH_APPROVE",
        "UNBIND",
    ]


async def test_an_approval_whose_worktree_cannot_be_made_rejects_the_switch(
    h: EngineHarness, tmp_path: Path
) -> None:
    await _home(h)
    api, target = tmp_path / "repos" / "api", root(tmp_path, "shared")
    git(api, "worktree", "add", "-b", "shared", str(target))
    git(api, "worktree", "lock", str(target))
    await wt(h).request_switch("agent-a", "shared")
    record = await wt(h).approve_switch("agent-a", actor="olivia")
    assert record.state == "BOUND_HOME"
    assert "worktree_locked" in record.note


@pytest.mark.parametrize(
    ("setup", "call", "error", "code"),
    [
        ("unbound", "unbind", WorktreeNotBoundError, "worktree_not_bound"),
        ("unbound", "request_switch", WorktreeNotBoundError, "worktree_not_bound"),
        ("unbound", "approve_switch", WorktreeNotBoundError, "worktree_not_bound"),
        ("home", "approve_switch", NotFoundError, "NOT_FOUND"),
        ("home", "reject_switch", NotFoundError, "NOT_FOUND"),
        ("home", "revoke_switch", NotFoundError, "NOT_FOUND"),
        ("pending", "request_switch", AlreadyExistsError, "already_exists"),
        ("pending", "revoke_switch", NotFoundError, "NOT_FOUND"),
        ("pending", "unbind", ValidationError, "validation_error"),
        ("pending", "bind", AlreadyExistsError, "already_exists"),
    ],
)
async def test_an_operation_the_state_does_not_allow_raises_and_changes_nothing(
    h: EngineHarness, setup: str, call: str, error: type[ApiaryError], code: str
) -> None:
    if setup != "unbound":
        await _home(h)
    if setup == "pending":
        await wt(h).request_switch("agent-a", "shared")
    before = wt(h).binding("agent-a")
    events = len(await h.events())
    args: dict[str, tuple[Any, ...]] = {"request_switch": ("other",), "bind": ("api", "x")}
    with pytest.raises(error) as caught:
        await getattr(wt(h), call)("agent-a", *args.get(call, ()))
    assert caught.value.code == code
    assert caught.value.details["state"] == before.state
    assert wt(h).binding("agent-a") == before
    assert await h.store.worktrees.get("agent-a") == (before if before.version else None)
    assert len(await h.events()) == events


async def test_bad_switch_arguments_name_their_field_and_change_nothing(h: EngineHarness) -> None:
    await _home(h)
    for kwargs, field in [
        ({"worktree_id": "frontend"}, "target_worktree_id"),  # the home itself
        ({"worktree_id": "../x"}, "worktree_id"),
        ({"worktree_id": "ok", "ttl_s": -1.0}, "ttl_ms"),
        ({"worktree_id": ""}, "target_worktree_id"),
    ]:
        with pytest.raises(ValidationError) as caught:
            await wt(h).request_switch("agent-a", **kwargs)
        assert caught.value.details["field"] == field
    with pytest.raises(ApiaryError) as not_found:
        await wt(h).request_switch("agent-a", "x", repo_id="nowhere")
    assert not_found.value.code == "worktree_not_found"
    await wt(h).request_switch("agent-a", "shared")
    pending = wt(h).binding("agent-a")
    with pytest.raises(ValidationError) as caught:
        await wt(h).approve_switch("agent-a", ttl_s=10**9)
    assert caught.value.details["field"] == "ttl_ms"
    with pytest.raises(ValidationError) as caught:
        await wt(h).approve_switch("agent-a", worktree_id="elsewhere")
    assert caught.value.details["field"] == "target_worktree_id"
    assert wt(h).binding("agent-a") == pending
    assert await h.engine.hitl.list()  # still waiting for its decision


# --- restart ------------------------------------------------------------------------------------


async def test_bindings_timers_and_pending_decisions_survive_a_restart(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'apiary.db'}"
    clock, ids = FakeClock(), SequentialIds()
    async with world(tmp_path, store_url=url, clock=clock, ids=ids) as h:
        await wt(h).bind("agent-a", "api", "a-home")
        await wt(h).bind("agent-b", "api", "b-home")
        pending = await wt(h).request_switch("agent-b", "shared")
        await wt(h).bind("agent-c", "api", "c-home")
        await wt(h).request_switch("agent-c", "c-away", ttl_s=30)
        await wt(h).approve_switch("agent-c", actor="olivia")
        await wt(h).bind("agent-d", "nowhere", "d-home")  # BIND_FAILED, retry in 1 s
        before = {r.agent_id: r for r in wt(h).list()}
        roots = {a: wt(h).bound_root(a) for a in before}
    async with world(tmp_path, store_url=url, clock=clock, ids=ids) as h:
        assert {r.agent_id: r for r in wt(h).list()} == before
        assert {a: wt(h).bound_root(a) for a in before} == roots
        (recovered,) = await h.events("worktree.recovered")
        assert recovered.details["bindings"] == 4
        # The pending decision is awaited again.
        await h.engine.hitl.decide(pending.invocation_id, "approve", OLIVIA, "after restart")
        assert (await settle(h, "agent-b", S.BOUND_NON_HOME)).current is not None
        # The retry and the TTL timers were re-armed.
        clock.advance(1)
        assert await wt(h).fire_due() == 1
        assert wt(h).binding("agent-d").attempts == 2
        clock.advance(29)
        await wt(h).fire_due()
        assert wt(h).binding("agent-c").state == "BOUND_HOME"


async def test_missing_worktree_directories_are_made_again_on_load(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'apiary.db'}"
    clock, ids = FakeClock(), SequentialIds()
    async with world(tmp_path, store_url=url, clock=clock, ids=ids) as h:
        await wt(h).bind("agent-a", "api", "frontend", branch="feat/front")
        await wt(h).bind("agent-b", "api", "b-home")
        await wt(h).request_switch("agent-b", "b-away")
        await wt(h).approve_switch("agent-b", actor="olivia")
    api = tmp_path / "repos" / "api"
    for gone in ("frontend", "b-away"):
        git(api, "worktree", "remove", "--force", str(root(tmp_path, gone)))
        assert not root(tmp_path, gone).exists()
    async with world(tmp_path, store_url=url, clock=clock, ids=ids) as h:
        home = wt(h).bound_root("agent-a")
        assert home is not None and (home / "README.md").read_text() == README
        assert git(home, "rev-parse", "--abbrev-ref", "HEAD") == "feat/front"
        away = wt(h).bound_root("agent-b")
        assert away is not None and away.resolve() == root(tmp_path, "b-away")
        assert git(away, "rev-parse", "--abbrev-ref", "HEAD") == "b-away"
        assert await h.events("worktree.restore_failed") == []
