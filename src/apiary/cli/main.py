"""Entry point of the `apiary` console script."""

from __future__ import annotations

import typer

from apiary import __version__
from apiary.cli import (
    agent,
    auth,
    certs,
    cluster,
    dlq,
    handoff,
    hitl,
    negotiation,
    room,
    runtime,
    swarm,
    task,
    tool,
    workflow,
    worktree,
)
from apiary.cli.command_tree import ApiaryGroup
from apiary.cli.demo import demo
from apiary.cli.events import events
from apiary.cli.send import send
from apiary.cli.serve import serve
from apiary.cli.status import status

app = typer.Typer(
    name="apiary",
    help="Apiary: a coordination server for process-isolated agents (SW4RM).",
    no_args_is_help=True,
    add_completion=False,
    cls=ApiaryGroup,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version,
        help="Print the Apiary version and exit",
    ),
) -> None:  # fmt: skip
    """Apiary: a coordination server for process-isolated agents (SW4RM)."""


app.command()(serve)
app.command()(demo)
app.command()(events)
app.command()(send)
app.command()(status)
app.add_typer(dlq.app, name="dlq")
app.add_typer(hitl.app, name="hitl")
app.add_typer(handoff.app, name="handoff")
app.add_typer(room.app, name="room")
app.add_typer(agent.app, name="agent")
app.add_typer(workflow.app, name="workflow")
app.add_typer(worktree.app, name="worktree")
app.add_typer(tool.app, name="tool")
app.add_typer(negotiation.app, name="negotiation")
app.add_typer(swarm.app, name="swarm")
app.add_typer(task.app, name="task")
app.add_typer(runtime.app, name="runtime")
app.add_typer(auth.app, name="auth")
app.add_typer(certs.app, name="certs")
app.add_typer(cluster.app, name="cluster")


@app.command()
def version() -> None:
    """Print the Apiary version."""
    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
