"""The in-memory room store: every record goes through its SQL row and back, so that it
refuses and coerces exactly what the SQL backends do, and stored records are detached from
the caller's."""

from __future__ import annotations

from collections.abc import Sequence

from apiary.core.events import EventDraft
from apiary.core.rooms.records import (
    DecisionRecord,
    PolicyVersionRecord,
    ProposalRecord,
    VoteRecord,
)
from apiary.store.errors import StoreError
from apiary.store.memory.events import MemoryEventLog
from apiary.store.sql.checks import check_limit
from apiary.store.sql.rooms import (
    decision_from_row,
    decision_row,
    policy_from_row,
    policy_row,
    proposal_from_row,
    proposal_row,
    vote_from_row,
    vote_row,
)


class MemoryRoomStore:
    """`RoomStore` over dicts keyed as the SQL tables' primary keys; events that commit with
    a change go to `log`."""

    def __init__(self, log: MemoryEventLog) -> None:
        self._log = log
        self._policies: dict[str, PolicyVersionRecord] = {}
        self._proposals: dict[str, ProposalRecord] = {}
        self._votes: dict[str, dict[str, VoteRecord]] = {}
        self._decisions: dict[str, dict[int, DecisionRecord]] = {}

    async def put_policy(self, record: PolicyVersionRecord) -> bool:
        stored = policy_from_row(policy_row(record))
        known = self._policies.get(stored.version)
        if known is not None:
            if dict(known.settings) != dict(stored.settings):
                raise StoreError(f"policy version {stored.version!r} names other settings")
            return False
        self._policies[stored.version] = stored
        return True

    async def get_policy(self, version: str) -> PolicyVersionRecord | None:
        found = self._policies.get(version)
        return None if found is None else policy_from_row(policy_row(found))

    async def list_policies(self) -> list[PolicyVersionRecord]:
        ordered = sorted(self._policies.values(), key=lambda p: (p.created_at, p.version))
        return [policy_from_row(policy_row(p)) for p in ordered]

    async def put_proposal(self, record: ProposalRecord, events: Sequence[EventDraft] = ()) -> None:
        stored = proposal_from_row(proposal_row(record))
        drafts = self._log.checked(events)
        self._proposals[stored.artifact_id] = stored
        self._log.append_now(drafts)

    async def get_proposal(self, artifact_id: str) -> ProposalRecord | None:
        # Records hold immutable values only: no copy needed.
        return self._proposals.get(artifact_id)

    async def list_proposals(
        self,
        states: frozenset[str] | None = None,
        room_id: str | None = None,
        after_created: float = 0.0,
        limit: int = 100,
    ) -> list[ProposalRecord]:
        check_limit(limit)
        found = sorted(
            (p for p in self._proposals.values()
             if p.created_at > after_created
             and (states is None or p.state in states)
             and (room_id is None or p.negotiation_room_id == room_id)),
            key=lambda p: (p.created_at, p.artifact_id),
        )  # fmt: skip
        return found[:limit]

    async def add_vote(self, vote: VoteRecord, events: Sequence[EventDraft] = ()) -> None:
        stored = vote_from_row(vote_row(vote))
        votes = self._votes.get(stored.artifact_id, {})
        if stored.critic_id in votes:
            raise StoreError(f"{stored.critic_id!r} already voted on {stored.artifact_id!r}")
        drafts = self._log.checked(events)
        self._votes.setdefault(stored.artifact_id, votes)[stored.critic_id] = stored
        self._log.append_now(drafts)

    async def votes(self, artifact_id: str) -> list[VoteRecord]:
        found = self._votes.get(artifact_id, {}).values()
        return sorted(found, key=lambda v: (v.voted_at, v.critic_id))

    async def decide(
        self,
        proposal: ProposalRecord,
        decision: DecisionRecord,
        events: Sequence[EventDraft] = (),
    ) -> None:
        stored_proposal = proposal_from_row(proposal_row(proposal))
        stored = decision_from_row(decision_row(decision))
        decisions = self._decisions.get(stored.artifact_id, {})
        if stored.sequence in decisions:
            raise StoreError(
                f"decision {stored.sequence} of {stored.artifact_id!r} is already recorded"
            )
        drafts = self._log.checked(events)
        self._decisions.setdefault(stored.artifact_id, decisions)[stored.sequence] = stored
        self._proposals[stored_proposal.artifact_id] = stored_proposal
        self._log.append_now(drafts)

    async def decisions(self, artifact_id: str) -> list[DecisionRecord]:
        found = self._decisions.get(artifact_id, {})
        return [decision_from_row(decision_row(found[n])) for n in sorted(found)]
