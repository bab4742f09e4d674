"""Command tools from the configuration (`[[tools.commands]]`), run as real processes through the
launcher (the sandbox's seam), over real gRPC."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from apiary.core.tools.descriptor import ToolDescriptor
from apiary.core.tools.policy import ExecutionPolicy
from apiary.engine.assembly import Runtime
from apiary.engine.tools.command_tools import CommandToolSpec
from apiary.engine.tools.settings import ToolSettings
from apiary.errors import ApiaryError
from apiary.sdk.tools import ToolClient, ToolResult
from apiary.server.config.loader import load_config
from apiary.server.coordinator import Coordinator, open_coordinator
from apiary.server.inprocess import open_test_coordinator
from tests.server.tool_agents import StaticWorktrees

PY = sys.executable
TICK = (
    "# apiary-tick-tool\n"
    "import os, sys, time\n"
    "print(os.getpid(), flush=True)\n"
    "for i in range(int(sys.argv[1])):\n"
    "    time.sleep(float(sys.argv[2])); print(i, flush=True)\n"
)


def spec(name: str, *argv: str, **fields: object) -> CommandToolSpec:
    descriptor = ToolDescriptor(
        name,
        idempotent=bool(fields.pop("idempotent", False)),
        needs_worktree=bool(fields.pop("needs_worktree", False)),
    )
    return CommandToolSpec("sh", descriptor, (PY, "-c", *argv), **fields)  # type: ignore[arg-type]


COMMANDS = (
    spec("tick", TICK, "{n}", "{pause}", stdin="none"),
    spec("echo", "import sys; sys.stdout.write(sys.stdin.read())", content_type="application/json"),
    spec("argv", "import json, sys; print(json.dumps(sys.argv[1:]))", "{text}", "x{n}y"),
    spec("fail", "import sys; print('no such file: x.txt', file=sys.stderr); sys.exit(3)"),
    spec("pwd", "import os; print(os.getcwd())", needs_worktree=True),
    spec("slow", TICK, "1000", "0.05", stdin="none",
         policy=ExecutionPolicy(budget_wall_ms=1500)),
)  # fmt: skip


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    (tmp_path / "wt").mkdir()
    runtime = Runtime(
        tools=ToolSettings(commands=COMMANDS, cancel_grace_s=2.0),
        worktrees=StaticWorktrees({"bound": tmp_path / "wt"}),
    )
    async with open_test_coordinator(tmp_path, runtime=runtime) as running:
        yield running


@pytest.fixture
async def client(coordinator: Coordinator) -> AsyncIterator[ToolClient]:
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel:
        yield ToolClient(channel, agent_id="bound")


async def gone(pid: int) -> bool:
    """No tick tool process is left anywhere. The tool runs in the sandbox's own PID
    namespace, so the pid it prints is not a host pid: look for its command line instead."""
    del pid  # a pid inside the sandbox's PID namespace: not one to look for on the host
    for _ in range(100):
        if not _tick_processes():
            return True
        await asyncio.sleep(0.02)
    return False


def _tick_processes() -> list[str]:
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as handle:
                if b"apiary-tick-tool" in handle.read():
                    found.append(entry.name)
        except OSError:
            continue
    return found


async def test_a_command_streams_its_output_as_frames(client: ToolClient) -> None:
    frames = [f async for f in client.stream("tick", {"n": 3, "pause": 0.01})]
    text = b"".join(f.data for f in frames).decode().split()
    assert text[1:] == ["0", "1", "2"]
    assert frames[-1].final
    assert all(not f.final for f in frames[:-1])
    summary = frames[-1].summary
    assert (summary["status"], summary["exit_code"]) == ("OK", 0)
    assert summary["bytes"] == sum(len(f.data) for f in frames)
    echoed = await client.call("echo", {"x": [1, "two"]})
    assert echoed.content_type == "application/json"
    assert echoed.json() == {"x": [1, "two"]}


async def test_arguments_fill_the_command_line_one_argument_each(client: ToolClient) -> None:
    done = await client.call("argv", {"text": "a b; rm -rf / $(id)", "n": 7})
    assert done.json() == ["a b; rm -rf / $(id)", "x7y"]
    with pytest.raises(ApiaryError) as missing:
        await client.call("argv", {"n": 1})
    assert missing.value.code == "validation_error"
    assert missing.value.details["field"] == "args.text"


async def test_a_failing_command_reports_its_exit_code_and_error_output(client: ToolClient) -> None:
    with pytest.raises(ApiaryError) as caught:
        await client.call("fail")
    assert caught.value.code == "TOOL_FAILED"
    assert caught.value.details["exit_code"] == "3"
    assert "no such file: x.txt" in caught.value.message


async def _pid_then_error(stream: AsyncIterator[ToolResult]) -> tuple[int, ApiaryError]:
    pid = 0
    try:
        async for frame in stream:
            pid = pid or int(frame.text().split()[0])
    except ApiaryError as exc:
        return pid, exc
    raise AssertionError("the stream ended without an error")


async def test_the_wall_budget_stops_the_command(client: ToolClient) -> None:
    pid, error = await _pid_then_error(client.stream("slow"))
    assert error.code == "WALL_TIMEOUT"
    assert await gone(pid)
    # A call's own budget overrides the tool's default.
    pid, error = await _pid_then_error(
        client.stream("tick", {"n": 1000, "pause": 0.05}, policy={"budget_wall_ms": 1000})
    )
    assert error.code == "WALL_TIMEOUT"
    assert await gone(pid)


@pytest.mark.conformance("tool.cancel.cleanup")
async def test_cancel_stops_the_process_and_ends_the_stream(client: ToolClient) -> None:
    frames: list[ToolResult] = []
    started = asyncio.Event()

    async def read() -> None:
        async for frame in client.stream("tick", {"n": 1000, "pause": 0.02}, call_id="k-1"):
            frames.append(frame)
            if len(frames) >= 3:
                started.set()

    reader = asyncio.create_task(read())
    await asyncio.wait_for(started.wait(), 10)
    pid = int(frames[0].text().split()[0])
    assert (await client.cancel("k-1"))[0] == "CANCELLED"
    await asyncio.wait_for(reader, 10)
    final = frames[-1]
    assert final.final
    assert final.summary["status"] == "CANCELLED"
    assert final.summary["partial_result"] is True
    assert await gone(pid)


async def test_worktree_commands_run_in_the_callers_worktree(
    client: ToolClient, coordinator: Coordinator, tmp_path: Path
) -> None:
    done = await client.call("pwd")
    assert done.text().strip() == str(tmp_path / "wt")
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel:
        with pytest.raises(ApiaryError) as caught:
            await ToolClient(channel, agent_id="unbound").call("pwd")
    assert caught.value.code == "worktree_not_bound"


async def test_command_tools_come_from_the_configuration_file(tmp_path: Path) -> None:
    config_file = tmp_path / "apiary.toml"
    config_file.write_text(f"""
