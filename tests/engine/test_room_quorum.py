"""A room's quorum through the engine on a SQLite file: the quorum is part of the policy
version a proposal is decided under, survives a restart, and decides at the policy timeout."""

from __future__ import annotations

from pathlib import Path

import pytest

from apiary.core.quorum import Quorum
from apiary.core.rooms.policy import RoomPolicy
from apiary.core.rooms.validation import ProposalDraft, VoteDraft
from apiary.engine.negotiation.rooms import RoomSettings
from apiary.testing.clock import FakeClock
from apiary.testing.engine import open_test_engine
from apiary.testing.ids import SequentialIds

PLAN = b'{"steps": ["migrate", "deploy"]}'
TWO_OF_THREE = Quorum.from_mapping({"kind": "minimum_votes", "value": 2})


@pytest.mark.conformance("room.quorum.policy")
async def test_a_proposal_keeps_its_quorum_across_a_restart_and_decides_at_the_timeout(
    tmp_path: Path,
) -> None:
    url = f"sqlite://{tmp_path / 'rooms.db'}"
    clock, ids = FakeClock(), SequentialIds()
    first = RoomSettings(policy=RoomPolicy(vote_timeout_s=60.0, quorum=TWO_OF_THREE))
    async with open_test_engine(store_url=url, clock=clock, ids=ids, rooms=first) as h:
        for agent in ("producer", "c1", "c2", "c3"):
            await h.register(agent)
        draft = ProposalDraft(
            "PLAN", "plan-1", "", PLAN, "application/json", ["c1", "c2", "c3"], "room-1"
        )
        await h.engine.rooms.submit(draft, "producer")
        for critic in ("c1", "c3"):
            await h.engine.rooms.vote(VoteDraft("plan-1", "", 9, 0.9, True), critic)
        h.clock.advance(59)
        assert await h.engine.rooms.fire_due() == 0
        assert (await h.engine.rooms.proposal("plan-1")).state == "OPEN"
    # Restarted with the default policy (every vote required): the proposal keeps the
    # version, and so the quorum, it was submitted under.
    later = RoomSettings(policy=RoomPolicy(vote_timeout_s=60.0))
    async with open_test_engine(store_url=url, clock=clock, ids=ids, rooms=later) as h:
        clock.advance(1)
        assert await h.engine.rooms.fire_due() == 1
        decision = await h.engine.rooms.wait("plan-1", timeout_s=5)
        assert decision.outcome == "APPROVED"
        assert decision.details["quorum"]["met"] is True
        assert decision.details["missing_critics"] == ["c2"]
        decided = [e for e in await h.events() if e.event_type == "room.decided"]
        assert decided[-1].details["outcome"] == "APPROVED"
