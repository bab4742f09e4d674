"""Negotiations over real gRPC sockets: NegotiationService, SchedulerPolicyService,
ActivityService and apiary.v1.NegotiationOperatorService (RFC 17, 17.2, 17.4)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration

from apiary.engine.assembly import Runtime
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.errors import (
    NotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
    ValidationError,
)
from apiary.sdk.client import Client
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb

TOKEN = "negotiation-operator-token"
HITL = HitlSettings(operators=(OperatorEntry("olivia", token_digest(TOKEN), ("admin",)),))
AUTH = {"authorization": f"Bearer {TOKEN}"}
n = pb.negotiation_pb2
p = pb.policy_pb2
s = pb.scheduler_policy_pb2
act = pb.activity_pb2
a = pb.apiary_pb2
DRAFT_A = b'{"path": "/api/v3/orders", "fields": ["id"]}'
DRAFT_B = b'{"path": "/api/v3/orders", "fields": ["id", "total"]}'


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path, runtime=Runtime(hitl=HITL)) as running:
        for agent in ("frontend", "graphql"):
            await running.registry.register(
                {
                    "agent_id": agent,
                    "name": agent,
                    "modalities_supported": ["application/json"],
                    "reasoning_connectors": ["builtin://rules"],
                }
            )
        yield running


@pytest.fixture
async def client(coordinator: Coordinator) -> AsyncIterator[Client]:
    async with Client(str(coordinator.grpc_address)) as c:
        yield c


@pytest.fixture
async def operator(coordinator: Coordinator) -> AsyncIterator[Client]:
    async with Client(str(coordinator.grpc_address), metadata=AUTH) as c:
        yield c


def _open(nid: str = "neg-1", **fields: object) -> n.NegotiationOpen:
    values: dict[str, object] = {
        "negotiation_id": nid, "topic": "/api/v3/orders", "participants": ["frontend", "graphql"],
        "intensity": pb.common_pb2.HIGH, "debate_timeout": Duration(seconds=300), **fields,
    }  # fmt: skip
    return n.NegotiationOpen(**values)  # type: ignore[arg-type]


async def test_the_canonical_service_runs_a_negotiation(
    coordinator: Coordinator, client: Client
) -> None:
    await client.negotiation.Open(_open(correlation_id="neg-1"))
    await client.negotiation.Propose(
        n.Proposal(
            negotiation_id="neg-1",
            from_agent="frontend",
            content_type="application/json",
            payload=DRAFT_A,
        )
    )
    await client.negotiation.Counter(
        n.CounterProposal(
            negotiation_id="neg-1",
            from_agent="graphql",
            content_type="application/json",
            payload=DRAFT_B,
        )
    )
    await client.negotiation.Evaluate(
        n.Evaluation(negotiation_id="neg-1", from_agent="frontend", confidence_score=0.95)
    )
    assert coordinator.negotiations is not None
    record = await coordinator.negotiations.get("neg-1")
    assert (record.state, record.decision["version"], record.intensity) == ("DECIDED", "v2",
                                                                             "HIGH")  # fmt: skip
    listed = await client.activity.ListArtifacts(act.ListArtifactsRequest(negotiation_id="neg-1"))
    assert [f"{i.kind}_{i.version}.json" for i in listed.items] == [
        "contract_v1.json", "contract_v2.json", "diff_v1_to_v2.json", "score_v2.frontend.json",
        "decision_final.json",
    ]  # fmt: skip
    assert listed.items[1].content == DRAFT_B
    assert listed.items[0].created_at.endswith("Z")
    contracts = await client.activity.ListArtifacts(
        act.ListArtifactsRequest(negotiation_id="neg-1", kind="contract")
    )
    assert len(contracts.items) == 2


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (_open(negotiation_id=""), "negotiation_id"),
        (_open(topic=""), "topic"),
        (_open(participants=["frontend"]), "participants"),
        (_open(intensity=0), "intensity"),
        (_open(correlation_id="other"), "correlation_id"),
        (_open(participants=["frontend", "ghost"]), "participants"),
    ],
)
async def test_a_bad_open_is_invalid_argument_naming_the_field(
    client: Client, request_: n.NegotiationOpen, field: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        await client.negotiation.Open(request_)
    assert caught.value.details["field"] == field


async def test_callers_speak_only_for_themselves(coordinator: Coordinator) -> None:
    address = str(coordinator.grpc_address)
    async with Client(address, agent_id="graphql") as graphql:
        await graphql.negotiation.Open(_open())
        with pytest.raises(PermissionDeniedError) as caught:
            await graphql.negotiation.Propose(
                n.Proposal(negotiation_id="neg-1", from_agent="frontend", payload=DRAFT_A)
            )
        assert caught.value.details["field"] == "from_agent"
        await graphql.negotiation.Propose(n.Proposal(negotiation_id="neg-1", payload=DRAFT_A))
        with pytest.raises(ValidationError) as score:
            await graphql.negotiation.Evaluate(
                n.Evaluation(negotiation_id="neg-1", confidence_score=7)
            )
        assert score.value.details["field"] == "confidence_score"
    async with Client(address, agent_id="frontend") as frontend:
        with pytest.raises(PermissionDeniedError):  # frontend did not open it
            await frontend.negotiation.Decide(n.Decision(negotiation_id="neg-1", decided_by="hitl"))
        await frontend.negotiation.Abort(n.AbortRequest(negotiation_id="neg-1", reason="scope"))
    assert coordinator.negotiations is not None
    assert (await coordinator.negotiations.get("neg-1")).state == "ABORTED"


@pytest.mark.conformance("negotiation.policy.derive-effective", "negotiation.stubs.policy-service")
async def test_policies_profiles_and_effective_policies(client: Client, operator: Client) -> None:
    with pytest.raises(UnauthenticatedError):
        await client.scheduler_policy.SetNegotiationPolicy(
            s.SetNegotiationPolicyRequest(policy=p.NegotiationPolicy(max_rounds=4))
        )
    base = p.NegotiationPolicy(
        max_rounds=4, score_threshold=0.8, diff_tolerance=1.0, round_timeout_ms=30_000,
        token_budget_per_round=4096, oscillation_limit=2,
        hitl=p.NegotiationPolicy.Hitl(mode="None"),
        scoring=p.NegotiationPolicy.Scoring(require_schema_valid=True, llm_weight=0.2),
    )  # fmt: skip
    done = await operator.scheduler_policy.SetNegotiationPolicy(
        s.SetNegotiationPolicyRequest(policy=base)
    )
    assert (done.ok, done.reason) == (True, "")
    got = await client.scheduler_policy.GetNegotiationPolicy(s.GetNegotiationPolicyRequest())
    assert got.policy.max_rounds == 4
    assert got.policy.score_threshold == pytest.approx(0.8)
    refused = await operator.scheduler_policy.SetNegotiationPolicy(
        s.SetNegotiationPolicyRequest(
            policy=p.NegotiationPolicy(max_rounds=99, round_timeout_ms=1000)
        )
    )
    assert not refused.ok
    assert refused.reason == "policy.max_rounds: 99 is outside the guardrails [1, 50]"
    with pytest.raises(ValidationError) as bad:
        await operator.scheduler_policy.SetNegotiationPolicy(
            s.SetNegotiationPolicyRequest(policy=p.NegotiationPolicy(max_rounds=0))
        )
    assert bad.value.details["field"] == "policy.max_rounds"
    quick = p.NegotiationPolicy()
    quick.CopyFrom(base)
    quick.max_rounds = 1
    zero = p.NegotiationPolicy(max_rounds=1, round_timeout_ms=5000)  # score_threshold 0
    unset = await operator.scheduler_policy.SetPolicyProfiles(
        s.SetPolicyProfilesRequest(profiles=[p.PolicyProfile(name="bad", policy=zero)])
    )
    assert unset.reason == (
        "profiles[0].policy.score_threshold: 0 is outside the guardrails [0.5, 1]"
    )
    profiles = s.SetPolicyProfilesRequest(profiles=[p.PolicyProfile(name="quick", policy=quick)])
    assert (await operator.scheduler_policy.SetPolicyProfiles(profiles)).ok
    listed = await client.scheduler_policy.ListPolicyProfiles(s.ListPolicyProfilesRequest())
    assert [x.name for x in listed.profiles] == ["LOWEST", "LOW", "MEDIUM", "HIGH", "HIGHEST",
                                                 "quick"]  # fmt: skip
    assert [x.policy.max_rounds for x in listed.profiles][:5] == [1, 2, 4, 6, 8]
    view = await client.negotiation_operator.Open(
        a.OpenNegotiationRequest(
            open=_open(negotiation_id=""),
            profile="quick",
            preferences={"frontend": p.AgentPreferences(score_threshold=0.9)},
            validation_json=json.dumps({"schema": {"type": "object"}}),
        )
    )
    assert view.negotiation_id and view.profile == "quick" and view.state == "OPEN"
    effective = await client.scheduler_policy.GetEffectivePolicy(
        s.GetEffectivePolicyRequest(negotiation_id=view.negotiation_id)
    )
    assert effective.effective.policy.max_rounds == 1
    assert effective.effective.policy.score_threshold == pytest.approx(0.9)
    assert effective.effective.applied["frontend"].score_threshold == pytest.approx(0.9)
    with pytest.raises(NotFoundError):
        await client.scheduler_policy.GetEffectivePolicy(
            s.GetEffectivePolicyRequest(negotiation_id="nope")
        )
    with pytest.raises(ValidationError) as prefs:
        await client.negotiation_operator.Open(
            a.OpenNegotiationRequest(
                open=_open(negotiation_id="neg-2"),
                preferences={"frontend": p.AgentPreferences(score_threshold=3)},
            )
        )
    assert prefs.value.details["field"] == "preferences.frontend.score_threshold"


@pytest.mark.conformance("negotiation.stubs.evaluation-reports")
async def test_evaluation_reports_and_hitl_actions(
    coordinator: Coordinator, client: Client, operator: Client
) -> None:
    await client.negotiation.Open(_open())
    await client.negotiation.Propose(
        n.Proposal(negotiation_id="neg-1", from_agent="frontend", payload=DRAFT_A)
    )
    report = p.EvaluationReport(from_agent="graphql", deterministic_score=0.5,
                                llm_confidence=0.4, notes="needs totals")  # fmt: skip
    first = await client.scheduler_policy.SubmitEvaluation(
        s.SubmitEvaluationRequest(negotiation_id="neg-1", report=report)
    )
    assert first.accepted
    again = await client.scheduler_policy.SubmitEvaluation(
        s.SubmitEvaluationRequest(negotiation_id="neg-1", report=report)
    )
    assert not again.accepted and again.reason.startswith("validation_error")
    with pytest.raises(ValidationError) as bad:
        await client.scheduler_policy.SubmitEvaluation(s.SubmitEvaluationRequest(
            negotiation_id="neg-1", report=p.EvaluationReport(from_agent="graphql",
                                                              deterministic_score=2),
        ))  # fmt: skip
    assert bad.value.details["field"] == "report.deterministic_score"
    # Two rounds at most (a participant's preference tightens the policy), then HITL.
    await client.negotiation_operator.Open(a.OpenNegotiationRequest(
        open=_open("neg-2"), preferences={"frontend": p.AgentPreferences(max_rounds=2)},
    ))  # fmt: skip
    await client.negotiation.Propose(
        n.Proposal(negotiation_id="neg-2", from_agent="frontend", payload=DRAFT_A)
    )
    await client.negotiation.Counter(
        n.CounterProposal(negotiation_id="neg-2", from_agent="graphql", payload=DRAFT_B)
    )
    await client.negotiation.Evaluate(
        n.Evaluation(negotiation_id="neg-2", from_agent="frontend", confidence_score=0.4)
    )
    assert coordinator.negotiations is not None
    assert (await coordinator.negotiations.get("neg-2")).state == "AWAITING_HITL"
    with pytest.raises(ValidationError) as unknown:
        await operator.scheduler_policy.HitlAction(
            s.HitlActionRequest(negotiation_id="neg-2", action="decide=v7", rationale="?")
        )
    assert unknown.value.details["field"] == "action"
    with pytest.raises(UnauthenticatedError):
        await client.scheduler_policy.HitlAction(
            s.HitlActionRequest(negotiation_id="neg-2", action="approve", rationale="?")
        )
    reply = await operator.scheduler_policy.HitlAction(
        s.HitlActionRequest(
            negotiation_id="neg-2", action="decide=frontend", rationale="A is enough"
        )
    )
    assert reply.ok and reply.reason.endswith("DECIDED")
    await _settled(coordinator, "neg-2")
    got = await client.negotiation_operator.Get(a.GetNegotiationRequest(negotiation_id="neg-2"))
    assert (got.state, got.decision.decided_by, got.decision.stop_reason) == (
        "DECIDED", "hitl", "max_rounds",
    )  # fmt: skip
    assert [r.from_agent for r in got.rounds] == ["frontend", "graphql"]
    assert list(got.rounds[1].delta.changed_paths) == ["/fields/1"]
    listed = await client.negotiation_operator.List(a.ListNegotiationsRequest(states=["decided"]))
    assert [v.negotiation_id for v in listed.negotiations] == ["neg-2"]
    with pytest.raises(ValidationError) as state:
        await client.negotiation_operator.List(a.ListNegotiationsRequest(states=["done"]))
    assert state.value.details["field"] == "states"


async def _settled(coordinator: Coordinator, nid: str) -> None:
    """Wait (bounded, driven by the event log) until the negotiation is decided."""
    engine = coordinator.negotiations
    assert engine is not None

    async def wait() -> None:
        while True:
            seen = await coordinator.events.last_sequence()
            if (await engine.get(nid)).state == "DECIDED":
                return
            await coordinator.events.wait_after(seen)

    await asyncio.wait_for(wait(), 10)


@pytest.mark.conformance("negotiation.stubs.artifact-service")
async def test_artifacts_are_written_once_and_checked(client: Client) -> None:
    item = act.Artifact(negotiation_id="neg-9", kind="note", version="v1",
                        content_type="text/plain", content=b"agreed offline")  # fmt: skip
    assert (await client.activity.AppendArtifact(act.AppendArtifactRequest(artifact=item))).ok
    same = await client.activity.AppendArtifact(act.AppendArtifactRequest(artifact=item))
    assert same.ok and "already recorded" in same.reason
    other = act.Artifact(negotiation_id="neg-9", kind="note", version="v1", content=b"changed")
    refused = await client.activity.AppendArtifact(act.AppendArtifactRequest(artifact=other))
    assert not refused.ok and refused.reason.startswith("already_exists")
    for bad, field in (
        (act.Artifact(negotiation_id="neg-9", kind="poem", version="v1"), "artifact.kind"),
        (act.Artifact(negotiation_id="", kind="note", version="v1"), "artifact.negotiation_id"),
        (act.Artifact(negotiation_id="n", kind="note", version="../x"), "artifact.version"),
        (act.Artifact(negotiation_id="n", kind="note", version="v1", created_at="yesterday"),
         "artifact.created_at"),
    ):  # fmt: skip
        with pytest.raises(ValidationError) as caught:
            await client.activity.AppendArtifact(act.AppendArtifactRequest(artifact=bad))
        assert caught.value.details["field"] == field
    listed = await client.activity.ListArtifacts(act.ListArtifactsRequest(negotiation_id="neg-9"))
    assert [(i.kind, i.content) for i in listed.items] == [("note", b"agreed offline")]


async def test_the_json_gateway_serves_the_same_methods(coordinator: Coordinator) -> None:
    import aiohttp  # noqa: PLC0415 - only this test speaks HTTP

    async with aiohttp.ClientSession(base_url=f"http://{coordinator.http_address}") as http:

        async def call(path: str, body: object) -> tuple[int, dict[str, object]]:
            async with http.post(f"/v1/{path}", data=json.dumps(body)) as resp:
                return resp.status, await resp.json()

        status, _ = await call("sw4rm.negotiation.NegotiationService/Open", {
            "negotiation_id": "neg-h", "topic": "/api", "participants": ["frontend", "graphql"],
            "intensity": "LOW",
        })  # fmt: skip
        assert status == 200
        status, got = await call(
            "sw4rm.scheduler.SchedulerPolicyService/GetEffectivePolicy", {"negotiation_id": "neg-h"}
        )
        assert status == 200
        assert got["effective"]["policy"]["max_rounds"] == 3  # type: ignore[index]
        status, error = await call("sw4rm.negotiation.NegotiationService/Open", {
            "negotiation_id": "neg-h", "topic": "/api", "participants": ["frontend", "graphql"],
            "intensity": "LOW",
        })  # fmt: skip
        assert status == 409
        assert "already exists" in json.dumps(error)
