"""`apiary tool providers|list|describe|call` against a running coordinator.

The commands run in this process (typer's runner, on a thread of their own, since each one
runs its own event loop): a Python process per command would cost a second or more each, and
the `apiary` executable's entry point is the same for every command (tests/e2e runs it)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from apiary.cli.main import app
from apiary.core.tools.descriptor import ToolDescriptor
from apiary.engine.assembly import Runtime
from apiary.engine.tools.command_tools import CommandToolSpec
from apiary.engine.tools.settings import ToolSettings
from apiary.sdk.tool_provider import Tool, ToolCallContext
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from tests.server.tool_agents import tool_agent

UPPER = CommandToolSpec(
    "text",
    ToolDescriptor("upper", input_schema='{"type": "object", "required": ["word"]}',
                   idempotent=True, side_effects="none", description="Shout a word."),
    (sys.executable, "-c", "import sys; print(sys.argv[1].upper())", "{word}"),
)  # fmt: skip


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    runtime = Runtime(tools=ToolSettings(commands=(UPPER,)))
    async with open_test_coordinator(tmp_path, runtime=runtime) as running:
        yield running


async def cli(*args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, app, ["tool", *args])


async def count(call: ToolCallContext) -> AsyncIterator[Any]:
    for i in range(call.args["n"]):
        yield f"line {i}\n"


async def test_listing_and_calling_tools_from_the_cli(coordinator: Coordinator) -> None:
    address = str(coordinator.grpc_address)
    async with tool_agent(address, "lines", [Tool("count", count, side_effects="process")]):
        listing = await cli("list", "--json", "--grpc", address)
        providers = await cli("providers", "--grpc", address)
        described = await cli("describe", "upper", "--grpc", address)
        called = await cli("call", "upper", '{"word": "bees"}', "--grpc", address)
        streamed = await cli("call", "count", '{"n": 3}', "--stream", "--json", "--grpc", address)
        failed = await cli("call", "upper", "{}", "--grpc", address)
    for done in (listing, providers, described, called, streamed):
        assert done.exit_code == 0, done.output
    assert "lines" in providers.stdout
    assert "command" in providers.stdout
    assert json.loads(described.stdout)["input_schema"] == {"type": "object", "required": ["word"]}
    tools = {d["tool_name"]: d for d in map(json.loads, listing.stdout.splitlines())}
    assert {d["provider_id"] for d in tools.values()} == {"lines", "text"}
    assert tools["count"]["capabilities"] == ["process"]
    assert (tools["upper"]["description"], tools["upper"]["idempotent"]) == ("Shout a word.", True)
    assert called.stdout == "BEES\n"
    assert json.loads(called.stderr)["status"] == "OK"
    frames = [json.loads(line) for line in streamed.stdout.splitlines()]
    assert [f["data"] for f in frames] == ["line 0\n", "line 1\n", "line 2\n", ""]
    assert frames[-1]["final"] and frames[-1]["summary"]["frames"] == 4
    assert failed.exit_code == 1
    assert "apiary tool: validation_error: args: $: 'word' is a required property" in failed.stderr
