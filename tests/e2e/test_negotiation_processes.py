"""Appendix D C.9 "Negotiation with timeout + HITL decision" with real agent processes.

The coordinator runs in the test process (real gRPC over loopback); frontend, graphql and a
HITL component are separate Python processes running tests/e2e/negotiation_agents.py (SDK
only). The Scheduler opens the negotiation (topic /api/v3/orders, intensity HIGH); frontend
proposes A, graphql counters with B, the Inference Engine evaluates (A, B), frontend's score
stays below the threshold, the round times out, the Scheduler escalates with
DEBATE_DEADLOCK, the HITL component decides B, and both participants receive DECISION B.
Waits follow the event log and the agents' stdout, each bounded; the round timeout is the
policy's (3 s: round_timeout_ms 1500 scaled by intensity HIGH).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration

from apiary.core.events import Event
from apiary.core.negotiation.policy import NegotiationPolicy
from apiary.engine.assembly import Runtime
from apiary.engine.hitl import HitlSettings
from apiary.engine.negotiation.policies import NegotiationSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.sdk.client import Client
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.testing.events import wait_for_event
from apiary.wire import pb
from tests.e2e.agent_process import AgentProcess as SharedAgentProcess
from tests.e2e.negotiation_agents import DRAFT_A, DRAFT_B

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 30.0
TOKEN = "c9-operator-token"
HITL = HitlSettings(operators=(OperatorEntry("olivia", token_digest(TOKEN), ("admin",)),))
POLICY = NegotiationPolicy(max_rounds=4, score_threshold=0.8, round_timeout_ms=1500,
                           llm_weight=0.3)  # fmt: skip


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    runtime = Runtime(hitl=HITL, negotiation=NegotiationSettings(base_policy=POLICY))
    async with open_test_coordinator(tmp_path, runtime=runtime) as running:
        yield running


class AgentProcess(SharedAgentProcess):
    """One `python -m tests.e2e.negotiation_agents ROLE` process and the lines it printed."""

    def kinds(self) -> list[str]:
        return [line["kind"] for line in self.lines if line["event"] == "negotiation"]


@asynccontextmanager
async def agent_process(
    coordinator: Coordinator, role: str, logs: Path
) -> AsyncIterator[AgentProcess]:
    with (logs / f"{role}.stderr").open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.e2e.negotiation_agents", role,
            str(coordinator.grpc_address), cwd=ROOT, stdout=asyncio.subprocess.PIPE,
            stderr=stderr, env={**os.environ, "APIARY_TOKEN": TOKEN},
        )  # fmt: skip
    agent = AgentProcess(proc, wait_s=WAIT_S)
    try:
        await agent.expect("ready")
        yield agent
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), WAIT_S)


async def _event(coordinator: Coordinator, where: Callable[[Event], bool]) -> Event:
    return await wait_for_event(coordinator.events, where, timeout_s=WAIT_S)


@pytest.mark.conformance(
    "negotiation.timeout.enforce", "negotiation.deadlock.handle",
    "negotiation.messages.kinds", "negotiation.protocol.two-party-unanimity",
    "negotiation.events.no-reorder", "negotiation.events.preserve-correlation",
    "negotiation.reports.contract-diff-artifacts", "negotiation.reports.evaluation-decision",
)  # fmt: skip
async def test_c9_negotiation_with_timeout_and_hitl_decision(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        frontend = await stack.enter_async_context(agent_process(coordinator, "frontend", tmp_path))
        graphql = await stack.enter_async_context(agent_process(coordinator, "graphql", tmp_path))
        hitl = await stack.enter_async_context(agent_process(coordinator, "hitl", tmp_path))
        async with Client(str(coordinator.grpc_address), agent_id="scheduler-client") as client:
            await client.negotiation.Open(pb.negotiation_pb2.NegotiationOpen(
                negotiation_id="orders-v3", topic="/api/v3/orders",
                participants=["frontend", "graphql"], intensity=pb.common_pb2.HIGH,
                debate_timeout=Duration(seconds=60),
            ))  # fmt: skip
        decided_fe = await frontend.expect("decided")
        decided_gql = await graphql.expect("decided")
        await hitl.expect("hitl_decided")
    for decided in (decided_fe, decided_gql):
        assert (decided["by"], decided["result"]) == ("hitl", DRAFT_B.decode())
    for agent in (frontend, graphql):
        assert agent.kinds() == ["open", "policy", "propose", "counter", "evaluate", "decide"]
        correlations = {line["correlation_id"] for line in agent.lines if "correlation_id" in line}
        assert correlations == {"orders-v3"}
    invocation = next(line for line in hitl.lines if line["event"] == "invocation")
    assert invocation["reason_type"] == "DEBATE_DEADLOCK"

    await _event(coordinator, lambda e: e.event_type == "negotiation.decided")
    log = [e for e in await coordinator.events.read(limit=100_000)
           if e.correlation_id == "orders-v3"]  # fmt: skip
    types = [e.event_type for e in log]
    expected = ["negotiation.opened", "negotiation.proposed", "negotiation.countered",
                "negotiation.inference", "negotiation.evaluated", "negotiation.round_closed",
                "negotiation.deadlocked", "hitl.opened", "negotiation.escalated",
                "hitl.decided", "negotiation.decided"]  # fmt: skip
    assert [t for t in types if t in expected] == expected
    by_type = {e.event_type: e for e in log}
    inference = by_type["negotiation.inference"].details
    assert 0.0 < inference["confidence_score"] < 1.0
    assert (
        by_type["negotiation.evaluated"].details["llm_confidence"] == inference["confidence_score"]
    )
    deadlock = by_type["negotiation.deadlocked"].details
    assert (deadlock["stop_reason"], deadlock["cause"]) == ("timeout", "round_timeout")
    assert by_type["hitl.decided"].actor == "olivia"
    final = by_type["negotiation.decided"].details
    assert (final["decided_by"], final["version"], final["stop_reason"]) == ("hitl", "v2",
                                                                             "timeout")  # fmt: skip

    async with Client(str(coordinator.grpc_address)) as client:
        listed = await client.activity.ListArtifacts(
            pb.activity_pb2.ListArtifactsRequest(negotiation_id="orders-v3")
        )
    items = {f"{i.kind}_{i.version}.json": i for i in listed.items}
    assert list(items) == ["contract_v1.json", "contract_v2.json", "diff_v1_to_v2.json",
                           "score_v2.frontend.json", "decision_final.json"]  # fmt: skip
    assert items["contract_v1.json"].content == DRAFT_A
    assert items["contract_v2.json"].content == DRAFT_B
    assert json.loads(items["diff_v1_to_v2.json"].content)["changed_paths"] == ["/paging"]
    report = json.loads(items["decision_final.json"].content)
    assert (report["decided_by"], report["stop_reason"]) == ("hitl", "timeout")
    assert report["version"] == "v2"
    assert report["hitl"]["via"] == "operator"
