"""NegotiationRoomService over real sockets (RFC 17.5; field numbers and status codes of
spec/INTEROP.md): a client generated from the canonical proto, the JSON gateway, the
apiary.v1 reads, and the `apiary room` CLI."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from apiary.core.rooms.policy import RoomPolicy
from apiary.engine.assembly import Runtime
from apiary.engine.hitl import HitlSettings
from apiary.engine.negotiation.rooms import RoomSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.testing.clock import FakeClock
from apiary.testing.events import wait_for_event
from apiary.wire import pb
from tests.server.wire_client import WAIT_S, error_detail, register

nr = pb.negotiation_room_pb2
a = pb.apiary_pb2
HITL = HitlSettings(operators=(OperatorEntry("olivia", token_digest("tok"), ("admin",)),))
ROOMS = RoomSettings(policy=RoomPolicy(version="rooms-v1", vote_timeout_s=60.0))


def as_agent(agent_id: str) -> tuple[tuple[str, str], ...]:
    return (("sw4rm-agent-id", agent_id),)


class Rig:
    def __init__(self, coordinator: Coordinator, clock: FakeClock, channel: grpc.aio.Channel):
        self.coordinator = coordinator
        self.clock = clock
        self.rooms = pb.negotiation_room_pb2_grpc.NegotiationRoomServiceStub(channel)
        self.query = pb.apiary_pb2_grpc.NegotiationRoomQueryServiceStub(channel)
        self.channel = channel

    async def propose(self, artifact_id: str, critics: list[str], **fields: Any) -> Any:
        values: dict[str, Any] = {
            "artifact_type": nr.CODE, "artifact_id": artifact_id,
            "artifact": b"def f(): return 1\n", "artifact_content_type": "text/x-python",
            "requested_critics": critics, "negotiation_room_id": "room-1",
        }  # fmt: skip
        values.update(fields)
        proposal = nr.NegotiationProposal(**values)
        return await self.rooms.SubmitProposal(
            nr.SubmitProposalRequest(proposal=proposal), metadata=as_agent("producer")
        )

    async def vote(self, artifact_id: str, critic: str, score: float, confidence: float) -> Any:
        vote = nr.NegotiationVote(
            artifact_id=artifact_id, score=score, confidence=confidence, passed=True
        )
        return await self.rooms.SubmitVote(
            nr.SubmitVoteRequest(vote=vote), metadata=as_agent(critic)
        )


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    clock = FakeClock()
    runtime = Runtime(clock=clock, sleep=clock.sleep, hitl=HITL, rooms=ROOMS)
    async with (
        open_test_coordinator(tmp_path, runtime=runtime) as coordinator,
        grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel,
    ):
        await register(channel, "producer", "c1", "c2")
        yield Rig(coordinator, clock, channel)


async def _status(call: Any) -> tuple[grpc.StatusCode, pb.apiary_pb2.ErrorDetail]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value.code(), error_detail(caught.value)


@pytest.mark.conformance("room.wait-for-decision", "transport.proto.canonical-contracts")
async def test_a_canonical_client_proposes_votes_and_reads_the_decision(rig: Rig) -> None:
    submitted = await rig.propose("code-1", ["c1", "c2"])
    assert (submitted.artifact_id, submitted.negotiation_room_id) == ("code-1", "room-1")
    waiting = asyncio.ensure_future(
        rig.rooms.WaitForDecision(
            nr.WaitForDecisionRequest(artifact_id="code-1", timeout_seconds=30)
        )
    )
    undecided = await rig.rooms.GetDecision(nr.GetDecisionRequest(artifact_id="code-1"))
    assert not undecided.HasField("decision")
    voted = await rig.vote("code-1", "c1", 8, 0.9)
    assert (voted.artifact_id, voted.critic_id) == ("code-1", "c1")
    await rig.vote("code-1", "c2", 6, 0.7)
    reply = await asyncio.wait_for(waiting, WAIT_S)
    decision = reply.decision
    assert decision.outcome == nr.APPROVED
    assert decision.policy_version == "rooms-v1"
    assert decision.aggregated_score.vote_count == 2
    assert decision.aggregated_score.weighted_mean == pytest.approx(7.125)
    assert [v.critic_id for v in decision.votes] == ["c1", "c2"]
    assert decision.votes[0].voted_at.seconds > 0 and decision.decided_at.seconds > 0
    assert decision.reason.startswith("approved:")
    votes = await rig.rooms.GetVotes(
        nr.GetVotesRequest(artifact_id="code-1", negotiation_room_id="room-1")
    )
    assert votes.vote_count == 2 and [v.score for v in votes.votes] == [8, 6]
    got = await rig.rooms.GetDecision(nr.GetDecisionRequest(artifact_id="code-1"))
    assert got.decision == decision


async def test_the_apiary_reads_list_show_and_audit(rig: Rig) -> None:
    await rig.propose("code-1", ["c1", "c2"])
    await rig.vote("code-1", "c1", 9, 0.9)
    listed = await rig.query.ListProposals(a.ListRoomProposalsRequest(critic_id="c2"))
    (item,) = listed.proposals
    assert (item.state, item.votes_received, item.votes_required) == ("OPEN", 1, 2)
    assert list(item.pending_critics) == ["c2"]
    assert item.proposal.artifact == b""  # listings leave the bytes out
    full = await rig.query.GetProposal(
        a.GetRoomProposalRequest(artifact_id="code-1", include_artifact=True)
    )
    assert full.proposal.artifact == b"def f(): return 1\n"
    assert full.proposal.producer_id == "producer"
    assert full.proposal.artifact_type == nr.CODE
    assert not (await rig.query.ListProposals(a.ListRoomProposalsRequest(critic_id="c1"))).proposals
    await rig.vote("code-1", "c2", 1, 0.9)  # std_dev 4: escalates
    (decision,) = (await rig.query.ListDecisions(
        a.ListRoomDecisionsRequest(artifact_id="code-1")
    )).decisions  # fmt: skip
    assert (decision.decision.outcome, decision.via) == (nr.ESCALATED_TO_HITL, "policy")
    assert list(decision.triggers) == ["extreme_disagreement"]
    assert decision.invocation_id
    (policy,) = (await rig.query.ListPolicies(a.ListRoomPoliciesRequest())).policies
    assert (policy.version, policy.current) == ("rooms-v1", True)
    assert json.loads(policy.settings_json)["min_score_threshold"] == 7.0


@pytest.mark.conformance("room.wait-for-decision.timeout")
async def test_errors_carry_the_interop_status_codes(rig: Rig) -> None:
    code, detail = await _status(rig.rooms.GetVotes(nr.GetVotesRequest(artifact_id="missing")))
    assert (code, detail.error_code) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    await rig.propose("code-1", ["c1", "c2"])
    code, detail = await _status(rig.propose("code-1", ["c1"]))
    assert code is grpc.StatusCode.ALREADY_EXISTS
    code, detail = await _status(rig.vote("code-1", "c1", 10.5, 0.9))
    assert (code, detail.details["field"]) == (grpc.StatusCode.INVALID_ARGUMENT, "vote.score")
    code, detail = await _status(rig.vote("code-1", "c1", 5, 1.2))
    assert detail.details["field"] == "vote.confidence"
    code, detail = await _status(
        rig.propose("", ["c1"], artifact_type=nr.ARTIFACT_TYPE_UNSPECIFIED)
    )
    assert (code, detail.details["field"]) == (
        grpc.StatusCode.INVALID_ARGUMENT, "proposal.artifact_type",
    )  # fmt: skip
    code, _ = await _status(
        rig.rooms.SubmitVote(nr.SubmitVoteRequest(vote=nr.NegotiationVote(
            artifact_id="code-1", critic_id="c2", score=5, confidence=0.5,
        )), metadata=as_agent("c1"))
    )  # fmt: skip
    assert code is grpc.StatusCode.PERMISSION_DENIED
    await rig.vote("code-1", "c1", 9, 0.9)
    code, _ = await _status(rig.vote("code-1", "c1", 9, 0.9))
    assert code is grpc.StatusCode.ALREADY_EXISTS
    # WaitForDecision ends with DEADLINE_EXCEEDED after timeout_seconds (on the fake clock).
    sleepers = rig.clock.pending_sleepers
    waiting = asyncio.ensure_future(
        rig.rooms.WaitForDecision(
            nr.WaitForDecisionRequest(artifact_id="code-1", timeout_seconds=7)
        )
    )
    await _until(lambda: rig.clock.pending_sleepers > sleepers)
    rig.clock.advance(7)
    code, detail = await _status(waiting)
    assert (code, detail.error_code) == (grpc.StatusCode.DEADLINE_EXCEEDED, "deadline_exceeded")
    await rig.vote("code-1", "c2", 9, 0.9)
    code, detail = await _status(rig.vote("code-1", "c2", 9, 0.9))
    assert (code, detail.error_code) == (grpc.StatusCode.FAILED_PRECONDITION, "ALREADY_COMPLETED")


async def _until(condition: Any) -> None:
    """Poll the server's progress (not time): bounded by WAIT_S."""

    async def poll() -> None:
        # The fake clock has no event for "someone sleeps now": poll it, briefly.
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), WAIT_S)


