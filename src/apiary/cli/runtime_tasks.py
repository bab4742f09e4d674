"""`apiary runtime create-task ...`: the control plane's task commands (docs/control-plane.md)
on the `apiary runtime` app, through the SDK's RuntimeClient. Each prints the task as it
stands after the command (JSON), or, for the commands that start a run, waits for it to
settle with `--wait`."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import typer

from apiary.cli.calls import PROFILE
from apiary.core.runtime.snapshot import TaskView
from apiary.sdk.runtime import RuntimeClient

Run = Callable[[str, str, bool, Callable[[RuntimeClient], Awaitable[Any]]], Any]
"""cli/runtime.py's `_run`: (program, http, jsonrpc, call) -> what the call answered."""

T = TypeVar("T")

TASK = typer.Argument(..., help="The task")
REASON = typer.Option("", "--reason", help="Why (recorded with the change)")
KEY = typer.Option("", "--idempotency-key", help="A retry with the same key does nothing again")
WAIT = typer.Option(False, "--wait", help="Wait until no run moves the task; print it then")
TIMEOUT = typer.Option(0, "--timeout", min=0, help="With --wait: seconds at most")


def show_after(
    run: Run, program: str, http: str, jsonrpc: bool, call: Callable[[RuntimeClient], Awaitable[T]],
    *, settle: Callable[[RuntimeClient, T], Awaitable[T]] | None,
    document: Callable[[T], object], failed: Callable[[T], bool],
) -> None:  # fmt: skip
    """Run `call`, then, given `settle`, wait with it for what `call` answered to settle;
    print the result as JSON (`document`), exit 1 when it settled `failed`."""

    async def then(client: RuntimeClient) -> T:
        found = await call(client)
        return found if settle is None else await settle(client, found)

    found: T = run(program, http, jsonrpc, then)
    typer.echo(json.dumps(document(found), indent=2, ensure_ascii=False))
    if settle is not None and failed(found):
        raise typer.Exit(1)


def json_option(text: str, name: str) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        typer.echo(f"apiary runtime: {name} is not JSON: {exc}", err=True)
        raise typer.Exit(2) from None


Show = Callable[..., None]


def register(app: typer.Typer, run: Run, http_option: Any, jsonrpc_option: Any) -> None:
    """Add the task commands to `app`; `run(program, http, jsonrpc, call)` runs a call."""

    def show(
        program: str, http: str, jsonrpc: bool,
        call: Callable[[RuntimeClient], Awaitable[TaskView]], wait: bool = False,
        timeout: float = 0,
    ) -> None:  # fmt: skip
        async def settle(client: RuntimeClient, task: TaskView) -> TaskView:
            return await client.wait_task(task.task_id, timeout=timeout or None)

        show_after(
            run, program, http, jsonrpc, call, settle=settle if wait else None,
            document=TaskView.to_json, failed=lambda t: t.status in ("failed", "cancelled"),
        )  # fmt: skip

    _editing(app, show, http_option, jsonrpc_option)
    _running(app, show, http_option, jsonrpc_option)
    _ending(app, show, http_option, jsonrpc_option)
    _respond(app, run, http_option, jsonrpc_option)


