"""Calling tools through a coordinator (RFC 18): ToolService, ConnectorService and
apiary.v1.ToolProviderService behind one small client.

    async with open_channel(address) as channel:  # apiary.sdk.channel
        tools = ToolClient(channel, agent_id="alice")
        frame = await tools.call("get_current_time", {"timezone": "UTC"}, provider_id="time")
        print(frame.json())

Failures raise the ApiaryError of the protocol error code (VALIDATION_ERROR,
PERMISSION_DENIED, WALL_TIMEOUT, ...).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import grpc

from apiary.core.tools.calls import ToolFrame as ToolResult  # the SDK names a frame a result
from apiary.sdk import errors
from apiary.wire import pb

AGENT_KEY = "sw4rm-agent-id"
JSON = "application/json"
_POLICY_FIELDS = frozenset({
    "timeout_ms", "max_retries", "backoff", "worktree_required", "network_policy",
    "privilege_level", "budget_cpu_ms", "budget_wall_ms",
})  # fmt: skip


def _result(frame: pb.tool_pb2.ToolFrame) -> ToolResult:
    summary = json.loads(frame.summary) if frame.summary else {}
    return ToolResult(
        frame.call_id, frame.frame_no, frame.final, frame.content_type, bytes(frame.data),
        summary if isinstance(summary, dict) else {},
    )  # fmt: skip


def execution_policy(values: Mapping[str, Any] | None) -> pb.tool_pb2.ExecutionPolicy:
    """An ExecutionPolicy from field values (`timeout_ms` becomes the `timeout` Duration)."""
    values = dict(values or {})
    unknown = sorted(set(values) - _POLICY_FIELDS)
    if unknown:
        raise ValueError(f"unknown execution policy fields: {', '.join(unknown)}")
    timeout_ms = int(values.pop("timeout_ms", 0))
    policy = pb.tool_pb2.ExecutionPolicy(**values)
    if timeout_ms:
        policy.timeout.FromMilliseconds(timeout_ms)
    return policy


def tool_call(
    tool_name: str, args: Any = None, *, provider_id: str = "", call_id: str = "",
    policy: Mapping[str, Any] | None = None, content_type: str = "",
) -> pb.tool_pb2.ToolCall:  # fmt: skip
    """A ToolCall; `args` bytes are sent as they are, anything else as JSON."""
    data = args if isinstance(args, bytes) else json.dumps({} if args is None else args).encode()
    return pb.tool_pb2.ToolCall(
        call_id=call_id, tool_name=tool_name, provider_id=provider_id,
        content_type=content_type or (JSON if not isinstance(args, bytes) else ""),
        args=data, policy=execution_policy(policy),
    )  # fmt: skip


class ToolClient:
    """The caller's side of tool calling; `agent_id` identifies the calling agent (the
    worktree a needs_worktree tool runs in is that agent's)."""

    def __init__(self, channel: grpc.aio.Channel, agent_id: str = "", token: str = "") -> None:
        self._tools = pb.tool_pb2_grpc.ToolServiceStub(channel)
        self._connector = pb.connector_pb2_grpc.ConnectorServiceStub(channel)
        self._providers = pb.apiary_pb2_grpc.ToolProviderServiceStub(channel)
        metadata: list[tuple[str, str]] = []
        if agent_id:
            metadata.append((AGENT_KEY, agent_id))
        if token:
            metadata.append(("authorization", f"Bearer {token}"))
        self._metadata = tuple(metadata)

    async def call(self, tool_name: str, args: Any = None, **options: Any) -> ToolResult:
        """Run a tool to completion: the final frame, with all of the result's data."""
        request = tool_call(tool_name, args, **options)
        reply = await errors.call(lambda: self._tools.Call(request, metadata=self._metadata))
        return _result(reply)

    async def stream(
        self, tool_name: str, args: Any = None, **options: Any
    ) -> AsyncIterator[ToolResult]:
        """Run a tool, frame by frame; the last one is final."""
        request = tool_call(tool_name, args, **options)
        request.stream = True
        call = self._tools.CallStream(request, metadata=self._metadata)
        async for frame in errors.stream(call.__aiter__()):
            yield _result(frame)

    async def cancel(self, call_id: str) -> tuple[str, str]:
        """Cancel (RFC 18.6): (error_code, message); CANCELLED when it was initiated,
        NOT_FOUND or ALREADY_COMPLETED otherwise."""
        request = pb.tool_pb2.ToolCall(call_id=call_id)
        reply = await errors.call(lambda: self._tools.Cancel(request, metadata=self._metadata))
        return reply.error_code, reply.message

    async def describe(self, provider_id: str = "") -> list[pb.connector_pb2.ToolDescriptor]:
        request = pb.connector_pb2.DescribeToolsRequest(provider_id=provider_id)
        reply = await errors.call(lambda: self._connector.DescribeTools(request))
        return list(reply.tools)

    async def providers(self, provider_id: str = "") -> list[pb.apiary_pb2.ToolProviderInfo]:
        request = pb.apiary_pb2.ListToolProvidersRequest(provider_id=provider_id)
        reply = await errors.call(lambda: self._providers.ListProviders(request))
        return list(reply.providers)

    async def register_provider(
        self, provider_id: str, tools: Sequence[pb.connector_pb2.ToolDescriptor]
    ) -> pb.connector_pb2.ProviderRegisterResponse:
        request = pb.connector_pb2.ProviderRegisterRequest(provider_id=provider_id, tools=tools)
        return await errors.call(
            lambda: self._connector.RegisterProvider(request, metadata=self._metadata)
        )

    async def register_mcp_server(
        self, provider_id: str, command: str, args: Sequence[str] = (),
        env: Mapping[str, str] | None = None, *, startup_timeout_s: int = 0,
    ) -> pb.apiary_pb2.ToolProviderInfo:  # fmt: skip
        """Start an MCP stdio server on the coordinator (needs an operator `token`)."""
        request = pb.apiary_pb2.RegisterMcpServerRequest(
            provider_id=provider_id, command=command, args=list(args), env=dict(env or {}),
            startup_timeout_s=startup_timeout_s,
        )  # fmt: skip
        return await errors.call(
            lambda: self._providers.RegisterMcpServer(request, metadata=self._metadata)
        )

    async def remove_provider(self, provider_id: str) -> bool:
        """Remove a provider and stop what it runs (needs an operator `token`)."""
        request = pb.apiary_pb2.RemoveToolProviderRequest(provider_id=provider_id)
        reply = await errors.call(
            lambda: self._providers.RemoveProvider(request, metadata=self._metadata)
        )
        return bool(reply.removed)


__all__ = ["ToolClient", "ToolResult"]