async def test_the_json_gateway_serves_the_same_handlers(rig: Rig) -> None:
    base = f"http://{rig.coordinator.http_address}/v1/sw4rm.negotiation_room.NegotiationRoomService"
    artifact = base64.b64encode(b"replicas: 3\n").decode()
    async with aiohttp.ClientSession() as http:
        proposal = {"proposal": {
            "artifact_type": "DEPLOYMENT", "artifact": artifact, "artifact_content_type":
            "application/yaml", "requested_critics": ["c1"], "negotiation_room_id": "ops",
        }}  # fmt: skip
        async with http.post(f"{base}/SubmitProposal", json=proposal,
                             headers={"sw4rm-agent-id": "producer"}) as resp:  # fmt: skip
            assert resp.status == 200
            artifact_id = (await resp.json())["artifact_id"]
        bad = {"vote": {"artifact_id": artifact_id, "score": 8, "confidence": -1}}
        async with http.post(f"{base}/SubmitVote", json=bad,
                             headers={"sw4rm-agent-id": "c1"}) as resp:  # fmt: skip
            assert resp.status == 400
            body = await resp.json()
            assert "vote.confidence" in json.dumps(body)
        good = {"vote": {"artifact_id": artifact_id, "score": 8, "confidence": 0.9,
                         "passed": True}}  # fmt: skip
        async with http.post(f"{base}/SubmitVote", json=good,
                             headers={"sw4rm-agent-id": "c1"}) as resp:  # fmt: skip
            assert resp.status == 200
        async with http.post(f"{base}/GetDecision", json={"artifact_id": artifact_id}) as resp:
            decision = (await resp.json())["decision"]
    assert decision["outcome"] == "APPROVED"
    assert decision["negotiation_room_id"] == "ops"


