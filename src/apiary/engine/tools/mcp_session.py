"""One live MCP stdio session, over the official MCP SDK: everything that touches the SDK.

`open_session` spawns the server with the SDK's stdio client, initializes the session and
yields an `McpSession`, whose methods speak Apiary's vocabulary: descriptors, frames and
ApiaryErrors (a closed connection is `unavailable`, an `isError` result TOOL_FAILED).
`engine/tools/mcp_bridge.py` imports this module only when it starts a server: the SDK takes about
half a second to import, which commands that run no MCP server (the CLI) should not pay.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import mcp_types
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from apiary.core.tools.descriptor import ToolDescriptor, validate_tool
from apiary.core.tools.schema import JSON
from apiary.engine.tools.providers import Frame
from apiary.errors import ToolFailedError, UnavailableError, ValidationError

log = logging.getLogger("apiary.tools")


def mcp_descriptor(tool: mcp_types.Tool) -> ToolDescriptor:
    """The descriptor of an MCP tool (docs/tools.md); ValidationError for bad schemas."""
    hints = tool.annotations
    read_only = bool(hints and hints.read_only_hint)
    effects = ["none"] if read_only else []
    if hints and hints.open_world_hint:
        effects = ["network"]
    return validate_tool(
        ToolDescriptor(
            tool_name=tool.name,
            input_schema=json.dumps(tool.input_schema) if tool.input_schema else "",
            output_schema=json.dumps(tool.output_schema) if tool.output_schema else "",
            idempotent=read_only or bool(hints and hints.idempotent_hint),
            side_effects=",".join(effects),
            description=tool.description or "",
        )
    )


def result_frame(result: mcp_types.CallToolResult) -> Frame:
    """The final frame of a successful `tools/call` result: `structuredContent` as JSON,
    otherwise the text, otherwise the content blocks as JSON."""
    if result.structured_content is not None:
        return Frame(json.dumps(result.structured_content).encode(), JSON, final=True)
    blocks = result.content
    if all(isinstance(b, mcp_types.TextContent) for b in blocks):
        text = "\n".join(b.text for b in blocks if isinstance(b, mcp_types.TextContent))
        return Frame(text.encode(), "text/plain", final=True)
    dumped = [b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in blocks]
    return Frame(json.dumps({"content": dumped}).encode(), JSON, final=True)


def _error_text(result: mcp_types.CallToolResult) -> str:
    texts = [b.text for b in result.content if isinstance(b, mcp_types.TextContent)]
    return "\n".join(texts) or "the MCP server reported an error"


class McpSession:
    def __init__(self, provider_id: str, session: ClientSession) -> None:
        self._provider_id = provider_id
        self._session = session

    async def list_tools(self) -> tuple[ToolDescriptor, ...]:
        """The server's tools (every page); tools with unusable schemas are skipped."""
        found: list[ToolDescriptor] = []
        cursor: str | None = None
        while True:
            params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
            listing = await self._session.list_tools(params=params)
            for tool in listing.tools:
                try:
                    found.append(mcp_descriptor(tool))
                except ValidationError as exc:
                    log.warning("MCP server %s: skipping tool %r: %s",
                                self._provider_id, tool.name, exc.message)  # fmt: skip
            cursor = listing.next_cursor
            if not cursor:
                return tuple(found)

    async def ping(self) -> None:
        """UnavailableError when the server no longer answers."""
        try:
            await self._session.send_ping()
        except MCPError as exc:
            raise UnavailableError(f"the server stopped answering: {exc}") from None

    async def call(self, tool_name: str, arguments: dict[str, Any]) -> Frame:
        """One `tools/call`, as the final frame of its result."""
        try:
            result = await self._session.call_tool(tool_name, arguments)
        except MCPError as exc:
            if "closed" in str(exc).lower():
                raise UnavailableError(
                    f"MCP server {self._provider_id!r} went away during the call: {exc}",
                    {"provider_id": self._provider_id, "connection": "closed"},
                ) from None
            raise ToolFailedError(f"MCP error {exc}", {"provider_id": self._provider_id}) from None
        if result.is_error:
            raise ToolFailedError(_error_text(result), {"provider_id": self._provider_id})
        return result_frame(result)


@asynccontextmanager
async def open_session(
    provider_id: str, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None,
    errlog: TextIO, startup_timeout_s: float,
) -> AsyncIterator[McpSession]:  # fmt: skip
    """Spawn the server and initialize the session (within `startup_timeout_s`); leaving
    stops the server (stdin closed, then SIGTERM, then SIGKILL, by the SDK). Enter and leave
    in the same task: the SDK's scopes are anyio's."""
    params = StdioServerParameters(
        command=argv[0], args=list(argv[1:]), env=dict(env) or None, cwd=cwd
    )
    async with (
        stdio_client(params, errlog=errlog) as (read, write),
        ClientSession(read, write) as session,
    ):
        async with asyncio.timeout(startup_timeout_s):
            await session.initialize()
        yield McpSession(provider_id, session)
