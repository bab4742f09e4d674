"""`apiary demo`: run the main job and print what happened."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from apiary.demo.job import DemoResult, run_demo


def demo(
    data_dir: Path | None = typer.Option(
        None, "--data-dir", help="Keep the run's state here (default: a new temporary dir)"
    ),
) -> None:
    """Run an embedded coordinator and two agent processes that exchange a message."""
    console = Console()
    with console.status("running the demo: coordinator + 2 agent processes ..."):
        result = asyncio.run(run_demo(data_dir))
    _summary(console, result)
    if not result.ok:
        console.print(f"[bold red]demo failed:[/] {result.reason}")
        for event in result.events[-15:]:
            console.print(f"  #{event.sequence} {event.event_type} {dict(event.details)}")
        raise typer.Exit(1)


def _summary(console: Console, result: DemoResult) -> None:
    table = Table(title="apiary demo", show_header=True)
    table.add_column("what")
    table.add_column("result")
    for report in result.reports:
        table.add_row(f"agent {report.get('agent')}", _describe(report))
    table.add_row("agents registered", str(result.count("agent.registered")))
    table.add_row("messages routed", str(result.count("message.received")))
    stages = result.ack_stages()
    table.add_row("acks", ", ".join(f"{k} {v}" for k, v in sorted(stages.items())) or "none")
    table.add_row("events logged", str(len(result.events)))
    table.add_row("time", f"{result.seconds:.2f} s")
    table.add_row("state", f"apiary serve --data-dir {result.data_dir}")
    console.print(table)
    if result.ok:
        console.print(
            "[bold green]demo ok[/]: the message was delivered, answered and acknowledged"
        )


def _describe(report: dict[str, object]) -> str:
    if report.get("role") == "initiator":
        stages = ", ".join(str(s) for s in report.get("ack_stages", []))  # type: ignore[attr-defined]
        reply, ms = report.get("reply"), report.get("round_trip_ms")
        return f"sent 'hello', acks [{stages}], got '{reply}' in {ms} ms"
    return f"answered with message {report.get('replied')}"
