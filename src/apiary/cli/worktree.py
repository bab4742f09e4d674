"""`apiary worktree list|status|bind|unbind|switch|approve|reject|revoke`: agents' worktree
bindings on a running coordinator (RFC 16; docs/worktrees.md).

`approve` needs an operator token (`--token` or APIARY_TOKEN) when the coordinator has HITL
operators configured. Every command takes `--json`; `bind` exits 1 when the BIND failed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import typer
from google.protobuf import json_format
from rich.table import Table

from apiary.cli.calls import COORDINATOR, credentials_of, refusal
from apiary.cli.output import console_for_output, stamp_text
from apiary.errors import ApiaryError
from apiary.sdk import errors
from apiary.sdk.channel import open_channel
from apiary.wire import pb

app = typer.Typer(no_args_is_help=True)  # help: cli/main.py SUBCOMMANDS
T = TypeVar("T")
JSON = typer.Option(False, "--json", help="Print JSON instead of a table")
TOKEN = typer.Option("", "--token", envvar="APIARY_TOKEN", help="Operator token (or APIARY_TOKEN)")
AGENT = typer.Argument(..., help="The agent whose binding it is")
a = pb.apiary_pb2
w = pb.worktree_pb2


@dataclass(frozen=True, slots=True)
class _Stubs:
    canonical: pb.worktree_pb2_grpc.WorktreeServiceStub
    bindings: pb.apiary_pb2_grpc.WorktreeBindingServiceStub


def _run(address: str, call: Callable[[_Stubs], Awaitable[T]]) -> T:
    async def go() -> T:
        async with open_channel(address, credentials=credentials_of(address)) as channel:
            stubs = _Stubs(
                pb.worktree_pb2_grpc.WorktreeServiceStub(channel),
                pb.apiary_pb2_grpc.WorktreeBindingServiceStub(channel),
            )
            return await errors.call(lambda: call(stubs))

    try:
        return asyncio.run(go())
    except ApiaryError as exc:
        typer.echo(refusal("worktree", exc, with_field=False, address=address), err=True)
        raise typer.Exit(1) from None


def _doc(binding: a.WorktreeBinding) -> dict[str, Any]:
    return json_format.MessageToDict(
        binding, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def _where(repo_id: str, worktree_id: str) -> str:
    return f"{repo_id}/{worktree_id}" if worktree_id else ""


def _table(bindings: list[a.WorktreeBinding], title: str) -> None:
    table = Table(title=title)
    for column in ("agent", "state", "home", "current", "pending", "reason", "expires (UTC)"):
        table.add_column(column)
    for b in bindings:
        table.add_row(
            b.agent_id, b.state, _where(b.repo_id, b.worktree_id),
            _where(b.current_repo_id, b.current_worktree_id),
            _where(b.target_repo_id, b.target_worktree_id), b.reason, stamp_text(b.expires_at),
        )  # fmt: skip
    console_for_output().print(table)


def _show(binding: a.WorktreeBinding, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(_doc(binding)))
        return
    table = Table(title=f"worktree binding of {binding.agent_id}", show_header=False)
    table.add_column("field")
    table.add_column("value")
    rows = [
        ("state", binding.state), ("home", _where(binding.repo_id, binding.worktree_id)),
        ("branch", binding.branch),
        ("current", _where(binding.current_repo_id, binding.current_worktree_id)),
        ("path", binding.path),
        ("pending switch", _where(binding.target_repo_id, binding.target_worktree_id)),
        ("expires (UTC)", stamp_text(binding.expires_at)), ("reason", binding.reason),
        ("attempts", str(binding.attempts or "")),
        ("next retry (UTC)", stamp_text(binding.retry_at)),
        ("HITL invocation", binding.invocation_id), ("note", binding.note),
        ("version", str(binding.version)),
    ]  # fmt: skip
    for name, value in rows:
        if value:
            table.add_row(name, value)
    console_for_output().print(table)


async def _get(stubs: _Stubs, agent_id: str) -> a.WorktreeBinding:
    found: a.WorktreeBinding = await stubs.bindings.Get(a.GetBindingRequest(agent_id=agent_id))
    return found


@app.command("list")
def list_bindings(
    grpc_address: str = COORDINATOR,
    state: list[str] = typer.Option([], "--state", help="Only these states (repeatable)"),
    repo: str = typer.Option("", "--repo", help="Only bindings whose home or current repo is this"),
    as_json: bool = JSON,
) -> None:
    """List every agent's binding."""
    request = a.ListBindingsRequest(states=[s.upper() for s in state], repo_id=repo)
    reply = _run(grpc_address, lambda s: s.bindings.List(request))
    if as_json:
        typer.echo(json.dumps([_doc(b) for b in reply.bindings]))
        return
    _table(list(reply.bindings), f"worktree bindings ({len(reply.bindings)})")


