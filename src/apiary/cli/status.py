"""`apiary status`: one look at a running coordinator (agents, tasks, dead letters, HITL),
which coordinator that is and why (cli/calls.py), and what the command's calls present to
it (the credentials every CLI command uses)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import typer
from rich.table import Table

from apiary.cli.calls import (
    COORDINATOR,
    Presented,
    credentials_of,
    described,
    refusal,
    run_client,
)
from apiary.cli.output import console_for_output
from apiary.core.records import TaskState
from apiary.errors import ApiaryError
from apiary.sdk.client import Client
from apiary.sdk.credentials import ClientCredentials
from apiary.wire import pb

a = pb.apiary_pb2
LIMIT = 1000
"""Rows read per list; a count that reaches it is shown as "1000+"."""
OPEN_TASK_STATES = [s.value for s in TaskState if not s.terminal]


def status(
    token: str = typer.Option("", "--token", envvar="APIARY_TOKEN",
                              help="Operator token (or APIARY_TOKEN): adds the HITL inbox"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object"),
    grpc_address: str = COORDINATOR,
) -> None:  # fmt: skip
    """Agents with their inbound queues, open tasks by state, dead letters, pending HITL, the
    coordinator called (and where its address came from), and the credentials the CLI
    presents (API key, client certificate, operator token or none)."""
    try:
        credentials = credentials_of(grpc_address) or ClientCredentials.load()
    except ApiaryError as exc:
        typer.echo(refusal("status", exc), err=True)
        raise typer.Exit(2) from None
    presented = Presented.of(credentials, token)
    doc = run_client("status", grpc_address, lambda c: _status(c, bool(token)), token=token,
                     with_field=False)  # fmt: skip
    doc["coordinator"] = {
        "address": str(grpc_address), "source": getattr(grpc_address, "source", ""),
        "text": described(grpc_address),
    }  # fmt: skip
    doc["credentials"] = presented.to_json()
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    _print(doc)


async def _status(client: Client, operator: bool) -> dict[str, Any]:
    agents = (await client.discovery.ListAgents(a.ListAgentsRequest())).agents
    request = a.ListTasksRequest(states=OPEN_TASK_STATES, limit=LIMIT)
    tasks = (await client.task_query.ListTasks(request)).tasks
    dead = (await client.dlq.List(a.ListDlqRequest(limit=LIMIT))).entries
    hitl: int | str = "needs an operator token (--token or APIARY_TOKEN)"
    if operator:
        pending = await client.hitl_operator.List(a.ListInvocationsRequest(limit=LIMIT))
        hitl = len(pending.invocations)
    by_state = Counter(t.state for t in tasks)
    running: dict[str, list[str]] = {}
    for t in tasks:
        if t.state == "RUNNING":
            running.setdefault(t.agent_id, []).append(t.task_id)
    return {
        "agents": [
            {"agent_id": i.descriptor.agent_id, "state": i.state,
             "inbox": i.buffer_depth, "capacity": i.buffer_capacity,
             "running": running.get(i.descriptor.agent_id, [])}
            for i in agents
        ],
        "tasks": {state: by_state.get(state, 0) for state in OPEN_TASK_STATES},
        "tasks_capped": len(tasks) >= LIMIT,
        "dead_letters": sum(1 for e in dead if not e.requeued_as),
        "dead_letters_capped": len(dead) >= LIMIT,
        "hitl_pending": hitl,
    }  # fmt: skip


def _count(n: int, capped: bool) -> str:
    return f"{n}+" if capped else str(n)


def _print(doc: dict[str, Any]) -> None:
    console = console_for_output()
    console.print(f"coordinator: {doc['coordinator']['text']}", markup=False, highlight=False)
    console.print(f"credentials: {doc['credentials']['text']}", markup=False, highlight=False)
    agents = Table(title=f"Agents ({len(doc['agents'])})")
    for column in ("agent", "state", "inbox", "running"):
        agents.add_column(column, overflow="fold")
    for agent in doc["agents"]:
        agents.add_row(
            agent["agent_id"], agent["state"], f"{agent['inbox']}/{agent['capacity']}",
            ", ".join(agent["running"]),
        )  # fmt: skip
    console.print(agents)
    summary = Table(title="Work")
    summary.add_column("what")
    summary.add_column("count", justify="right")
    capped = doc["tasks_capped"]
    for state, n in doc["tasks"].items():
        summary.add_row(f"tasks {state}", _count(n, capped))
    summary.add_row(
        "dead letters (not requeued)", _count(doc["dead_letters"], doc["dead_letters_capped"])
    )
    summary.add_row("HITL pending", str(doc["hitl_pending"]))
    console.print(summary)
