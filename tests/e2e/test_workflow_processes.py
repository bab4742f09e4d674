"""DAG workflows with real agent processes (RFC 17.7, Appendix D C.12).

The coordinator runs in the test process (real gRPC over loopback sockets); every agent is a
separate Python process running tests/e2e/workflow_agents.py, which uses only the SDK. The
orchestrator's calls go over gRPC with the SDK's typed client. Waits are driven by the
coordinator's event log and the agents' stdout lines, each bounded.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from apiary.core.events import Event
from apiary.sdk.agent import Agent
from apiary.sdk.client import Client
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.testing.events import wait_for_event
from apiary.wire import pb
from tests.e2e.agent_process import AgentProcess

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 30.0
w = pb.workflow_pb2


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path) as running:
        yield running


@asynccontextmanager
async def agents(
    coordinator: Coordinator, logs: Path, **roles: str
) -> AsyncIterator[dict[str, AgentProcess]]:
    """One process per agent id, with its role; all ready (registered) on entry."""
    started: dict[str, AgentProcess] = {}
    try:
        for agent_id, role in roles.items():
            with (logs / f"{agent_id}.stderr").open("wb") as stderr:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "tests.e2e.workflow_agents", agent_id,
                    str(coordinator.grpc_address), role, cwd=ROOT,
                    stdout=asyncio.subprocess.PIPE, stderr=stderr,
                )  # fmt: skip
            started[agent_id] = AgentProcess(proc, wait_s=WAIT_S)
        for process in started.values():
            await process.expect("ready")
        yield started
    finally:
        for process in started.values():
            if process.proc.returncode is None:
                process.proc.terminate()
        for process in started.values():
            await asyncio.wait_for(process.proc.wait(), WAIT_S)


async def _event(coordinator: Coordinator, where: Callable[[Event], bool]) -> Event:
    return await wait_for_event(coordinator.events, where, timeout_s=WAIT_S)


async def _finished(coordinator: Coordinator, workflow_id: str) -> Event:
    return await _event(
        coordinator,
        lambda e: (
            e.event_type in ("workflow.completed", "workflow.failed")
            and e.correlation_id == workflow_id
        ),
    )


def _node(node_id: str, agent_id: str, *deps: str, **fields: Any) -> w.WorkflowNode:
    return w.WorkflowNode(node_id=node_id, agent_id=agent_id, dependencies=list(deps), **fields)


def _definition(workflow_id: str, *nodes: w.WorkflowNode) -> w.WorkflowDefinition:
    definition = w.WorkflowDefinition(workflow_id=workflow_id)
    for node in nodes:
        definition.nodes[node.node_id].CopyFrom(node)
    return definition


async def _node_log(coordinator: Coordinator, workflow_id: str) -> list[tuple[str, str]]:
    events = await coordinator.events.read(limit=100_000)
    return [
        (e.event_type.removeprefix("workflow."), str(e.details.get("node_id", "")))
        for e in events
        if e.correlation_id == workflow_id and e.event_type.startswith("workflow.")
    ]


@pytest.mark.conformance(
    "workflow.ops.create", "workflow.ops.start", "workflow.ops.get-state",
    "workflow.roots.execute-first", "workflow.execution.deps-completed",
    "patterns.workflow.no-run-before-deps",
)  # fmt: skip
async def test_c12_a_diamond_runs_on_agent_processes_with_parallel_branches(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    address = str(coordinator.grpc_address)
    diamond = _definition(
        "c12",
        _node("parse", "parser", input_mapping={"file": "source"},
              output_mapping={"records": "records"}),
        _node("count_left", "left", "parse", input_mapping={"rows": "records"},
              output_mapping={"count": "stats.left"}),
        _node("count_right", "right", "parse", input_mapping={"rows": "$.records[0]"},
              output_mapping={"count": "stats.right"}),
        _node("report", "joiner", "count_left", "count_right", input_mapping={"stats": "stats"},
              output_mapping={"$": "report"}),
    )  # fmt: skip
    roles = {"parser": "parse", "left": "branch", "right": "branch", "joiner": "join"}
    async with (
        agents(coordinator, tmp_path, **roles) as procs,
        Client(address) as client,
        Agent("orchestrator", coordinator=address) as orchestrator,
    ):
        created = await client.workflow.CreateWorkflow(w.CreateWorkflowRequest(definition=diamond))
        assert created.workflow_id == "c12"
        await client.workflow.StartWorkflow(
            w.StartWorkflowRequest(workflow_id="c12", workflow_data='{"source": "q3.csv"}')
        )
        parsed = await procs["parser"].expect("started", node="parse")
        assert parsed["input"] == {"file": "q3.csv"}
        # Both branches start, and each waits for its release: they run at the same time.
        left = await procs["left"].expect("started", node="count_left")
        right = await procs["right"].expect("started", node="count_right")
        assert len(left["input"]["rows"]) == 3 and right["input"]["rows"]["id"] == 0
        state = (await client.workflow.GetWorkflowState(
            w.GetWorkflowStateRequest(workflow_id="c12"))).state  # fmt: skip
        statuses = {k: w.NodeStatus.Name(s.status) for k, s in state.node_states.items()}
        assert statuses == {"parse": "COMPLETED", "count_left": "RUNNING",
                            "count_right": "RUNNING", "report": "PENDING"}  # fmt: skip
        await orchestrator.send("left", {"release": "count_left"})
        await procs["left"].expect("released", node="count_left")
        await orchestrator.send("right", {"release": "count_right"})
        done = await _finished(coordinator, "c12")
        assert done.event_type == "workflow.completed"

        state = (await client.workflow.GetWorkflowState(
            w.GetWorkflowStateRequest(workflow_id="c12"))).state  # fmt: skip
    assert {w.NodeStatus.Name(s.status) for s in state.node_states.values()} == {"COMPLETED"}
    assert state.metadata["status"] == "COMPLETED" and state.HasField("completed_at")
    data = json.loads(state.workflow_data)
    assert data["stats"] == {"left": 3, "right": 2}  # right got one record: an object of 2 keys
    assert data["report"] == {"total": 5}
    assert json.loads(state.node_states["count_left"].output) == {"count": 3, "by": "left"}
    log = await _node_log(coordinator, "c12")
    assert log[:3] == [("created", ""), ("started", ""), ("node_ready", "parse")]
    assert log[-1] == ("completed", "")
    # The join ran only after both branches completed; both branches were running at once.
    position = {entry: i for i, entry in enumerate(log)}
    assert position[("node_ready", "report")] > position[("node_completed", "count_left")]
    assert position[("node_ready", "report")] > position[("node_completed", "count_right")]
    assert position[("node_running", "count_right")] < position[("node_completed", "count_left")]


async def test_a_failed_attempt_is_retried_and_a_final_failure_skips_the_dependents(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    address = str(coordinator.grpc_address)
    definition = _definition(
        "flaky",
        _node("first", "flaky", metadata={"retries": "1"}, output_mapping={"attempt": "tries"}),
        _node("second", "flaky", "first"),  # no retry: its first attempt fails for good
        _node("third", "joiner", "second"),
    )
    async with (
        agents(coordinator, tmp_path, flaky="flaky", joiner="join"),
        Client(address) as client,
    ):
        await client.workflow.CreateWorkflow(w.CreateWorkflowRequest(definition=definition))
        await client.workflow.StartWorkflow(w.StartWorkflowRequest(workflow_id="flaky"))
        done = await _finished(coordinator, "flaky")
        state = (await client.workflow.GetWorkflowState(
            w.GetWorkflowStateRequest(workflow_id="flaky"))).state  # fmt: skip
    assert done.event_type == "workflow.failed"
    nodes = state.node_states
    assert [w.NodeStatus.Name(nodes[k].status) for k in ("first", "second", "third")] == [
        "COMPLETED", "FAILED", "SKIPPED"
    ]  # fmt: skip
    assert json.loads(state.workflow_data) == {"tries": 2}
    assert nodes["second"].error.startswith("tool_timeout: the first attempt always times out")
    assert nodes["third"].error == "dependency second failed"
    log = await _node_log(coordinator, "flaky")
    assert [kind for kind, node in log if node == "first"] == [
        "node_ready", "node_running", "node_retrying", "node_running", "node_completed"
    ]  # fmt: skip
    tasks = [e for e in await coordinator.events.read(limit=100_000)
             if e.event_type == "task.failed"]  # fmt: skip
    assert [e.details["task_id"] for e in tasks] == [
        "workflow:flaky:first:1", "workflow:flaky:second:1"
    ]  # fmt: skip


async def _cli(address: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "apiary.cli.main", "workflow", *args, "--grpc", address, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), WAIT_S)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_cli_creates_from_toml_starts_watches_and_reports(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    address = str(coordinator.grpc_address)
    toml = tmp_path / "pipeline.toml"
    toml.write_text(
        'workflow_id = "cli"\n'
        "[nodes.parse]\n"
        'agent_id = "parser"\n'
        'input_mapping = { file = "source" }\n'
        'output_mapping = { "$.records[2].id" = "last_id" }\n'
        "[nodes.total]\n"
        'agent_id = "joiner"\n'
        'dependencies = ["parse"]\n'
        'input_mapping = { "stats.last" = "last_id" }\n'
        'output_mapping = { total = "total" }\n'
    )
    cyclic = tmp_path / "cyclic.json"
    cyclic.write_text(json.dumps({"workflow_id": "loop", "nodes": {
        "a": {"agent_id": "x", "dependencies": ["b"]},
        "b": {"agent_id": "x", "dependencies": ["a"]}}}))  # fmt: skip
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"nodes": {"a": {"agent_id": "x", "trigger_type": "LATER"}}}))
    async with agents(coordinator, tmp_path, parser="parse", joiner="join"):
        code, out, _ = await _cli(address, "create", str(toml), "--json")
        assert code == 0 and json.loads(out) == {"workflow_id": "cli", "nodes": 2}
        code, out, _ = await _cli(
            address, "start", "cli", "--data", '{"source": "a.csv"}', "--watch", "--json"
        )
        assert code == 0, out
        final = json.loads(out)
        assert final["metadata"]["status"] == "COMPLETED"
        assert json.loads(final["workflow_data"]) == {"source": "a.csv", "last_id": 2, "total": 2}
        code, out, _ = await _cli(address, "status", "cli")
        assert code == 0 and "cli COMPLETED" in out and "2 completed" in out

    code, _, err = await _cli(address, "create", str(cyclic))
    assert code == 1 and "workflow_cycle_detected" in err and "a -> b -> a" in err
    code, _, err = await _cli(address, "create", str(broken))
    assert code == 2 and "nodes.a.trigger_type" in err
    code, _, err = await _cli(address, "status", "nope")
    assert code == 1 and "NOT_FOUND" in err
