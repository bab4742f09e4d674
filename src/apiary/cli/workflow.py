"""`apiary workflow create|start|status|resume`: DAG workflows (RFC 17.7; docs/workflows.md).

A definition file is JSON or TOML (by its extension): the `WorkflowDefinition` fields, with
`nodes` an object keyed by node id. `status --watch` (and `start --watch`) shows the nodes'
states live until the workflow finishes, and then exits 0 when it COMPLETED, 1 otherwise.
"""

from __future__ import annotations

import asyncio
import datetime as dt
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

from apiary.core.workflow.definition import spec_from_json
from apiary.errors import ApiaryError
from apiary.sdk import errors
from apiary.sdk.channel import open_channel
from apiary.wire import pb
from apiary.wire.workflow import definition_to_proto

app = typer.Typer(help="Define, run and watch DAG workflows (RFC 17.7).", no_args_is_help=True)
T = TypeVar("T")
w = pb.workflow_pb2
GRPC = typer.Option("127.0.0.1:50051", "--grpc", help="Coordinator HOST:PORT")
AS_JSON = typer.Option(False, "--json", help="Print JSON for scripts")
STYLE = {"PENDING": "dim", "READY": "cyan", "RUNNING": "yellow", "COMPLETED": "green",
         "FAILED": "red", "SKIPPED": "magenta"}  # fmt: skip
Stub = pb.workflow_pb2_grpc.WorkflowServiceStub


def _fail(text: str, code: int = 1) -> typer.Exit:
    typer.echo(f"apiary workflow: {text}", err=True)
    return typer.Exit(code)


def _run(address: str, call: Callable[[Stub], Awaitable[T]]) -> T:
    async def go() -> T:
        async with open_channel(address) as channel:
            return await call(Stub(channel))

    try:
        return asyncio.run(go())
    except ApiaryError as exc:
        field = f" (field {exc.details['field']})" if "field" in exc.details else ""
        raise _fail(f"{exc.code}: {exc.message}{field}") from None


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
    return dt.datetime.fromtimestamp(ts.seconds, dt.UTC).strftime("%H:%M:%S")


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
    style = {"COMPLETED": "green", "FAILED": "red"}.get(status, "yellow")
    head = Text.assemble((f"{state.workflow_id} ", "bold"), (status, style), f"  {summary}")
    return Group(head, table)


def _finish(state: pb.workflow_pb2.WorkflowState, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(_as_dict(state), indent=2))
    else:
        Console().print(render(state))


def _watch(address: str, workflow_id: str, interval: float, as_json: bool) -> None:
    """Show the nodes live until the workflow finishes; exit 1 unless it COMPLETED."""

    async def go() -> pb.workflow_pb2.WorkflowState:
        request = w.GetWorkflowStateRequest(workflow_id=workflow_id)
        async with open_channel(address) as channel:
            stub = Stub(channel)
            state: pb.workflow_pb2.WorkflowState = (
                await errors.call(lambda: stub.GetWorkflowState(request))
            ).state
            with Live(render(state), console=Console(stderr=as_json), transient=as_json) as live:
                while state.metadata.get("status") not in ("COMPLETED", "FAILED"):
                    await asyncio.sleep(interval)
                    state = (await errors.call(lambda: stub.GetWorkflowState(request))).state
                    live.update(render(state))
            return state

    try:
        state = asyncio.run(go())
    except ApiaryError as exc:
        raise _fail(f"{exc.code}: {exc.message}") from None
    if as_json:
        typer.echo(json.dumps(_as_dict(state), indent=2))
    if state.metadata.get("status") != "COMPLETED":
        raise typer.Exit(1)


@app.command()
def create(
    file: Path = typer.Argument(..., help="Definition file (.json or .toml)"),
    workflow_id: str = typer.Option("", "--id", help="Override the file's workflow_id"),
    grpc_address: str = GRPC,
    as_json: bool = AS_JSON,
) -> None:
    """Validate and register a workflow definition (CreateWorkflow)."""
    definition = _load(file)
    if workflow_id:
        definition.workflow_id = workflow_id
    request = w.CreateWorkflowRequest(definition=definition)
    reply = _run(grpc_address, lambda stub: errors.call(lambda: stub.CreateWorkflow(request)))
    if as_json:
        typer.echo(json.dumps({"workflow_id": reply.workflow_id, "nodes": len(definition.nodes)}))
    else:
        typer.echo(f"created workflow {reply.workflow_id} ({len(definition.nodes)} nodes)")


@app.command()
def start(
    workflow_id: str = typer.Argument(...),
    data: str = typer.Option("", "--data", help="Initial workflow_data: JSON, or @FILE"),
    meta: list[str] = typer.Option([], "--meta", help="KEY=VALUE run metadata (repeatable)"),
    watch: bool = typer.Option(False, "--watch", help="Show progress until it finishes"),
    interval: float = typer.Option(0.5, "--interval", help="Seconds between refreshes"),
    grpc_address: str = GRPC,
    as_json: bool = AS_JSON,
) -> None:
    """Start a workflow with its initial data (StartWorkflow)."""
    request = w.StartWorkflowRequest(
        workflow_id=workflow_id, workflow_data=_data(data), metadata=_pairs(meta)
    )
    reply = _run(grpc_address, lambda stub: errors.call(lambda: stub.StartWorkflow(request)))
    if watch:
        _watch(grpc_address, workflow_id, interval, as_json)
    else:
        _finish(reply.state, as_json)


@app.command()
def status(
    workflow_id: str = typer.Argument(...),
    watch: bool = typer.Option(False, "--watch", help="Follow until the workflow finishes"),
    interval: float = typer.Option(0.5, "--interval", help="Seconds between refreshes"),
    grpc_address: str = GRPC,
    as_json: bool = AS_JSON,
) -> None:
    """Show the nodes' states, timestamps, outputs and errors (GetWorkflowState)."""
    if watch:
        _watch(grpc_address, workflow_id, interval, as_json)
        return
    request = w.GetWorkflowStateRequest(workflow_id=workflow_id)
    reply = _run(grpc_address, lambda stub: errors.call(lambda: stub.GetWorkflowState(request)))
    _finish(reply.state, as_json)


@app.command()
def resume(
    workflow_id: str = typer.Argument(...),
    node: str = typer.Option(
        "", "--node", help="Fire or re-run this node (default: every failed and skipped node)"
    ),
    data: str = typer.Option("", "--data", help="JSON merged into workflow_data, or @FILE"),
    meta: list[str] = typer.Option([], "--meta", help="KEY=VALUE run metadata (repeatable)"),
    grpc_address: str = GRPC,
    as_json: bool = AS_JSON,
) -> None:
    """Continue a workflow from a node (ResumeWorkflow): MANUAL triggers, recovery, reruns."""
    request = w.ResumeWorkflowRequest(
        workflow_id=workflow_id, node_id=node, workflow_data=_data(data), metadata=_pairs(meta)
    )
    reply = _run(grpc_address, lambda stub: errors.call(lambda: stub.ResumeWorkflow(request)))
    _finish(reply.state, as_json)
