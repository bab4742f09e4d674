"""sw4rm.worktree.WorktreeService and apiary.v1.WorktreeBindingService: thin adapters over
engine/worktrees/worktrees.py (RFC 16).

The caller named in the event log is the `sw4rm-agent-id` metadata, else the peer address.
ApproveSwitch lets a switch happen: when HITL operators are configured it needs one of
them (`authorization: Bearer <token>`), who is then the approver on record; without any,
the caller acts as the Scheduler's policy (dev mode, RFC 15.3).
"""

from __future__ import annotations

from apiary.core.worktrees.records import BindingState
from apiary.engine.worktrees.worktrees import Worktrees
from apiary.errors import ValidationError
from apiary.server.context import CallContext
from apiary.server.services.request_checks import DEFAULT_CHECKS, RequestChecks, checked
from apiary.wire import pb
from apiary.wire.worktrees import bind_response, binding_to_proto, status_response

w = pb.worktree_pb2
a = pb.apiary_pb2


def _caller(ctx: CallContext) -> str:
    return ctx.caller()


def _agent(agent_id: str) -> str:
    if not agent_id:
        raise ValidationError.for_field("agent_id", "is required")
    return agent_id


@checked
class WorktreeHandler:
    """The canonical WorktreeService."""

    def __init__(self, worktrees: Worktrees, checks: RequestChecks = DEFAULT_CHECKS) -> None:
        self._worktrees = worktrees
        self._checks = checks

    async def bind(self, req: w.BindRequest, ctx: CallContext) -> w.BindResponse:
        record = await self._worktrees.bind(
            _agent(req.agent_id), req.repo_id, req.worktree_id, actor=_caller(ctx)
        )
        return bind_response(record)

    async def unbind(self, req: w.UnbindRequest, ctx: CallContext) -> w.UnbindResponse:
        await self._worktrees.unbind(_agent(req.agent_id), actor=_caller(ctx))
        return w.UnbindResponse(ok=True)

    async def request_switch(self, req: w.SwitchRequest, ctx: CallContext) -> w.StatusResponse:
        record = await self._worktrees.request_switch(
            _agent(req.agent_id), req.target_worktree_id, requires_hitl=req.requires_hitl,
            actor=_caller(ctx),
        )  # fmt: skip
        return status_response(record)

    async def approve_switch(self, req: w.SwitchApprove, ctx: CallContext) -> w.StatusResponse:
        operator = ctx.operator_or_none()
        actor = operator.name if operator is not None else _caller(ctx)
        record = await self._worktrees.approve_switch(
            _agent(req.agent_id), worktree_id=req.target_worktree_id, ttl_s=req.ttl_ms / 1000,
            actor=actor,
        )  # fmt: skip
        return status_response(record)

    async def reject_switch(self, req: w.SwitchReject, ctx: CallContext) -> w.StatusResponse:
        record = await self._worktrees.reject_switch(
            _agent(req.agent_id), req.reason, actor=_caller(ctx)
        )
        return status_response(record)

    async def status(self, req: w.StatusRequest, ctx: CallContext) -> w.StatusResponse:
        return status_response(self._worktrees.binding(_agent(req.agent_id)))


@checked
class WorktreeBindingHandler:
    """apiary.v1.WorktreeBindingService: listings, whole records, BIND with metadata,
    switches to other repositories, SWITCH_REVOKE."""

    def __init__(self, worktrees: Worktrees, checks: RequestChecks = DEFAULT_CHECKS) -> None:
        self._worktrees = worktrees
        self._checks = checks

    def _view(self, agent_id: str) -> a.WorktreeBinding:
        record = self._worktrees.binding(agent_id)
        return binding_to_proto(record, self._worktrees.path_of(record))

    async def list(self, req: a.ListBindingsRequest, ctx: CallContext) -> a.ListBindingsResponse:
        states = None
        if req.states:
            known = {s.value for s in BindingState}
            for state in req.states:
                if state not in known:
                    raise ValidationError.for_field(
                        "states", f"{state!r} is not one of {', '.join(sorted(known))}"
                    )
            states = frozenset(req.states)
        found = self._worktrees.list(states, req.repo_id or None)
        return a.ListBindingsResponse(
            bindings=[binding_to_proto(r, self._worktrees.path_of(r)) for r in found]
        )

    async def get(self, req: a.GetBindingRequest, ctx: CallContext) -> a.WorktreeBinding:
        return self._view(_agent(req.agent_id))

    async def bind(self, req: a.BindWorktreeRequest, ctx: CallContext) -> a.WorktreeBinding:
        record = await self._worktrees.bind(
            _agent(req.agent_id), req.repo_id, req.worktree_id, branch=req.branch,
            commit_sha=req.commit_sha, actor=_caller(ctx),
        )  # fmt: skip
        return binding_to_proto(record, self._worktrees.path_of(record))

    async def request_switch(
        self, req: a.SwitchWorktreeRequest, ctx: CallContext
    ) -> a.WorktreeBinding:
        record = await self._worktrees.request_switch(
            _agent(req.agent_id), req.target_worktree_id, repo_id=req.target_repo_id,
            ttl_s=req.ttl_ms / 1000, requires_hitl=req.requires_hitl, actor=_caller(ctx),
        )  # fmt: skip
        return binding_to_proto(record, self._worktrees.path_of(record))

    async def revoke(self, req: a.RevokeSwitchRequest, ctx: CallContext) -> a.WorktreeBinding:
        record = await self._worktrees.revoke_switch(
            _agent(req.agent_id), req.reason, actor=_caller(ctx)
        )
        return binding_to_proto(record, self._worktrees.path_of(record))
