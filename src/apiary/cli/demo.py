"""`apiary demo`: its options. What it runs is in cli/demo_run.py, imported only when it
runs: the demo and its coordinator take 2.5 s to import, which `apiary demo --help` does not
need."""

from __future__ import annotations

from pathlib import Path

import typer


def demo(
    yes: bool = typer.Option(
        False, "--yes", "-y", help="Let the demo operator approve the merge (no prompt)"
    ),
    keep: bool = typer.Option(
        False,
        "--keep",
        help="Keep the coordinator (and its console) serving after the run, until Ctrl-C",
    ),
    data_dir: Path | None = typer.Option(
        None, "--data-dir", help="The run's directory, empty or new [a new temporary dir]"
    ),
) -> None:
    """Six agent processes fix a failing test in a real git repository, through an embedded
    coordinator in secure mode (mTLS, a certificate and a signing key per agent): a workflow,
    worktrees, tools (and an MCP server), a review room, a HITL approval and a preemption.
    Exits 0 only when the fix is merged, its tests pass and no call was refused."""
    from apiary.cli.demo_run import run_demo_command  # noqa: PLC0415 - see above

    run_demo_command(yes, keep, data_dir)
