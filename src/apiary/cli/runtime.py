"""`apiary runtime ...`: the runtime control plane (docs/control-plane.md) of a coordinator,
over its HTTP port, through the SDK's RuntimeClient: submit turns to an agent's thread,
interrupt them, read sessions, threads and tasks, follow a session's events; create and
drive agent tasks (cli/runtime_tasks.py) and jobs (cli/runtime_jobs.py).

The HTTP address is the first of `--http`, `APIARY_HTTP`, the address a running
`apiary serve` recorded in the data directory (APIARY_DATA_DIR or ./.apiary), else
127.0.0.1:8080; calls present the client credentials (`--profile`, APIARY_API_KEY, ...)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import typer
from rich.table import Table

from apiary.cli.calls import PROFILE, refusal
from apiary.cli.output import console_for_output
from apiary.cli.runtime_exports import register as register_export_commands
from apiary.cli.runtime_jobs import register as register_job_commands
from apiary.cli.runtime_permissions import register as register_permission_commands
from apiary.cli.runtime_processes import register as register_process_commands
from apiary.cli.runtime_tasks import register as register_task_commands
from apiary.cli.serving import client_data_dir, recorded
from apiary.core.runtime.snapshot import RuntimeSnapshot
from apiary.errors import ApiaryError
from apiary.sdk.runtime import RuntimeClient, StreamSnapshot, Transport

app = typer.Typer(no_args_is_help=True)  # help: cli/main.py SUBCOMMANDS
T = TypeVar("T")
HTTP_ENV: Final = "APIARY_HTTP"
DEFAULT_HTTP: Final = "127.0.0.1:8080"
HTTP = typer.Option(
    "", "--http", metavar="HOST:PORT",
    help=f"The coordinator's HTTP address [else {HTTP_ENV}, the address `apiary serve` "
    f"recorded in the data directory, else {DEFAULT_HTTP}]",
)  # fmt: skip
JSONRPC = typer.Option(False, "--jsonrpc", help="Call through the JSON-RPC 2.0 endpoint")
JSON_OUT = typer.Option(False, "--json", help="JSON instead of a table")
QUEUE_POLICY = typer.Option(
    "", "--queue-policy", metavar="queue|reject",
    help="A new thread's policy for turns while it is busy [queue]",
)  # fmt: skip


def http_address(given: str = "") -> str:
    """The HTTP address (see the module docstring), as a URL when it is known to use TLS."""
    if given:
        return given
    named = os.environ.get(HTTP_ENV, "")
    if named:
        return named
    serving = recorded(client_data_dir())
    if serving is not None:
        return serving.http_url
    return DEFAULT_HTTP


def _run(
    program: str, http: str, jsonrpc: bool, call: Callable[[RuntimeClient], Awaitable[T]]
) -> T:
    address = http_address(http)

    async def go() -> T:
        transport: Transport = "jsonrpc" if jsonrpc else "http"
        async with RuntimeClient(address, transport=transport) as client:
            return await call(client)

    try:
        return asyncio.run(go())
    except ApiaryError as exc:
        typer.echo(refusal(f"runtime {program}", exc, address=address), err=True)
        raise typer.Exit(1) from None


def _print_json(doc: object) -> None:
    typer.echo(json.dumps(doc, indent=2, ensure_ascii=False))


@app.command()
def submit(
    text: str = typer.Argument(..., help="The turn's input: text, or JSON with --input-json"),
    agent: str = typer.Option("", "--agent", help="The agent a new thread is bound to"),
    capability: str = typer.Option(
        "", "--capability", help="Or the capability queue a new thread is bound to"
    ),
    session: str = typer.Option("", "--session", help="The session (default: a new one)"),
    thread: str = typer.Option("", "--thread", help="The thread (default: a new one)"),
    turn_id: str = typer.Option(
        "", "--turn-id", help="The turn's id: submitting it again is the same turn"
    ),
    input_json: bool = typer.Option(False, "--input-json", help="Read the input as JSON"),
    queue_policy: str = QUEUE_POLICY,
    wait: bool = typer.Option(False, "--wait", help="Wait for the turn to end; print its result"),
    timeout: float = typer.Option(0, "--timeout", min=0, help="With --wait: seconds at most"),
    http: str = HTTP,
    jsonrpc: bool = JSONRPC,
    as_json: bool = JSON_OUT,
    profile: str = PROFILE,
) -> None:
    """Submit a turn to a thread; it runs as a task of the thread's agent."""
    value: Any = text
    if input_json:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            typer.echo(f"apiary runtime submit: TEXT is not JSON: {exc}", err=True)
            raise typer.Exit(2) from None

    async def call(client: RuntimeClient) -> dict[str, Any]:
        turn = await client.submit_turn(
            value, agent_id=agent, session_id=session, thread_id=thread, turn_id=turn_id,
            queue_policy=queue_policy or None, capability=capability,
        )  # fmt: skip
        shown: dict[str, Any] = {
            "created": turn.created, "session_id": turn.session_id,
            "thread_id": turn.thread_id, "turn_id": turn.turn_id, "task_id": turn.task_id,
            "status": turn.status,
        }  # fmt: skip
        if wait:
            ended = await client.wait_turn(turn.session_id, turn.turn_id, timeout=timeout or None)
            shown.update(status=ended.status, result=ended.result, error=dict(ended.error))
        return shown

    shown = _run("submit", http, jsonrpc, call)
    if as_json:
        _print_json(shown)
        return
    for key, item in shown.items():
        typer.echo(f"{key}: {json.dumps(item) if not isinstance(item, str) else item}")
    if wait and shown["status"] != "completed":
        raise typer.Exit(1)


