"""Checks of the room store (`RoomStore`): what negotiation rooms need to resume after a
restart, and to keep their audit record (RFC 17.5)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from apiary.core.rooms.records import (
    DecisionRecord,
    PolicyVersionRecord,
    ProposalRecord,
    RoomState,
    VoteRecord,
)
from apiary.core.vote_aggregation import AggregatedScore
from apiary.store.errors import StoreError
from apiary.store.protocols import Store
from apiary.testing.store_suite.base import (
    T0,
    UNICODE,
    Check,
    CheckNotApplicable,
    StoreFactory,
    registry,
)

CHECKS: list[Check] = []
_check = registry(CHECKS)

ARTIFACT = b'\x00{"plan": [1, 2]}\x00' + bytes(range(256)) + b"\x00"
"""Every byte value with NULs inside and at both ends: an artifact is bytes, not text."""
SCORES = AggregatedScore(7.0, 6.0, 8.0, 1.0, 7.125, 2)


def proposal(artifact_id: str, n: int = 0, **fields: Any) -> ProposalRecord:
    """An OPEN proposal of room-1 by producer-p with critics c1, c2, created at T0 + n."""
    values: dict[str, Any] = {
        "artifact_id": artifact_id,
        "negotiation_room_id": "room-1",
        "artifact_type": "PLAN",
        "producer_id": "producer-p",
        "artifact": ARTIFACT,
        "artifact_content_type": "application/json",
        "requested_critics": ("c1", "c2"),
        "created_at": T0 + n,
        "state": RoomState.OPEN.value,
        "updated_at": T0 + n,
        "policy_version": "v1",
        "vote_deadline": T0 + n + 300,
    }
    values.update(fields)
    return ProposalRecord(**values)


def vote(artifact_id: str, critic_id: str, n: int = 0, **fields: Any) -> VoteRecord:
    values: dict[str, Any] = {
        "artifact_id": artifact_id,
        "critic_id": critic_id,
        "score": 8.0,
        "confidence": 0.9,
        "passed": True,
        "strengths": ("clear", UNICODE),
        "weaknesses": ("no rollback plan",),
        "recommendations": ("ESCALATE: licence unclear",),
        "negotiation_room_id": "room-1",
        "voted_at": T0 + 10 + n,
    }
    values.update(fields)
    return VoteRecord(**values)


def decision(artifact_id: str, sequence: int = 1, **fields: Any) -> DecisionRecord:
    values: dict[str, Any] = {
        "artifact_id": artifact_id,
        "sequence": sequence,
        "negotiation_room_id": "room-1",
        "outcome": "APPROVED",
        "votes": (vote(artifact_id, "c1"), vote(artifact_id, "c2", 1, score=6.0, passed=False)),
        "aggregated_score": SCORES,
        "policy_version": "v1",
        "reason": "approved: weighted_mean 7.12 >= 7",
        "decided_at": T0 + 20,
        "decided_by": "negotiation_room",
        "via": "policy",
        "triggers": (),
        "details": {"pass_ratio": 0.5, "nested": {"list": [1, None, "x"]}},
    }
    values.update(fields)
    return DecisionRecord(**values)


async def _artifacts(store: Store, **kwargs: Any) -> list[str]:
    return [p.artifact_id for p in await store.rooms.list_proposals(**kwargs)]


@_check
async def room_policy_versions_name_fixed_settings(factory: StoreFactory) -> None:
    v1 = PolicyVersionRecord("v1", {"min_score_threshold": 7.0, "roles": ["a"]}, T0)
    v0 = PolicyVersionRecord("v0", {"min_score_threshold": 6.5}, T0 - 10)
    async with factory.open() as store:
        assert await store.rooms.list_policies() == []
        assert await store.rooms.get_policy("v1") is None
        assert await store.rooms.put_policy(v1) is True
        assert await store.rooms.put_policy(v0) is True
        # The same version with the same settings again changes nothing, whatever its time.
        assert await store.rooms.put_policy(replace(v1, created_at=T0 + 99)) is False
        assert await store.rooms.get_policy("v1") == v1
        # The same version with other settings is refused: a version names one set.
        try:
            await store.rooms.put_policy(replace(v1, settings={"min_score_threshold": 9.0}))
        except StoreError:
            pass
        else:
            raise AssertionError("a policy version was stored twice with different settings")
        assert await store.rooms.get_policy("v1") == v1
        assert await store.rooms.list_policies() == [v0, v1]
        assert await store.rooms.get_policy("V1") is None


@_check
async def room_proposals_are_put_and_read(factory: StoreFactory) -> None:
    full = proposal(
        f"artifact {UNICODE}",
        negotiation_room_id=f"room {UNICODE}",
        producer_id=UNICODE,
        requested_critics=("c1", UNICODE),
        invocation_id="hitl-1",
        state=RoomState.ESCALATED.value,
    )
    async with factory.open() as store:
        assert await store.rooms.get_proposal(full.artifact_id) is None
        await store.rooms.put_proposal(full)
        stored = await store.rooms.get_proposal(full.artifact_id)
        assert stored == full
        assert stored is not None
        assert type(stored.artifact) is bytes and stored.artifact == ARTIFACT
        assert type(stored.requested_critics) is tuple
        # Loose input comes back as the field's type on every backend.
        loose = proposal("loose", artifact=bytearray(b"\x00x"), created_at=1_700_000_000)
        await store.rooms.put_proposal(loose)
        back = await store.rooms.get_proposal("loose")
        assert back is not None
        assert (type(back.artifact), type(back.created_at)) == (bytes, float)
        # Replaced as a whole, not merged.
        decided = replace(loose, state=RoomState.APPROVED.value, invocation_id="", updated_at=T0)
        await store.rooms.put_proposal(decided)
        assert await store.rooms.get_proposal("loose") == decided
        assert await store.rooms.get_proposal("LOOSE") is None
        assert await store.rooms.get_proposal("") is None


@_check
async def room_proposal_list_filters_and_pages(factory: StoreFactory) -> None:
    open_, escalated, approved = (s.value for s in (RoomState.OPEN, RoomState.ESCALATED,
                                                    RoomState.APPROVED))  # fmt: skip
    async with factory.open() as store:
        # Put out of order; a tie on created_at is broken by artifact_id.
        for record in (
            proposal("a-3", 3, state=approved),
            proposal("a-1", 1, negotiation_room_id="room-2"),
            proposal("a-2b", 2, state=escalated),
            proposal("a-2a", 2),
            proposal("a-4", 4, negotiation_room_id="room-2", state=approved),
        ):
            await store.rooms.put_proposal(record)
        everything = ["a-1", "a-2a", "a-2b", "a-3", "a-4"]
        assert await _artifacts(store) == everything
        assert await _artifacts(store, states=frozenset({open_})) == ["a-1", "a-2a"]
        assert await _artifacts(store, states=frozenset({open_, escalated})) == everything[:3]
        assert await _artifacts(store, states=frozenset()) == []
        assert await _artifacts(store, states=frozenset({"open"})) == []
        assert await _artifacts(store, room_id="room-2") == ["a-1", "a-4"]
        assert await _artifacts(store, room_id="room-2", states=frozenset({approved})) == ["a-4"]
        assert await _artifacts(store, room_id="ROOM-2") == []
        assert await _artifacts(store, after_created=T0 + 2) == ["a-3", "a-4"]
        assert await _artifacts(store, limit=2) == ["a-1", "a-2a"]
        assert await _artifacts(store, limit=0) == []
        try:
            await store.rooms.list_proposals(limit=-1)
        except ValueError:
            pass
        else:
            raise AssertionError("list_proposals(limit=-1) did not raise ValueError")


@_check
async def a_critic_votes_once_per_artifact(factory: StoreFactory) -> None:
    first = vote("a-1", "c2", 0)
    second = vote("a-1", "c1", 5, score=2.5, confidence=0.0, passed=False, strengths=())
    async with factory.open() as store:
        assert await store.rooms.votes("a-1") == []
        await store.rooms.add_vote(second)
        await store.rooms.add_vote(first)
        await store.rooms.add_vote(vote("a-2", "c1"))
        # By voted_at, then critic_id; every field as given.
        assert await store.rooms.votes("a-1") == [first, second]
        try:
            await store.rooms.add_vote(replace(first, score=1.0))
        except StoreError:
            pass
        else:
            raise AssertionError("a second vote of the same critic was stored")
        assert await store.rooms.votes("a-1") == [first, second]
        assert [v.critic_id for v in await store.rooms.votes("a-2")] == ["c1"]
        stored = (await store.rooms.votes("a-1"))[1]
        assert (type(stored.score), type(stored.passed)) == (float, bool)
        # Ties on voted_at are ordered by critic_id.
        await store.rooms.add_vote(vote("a-3", "z", 0))
        await store.rooms.add_vote(vote("a-3", "b", 0))
        assert [v.critic_id for v in await store.rooms.votes("a-3")] == ["b", "z"]


@_check
async def a_decision_lands_with_its_proposal_or_not_at_all(factory: StoreFactory) -> None:
    escalated = proposal("a-1", state=RoomState.ESCALATED.value, invocation_id="hitl-7")
    first = decision("a-1", 1, outcome="ESCALATED_TO_HITL", triggers=("critic_request",),
                     invocation_id="hitl-7")  # fmt: skip
    final = decision("a-1", 2, outcome="APPROVED", decided_by=UNICODE, via="hitl",
                     aggregated_score=None, votes=(), details={"action": "approve"})  # fmt: skip
    async with factory.open() as store:
        await store.rooms.put_proposal(proposal("a-1"))
        assert await store.rooms.decisions("a-1") == []
        await store.rooms.decide(escalated, first)
        assert await store.rooms.get_proposal("a-1") == escalated
        assert await store.rooms.decisions("a-1") == [first]
        approved = replace(escalated, state=RoomState.APPROVED.value, updated_at=T0 + 60)
        await store.rooms.decide(approved, final)
        assert await store.rooms.decisions("a-1") == [first, final]
        assert await store.rooms.get_proposal("a-1") == approved
        # A decision with a sequence already taken is refused, and the proposal stays.
        try:
            await store.rooms.decide(replace(approved, state="OPEN"), replace(final, reason="x"))
        except StoreError:
            pass
        else:
            raise AssertionError("a second decision 2 was stored")
        assert await store.rooms.get_proposal("a-1") == approved
        assert await store.rooms.decisions("a-1") == [first, final]
        stored = (await store.rooms.decisions("a-1"))[0]
        assert stored.aggregated_score == SCORES
        assert stored.votes == first.votes
        assert await store.rooms.decisions("a-2") == []


@_check
async def room_records_that_do_not_fit_are_refused(factory: StoreFactory) -> None:
    good = proposal("a-1")
    async with factory.open() as store:
        for bad in (
            replace(good, state="open"),
            replace(good, requested_critics=("c1", 2)),  # type: ignore[arg-type]
            replace(good, requested_critics="c1"),  # type: ignore[arg-type]
        ):
            try:
                await store.rooms.put_proposal(bad)
            except ValueError:
                pass
            else:
                raise AssertionError(f"a proposal was accepted: {bad!r}")
        assert await store.rooms.get_proposal("a-1") is None
        await store.rooms.put_proposal(good)
        for bad_decision in (
            decision("a-1", 0),
            decision("a-1", details={"nan": float("nan")}),
            decision("a-1", triggers=("x", 1)),
        ):
            try:
                await store.rooms.decide(replace(good, state="APPROVED"), bad_decision)
            except ValueError:
                pass
            else:
                raise AssertionError(f"a decision was accepted: {bad_decision!r}")
        assert await store.rooms.get_proposal("a-1") == good
        assert await store.rooms.decisions("a-1") == []
        try:
            await store.rooms.add_vote(vote("a-1", "c1", strengths=(b"bytes",)))
        except ValueError:
            pass
        else:
            raise AssertionError("a vote with a non-text strength was accepted")
        assert await store.rooms.votes("a-1") == []


@_check
async def many_concurrent_votes_are_all_stored(factory: StoreFactory) -> None:
    critics = [f"critic-{i:03}" for i in range(200)]
    votes = [vote("a-1", c, i, score=i % 11) for i, c in enumerate(critics)]
    async with factory.open() as store:
        await asyncio.gather(*(store.rooms.add_vote(v) for v in reversed(votes)))
        assert await store.rooms.votes("a-1") == votes
        results = await asyncio.gather(
            *(store.rooms.add_vote(v) for v in votes[:20]), return_exceptions=True
        )
        assert all(isinstance(r, StoreError) for r in results)
        assert len(await store.rooms.votes("a-1")) == len(critics)


@_check
async def rooms_survive_closing_and_reopening(factory: StoreFactory) -> None:
    if not factory.durable:
        raise CheckNotApplicable(f"the {factory.backend} backend is not durable")
    policy = PolicyVersionRecord("v1", {"min_score_threshold": 7.0}, T0)
    open_ = proposal("a-1")
    escalated = proposal("a-2", 1, state=RoomState.ESCALATED.value, invocation_id="hitl-2")
    first = decision("a-2", outcome="ESCALATED_TO_HITL", invocation_id="hitl-2")
    async with factory.open() as store:
        await store.rooms.put_policy(policy)
        await store.rooms.put_proposal(open_)
        await store.rooms.put_proposal(proposal("a-2", 1))
        await store.rooms.add_vote(vote("a-1", "c1"))
        await store.rooms.decide(escalated, first)
    async with factory.open() as store:
        assert await store.rooms.list_policies() == [policy]
        assert await store.rooms.list_proposals() == [open_, escalated]
        assert await store.rooms.votes("a-1") == [vote("a-1", "c1")]
        assert await store.rooms.decisions("a-2") == [first]
        live = frozenset({RoomState.OPEN.value, RoomState.ESCALATED.value})
        assert await _artifacts(store, states=live) == ["a-1", "a-2"]
