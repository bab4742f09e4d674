"""`apiary tool providers|list|describe|call`: the tools of a running coordinator (RFC 18)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import typer
from rich.table import Table

from apiary.cli.calls import COORDINATOR, credentials_of, refusal
from apiary.cli.output import console_for_output, utc_text
from apiary.errors import ApiaryError
from apiary.sdk.channel import open_channel
from apiary.sdk.tools import ToolClient, ToolResult
from apiary.wire import pb

app = typer.Typer(no_args_is_help=True)  # help: cli/main.py SUBCOMMANDS
T = TypeVar("T")
PROVIDER = typer.Option("", "--provider", "-p", help="Provider id")
AS_JSON = typer.Option(False, "--json", help="JSON lines instead of a table")


def _run(address: str, work: Callable[[ToolClient], Awaitable[T]], agent_id: str = "") -> T:
    async def go() -> T:
        async with open_channel(address, credentials=credentials_of(address)) as channel:
            return await work(ToolClient(channel, agent_id=agent_id))

    try:
        return asyncio.run(go())
    except ApiaryError as exc:
        typer.echo(refusal("tool", exc, with_field=False, address=address), err=True)
        raise typer.Exit(1) from None


def _tool_doc(info: pb.apiary_pb2.ToolInfo) -> dict[str, Any]:
    d = info.descriptor
    return {
        "provider_id": info.provider_id, "tool_name": d.tool_name,
        "description": info.description, "idempotent": d.idempotent,
        "needs_worktree": d.needs_worktree, "default_timeout_s": d.default_timeout_s,
        "max_concurrency": d.max_concurrency, "side_effects": d.side_effects,
        "capabilities": list(info.capabilities),
        "input_schema": json.loads(d.input_schema) if d.input_schema else None,
        "output_schema": json.loads(d.output_schema) if d.output_schema else None,
    }  # fmt: skip


def _tools(address: str, provider: str) -> list[pb.apiary_pb2.ToolInfo]:
    providers = _run(address, lambda c: c.providers(provider))
    return [t for p in providers for t in p.tools]


@app.command()
def providers(grpc_address: str = COORDINATOR, as_json: bool = AS_JSON) -> None:
    """List tool providers: agents, configured commands, MCP servers."""
    found = _run(grpc_address, lambda c: c.providers())
    if as_json:
        for p in found:
            typer.echo(json.dumps({
                "provider_id": p.provider_id, "kind": p.kind, "state": p.state,
                "tools": [t.descriptor.tool_name for t in p.tools],
                "registered_by": p.registered_by,
                "registered_at": p.registered_at.ToJsonString(), "detail": p.detail,
            }))  # fmt: skip
        return
    table = Table(title=f"tool providers ({len(found)})")
    for column in ("provider", "kind", "state", "tools", "registered by", "registered (UTC)"):
        table.add_column(column)
    for p in found:
        table.add_row(p.provider_id, p.kind, p.state, str(len(p.tools)), p.registered_by,
                      utc_text(p.registered_at.seconds))  # fmt: skip
    console_for_output().print(table)


@app.command("list")
def list_tools(
    grpc_address: str = COORDINATOR, provider: str = PROVIDER, as_json: bool = AS_JSON
) -> None:
    """List tools with their side effects and capability requirements."""
    tools = _tools(grpc_address, provider)
    if as_json:
        for info in tools:
            doc = _tool_doc(info)
            del doc["input_schema"], doc["output_schema"]
            typer.echo(json.dumps(doc))
        return
    table = Table(title=f"tools ({len(tools)})")
    for column in ("provider", "tool", "idempotent", "requires", "timeout s", "description"):
        table.add_column(column)
    for info in tools:
        d = info.descriptor
        table.add_row(
            info.provider_id, d.tool_name, "yes" if d.idempotent else "no",
            ", ".join(info.capabilities) or "-", str(d.default_timeout_s or "-"),
            info.description.splitlines()[0] if info.description else "",
        )  # fmt: skip
    console_for_output().print(table)


@app.command()
def describe(
    tool_name: str = typer.Argument(..., help="The tool's name"),
    grpc_address: str = COORDINATOR,
    provider: str = PROVIDER,
) -> None:
    """Show one tool's descriptor with its schemas."""
    found = [t for t in _tools(grpc_address, provider) if t.descriptor.tool_name == tool_name]
    if not found:
        typer.echo(f"apiary tool: NOT_FOUND: no tool {tool_name!r}", err=True)
        raise typer.Exit(1)
    for info in found:
        typer.echo(json.dumps(_tool_doc(info), indent=2))


def _policy(entries: list[str]) -> dict[str, Any]:
    policy: dict[str, Any] = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep:
            typer.echo(f"apiary tool: --policy takes KEY=VALUE, not {entry!r}", err=True)
            raise typer.Exit(2)
        policy[key] = int(value) if value.isdigit() else value
    return policy


def _show(frame: ToolResult, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps({
            "call_id": frame.call_id, "frame_no": frame.frame_no, "final": frame.final,
            "content_type": frame.content_type, "data": frame.text(),
            "summary": dict(frame.summary),
        }))  # fmt: skip
    elif frame.data:
        sys.stdout.write(frame.text())
        sys.stdout.flush()


@app.command()
def call(
    tool_name: str = typer.Argument(..., help="The tool to call"),
    args: str = typer.Argument("{}", help="Arguments as JSON"),
    grpc_address: str = COORDINATOR,
    provider: str = PROVIDER,
    stream: bool = typer.Option(False, "--stream", help="Print frames as they arrive"),
    agent_id: str = typer.Option("", "--agent-id", help="Call as this agent (worktree tools)"),
    policy: list[str] = typer.Option([], "--policy", help="Execution policy KEY=VALUE"),
    as_json: bool = typer.Option(False, "--json", help="Frames as JSON lines"),
) -> None:
    """Call a tool and print its result (the final frame's summary goes to stderr)."""
    try:
        arguments = json.loads(args)
    except json.JSONDecodeError as exc:
        typer.echo(f"apiary tool: ARGS is not JSON: {exc.msg}", err=True)
        raise typer.Exit(2) from None
    options = {"provider_id": provider, "policy": _policy(policy)}

    async def work(client: ToolClient) -> ToolResult | None:
        if not stream:
            return await client.call(tool_name, arguments, **options)
        async for frame in client.stream(tool_name, arguments, **options):
            _show(frame, as_json)
            if frame.final:
                return frame
        return None

    final = _run(grpc_address, work, agent_id)
    if final is None:
        return
    if not stream:
        _show(final, as_json)
    if not as_json:
        if final.data and not final.data.endswith(b"\n"):
            typer.echo("")
        typer.echo(json.dumps(dict(final.summary)), err=True)
    if final.cancelled:
        raise typer.Exit(1)
