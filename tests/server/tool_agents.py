"""Test agents that provide tools over real gRPC: an SDK ToolHost, and a raw agent whose every
answer the test scripts (for exact cancellation sequences)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc

from apiary.core.envelope import AckStage, Envelope, MessageType
from apiary.sdk.agent import Agent
from apiary.sdk.tool_provider import Tool, ToolHost

TOOLS = "tools"
WAIT_S = 10.0


@contextlib.asynccontextmanager
async def tool_agent(address: str, agent_id: str, tools: Sequence[Tool]) -> AsyncIterator[Agent]:
    """An agent serving `tools` through the SDK's ToolHost until the block ends."""
    async with Agent(agent_id, coordinator=address) as agent:
        host = ToolHost(agent, tools)
        await host.register()
        serving = asyncio.create_task(host.serve())
        try:
            yield agent
        finally:
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await serving


class RawProvider:
    """An agent whose TOOL_CALL envelopes land in a queue; the test answers them itself."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.calls: asyncio.Queue[tuple[Envelope, dict[str, Any]]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def start(self, tools: Sequence[Tool]) -> None:
        await ToolHost(self.agent, tools).register()
        self._task = asyncio.create_task(self._receive())

    async def _receive(self) -> None:
        async for env in self.agent.messages():
            if env.message_type is MessageType.TOOL_CALL:
                await self.agent.ack(env, AckStage.READ)
                await self.calls.put((env, json.loads(env.payload)))

    async def next_call(self) -> tuple[Envelope, dict[str, Any]]:
        return await asyncio.wait_for(self.calls.get(), WAIT_S)

    async def result(self, call: Envelope, body: dict[str, Any]) -> None:
        doc = {"call_id": json.loads(call.payload)["call_id"], "status": "OK", **body}
        env = self.agent.envelope(
            doc, message_type=MessageType.TOOL_RESULT, correlation_id=call.correlation_id
        )
        await self.agent.send_envelope(env, to=TOOLS)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await self._task


@contextlib.asynccontextmanager
async def raw_provider(
    address: str, agent_id: str, tools: Sequence[Tool]
) -> AsyncIterator[RawProvider]:
    async with Agent(agent_id, coordinator=address) as agent:
        provider = RawProvider(agent)
        await provider.start(tools)
        try:
            yield provider
        finally:
            await provider.stop()


async def never(call: object) -> None:
    """A handler for tools a RawProvider answers by hand (never called)."""
    raise AssertionError("a raw provider's tools are answered by the test")


class StaticWorktrees:
    """Stands in for the engine's worktree manager (another branch delivers it): the
    WorktreeBindings protocol over a fixed agent -> root mapping."""

    def __init__(self, roots: dict[str, Path]) -> None:
        self.roots = roots

    def bound_root(self, agent_id: str) -> Path | None:
        return self.roots.get(agent_id)