def _cli(coordinator: Coordinator, *args: str, agent: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}  # wide enough for the tables
    if agent:
        env["APIARY_AGENT_ID"] = agent
    return subprocess.run(
        [sys.executable, "-m", "apiary.cli.main", "room", *args,
         "--grpc", str(coordinator.grpc_address)],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip


async def test_the_cli_proposes_votes_and_shows_the_decision(rig: Rig, tmp_path: Path) -> None:
    plan = tmp_path / "plan.md"
    plan.write_text("1. migrate\n2. deploy\n")
    run = asyncio.to_thread
    proposed = await run(
        _cli, rig.coordinator, "propose", "--type", "plan", "--file", str(plan),
        "--content-type", "text/markdown", "--critic", "c1", "--artifact-id", "plan-1",
        "--room", "room-9", agent="producer",
    )  # fmt: skip
    assert proposed.returncode == 0, proposed.stderr
    assert proposed.stdout.strip() == "plan-1 in room room-9"
    listed = await run(_cli, rig.coordinator, "list", "--critic", "c1", "--json")
    assert [json.loads(line)["proposal"]["artifact_id"] for line in listed.stdout.splitlines()] == [
        "plan-1"
    ]
    undecided = await run(_cli, rig.coordinator, "decision", "plan-1")
    assert undecided.returncode == 3 and "no decision yet" in undecided.stderr
    refused = await run(
        _cli, rig.coordinator, "vote", "plan-1", "--score", "11", "--confidence", "1", agent="c1"
    )
    assert refused.returncode == 1
    assert "validation_error: vote.score: must be between 0 and 10" in refused.stderr
    voted = await run(
        _cli, rig.coordinator, "vote", "plan-1", "--score", "9", "--confidence", "0.9",
        "--strength", "small steps", agent="c1",
    )  # fmt: skip
    assert voted.returncode == 0, voted.stderr
    waited = await run(_cli, rig.coordinator, "wait", "plan-1", "--timeout", "5", "--json")
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout)["outcome"] == "APPROVED"
    shown = await run(_cli, rig.coordinator, "show", "plan-1", "--json")
    doc = json.loads(shown.stdout)
    assert doc["state"] == "APPROVED" and doc["proposal"]["artifact_type"] == "PLAN"
    assert doc["votes"][0]["strengths"] == ["small steps"]
    assert doc["decisions"][0]["via"] == "policy"
    table = await run(_cli, rig.coordinator, "list")
    assert "plan-1" in table.stdout and "APPROVED" in table.stdout


@pytest.mark.conformance("room.escalate.vote-timeout")
async def test_the_coordinators_timer_loop_escalates_at_the_policy_timeout(rig: Rig) -> None:
    await rig.propose("code-1", ["c1", "c2"])
    await rig.vote("code-1", "c1", 9, 0.9)
    rig.clock.advance(ROOMS.policy.vote_timeout_s)
    found = await wait_for_event(
        rig.coordinator.events, lambda e: e.event_type == "room.escalated", timeout_s=WAIT_S
    )
    assert found.details["triggers"] == ["vote_timeout"]
    assert found.details["hitl_reason"] == "DEBATE_DEADLOCK"
    reply = await rig.rooms.GetDecision(nr.GetDecisionRequest(artifact_id="code-1"))
    assert reply.decision.outcome == nr.ESCALATED_TO_HITL
    assert "no vote from c2" in reply.decision.reason
