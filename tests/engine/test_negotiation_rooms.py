"""Negotiation rooms through the engine, on a fake clock (RFC 17.5, Appendix C.10): critics
notified, votes, auto-approval, WaitForDecision, policy timeouts, escalation to HITL and the
human's decision, and every room surviving a restart from a SQLite file."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from apiary.core.rooms.policy import RoomPolicy
from apiary.core.rooms.records import DecisionRecord
from apiary.core.rooms.validation import ProposalDraft, VoteDraft
from apiary.engine.hitl import HitlSettings
from apiary.engine.negotiation.rooms import RoomSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.errors import (
    AlreadyCompletedError,
    AlreadyExistsError,
    DeadlineExceededError,
    NotFoundError,
    PermissionDeniedError,
    ValidationError,
)
from apiary.store.errors import StoreError
from apiary.testing.clock import FakeClock
from apiary.testing.engine import EngineHarness, open_test_engine
from apiary.testing.ids import SequentialIds

HITL = HitlSettings(operators=(OperatorEntry("olivia", token_digest("olivia-token"), ("admin",)),))
ROOMS = RoomSettings(policy=RoomPolicy(vote_timeout_s=60.0, hitl_timeout_s=120.0))
PLAN = b'{"steps": ["migrate", "deploy"]}'


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine(hitl=HITL, rooms=ROOMS) as harness:
        for agent in ("producer", "c1", "c2"):
            await harness.register(agent)
        yield harness


async def propose(h: EngineHarness, artifact_id: str = "plan-1", **fields: Any) -> str:
    values: dict[str, Any] = {
        "artifact_type": "PLAN", "artifact_id": artifact_id, "producer_id": "",
        "artifact": PLAN, "artifact_content_type": "application/json",
        "requested_critics": ["c1", "c2"], "negotiation_room_id": "room-1",
    }  # fmt: skip
    values.update(fields)
    record = await h.engine.rooms.submit(ProposalDraft(**values), "producer")
    return record.artifact_id


async def vote(
    h: EngineHarness, critic: str, score: float, confidence: float, artifact: str = "plan-1",
    **fields: Any,
) -> None:  # fmt: skip
    passed = fields.pop("passed", True)
    await h.engine.rooms.vote(VoteDraft(artifact, "", score, confidence, passed, **fields), critic)


def notices(payloads: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [p for p in payloads if p["type"] == "NOTIFICATION" and p.get("event") == event]


async def room_events(h: EngineHarness) -> list[str]:
    return [e.event_type for e in await h.events() if e.event_type.startswith(("room.", "hitl."))]


async def sleeping(h: EngineHarness, count: int) -> None:
    """Let waiters start until `count` sleeps wait on the fake clock (bounded, no real time)."""
    for _ in range(1000):
        if h.clock.pending_sleepers >= count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{h.clock.pending_sleepers} sleepers, expected {count}")


def operator(h: EngineHarness) -> Any:
    return h.engine.hitl.operators.authenticate("Bearer olivia-token")


@pytest.mark.conformance(
    "room.auto-approval.all-conditions", "patterns.room.auto-approval.all-conditions",
    "room.decision.policy-version", "patterns.room.decision.policy-version",
)  # fmt: skip
async def test_appendix_c10_critics_are_notified_and_their_votes_approve(
    h: EngineHarness,
) -> None:
    artifact = await propose(h)
    for critic in ("c1", "c2"):
        (review,) = notices(await h.inbox_payloads(critic), "room.proposal")
        assert review["artifact_id"] == artifact and review["negotiation_room_id"] == "room-1"
        assert base64.b64decode(review["artifact_b64"]) == PLAN
        assert review["artifact_sha256"] == hashlib.sha256(PLAN).hexdigest()
        assert review["producer_id"] == "producer"
    await vote(h, "c1", 8, 0.9)
    assert await h.engine.rooms.decision(artifact) is None
    await vote(h, "c2", 6, 0.7)
    decision = await h.engine.rooms.decision(artifact)
    assert decision is not None and decision.outcome == "APPROVED"
    assert decision.aggregated_score is not None
    assert decision.aggregated_score.weighted_mean == pytest.approx(7.125)
    assert decision.aggregated_score.std_dev == 1.0
    assert decision.policy_version == ROOMS.policy.policy_version
    assert [v.critic_id for v in decision.votes] == ["c1", "c2"]
    (told,) = notices(await h.inbox_payloads("producer"), "room.decided")
    assert (told["outcome"], told["policy_version"]) == ("APPROVED", decision.policy_version)
    assert await room_events(h) == ["room.proposed", "room.voted", "room.voted", "room.decided"]
    decided = (await h.events("room.decided"))[0]
    assert decided.correlation_id == "room-1"  # RFC 17: the room id scopes its events
    assert decided.details["outcome"] == "APPROVED"
    assert [v.critic_id for v in await h.engine.rooms.votes(artifact, "room-1")] == ["c1", "c2"]


@pytest.mark.conformance("room.wait-for-decision")
async def test_wait_for_decision_blocks_until_the_decision(h: EngineHarness) -> None:
    artifact = await propose(h)
    waiter = asyncio.create_task(h.engine.rooms.wait(artifact, "room-1", 30))
    await vote(h, "c1", 9, 0.9)
    await asyncio.sleep(0)
    assert not waiter.done()
    await vote(h, "c2", 3, 0.9)
    decided: DecisionRecord = await asyncio.wait_for(waiter, 5)
    assert decided.outcome == "REVISION_REQUESTED"
    assert "weighted_mean 6.00 not >= 7" in decided.reason
    # A decided room answers at once.
    assert (await h.engine.rooms.wait(artifact)).outcome == "REVISION_REQUESTED"


@pytest.mark.conformance("room.wait-for-decision.timeout")
async def test_wait_for_decision_times_out_in_virtual_time(h: EngineHarness) -> None:
    artifact = await propose(h)
    waiter = asyncio.create_task(h.engine.rooms.wait(artifact, timeout_s=5))
    await sleeping(h, 1)
    h.clock.advance(4.9)
    await asyncio.sleep(0)
    assert not waiter.done()
    h.clock.advance(0.1)
    with pytest.raises(DeadlineExceededError, match="within 5 s") as caught:
        await asyncio.wait_for(waiter, 5)
    assert caught.value.details == {"artifact_id": artifact, "state": "OPEN"}
    # 0 means the configured default window, and no wait is longer than wait_max_s.
    default = asyncio.create_task(h.engine.rooms.wait(artifact, timeout_s=0))
    capped = asyncio.create_task(h.engine.rooms.wait(artifact, timeout_s=10**9))
    await sleeping(h, 2)
    h.clock.advance(ROOMS.wait_default_s)
    with pytest.raises(DeadlineExceededError):
        await asyncio.wait_for(default, 5)
    assert not capped.done()
    h.clock.advance(ROOMS.wait_max_s)
    with pytest.raises(DeadlineExceededError):
        await asyncio.wait_for(capped, 5)
    with pytest.raises(ValidationError, match="timeout_seconds"):
        await h.engine.rooms.wait(artifact, timeout_s=-1)


@pytest.mark.conformance(
    "room.escalate.low-confidence", "patterns.room.escalate.low-confidence",
    "hitl.decision.apply-immediately",
)  # fmt: skip
async def test_an_uncertain_vote_escalates_and_the_operator_decides(h: EngineHarness) -> None:
    artifact = await propose(h)
    waiter = asyncio.create_task(h.engine.rooms.wait(artifact))
    await vote(h, "c1", 9, 0.9)
    await vote(h, "c2", 8, 0.25, recommendations=["not sure about the rollback"])
    proposal = await h.engine.rooms.proposal(artifact)
    assert proposal.state == "ESCALATED" and proposal.invocation_id
    interim = await h.engine.rooms.decision(artifact)
    assert interim is not None and interim.outcome == "ESCALATED_TO_HITL"
    assert interim.invocation_id == proposal.invocation_id
    invocation = await h.engine.hitl.get(proposal.invocation_id)
    assert (invocation.reason_type, invocation.state) == ("CONFLICT", "PENDING")
    assert invocation.subject["artifact_id"] == artifact
    assert invocation.context["triggers"] == ["low_confidence"]
    assert invocation.deadline == h.clock.now() + 120
    (escalated,) = notices(await h.inbox_payloads("producer"), "room.escalated")
    assert escalated["invocation_id"] == proposal.invocation_id
    assert not waiter.done()
    await h.engine.hitl.decide(proposal.invocation_id, "approve", operator(h), "rollback is fine")
    final = await asyncio.wait_for(waiter, 5)
    assert (final.outcome, final.decided_by, final.via, final.sequence) == (
        "APPROVED", "olivia", "hitl", 2,
    )  # fmt: skip
    assert "approve by olivia: rollback is fine" in final.reason
    assert [d.outcome for d in await h.engine.rooms.decisions(artifact)] == [
        "ESCALATED_TO_HITL", "APPROVED",
    ]  # fmt: skip
    assert await room_events(h) == [
        "room.proposed", "room.voted", "room.voted", "hitl.opened", "room.escalated",
        "hitl.decided", "room.decided",
    ]  # fmt: skip
    decided = (await h.events("room.decided"))[0]
    assert (decided.actor, decided.details["via"]) == ("olivia", "hitl")
    (told,) = notices(await h.inbox_payloads("producer"), "room.decided")
    assert (told["outcome"], told["decided_by"]) == ("APPROVED", "olivia")


@pytest.mark.conformance("room.escalate.vote-timeout", "patterns.room.escalate.vote-timeout")
async def test_the_policy_timeout_escalates_and_late_votes_are_refused(h: EngineHarness) -> None:
    artifact = await propose(h)
    await vote(h, "c1", 9, 0.9)
    h.clock.advance(59)
    assert await h.engine.rooms.fire_due() == 0
    h.clock.advance(1)
    assert await h.engine.rooms.fire_due() == 1
    proposal = await h.engine.rooms.proposal(artifact)
    assert proposal.state == "ESCALATED"
    invocation = await h.engine.hitl.get(proposal.invocation_id)
    assert invocation.reason_type == "DEBATE_DEADLOCK"
    assert invocation.context["missing_critics"] == ["c2"]
    with pytest.raises(AlreadyCompletedError, match="escalated to HITL"):
        await vote(h, "c2", 9, 0.9)
    # A deny (the operator's) asks the producer for a revision.
    await h.engine.hitl.decide(proposal.invocation_id, "deny", operator(h), "c2 never answered")
    final = await h.engine.rooms.wait(artifact, timeout_s=5)
    assert (final.outcome, final.via) == ("REVISION_REQUESTED", "hitl")
    with pytest.raises(AlreadyCompletedError, match="decided REVISION_REQUESTED"):
        await vote(h, "c2", 9, 0.9)


async def test_a_hitl_deadline_decides_by_its_fallback(h: EngineHarness) -> None:
    artifact = await propose(h)
    await vote(h, "c1", 9, 0.9, recommendations=["ESCALATE: touches billing"])
    await vote(h, "c2", 9, 0.9)
    proposal = await h.engine.rooms.proposal(artifact)
    assert proposal.state == "ESCALATED"
    h.clock.advance(120)
    await h.engine.hitl.tick()
    final = await h.engine.rooms.wait(artifact, timeout_s=5)
    assert (final.outcome, final.via, final.decided_by) == (
        "REVISION_REQUESTED", "hitl_fallback", "apiary",
    )  # fmt: skip
    assert "(deadline)" in final.reason


async def test_without_a_hitl_component_the_fallback_decides_at_once() -> None:
    async with open_test_engine(rooms=ROOMS) as h:  # no operators: no HITL component
        for agent in ("producer", "c1", "c2"):
            await h.register(agent)
        artifact = await propose(h)
        await vote(h, "c1", 10, 0.9)
        await vote(h, "c2", 2, 0.9)  # std_dev 4: extreme disagreement
        final = await h.engine.rooms.wait(artifact, timeout_s=5)
        assert (final.outcome, final.via) == ("REVISION_REQUESTED", "hitl_fallback")
        assert final.details["error_code"] == "hitl_unavailable"


async def test_requests_are_refused_with_specific_errors(h: EngineHarness) -> None:
    artifact = await propose(h)
    with pytest.raises(AlreadyExistsError, match="already proposed"):
        await propose(h)
    with pytest.raises(NotFoundError):
        await vote(h, "c1", 9, 0.9, artifact="nope")
    with pytest.raises(PermissionDeniedError, match="not a requested critic"):
        await vote(h, "producer", 9, 0.9)
    with pytest.raises(ValidationError) as caught:
        await vote(h, "c1", 11, 0.9)
    assert caught.value.details["field"] == "vote.score"
    await vote(h, "c1", 9, 0.9)
    with pytest.raises(AlreadyExistsError, match="already voted"):
        await vote(h, "c1", 9, 0.9)
    with pytest.raises(NotFoundError, match="not in room"):
        await h.engine.rooms.votes(artifact, "room-2")
    with pytest.raises(ValidationError) as caught:
        await h.engine.rooms.submit(
            ProposalDraft("PLAN", "x", "", PLAN, "application/json", ["c1"], "r"), ""
        )
    assert caught.value.details["field"] == "proposal.producer_id"


async def test_ids_are_generated_and_critics_see_their_pending_reviews(h: EngineHarness) -> None:
    first = await propose(h, artifact_id="", negotiation_room_id="")
    second = await propose(h, "plan-2", requested_critics=["c2"])
    proposal = await h.engine.rooms.proposal(first)
    assert proposal.negotiation_room_id and proposal.negotiation_room_id != first
    pending = await h.engine.rooms.list_proposals(critic_id="c2")
    assert [p.artifact_id for p in pending] == [first, second]
    await vote(h, "c2", 9, 0.9, artifact=second)  # decides plan-2 (the only critic)
    await vote(h, "c2", 9, 0.9, artifact=first)
    assert await h.engine.rooms.list_proposals(critic_id="c2") == []
    assert [p.artifact_id for p in await h.engine.rooms.list_proposals(critic_id="c1")] == [first]
    every = await h.engine.rooms.list_proposals(room_id="room-1")
    assert [(p.artifact_id, p.state) for p in every] == [("plan-2", "APPROVED")]


async def test_big_artifacts_are_announced_without_their_bytes(h: EngineHarness) -> None:
    big = b"x" * (ROOMS.inline_artifact_bytes + 1)
    await propose(h, artifact=big, artifact_content_type="text/plain")
    (review,) = notices(await h.inbox_payloads("c1"), "room.proposal")
    assert "artifact_b64" not in review
    assert (review["artifact_size"], review["artifact_sha256"]) == (
        len(big), hashlib.sha256(big).hexdigest(),
    )  # fmt: skip


async def test_an_unreachable_critic_is_logged_and_the_room_opens(h: EngineHarness) -> None:
    await propose(h, requested_critics=["c1", "ghost"])
    (refused,) = await h.events("room.notice_refused")
    assert (refused.agent_id, refused.details["error_code"]) == ("ghost", "no_route")
    assert notices(await h.inbox_payloads("c1"), "room.proposal")


@pytest.mark.conformance("room.policy.versioning")
async def test_rooms_survive_a_restart_from_a_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'apiary.db'}"
    clock, ids = FakeClock(), SequentialIds()
    async with open_test_engine(store_url=url, clock=clock, ids=ids, hitl=HITL, rooms=ROOMS) as h:
        for agent in ("producer", "c1", "c2"):
            await h.register(agent)
        await propose(h, "open")
        await vote(h, "c1", 9, 0.9, artifact="open")
        await propose(h, "timed")
        await propose(h, "escalated")
        await vote(h, "c1", 10, 0.9, artifact="escalated")
        await vote(h, "c2", 2, 0.9, artifact="escalated")
        escalated = await h.engine.rooms.proposal("escalated")
        reviews = len(notices(await h.inbox_payloads("c2"), "room.proposal"))
    clock.advance(30)
    # The policy changed meanwhile: rooms opened before are still decided under their own.
    stricter = RoomSettings(policy=RoomPolicy(vote_timeout_s=60.0, min_score_threshold=9.5))
    async with open_test_engine(
        store_url=url, clock=clock, ids=ids, hitl=HITL, rooms=stricter
    ) as h:
        rooms = h.engine.rooms
        assert {v.version for v in await rooms.policy_versions()} == {
            ROOMS.policy.policy_version, stricter.policy.policy_version,
        }  # fmt: skip
        # Re-announcing open rooms reaches nobody twice.
        assert len(notices(await h.inbox_payloads("c2"), "room.proposal")) == reviews
        await vote(h, "c2", 9, 0.9, artifact="open")
        decided = await rooms.wait("open", timeout_s=1)
        assert (decided.outcome, decided.policy_version) == (
            "APPROVED", ROOMS.policy.policy_version,
        )  # fmt: skip
        # Vote timers were re-armed: 60 s after submission, not after the restart.
        clock.advance(30)
        assert await rooms.fire_due() == 1
        assert (await rooms.proposal("timed")).state == "ESCALATED"
        # The escalation opened before the restart still decides its room.
        assert (await rooms.proposal("escalated")).invocation_id == escalated.invocation_id
        await h.engine.hitl.decide(escalated.invocation_id, "approve", operator(h), "fine")
        final = await rooms.wait("escalated", timeout_s=1)
        assert (final.outcome, final.decided_by) == ("APPROVED", "olivia")
        # New rooms take the new policy.
        await propose(h, "new")
        assert (await rooms.proposal("new")).policy_version == stricter.policy.policy_version


async def test_a_vote_stored_just_before_a_stop_is_decided_on_start(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'apiary.db'}"
    clock, ids = FakeClock(), SequentialIds()
    async with open_test_engine(store_url=url, clock=clock, ids=ids, hitl=HITL, rooms=ROOMS) as h:
        for agent in ("producer", "c1", "c2"):
            await h.register(agent)
        await propose(h)
        await vote(h, "c1", 8, 0.9)
        (first,) = await h.store.rooms.votes("plan-1")
        # The last vote landed, the stop came before its decision did.
        await h.store.rooms.add_vote(replace(first, critic_id="c2"))
    async with open_test_engine(store_url=url, clock=clock, ids=ids, hitl=HITL, rooms=ROOMS) as h:
        decided = await h.engine.rooms.wait("plan-1", timeout_s=1)
        assert decided.outcome == "APPROVED"
        assert [v.critic_id for v in decided.votes] == ["c1", "c2"]


async def test_an_escalation_opened_just_before_a_stop_is_not_opened_twice(
    tmp_path: Path,
) -> None:
    url = f"sqlite://{tmp_path / 'apiary.db'}"
    clock, ids = FakeClock(), SequentialIds()
    async with open_test_engine(store_url=url, clock=clock, ids=ids, hitl=HITL, rooms=ROOMS) as h:
        for agent in ("producer", "c1", "c2"):
            await h.register(agent)
        await propose(h)
        await vote(h, "c1", 10, 0.9)
        (first,) = await h.store.rooms.votes("plan-1")
        # The last vote landed and the invocation was opened; the stop came before the room
        # recorded its escalation.
        await h.store.rooms.add_vote(replace(first, critic_id="c2", score=2.0))
        orphan = await h.engine.hitl.open(
            "CONFLICT", {"reason": "std_dev 4"}, requested_by="negotiation_room",
            subject={"artifact_id": "plan-1"},
        )  # fmt: skip
    async with open_test_engine(store_url=url, clock=clock, ids=ids, hitl=HITL, rooms=ROOMS) as h:
        proposal = await h.engine.rooms.proposal("plan-1")
        assert (proposal.state, proposal.invocation_id) == ("ESCALATED", orphan.invocation_id)
        assert [r.invocation_id for r in await h.engine.hitl.list()] == [orphan.invocation_id]
        await h.engine.hitl.decide(orphan.invocation_id, "deny", operator(h), "split verdict")
        final = await h.engine.rooms.wait("plan-1", timeout_s=1)
        assert (final.outcome, final.decided_by) == ("REVISION_REQUESTED", "olivia")


async def test_a_policy_version_name_names_one_set_of_settings(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'apiary.db'}"
    named = RoomSettings(policy=RoomPolicy(version="v1"))
    async with open_test_engine(store_url=url, rooms=named) as h:
        assert [v.version for v in await h.engine.rooms.policy_versions()] == ["v1"]
    changed = RoomSettings(policy=RoomPolicy(version="v1", min_score_threshold=9.0))
    with pytest.raises(StoreError, match="'v1' names other settings"):
        async with open_test_engine(store_url=url, rooms=changed):
            pass
