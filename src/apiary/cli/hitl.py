"""`apiary hitl list|show|approve|deny|modify|defer`: decide HITL invocations (RFC 15).

Operators authenticate with their token (`--token` or the APIARY_TOKEN environment
variable), or with the client's own credentials (an operator's API key or client
certificate: APIARY_API_KEY, APIARY_TLS_CERT/KEY or the client configuration file).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TypeVar

import typer
from rich.table import Table

from apiary.cli.calls import COORDINATOR, credentials_of, refusal
from apiary.cli.output import TIME, console_for_output, stamp_text
from apiary.errors import ApiaryError
from apiary.sdk import errors
from apiary.sdk.channel import open_channel
from apiary.wire import pb

app = typer.Typer(no_args_is_help=True)  # help: cli/main.py SUBCOMMANDS
T = TypeVar("T")
TOKEN = typer.Option(
    "", "--token", envvar="APIARY_TOKEN",
    help="Operator token (or APIARY_TOKEN); without one, the client's own credentials",
)  # fmt: skip
REASON = typer.Option(..., "--reason", "-r", help="Rationale recorded with the decision")
INVOCATION = typer.Argument(..., help="The invocation's id (hitl list)")
Stub = pb.apiary_pb2_grpc.HitlOperatorServiceStub
a = pb.apiary_pb2


def _run(
    address: str, token: str, call: Callable[[Stub, tuple[tuple[str, str], ...]], Awaitable[T]]
) -> T:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()

    async def go() -> T:
        async with open_channel(address, credentials=credentials_of(address)) as channel:
            return await errors.call(lambda: call(Stub(channel), metadata))

    try:
        return asyncio.run(go())
    except ApiaryError as exc:
        typer.echo(refusal("hitl", exc, token=token, address=address), err=True)
        raise typer.Exit(1) from None


def _table(views: list[a.HitlInvocationView]) -> None:
    table = Table(title=f"HITL invocations ({len(views)})")
    for column in ("id", "reason", "state", "requested by", "suggested", "deadline (UTC)", "roles"):
        table.add_column(column)
    for v in views:
        table.add_row(
            v.invocation_id, v.reason_type, v.state, v.requested_by, v.suggested_action,
            stamp_text(v.deadline, TIME), ", ".join(v.approver_roles),
        )  # fmt: skip
    console_for_output().print(table)


def _doc(v: a.HitlInvocationView) -> dict[str, object]:
    return {
        "invocation_id": v.invocation_id, "reason_type": v.reason_type, "state": v.state,
        "requested_by": v.requested_by, "correlation_id": v.correlation_id,
        "subject": json.loads(v.subject_json or "{}"),
        "context": json.loads(v.context_json or "{}"),
        "suggested_action": v.suggested_action, "proposed_actions": list(v.proposed_actions),
        "approver_roles": list(v.approver_roles),
        "deadline": v.deadline.ToJsonString() if v.HasField("deadline") else None,
        "extensions": v.extensions, "decision": json.loads(v.decision_json or "{}"),
    }  # fmt: skip


@app.command("list")
def list_invocations(
    grpc_address: str = COORDINATOR,
    token: str = TOKEN,
    include_decided: bool = typer.Option(False, "--all", help="Include decided ones"),
    wait: bool = typer.Option(False, "--wait", help="Block until a new invocation arrives"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line"),
) -> None:
    """List pending invocations (with --wait: wait for the next one and show it)."""
    if wait:

        async def first(stub: Stub, md: tuple[tuple[str, str], ...]) -> list[a.HitlInvocationView]:
            call = stub.Watch(a.WatchInvocationsRequest(include_pending=False), metadata=md)
            async for item in call:
                call.cancel()
                return [item]
            return []

        views = _run(grpc_address, token, first)
    else:
        request = a.ListInvocationsRequest(include_decided=include_decided)
        views = list(
            _run(grpc_address, token, lambda s, md: s.List(request, metadata=md)).invocations
        )
    if as_json:
        for v in views:
            typer.echo(json.dumps(_doc(v)))
    else:
        _table(views)


@app.command()
def show(
    invocation_id: str = INVOCATION, grpc_address: str = COORDINATOR, token: str = TOKEN
) -> None:
    """Show one invocation with its context and decision."""
    request = a.GetInvocationRequest(invocation_id=invocation_id)
    view = _run(grpc_address, token, lambda s, md: s.Get(request, metadata=md))
    typer.echo(json.dumps(_doc(view), indent=2))


def _decide(
    invocation_id: str, action: str, reason: str, grpc_address: str, token: str, patch: str = ""
) -> None:
    request = a.DecideInvocationRequest(
        invocation_id=invocation_id, action=action, rationale=reason, patch_json=patch
    )
    view = _run(grpc_address, token, lambda s, md: s.Decide(request, metadata=md))
    decision = json.loads(view.decision_json or "{}")
    typer.echo(f"{view.invocation_id}: {view.state} ({decision.get('action', action)})")


@app.command()
def approve(
    invocation_id: str = INVOCATION,
    reason: str = REASON,
    grpc_address: str = COORDINATOR,
    token: str = TOKEN,
) -> None:
    """Approve an invocation."""
    _decide(invocation_id, "approve", reason, grpc_address, token)


@app.command()
def deny(
    invocation_id: str = INVOCATION,
    reason: str = REASON,
    grpc_address: str = COORDINATOR,
    token: str = TOKEN,
) -> None:
    """Deny an invocation."""
    _decide(invocation_id, "deny", reason, grpc_address, token)


@app.command()
def modify(
    invocation_id: str = INVOCATION,
    patch: str = typer.Option(..., "--patch", help="JSON object applied to the proposal"),
    reason: str = REASON,
    grpc_address: str = COORDINATOR,
    token: str = TOKEN,
) -> None:
    """Approve with changes (a JSON patch)."""
    _decide(invocation_id, "modify", reason, grpc_address, token, patch)


@app.command()
def defer(
    invocation_id: str = INVOCATION,
    reason: str = REASON,
    grpc_address: str = COORDINATOR,
    token: str = TOKEN,
) -> None:
    """Postpone: the deadline moves out and the invocation stays pending."""
    _decide(invocation_id, "defer", reason, grpc_address, token)
