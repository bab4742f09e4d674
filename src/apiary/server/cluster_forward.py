"""The calls of the leader's services, forwarded to the leader by the other replicas
(docs/cluster.md, "The leader").

In cluster mode the handlers of `LEADER_SERVICES` are wrapped (`LeaderRouted`), every
tenant's: on the leader a call is served by the local handler of the tenant it acts in; on
another replica it is forwarded, after this replica's access guard admitted it, to the
address the leader recorded, as the same method with the same request and metadata plus
`FORWARD_KEY` (the principal established here, signed: `core.cluster.forwarding`), which
the leader's authenticator accepts from replicas only; the principal's tenant and the
call's `apiary-tenant` go with it, so the leader serves it in the same tenant. The leader's
answer, or its error, is this call's. A call that arrives forwarded on a replica that no
longer leads is not forwarded again: it is unavailable, for the caller to try again. Reads
(`RETRIED`) are forwarded again to the next leader when the leader goes away mid-call,
until the call's deadline; other calls answer unavailable then (the caller decides: a task
submitted with its own task_id may be submitted again).

Over TLS the replica trusts the certificate it serves itself and presents its client
certificate (`server.tls.ReplicaTls`: `[cluster] client_cert`, by default its own
`tls_cert`) to a leader that requires one; a leader that refuses it is told apart from a
leader gone (`ReplicaTls.refusal`) and the call answers unavailable naming the setting,
without being forwarded again.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import grpc
from google.protobuf.message import Message

from apiary.core.access.principal import DEFAULT_TENANT
from apiary.core.access.proof import PROOF_KEY
from apiary.core.cluster.forwarding import FORWARD_KEY, Forwarded, sign_forward
from apiary.engine.cluster.leader_role import LeaderRole
from apiary.errors import ApiaryError, UnavailableError, UnimplementedError
from apiary.server.context import CallContext
from apiary.server.dispatch import snake_case
from apiary.server.tls import ReplicaTls
from apiary.wire.errordetail import error_from_trailers
from apiary.wire.services import SERVICES, RpcMethod

LEADER_SERVICES: Final = frozenset(
    {
        "sw4rm.scheduler.SchedulerService",
        "apiary.v1.TaskQueryService",
        "apiary.v1.AgentControlService",
        "apiary.v1.ActivityBufferService",
        "sw4rm.hitl.HitlService",
        "apiary.v1.HitlOperatorService",
        "sw4rm.workflow.WorkflowService",
        "apiary.v1.WorkflowQueryService",
        "sw4rm.handoff.HandoffService",
        "apiary.v1.HandoffQueryService",
        "sw4rm.negotiation_room.NegotiationRoomService",
        "apiary.v1.NegotiationRoomQueryService",
        "sw4rm.negotiation.NegotiationService",
        "apiary.v1.NegotiationOperatorService",
        "sw4rm.scheduler.SchedulerPolicyService",
        "sw4rm.activity.ActivityService",
        "sw4rm.tool.ToolService",
        "sw4rm.connector.ConnectorService",
        "apiary.v1.ToolProviderService",
        "sw4rm.worktree.WorktreeService",
        "apiary.v1.WorktreeBindingService",
    }
)
"""The services whose component runs on the leader only (`engine.assembly.LEADER_PARTS`,
docs/cluster.md's table)."""
RETRIED: Final = frozenset(
    {
        "/apiary.v1.TaskQueryService/GetTask",
        "/apiary.v1.TaskQueryService/WaitTask",
        "/apiary.v1.TaskQueryService/ListTasks",
        "/apiary.v1.DiscoveryService/ListAgents",
        "/apiary.v1.DiscoveryService/GetAgent",
    }
)
"""Reads, forwarded again to the next leader when the leader goes away mid-call (the
agents' states of DiscoveryService: `server.cluster_reads`)."""
_NOT_FORWARDED: Final = frozenset({PROOF_KEY, FORWARD_KEY})
"""The caller's credentials stay here: the forwarded call acts as the principal signed."""
_FORWARDED_PREFIXES: Final = ("sw4rm-", "apiary-")
_FORWARDED: Final = frozenset({"traceparent", "tracestate", "baggage"})
"""What of a call's metadata (or an HTTP call's headers) the leader's handlers may read,
besides the protocol's and Apiary's own keys: the trace context."""
RETRY_PAUSE_S: Final = 0.1
"""The pause before a read is forwarded again after its leader went away."""
CHANNEL_OPTIONS: Final = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
"""A replica restarted at the leader's address (a rolling restart) is reached again within
a second, not after grpc's default backoff of up to two minutes."""
LEADER_WAIT_S: Final = 30.0
CLIENT_CERT: Final = "cluster.client_cert"
"""The setting named when the leader refuses this replica's client certificate."""
"""How long a call waits for a leader when the cluster has none (its deadline first)."""


class Forwarder:
    """Forwards calls to the cluster's leader (module docstring)."""

    def __init__(self, role: LeaderRole, tls: ReplicaTls | None = None) -> None:
        self._role = role
        self._tls = tls
        self._channels: dict[str, grpc.aio.Channel] = {}

    @property
    def replica_id(self) -> str:
        return self._role.lease.me.replica_id

    async def local(self, tenant: str = DEFAULT_TENANT) -> bool:
        """Whether this replica serves a call in `tenant`: it leads now, the tenant's
        components loaded (a term that has just begun, or a tenant just opened here, is
        waited for while they load). Forwarded, a call acts in the same tenant on the
        leader: its principal and its `apiary-tenant` metadata go with it."""
        role = self._role
        part = role.parts.get(tenant)
        if part is None:
            return False
        if role.lease.leads() and not part.loaded.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LEADER_WAIT_S):
                    await part.loaded.wait()
        return role.leads(tenant)

    async def unary(self, method: RpcMethod, request: Message, ctx: CallContext) -> Message:
        loop = asyncio.get_running_loop()
        remaining = ctx.time_remaining()
        until = loop.time() + (LEADER_WAIT_S if remaining is None else remaining)
        while True:
            address = await self._leader(ctx)
            call = self._channel(address).unary_unary(
                method.path,
                request_serializer=type(request).SerializeToString,
                response_deserializer=method.response_type.FromString,
            )
            try:
                response: Message = await call(
                    request, metadata=self.signed(method.path, ctx),
                    timeout=ctx.time_remaining(),
                )  # fmt: skip
                return response
            except grpc.aio.AioRpcError as exc:
                error = await self._error(exc, address)
                refused = error.details.get("field") == CLIENT_CERT  # (refused again)
                gone = _leader_gone(exc) and not refused
                if not (gone and method.path in RETRIED) or loop.time() > until:
                    raise error from None
            self._role.lease.wake()  # (look at the lease again: the leader may be gone)
            await asyncio.sleep(RETRY_PAUSE_S)

    async def stream(
        self, method: RpcMethod, request: Message, ctx: CallContext
    ) -> AsyncIterator[Message]:
        address = await self._leader(ctx)
        call = self._channel(address).unary_stream(
            method.path,
            request_serializer=type(request).SerializeToString,
            response_deserializer=method.response_type.FromString,
        )
        answers = call(
            request, metadata=self.signed(method.path, ctx), timeout=ctx.time_remaining()
        )
        try:
            async for item in answers:
                yield item
        except grpc.aio.AioRpcError as exc:
            raise await self._error(exc, address) from None
        finally:
            answers.cancel()

    async def _leader(self, ctx: CallContext) -> str:
        if ctx.get(FORWARD_KEY):
            raise UnavailableError(
                "the call was forwarded to this replica as the cluster's leader, but it no "
                "longer leads: try again",
                {"component": "leader"},
            )
        remaining = ctx.time_remaining()
        wait_s = LEADER_WAIT_S if remaining is None else max(0.0, min(remaining, LEADER_WAIT_S))
        address = await self._role.address(wait_s)
        if not address:
            raise UnavailableError(
                "the cluster has no leader right now (one is taken over within [cluster] "
                "lease_s): try again",
                {"component": "leader"},
            )
        return address

    def signed(self, path: str, ctx: CallContext) -> list[tuple[str, str]]:
        """The metadata (or HTTP headers) forwarding the call of `path` as `ctx`'s
        principal: what the leader may read of `ctx`'s, and the signed principal."""
        principal = ctx.principal
        forwarded = Forwarded(
            principal,
            self._role.lease.me.replica_id,
            int(time.time() * 1000),
            secrets.token_hex(12),
        )
        kept = [
            (k, v) for k, v in ctx.metadata.items()
            if k not in _NOT_FORWARDED and (k.startswith(_FORWARDED_PREFIXES) or k in _FORWARDED)
        ]  # fmt: skip
        return [*kept, (FORWARD_KEY, sign_forward(self._role.forward_key, path, forwarded))]

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            if self._tls is None:
                channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
            else:
                creds = self._tls.credentials()
                channel = grpc.aio.secure_channel(address, creds, options=CHANNEL_OPTIONS)
            self._channels[address] = channel
        return channel

    async def _error(self, exc: grpc.aio.AioRpcError, address: str) -> ApiaryError:
        """The leader's error, or why it gave none: it did not answer, or (TLS) it refused
        this replica's client certificate, which names the setting to change."""
        found = error_from_trailers(exc.trailing_metadata() or ())
        if found is not None:
            return found
        tls = self._tls
        refused = await tls.refusal(address) if tls is not None and _unreached(exc) else None
        if tls is not None and refused is not None:
            return UnavailableError(
                f"the cluster's leader at {address} refused this replica's client certificate "
                f"({tls.setting} = {tls.cert}: {refused}): a leader with tls_client_ca takes "
                "a certificate its CA signed that allows client authentication; set "
                "cluster.client_cert and cluster.client_key to one",
                {"component": "leader", "field": CLIENT_CERT},
            )
        return UnavailableError(
            f"the cluster's leader at {address} did not answer ({exc.code().name}): try again",
            {"component": "leader"},
        )

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()