KEY = typer.Option("", "--idempotency-key", help="A retry with the same key does nothing again")


@app.command()
def interrupt(
    thread: str = typer.Argument(..., help="The thread whose running turn to stop"),
    turn: str = typer.Option("", "--turn", help="Stop this turn instead (a queued one too)"),
    clear_queue: bool = typer.Option(
        False, "--clear-queue", help="Cancel the thread's queued turns as well"
    ),
    reason: str = typer.Option("", "--reason", help="Why (recorded with the interrupt)"),
    keep_subagents: bool = typer.Option(
        False, "--keep-subagents", help="Leave the subagents spawned with the turn running"
    ),
    idempotency_key: str = KEY,
    http: str = HTTP,
    jsonrpc: bool = JSONRPC,
    profile: str = PROFILE,
) -> None:
    """Interrupt a turn: a queued one is cancelled, a started one's task cancelled or
    asked to stop; the subagents spawned with it are closed."""

    async def call(client: RuntimeClient) -> dict[str, Any]:
        return await client.interrupt_turn(
            thread_id=thread, turn_id=turn, clear_queue=clear_queue, reason=reason,
            close_subagents=not keep_subagents, idempotency_key=idempotency_key,
        )  # fmt: skip

    _print_json(_run("interrupt", http, jsonrpc, call))


@app.command()
def remove(
    turn: str = typer.Argument(..., help="The queued turn to take out of its thread's queue"),
    reason: str = typer.Option("", "--reason", help="Why (recorded)"),
    idempotency_key: str = KEY,
    http: str = HTTP,
    jsonrpc: bool = JSONRPC,
    profile: str = PROFILE,
) -> None:
    """Remove a queued turn from its thread's queue."""

    async def call(client: RuntimeClient) -> dict[str, Any]:
        return await client.remove_queued_turn(turn, reason=reason, idempotency_key=idempotency_key)

    _print_json(_run("remove", http, jsonrpc, call))


@app.command()
def promote(
    turn: str = typer.Argument(..., help="The queued turn to move ahead"),
    before: str = typer.Option(
        "", "--before", metavar="TURN", help="Move it ahead of this queued turn [the head]"
    ),
    idempotency_key: str = KEY,
    http: str = HTTP,
    jsonrpc: bool = JSONRPC,
    profile: str = PROFILE,
) -> None:
    """Move a queued turn ahead in its thread's queue; prints the queue in its new order."""

    async def call(client: RuntimeClient) -> dict[str, Any]:
        return await client.promote_queued_turn(
            turn, before_turn_id=before, idempotency_key=idempotency_key
        )

    _print_json(_run("promote", http, jsonrpc, call))


