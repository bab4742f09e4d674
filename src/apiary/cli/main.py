"""Entry point of the `apiary` console script."""

from __future__ import annotations

from typing import Final

import typer

from apiary import __version__
from apiary.cli.command_tree import ApiaryGroup, Subcommand

SUBCOMMANDS: Final = (
    Subcommand("serve", "apiary.cli.serve:serve",
               "Run the coordinator: every SW4RM service on one gRPC port."),
    Subcommand("demo", "apiary.cli.demo:demo",
               "Six agent processes fix a failing test in a git repository."),
    Subcommand("events", "apiary.cli.events:events",
               "Show a coordinator's events (with --follow: as they come)."),
    Subcommand("send", "apiary.cli.send:send", "Send one DATA message; print its message_id."),
    Subcommand("status", "apiary.cli.status:status",
               "Agents and their queues, open tasks, dead letters and HITL."),
    Subcommand("version", "apiary.cli.main:version", "Print the Apiary version."),
    Subcommand("dlq", "apiary.cli.dlq:app",
               "Inspect, requeue and export dead letters (RFC 21.1)."),
    Subcommand("hitl", "apiary.cli.hitl:app", "Decide human-in-the-loop invocations (RFC 15)."),
    Subcommand("handoff", "apiary.cli.handoff:app",
               "Request, answer and inspect agent handoffs (RFC 17.6)."),
    Subcommand("room", "apiary.cli.room:app",
               "Negotiation rooms: proposals, votes, decisions (RFC 17.5)."),
    Subcommand("agent", "apiary.cli.agent:app",
               "Run SDK agents; suspend and resume agents (RFC 8.1)."),
    Subcommand("workflow", "apiary.cli.workflow:app",
               "Define, run and watch DAG workflows (RFC 17.7)."),
    Subcommand("worktree", "apiary.cli.worktree:app",
               "Bind agents to git worktrees and switch them (RFC 16)."),
    Subcommand("tool", "apiary.cli.tool:app", "List, describe and call tools (RFC 18)."),
    Subcommand("negotiation", "apiary.cli.negotiation:app",
               "Negotiations between agents (RFC 17)."),
    Subcommand("swarm", "apiary.cli.swarm:app",
               "Federate with other agents over the Agent Swarm Protocol 0.1.0."),
    Subcommand("task", "apiary.cli.task:app",
               "Submit, list and inspect Scheduler tasks (RFC 7, 9)."),
    Subcommand("runtime", "apiary.cli.runtime:app",
               "The runtime control plane: sessions, threads and turns."),
    Subcommand("auth", "apiary.cli.auth:app",
               "Create, list, rotate and revoke API keys (kept hashed)."),
    Subcommand("certs", "apiary.cli.certs:app", "Certificates for the secure mode (mTLS)."),
    Subcommand("cluster", "apiary.cli.cluster:app",
               "Cluster mode: replicas and partition leases."),
)  # fmt: skip
"""Every command of `apiary`, in the order `apiary --help` lists them; each module is
imported when its command is called."""


class _Root(ApiaryGroup):
    subcommands = SUBCOMMANDS


app = typer.Typer(
    name="apiary",
    help="Apiary: a coordination server for process-isolated agents (SW4RM).",
    no_args_is_help=True,
    add_completion=False,
    cls=_Root,
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


def version() -> None:
    """Print the Apiary version."""
    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
