"""sw4rm.registry.RegistryService. A registration may declare how many Scheduler tasks the
agent runs at once in the call's `apiary-task-concurrency` metadata (core/tasks/capacity.py;
the canonical descriptor has no field for it)."""

from __future__ import annotations

from apiary.core.access.principal import PrincipalKind
from apiary.core.tasks.capacity import TASK_CONCURRENCY_METADATA, check_task_concurrency
from apiary.engine.presence import Presence
from apiary.engine.registry import Registry
from apiary.engine.scheduler.scheduler import Scheduler
from apiary.errors import ApiaryError
from apiary.server.context import CallContext, request_proof
from apiary.server.services.request_checks import (
    DEFAULT_CHECKS,
    RequestChecks,
    checked,
    checks_inside,
)
from apiary.wire import pb
from apiary.wire.convert import descriptor_to_dict

registry_pb2 = pb.registry_pb2


def _vouched(ctx: CallContext, agent_id: str) -> bool:
    """Whether the call's credential speaks for `agent_id` (the agent itself, or an operator,
    whom the access guard let act for it)."""
    principal = ctx.principal
    return principal.is_agent(agent_id) or principal.kind is PrincipalKind.OPERATOR


@checked
class RegistryHandler:
    def __init__(
        self,
        registry: Registry,
        presence: Presence,
        scheduler: Scheduler,
        checks: RequestChecks = DEFAULT_CHECKS,
    ) -> None:
        self._registry = registry
        self._presence = presence
        self._scheduler = scheduler
        self._checks = checks

    @checks_inside
    async def register_agent(
        self, req: registry_pb2.RegisterAgentRequest, ctx: CallContext
    ) -> registry_pb2.RegisterAgentResponse:
        try:
            self._checks.check_metadata(ctx)
            self._checks.check(req)
            declared = ctx.get(TASK_CONCURRENCY_METADATA)
            record = await self._registry.register(
                descriptor_to_dict(req.agent), bytes(req.agent.public_key),
                proof=request_proof(ctx), signed=req.SerializeToString(deterministic=True),
                vouched=_vouched(ctx, req.agent.agent_id),
                task_concurrency=(
                    check_task_concurrency(declared, TASK_CONCURRENCY_METADATA)
                    if declared else None
                ),
            )  # fmt: skip
        except ApiaryError as exc:
            if exc.code != "validation_error":
                raise
            # The canonical reply carries refusals: accepted=false with the reason.
            return registry_pb2.RegisterAgentResponse(accepted=False, reason=exc.message)
        await self._presence.joined(record)
        await self._scheduler.agent_registered(record.agent_id, record.name)
        return registry_pb2.RegisterAgentResponse(
            accepted=True, reason=f"registered {record.agent_id}"
        )

    async def heartbeat(
        self, req: registry_pb2.HeartbeatRequest, ctx: CallContext
    ) -> registry_pb2.HeartbeatResponse:
        state = pb.common_pb2.AgentState.Name(req.state) if req.state else ""
        await self._registry.heartbeat(req.agent_id, state, dict(req.health))
        if state:
            await self._scheduler.agent_reported(req.agent_id, state)
        return registry_pb2.HeartbeatResponse(ok=True)

    async def deregister_agent(
        self, req: registry_pb2.DeregisterAgentRequest, ctx: CallContext
    ) -> registry_pb2.DeregisterAgentResponse:
        self._registry.check_removal(
            req.agent_id, signed=req.SerializeToString(deterministic=True),
            proof=request_proof(ctx), vouched=_vouched(ctx, req.agent_id),
        )  # fmt: skip
        ok = await self._registry.deregister(req.agent_id, req.reason)
        if ok:
            await self._presence.left(req.agent_id, req.reason)
            await self._scheduler.agent_deregistered(req.agent_id)
        return registry_pb2.DeregisterAgentResponse(ok=ok)
