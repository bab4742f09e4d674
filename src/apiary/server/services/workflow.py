"""sw4rm.workflow.WorkflowService: DAG workflows (RFC 17.7; engine/workflows.py), and
apiary.v1.WorkflowQueryService: listing, cancelling and a run's history.

Failures raise `apiary.errors` exceptions (workflow_cycle_detected, validation_error naming
the field, NOT_FOUND, ...), which the transports map to a status with the error code; a
successful call answers success=true.
"""

from __future__ import annotations

from apiary.core.json_reader import read_json_object
from apiary.engine.workflows import Workflows
from apiary.errors import ValidationError
from apiary.server.context import CallContext
from apiary.server.services.negotiation import caller_name
from apiary.server.services.request_checks import DEFAULT_CHECKS, RequestChecks, checked
from apiary.wire import pb
from apiary.wire.convert import event_to_proto
from apiary.wire.workflow import definition_from_proto, state_to_proto, summary_to_proto

w = pb.workflow_pb2
a = pb.apiary_pb2
PAGE = 100
"""Workflows or events per page when the request names no limit."""
MAX_PAGE = 1000
"""Workflows or events per page at most (a larger limit is lowered to it)."""


@checked
class WorkflowHandler:
    def __init__(self, workflows: Workflows, checks: RequestChecks = DEFAULT_CHECKS) -> None:
        self._workflows = workflows
        self._checks = checks

    def _data(self, text: str) -> str:
        """`text`, once it is JSON workflow data within the limits (the engine reads it)."""
        if text.strip():
            limits = self._checks.limits
            read_json_object(
                text, "workflow_data", max_bytes=limits.document_bytes,
                max_depth=limits.json_depth,
            )  # fmt: skip
        return text

    async def create_workflow(
        self, req: w.CreateWorkflowRequest, ctx: CallContext
    ) -> w.CreateWorkflowResponse:
        if not req.HasField("definition"):
            raise ValidationError.for_field("definition", "is required")
        spec = await self._workflows.create(definition_from_proto(req.definition))
        return w.CreateWorkflowResponse(workflow_id=spec.workflow_id, success=True)

    async def start_workflow(
        self, req: w.StartWorkflowRequest, ctx: CallContext
    ) -> w.StartWorkflowResponse:
        stored = await self._workflows.start(
            req.workflow_id, self._data(req.workflow_data), req.metadata
        )
        return w.StartWorkflowResponse(
            workflow_id=req.workflow_id, state=state_to_proto(stored), success=True
        )

    async def get_workflow_state(
        self, req: w.GetWorkflowStateRequest, ctx: CallContext
    ) -> w.GetWorkflowStateResponse:
        stored = await self._workflows.state(req.workflow_id)
        return w.GetWorkflowStateResponse(state=state_to_proto(stored), success=True)

    async def resume_workflow(
        self, req: w.ResumeWorkflowRequest, ctx: CallContext
    ) -> w.ResumeWorkflowResponse:
        stored = await self._workflows.resume(
            req.workflow_id, req.node_id, self._data(req.workflow_data), req.metadata
        )
        return w.ResumeWorkflowResponse(
            workflow_id=req.workflow_id, state=state_to_proto(stored), success=True
        )


def _page(limit: int) -> int:
    return min(limit or PAGE, MAX_PAGE)


@checked
class WorkflowQueryHandler:
    def __init__(self, workflows: Workflows, checks: RequestChecks = DEFAULT_CHECKS) -> None:
        self._workflows = workflows
        self._checks = checks

    async def list_workflows(
        self, req: a.ListWorkflowsRequest, ctx: CallContext
    ) -> a.ListWorkflowsResponse:
        states = [state.strip().upper() for state in req.states] or None
        found, cursor = await self._workflows.reads.summaries(
            states, req.after_id, _page(req.limit)
        )
        return a.ListWorkflowsResponse(
            workflows=[summary_to_proto(s) for s in found], next_after_id=cursor
        )

    async def cancel_workflow(
        self, req: a.CancelWorkflowRequest, ctx: CallContext
    ) -> w.WorkflowState:
        by, _ = caller_name(ctx)
        return state_to_proto(await self._workflows.cancel(req.workflow_id, req.reason, by))

    async def workflow_history(
        self, req: a.WorkflowHistoryRequest, ctx: CallContext
    ) -> a.WorkflowHistoryResponse:
        events, cursor = await self._workflows.reads.history(
            req.workflow_id, req.after_sequence, _page(req.limit),
            frozenset(req.event_types) or None,
        )  # fmt: skip
        return a.WorkflowHistoryResponse(
            events=[event_to_proto(e) for e in events], next_after_sequence=cursor
        )
