"""`apiary send`: one message to an agent, from the command line.

Without --wait the command is a one-way producer: it sends, prints the message_id and ends.
It is no registered agent, so the coordinator ends the recipient's ACKs of the message
instead of forwarding them, and a reply to it is refused (no_route, answered to the replier
and logged; the SDK's `Message.reply` lets the handler go on). With --wait it registers as
the sender agent for the length of the command (with an inbound stream, any content type),
prints the replies that come in the message's correlation (or the FULFILLED note when there
are none), and deregisters as it ends (docs/decisions.md).
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import typer

from apiary.cli.calls import COORDINATOR, SIGNING_KEY, credentials_of, refusal
from apiary.core.envelope import AckStage, Envelope
from apiary.errors import ApiaryError, NotFoundError
from apiary.sdk import errors
from apiary.sdk.connection import Connection
from apiary.sdk.keys import load_signing_key
from apiary.sdk.outcome import Outcome, wait_for_outcome
from apiary.wire import pb

SENDER_NAME = "apiary send"
"""The registered name of the sender agent `--wait` registers: a registration of that name
left behind (a command killed while waiting) is taken over by the next one."""
NO_OUTCOME_EXIT = 3
"""The exit code of `--wait` when the message reached no terminal stage in time."""


class _UsageError(Exception):
    """A refusal the command itself makes: printed, exit code 2."""


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
    wait: bool = typer.Option(
        False,
        "--wait",
        help="Register as the --from agent while waiting for the outcome: print the replies "
        "(else the FULFILLED note); exit 1 when the message is REJECTED, FAILED or TIMED_OUT",
    ),
    timeout: float = typer.Option(
        30.0,
        "--timeout",
        metavar="SECONDS",
        help=f"How long --wait waits for the outcome (exit {NO_OUTCOME_EXIT} without one)",
    ),
    signing_key: Path | None = SIGNING_KEY,
    grpc_address: str = COORDINATOR,
) -> None:
    """Send one DATA message; prints its message_id, or with --wait its replies (exit 1 when
    refused, naming why)."""
    given = [name for name, v in (("--json", data), ("--text", text), ("--file", file)) if v]
    if len(given) != 1:
        typer.echo("apiary send: give exactly one of --json, --text, --file", err=True)
        raise typer.Exit(2)
    if not timeout > 0:
        typer.echo(f"apiary send: --timeout must be more than 0 seconds, not {timeout}", err=True)
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
        sender = Connection(
            producer, coordinator=grpc_address, signing_key=key,
            credentials=credentials_of(grpc_address), name=SENDER_NAME,
            description="the apiary send command, registered while it waits for an outcome",
            modalities=("*/*",),
        )  # fmt: skip
        env = sender.envelope(body, content_type=kind, correlation_id=correlation_id)
        if not wait:
            why = asyncio.run(_send(sender, env, to))
            typer.echo(env.message_id)
            typer.echo(f"accepted: {why}", err=True)
            return
        outcome = asyncio.run(_send_and_wait(sender, env, to, timeout))
    except _UsageError as exc:
        typer.echo(f"apiary send: {exc}", err=True)
        raise typer.Exit(2) from None
    except ApiaryError as exc:
        typer.echo(refusal("send", exc, address=grpc_address), err=True)
        if not wait and _unregistered_signer(exc):
            typer.echo(
                f"apiary send: with message signing on, {producer} must be a registered agent "
                "to be verified: --wait registers it (with --signing-key) while it waits",
                err=True,
            )
        raise typer.Exit(1) from None
    raise typer.Exit(_ended(env, to, outcome, timeout))


def _unregistered_signer(exc: ApiaryError) -> bool:
    """A refusal of a signed message whose producer has no registered key to check it by."""
    return (
        exc.code == "permission_denied"
        and exc.details.get("field") == "signature"
        and "no registered public key" in exc.message
    )


async def _send(sender: Connection, env: Envelope, to: str) -> str:
    """One-way: the router's reason for accepting `env`."""
    sender.connect()
    try:
        return await sender.send_envelope(env, to)
    finally:
        await sender.stop(deregister=False)


async def _send_and_wait(sender: Connection, env: Envelope, to: str, wait_s: float) -> Outcome:
    """Register as the sender, send `env` and follow it to its outcome (`wait_s` at most),
    printing each reply as it comes; deregister however it ends."""
    sender.connect()
    try:
        await _check_free(sender)
        await sender.register()
    except BaseException:
        await sender.stop(deregister=False)
        raise
    try:
        why = await sender.send_envelope(env, to)
        typer.echo(
            f"sent {env.message_id} to {to} as {sender.agent_id} (accepted: {why}); "
            f"waiting up to {wait_s:g} s for its outcome",
            err=True,
        )
        deliveries = sender.deliveries()
        try:
            return await wait_for_outcome(
                sender, env, deliveries, wait_s=wait_s, on_reply=_print_reply
            )
        finally:
            await deliveries.aclose()
    finally:
        try:
            await sender.stop("apiary send ended")
        except ApiaryError as exc:  # the outcome stands; the registration is left behind
            typer.echo(
                f"apiary send: {sender.agent_id} stays registered: deregistering it was "
                f"refused: {exc.code}: {exc.message}",
                err=True,
            )


async def _check_free(sender: Connection) -> None:
    """Refuse to register over an agent that is not a sender left behind: --wait deregisters
    what it registered, which would take a running agent's registration away."""
    request = pb.apiary_pb2.GetAgentRequest(agent_id=sender.agent_id)
    stub = pb.apiary_pb2_grpc.DiscoveryServiceStub(sender.channel)
    try:
        found = await errors.call(lambda: stub.GetAgent(request))
    except NotFoundError:
        return
    if found.descriptor.name != SENDER_NAME:
        raise _UsageError(
            f"--from {sender.agent_id} names a registered agent; --wait registers the sender "
            "while it waits and deregisters it after, so give it an id of its own (default: cli)"
        )


async def _print_reply(reply: Envelope) -> None:
    """A reply on stdout: its payload as text, or base64 when it is not UTF-8."""
    try:
        shown = reply.payload.decode("utf-8")
    except UnicodeDecodeError:
        shown = base64.b64encode(reply.payload).decode()
        typer.echo(f"(reply {reply.message_id}: {reply.content_type}, base64)", err=True)
    typer.echo(shown)


def _ended(env: Envelope, to: str, outcome: Outcome, wait_s: float) -> int:
    """What --wait prints once it stops, and its exit code."""
    stage = outcome.stage
    if not outcome.finished:
        heard = stage.name if stage else "accepted, not acknowledged"
        typer.echo(
            f"apiary send: no outcome for {env.message_id} within {wait_s:g} s (last: {heard});"
            f" the coordinator still holds it: apiary events --correlation-id "
            f"{env.correlation_id}",
            err=True,
        )
        return NO_OUTCOME_EXIT
    said = f"{outcome.error_code}: {outcome.note}" if outcome.error_code else outcome.note
    if stage is AckStage.FULFILLED:
        if not outcome.replies and outcome.note:
            typer.echo(outcome.note)
        typer.echo(f"FULFILLED by {outcome.by}" + (f": {said}" if said else ""), err=True)
        return 0
    typer.echo(
        f"apiary send: {env.message_id} to {to} {stage.name} by {outcome.by}"
        + (f": {said}" if said else ""),
        err=True,
    )
    return 1
