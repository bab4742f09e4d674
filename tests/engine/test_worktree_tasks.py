"""Task eligibility and worktrees (RFC 16.3): a task scoped `worktree:required` goes only to an
agent with a bound worktree; BIND_FAILED counts as unbound; a successful BIND releases it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apiary.core.scope_overlap import parse_scope
from apiary.core.worktrees.records import BindingState as S
from apiary.engine.scheduler.scheduler import Submission
from apiary.errors import ValidationError
from tests.engine.test_worktrees import settle, world, wt

SCOPE = "repo:api path:src/** worktree:required"


@pytest.mark.conformance(
    "worktree.bind-failed.no-worktree-tasks", "worktree.bind-failed.treat-as-unbound"
)
async def test_a_worktree_task_waits_until_its_agent_is_bound(tmp_path: Path) -> None:
    async with world(tmp_path) as h:
        scheduler = h.engine.scheduler
        await h.register("agent-a")
        await scheduler.agent_ready("agent-a")
        await wt(h).bind("agent-a", "nowhere", "home")  # no such repository
        await settle(h, "agent-a", S.BIND_FAILED)
        params = json.dumps({"task": "fix"}).encode()
        result = await scheduler.submit(Submission("agent-a", "t-fix", None, params, scope=SCOPE))
        assert result.accepted
        held = await scheduler.find("t-fix")
        assert held.state == "QUEUED"  # BIND_FAILED is treated like UNBOUND
        assert "bind a worktree" in held.note
        (waiting,) = await h.events("task.waiting_worktree")
        assert waiting.details["task_id"] == "t-fix"
        # A task that needs no worktree is not held.
        await h.register("agent-b")
        await scheduler.agent_ready("agent-b")
        await scheduler.submit(
            Submission("agent-b", "t-read", None, params, scope="repo:api path:docs/**")
        )
        assert (await scheduler.find("t-read")).state == "DISPATCHED"
        # UNBIND clears the failure, a good BIND releases the held task.
        await wt(h).unbind("agent-a")
        await wt(h).bind("agent-a", "api", "home")
        await settle(h, "agent-a", S.BOUND_HOME)
        await scheduler.fire_due()  # the binding's change woke the agent's queue
        assert (await scheduler.find("t-fix")).state == "DISPATCHED"


def test_worktree_required_is_a_scope_term() -> None:
    assert parse_scope(SCOPE).needs_worktree
    assert parse_scope('{"paths": ["src/**"], "worktree": "required"}').needs_worktree
    assert not parse_scope("repo:api").needs_worktree
    assert parse_scope(SCOPE).text() == "repo:api path:src/** worktree:required"
    with pytest.raises(ValidationError) as caught:
        parse_scope("worktree:maybe")
    assert caught.value.details["field"] == "scope"