def _editing(app: typer.Typer, show: Show, http_option: Any, jsonrpc_option: Any) -> None:
    @app.command("create-task")
    def create_task(
        title: str = typer.Option("", "--title", help="What the task is called"),
        objective: str = typer.Option("", "--objective", help="What it is to achieve"),
        agent: str = typer.Option("", "--agent", help="The agent its runs go to"),
        capability: str = typer.Option("", "--capability", help="Or a capability queue"),
        input_json: str = typer.Option("", "--input", help="Its input (JSON)"),
        profile_json: str = typer.Option("", "--profile-json", help="Its task profile (JSON)"),
        constraints: str = typer.Option("", "--constraints", help="Its constraints (JSON)"),
        task_id: str = typer.Option("", "--task-id", help="Its id (an idempotency key)"),
        session: str = typer.Option("", "--session", help="Its session (default: a new one)"),
        parent: str = typer.Option("", "--parent", help="Its parent task"),
        depends_on: list[str] = typer.Option([], "--depends-on", help="A task it waits for"),
        start: bool = typer.Option(False, "--start", help="Start its first run at once"),
        wait: bool = WAIT,
        timeout: float = TIMEOUT,
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """Create an agent task (a draft unless --start)."""
        params = {
            "task_id": task_id, "agent_id": agent, "capability": capability,
            "session_id": session, "title": title, "objective": objective,
            "input": json_option(input_json, "--input"),
            "task_profile": json_option(profile_json, "--profile-json"),
            "constraints": json_option(constraints, "--constraints"),
            "parent_task_id": parent, "depends_on": depends_on, "start": start,
        }  # fmt: skip
        show("create-task", http, jsonrpc, lambda c: c.create_task(**params), wait and start,
             timeout)  # fmt: skip

    @app.command("update-task")
    def update_task(
        task_id: str = TASK,
        title: str = typer.Option("", "--title", help="Its new title"),
        objective: str = typer.Option("", "--objective", help="Its new objective"),
        input_json: str = typer.Option("", "--input", help="Its input for the next run (JSON)"),
        agent: str = typer.Option("", "--agent", help="The agent its next run goes to"),
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """Change a task's metadata (its input and agent while no run is in hand)."""
        changes = {k: v for k, v in (("title", title), ("objective", objective),
                                     ("agent_id", agent)) if v}  # fmt: skip
        if input_json:
            changes["input"] = json_option(input_json, "--input")
        show("update-task", http, jsonrpc, lambda c: c.update_task(task_id, **changes))


def _running(app: typer.Typer, show: Show, http_option: Any, jsonrpc_option: Any) -> None:
    def action(name: str, doc: str, starts: bool) -> None:
        method = name.replace("-", "_")

        def command(
            task_id: str = TASK, reason: str = REASON, key: str = KEY, wait: bool = WAIT,
            timeout: float = TIMEOUT, http: str = http_option, jsonrpc: bool = jsonrpc_option,
            profile: str = PROFILE,
        ) -> None:  # fmt: skip
            async def call(c: RuntimeClient) -> TaskView:
                act = getattr(c, method)
                found: TaskView = await act(task_id, reason=reason, idempotency_key=key)
                return found

            show(name, http, jsonrpc, call, wait and starts, timeout)

        command.__doc__ = doc
        app.command(name)(command)

    action("start-task", "Start a draft task's first run.", True)
    action("pause-task", "Pause a task: its run is stopped (the intent recorded first).", False)
    action("resume-task", "Resume a paused task with a new run.", True)
    action("cancel-task", "Cancel a task, its run and its child tasks.", False)
    action("retry-task", "Run a failed or cancelled task again (a new attempt).", True)


def _ending(app: typer.Typer, show: Show, http_option: Any, jsonrpc_option: Any) -> None:
    @app.command("append-task-progress")
    def append_task_progress(
        task_id: str = TASK,
        summary: str = typer.Option("", "--summary", help="What happened so far"),
        phase: str = typer.Option("", "--phase", help="The phase it is in"),
        percent: int = typer.Option(-1, "--percent", min=-1, max=100, help="How far (0-100)"),
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """Record a task's progress."""
        shown = percent if percent >= 0 else None
        show("append-task-progress", http, jsonrpc, lambda c: c.append_task_progress(
            task_id, phase=phase, summary=summary, percent=shown))  # fmt: skip

    @app.command("complete-task")
    def complete_task(
        task_id: str = TASK,
        result: str = typer.Option("", "--result", help="Its result (JSON)"),
        evidence: list[str] = typer.Option([], "--evidence", help="An evidence ref"),
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """Complete a task that has no run in hand, with its result and evidence."""
        given = json_option(result, "--result")
        show("complete-task", http, jsonrpc, lambda c: c.complete_task(
            task_id, result=given, evidence_refs=evidence or None))  # fmt: skip

    @app.command("fail-task")
    def fail_task(
        task_id: str = TASK,
        code: str = typer.Option("", "--code", help="The error code"),
        message: str = typer.Option("", "--message", help="What went wrong"),
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """Fail a task that has no run in hand."""
        show("fail-task", http, jsonrpc, lambda c: c.fail_task(
            task_id, error_code=code, message=message))  # fmt: skip

    def edge(name: str, remove: bool) -> None:
        def command(
            task_id: str = TASK,
            target: str = typer.Argument(..., help="The other end of the edge"),
            kind: str = typer.Option(
                "dependency", "--kind",
                help="parent, child, dependency, source, artifact, evidence or subagent",
            ),
            http: str = http_option,
            jsonrpc: bool = jsonrpc_option,
            profile: str = PROFILE,
        ) -> None:  # fmt: skip
            async def call(c: RuntimeClient) -> TaskView:
                if remove:
                    return await c.unlink_tasks(task_id, target, kind=kind)
                return await c.link_tasks(task_id, target, kind=kind)

            show(name, http, jsonrpc, call)

        command.__doc__ = "Remove a task's edge (kept as removed)." if remove else (
            "Add an edge from a task to another (or to an artifact, evidence, source)."
        )  # fmt: skip
        app.command(name)(command)

    edge("link-tasks", remove=False)
    edge("unlink-tasks", remove=True)


def _respond(app: typer.Typer, run: Run, http_option: Any, jsonrpc_option: Any) -> None:
    @app.command("respond")
    def respond(
        action_id: str = typer.Argument(..., help="The action (action.required's actionId)"),
        decision: str = typer.Argument(..., help="approve, deny, modify, defer (or its own)"),
        rationale: str = typer.Option("", "--rationale", help="Why (recorded)"),
        patch: str = typer.Option("", "--patch", help="With modify: the change (JSON)"),
        key: str = KEY,
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """Decide an action a turn or task waits on."""
        given = json_option(patch, "--patch")
        answer = run(
            "respond", http, jsonrpc,
            lambda c: c.respond_action(
                action_id, decision, rationale=rationale, patch=given, idempotency_key=key
            ),
        )  # fmt: skip
        typer.echo(json.dumps(answer, indent=2, ensure_ascii=False))
