"""Negotiations through the engine on a fake clock (RFC 17, 17.1-17.4, 15.4): fanout to the
participants, artifacts, timeouts in virtual time, HITL decisions and fallbacks, inference,
NEGOTIATION envelopes addressed to the Scheduler."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest

from apiary.core.envelope import MessageType
from apiary.core.hitl.policy import HitlPolicy
from apiary.core.hitl.vocabulary import UnavailablePolicy
from apiary.core.negotiation.events import decode_event
from apiary.core.negotiation.policy import NegotiationPolicy
from apiary.core.negotiation.records import NegotiationRecord
from apiary.engine.hitl import HitlSettings
from apiary.engine.negotiation.policies import NegotiationSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.errors import (
    AlreadyCompletedError,
    AlreadyExistsError,
    NotFoundError,
    PermissionDeniedError,
    ValidationError,
)
from apiary.testing.engine import EngineHarness, open_test_engine

OLIVIA = OperatorEntry("olivia", token_digest("olivia-token"), ("admin",))
WITH_OPERATOR = HitlSettings(operators=(OLIVIA,))
A = b'{"path": "/api/v3/orders", "fields": ["id", "total"]}'
B = b'{"path": "/api/v3/orders", "fields": ["id", "total", "currency"]}'


def _settings(policy: NegotiationPolicy | None = None, **extra: Any) -> NegotiationSettings:
    return NegotiationSettings(base_policy=policy or NegotiationPolicy(), **extra)


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine(hitl=WITH_OPERATOR, negotiation=_settings()) as harness:
        await harness.register("frontend")
        await harness.register("graphql")
        yield harness


async def _open(h: EngineHarness, nid: str = "neg-1", **options: Any) -> NegotiationRecord:
    values: dict[str, Any] = {
        "negotiation_id": nid, "topic": "/api/v3/orders",
        "participants": ["frontend", "graphql"], "intensity": "MEDIUM",
        "opened_by": "scheduler", **options,
    }  # fmt: skip
    return await h.engine.negotiations.open(**values)


async def _fanout(h: EngineHarness, agent: str) -> list[tuple[bytes, str]]:
    """(payload, correlation_id) of every NEGOTIATION envelope in the agent's inbox."""
    found = []
    for message in await h.store.messages.inbox(agent, 0, 10_000):
        env = h.engine.router.codec.decode(message.envelope)
        if env.message_type is MessageType.NEGOTIATION:
            found.append((env.payload, env.correlation_id))
    return found


async def _kinds(h: EngineHarness, agent: str) -> list[str]:
    return [decode_event(p).kind for p, _ in await _fanout(h, agent)]


async def _until(h: EngineHarness, nid: str, state: str) -> NegotiationRecord:
    """The negotiation once it reaches `state`, driven by new events (bounded)."""

    async def wait() -> NegotiationRecord:
        while True:
            seen = await h.engine.events.last_sequence()
            record = await h.engine.negotiations.get(nid)
            if record.state == state:
                return record
            await h.engine.events.wait_after(seen)

    return await asyncio.wait_for(wait(), 5)


def _types(events: list[Any], prefix: str = "negotiation.") -> list[str]:
    return [e.event_type for e in events if e.event_type.startswith(prefix)]


