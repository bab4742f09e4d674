"""`apiary workflow create|start|status|resume|list|cancel|history`: DAG workflows (RFC 17.7;
docs/workflows.md).

A definition file is JSON or TOML (by its extension): the `WorkflowDefinition` fields, with
`nodes` an object keyed by node id. `status --watch` (and `start --watch`) shows the nodes'
states live until the workflow finishes, and then exits 0 when it COMPLETED, 1 otherwise.
`list` and `history` page with `--after` (a page that is not the last says where the next one
starts, on stderr; in `--json` as `next_after_id` / `next_after_sequence`).
"""

from __future__ import annotations

import asyncio
import json
import tomllib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from google.protobuf import json_format
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from apiary.cli.calls import COORDINATOR, run_client
from apiary.cli.output import TIME, console_for_output, utc_text
from apiary.core.workflow.definition import spec_from_json
from apiary.errors import ApiaryError
from apiary.sdk.client import Client
from apiary.wire import pb
from apiary.wire.workflow import definition_to_proto

app = typer.Typer(no_args_is_help=True)  # help: cli/main.py SUBCOMMANDS
T = TypeVar("T")
w = pb.workflow_pb2
AS_JSON = typer.Option(False, "--json", help="Print JSON for scripts")
STYLE = {"PENDING": "dim", "READY": "cyan", "RUNNING": "yellow", "COMPLETED": "green",
         "FAILED": "red", "SKIPPED": "magenta", "CANCELLED": "magenta",
         "CREATED": "dim"}  # fmt: skip
FINISHED = ("COMPLETED", "FAILED", "CANCELLED")
a = pb.apiary_pb2


def _fail(text: str, code: int = 1) -> typer.Exit:
    typer.echo(f"apiary workflow: {text}", err=True)
    return typer.Exit(code)


def _call(address: str, call: Callable[[Client], Awaitable[T]]) -> T:
    """`call` with a client of `address`; a refusal says `apiary workflow: ...` (or that the
    coordinator cannot be reached) and ends the command with exit code 1."""
    return run_client("workflow", address, call)


def _load(path: Path) -> pb.workflow_pb2.WorkflowDefinition:
    try:
        text = path.read_text(encoding="utf-8")
        doc = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
    except (OSError, ValueError) as exc:
        raise _fail(f"cannot read {path}: {exc}", 2) from None
    try:
        return definition_to_proto(spec_from_json(doc))
    except ApiaryError as exc:
        raise _fail(f"{path}: {exc.message}", 2) from None


