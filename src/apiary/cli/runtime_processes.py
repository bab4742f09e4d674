"""`apiary runtime process write|terminate`: the control plane's process commands
(docs/control-plane.md, "Processes") on the `apiary runtime` app, through the SDK's
RuntimeClient. Each prints the command's answer (JSON); a process the runtime does not
know, or one that has ended, is refused (unavailable, exit 1)."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

from apiary.cli.calls import PROFILE
from apiary.cli.runtime_tasks import KEY, Run


def register(app: typer.Typer, run: Run, http_option: Any, jsonrpc_option: Any) -> None:
    """Add `process` (write, terminate) to `app`; `run(program, http, jsonrpc, call)` runs
    one call."""
    process = typer.Typer(
        help="Write to or terminate a running process (a tool call of a thread's agent).",
        no_args_is_help=True,
    )
    app.add_typer(process, name="process")

    @process.command("write")
    def write(
        process_id: str = typer.Argument(..., help="The process (its processId: the call id)"),
        text: str = typer.Argument(
            None, help="What to write (add a line feed with --line); none: read standard input"
        ),
        line: bool = typer.Option(False, "--line", help="End TEXT with a line feed"),
        eof: bool = typer.Option(False, "--eof", help="Close its standard input afterwards"),
        thread: str = typer.Option(
            "", "--thread", help="Where a warning goes when the runtime does not know it"
        ),
        key: str = KEY,
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """Write TEXT (or this command's standard input) to a process's standard input."""
        data = (text + ("\n" if line else "")).encode() if text is not None else (
            b"" if eof and sys.stdin.isatty() else sys.stdin.buffer.read()
        )  # fmt: skip
        answer = run(
            "process write", http, jsonrpc,
            lambda c: c.write_process_stdin(
                process_id, data, eof=eof, thread_id=thread, idempotency_key=key
            ),
        )  # fmt: skip
        typer.echo(json.dumps(answer, indent=2, ensure_ascii=False))

    @process.command("terminate")
    def terminate(
        process_id: str = typer.Argument(..., help="The process (its processId: the call id)"),
        reason: str = typer.Option("", "--reason", help="Why (recorded in process.terminated)"),
        thread: str = typer.Option(
            "", "--thread", help="Where a warning goes when the runtime does not know it"
        ),
        key: str = KEY,
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """Stop a process: SIGTERM, then SIGKILL after the grace period."""
        answer = run(
            "process terminate", http, jsonrpc,
            lambda c: c.terminate_process(
                process_id, reason=reason, thread_id=thread, idempotency_key=key
            ),
        )  # fmt: skip
        typer.echo(json.dumps(answer, indent=2, ensure_ascii=False))
