"""Checks of the tool store (`ToolStore`): the provider catalogue DescribeTools serves, which
must survive a restart (RFC 18.1)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import replace
from typing import Any

from apiary.core.tools.descriptor import ToolDescriptor, ToolProviderRecord
from apiary.store.errors import StoreError
from apiary.testing.store_suite.base import (
    T0,
    UNICODE,
    Check,
    CheckNotApplicable,
    StoreFactory,
    registry,
)

CHECKS: list[Check] = []
_check = registry(CHECKS)

SCHEMA = json.dumps(
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
)


def tool(name: str, **fields: Any) -> ToolDescriptor:
    return ToolDescriptor(tool_name=name, **fields)


def provider(provider_id: str, *tools: ToolDescriptor, **fields: Any) -> ToolProviderRecord:
    """An agent provider registered at T0 with the given tools."""
    values: dict[str, Any] = {
        "provider_id": provider_id,
        "kind": "agent",
        "registered_at": T0,
        "updated_at": T0,
        "tools": tools,
        "registered_by": provider_id,
    }
    values.update(fields)
    return ToolProviderRecord(**values)


FULL_TOOL = tool(
    "write_file",
    input_schema=SCHEMA,
    output_schema='{"type": "string"}',
    idempotent=True,
    needs_worktree=True,
    default_timeout_s=30,
    max_concurrency=4,
    side_effects="filesystem,process",
    description="Write a file in the caller's worktree.",
)


@_check
async def tool_providers_are_put_and_read(factory: StoreFactory) -> None:
    fs = provider("fs", FULL_TOOL, tool("read_file"), tool("stat"))
    mcp = provider(
        "time",
        tool("get_current_time"),
        kind="mcp",
        registered_by="config",
        config={"command": "mcp-server-time", "args": ["--local-timezone", "UTC"], "env": {}},
        updated_at=T0 + 1.5,
    )
    async with factory.open() as store:
        assert await store.tools.get("fs") is None
        assert await store.tools.list() == []
        await store.tools.put(mcp)
        await store.tools.put(fs)
        stored = await store.tools.get("fs")
        assert stored == fs
        assert stored is not None
        assert [t.tool_name for t in stored.tools] == ["write_file", "read_file", "stat"]
        assert stored.tools[0] == FULL_TOOL
        assert stored.tools[1] == tool("read_file")  # every optional field empty
        assert await store.tools.get("time") == mcp
        assert await store.tools.list() == [fs, mcp]  # by provider_id
        assert await store.tools.get("FS") is None
        assert await store.tools.get("") is None


@_check
async def putting_a_provider_again_replaces_all_its_tools(factory: StoreFactory) -> None:
    first = provider("fs", tool("a"), tool("b"), tool("c"))
    second = provider("fs", tool("c", idempotent=True), tool("d"), updated_at=T0 + 10)
    async with factory.open() as store:
        await store.tools.put(first)
        await store.tools.put(provider("other", tool("a")))
        await store.tools.put(second)
        assert await store.tools.get("fs") == second  # a and b are gone, c changed
        assert await store.tools.get("other") == provider("other", tool("a"))
        empty = replace(second, tools=())
        await store.tools.put(empty)
        assert await store.tools.get("fs") == empty
        assert [p.provider_id for p in await store.tools.list()] == ["fs", "other"]


@_check
async def deleting_a_provider_removes_its_tools(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await store.tools.put(provider("fs", tool("a"), tool("b")))
        await store.tools.put(provider("git", tool("a")))
        assert await store.tools.delete("fs") is True
        assert await store.tools.delete("fs") is False
        assert await store.tools.get("fs") is None
        assert await store.tools.list() == [provider("git", tool("a"))]
        # A provider put again after its deletion starts from its new tools only.
        await store.tools.put(provider("fs", tool("c")))
        assert await store.tools.get("fs") == provider("fs", tool("c"))


@_check
async def tool_records_keep_unicode_and_large_schemas(factory: StoreFactory) -> None:
    big = json.dumps(
        {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(5000)}}
    )
    record = provider(
        f"prov {UNICODE}",
        tool(f"t-{len(UNICODE)}", input_schema=big, description=UNICODE, side_effects="gpu"),
        registered_by=UNICODE,
        config={UNICODE: [UNICODE, 1, 2.5, None, True]},
    )
    async with factory.open() as store:
        await store.tools.put(record)
        assert await store.tools.get(f"prov {UNICODE}") == record
        (listed,) = await store.tools.list()
        assert listed.tools[0].input_schema == big


@_check
async def tool_records_refuse_what_sql_cannot_hold(factory: StoreFactory) -> None:
    async with factory.open() as store:
        for bad in (
            provider("p", config={"x": float("nan")}),
            provider("p", tool("t", max_concurrency=-1)),
            provider("p", tool("t", default_timeout_s=1 << 64)),
        ):
            raised = False
            try:
                await store.tools.put(bad)
            except (ValueError, StoreError):
                raised = True
            assert raised, f"{bad} was accepted"
        assert await store.tools.list() == []
        # Two tools of one provider cannot share a name.
        with contextlib.suppress(ValueError, StoreError):
            await store.tools.put(provider("dup", tool("t"), tool("t")))
        assert await store.tools.get("dup") is None


@_check
async def concurrent_tool_puts_each_land_whole(factory: StoreFactory) -> None:
    records = [
        provider(f"p{i:03}", *(tool(f"t{j}", idempotent=bool(j % 2)) for j in range(i % 7)))
        for i in range(60)
    ]
    async with factory.open() as store:
        await asyncio.gather(*(store.tools.put(r) for r in records))
        assert await store.tools.list() == records
        fetched = await asyncio.gather(*(store.tools.get(r.provider_id) for r in records))
        assert fetched == records


@_check
async def tool_providers_survive_closing_and_reopening(factory: StoreFactory) -> None:
    if not factory.durable:
        raise CheckNotApplicable(f"the {factory.backend} backend is not durable")
    fs = provider("fs", FULL_TOOL, tool("read_file"))
    async with factory.open() as store:
        await store.tools.put(fs)
        await store.tools.put(provider("gone", tool("x")))
        await store.tools.delete("gone")
    async with factory.open() as store:
        assert await store.tools.list() == [fs]
        await store.tools.put(replace(fs, tools=(tool("read_file"),), updated_at=T0 + 5))
    async with factory.open() as store:
        found = await store.tools.get("fs")
        assert found is not None
        assert found.tools == (tool("read_file"),)
        assert found.updated_at == T0 + 5
