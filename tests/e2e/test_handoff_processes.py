"""Agent handoff with real agent processes (RFC 17.6, Appendix D C.11).

The coordinator runs in the test process (real gRPC over loopback sockets); every agent is a
separate Python process running tests/e2e/handoff_agents.py, which uses only the SDK. Waits
are driven by the agents' stdout lines and the coordinator's event log, each bounded.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from tests.e2e.agent_process import AgentProcess
from tests.e2e.handoff_agents import CONTEXT

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 30.0


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path) as running:
        yield running


@asynccontextmanager
async def agent_process(
    coordinator: Coordinator, logs: Path, role: str, agent_id: str, *args: str
) -> AsyncIterator[AgentProcess]:
    with (logs / f"{agent_id}.stderr").open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.e2e.handoff_agents", role, agent_id,
            str(coordinator.grpc_address), *args, cwd=ROOT,
            stdout=asyncio.subprocess.PIPE, stderr=stderr,
        )  # fmt: skip
    agent = AgentProcess(proc, wait_s=WAIT_S)
    try:
        await agent.expect("ready")
        yield agent
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), WAIT_S)


async def handoff_events(coordinator: Coordinator, request_id: str) -> list[tuple[str, str]]:
    """(event type, agent_id) of the handoff's events in the log, in order."""
    events = await coordinator.events.read(limit=10_000)
    return [
        (e.event_type, e.agent_id)
        for e in events
        if e.event_type.startswith("handoff.") and e.correlation_id == request_id
    ]


@pytest.mark.conformance(
    "handoff.context.content-types",
    "handoff.context.no-continue-after",
    "patterns.handoff.no-continue-after",
)
async def test_c11_the_target_accepts_and_resumes_work_with_the_context(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    async with (
        agent_process(coordinator, tmp_path, "reviewer", "reviewer-b") as b,
        agent_process(coordinator, tmp_path, "origin", "origin-a", "reviewer-b") as a,
    ):
        request_id = (await a.expect("requested"))["request_id"]
        offered = await b.expect("offered")
        assert offered["request_id"] == request_id and offered["origin"] == "origin-a"
        assert offered["snapshot"] == CONTEXT
        assert offered["content_type"] == "application/json"
        outcome = await a.expect("outcome")
        assert outcome["state"] == "ACCEPTED"
        assert outcome["updates"] == ["handoff.requested", "handoff.accepted"]
        await a.expect("completed")
        resumed = await b.expect("resumed")
        assert resumed["ticket"] == 42
        assert resumed["done"] == [
            "triage",
            "reproduce",
            "patch (by reviewer-b)",
            "test (by reviewer-b)",
        ]
        assert (await a.expect("barred"))["code"] == "permission_denied"
        assert a.events() == [
            "ready", "working", "requested", "outcome", "stopped", "completed", "barred",
        ]  # fmt: skip
    assert await handoff_events(coordinator, request_id) == [
        ("handoff.requested", "origin-a"),
        ("handoff.accepted", "origin-a"),
        ("handoff.completed", "origin-a"),
        ("handoff.context_revoked", "origin-a"),
    ]
    events = await coordinator.events.read(limit=10_000)
    by_type = {e.event_type: e for e in events if e.correlation_id == request_id}
    assert by_type["handoff.accepted"].actor == "reviewer-b"
    assert by_type["handoff.completed"].actor == "origin-a"
    assert by_type["handoff.requested"].details["capabilities_required"] == ["security-review"]


async def test_a_rejected_handoff_is_rerouted_to_another_capable_agent(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    async with (
        agent_process(coordinator, tmp_path, "refuser", "reviewer-c") as c,
        agent_process(coordinator, tmp_path, "reviewer", "reviewer-b") as b,
        agent_process(coordinator, tmp_path, "origin", "origin-a", "reviewer-c") as a,
    ):
        request_id = (await a.expect("requested"))["request_id"]
        assert (await c.expect("refused"))["request_id"] == request_id
        offered = await b.expect("offered")
        assert (offered["request_id"], offered["attempt"]) == (request_id, 2)
        outcome = await a.expect("outcome")
        assert outcome["state"] == "ACCEPTED"
        assert outcome["updates"] == [
            "handoff.requested",
            "handoff.rejected",
            "handoff.rerouted",
            "handoff.accepted",
        ]
        await a.expect("completed")
        assert (await b.expect("resumed"))["ticket"] == 42
        assert "resumed" not in c.events()
    assert await handoff_events(coordinator, request_id) == [
        ("handoff.requested", "origin-a"),
        ("handoff.rejected", "origin-a"),
        ("handoff.context_revoked", "reviewer-c"),
        ("handoff.rerouted", "origin-a"),
        ("handoff.accepted", "origin-a"),
        ("handoff.completed", "origin-a"),
        ("handoff.context_revoked", "origin-a"),
    ]
    events = await coordinator.events.read(limit=10_000)
    rejected = next(e for e in events if e.event_type == "handoff.rejected")
    assert rejected.actor == "reviewer-c" and rejected.details["why"] == "on leave this week"
    rerouted = next(e for e in events if e.event_type == "handoff.rerouted")
    assert rerouted.details["previous_agent"] == "reviewer-c"
    assert rerouted.details["to_agent"] == "reviewer-b"
