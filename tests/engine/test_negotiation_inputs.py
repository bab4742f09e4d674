"""Negotiation inputs beyond the RPCs: NEGOTIATION envelopes addressed to the Scheduler, the
Inference Engine's confidence, HITL gates and an absent HITL component (RFC 17, 17.3, 15.3)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from apiary.core.envelope import MessageType
from apiary.core.negotiation.policy import HitlGate, NegotiationPolicy
from apiary.engine.hitl import HitlSettings
from apiary.engine.negotiation.inference import DebateVerdict
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.errors import PermissionDeniedError, ValidationError
from apiary.sdk import negotiation as sdk
from apiary.testing.engine import EngineHarness, open_test_engine
from tests.engine.test_negotiations import A, B, _kinds, _open, _settings, _types, _until

OLIVIA = OperatorEntry("olivia", token_digest("olivia-token"), ("admin",))


async def _harness(**options: Any) -> AsyncIterator[EngineHarness]:
    async with open_test_engine(**options) as h:
        await h.register("frontend")
        await h.register("graphql")
        yield h


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async for harness in _harness(hitl=HitlSettings(operators=(OLIVIA,)),
                                  negotiation=_settings()):  # fmt: skip
        yield harness


@pytest.mark.conformance("negotiation.messages.kinds")
async def test_participants_negotiate_with_negotiation_envelopes(h: EngineHarness) -> None:
    await _open(h)

    async def send(agent: str, body: bytes, correlation: str = "neg-1") -> None:
        env = h.envelope(agent, body, message_type=MessageType.NEGOTIATION,
                         correlation_id=correlation)  # fmt: skip
        await h.send_env(env, "scheduler")

    await send("frontend", sdk.proposal("neg-1", A))
    await send("graphql", sdk.proposal("", B, counter=True))  # negotiation from correlation
    await send("frontend", sdk.evaluation("neg-1", 0.95, "B is better"))
    record = await h.engine.negotiations.get("neg-1")
    assert (record.state, record.decision["version"]) == ("DECIDED", "v2")
    assert await _kinds(h, "graphql") == ["open", "policy", "propose", "counter", "evaluate",
                                          "decide"]  # fmt: skip
    with pytest.raises(PermissionDeniedError):
        body = sdk.evaluation("neg-1", 0.1).replace(b'"kind"', b'"from":"graphql","kind"')
        await send("frontend", body)
    with pytest.raises(ValidationError) as caught:
        await send("frontend", b'{"kind": "decide", "negotiation_id": "neg-1"}')
    assert caught.value.details["field"] == "kind"


class ScriptedInference:
    name = "scripted"

    def __init__(self, confidence: float | None) -> None:
        self.confidence = confidence
        self.calls: list[tuple[str, str]] = []

    async def evaluate_debate(
        self, negotiation_id: str, proposal_a: str, proposal_b: str, intensity: str
    ) -> DebateVerdict:
        self.calls.append((proposal_a, proposal_b))
        if self.confidence is None:
            raise ConnectionError("inference engine unreachable")
        return DebateVerdict(self.confidence, "scripted")


@pytest.mark.conformance(
    "negotiation.scoring.deterministic-first", "patterns.scoring.deterministic-first",
)  # fmt: skip
async def test_the_inference_confidence_comes_after_the_deterministic_checks(
    h: EngineHarness,
) -> None:
    inference = ScriptedInference(0.71)
    h.engine.negotiations.inference = inference
    await h.engine.negotiations.policies.set_base(NegotiationPolicy(llm_weight=0.5), "test")
    await _open(h)
    await h.engine.negotiations.propose("neg-1", "frontend", "application/json", A)
    assert inference.calls == []  # nothing to compare the first draft with
    await h.engine.negotiations.propose("neg-1", "graphql", "application/json", B, counter=True)
    assert inference.calls == [(A.decode(), B.decode())]
    types = _types(await h.events())
    assert types.index("negotiation.countered") < types.index("negotiation.inference")
    (consulted,) = await h.events("negotiation.inference")
    assert (consulted.details["confidence_score"], consulted.details["round"]) == (0.71, 2)
    round_ = await h.engine.negotiations.evaluate("neg-1", "frontend", 0.9)
    report = round_.evaluations["frontend"]
    assert (report["deterministic_score"], report["llm_confidence"], report["score"]) == (
        0.9, 0.71, 0.805,
    )  # fmt: skip


@pytest.mark.conformance("defaults.inference-unreachable.shorten-debates")
async def test_an_unreachable_inference_engine_shortens_the_debate(h: EngineHarness) -> None:
    h.engine.negotiations.inference = ScriptedInference(None)
    await h.engine.negotiations.policies.set_base(NegotiationPolicy(llm_weight=0.5), "test")
    await _open(h)
    await h.engine.negotiations.propose("neg-1", "frontend", "application/json", A)
    await h.engine.negotiations.propose("neg-1", "graphql", "application/json", B, counter=True)
    (unavailable,) = await h.events("negotiation.inference_unavailable")
    assert "unreachable" in unavailable.details["reason"]
    (shortened,) = await h.events("negotiation.shortened")
    assert (shortened.details["from_max_rounds"], shortened.details["to_max_rounds"]) == (6, 3)
    effective = await h.engine.negotiations.effective("neg-1")
    assert effective.policy.max_rounds == 3
    assert (await _kinds(h, "frontend"))[-1] == "policy"  # the new policy is broadcast


async def test_pause_between_rounds_resumes_when_an_operator_approves(h: EngineHarness) -> None:
    await h.engine.negotiations.policies.set_base(
        NegotiationPolicy(hitl=HitlGate.PAUSE_BETWEEN_ROUNDS), "test"
    )
    await _open(h)
    await h.engine.negotiations.propose("neg-1", "frontend", "application/json", A)
    await h.engine.negotiations.evaluate("neg-1", "graphql", 0.3)
    record = await h.engine.negotiations.get("neg-1")
    assert record.state == "PAUSED"
    with pytest.raises(ValidationError, match="PAUSED"):
        await h.engine.negotiations.propose("neg-1", "graphql", "application/json", B)
    assert h.engine.negotiations.next_deadline() is None  # no timer while HITL decides
    operator = h.engine.hitl.operators.authenticate("Bearer olivia-token")
    await h.engine.hitl.decide(record.invocation_id, "approve", operator, "one more round")
    resumed = await _until(h, "neg-1", "AWAITING_COUNTER")
    assert resumed.round_deadline == h.clock.now() + 60
    await h.engine.negotiations.propose("neg-1", "graphql", "application/json", B, counter=True)
    assert (await h.engine.negotiations.get("neg-1")).round == 2


@pytest.mark.conformance("hitl.absent.fallback-logged")
async def test_without_a_hitl_component_the_deadlock_falls_back_at_once() -> None:
    async for h in _harness(negotiation=_settings(NegotiationPolicy(max_rounds=1))):
        await _open(h)
        await h.engine.negotiations.propose("neg-1", "frontend", "application/json", A)
        await h.engine.negotiations.evaluate("neg-1", "graphql", 0.2)
        ended = await _until(h, "neg-1", "ABORTED")
        assert ended.decision["error_code"] == "hitl_unavailable"
        assert (ended.decision["hitl"]["via"], ended.decision["hitl"]["policy"]) == (
            "absent", "DENY_BY_DEFAULT",
        )  # fmt: skip
        (escalated,) = await h.events("negotiation.escalated")
        assert escalated.details["hitl_available"] is False
