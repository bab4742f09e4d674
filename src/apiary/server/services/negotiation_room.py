"""sw4rm.negotiation_room.NegotiationRoomService and apiary.v1.NegotiationRoomQueryService:
thin adapters over engine/negotiation/rooms.py (RFC 17.5).

The caller is the `sw4rm-agent-id` of the call: a producer or critic may leave producer_id /
critic_id empty and is refused when it names another agent. WaitForDecision blocks for at
most timeout_seconds (0: the configured default) and answers DEADLINE_EXCEEDED when no final
decision came (spec/INTEROP.md).
"""

from __future__ import annotations

from apiary.core.envelope_rules import is_json_type
from apiary.core.json_reader import check_nesting
from apiary.engine.negotiation.rooms import NegotiationRooms
from apiary.errors import ValidationError
from apiary.server.context import CallContext
from apiary.server.services.request_checks import DEFAULT_CHECKS, RequestChecks, checked
from apiary.wire import pb
from apiary.wire.rooms import (
    decision_to_proto,
    proposal_draft,
    room_decision,
    room_policy,
    room_proposal,
    vote_draft,
    vote_to_proto,
)

nr = pb.negotiation_room_pb2
a = pb.apiary_pb2


@checked
class NegotiationRoomHandler:
    def __init__(self, rooms: NegotiationRooms, checks: RequestChecks = DEFAULT_CHECKS) -> None:
        self._rooms = rooms
        self._checks = checks

    async def submit_proposal(
        self, req: nr.SubmitProposalRequest, ctx: CallContext
    ) -> nr.SubmitProposalResponse:
        if not req.HasField("proposal"):
            raise ValidationError.for_field("proposal", "is required")
        proposal = req.proposal
        if proposal.artifact and is_json_type(proposal.artifact_content_type):
            depth = self._checks.limits.json_depth
            check_nesting(proposal.artifact, "proposal.artifact", depth)
        record = await self._rooms.submit(proposal_draft(req.proposal), ctx.agent_id())
        return nr.SubmitProposalResponse(
            artifact_id=record.artifact_id, negotiation_room_id=record.negotiation_room_id
        )

    async def submit_vote(
        self, req: nr.SubmitVoteRequest, ctx: CallContext
    ) -> nr.SubmitVoteResponse:
        if not req.HasField("vote"):
            raise ValidationError.for_field("vote", "is required")
        vote = await self._rooms.vote(vote_draft(req.vote), ctx.agent_id())
        return nr.SubmitVoteResponse(artifact_id=vote.artifact_id, critic_id=vote.critic_id)

    async def get_votes(self, req: nr.GetVotesRequest, ctx: CallContext) -> nr.GetVotesResponse:
        votes = await self._rooms.votes(req.artifact_id, req.negotiation_room_id)
        return nr.GetVotesResponse(votes=[vote_to_proto(v) for v in votes], vote_count=len(votes))

    async def get_decision(
        self, req: nr.GetDecisionRequest, ctx: CallContext
    ) -> nr.GetDecisionResponse:
        """The latest decision; no decision field while votes are still being collected."""
        found = await self._rooms.decision(req.artifact_id, req.negotiation_room_id)
        if found is None:
            return nr.GetDecisionResponse()
        return nr.GetDecisionResponse(decision=decision_to_proto(found))

    async def wait_for_decision(
        self, req: nr.WaitForDecisionRequest, ctx: CallContext
    ) -> nr.WaitForDecisionResponse:
        found = await self._rooms.wait(
            req.artifact_id, req.negotiation_room_id, float(req.timeout_seconds)
        )
        return nr.WaitForDecisionResponse(decision=decision_to_proto(found))


@checked
class NegotiationRoomQueryHandler:
    def __init__(self, rooms: NegotiationRooms, checks: RequestChecks = DEFAULT_CHECKS) -> None:
        self._rooms = rooms
        self._checks = checks

    async def list_proposals(
        self, req: a.ListRoomProposalsRequest, ctx: CallContext
    ) -> a.ListRoomProposalsResponse:
        found = await self._rooms.list_proposals(
            room_id=req.negotiation_room_id or None,
            states=frozenset(s.upper() for s in req.states) if req.states else None,
            critic_id=req.critic_id or None,
            limit=req.limit or 100,
        )
        views = [room_proposal(p, await self._rooms.votes(p.artifact_id)) for p in found]
        return a.ListRoomProposalsResponse(proposals=views)

    async def get_proposal(self, req: a.GetRoomProposalRequest, ctx: CallContext) -> a.RoomProposal:
        record = await self._rooms.proposal(req.artifact_id, req.negotiation_room_id)
        votes = await self._rooms.votes(record.artifact_id)
        return room_proposal(record, votes, include_artifact=req.include_artifact)

    async def list_decisions(
        self, req: a.ListRoomDecisionsRequest, ctx: CallContext
    ) -> a.ListRoomDecisionsResponse:
        found = await self._rooms.decisions(req.artifact_id, req.negotiation_room_id)
        return a.ListRoomDecisionsResponse(decisions=[room_decision(d) for d in found])

    async def list_policies(
        self, req: a.ListRoomPoliciesRequest, ctx: CallContext
    ) -> a.ListRoomPoliciesResponse:
        current = self._rooms.settings.policy.policy_version
        versions = await self._rooms.policy_versions()
        return a.ListRoomPoliciesResponse(policies=[room_policy(v, current) for v in versions])