def _data(text: str) -> str:
    """--data: JSON text, or @FILE."""
    if text.startswith("@"):
        try:
            return Path(text[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise _fail(f"cannot read {text[1:]}: {exc}", 2) from None
    return text


def _pairs(items: list[str]) -> dict[str, str]:
    found = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _fail(f"--meta takes KEY=VALUE, not {item!r}", 2)
        found[key] = value
    return found


def _when(ts: Any) -> str:
    if not ts.seconds and not ts.nanos:
        return ""
    return utc_text(ts.seconds, TIME)


def _as_dict(state: pb.workflow_pb2.WorkflowState) -> dict[str, Any]:
    found: dict[str, Any] = json_format.MessageToDict(state, preserving_proto_field_name=True)
    return found


def render(state: pb.workflow_pb2.WorkflowState) -> Group:
    """The workflow's status line and one row per node."""
    status = state.metadata.get("status", "")
    table = Table(show_edge=False, pad_edge=False)
    for column in ("node", "status", "started", "completed", "output / error"):
        table.add_column(column)
    for node_id, node in state.node_states.items():
        name = w.NodeStatus.Name(node.status)
        detail = node.error or node.output
        table.add_row(
            node_id, Text(name, style=STYLE.get(name, "")), _when(node.started_at),
            _when(node.completed_at), detail if len(detail) <= 60 else detail[:57] + "...",
        )  # fmt: skip
    counts: dict[str, int] = {}
    for node in state.node_states.values():
        name = w.NodeStatus.Name(node.status)
        counts[name] = counts.get(name, 0) + 1
    summary = ", ".join(f"{n} {k.lower()}" for k, n in counts.items())
    style = {"COMPLETED": "green", "FAILED": "red", "CANCELLED": "magenta"}.get(status, "yellow")
    head = Text.assemble((f"{state.workflow_id} ", "bold"), (status, style), f"  {summary}")
    return Group(head, table)


def _finish(state: pb.workflow_pb2.WorkflowState, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(_as_dict(state), indent=2))
    else:
        console_for_output().print(render(state))


def _watch(address: str, workflow_id: str, interval: float, as_json: bool) -> None:
    """Show the nodes live until the workflow finishes; exit 1 unless it COMPLETED."""

    async def follow(client: Client) -> pb.workflow_pb2.WorkflowState:
        request = w.GetWorkflowStateRequest(workflow_id=workflow_id)
        state: pb.workflow_pb2.WorkflowState = (
            await client.workflow.GetWorkflowState(request)
        ).state
        with Live(render(state), console=Console(stderr=as_json), transient=as_json) as live:
            while state.metadata.get("status") not in FINISHED:
                await asyncio.sleep(interval)
                state = (await client.workflow.GetWorkflowState(request)).state
                live.update(render(state))
        return state

    state = _call(address, follow)
    if as_json:
        typer.echo(json.dumps(_as_dict(state), indent=2))
    if state.metadata.get("status") != "COMPLETED":
        raise typer.Exit(1)


@app.command()
def create(
    file: Path = typer.Argument(..., help="Definition file (.json or .toml)"),
    workflow_id: str = typer.Option("", "--id", help="Override the file's workflow_id"),
    grpc_address: str = COORDINATOR,
    as_json: bool = AS_JSON,
) -> None:
    """Validate and register a workflow definition (CreateWorkflow)."""
    definition = _load(file)
    if workflow_id:
        definition.workflow_id = workflow_id
    request = w.CreateWorkflowRequest(definition=definition)
    reply = _call(grpc_address, lambda c: c.workflow.CreateWorkflow(request))
    if as_json:
        typer.echo(json.dumps({"workflow_id": reply.workflow_id, "nodes": len(definition.nodes)}))
    else:
        typer.echo(f"created workflow {reply.workflow_id} ({len(definition.nodes)} nodes)")


@app.command()
def start(
    workflow_id: str = typer.Argument(..., help="The workflow to start"),
    data: str = typer.Option("", "--data", help="Initial workflow_data: JSON, or @FILE"),
    meta: list[str] = typer.Option([], "--meta", help="KEY=VALUE run metadata (repeatable)"),
    watch: bool = typer.Option(False, "--watch", help="Show progress until it finishes"),
    interval: float = typer.Option(0.5, "--interval", help="Seconds between refreshes"),
    grpc_address: str = COORDINATOR,
    as_json: bool = AS_JSON,
) -> None:
    """Start a workflow with its initial data (StartWorkflow)."""
    request = w.StartWorkflowRequest(
        workflow_id=workflow_id, workflow_data=_data(data), metadata=_pairs(meta)
    )
    reply = _call(grpc_address, lambda c: c.workflow.StartWorkflow(request))
    if watch:
        _watch(grpc_address, workflow_id, interval, as_json)
    else:
        _finish(reply.state, as_json)


@app.command()
def status(
    workflow_id: str = typer.Argument(..., help="The workflow whose state to show"),
    watch: bool = typer.Option(False, "--watch", help="Follow until the workflow finishes"),
    interval: float = typer.Option(0.5, "--interval", help="Seconds between refreshes"),
    grpc_address: str = COORDINATOR,
    as_json: bool = AS_JSON,
) -> None:
    """Show the nodes' states, timestamps, outputs and errors (GetWorkflowState)."""
    if watch:
        _watch(grpc_address, workflow_id, interval, as_json)
        return
    request = w.GetWorkflowStateRequest(workflow_id=workflow_id)
    reply = _call(grpc_address, lambda c: c.workflow.GetWorkflowState(request))
    _finish(reply.state, as_json)


@app.command()
def resume(
    workflow_id: str = typer.Argument(..., help="The workflow to resume"),
    node: str = typer.Option(
        "", "--node", help="Fire or re-run this node (default: every failed and skipped node)"
    ),
    data: str = typer.Option("", "--data", help="JSON merged into workflow_data, or @FILE"),
    meta: list[str] = typer.Option([], "--meta", help="KEY=VALUE run metadata (repeatable)"),
    grpc_address: str = COORDINATOR,
    as_json: bool = AS_JSON,
) -> None:
    """Continue a workflow from a node (ResumeWorkflow): MANUAL triggers, recovery, reruns."""
    request = w.ResumeWorkflowRequest(
        workflow_id=workflow_id, node_id=node, workflow_data=_data(data), metadata=_pairs(meta)
    )
    reply = _call(grpc_address, lambda c: c.workflow.ResumeWorkflow(request))
    _finish(reply.state, as_json)


def _stamp(ts: Any) -> str:
    """A Timestamp as UTC date and time; empty when unset."""
    if not ts.seconds and not ts.nanos:
        return ""
    return utc_text(ts.seconds)


def _reply_doc(reply: Any) -> str:
    doc = json_format.MessageToDict(
        reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return json.dumps(doc, indent=2)


@app.command("list")
def list_workflows(
    state: list[str] = typer.Option(
        [], "--state", "-s", help="Only CREATED, RUNNING, COMPLETED, FAILED or CANCELLED (repeat)"
    ),
    after: str = typer.Option("", "--after", help="Start after this workflow id (paging)"),
    limit: int = typer.Option(100, "--limit", min=1, max=1000, help="Workflows per page"),
    grpc_address: str = COORDINATOR,
    as_json: bool = AS_JSON,
) -> None:
    """Workflows by id: state, nodes done of all, when started and last updated."""
    request = a.ListWorkflowsRequest(states=state, after_id=after, limit=limit)
    reply = _call(grpc_address, lambda c: c.workflow_query.ListWorkflows(request))
    if as_json:
        typer.echo(_reply_doc(reply))
        return
    table = Table(title=f"Workflows ({len(reply.workflows)})")
    for column in ("id", "state", "nodes done", "started (UTC)", "updated (UTC)"):
        table.add_column(column)
    for item in reply.workflows:
        table.add_row(
            item.workflow_id, Text(item.state, style=STYLE.get(item.state, "")),
            f"{item.nodes_done}/{item.nodes_total}", _stamp(item.started_at),
            _stamp(item.updated_at),
        )  # fmt: skip
    console_for_output().print(table)
    if reply.next_after_id:
        typer.echo(f"more follow: --after {reply.next_after_id}", err=True)


@app.command()
def cancel(
    workflow_id: str = typer.Argument(..., help="The workflow to cancel"),
    reason: str = typer.Option("", "--reason", help="Why (kept in the cancelled nodes' errors)"),
    grpc_address: str = COORDINATOR,
    as_json: bool = AS_JSON,
) -> None:
    """Cancel a workflow that has not finished (CancelWorkflow): its unfinished nodes end and
    their queued tasks are cancelled; it can be neither started nor resumed afterwards."""
    request = a.CancelWorkflowRequest(workflow_id=workflow_id, reason=reason)
    state = _call(grpc_address, lambda c: c.workflow_query.CancelWorkflow(request))
    _finish(state, as_json)


@app.command()
def history(
    workflow_id: str = typer.Argument(..., help="The workflow whose run to show"),
    after: int = typer.Option(0, "--after", min=0, help="After this event sequence (paging)"),
    limit: int = typer.Option(100, "--limit", min=1, max=1000, help="Events per page"),
    event_type: list[str] = typer.Option(
        [], "--type", help="Only this event type (repeat); `workflow.` means every workflow.*"
    ),
    grpc_address: str = COORDINATOR,
    as_json: bool = AS_JSON,
) -> None:
    """The run's events from the event log, oldest first (WorkflowHistory)."""
    request = a.WorkflowHistoryRequest(
        workflow_id=workflow_id, after_sequence=after, limit=limit, event_types=event_type
    )
    reply = _call(grpc_address, lambda c: c.workflow_query.WorkflowHistory(request))
    if as_json:
        typer.echo(_reply_doc(reply))
        return
    table = Table(title=f"{workflow_id}: {len(reply.events)} events")
    for column in ("seq", "time (UTC)", "type", "node", "actor", "details"):
        table.add_column(column)
    for event in reply.events:
        details = json.loads(event.details_json or "{}")
        node = str(details.pop("node_id", "")) if isinstance(details, dict) else ""
        if isinstance(details, dict):
            details.pop("workflow_id", None)
        text = json.dumps(details, separators=(",", ":"), ensure_ascii=False)
        table.add_row(
            str(event.sequence), _stamp(event.ts), event.event_type, node, event.actor,
            text if len(text) <= 80 else text[:77] + "...",
        )  # fmt: skip
    console_for_output().print(table)
    if reply.next_after_sequence:
        typer.echo(f"more follow: --after {reply.next_after_sequence}", err=True)