@app.command()
def status(agent_id: str = AGENT, grpc_address: str = COORDINATOR, as_json: bool = JSON) -> None:
    """Show one agent's binding."""
    _show(_run(grpc_address, lambda s: _get(s, agent_id)), as_json)


@app.command()
def bind(
    agent_id: str = AGENT,
    repo_id: str = typer.Argument(..., help="The repository ([[worktrees.repos]] id)"),
    worktree_id: str = typer.Argument(..., help="The worktree (made when it does not exist)"),
    branch: str = typer.Option("", "--branch", help="Branch to check out (default: the id)"),
    commit: str = typer.Option("", "--commit", help="Start a new branch here (default HEAD)"),
    grpc_address: str = COORDINATOR,
    as_json: bool = JSON,
) -> None:
    """Bind the agent's home worktree (made with `git worktree add` unless it exists)."""
    request = a.BindWorktreeRequest(
        agent_id=agent_id, repo_id=repo_id, worktree_id=worktree_id, branch=branch,
        commit_sha=commit,
    )  # fmt: skip
    binding = _run(grpc_address, lambda s: s.bindings.Bind(request))
    _show(binding, as_json)
    if binding.state == "BIND_FAILED":
        raise typer.Exit(1)


@app.command()
def unbind(agent_id: str = AGENT, grpc_address: str = COORDINATOR, as_json: bool = JSON) -> None:
    """Unbind the agent (from its home, a non-home worktree or BIND_FAILED)."""

    async def call(s: _Stubs) -> a.WorktreeBinding:
        await s.canonical.Unbind(w.UnbindRequest(agent_id=agent_id))
        return await _get(s, agent_id)

    _show(_run(grpc_address, call), as_json)


@app.command()
def switch(
    agent_id: str = AGENT,
    worktree_id: str = typer.Argument(..., help="The worktree to switch to"),
    repo: str = typer.Option("", "--repo", help="Target repository (default: the home one)"),
    ttl: float = typer.Option(0.0, "--ttl", help="Seconds in the target (default: configured)"),
    grpc_address: str = COORDINATOR,
    as_json: bool = JSON,
) -> None:
    """Request a switch to a non-home worktree; HITL (or `approve`) decides."""
    request = a.SwitchWorktreeRequest(
        agent_id=agent_id, target_repo_id=repo, target_worktree_id=worktree_id,
        ttl_ms=round(ttl * 1000), requires_hitl=True,
    )  # fmt: skip
    _show(_run(grpc_address, lambda s: s.bindings.RequestSwitch(request)), as_json)


@app.command()
def approve(
    agent_id: str = AGENT,
    ttl: float = typer.Option(0.0, "--ttl", help="Seconds in the target (default: as requested)"),
    token: str = TOKEN,
    grpc_address: str = COORDINATOR,
    as_json: bool = JSON,
) -> None:
    """Approve the agent's pending switch (an operator's decision)."""
    metadata = (("authorization", f"Bearer {token}"),) if token else ()

    async def call(s: _Stubs) -> a.WorktreeBinding:
        request = w.SwitchApprove(agent_id=agent_id, ttl_ms=round(ttl * 1000))
        await s.canonical.ApproveSwitch(request, metadata=metadata)
        return await _get(s, agent_id)

    _show(_run(grpc_address, call), as_json)


@app.command()
def reject(
    agent_id: str = AGENT,
    reason: str = typer.Option("", "--reason", "-r", help="Why, for the record"),
    grpc_address: str = COORDINATOR,
    as_json: bool = JSON,
) -> None:
    """Reject the agent's pending switch: it stays home."""

    async def call(s: _Stubs) -> a.WorktreeBinding:
        await s.canonical.RejectSwitch(w.SwitchReject(agent_id=agent_id, reason=reason))
        return await _get(s, agent_id)

    _show(_run(grpc_address, call), as_json)


@app.command()
def revoke(
    agent_id: str = AGENT,
    reason: str = typer.Option("", "--reason", "-r", help="Why, for the record"),
    grpc_address: str = COORDINATOR,
    as_json: bool = JSON,
) -> None:
    """End the agent's non-home binding now: it returns home."""
    request = a.RevokeSwitchRequest(agent_id=agent_id, reason=reason)
    _show(_run(grpc_address, lambda s: s.bindings.Revoke(request)), as_json)
