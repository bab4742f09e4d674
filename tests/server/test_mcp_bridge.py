"""The MCP bridge end to end, against the real mcp-server-time (an MCP stdio server) started
by the coordinator through the official MCP SDK."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from apiary.engine.assembly import Runtime
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.engine.tools.mcp_bridge import McpProvider, McpServerSpec
from apiary.engine.tools.settings import ToolSettings
from apiary.errors import ApiaryError
from apiary.sdk.tools import ToolClient
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator

SERVER = (sys.executable, "-m", "mcp_server_time")
TIME = McpServerSpec("time", SERVER[0], SERVER[1:], startup_timeout_s=30)
TOKEN = "operator-token"
WAIT_S = 30


def _runtime(*servers: McpServerSpec) -> Runtime:
    return Runtime(
        hitl=HitlSettings(operators=(OperatorEntry("olivia", token_digest(TOKEN), ("admin",)),)),
        tools=ToolSettings(mcp=servers, mcp_health_interval_s=0.2),
    )


def provider(coordinator: Coordinator, provider_id: str) -> McpProvider:
    assert coordinator.tools is not None
    entry = coordinator.tools.catalog.get(provider_id)
    assert entry is not None
    assert isinstance(entry.provider, McpProvider)
    return entry.provider


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path, runtime=_runtime(TIME)) as running:
        await provider(running, "time").wait_ready(WAIT_S)
        yield running


@pytest.fixture
async def client(coordinator: Coordinator) -> AsyncIterator[ToolClient]:
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel:
        yield ToolClient(channel)


def server_pids() -> list[int]:
    """This process's children running mcp_server_time."""
    children: list[int] = []
    for task in os.listdir("/proc/self/task"):
        try:
            children += [
                int(p) for p in Path(f"/proc/self/task/{task}/children").read_text().split()
            ]
        except OSError:
            continue
    found = []
    for pid in children:
        try:
            if b"mcp_server_time" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.conformance(
    "tool.discovery.mcp-manifest", "tool.descriptors.mcp-like", "tool.descriptors.conformance"
)
async def test_the_servers_manifest_becomes_descriptors(client: ToolClient) -> None:
    described = {t.tool_name: t for t in await client.describe()}
    assert set(described) == {"get_current_time", "convert_time"}
    now = described["get_current_time"]
    schema = json.loads(now.input_schema)
    assert schema["required"] == ["timezone"]
    assert schema["properties"]["timezone"]["type"] == "string"
    assert json.loads(now.output_schema)["required"] == ["timezone", "datetime", "day_of_week",
                                                         "is_dst"]  # fmt: skip
    # readOnlyHint / idempotentHint: safe to retry, no side effects.
    assert (now.idempotent, now.side_effects) == (True, "none")
    (info,) = await client.providers("time")
    assert (info.kind, info.state, info.registered_by) == ("mcp", "READY", "config")
    assert "mcp_server_time" in info.detail
    assert info.tools[0].description.startswith("Get current time")


async def test_calling_get_current_time(client: ToolClient) -> None:
    frame = await client.call("get_current_time", {"timezone": "UTC"}, provider_id="time")
    assert frame.final
    assert frame.content_type == "application/json"
    result = frame.json()
    assert result["timezone"] == "UTC"
    assert result["datetime"].endswith("+00:00")
    converted = [f async for f in client.stream(
        "convert_time", {"source_timezone": "UTC", "time": "12:00",
                         "target_timezone": "Asia/Tokyo"},
    )]  # fmt: skip
    (final,) = converted
    assert final.json()["target"]["datetime"].endswith("21:00:00+09:00")


SLOW_TIME = McpServerSpec(
    "time", sys.executable,
    ("-c", "import runpy, sys, time; time.sleep(1.5); sys.argv = ['mcp_server_time'];"
           " runpy.run_module('mcp_server_time', run_name='__main__')"),
    startup_timeout_s=30,
)  # fmt: skip
"""mcp-server-time, slow to start: it lists its tools 1.5 s after its start at the earliest."""


async def test_a_call_made_while_its_server_starts_waits_for_its_tools(tmp_path: Path) -> None:
    """A call right after the coordinator's start, before the server first listed its tools,
    waits for them instead of being refused not_found for a tool the server offers."""
    async with (
        open_test_coordinator(tmp_path, runtime=_runtime(SLOW_TIME)) as running,
        grpc.aio.insecure_channel(str(running.grpc_address)) as channel,
    ):
        assert provider(running, "time").state == "STARTING"
        frame = await asyncio.wait_for(
            ToolClient(channel).call("get_current_time", {"timezone": "UTC"}, provider_id="time"),
            WAIT_S,
        )
        assert frame.final and frame.json()["timezone"] == "UTC"


