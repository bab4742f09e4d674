"""sw4rm.handoff.HandoffService and apiary.v1.HandoffQueryService: thin adapters over
engine/handoffs.py. The caller is named by the `sw4rm-agent-id` request metadata."""

from __future__ import annotations

from apiary.core.handoff import from_proto
from apiary.engine.handoffs import Handoffs
from apiary.errors import ValidationError
from apiary.server.context import CallContext
from apiary.server.services.request_checks import DEFAULT_CHECKS, RequestChecks, checked
from apiary.wire import pb
from apiary.wire.handoff import (
    SNAPSHOT_CONTENT_TYPE_KEY,
    draft_from_proto,
    handoff_view,
    request_to_proto,
)

MAX_LIST = 1000
h = pb.handoff_pb2
a = pb.apiary_pb2
Empty = pb.common_pb2.Empty


@checked
class HandoffHandler:
    def __init__(self, handoffs: Handoffs, checks: RequestChecks = DEFAULT_CHECKS) -> None:
        self._handoffs = handoffs
        self._checks = checks

    async def request_handoff(self, req: h.HandoffRequest, ctx: CallContext) -> Empty:
        draft = draft_from_proto(req, ctx.get(SNAPSHOT_CONTENT_TYPE_KEY))
        await self._handoffs.request(draft, caller=ctx.agent_id())
        return Empty()

    async def accept_handoff(self, req: h.HandoffResponse, ctx: CallContext) -> Empty:
        await self._handoffs.accept(
            req.request_id, accepting_agent=req.accepting_agent, caller=ctx.agent_id()
        )
        return Empty()

    async def reject_handoff(self, req: h.HandoffResponse, ctx: CallContext) -> Empty:
        if req.accepted:
            raise ValidationError.for_field("accepted", "must be false on RejectHandoff")
        await self._handoffs.reject(
            req.request_id, req.rejection_reason, rejecting_agent=req.accepting_agent,
            caller=ctx.agent_id(),
        )  # fmt: skip
        return Empty()

    async def get_pending_handoffs(
        self, req: h.GetPendingHandoffsRequest, ctx: CallContext
    ) -> h.GetPendingHandoffsResponse:
        records = await self._handoffs.pending(req.agent_id, caller=ctx.agent_id())
        return h.GetPendingHandoffsResponse(
            pending_requests=[request_to_proto(r, include_snapshot=True) for r in records]
        )

    async def complete_handoff(
        self, req: h.CompleteHandoffRequest, ctx: CallContext
    ) -> h.CompleteHandoffResponse:
        status = from_proto(req.status) if req.status else ""
        record = await self._handoffs.complete(req.request_id, status, caller=ctx.agent_id())
        message = f"{record.request_id} {record.state}: the context is {record.to_agent}'s"
        return h.CompleteHandoffResponse(success=True, message=message)


@checked
class HandoffQueryHandler:
    def __init__(self, handoffs: Handoffs, checks: RequestChecks = DEFAULT_CHECKS) -> None:
        self._handoffs = handoffs
        self._checks = checks

    async def list_handoffs(
        self, req: a.ListHandoffsRequest, ctx: CallContext
    ) -> a.ListHandoffsResponse:
        states = [from_proto(s, "statuses") for s in req.statuses] or None
        records = await self._handoffs.search(
            states, from_agent=req.from_agent or None, to_agent=req.to_agent or None,
            limit=min(req.limit or 100, MAX_LIST),
        )  # fmt: skip
        return a.ListHandoffsResponse(
            handoffs=[handoff_view(r, include_snapshot=False) for r in records]
        )

    async def get_handoff(self, req: a.GetHandoffRequest, ctx: CallContext) -> a.HandoffView:
        record = await self._handoffs.get(
            req.request_id, caller=ctx.agent_id(), include_snapshot=req.include_snapshot
        )
        return handoff_view(record, include_snapshot=req.include_snapshot)
