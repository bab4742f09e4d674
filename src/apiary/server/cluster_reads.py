"""DiscoveryService on the replicas of a cluster (docs/cluster.md, "Reads of the leader's
memory"): each agent's `state` is the leader's.

An agent's shown state (`core.agent_state.shown_state`) comes from the registry, which is
the store's and alike on every replica, and from the Scheduler's lifecycle, which lives in
the leader's memory only: the lifecycles of a replica that does not lead are idle. So on
such a replica ListAgents and GetAgent are answered here (the registry, and the buffers of
the agents streaming on this replica) with each agent's `state` taken from the same call
forwarded to the leader (`server.cluster_forward`: the caller's principal, signed, and the
leader's access rule for the same method). An agent the leader does not know yet (registered
a moment ago elsewhere) keeps the state decided here. SetBufferCapacity stays this
replica's (docs/cluster.md, "Buffers, credits and the maximum age").
"""

from __future__ import annotations

from typing import Final

from apiary.errors import NotFoundError
from apiary.server.cluster_forward import Forwarder
from apiary.server.context import CallContext
from apiary.server.services.discovery import DiscoveryHandler
from apiary.wire import pb
from apiary.wire.services import SERVICES

apiary_pb2 = pb.apiary_pb2
DISCOVERY: Final = "apiary.v1.DiscoveryService"
_METHODS: Final = {m.name: m for m in SERVICES[DISCOVERY]}


class DiscoveryThroughLeader:
    """DiscoveryService in cluster mode (module docstring)."""

    def __init__(self, handler: DiscoveryHandler, forwarder: Forwarder) -> None:
        self._handler = handler
        self._forwarder = forwarder

    async def list_agents(
        self, req: apiary_pb2.ListAgentsRequest, ctx: CallContext
    ) -> apiary_pb2.ListAgentsResponse:
        mine = await self._handler.list_agents(req, ctx)
        if await self._forwarder.local(ctx.tenant()):
            return mine
        theirs = await self._forwarder.unary(_METHODS["ListAgents"], req, ctx)
        assert isinstance(theirs, apiary_pb2.ListAgentsResponse)
        states = {info.descriptor.agent_id: info.state for info in theirs.agents}
        for info in mine.agents:
            info.state = states.get(info.descriptor.agent_id, info.state)
        return mine

    async def get_agent(
        self, req: apiary_pb2.GetAgentRequest, ctx: CallContext
    ) -> apiary_pb2.AgentInfo:
        mine = await self._handler.get_agent(req, ctx)
        if await self._forwarder.local(ctx.tenant()):
            return mine
        try:
            theirs = await self._forwarder.unary(_METHODS["GetAgent"], req, ctx)
        except NotFoundError:
            return mine
        assert isinstance(theirs, apiary_pb2.AgentInfo)
        mine.state = theirs.state
        return mine

    async def set_buffer_capacity(
        self, req: apiary_pb2.SetBufferCapacityRequest, ctx: CallContext
    ) -> apiary_pb2.SetBufferCapacityResponse:
        return await self._handler.set_buffer_capacity(req, ctx)