async def test_a_call_waits_no_longer_than_its_servers_startup_timeout(tmp_path: Path) -> None:
    """A server that lists nothing within its startup_timeout_s: the call is refused
    unavailable, naming the server, not left waiting and not answered not_found."""
    never_up = McpServerSpec(
        "time", sys.executable, ("-c", "import time; time.sleep(60)"), startup_timeout_s=1
    )
    async with (
        open_test_coordinator(tmp_path, runtime=_runtime(never_up)) as running,
        grpc.aio.insecure_channel(str(running.grpc_address)) as channel,
    ):
        with pytest.raises(ApiaryError) as refused:
            await asyncio.wait_for(
                ToolClient(channel).call("get_current_time", {}, provider_id="time"), WAIT_S
            )
    assert refused.value.code == "unavailable", refused.value
    assert "MCP server 'time'" in refused.value.message


async def test_bad_arguments_give_clear_errors(client: ToolClient) -> None:
    with pytest.raises(ApiaryError) as missing:
        await client.call("get_current_time", {})
    with pytest.raises(ApiaryError) as wrong_type:
        await client.call("get_current_time", {"timezone": 5})
    with pytest.raises(ApiaryError) as unknown_zone:
        await client.call("get_current_time", {"timezone": "Nowhere/Atlantis"})
    assert missing.value.code == "validation_error"
    assert missing.value.details == {"field": "args", "path": "$"}
    assert "'timezone' is a required property" in missing.value.message
    assert wrong_type.value.details == {"field": "args", "path": "$.timezone"}
    assert unknown_zone.value.code == "TOOL_FAILED"
    assert "Invalid timezone" in unknown_zone.value.message
    assert "Nowhere/Atlantis" in unknown_zone.value.message


async def test_a_server_that_dies_is_started_again(
    coordinator: Coordinator, client: ToolClient
) -> None:
    bridge = provider(coordinator, "time")
    (pid,) = server_pids()
    os.kill(pid, signal.SIGKILL)
    for _ in range(WAIT_S * 100):
        if bridge.starts >= 2 and bridge.state == "READY":
            break
        await asyncio.sleep(0.01)
    assert (bridge.starts, bridge.state) == (2, "READY")
    (restarted,) = server_pids()
    assert restarted != pid
    frame = await client.call("get_current_time", {"timezone": "Europe/Paris"})
    assert frame.json()["timezone"] == "Europe/Paris"
    found = await coordinator.events.read(limit=10_000)
    assert "tool.mcp_restarting" in [e.event_type for e in found]


async def test_servers_registered_at_runtime_need_an_operator_and_come_back(
    tmp_path: Path,
) -> None:
    async with (
        open_test_coordinator(tmp_path, store="", runtime=_runtime()) as first,
        grpc.aio.insecure_channel(str(first.grpc_address)) as channel,
    ):
        with pytest.raises(ApiaryError) as anonymous:
            await ToolClient(channel).register_mcp_server("clock", SERVER[0], SERVER[1:])
        operator = ToolClient(channel, token=TOKEN)
        info = await operator.register_mcp_server("clock", SERVER[0], SERVER[1:],
                                                  startup_timeout_s=WAIT_S)  # fmt: skip
        assert (info.kind, info.state, info.registered_by) == ("mcp", "READY", "olivia")
        assert sorted(t.descriptor.tool_name for t in info.tools) == [
            "convert_time", "get_current_time",
        ]  # fmt: skip
        (pid,) = server_pids()
    assert anonymous.value.code == "unauthenticated"
    assert not alive(pid)  # the coordinator stopped it on its way out
    async with open_test_coordinator(tmp_path, store="", runtime=_runtime()) as second:
        await provider(second, "clock").wait_ready(WAIT_S)
        async with grpc.aio.insecure_channel(str(second.grpc_address)) as channel:
            frame = await ToolClient(channel).call("get_current_time", {"timezone": "UTC"})
            assert frame.json()["timezone"] == "UTC"
            (pid,) = server_pids()
            assert await ToolClient(channel, token=TOKEN).remove_provider("clock")
            assert await ToolClient(channel).providers() == []
            assert not alive(pid)


async def test_a_server_that_cannot_start_is_refused_with_the_reason(tmp_path: Path) -> None:
    async with (
        open_test_coordinator(tmp_path, runtime=_runtime()) as running,
        grpc.aio.insecure_channel(str(running.grpc_address)) as channel,
    ):
        operator = ToolClient(channel, token=TOKEN)
        with pytest.raises(ApiaryError) as caught:
            await operator.register_mcp_server("nope", str(tmp_path / "no-such-server"),
                                               startup_timeout_s=1)  # fmt: skip
        assert await ToolClient(channel).providers() == []
    assert caught.value.code == "unavailable"
    assert "no-such-server" in caught.value.message
