"""`apiary events`: read the event log of a running coordinator."""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import typer
from rich.console import Console
from rich.table import Table

from apiary.errors import ApiaryError
from apiary.sdk import errors
from apiary.sdk.channel import open_channel
from apiary.wire import pb


def events(
    grpc_address: str = typer.Option("127.0.0.1:50051", "--grpc", help="Coordinator HOST:PORT"),
    after: int = typer.Option(0, "--after", help="Only events with a higher sequence"),
    limit: int = typer.Option(100, "--limit", help="At most this many events"),
    correlation_id: str = typer.Option("", "--correlation-id", help="Filter by correlation id"),
    agent_id: str = typer.Option("", "--agent", help="Filter by agent id"),
    event_type: list[str] = typer.Option([], "--type", help="Filter by event type (repeatable)"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line"),
) -> None:
    """Show events from a coordinator's event log."""
    request = pb.apiary_pb2.ReadEventsRequest(
        after_sequence=after, limit=limit, correlation_id=correlation_id,
        agent_id=agent_id, event_types=event_type,
    )  # fmt: skip
    try:
        response = asyncio.run(_read(grpc_address, request))
    except ApiaryError as exc:
        typer.echo(f"apiary events: {exc.code}: {exc.message}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        for e in response.events:
            doc = {
                "sequence": e.sequence, "ts": e.ts.ToJsonString(), "type": e.event_type,
                "actor": e.actor, "correlation_id": e.correlation_id, "agent_id": e.agent_id,
                "details": json.loads(e.details_json or "{}"),
            }  # fmt: skip
            typer.echo(json.dumps(doc))
        return
    table = Table(title=f"events (log at #{response.last_sequence})")
    for column in ("seq", "time (UTC)", "type", "actor", "agent", "details"):
        table.add_column(column)
    for e in response.events:
        when = dt.datetime.fromtimestamp(e.ts.seconds, dt.UTC).strftime("%H:%M:%S")
        table.add_row(str(e.sequence), when, e.event_type, e.actor, e.agent_id, e.details_json[:80])
    Console().print(table)


async def _read(
    address: str, request: pb.apiary_pb2.ReadEventsRequest
) -> pb.apiary_pb2.ReadEventsResponse:
    async with open_channel(address) as channel:
        stub = pb.apiary_pb2_grpc.EventLogServiceStub(channel)
        return await errors.call(lambda: stub.ReadEvents(request, timeout=10))