[tools]
max_retries = 2

[tools.preapproved]
ELEVATED = ["text"]

[[tools.commands]]
provider = "text"
name = "upper"
argv = [{json.dumps(PY)}, "-c", "import sys; print(sys.argv[1].upper())", "{{word}}"]
idempotent = true
side_effects = "none"
description = "Shout a word."
[tools.commands.input_schema]
type = "object"
required = ["word"]
properties = {{ word = {{ type = "string" }} }}
[tools.commands.policy]
budget_wall_ms = 5000
privilege_level = "ELEVATED"
""")
    flags = {"grpc": "127.0.0.1:0", "http": "127.0.0.1:0", "store": "memory://",
             "data_dir": str(tmp_path)}  # fmt: skip
    config = load_config(config_file, {}, flags)
    async with (
        open_coordinator(config) as running,
        grpc.aio.insecure_channel(str(running.grpc_address)) as channel,
    ):
        client = ToolClient(channel)
        (provider,) = await client.providers()
        assert (provider.provider_id, provider.kind, provider.registered_by) == (
            "text", "command", "config",
        )  # fmt: skip
        (info,) = provider.tools
        assert info.description == "Shout a word."
        assert json.loads(info.descriptor.input_schema)["required"] == ["word"]
        shout = await client.call("upper", {"word": "bees"})
        with pytest.raises(ApiaryError) as caught:
            await client.call("upper", {"word": 7})
    assert shout.text() == "BEES\n"
    assert caught.value.details == {"field": "args", "path": "$.word"}
