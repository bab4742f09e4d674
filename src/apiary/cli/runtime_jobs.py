"""`apiary runtime job create|get|cancel`: the control plane's job commands
(docs/control-plane.md) on the `apiary runtime` app, through the SDK's RuntimeClient. Each
prints the job as it stands after the command (JSON), or, with `--wait`, once it ended (exit
1 when it did not complete, or for `cancel`, was not cancelled)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

import typer

from apiary.cli.calls import PROFILE
from apiary.cli.runtime_tasks import KEY, REASON, TIMEOUT, Run, json_option, show_after
from apiary.sdk.runtime import RuntimeClient
from apiary.sdk.runtime_jobs import JobInfo

JOB = typer.Argument(..., help="The job")
WAIT = typer.Option(False, "--wait", help="Wait until every item has ended; print the job then")


def _document(job: JobInfo) -> dict[str, Any]:
    return {**{k: v for k, v in asdict(job).items() if k != "extra"}, **job.extra}


def _items(items_json: str, item: list[str]) -> list[dict[str, Any]]:
    found: list[Any] = list(json_option(items_json, "--items") or [])
    found += [json_option(text, "--item") for text in item]
    if not found:
        typer.echo("apiary runtime job create: give --items or --item", err=True)
        raise typer.Exit(2)
    return found


def register(app: typer.Typer, run: Run, http_option: Any, jsonrpc_option: Any) -> None:
    """Add `job` (create, get, cancel) to `app`; `run(program, http, jsonrpc, call)` runs a
    call."""
    jobs = typer.Typer(help="Jobs: batches of agent tasks (create, get, cancel)")
    app.add_typer(jobs, name="job")

    def show(
        program: str, http: str, jsonrpc: bool,
        call: Callable[[RuntimeClient], Awaitable[JobInfo]], wait: bool = False,
        timeout: float = 0, fine: str = "completed",
    ) -> None:  # fmt: skip
        async def settle(client: RuntimeClient, job: JobInfo) -> JobInfo:
            return await client.wait_job(job.job_id, timeout=timeout or None)

        show_after(
            run, program, http, jsonrpc, call, settle=settle if wait else None,
            document=_document, failed=lambda j: j.status != fine,
        )  # fmt: skip

    @jobs.command("create")
    def create(
        items_json: str = typer.Option("", "--items", help="Its items (a JSON array)"),
        item: list[str] = typer.Option([], "--item", help="One item (a JSON object)"),
        agent: str = typer.Option("", "--agent", help="The agent its items run on"),
        capability: str = typer.Option("", "--capability", help="Or a capability queue"),
        title: str = typer.Option("", "--title", help="What the job is called"),
        objective: str = typer.Option("", "--objective", help="What its items are to achieve"),
        job_id: str = typer.Option("", "--job-id", help="Its id (an idempotency key)"),
        session: str = typer.Option("", "--session", help="Its session (default: a new one)"),
        parent: str = typer.Option("", "--parent", help="A task whose cancel cancels it"),
        wait: bool = WAIT,
        timeout: float = TIMEOUT,
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """Create a job: its items (each: task_id, agent_id, title, objective, input) are
        agent tasks, started at once."""
        given = _items(items_json, item)

        def call(client: RuntimeClient) -> Awaitable[JobInfo]:
            return client.create_job(
                given, job_id=job_id, agent_id=agent, capability=capability,
                session_id=session, title=title, objective=objective, parent_task_id=parent,
            )  # fmt: skip

        show("job create", http, jsonrpc, call, wait, timeout)

    @jobs.command("get")
    def get(
        job_id: str = JOB,
        wait: bool = WAIT,
        timeout: float = TIMEOUT,
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """A job: its status, and each item's own status and output."""
        show("job get", http, jsonrpc, lambda c: c.get_job(job_id), wait, timeout)

    @jobs.command("cancel")
    def cancel(
        job_id: str = JOB,
        reason: str = REASON,
        key: str = KEY,
        wait: bool = WAIT,
        timeout: float = TIMEOUT,
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """Cancel a job: the intent first, then its items not ended (completed ones stay)."""
        show(
            "job cancel", http, jsonrpc,
            lambda c: c.cancel_job(job_id, reason=reason, idempotency_key=key), wait, timeout,
            "cancelled",
        )  # fmt: skip
