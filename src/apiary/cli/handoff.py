"""`apiary handoff list|show|request|accept|reject|complete`: agent handoffs (RFC 17.6).

`--as AGENT` calls as that agent (the `sw4rm-agent-id` metadata): the origin for request and
complete, the target for accept and reject, a reader of the snapshot for `show --snapshot`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
import typer
from rich.table import Table

from apiary.cli.calls import COORDINATOR, credentials_of, refusal
from apiary.cli.output import TIME, console_for_output, stamp_text
from apiary.core.handoff import HandoffState
from apiary.errors import ApiaryError
from apiary.sdk import errors
from apiary.sdk.channel import open_channel
from apiary.wire import pb
from apiary.wire.handoff import SNAPSHOT_CONTENT_TYPE_KEY, seconds_duration

app = typer.Typer(no_args_is_help=True)  # help: cli/main.py SUBCOMMANDS
T = TypeVar("T")
AS = typer.Option("", "--as", help="Call as this agent (sw4rm-agent-id)")
REQUEST = typer.Argument(..., help="The handoff's request_id")
AGENT_KEY = "sw4rm-agent-id"
h = pb.handoff_pb2
a = pb.apiary_pb2
Metadata = tuple[tuple[str, str], ...]


class Stubs:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.handoff = pb.handoff_pb2_grpc.HandoffServiceStub(channel)
        self.query = pb.apiary_pb2_grpc.HandoffQueryServiceStub(channel)


def _run(address: str, call: Callable[[Stubs], Awaitable[T]]) -> T:
    async def go() -> T:
        async with open_channel(address, credentials=credentials_of(address)) as channel:
            return await errors.call(lambda: call(Stubs(channel)))

    try:
        return asyncio.run(go())
    except ApiaryError as exc:
        typer.echo(refusal("handoff", exc, address=address), err=True)
        raise typer.Exit(1) from None


def _as(agent: str) -> Metadata:
    return ((AGENT_KEY, agent),) if agent else ()


def _status(name: str) -> h.HandoffStatus.ValueType:
    try:
        return h.HandoffStatus.Value(name.strip().upper())
    except ValueError:
        names = ", ".join(HandoffState)
        typer.echo(f"apiary handoff: --status must be one of {names}, got {name!r}", err=True)
        raise typer.Exit(2) from None


def _snapshot(view: a.HandoffView) -> dict[str, Any]:
    data = bytes(view.request.context_snapshot)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}
    if view.snapshot_content_type.split(";")[0].strip().endswith("json"):
        return {"json": json.loads(text)}
    return {"text": text}


def _doc(view: a.HandoffView, *, snapshot: bool = False) -> dict[str, Any]:
    r = view.request
    doc: dict[str, Any] = {
        "request_id": r.request_id, "state": h.HandoffStatus.Name(view.status),
        "from_agent": r.from_agent, "to_agent": r.to_agent, "requested_to": view.requested_to,
        "reason": r.reason, "capabilities_required": list(r.capabilities_required),
        "priority": r.priority, "timeout_s": r.timeout.ToTimedelta().total_seconds(),
        "attempt": view.attempt, "tried": list(view.tried),
        "accepting_agent": view.accepting_agent, "rejection_reason": view.rejection_reason,
        "snapshot_content_type": view.snapshot_content_type,
        "snapshot_size": view.snapshot_size, "context_holders": list(view.context_holders),
        "created_at": view.created_at.ToJsonString(), "deadline": view.deadline.ToJsonString(),
    }  # fmt: skip
    if snapshot:
        doc["snapshot"] = _snapshot(view)
    return doc


def _table(views: list[a.HandoffView]) -> None:
    table = Table(title=f"Handoffs ({len(views)})")
    columns = ("id", "state", "from", "to", "attempt", "capabilities", "deadline (UTC)", "reason")
    for column in columns:
        table.add_column(column)
    for v in views:
        table.add_row(
            v.request.request_id, h.HandoffStatus.Name(v.status), v.request.from_agent,
            v.request.to_agent, str(v.attempt), ", ".join(v.request.capabilities_required),
            stamp_text(v.deadline, TIME) if v.status == h.PENDING else "", v.request.reason,
        )  # fmt: skip
    console_for_output().print(table)


@app.command("list")
def list_handoffs(
    status: list[str] = typer.Option([], "--status", "-s", help="PENDING, ACCEPTED, ... (repeat)"),
    from_agent: str = typer.Option("", "--from", help="Only handoffs from this agent"),
    to_agent: str = typer.Option("", "--to", help="Only handoffs to this agent"),
    limit: int = typer.Option(100, "--limit", min=1, max=1000, help="At most this many"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line"),
    grpc_address: str = COORDINATOR,
) -> None:
    """List handoffs, oldest first."""
    request = a.ListHandoffsRequest(
        statuses=[_status(s) for s in status],
        from_agent=from_agent, to_agent=to_agent, limit=limit,
    )  # fmt: skip
    views = list(_run(grpc_address, lambda s: s.query.ListHandoffs(request)).handoffs)
    if as_json:
        for v in views:
            typer.echo(json.dumps(_doc(v)))
    else:
        _table(views)


@app.command()
def show(
    request_id: str = REQUEST,
    snapshot: bool = typer.Option(False, "--snapshot", help="Include the context snapshot"),
    agent: str = AS,
    grpc_address: str = COORDINATOR,
) -> None:
    """Show one handoff as JSON (with --snapshot --as AGENT: its context too)."""
    request = a.GetHandoffRequest(request_id=request_id, include_snapshot=snapshot)
    view = _run(grpc_address, lambda s: s.query.GetHandoff(request, metadata=_as(agent)))
    typer.echo(json.dumps(_doc(view, snapshot=snapshot), indent=2))


@app.command()
def request(
    from_agent: str = typer.Option(..., "--from", help="The originating agent"),
    to_agent: str = typer.Option("", "--to", help="The target (empty: route by capability)"),
    capability: list[str] = typer.Option([], "--capability", "-c", help="Required (repeat)"),
    reason: str = typer.Option("", "--reason", "-r", help="Why the work is handed off"),
    snapshot: str = typer.Option("", "--snapshot", help="The context snapshot, as text"),
    snapshot_file: Path | None = typer.Option(
        None, "--snapshot-file", exists=True, help="The context snapshot, from a file"
    ),
    content_type: str = typer.Option("", "--content-type", help="The snapshot's media type"),
    priority: int = typer.Option(0, "--priority", help="-19 (most urgent) to 20"),
    timeout: float = typer.Option(0.0, "--timeout", help="Seconds to wait for acceptance"),
    request_id: str = typer.Option("", "--id", help="Default: a new UUID"),
    grpc_address: str = COORDINATOR,
) -> None:
    """Request a handoff as the originating agent; prints its request_id."""
    if snapshot and snapshot_file is not None:
        typer.echo("apiary handoff: give --snapshot or --snapshot-file, not both", err=True)
        raise typer.Exit(2)
    data = snapshot_file.read_bytes() if snapshot_file is not None else snapshot.encode()
    message = h.HandoffRequest(
        request_id=request_id or str(uuid.uuid4()), from_agent=from_agent, to_agent=to_agent,
        reason=reason, context_snapshot=data, capabilities_required=capability,
        priority=priority,
    )  # fmt: skip
    if timeout:
        message.timeout.CopyFrom(seconds_duration(timeout))
    metadata = _as(from_agent) + (
        ((SNAPSHOT_CONTENT_TYPE_KEY, content_type),) if content_type else ()
    )
    _run(grpc_address, lambda s: s.handoff.RequestHandoff(message, metadata=metadata))
    typer.echo(message.request_id)


@app.command()
def accept(request_id: str = REQUEST, agent: str = AS, grpc_address: str = COORDINATOR) -> None:
    """Accept a handoff as its target."""
    message = h.HandoffResponse(request_id=request_id, accepted=True, accepting_agent=agent)
    _run(grpc_address, lambda s: s.handoff.AcceptHandoff(message, metadata=_as(agent)))
    typer.echo(f"{request_id}: ACCEPTED")


@app.command()
def reject(
    request_id: str = REQUEST,
    reason: str = typer.Option(..., "--reason", "-r", help="Why (sent to the origin)"),
    agent: str = AS,
    grpc_address: str = COORDINATOR,
) -> None:
    """Reject a handoff as its target; it may be rerouted to another capable agent."""
    message = h.HandoffResponse(
        request_id=request_id, accepting_agent=agent, rejection_reason=reason
    )
    _run(grpc_address, lambda s: s.handoff.RejectHandoff(message, metadata=_as(agent)))
    typer.echo(f"{request_id}: REJECTED")


@app.command()
def complete(request_id: str = REQUEST, agent: str = AS, grpc_address: str = COORDINATOR) -> None:
    """Report an accepted handoff COMPLETED (the context is transferred)."""
    message = h.CompleteHandoffRequest(request_id=request_id, status=h.COMPLETED)
    reply = _run(grpc_address, lambda s: s.handoff.CompleteHandoff(message, metadata=_as(agent)))
    typer.echo(reply.message)
