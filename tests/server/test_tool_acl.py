"""Tool ACLs (RFC 18.2: providers run under the invoking agent's ACLs): the coordinator refuses
a call its ACL does not grant, before anything runs, and tells agent providers who invoked."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from apiary.core.tools.descriptor import ToolDescriptor
from apiary.engine.assembly import Runtime
from apiary.engine.tools.command_tools import CommandToolSpec
from apiary.engine.tools.settings import ToolSettings
from apiary.errors import PermissionDeniedError
from apiary.sdk.tools import ToolClient
from apiary.server.config.loader import load_config
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator


def _say(provider: str, name: str, word: str) -> CommandToolSpec:
    return CommandToolSpec(
        provider, ToolDescriptor(name), (sys.executable, "-c", f"print({word!r})")
    )


ACL = {"coder": frozenset({"fs"}), "*": frozenset({"text/echo"})}


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    tools = ToolSettings(
        commands=(_say("fs", "read", "r"), _say("text", "echo", "e"), _say("text", "shout", "S")),
        acl=ACL,
    )
    async with open_test_coordinator(tmp_path, runtime=Runtime(tools=tools)) as running:
        yield running


@pytest.mark.conformance("tool.invocation.provider-acls")
async def test_calls_outside_the_acl_are_refused_before_they_run(
    coordinator: Coordinator,
) -> None:
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel:
        coder, critic = ToolClient(channel, "coder"), ToolClient(channel, "critic")
        assert (await coder.call("read")).text().strip() == "r"  # granted: provider fs
        assert (await critic.call("echo")).text().strip() == "e"  # granted to everyone
        for client, tool in ((critic, "read"), (coder, "shout"), (ToolClient(channel), "read")):
            with pytest.raises(PermissionDeniedError) as caught:
                await client.call(tool)
            assert caught.value.details["reason"] == "acl"
    started = [e for e in await coordinator.events.read(limit=10_000)
               if e.event_type == "tool.call_started"]  # fmt: skip
    assert len(started) == 2  # the refused ones never started


def test_the_acl_comes_from_the_configuration(tmp_path: Path) -> None:
    file = tmp_path / "apiary.toml"
    file.write_text('[tools.acl]\ncoder = ["fs", "time/get_current_time"]\n"*" = ["text"]\n')
    acl = load_config(file, {}, {}).tools.acl
    assert acl == {"coder": {"fs", "time/get_current_time"}, "*": {"text"}}
    file.write_text('[tools]\nacl = ["fs"]\n')
    with pytest.raises(Exception, match="acl"):
        load_config(file, {}, {})
    assert ToolSettings().permits("anyone", "fs", "read")  # no ACL: everything
