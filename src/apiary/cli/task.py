"""`apiary task submit|wait|status|list|show|cancel|preempt`: Scheduler tasks (RFC 7, 9),
submitted through TaskQueryService.SubmitTask, whose handle gives the result back
(`--wait`, `apiary task wait`)."""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import typer
from google.protobuf import json_format
from rich.table import Table

from apiary.cli.calls import COORDINATOR, run_client
from apiary.cli.output import console_for_output, stamp_text
from apiary.core.tasks.result import decode_result
from apiary.sdk.client import Client
from apiary.sdk.errors import TaskFailedError, TaskHeldError, TaskTimeoutError
from apiary.sdk.task_handle import TaskHandle, TaskStatus
from apiary.wire import pb

app = typer.Typer(no_args_is_help=True)  # help: cli/main.py SUBCOMMANDS
T = TypeVar("T")
JSON_OUT = typer.Option(False, "--json", help="JSON instead of a table")
a = pb.apiary_pb2
s = pb.scheduler_pb2


def _run(address: str, call: Callable[[Client], Awaitable[T]], token: str = "") -> T:
    return run_client("task", address, call, token=token)


def task_doc(view: a.TaskView, *, params: bool = False) -> dict[str, Any]:
    """A task as JSON (its params decoded when they are JSON or text)."""
    doc = json_format.MessageToDict(
        view, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    doc.pop("params", None)
    for key in ("seq", "params_size", "result_size"):  # 64-bit integers are strings in JSON
        doc[key] = int(doc.get(key, 0))
    text = doc.pop("result_json", "")
    if text:
        doc["result"] = decode_result(text)
    if params:
        data = bytes(view.params)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            doc["params_base64"] = base64.b64encode(data).decode()
        else:
            doc["params"] = json.loads(text) if view.content_type.endswith("json") else text
    return doc


def _table(views: list[a.TaskView]) -> None:
    table = Table(title=f"Tasks ({len(views)})")
    for column in ("seq", "id", "agent", "state", "priority", "lane", "attempts", "updated (UTC)",
                   "note"):  # fmt: skip
        table.add_column(column, overflow="fold")
    for v in views:
        # A shared task: its queue, and the agent holding it (when one does).
        agent = f"{v.agent_id} ({v.queue})" if v.queue and v.agent_id else v.queue or v.agent_id
        note = f"{v.error_code}: {v.note}" if v.error_code and v.note else v.error_code or v.note
        table.add_row(
            str(v.seq), v.task_id, agent, v.state, str(v.priority), v.lane,
            str(v.attempts), stamp_text(v.updated_at), note,
        )  # fmt: skip
    console_for_output().print(table)


WAIT_TIMEOUT = typer.Option(
    None, "--timeout", min=0, help="Seconds to wait at most (default: until it ends)"
)


@dataclass(frozen=True, slots=True)
class _Waited:
    """How a wait for a task's result ended: its value, or why there is none."""

    task_id: str
    value: Any = None
    failure: str = ""
    """Set: the line to print instead of a value."""


async def _wait(handle: TaskHandle, timeout: float | None) -> _Waited:  # noqa: ASYNC109
    try:
        return _Waited(handle.task_id, await handle.result(timeout=timeout))
    except TaskFailedError as exc:
        return _Waited(handle.task_id, failure=f"failed: {exc.error_code}: {exc.message}")
    except TaskHeldError as exc:
        return _Waited(handle.task_id, failure=f"still HELD: {exc.reason}")
    except TaskTimeoutError as exc:
        return _Waited(handle.task_id, failure=f"still {exc.state} after {timeout} s")


def _print_result(waited: _Waited) -> None:
    """The result as JSON on stdout; a failure or timeout on stderr, exit 1."""
    if waited.failure:
        typer.echo(f"apiary task: task {waited.task_id} {waited.failure}", err=True)
        raise typer.Exit(1)
    typer.echo(json.dumps(waited.value))


@app.command()
def submit(
    agent_id: str = typer.Argument(
        "", help="The agent that runs it (or give --capability or --agent-type instead)"
    ),
    scope: str = typer.Option(..., "--scope", help="What it reads or changes: repo:app path:src"),
    capability: str = typer.Option(
        "", "--capability", help="Any agent offering this capability takes it (a shared queue)"
    ),
    agent_type: str = typer.Option(
        "", "--agent-type", help="Any agent of this type (its descriptor name) takes it"
    ),
    params: str = typer.Option("{}", "--params", help="Its payload (JSON unless --content-type)"),
    params_file: Path | None = typer.Option(
        None, "--params-file", exists=True, dir_okay=False, help="Its payload, from a file"
    ),
    content_type: str = typer.Option("", "--content-type", help="Default application/json"),
    priority: int = typer.Option(0, "--priority", help="-19 (most urgent) to 20"),
    task_id: str = typer.Option(
        "", "--id", help="Default: one the coordinator assigns. Submitting the same task under "
        "its id again is that task; other content under it is refused (task_id_conflict)"
    ),
    wait: bool = typer.Option(False, "--wait", help="Wait for the result and print it as JSON"),
    timeout: float | None = WAIT_TIMEOUT,
    grpc_address: str = COORDINATOR,
) -> None:  # fmt: skip
    """Submit a task to an agent, or to the shared queue of a capability or an agent type;
    prints its id, or with --wait its result (exit 1 when refused, failed or still not ended
    after --timeout, with the reason)."""
    named = [n for n, v in (("AGENT_ID", agent_id), ("--capability", capability),
                            ("--agent-type", agent_type)) if v]  # fmt: skip
    if len(named) != 1:
        why = "name who runs it" if not named else f"{' and '.join(named)} both name who runs it"
        typer.echo(f"apiary task: {why}: give AGENT_ID, --capability or --agent-type", err=True)
        raise typer.Exit(2)
    data = params_file.read_bytes() if params_file is not None else params.encode()
    kind = content_type or ("application/json" if data else "")
    if kind.endswith("json") and data:
        try:
            json.loads(data)
        except ValueError as exc:
            typer.echo(f"apiary task: --params is not JSON: {exc}", err=True)
            raise typer.Exit(2) from None

    async def go(c: Client) -> tuple[TaskHandle, _Waited | None]:
        handle = await c.submit_task(
            agent_id, data, scope=scope, task_id=task_id, priority=priority, content_type=kind,
            capability=capability, agent_type=agent_type,
        )  # fmt: skip
        return handle, await _wait(handle, timeout) if wait else None

    handle, waited = _run(grpc_address, go)
    submitted = handle.submitted
    where = f"{submitted.state}: {handle.reason}" if submitted else handle.reason
    again = "" if handle.created else " (submitted before)"
    if waited is None:
        typer.echo(handle.task_id)
        typer.echo(f"{where}{again}", err=True)
        return
    typer.echo(f"task {handle.task_id}{again}: {where}", err=True)
    _print_result(waited)


@app.command("wait")
def wait_task(
    task_id: str = typer.Argument(..., help="The task's id"),
    timeout: float | None = WAIT_TIMEOUT,
    grpc_address: str = COORDINATOR,
) -> None:
    """Wait for a task's result and print it as JSON (exit 1 when it failed or has not
    ended after --timeout, with the reason: its error, or why it is HELD)."""
    _print_result(_run(grpc_address, lambda c: _wait(c.task(task_id), timeout)))


@app.command()
def status(
    task_id: str = typer.Argument(..., help="The task's id"), grpc_address: str = COORDINATOR
) -> None:
    """Where a task stands, in one line: its state and why (a HELD task's HITL invocation
    and the job it duplicates)."""
    found: TaskStatus = _run(grpc_address, lambda c: c.task(task_id).status())
    why = f": {found.reason}" if found.reason else ""
    typer.echo(f"{found.task_id} {found.state}{why}")


@app.command("list")
def list_tasks(
    state: list[str] = typer.Option([], "--state", "-s", help="QUEUED, RUNNING, ... (repeat)"),
    agent_id: str = typer.Option("", "--agent", help="Only this agent's tasks"),
    queue: str = typer.Option(
        "", "--queue", help="Only this shared queue's: capability:NAME or agent_type:NAME"
    ),
    after: int | None = typer.Option(None, "--after", min=0, help="After this seq (paging)"),
    limit: int = typer.Option(100, "--limit", min=1, max=1000, help="Tasks per page"),
    as_json: bool = JSON_OUT,
    grpc_address: str = COORDINATOR,
) -> None:
    """Tasks in submission order."""
    request = a.ListTasksRequest(states=state, agent_id=agent_id, limit=limit, queue=queue)
    if after is not None:
        request.after_seq = after
    views = list(_run(grpc_address, lambda c: c.task_query.ListTasks(request)).tasks)
    if as_json:
        for v in views:
            typer.echo(json.dumps(task_doc(v)))
        return
    _table(views)
    if len(views) == limit:
        typer.echo(f"more may follow: --after {views[-1].seq}", err=True)


@app.command()
def show(
    task_id: str = typer.Argument(..., help="The task's id"), grpc_address: str = COORDINATOR
) -> None:
    """One task as JSON, its params included."""
    view = _run(grpc_address, lambda c: c.task_query.GetTask(a.GetTaskRequest(task_id=task_id)))
    typer.echo(json.dumps(task_doc(view, params=True), indent=2))


@app.command()
def cancel(
    task_id: str = typer.Argument(..., help="The task to cancel"),
    reason: str = typer.Option("", "--reason", help="Why (kept in the task's note)"),
    token: str = typer.Option("", "--token", envvar="APIARY_TOKEN",
                              help="Operator token (or APIARY_TOKEN) when operators are set up"),
    grpc_address: str = COORDINATOR,
) -> None:  # fmt: skip
    """Cancel a task that has not started (QUEUED, HELD, or DISPATCHED and waiting at its
    agent unread): it ends FAILED, `cancelled` (a waiting one once its agent gives it back)."""
    request = a.CancelTaskRequest(task_id=task_id, reason=reason)
    view = _run(grpc_address, lambda c: c.task_query.CancelTask(request), token)
    if view.state == "DISPATCHED":
        typer.echo(f"{view.task_id}: DISPATCHED (asked back from {view.agent_id}: it ends "
                   "cancelled once the agent gives it back)")  # fmt: skip
        return
    typer.echo(f"{view.task_id}: {view.state} ({view.error_code}: {view.note})")


@app.command()
def preempt(
    agent_id: str = typer.Argument(..., help="The agent whose running task should yield"),
    task_id: str = typer.Option("", "--task", help="Only if this task is the one running"),
    reason: str = typer.Option("operator", "--reason", help="Why, told to the agent"),
    grpc_address: str = COORDINATOR,
) -> None:
    """Ask the agent to yield its running task at its next safe point (RFC 7.2)."""
    request = s.PreemptRequest(agent_id=agent_id, task_id=task_id, reason=reason)
    reply = _run(grpc_address, lambda c: c.scheduler.RequestPreemption(request))
    typer.echo("preemption requested" if reply.enqueued else "nothing to preempt")