@app.command()
def resume(
    thread: str = typer.Argument(..., help="The thread to continue"),
    turn: str = typer.Option(
        "", "--turn", help="Run this turn again if its task was lost [the latest lost one]"
    ),
    reason: str = typer.Option("", "--reason", help="Why (recorded with the resume)"),
    idempotency_key: str = KEY,
    http: str = HTTP,
    jsonrpc: bool = JSONRPC,
    profile: str = PROFILE,
) -> None:
    """Resume a thread explicitly: follow its task when it is still active, run a turn
    whose task was lost again as a new turn, or start what waits (`mode` says which)."""

    async def call(client: RuntimeClient) -> dict[str, Any]:
        return await client.resume_thread(
            thread, turn_id=turn, reason=reason, idempotency_key=idempotency_key
        )

    _print_json(_run("resume", http, jsonrpc, call))


def _threads_table(snapshot: RuntimeSnapshot, title: str) -> None:
    table = Table(title=title)
    for column in ("thread", "agent", "status", "active turn", "queued", "turns"):
        table.add_column(column, overflow="fold")
    for view in snapshot.threads:
        table.add_row(
            view.thread_id, str(view.extra.get("agentId", "")), view.status,
            view.active_turn_id or "", str(len(view.queued_turns or ())),
            str(view.extra.get("turnCount", len(view.turns or ()))),
        )  # fmt: skip
    console_for_output().print(table)


@app.command("session")
def session_(
    session: str = typer.Argument(..., help="The session to read"),
    turns: int = typer.Option(20, "--turns", min=0, help="Last turns shown per thread"),
    http: str = HTTP,
    jsonrpc: bool = JSONRPC,
    as_json: bool = JSON_OUT,
    profile: str = PROFILE,
) -> None:
    """A session's threads, turns and tasks (its snapshot)."""
    read = _run("session", http, jsonrpc, lambda c: c.get_session(session, turns=turns))
    if as_json:
        _print_json({"session": dict(read.session), "snapshot": read.snapshot.to_json(),
                     "cursor": read.cursor})  # fmt: skip
        return
    _threads_table(read.snapshot, f"session {session} (as of event #{read.cursor})")


@app.command("thread")
def thread_(
    thread: str = typer.Argument(..., help="The thread to read"),
    http: str = HTTP,
    jsonrpc: bool = JSONRPC,
    as_json: bool = JSON_OUT,
    profile: str = PROFILE,
) -> None:
    """One thread: status, queue, turns, last outcome and diagnostics."""
    snapshot = _run("thread", http, jsonrpc, lambda c: c.get_thread_read(thread))
    if as_json:
        _print_json(snapshot.to_json())
        return
    view = snapshot.threads[0]
    table = Table(title=f"thread {thread}: {view.status}")
    for column in ("#", "turn", "status", "task", "why"):
        table.add_column(column, overflow="fold")
    for turn in view.turns or ():
        error = turn.extra.get("error") or {}
        table.add_row(
            str(turn.extra.get("ordinal", "")), turn.turn_id, turn.status, turn.task_id or "",
            str(error.get("code") or turn.extra.get("statusReason") or ""),
        )  # fmt: skip
    console_for_output().print(table)
    last = view.extra.get("lastOutcome")
    if last:
        typer.echo(f"last outcome: {json.dumps(last, ensure_ascii=False)}")


@app.command()
def tasks(
    session: str = typer.Option("", "--session", help="The session whose turns' tasks to list"),
    thread: str = typer.Option("", "--thread", help="Only this thread's"),
    http: str = HTTP,
    jsonrpc: bool = JSONRPC,
    as_json: bool = JSON_OUT,
    profile: str = PROFILE,
) -> None:
    """The Apiary tasks that a session's turns run as."""
    found = _run(
        "tasks", http, jsonrpc, lambda c: c.list_tasks(session_id=session, thread_id=thread)
    )
    if as_json:
        _print_json([t.to_json() for t in found])
        return
    table = Table(title=f"tasks ({len(found)})")
    for column in ("task", "turn", "status", "apiary state", "agent", "updated"):
        table.add_column(column, overflow="fold")
    for t in found:
        table.add_row(
            t.task_id, t.turn_id or "", t.status, t.native_status or "",
            str(t.extra.get("agentId", "")), t.updated_at or "",
        )  # fmt: skip
    console_for_output().print(table)