def _unreached(exc: grpc.aio.AioRpcError) -> bool:
    """Whether the call failed before the leader's handlers saw it (no connection)."""
    return exc.code() is grpc.StatusCode.UNAVAILABLE and not exc.trailing_metadata()


def _leader_gone(exc: grpc.aio.AioRpcError) -> bool:
    """Whether the leader went away (or stopped leading) before answering."""
    if exc.code() is not grpc.StatusCode.UNAVAILABLE:
        return False
    found = error_from_trailers(exc.trailing_metadata() or ())
    return found is None or found.details.get("component") == "leader"


class LeaderRouted:
    """A service's handler in cluster mode: each method served here while this replica
    leads, forwarded to the leader otherwise (module docstring)."""

    def __init__(self, service: str, handler: object, forwarder: Forwarder) -> None:
        self._handler = handler
        self._forwarder = forwarder
        self._methods = {snake_case(m.name): m for m in SERVICES[service]}

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = self._methods.get(name)
        local: Callable[..., Any] | None = getattr(self._handler, name, None)
        if method is None or local is None:
            raise AttributeError(name)
        forwarder = self._forwarder
        if method.client_streaming:
            # FollowTasks, the one leader method taking a client stream, is not forwarded:
            # another replica answers unimplemented and the client waits with WaitTask.
            async def bidi(
                frames: AsyncIterator[Message], ctx: CallContext
            ) -> AsyncIterator[Message]:
                if not await forwarder.local(ctx.tenant()):
                    raise UnimplementedError(
                        f"{method.path} is served by the cluster's leader only, and this "
                        "replica does not lead: wait for tasks with WaitTask",
                        {"method": method.path, "component": "leader"},
                    )
                async for item in local(frames, ctx):
                    yield item

            return bidi
        if method.server_streaming:

            async def stream(request: Message, ctx: CallContext) -> AsyncIterator[Message]:
                items = local(request, ctx) if await forwarder.local(ctx.tenant()) else None
                if items is None:
                    items = forwarder.stream(method, request, ctx)
                async for item in items:
                    yield item

            return stream

        async def unary(request: Message, ctx: CallContext) -> Message:
            if await forwarder.local(ctx.tenant()):
                answer: Message = await local(request, ctx)
                return answer
            return await forwarder.unary(method, request, ctx)

        return unary
