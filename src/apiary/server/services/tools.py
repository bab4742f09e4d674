"""sw4rm.tool.ToolService, sw4rm.connector.ConnectorService and apiary.v1.ToolProviderService:
thin adapters over engine/tools/service.py.

The caller's agent identity is the `sw4rm-agent-id` request metadata (as for HITL): the agent
a needs_worktree tool runs for, and the only provider id an agent may register as.
Call is unary (the final frame, with every frame's data); CallStream streams (the request's
`stream` flag is the RPC's). A cancelled unary Call answers CANCELLED.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from apiary.core.json_reader import check_nesting
from apiary.core.limits import Limits
from apiary.core.tools.calls import ToolFrame
from apiary.core.tools.policy import ExecutionPolicy
from apiary.core.tools.requests import effective_policy
from apiary.core.tools.schema import JSON, is_json
from apiary.engine.tools.catalog import ProviderEntry
from apiary.engine.tools.mcp_bridge import McpProvider, McpServerSpec
from apiary.engine.tools.service import CallRequest, ToolService
from apiary.errors import CallCancelledError, InternalError, NotFoundError, ValidationError
from apiary.server.context import CallContext
from apiary.server.services.request_checks import (
    DEFAULT_CHECKS,
    RequestChecks,
    checked,
    checks_inside,
)
from apiary.wire import pb
from apiary.wire.tools import (
    descriptor_from_proto,
    descriptor_to_proto,
    frame_to_proto,
    provider_info,
    requested_policy,
)

tool_pb2 = pb.tool_pb2
connector = pb.connector_pb2
apiary_pb2 = pb.apiary_pb2


def _request(
    req: tool_pb2.ToolCall, ctx: CallContext, limits: Limits, *, stream: bool
) -> CallRequest:
    if req.args and is_json(req.content_type or JSON):
        check_nesting(req.args, "args", limits.json_depth)
    return CallRequest(
        tool_name=req.tool_name, provider_id=req.provider_id, call_id=req.call_id,
        args=bytes(req.args), content_type=req.content_type,
        policy=requested_policy(req.policy), stream=stream, caller=ctx.agent_id(),
    )  # fmt: skip


def _proto(frame: ToolFrame) -> tool_pb2.ToolFrame:
    return frame_to_proto(frame.call_id, frame.frame_no, frame.final, frame.content_type,
                          frame.data, frame.summary)  # fmt: skip


@checked
class ToolHandler:
    def __init__(self, tools: ToolService, checks: RequestChecks = DEFAULT_CHECKS) -> None:
        self._tools = tools
        self._checks = checks

    async def call(self, req: tool_pb2.ToolCall, ctx: CallContext) -> tool_pb2.ToolFrame:
        final: ToolFrame | None = None
        request = _request(req, ctx, self._checks.limits, stream=False)
        async with contextlib.aclosing(self._tools.call(request)) as it:
            async for frame in it:
                final = frame
        if final is None:  # pragma: no cover - the service always ends with a final frame
            raise InternalError("the call ended without a final frame")
        if final.cancelled:
            raise CallCancelledError(
                f"tool call {final.call_id} was cancelled", {"call_id": final.call_id}
            )
        return _proto(final)

    async def call_stream(
        self, req: tool_pb2.ToolCall, ctx: CallContext
    ) -> AsyncIterator[tool_pb2.ToolFrame]:
        request = _request(req, ctx, self._checks.limits, stream=True)
        async with contextlib.aclosing(self._tools.call(request)) as it:
            async for frame in it:
                yield _proto(frame)

    async def cancel(self, req: tool_pb2.ToolCall, ctx: CallContext) -> tool_pb2.ToolError:
        answer = await self._tools.cancel(req.call_id, ctx.agent_id())
        return tool_pb2.ToolError(
            call_id=answer.call_id, error_code=answer.error_code, message=answer.message
        )


@checked
class ConnectorHandler:
    def __init__(self, tools: ToolService, checks: RequestChecks = DEFAULT_CHECKS) -> None:
        self._tools = tools
        self._checks = checks

    @checks_inside
    async def register_provider(
        self, req: connector.ProviderRegisterRequest, ctx: CallContext
    ) -> connector.ProviderRegisterResponse:
        try:
            self._checks.check_metadata(ctx)
            self._checks.check(req)
            depth = self._checks.limits.json_depth
            for index, tool in enumerate(req.tools):
                check_nesting(tool.input_schema, f"tools[{index}].input_schema", depth)
                check_nesting(tool.output_schema, f"tools[{index}].output_schema", depth)
            tools = [descriptor_from_proto(t) for t in req.tools]
            record = await self._tools.register_agent_provider(
                req.provider_id, tools, ctx.agent_id()
            )
        except ValidationError as exc:
            # The canonical reply carries refusals: ok=false with the reason, which names
            # the tool and the field.
            return connector.ProviderRegisterResponse(ok=False, reason=exc.message)
        return connector.ProviderRegisterResponse(
            ok=True, reason=f"registered {len(record.tools)} tool(s) for {record.provider_id}"
        )

    async def describe_tools(
        self, req: connector.DescribeToolsRequest, ctx: CallContext
    ) -> connector.DescribeToolsResponse:
        entries = _entries(self._tools, req.provider_id)
        return connector.DescribeToolsResponse(
            tools=[descriptor_to_proto(t) for e in entries for t in e.record.tools]
        )


def _entries(tools: ToolService, provider_id: str) -> list[ProviderEntry]:
    if not provider_id:
        return tools.catalog.entries()
    entry = tools.catalog.get(provider_id)
    if entry is None:
        raise NotFoundError(f"no tool provider {provider_id!r}", {"provider_id": provider_id})
    return [entry]


def _info(entry: ProviderEntry) -> apiary_pb2.ToolProviderInfo:
    provider = entry.provider
    detail = provider.detail if isinstance(provider, McpProvider) else ""
    return provider_info(entry.record, provider.state, detail)


@checked
class ToolProviderHandler:
    """Listing for everyone; starting and removing providers for operators only (an MCP
    server is a process on the coordinator's host)."""

    def __init__(self, tools: ToolService, checks: RequestChecks = DEFAULT_CHECKS) -> None:
        self._tools = tools
        self._checks = checks

    async def list_providers(
        self, req: apiary_pb2.ListToolProvidersRequest, ctx: CallContext
    ) -> apiary_pb2.ListToolProvidersResponse:
        entries = _entries(self._tools, req.provider_id)
        return apiary_pb2.ListToolProvidersResponse(providers=[_info(e) for e in entries])

    async def register_mcp_server(
        self, req: apiary_pb2.RegisterMcpServerRequest, ctx: CallContext
    ) -> apiary_pb2.ToolProviderInfo:
        operator = ctx.operator()
        policy = effective_policy(requested_policy(req.policy), ExecutionPolicy())
        spec = McpServerSpec(
            provider_id=req.provider_id, command=req.command, args=tuple(req.args),
            env=dict(req.env), policy=policy,
            startup_timeout_s=float(req.startup_timeout_s or 30), source="runtime",
        )  # fmt: skip
        return _info(await self._tools.register_mcp_server(spec, operator.name))

    async def remove_provider(
        self, req: apiary_pb2.RemoveToolProviderRequest, ctx: CallContext
    ) -> apiary_pb2.RemoveToolProviderResponse:
        removed = await self._tools.remove_provider(req.provider_id)
        return apiary_pb2.RemoveToolProviderResponse(removed=removed)
