"""`apiary events`: read the event log of a running coordinator, or follow it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import typer
from rich.table import Table

from apiary.cli.calls import COORDINATOR, credentials_of, refusal
from apiary.cli.output import TIME, console_for_output, utc_text
from apiary.errors import ApiaryError
from apiary.sdk import errors
from apiary.sdk.channel import open_channel
from apiary.wire import pb

FOLLOW_POLL_S = 0.5
"""How often `--follow` asks for events after the last one it printed."""


def events(
    grpc_address: str = COORDINATOR,
    after: int = typer.Option(0, "--after", help="Only events with a higher sequence"),
    limit: int = typer.Option(100, "--limit", help="At most this many events"),
    correlation_id: str = typer.Option("", "--correlation-id", help="Filter by correlation id"),
    agent_id: str = typer.Option("", "--agent", help="Filter by agent id"),
    event_type: list[str] = typer.Option(
        [], "--type", help="Filter by event type (repeatable); `task.` means every task.* type"
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line"),
    follow: bool = typer.Option(
        False,
        "--follow",
        "-f",
        help="Print new events as they are logged (from now, or after --after) until Ctrl-C",
    ),
) -> None:
    """Show events from a coordinator's event log (with --follow: as they happen)."""
    request = pb.apiary_pb2.ReadEventsRequest(
        after_sequence=after, limit=limit, correlation_id=correlation_id,
        agent_id=agent_id, event_types=event_type,
    )  # fmt: skip
    try:
        if follow:
            asyncio.run(_follow(grpc_address, request, as_json))
            return
        response = asyncio.run(_read(grpc_address, request))
    except ApiaryError as exc:
        typer.echo(refusal("events", exc, with_field=False, address=grpc_address), err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        return
    if as_json:
        for e in response.events:
            typer.echo(json.dumps(_doc(e)))
        return
    table = Table(title=f"events (log at #{response.last_sequence})")
    for column in ("seq", "time (UTC)", "type", "actor", "agent", "details"):
        table.add_column(column)
    for e in response.events:
        table.add_row(str(e.sequence), _when(e), e.event_type, e.actor, e.agent_id,
                      e.details_json[:80])  # fmt: skip
    console_for_output().print(table)


def _doc(e: pb.apiary_pb2.Event) -> dict[str, Any]:
    return {
        "sequence": e.sequence, "ts": e.ts.ToJsonString(), "type": e.event_type,
        "actor": e.actor, "correlation_id": e.correlation_id, "agent_id": e.agent_id,
        "details": json.loads(e.details_json or "{}"),
    }  # fmt: skip


def _when(e: pb.apiary_pb2.Event) -> str:
    return utc_text(e.ts.seconds, TIME)


async def _read(
    address: str, request: pb.apiary_pb2.ReadEventsRequest
) -> pb.apiary_pb2.ReadEventsResponse:
    async with open_channel(address, credentials=credentials_of(address)) as channel:
        stub = pb.apiary_pb2_grpc.EventLogServiceStub(channel)
        return await errors.call(lambda: stub.ReadEvents(request, timeout=10))


async def _follow(address: str, request: pb.apiary_pb2.ReadEventsRequest, as_json: bool) -> None:
    """Print matching events as they are logged, one line each, in sequence order."""
    async with open_channel(address, credentials=credentials_of(address)) as channel:
        stub = pb.apiary_pb2_grpc.EventLogServiceStub(channel)
        if not request.after_sequence:  # from now on, like tail -f
            probe = pb.apiary_pb2.ReadEventsRequest(limit=1)
            now = await errors.call(lambda: stub.ReadEvents(probe, timeout=10))
            request.after_sequence = now.last_sequence
        while True:
            page = await errors.call(lambda: stub.ReadEvents(request, timeout=10))
            for e in page.events:
                line = json.dumps(_doc(e)) if as_json else (
                    f"#{e.sequence} {_when(e)} {e.event_type} {e.actor}"
                    f"{' ' + e.agent_id if e.agent_id else ''} {e.details_json[:120]}"
                )  # fmt: skip
                typer.echo(line)
            if page.events:
                request.after_sequence = page.events[-1].sequence
            if len(page.events) < max(request.limit, 1):
                await asyncio.sleep(FOLLOW_POLL_S)
