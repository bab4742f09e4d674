"""`apiary dlq list|show|requeue|export`: the dead letter queue of a running coordinator."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

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
SINCE = typer.Option("", "--since", help="Failed at or after (ISO-8601)")
UNTIL = typer.Option("", "--until", help="Failed at or before (ISO-8601)")
ERROR = typer.Option("", "--error", help="Error class, e.g. ttl_expired")
ROUTE = typer.Option("", "--route", help="Recipient agent")
PRODUCER = typer.Option("", "--producer", help="Producer agent")


def _run(address: str, call: Callable[[pb.apiary_pb2_grpc.DlqServiceStub], Awaitable[T]]) -> T:
    async def go() -> T:
        async with open_channel(address, credentials=credentials_of(address)) as channel:
            stub = pb.apiary_pb2_grpc.DlqServiceStub(channel)
            return await errors.call(lambda: call(stub))

    try:
        return asyncio.run(go())
    except ApiaryError as exc:
        typer.echo(refusal("dlq", exc, with_field=False, address=address), err=True)
        raise typer.Exit(1) from None


def _since(text: str, name: str) -> float | None:
    if not text:
        return None
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        typer.echo(f"apiary dlq: {name} must be ISO-8601, e.g. 2026-11-22T10:00:00Z", err=True)
        raise typer.Exit(2) from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


def _filter(
    since: str, until: str, error: str, recipient: str, producer: str
) -> pb.apiary_pb2.DlqFilter:
    f = pb.apiary_pb2.DlqFilter(error_code=error, recipient=recipient, producer_id=producer)
    for name, text in (("since", since), ("until", until)):
        value = _since(text, f"--{name}")
        if value is not None:
            getattr(f, name).FromSeconds(int(value))
    return f


@app.command("list")
def list_entries(
    grpc_address: str = COORDINATOR,
    since: str = SINCE,
    until: str = UNTIL,
    error: str = ERROR,
    recipient: str = ROUTE,
    producer: str = PRODUCER,
    limit: int = typer.Option(100, "--limit", help="At most this many dead letters"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line"),
) -> None:
    """List dead letters, newest last."""
    request = pb.apiary_pb2.ListDlqRequest(
        filter=_filter(since, until, error, recipient, producer), limit=limit
    )
    reply = _run(grpc_address, lambda stub: stub.List(request))
    if as_json:
        for entry in reply.entries:
            typer.echo(
                json_format.MessageToJson(entry, indent=None, preserving_proto_field_name=True)
            )
        return
    table = Table(title=f"dead letters ({len(reply.entries)})")
    for column in (
        "id",
        "failed (UTC)",
        "error",
        "producer",
        "route",
        "type",
        "bytes",
        "requeued as",
    ):
        table.add_column(column)
    for e in reply.entries:
        table.add_row(
            str(e.entry_id), stamp_text(e.failed_at), e.error_code, e.producer_id, e.recipient,
            pb.common_pb2.MessageType.Name(e.message_type), str(e.payload_size), e.requeued_as,
        )  # fmt: skip
    console_for_output().print(table)


@app.command()
def show(
    entry_id: int = typer.Argument(..., help="The dead letter's entry id (dlq list)"),
    grpc_address: str = COORDINATOR,
) -> None:
    """Show one dead letter with its attempt history and a payload excerpt."""
    entry = _run(
        grpc_address, lambda stub: stub.Get(pb.apiary_pb2.GetDlqRequest(entry_id=entry_id))
    )
    doc = json_format.MessageToDict(entry, preserving_proto_field_name=True)
    doc["payload_excerpt"] = entry.payload_excerpt.decode("utf-8", "replace")
    typer.echo(json.dumps(doc, indent=2))


@app.command()
def requeue(
    entry_ids: list[int] = typer.Argument(..., help="Entry ids of the dead letters to requeue"),
    grpc_address: str = COORDINATOR,
) -> None:
    """Admit the selected entries again as new attempts."""
    request = pb.apiary_pb2.RequeueDlqRequest(entry_ids=entry_ids)
    reply = _run(grpc_address, lambda stub: stub.Requeue(request))
    failed = 0
    for result in reply.results:
        if result.ok:
            typer.echo(f"{result.entry_id}: requeued as {result.new_message_id}")
        else:
            failed += 1
            typer.echo(f"{result.entry_id}: {result.error}", err=True)
    if failed:
        raise typer.Exit(1)


@app.command()
def export(
    output: Path = typer.Option(
        ..., "--output", "-o", help="Where to write the entries, one JSON object a line"
    ),
    grpc_address: str = COORDINATOR,
    since: str = SINCE,
    until: str = UNTIL,
    error: str = ERROR,
    recipient: str = ROUTE,
    producer: str = PRODUCER,
    payloads: bool = typer.Option(False, "--payloads", help="Include whole payloads"),
    page_size: int = typer.Option(
        100, "--page-size", min=1, max=1000, help="Entries asked for per call"
    ),
) -> None:
    """Export the diagnostics of every matching dead letter as JSON lines, page by page
    (progress on stderr)."""
    request = pb.apiary_pb2.ExportDlqRequest(
        filter=_filter(since, until, error, recipient, producer),
        include_payloads=payloads,
        page_size=page_size,
    )
    written = _run(grpc_address, lambda stub: _export_pages(stub, request, output))
    typer.echo(f"wrote {written} entries to {output}")


async def _export_pages(
    stub: pb.apiary_pb2_grpc.DlqServiceStub, request: pb.apiary_pb2.ExportDlqRequest, output: Path
) -> int:
    """Every page of the export, following its cursor, written to `output`; the count."""
    written = 0
    with output.open("w", encoding="utf-8") as out:
        while True:
            reply: pb.apiary_pb2.ExportDlqResponse = await stub.Export(request)
            for entry in json.loads(reply.bundle)["entries"]:
                out.write(json.dumps(entry, sort_keys=True) + "\n")
            written += reply.entries
            typer.echo(f"apiary dlq export: {written} written", err=True)
            if not reply.next_cursor:
                return written
            request.cursor = reply.next_cursor
