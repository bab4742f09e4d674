"""An SDK agent's worktree and tools against a real coordinator: it binds a real git worktree,
edits a file through the confined file API (escapes refused), calls a command tool that runs
in that worktree under the sandbox and a tool of a real MCP server (mcp-server-time) through
the bridge, and loses the worktree's tools once unbound (RFC 16, 18; issue 6's agent flow)."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

import apiary
from apiary.core.envelope import MessageType
from apiary.core.tools.descriptor import ToolDescriptor
from apiary.engine.assembly import Runtime
from apiary.engine.tools.command_tools import CommandToolSpec
from apiary.engine.tools.mcp_bridge import McpProvider, McpServerSpec
from apiary.engine.tools.settings import ToolSettings
from apiary.engine.worktrees.settings import RepoEntry, WorktreeSettings
from apiary.errors import ApiaryError, PermissionDeniedError
from apiary.sdk.connection import Delivery
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from tests.gitrepo import git, make_repo

LINES = CommandToolSpec(
    "files",
    ToolDescriptor("count_lines", needs_worktree=True, input_schema='{"type": "object"}'),
    (sys.executable, "-c", "import sys; print(len(open(sys.argv[1]).read().splitlines()))",
     "{path}"),
)  # fmt: skip
TIME = McpServerSpec("time", sys.executable, ("-m", "mcp_server_time"), startup_timeout_s=30)


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    repo = make_repo(tmp_path / "shop")
    runtime = Runtime(tools=ToolSettings(commands=(LINES,), mcp=(TIME,)))
    worktrees = WorktreeSettings(repos=(RepoEntry("shop", repo),))
    async with open_test_coordinator(
        tmp_path / "data", runtime=runtime, worktrees=worktrees
    ) as running:
        assert running.tools is not None
        entry = running.tools.catalog.get("time")
        assert entry is not None and isinstance(entry.provider, McpProvider)
        await entry.provider.wait_ready(30)
        yield running


@pytest.mark.conformance("worktree.tools.not-bound-error", "tool.invocation.provider-confinement")
async def test_an_agent_binds_edits_and_calls_tools_in_its_worktree(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    async with apiary.Agent("coder", coordinator=str(coordinator.grpc_address)) as coder:
        workspace = await coder.bind_worktree("shop", "coder-home", branch="fix/greeting")
        assert workspace.state == "BOUND_HOME"
        assert git(workspace.path, "rev-parse", "--abbrev-ref", "HEAD") == "fix/greeting"
        files = workspace.files
        assert files.read_text("src/app.py") == "print('hello')\n"
        files.write_text(
            "src/app.py", "def greet() -> str:\n    return 'hello'\n\n\nprint(greet())\n"
        )
        with pytest.raises(PermissionDeniedError) as escaped:
            files.write_text("../../outside.txt", "no")
        assert escaped.value.details["reason"] == "path_traversal"
        assert not (tmp_path / "outside.txt").exists()
        assert "src/app.py" in git(workspace.path, "status", "--porcelain")

        counted = await coder.tools.call("count_lines", {"path": "src/app.py"})
        assert counted.text().strip() == "5"  # the tool ran in the worktree, saw the edit
        now = await coder.tools.call("get_current_time", {"timezone": "UTC"})
        assert json.loads(now.text())["timezone"] == "UTC"

        await coder.unbind_worktree()
        assert coder.workspace is None
        with pytest.raises(ApiaryError) as unbound:
            await coder.tools.call("count_lines", {"path": "src/app.py"})
        assert unbound.value.code == "worktree_not_bound"


async def test_a_failed_bind_raises_its_reason(coordinator: Coordinator) -> None:
    async with apiary.Agent("coder", coordinator=str(coordinator.grpc_address)) as coder:
        with pytest.raises(ApiaryError) as missing:
            await coder.bind_worktree("no-such-repo", "home")
        assert missing.value.code == "worktree_not_found"
        assert coder.workspace is None


async def test_the_workspace_follows_the_coordinators_binding_notices(
    coordinator: Coordinator,
) -> None:
    async with apiary.Agent("coder", coordinator=str(coordinator.grpc_address)) as coder:
        await coder.bind_worktree("shop", "coder-home")

        def notice(producer: str, state: str) -> apiary.Message:
            env = coder.envelope(
                {"action": "status", "state": state}, message_type=MessageType.WORKTREE_CONTROL
            )
            return apiary.Message(coder, Delivery(replace(env, producer_id=producer), 1, 1, False))

        assert await coder.on_worktree_control(notice("coordinator", "BOUND_HOME"))
        assert coder.workspace is not None
        with pytest.raises(apiary.Rejected):
            await coder.on_worktree_control(notice("mallory", "UNBOUND"))
        assert coder.workspace is not None  # only the coordinator speaks for the binding
        await coder.on_worktree_control(notice("coordinator", "UNBOUND"))
        assert coder.workspace is None
