"""`apiary demo` run (cli/demo.py has its options): the job a new user runs first
(docs/demo.md)."""

from __future__ import annotations

import asyncio
import getpass
import re
import sys
import tempfile
from pathlib import Path

import typer
from rich.console import Console

from apiary.demo.configuration import DEMO_OPERATOR
from apiary.demo.job import DemoError, DemoOptions, run_demo
from apiary.demo.operator import auto_approve
from apiary.demo.view import DemoView


def run_demo_command(yes: bool, keep: bool, data_dir: Path | None) -> None:
    """`apiary demo` with its options read."""
    # Not console_for_output(): the view's panels (--keep's, an agent's log) expand to the
    # console's width, which it leaves unbounded for a pipe.
    console = Console()
    run_dir = data_dir or Path(tempfile.mkdtemp(prefix="apiary-demo-"))
    ask = not yes and sys.stdin.isatty() and console.is_terminal
    view = DemoView(console, live=console.is_terminal)
    options = DemoOptions(
        data_dir=run_dir,
        operator=_login() if ask else DEMO_OPERATOR,
        decide=view.ask if ask else auto_approve,
        observe=view.update,
        started=view.started,
        linger=view.linger if keep else None,
    )
    try:
        with view:
            result = asyncio.run(run_demo(options))
    except DemoError as exc:
        typer.echo(f"apiary demo: {exc}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        typer.echo(f"apiary demo: interrupted; what it did is in {run_dir}", err=True)
        raise typer.Exit(130) from None
    if not keep:  # --keep printed it before lingering
        view.summary(result)
    if not result.ok:
        raise typer.Exit(1)


def _login() -> str:
    """Who is at the terminal: the HITL operator the audit trail names, as a principal's name
    (letters, digits and ._@:- only: the operator's certificate names it)."""
    try:
        login = getpass.getuser()
    except (OSError, KeyError):
        login = ""
    name = re.sub(r"[^A-Za-z0-9._@:-]", "-", login).lstrip("._@:-")[:128]
    return name or "terminal-operator"
