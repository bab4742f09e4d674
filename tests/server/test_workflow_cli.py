"""`apiary workflow list|cancel|history` against a running coordinator on a SQLite file (real
sockets, real CLI processes)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from apiary.sdk.client import Client
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb

w = pb.workflow_pb2


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path, f"sqlite:///{tmp_path / 'apiary.db'}") as running:
        yield running


async def _cli(coordinator: Coordinator, *args: str, code: int = 0) -> tuple[str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "apiary.cli.main", "workflow", *args,
        "--grpc", str(coordinator.grpc_address),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == code, (proc.returncode, out.decode(), err.decode())
    return out.decode(), err.decode()


async def test_workflows_are_listed_cancelled_and_their_history_shown(
    coordinator: Coordinator,
) -> None:
    async with Client(str(coordinator.grpc_address)) as client:
        for workflow_id in ("wf-1", "wf-2"):  # MANUAL roots: they wait, RUNNING
            definition = w.WorkflowDefinition(workflow_id=workflow_id)
            for key, node in (("fetch", w.WorkflowNode(trigger_type=w.MANUAL)),
                              ("load", w.WorkflowNode(dependencies=["fetch"]))):  # fmt: skip
                node.node_id, node.agent_id = key, "worker"
                definition.nodes[key].CopyFrom(node)
            await client.workflow.CreateWorkflow(w.CreateWorkflowRequest(definition=definition))
            await client.workflow.StartWorkflow(w.StartWorkflowRequest(workflow_id=workflow_id))

    table, hint = await _cli(coordinator, "list")
    rows = [
        [cell.strip() for cell in line.split("\u2502")[1:-1]]
        for line in table.splitlines() if "wf-" in line
    ]  # fmt: skip
    assert [row[:3] for row in rows] == [["wf-1", "RUNNING", "0/2"], ["wf-2", "RUNNING", "0/2"]]
    assert hint == ""
    first, hint = await _cli(coordinator, "list", "--limit", "1")
    assert "wf-1" in first and "wf-2" not in first and "more follow: --after wf-1" in hint
    rest, hint = await _cli(coordinator, "list", "--after", "wf-1")
    assert "wf-2" in rest and "wf-1" not in rest and hint == ""

    out, _ = await _cli(coordinator, "cancel", "wf-1", "--reason", "not needed")
    assert "CANCELLED" in out and "not needed" in out
    _, err = await _cli(coordinator, "cancel", "wf-1", code=1)
    assert "ALREADY_COMPLETED" in err and "is CANCELLED" in err
    # A cancelled run is finished: a watch ends at once (exit 1: it did not complete).
    await _cli(coordinator, "status", "wf-1", "--watch", "--interval", "0.05", code=1)

    listed = json.loads((await _cli(coordinator, "list", "--state", "cancelled", "--json"))[0])
    assert [(x["workflow_id"], x["state"], x["nodes_done"], x["nodes_total"])
            for x in listed["workflows"]] == [("wf-1", "CANCELLED", 2, 2)]  # fmt: skip
    assert listed["next_after_id"] == ""
    _, err = await _cli(coordinator, "list", "--state", "finished", code=1)
    assert "validation_error" in err and "states: must be among" in err

    table, hint = await _cli(coordinator, "history", "wf-1")
    assert "workflow.created" in table and "workflow.cancelled" in table and hint == ""
    assert "fetch" in table  # the node column of node events
    document = json.loads((await _cli(coordinator, "history", "wf-1", "--json"))[0])
    types = [e["event_type"] for e in document["events"]]
    assert types[0] == "workflow.created" and types[-1] == "workflow.cancelled"
    page, hint = await _cli(coordinator, "history", "wf-1", "--limit", "1", "--type", "workflow.")
    after = document["events"][0]["sequence"]
    assert "workflow.created" in page and f"more follow: --after {after}" in hint
    _, err = await _cli(coordinator, "history", "ghost", code=1)
    assert "NOT_FOUND" in err and "ghost" in err
