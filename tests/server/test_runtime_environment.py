"""get_tool_inventory and get_execution_environment against a real coordinator (HTTP sockets,
the tool catalogue, the tool ACL): a thread's agent sees the tools its ACL lets it call,
a tool that needs a worktree is unavailable while the agent is bound to none, the
inventory's change is a `tool.catalog.resolved` event, and the environment reports the
worktree its tools run in and the sandbox they run under. Every event and answer is
validated against the contract's schemas."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from apiary.core.tools.descriptor import ToolDescriptor
from apiary.core.tools.policy import HostPort
from apiary.engine.assembly import Runtime
from apiary.engine.tools.settings import ToolSettings
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from tests.server.runtime_harness import RuntimeHttp, runtime_http, session_events
from tests.server.tool_agents import StaticWorktrees

AGENT = "writer"
SETTINGS = ToolSettings(
    acl={AGENT: frozenset({AGENT, "helper/search", "helper/deploy"})},
    allowlist=(HostPort("pypi.org", 443),),
    preapproved={"ELEVATED": frozenset({"helper/deploy"})},
)


async def _register(coordinator: Coordinator, agent_id: str, *tools: ToolDescriptor) -> None:
    await coordinator.registry.register(
        {"agent_id": agent_id, "name": agent_id, "reasoning_connectors": ["builtin://rules"]}
    )
    assert coordinator.tools is not None
    await coordinator.tools.register_agent_provider(agent_id, list(tools), agent_id)


async def _thread(coordinator: Coordinator, runtime: RuntimeHttp) -> dict[str, Any]:
    await _register(
        coordinator, AGENT,
        ToolDescriptor("write_file", input_schema='{"type": "object"}', description="Write"),
    )  # fmt: skip
    await _register(
        coordinator, "helper", ToolDescriptor("search", idempotent=True),
        ToolDescriptor("deploy", needs_worktree=True, side_effects="network"),
        ToolDescriptor("secret"),
    )  # fmt: skip
    return await runtime.ok("submit_turn", agent_id=AGENT, turn_id="t-1", input="go")


def _resolved(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "tool.catalog.resolved"]


async def test_the_inventory_is_the_catalogue_as_the_agents_acl_sees_it(tmp_path: Path) -> None:
    runtime_settings = Runtime(tools=SETTINGS)
    async with (
        open_test_coordinator(tmp_path, runtime=runtime_settings) as coordinator,
        runtime_http(coordinator) as runtime,
    ):
        turn = await _thread(coordinator, runtime)
        found = await runtime.ok("get_tool_inventory", thread_id=turn["threadId"])
        assert found["agentId"] == AGENT and found["acl"] is True and found["withheld"] == 1
        tools = {t["toolId"]: t for t in found["tools"]}
        assert sorted(tools) == ["helper/deploy", "helper/search", "writer/write_file"]
        assert tools["writer/write_file"]["inputSchema"] == {"type": "object"}
        assert tools["helper/search"]["idempotent"] is True and tools["helper/search"]["available"]
        deploy = tools["helper/deploy"]
        assert deploy["available"] is False and deploy["unavailableReason"] == "worktree_not_bound"
        assert deploy["capabilities"] == ["network", "worktree"]
        again = await runtime.ok("get_tool_inventory", thread_id=turn["threadId"])
        assert again["toolInventoryRef"] == found["toolInventoryRef"]
        events = _resolved(await session_events(coordinator, turn["sessionId"]))
        assert len(events) == 1  # written when resolved, not on every read
        assert events[0]["refs"]["toolInventoryRef"] == found["toolInventoryRef"]
        assert events[0]["payload"]["toolCount"] == 3 and events[0]["threadId"] == turn["threadId"]
        # The catalogue changes: the inventory is another, and its event says so.
        await _register(coordinator, AGENT, ToolDescriptor("write_file"), ToolDescriptor("read"))
        changed = await runtime.ok("get_tool_inventory", thread_id=turn["threadId"])
        assert changed["toolInventoryRef"] != found["toolInventoryRef"]
        assert "writer/read" in {t["toolId"] for t in changed["tools"]}
        events = _resolved(await session_events(coordinator, turn["sessionId"]))
        assert len(events) == 2 and events[1]["payload"]["toolCount"] == 4
        for params, field in (({}, "thread_id"), ({"thread_id": "nope"}, "thread_id"),
                              ({"thread_id": "x", "tool": 1}, "tool")):  # fmt: skip
            status = 404 if params.get("thread_id") == "nope" else 400
            error = await runtime.error(status, "get_tool_inventory", **params)
            assert error["details"]["field"] == field


async def test_the_environment_is_the_agents_worktree_and_its_tools_sandbox(
    tmp_path: Path,
) -> None:
    root = tmp_path / "wt"
    runtime_settings = Runtime(tools=SETTINGS, worktrees=StaticWorktrees({AGENT: root}))
    async with (
        open_test_coordinator(tmp_path, runtime=runtime_settings) as coordinator,
        runtime_http(coordinator) as runtime,
    ):
        turn = await _thread(coordinator, runtime)
        found = await runtime.ok("get_execution_environment", thread_id=turn["threadId"])
        environment = found["executionEnvironment"]
        assert environment["cwd"] == str(root) and environment["workspaceRoots"] == [str(root)]
        assert environment["scope"] == f"resource:runtime-thread/{turn['threadId']}"
        assert environment["network"] == {"defaultPolicy": "DENY_ALL",
                                          "allowlist": ["pypi.org:443"]}  # fmt: skip
        assert environment["sandbox"]["preapproved"] == {"ELEVATED": ["helper/deploy"]}
        assert environment["sandbox"]["defaultPrivilegeLevel"] == "MINIMAL"
        assert environment["processLimits"]["maxRetries"] == SETTINGS.max_retries
        assert environment["worktree"]["bound"] is True
        # Bound, its worktree tools can run.
        inventory = await runtime.ok("get_tool_inventory", thread_id=turn["threadId"])
        assert all(t["available"] for t in inventory["tools"])
        answer = await runtime.call("get_execution_environment", thread_id=turn["threadId"])
        assert answer["result"] == found
        error = await runtime.error(400, "get_execution_environment")
        assert error["details"]["field"] == "thread_id"


async def test_an_unbound_agents_environment_has_no_cwd_and_the_cli_shows_both(
    tmp_path: Path,
) -> None:
    async with open_test_coordinator(tmp_path) as coordinator, runtime_http(coordinator) as runtime:
        turn = await _thread(coordinator, runtime)
        found = await runtime.ok("get_execution_environment", thread_id=turn["threadId"])
        environment = found["executionEnvironment"]
        assert environment["cwd"] is None and environment["workspaceRoots"] == []
        assert environment["worktree"] == {"state": "UNBOUND", "bound": False}
        out = await _cli(coordinator, "tools", turn["threadId"])
        assert json.loads(out)["withheld"] == 0  # no tool ACL: every tool
        out = await _cli(coordinator, "environment", turn["threadId"])
        assert json.loads(out)["executionEnvironment"]["agentId"] == AGENT


async def _cli(coordinator: Coordinator, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "apiary.cli.main", "runtime", *args,
        "--http", str(coordinator.http_address),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, (out.decode(), err.decode())
    return out.decode()
