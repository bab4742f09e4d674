"""apiary.v1.DiscoveryService: registry reads and per-agent buffer capacity. An agent's
`state` is the one `core.agent_state.shown_state` decides from the registry's record and the
Scheduler's lifecycle, so that every reader (the console, `apiary status`) shows the same."""

from __future__ import annotations

from collections.abc import Callable

from apiary.core.agent_lifecycle import AgentLifecycleState
from apiary.core.agent_state import shown_state
from apiary.core.records import AgentRecord
from apiary.core.tasks.capacity import declared_concurrency
from apiary.engine.registry import Registry, retired_keys_of
from apiary.engine.router.router import Router
from apiary.server.context import CallContext
from apiary.server.services.request_checks import DEFAULT_CHECKS, RequestChecks, checked
from apiary.wire import pb
from apiary.wire.convert import descriptor_from_dict, float_to_timestamp

apiary_pb2 = pb.apiary_pb2
Lifecycle = Callable[[str], AgentLifecycleState | None]
"""An agent's lifecycle state as the Scheduler holds it (None: not tracked)."""


@checked
class DiscoveryHandler:
    def __init__(
        self,
        registry: Registry,
        router: Router,
        checks: RequestChecks = DEFAULT_CHECKS,
        lifecycle: Lifecycle | None = None,
    ) -> None:
        self._registry = registry
        self._router = router
        self._checks = checks
        self._lifecycle = lifecycle

    def _info(self, record: AgentRecord) -> apiary_pb2.AgentInfo:
        inbox = self._router.inbox(record.agent_id)
        return apiary_pb2.AgentInfo(
            descriptor=descriptor_from_dict(dict(record.descriptor)),
            state=shown_state(
                record.state, self._lifecycle(record.agent_id) if self._lifecycle else None
            ),
            registered_at=float_to_timestamp(record.registered_at),
            last_heartbeat_at=float_to_timestamp(record.last_heartbeat_at),
            buffer_capacity=inbox.capacity,
            buffer_depth=inbox.depth,
            retired_keys=[
                apiary_pb2.RetiredKey(public_key=key, retired_at=float_to_timestamp(at))
                for key, at in retired_keys_of(record, self._registry.now())
            ],
            task_concurrency=declared_concurrency(record.descriptor) or 1,
        )

    async def list_agents(
        self, req: apiary_pb2.ListAgentsRequest, ctx: CallContext
    ) -> apiary_pb2.ListAgentsResponse:
        agents = await self._registry.list()
        if req.capability:
            agents = [a for a in agents if req.capability in a.descriptor.get("capabilities", [])]
        return apiary_pb2.ListAgentsResponse(agents=[self._info(a) for a in agents])

    async def get_agent(
        self, req: apiary_pb2.GetAgentRequest, ctx: CallContext
    ) -> apiary_pb2.AgentInfo:
        return self._info(await self._registry.get(req.agent_id))

    async def set_buffer_capacity(
        self, req: apiary_pb2.SetBufferCapacityRequest, ctx: CallContext
    ) -> apiary_pb2.SetBufferCapacityResponse:
        await self._registry.get(req.agent_id)
        capacity = self._router.set_capacity(req.agent_id, req.capacity)
        return apiary_pb2.SetBufferCapacityResponse(capacity=capacity)
