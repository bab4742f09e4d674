"""`apiary runtime export evidence|replay|review SESSION`: the control plane's exports
(docs/control-plane.md) on the `apiary runtime` app, through the SDK's RuntimeClient. A pack
is printed as JSON, or written to `--out`; `evidence` writes every page (one JSON object per
line) with a progress line per page on stderr, or one page with `--after`/`--limit`."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Any, TextIO

import typer

from apiary.cli.calls import PROFILE
from apiary.cli.runtime_tasks import Run
from apiary.sdk.runtime import RuntimeClient


class ExportKind(StrEnum):
    evidence = "evidence"
    replay = "replay"
    review = "review"


def register(app: typer.Typer, run: Run, http_option: Any, jsonrpc_option: Any) -> None:
    """Add `export` to `app`; `run(program, http, jsonrpc, call)` runs a call."""

    @app.command("export")
    def export(
        kind: ExportKind = typer.Argument(..., help="evidence, replay or review"),
        session_id: str = typer.Argument(..., help="The session to export"),
        thread: str = typer.Option("", "--thread", help="replay: only this thread's turns"),
        after: int = typer.Option(
            -1, "--after", min=-1, help="evidence: one page, of the events after this sequence"
        ),
        limit: int = typer.Option(
            0, "--limit", min=0, max=5000, help="evidence: events per page [the server's: 1000]"
        ),
        out: Path | None = typer.Option(
            None, "--out", help="Write the pack here instead of printing it"
        ),
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """A pack built from a session's facts: its evidence (events, snapshot, digest), a
        replay case (each turn's input and outcome) or a review template."""
        if thread and kind is not ExportKind.replay:
            typer.echo("apiary runtime export: --thread is for replay only", err=True)
            raise typer.Exit(2)
        target = out.open("w", encoding="utf-8") if out is not None else sys.stdout
        try:
            if kind is ExportKind.evidence:
                run("export", http, jsonrpc,
                    lambda c: _evidence(c, session_id, after, limit, target))  # fmt: skip
            elif kind is ExportKind.replay:
                case = run("export", http, jsonrpc,
                           lambda c: c.export_replay(session_id, thread_id=thread))  # fmt: skip
                target.write(json.dumps(case, indent=2, ensure_ascii=False) + "\n")
            else:
                review = run("export", http, jsonrpc, lambda c: c.export_review(session_id))
                target.write(json.dumps(review, indent=2, ensure_ascii=False) + "\n")
        finally:
            if out is not None:
                target.close()
        if out is not None:
            typer.echo(f"{kind.value} of {session_id} written to {out}", err=True)


async def _evidence(
    client: RuntimeClient, session_id: str, after: int, limit: int, target: TextIO
) -> None:
    """One page (`after` given) as JSON, or every page as one JSON object per line."""
    if after >= 0:
        page = await client.export_evidence(session_id, after=after, limit=limit)
        target.write(json.dumps(page, indent=2, ensure_ascii=False) + "\n")
        return
    written = 0
    async for page in client.evidence_pages(session_id, limit=limit):
        target.write(json.dumps(page, ensure_ascii=False) + "\n")
        written += len(page["events"])
        more = ", more follow" if page["more"] else ""
        typer.echo(
            f"evidence: {written} events through sequence {page['range']['through']}{more}",
            err=True,
        )