@app.command()
def task(
    task_id: str = typer.Argument(..., help="The task to show"),
    http: str = HTTP,
    jsonrpc: bool = JSONRPC,
    profile: str = PROFILE,
) -> None:
    """One task as the contract shows it, with its result (JSON)."""
    _print_json(_run("task", http, jsonrpc, lambda c: c.get_task(task_id)).to_json())


@app.command()
def events(
    session: str = typer.Argument(..., help="The session whose events to show"),
    channel: str = typer.Option("", "--channel", help="Resume this channel"),
    token: str = typer.Option("", "--token", help="The channel's resume token"),
    after: int = typer.Option(
        -1, "--after", help="Replay after this sequence [the channel's acknowledged one]"
    ),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Go on printing events as they happen, until Ctrl-C"
    ),
    http: str = HTTP,
    jsonrpc: bool = JSONRPC,
    profile: str = PROFILE,
) -> None:
    """A session's snapshot, then its events (one JSON object per line)."""
    position = after if after >= 0 else None

    async def once(client: RuntimeClient) -> None:
        replay = await client.reconnect_channel(
            session, channel_id=channel, resume_token=token,
            last_acknowledged_sequence=position,
        )  # fmt: skip
        _line({"snapshot": replay.snapshot.to_json(), "channel": _channel(replay.channel)})
        for event in replay.events:
            _line(event.to_json())

    async def stream(client: RuntimeClient) -> None:
        async for item in client.events(
            session, channel_id=channel, resume_token=token, after=position
        ):
            if isinstance(item, StreamSnapshot):
                _line({"snapshot": item.snapshot.to_json(), "channel": _channel(item.channel)})
            else:
                _line(item.to_json())

    try:
        _run("events", http, jsonrpc, stream if follow else once)
    except KeyboardInterrupt:
        return


def _channel(info: Any) -> dict[str, Any]:
    shown = {"channel_id": info.channel_id, "acknowledged_sequence": info.acknowledged_sequence}
    if info.resume_token:
        shown["resume_token"] = info.resume_token
    return shown


def _line(doc: object) -> None:
    typer.echo(json.dumps(doc, ensure_ascii=False, separators=(",", ":")))


@app.command()
def ack(
    channel: str = typer.Argument(..., help="The channel"),
    sequence: int = typer.Argument(..., help="Acknowledge every event up to this sequence"),
    token: str = typer.Option(..., "--token", help="The channel's resume token"),
    http: str = HTTP,
    jsonrpc: bool = JSONRPC,
    profile: str = PROFILE,
) -> None:
    """Acknowledge a channel's events (a resume starts after them)."""
    info = _run("ack", http, jsonrpc, lambda c: c.ack_events(channel, token, sequence))
    _print_json(_channel(info) | {"expires_at": info.expires_at})


@app.command()
def commands(
    http: str = HTTP,
    jsonrpc: bool = JSONRPC,
    as_json: bool = JSON_OUT,
    profile: str = PROFILE,
) -> None:
    """The commands of the runtime contract, and which this coordinator serves."""
    listed = _run("commands", http, jsonrpc, lambda c: c.commands())
    if as_json:
        _print_json(listed)
        return
    table = Table(title="runtime commands")
    for column in ("command", "served", "what"):
        table.add_column(column, overflow="fold")
    for item in listed:
        table.add_row(item["command"], "yes" if item["served"] else "designed", item["summary"])
    console_for_output().print(table)


register_task_commands(app, _run, HTTP, JSONRPC)
register_permission_commands(app, _run, HTTP, JSONRPC)
register_export_commands(app, _run, HTTP, JSONRPC)
register_job_commands(app, _run, HTTP, JSONRPC)
register_process_commands(app, _run, HTTP, JSONRPC)
