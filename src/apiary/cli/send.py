"""`apiary send`: one message to an agent, from the command line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import typer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from apiary.cli.calls import COORDINATOR, SIGNING_KEY, refusal
from apiary.errors import ApiaryError
from apiary.sdk.connection import Connection
from apiary.sdk.keys import load_signing_key


def send(
    to: str = typer.Argument(..., help="The recipient agent"),
    producer: str = typer.Option("cli", "--from", help="The producer_id it is sent as"),
    data: str = typer.Option("", "--json", help="A JSON payload"),
    text: str = typer.Option("", "--text", help="A text/plain payload"),
    file: Path | None = typer.Option(
        None,
        "--file",
        exists=True,
        dir_okay=False,
        help="The payload from a file (with --content-type)",
    ),
    content_type: str = typer.Option("", "--content-type", help="The payload's media type"),
    correlation_id: str = typer.Option("", "--correlation", help="Default: the message_id"),
    signing_key: Path | None = SIGNING_KEY,
    grpc_address: str = COORDINATOR,
) -> None:
    """Send one DATA message; prints its message_id (exit 1 when refused, naming why)."""
    given = [name for name, v in (("--json", data), ("--text", text), ("--file", file)) if v]
    if len(given) != 1:
        typer.echo("apiary send: give exactly one of --json, --text, --file", err=True)
        raise typer.Exit(2)
    body: bytes
    if data:
        try:
            json.loads(data)
        except ValueError as exc:
            typer.echo(f"apiary send: --json is not JSON: {exc}", err=True)
            raise typer.Exit(2) from None
        body, kind = data.encode(), content_type or "application/json"
    elif text:
        body, kind = text.encode(), content_type or "text/plain"
    else:
        assert file is not None
        body, kind = file.read_bytes(), content_type or "application/octet-stream"
    try:
        key = load_signing_key(signing_key) if signing_key is not None else None
        reason = asyncio.run(_send(grpc_address, producer, to, body, kind, correlation_id, key))
    except ApiaryError as exc:
        typer.echo(refusal("send", exc, address=grpc_address), err=True)
        raise typer.Exit(1) from None
    message_id, why = reason
    typer.echo(message_id)
    typer.echo(f"accepted: {why}", err=True)


async def _send(
    address: str, producer: str, to: str, body: bytes, content_type: str,
    correlation_id: str, key: Ed25519PrivateKey | None,
) -> tuple[str, str]:  # fmt: skip
    sender = Connection(producer, coordinator=address, signing_key=key)
    sender.connect()
    try:
        env = sender.envelope(body, content_type=content_type, correlation_id=correlation_id)
        return env.message_id, await sender.send_envelope(env, to)
    finally:
        await sender.stop(deregister=False)
