"""sw4rm.registry.RegistryService."""

from __future__ import annotations

from apiary.engine.registry import Registry
from apiary.server.context import CallContext
from apiary.wire import pb
from apiary.wire.convert import descriptor_to_dict

registry_pb2 = pb.registry_pb2


class RegistryHandler:
    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    async def register_agent(
        self, req: registry_pb2.RegisterAgentRequest, ctx: CallContext
    ) -> registry_pb2.RegisterAgentResponse:
        record = await self._registry.register(descriptor_to_dict(req.agent))
        return registry_pb2.RegisterAgentResponse(
            accepted=True, reason=f"registered {record.agent_id}"
        )

    async def heartbeat(
        self, req: registry_pb2.HeartbeatRequest, ctx: CallContext
    ) -> registry_pb2.HeartbeatResponse:
        state = pb.common_pb2.AgentState.Name(req.state) if req.state else ""
        await self._registry.heartbeat(req.agent_id, state, dict(req.health))
        return registry_pb2.HeartbeatResponse(ok=True)

    async def deregister_agent(
        self, req: registry_pb2.DeregisterAgentRequest, ctx: CallContext
    ) -> registry_pb2.DeregisterAgentResponse:
        ok = await self._registry.deregister(req.agent_id, req.reason)
        return registry_pb2.DeregisterAgentResponse(ok=ok)