async def test_a_reader_that_sees_the_decision_finds_its_report(
    h: EngineHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decision and its artifacts are one write: there is no moment at which the stored
    state says DECIDED and the decision report is not there yet."""
    negotiations, seen = h.store.negotiations, []
    save = negotiations.save

    async def save_and_look(
        record: Any, round_: Any = None, artifacts: Any = (), events: Any = (),
        artifact_events: Any = (),
    ) -> list[bool]:  # fmt: skip
        added = await save(record, round_, artifacts, events, artifact_events)
        listed = await h.store.artifacts.list(record.negotiation_id)
        logged = [e.details["name"] for e in await h.store.events.read(limit=10_000)
                  if e.event_type == "artifact.appended"]  # fmt: skip
        seen.append((record.state, [a.name for a in listed], logged))
        return added

    monkeypatch.setattr(negotiations, "save", save_and_look)
    await _open(h)
    await h.engine.negotiations.propose("neg-1", "frontend", "application/json", A)
    await h.engine.negotiations.evaluate("neg-1", "graphql", 0.9, "matches our schema")
    decided = [names for state, names, _ in seen if state == "DECIDED"]
    assert decided == [["contract_v1.json", "score_v1.graphql.json", "decision_final.json"]]
    # Each artifact is logged once, in the write that holds it: the log has the event of
    # every artifact stored as soon as that write returns.
    assert all(logged == names for _, names, logged in seen)
    logged = [e.details["name"] for e in await h.events() if e.event_type == "artifact.appended"]
    assert logged == decided[0]


@pytest.mark.conformance(
    "negotiation.events.preserve-correlation", "patterns.events.preserve-correlation",
    "negotiation.events.no-reorder", "patterns.events.no-reorder",
    "negotiation.events.preserve-payload", "patterns.events.preserve-payload",
    "negotiation.policy.persist-per-room", "patterns.policy.persist-per-room",
    "negotiation.no-repo-mutation", "observability.log.repo-worktree-negotiation",
)  # fmt: skip
async def test_a_consensus_is_fanned_out_in_order_with_its_artifacts(h: EngineHarness) -> None:
    await _open(h)
    stored = await h.store.negotiations.get("neg-1")
    assert stored is not None and stored.policy["policy"]["max_rounds"] == 6
    await h.engine.negotiations.propose("neg-1", "frontend", "application/json", A)
    await h.engine.negotiations.evaluate("neg-1", "graphql", 0.9, "matches our schema")
    record = await h.engine.negotiations.get("neg-1")
    assert (record.state, record.decision["decided_by"]) == ("DECIDED", "consensus")
    for agent in ("frontend", "graphql"):
        assert await _kinds(h, agent) == ["open", "policy", "propose", "evaluate", "decide"]
        fanned = await _fanout(h, agent)
        assert {corr for _, corr in fanned} == {"neg-1"}
        assert decode_event(fanned[2][0]).payload() == A  # the draft's bytes, unchanged
        assert decode_event(fanned[4][0]).result() == A
    # Both participants receive the very same event bytes.
    assert await _fanout(h, "frontend") == await _fanout(h, "graphql")
    names = [a.name for a in await h.engine.negotiations.artifacts.list("neg-1")]
    assert names == ["contract_v1.json", "score_v1.graphql.json", "decision_final.json"]
    logged = [e for e in await h.events() if e.event_type.startswith("negotiation.")]
    assert [e.event_type for e in logged] == [
        "negotiation.opened", "negotiation.proposed", "negotiation.evaluated",
        "negotiation.decided",
    ]  # fmt: skip
    # Each names its negotiation and correlates by it (as worktree events name repo and
    # worktree: tests/engine/test_worktrees.py).
    assert {(e.correlation_id, e.details["negotiation_id"]) for e in logged} == {("neg-1", "neg-1")}
    # The negotiation mutated nothing: no task, no message but its own NEGOTIATION events.
    assert h.engine.scheduler.depth() == 0 and not h.engine.scheduler.counts()
    types = {h.engine.router.codec.decode(m.envelope).message_type
             for m in await h.store.messages.inbox("graphql", 0, 10_000)}  # fmt: skip
    assert MessageType.NEGOTIATION in types
    assert not types & {MessageType.DATA, MessageType.CONTROL, MessageType.WORKTREE_CONTROL}


async def test_bad_input_is_refused_with_the_field_named(h: EngineHarness) -> None:
    with pytest.raises(ValidationError) as caught:
        await _open(h, participants=["frontend", "nobody"])
    assert caught.value.details["field"] == "participants"
    assert "nobody is not a registered agent" in caught.value.message
    with pytest.raises(NotFoundError) as profile:
        await _open(h, profile="no-such-profile")
    assert profile.value.details["field"] == "profile"
    await _open(h)
    with pytest.raises(AlreadyExistsError):
        await _open(h)
    with pytest.raises(ValidationError) as early:
        await h.engine.negotiations.evaluate("neg-1", "graphql", 0.5)
    assert "no draft to evaluate" in early.value.message
    with pytest.raises(NotFoundError):
        await h.engine.negotiations.propose("neg-9", "frontend", "", A)
    with pytest.raises(PermissionDeniedError):
        await h.engine.negotiations.decide("neg-1", by="graphql", decided_by="policy",
                                           content_type="", result=b"x")  # fmt: skip
    with pytest.raises(PermissionDeniedError):
        await h.engine.negotiations.abort("neg-1", by="mallory", reason="mine now")
    await h.engine.negotiations.abort("neg-1", by="graphql", reason="out of scope")
    with pytest.raises(AlreadyCompletedError):
        await h.engine.negotiations.propose("neg-1", "frontend", "", A)
    assert await _kinds(h, "frontend") == ["open", "policy", "abort"]


async def test_an_invalid_draft_is_logged_and_refused_without_a_round(h: EngineHarness) -> None:
    schema = {"type": "object", "required": ["path", "fields"]}
    await _open(h, validation={"schema": schema})
    with pytest.raises(ValidationError) as caught:
        await h.engine.negotiations.propose("neg-1", "frontend", "application/json", b'{"a": 1}')
    assert caught.value.details["field"] == "payload"
    record = await h.engine.negotiations.get("neg-1")
    assert (record.round, record.state, record.tokens_spent) == (0, "OPEN", 0)
    (refused,) = await h.events("negotiation.draft_refused")
    assert "'path' is a required property" in refused.details["reason"]
    assert await _kinds(h, "graphql") == ["open", "policy"]
    await h.engine.negotiations.propose("neg-1", "frontend", "application/json", A)
    assert (await h.engine.negotiations.get("neg-1")).round == 1


@pytest.mark.conformance("negotiation.timeout.enforce", "negotiation.deadlock.handle")
async def test_a_round_timeout_escalates_and_an_operator_decides(h: EngineHarness) -> None:
    await _open(h)
    await h.engine.negotiations.propose("neg-1", "frontend", "application/json", A)
    await h.engine.negotiations.propose("neg-1", "graphql", "application/json", B, counter=True)
    await h.engine.negotiations.evaluate("neg-1", "frontend", 0.71)
    assert h.engine.negotiations.next_deadline() == h.clock.now() + 60
    h.clock.advance(59.9)
    assert await h.engine.negotiations.fire_due() == 0
    h.clock.advance(0.1)
    assert await h.engine.negotiations.fire_due() == 1
    record = await h.engine.negotiations.get("neg-1")
    assert (record.state, record.stop_reason) == ("AWAITING_HITL", "timeout")
    (invocation,) = await h.engine.hitl.list()
    assert invocation.invocation_id == record.invocation_id
    assert (invocation.reason_type, invocation.subject["negotiation_id"]) == (
        "DEBATE_DEADLOCK", "neg-1",
    )  # fmt: skip
    assert invocation.context["suggested_version"] == "v2"
    target, action, patch = await h.engine.negotiations.hitl_action("neg-1", "decide=frontend")
    assert (target, action, patch) == (invocation.invocation_id, "modify", {"accept": "v1"})
    operator = h.engine.hitl.operators.authenticate("Bearer olivia-token")
    await h.engine.hitl.decide(target, action, operator, "A keeps v2 clients working", patch)
    decided = await _until(h, "neg-1", "DECIDED")
    assert (decided.decision["decided_by"], decided.decision["version"]) == ("hitl", "v1")
    assert decided.decision["hitl"]["decided_by"] == "olivia"
    assert base64.b64decode(decided.decision["result_b64"]) == A
    assert (await _kinds(h, "graphql"))[-1] == "decide"
    assert _types(await h.events())[-3:] == [
        "negotiation.deadlocked", "negotiation.escalated", "negotiation.decided",
    ]  # fmt: skip


@pytest.mark.conformance(
    "hitl.unavailable.apply-policy", "hitl.unavailable.deny-aborts", "hitl.unavailable.log",
)  # fmt: skip
@pytest.mark.parametrize(
    ("policy", "score", "state", "error_code"),
    [
        (UnavailablePolicy.DENY_BY_DEFAULT, 0.9, "ABORTED", "hitl_unavailable"),
        (UnavailablePolicy.AUTO_DECIDE_THRESHOLD, 0.9, "DECIDED", ""),
        (UnavailablePolicy.AUTO_DECIDE_THRESHOLD, 0.5, "ABORTED", "hitl_unavailable"),
    ],
)
async def test_unavailable_hitl_applies_the_fallback_to_the_deadlock(
    policy: UnavailablePolicy, score: float, state: str, error_code: str
) -> None:
    hitl = HitlSettings(
        policy=HitlPolicy(unavailable_policy=policy, auto_decide_threshold=0.8),
        operators=(OLIVIA,), presence_required=True,
    )  # fmt: skip
    settings = _settings(NegotiationPolicy(max_rounds=1, score_threshold=0.95))
    async with open_test_engine(hitl=hitl, negotiation=settings) as h:
        await h.register("frontend")
        await h.register("graphql")
        await _open(h)
        await h.engine.negotiations.propose("neg-1", "frontend", "application/json", A)
        await h.engine.negotiations.evaluate("neg-1", "graphql", score)
        record = await h.engine.negotiations.get("neg-1")
        assert (record.state, record.stop_reason) == ("AWAITING_HITL", "max_rounds")
        h.clock.advance(5)
        await h.engine.hitl.tick()
        ended = await _until(h, "neg-1", state)
        audit = ended.decision["hitl"]
        assert (audit["via"], audit["fallback"], audit["policy"]) == ("unavailable", True,
                                                                      policy.value)  # fmt: skip
        assert ended.decision.get("error_code", "") == error_code
        if state == "DECIDED":
            assert ended.decision["decided_by"] == "policy"
        (fallback,) = await h.events("hitl.fallback")
        assert fallback.correlation_id == "neg-1"


async def test_a_participant_that_left_misses_events_and_the_debate_goes_on(
    h: EngineHarness,
) -> None:
    await _open(h)
    await h.engine.registry.deregister("graphql", "left the team")
    await h.engine.negotiations.propose("neg-1", "frontend", "application/json", A)
    (missed,) = await h.events("negotiation.fanout_failed")
    assert (missed.details["agent"], missed.details["kind"]) == ("graphql", "propose")
    assert "no registered agent" in missed.details["reason"]
    assert (await h.engine.negotiations.get("neg-1")).round == 1
