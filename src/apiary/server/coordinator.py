"""Assembles a coordinator: store, engine, gRPC server and HTTP server, with one lifetime."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from functools import partial

import grpc
from aiohttp import web
from grpc_health.v1 import health as grpc_health

from apiary.core.access.principal import DEFAULT_TENANT
from apiary.core.clock import Clock
from apiary.core.dedup import iso_utc
from apiary.engine.activity import Activity
from apiary.engine.assembly import (
    Engine,
    Runtime,
    build_engine,
    close_engine,
    load_engine,
    start_engine_tasks,
    supervised,
)
from apiary.engine.cluster.node import ClusterNode
from apiary.engine.eventlog import EventRecorder
from apiary.engine.handoffs import Handoffs
from apiary.engine.hitl import Hitl
from apiary.engine.negotiation.negotiations import Negotiations
from apiary.engine.negotiation.rooms import NegotiationRooms
from apiary.engine.presence import Presence
from apiary.engine.registry import Registry
from apiary.engine.router.delivery import Delivery
from apiary.engine.router.router import Router
from apiary.engine.scheduler.scheduler import Scheduler
from apiary.engine.settings import RouterSettings
from apiary.engine.tools.service import ToolService
from apiary.engine.workflows import Workflows
from apiary.engine.worktrees.worktrees import Worktrees
from apiary.server.auth.authenticator import Authenticator
from apiary.server.auth.forwarded import ForwardedCalls
from apiary.server.auth.guard import AccessGuard
from apiary.server.auth.keys import KeyRing
from apiary.server.cluster import follow_tenants, open_replica, store_claim, tenant_replicas
from apiary.server.cluster_forward import LEADER_SERVICES, Forwarder, LeaderRouted
from apiary.server.cluster_hitl import ForwardedHitl
from apiary.server.cluster_reads import DISCOVERY, DiscoveryThroughLeader
from apiary.server.config.address import Address
from apiary.server.config.server import ServerConfig
from apiary.server.control_plane import ControlPlanes
from apiary.server.dispatch import Dispatcher
from apiary.server.grpc.server import build_grpc_server, set_serving
from apiary.server.http.app import build_http_app
from apiary.server.http.console import ConsoleSources
from apiary.server.http.request_head import JsonRefusingAppRunner
from apiary.server.metrics import Metrics
from apiary.server.services.activity import ActivityBufferHandler, ActivityHandler
from apiary.server.services.artifacts import ArtifactsHandler
from apiary.server.services.discovery import DiscoveryHandler
from apiary.server.services.dlq import DlqHandler
from apiary.server.services.handoff import HandoffHandler, HandoffQueryHandler
from apiary.server.services.hitl import (
    HitlDecisions,
    HitlHandler,
    HitlOperatorHandler,
    served_decision,
)
from apiary.server.services.inference import InferenceHandler
from apiary.server.services.logging import EventLogHandler, LoggingHandler
from apiary.server.services.negotiation import NegotiationHandler, NegotiationOperatorHandler
from apiary.server.services.negotiation_room import (
    NegotiationRoomHandler,
    NegotiationRoomQueryHandler,
)
from apiary.server.services.registry import RegistryHandler
from apiary.server.services.request_checks import RequestChecks
from apiary.server.services.router import RouterHandler, RouterStreamHandler
from apiary.server.services.runtime_control import RuntimeControlHandler
from apiary.server.services.scheduler import (
    AgentControlHandler,
    SchedulerHandler,
    TaskQueryHandler,
)
from apiary.server.services.scheduler_policy import SchedulerPolicyHandler
from apiary.server.services.tools import ConnectorHandler, ToolHandler, ToolProviderHandler
from apiary.server.services.workflow import WorkflowHandler, WorkflowQueryHandler
from apiary.server.services.worktree import WorktreeBindingHandler, WorktreeHandler
from apiary.server.store_health import StoreHealth
from apiary.server.tenancy import (
    Tenancy,
    hitl_settings,
    key_ring,
    serves_tenants,
    tenant_engine,
)
from apiary.server.tls import grpc_credentials, http_context, replica_tls
from apiary.server.tracing.server_tracing import ServerTracing
from apiary.stopping import stop_step, stop_tasks
from apiary.store.claim import Claim, Holder
from apiary.store.open import open_store
from apiary.store.protocols import Store
from apiary.store.sqlite.store import SqliteStore
from apiary.swarm.peer import SwarmPeer, open_swarm_peer
from apiary.swarm.transport import add_swarm_routes
from apiary.system import SystemClock

log = logging.getLogger("apiary.server")

SHUTDOWN_GRACE_S = 5.0


@dataclass(slots=True)
class Coordinator:
    """A running coordinator and the addresses it actually bound."""

    config: ServerConfig
    store: Store
    events: EventRecorder
    registry: Registry
    router: Router
    delivery: Delivery
    presence: Presence
    grpc_address: Address
    http_address: Address
    hitl: Hitl | None = None
    activity: Activity | None = None
    scheduler: Scheduler | None = None
    workflows: Workflows | None = None
    handoffs: Handoffs | None = None
    worktrees: Worktrees | None = None
    rooms: NegotiationRooms | None = None
    tools: ToolService | None = None
    negotiations: Negotiations | None = None
    swarm: SwarmPeer | None = None
    """The swarm peer, when the configuration has a [swarm] table."""
    tenancy: Tenancy | None = None
    """Every tenant's engine; the fields above are the default tenant's."""
    control_planes: ControlPlanes | None = None
    """Every tenant's runtime control plane (docs/control-plane.md)."""
    cluster: ClusterNode | None = None
    """This replica's cluster parts, in cluster mode (docs/cluster.md)."""
    claim_taken: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when another coordinator took this one's claim on the store (store/claim.py):
    it no longer serves (health NOT_SERVING, not ready) and its owner must stop it."""
    leadership_lost: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when this replica's term as the cluster's leader ran out unrenewed (cluster
    mode, docs/cluster.md "The leader"): it no longer serves and its owner must stop it."""
    ready: bool = False


def _handlers(
    engine: Engine, runtime: Runtime, checks: RequestChecks, secure: bool
) -> dict[str, object]:
    handlers: dict[str, object] = {}
    handlers |= {
        "sw4rm.registry.RegistryService": RegistryHandler(
            engine.registry, engine.presence, engine.scheduler, checks=checks
        ),
        "sw4rm.router.RouterService": RouterHandler(
            engine.router,
            engine.delivery,
            HitlDecisions(served_decision(handlers), checks.limits),
            checks=checks,
        ),
        "sw4rm.logging.LoggingService": LoggingHandler(engine.events, checks=checks),
        "apiary.v1.EventLogService": EventLogHandler(engine.events, checks=checks),
        "apiary.v1.RouterStreamService": RouterStreamHandler(
            engine.router, engine.delivery, checks=checks
        ),
        "apiary.v1.DiscoveryService": DiscoveryHandler(
            engine.registry,
            engine.router,
            checks=checks,
            lifecycle=engine.scheduler.lifecycles.state,
        ),
        "apiary.v1.DlqService": DlqHandler(engine.router, runtime.ids, checks=checks),
        "apiary.v1.HitlOperatorService": HitlOperatorHandler(engine.hitl, checks=checks),
        "apiary.v1.ActivityBufferService": ActivityBufferHandler(engine.activity, checks=checks),
        "sw4rm.scheduler.SchedulerService": SchedulerHandler(
            engine.scheduler, ActivityHandler(engine.activity), checks=checks
        ),
        "apiary.v1.AgentControlService": AgentControlHandler(engine.scheduler, checks=checks),
        "apiary.v1.TaskQueryService": TaskQueryHandler(
            engine.scheduler, engine.hitl, checks=checks, secure=secure
        ),
        "sw4rm.reasoning.InferenceProxy": InferenceHandler(checks=checks),
        "sw4rm.reasoning.ReasoningProxy": InferenceHandler(checks=checks),
        "sw4rm.hitl.HitlService": HitlHandler(engine.hitl, checks=checks),
        "sw4rm.workflow.WorkflowService": WorkflowHandler(engine.workflows, checks=checks),
        "apiary.v1.WorkflowQueryService": WorkflowQueryHandler(engine.workflows, checks=checks),
        "sw4rm.handoff.HandoffService": HandoffHandler(engine.handoffs, checks=checks),
        "apiary.v1.HandoffQueryService": HandoffQueryHandler(engine.handoffs, checks=checks),
        "sw4rm.worktree.WorktreeService": WorktreeHandler(engine.worktrees, checks=checks),
        "apiary.v1.WorktreeBindingService": WorktreeBindingHandler(engine.worktrees, checks=checks),
        "sw4rm.negotiation_room.NegotiationRoomService": NegotiationRoomHandler(
            engine.rooms, checks=checks
        ),
        "apiary.v1.NegotiationRoomQueryService": NegotiationRoomQueryHandler(
            engine.rooms, checks=checks
        ),
        "sw4rm.tool.ToolService": ToolHandler(engine.tools, checks=checks),
        "sw4rm.connector.ConnectorService": ConnectorHandler(engine.tools, checks=checks),
        "apiary.v1.ToolProviderService": ToolProviderHandler(engine.tools, checks=checks),
        "sw4rm.scheduler.SchedulerPolicyService": SchedulerPolicyHandler(
            engine.negotiations, engine.hitl, checks=checks
        ),
        "sw4rm.negotiation.NegotiationService": NegotiationHandler(
            engine.negotiations, engine.hitl, checks=checks
        ),
        "apiary.v1.NegotiationOperatorService": NegotiationOperatorHandler(
            engine.negotiations, engine.hitl, runtime.ids, checks=checks
        ),
        "sw4rm.activity.ActivityService": ArtifactsHandler(
            engine.negotiations.artifacts, checks=checks
        ),
    }
    return handlers


def _known_tenants(config: ServerConfig, keys: KeyRing) -> Callable[[], set[str]]:
    """The tenants the configuration and the credentials name (read afresh: keys change)."""

    def known() -> set[str]:
        named = {entry.tenant for entry in keys.entries()}
        return named | set(config.auth.tenants) | {r.tenant for r in config.auth.certificates}

    return known


def _access_guard(
    config: ServerConfig, engine: Engine, runtime: Runtime, metrics: Metrics, tenancy: Tenancy,
    replica: ClusterNode | None,
) -> AccessGuard:  # fmt: skip
    """The one access guard of every surface (docs/security.md); in cluster mode it takes
    the calls other replicas forward, signed with the cluster's key."""
    auth = config.auth
    forwarded = {}
    if replica is not None and replica.leader is not None:
        forwarded["forwarded"] = ForwardedCalls(replica.leader.forward_key, time.time).principal
    authenticator = Authenticator(
        operators=engine.hitl.operators, keys=key_ring(config),
        certificates=auth.certificates, public_key=tenancy.public_key,
        now=runtime.clock.now, audience=auth.audience, window_s=auth.proof_window_s,
        secure=auth.secure, **forwarded,
    )  # fmt: skip
    return AccessGuard(
        authenticator, tenancy.events, secure=auth.secure, denied=metrics.access_denied,
        owners={"tool_call": tenancy.tool_call_owner, "task": tenancy.task_owner},
        log_allowed=auth.log_allowed,
    )  # fmt: skip


def _bind_http(address: Address) -> socket.socket:
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address.host, address.port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _coordinator(
    config: ServerConfig,
    store: Store,
    engine: Engine,
    grpc: Address,
    http: Address,
    swarm: SwarmPeer | None,
) -> Coordinator:
    return Coordinator(
        config, store, engine.events, engine.registry, engine.router, engine.delivery,
        engine.presence, grpc, http, hitl=engine.hitl, activity=engine.activity,
        scheduler=engine.scheduler, workflows=engine.workflows, handoffs=engine.handoffs,
        worktrees=engine.worktrees, rooms=engine.rooms, tools=engine.tools,
        negotiations=engine.negotiations, swarm=swarm,
    )  # fmt: skip


@asynccontextmanager
async def open_coordinator(
    config: ServerConfig,
    clock: Clock | None = None,
    *,
    runtime: Runtime | None = None,
    router_settings: RouterSettings | None = None,
    swarm_client_tls: ssl.SSLContext | None = None,
    tracing: ServerTracing | None = None,
) -> AsyncIterator[Coordinator]:
    """Run a coordinator for the duration of the block; shuts down gracefully on exit.

    `swarm_client_tls` is how the swarm peer verifies its peers' certificates (tests: a
    private CA); None: the swarm home's ca_file, else the system's CAs. `tracing` is the
    coordinator's tracing (tests: an in-memory exporter's), which its owner closes; None:
    per the [tracing] table.
    """
    runtime = _runtime(config, runtime, clock)
    settings = router_settings or config.router
    async with (
        open_store(config.store or None, config.data_dir) as store,
        store_claim(store, Holder.here(iso_utc(runtime.clock.now())), config.cluster) as claim,
        AsyncExitStack() as optional,
    ):
        if tracing is None:
            tracing = await _open_tracing(config, optional)
        if tracing is not None:
            runtime = replace(runtime, tracing=tracing)
        engine = build_engine(
            store, settings, runtime, hitl_settings(config), config.scheduler, config.data_dir,
            config.handoff, config.worktrees, config.rooms, config.tools, config.negotiation,
        )  # fmt: skip
        replica = await optional.enter_async_context(
            open_replica(config.cluster, store, engine, runtime, f"grpc {config.grpc}")
        )
        swarm = await _start_swarm(
            config, store, engine, runtime, swarm_client_tls, optional, replica
        )
        recovered = await load_engine(
            engine, recover_messages=replica is None, leader=replica is None
        )
        metrics = Metrics(
            engine.router, engine.activity, engine.scheduler, engine.events,
            store_stats=(lambda: store.stats) if isinstance(store, SqliteStore) else None,
            cluster=replica,
        )  # fmt: skip
        checks = RequestChecks(config.limits)
        forwarder = _forwarder(replica, engine, config, optional)
        handlers = _leader_routed(_handlers(engine, runtime, checks, config.auth.secure), forwarder)
        # (the services of every tenant, serving each call in its tenant: set below, as
        # they need the tenancy)
        every_tenant: dict[str, object] = {}
        tenancy = Tenancy(
            config, runtime,
            tenant_engine(
                DEFAULT_TENANT, store, engine, handlers, config.auth.quota(DEFAULT_TENANT)
            ),
            lambda tenant_engine: {
                **_leader_routed(
                    _handlers(tenant_engine, runtime, checks, config.auth.secure), forwarder
                ),
                **every_tenant,
            },
            _known_tenants(config, key_ring(config)),
            None if replica is None else tenant_replicas(replica, store, runtime, forwarder),
        )  # fmt: skip
        guard = _access_guard(config, engine, runtime, metrics, tenancy, replica)
        controls, every_tenant["apiary.v1.RuntimeControlService"] = _control_planes(
            config, runtime, tenancy, guard, forwarder, checks
        )
        handlers.update(every_tenant)
        dispatcher = Dispatcher(handlers, guard, tenancy, tracing=tracing)
        server, health = build_grpc_server(dispatcher, metrics)
        reach = StoreHealth(store, lambda ok: set_serving(health, ok), runtime.sleep)
        grpc_address = _bind_grpc(server, config)
        http_socket = _bind_http(config.http)
        state = _coordinator(
            config, store, engine, grpc_address,
            Address(config.http.host, http_socket.getsockname()[1]), swarm,
        )  # fmt: skip
        app = build_http_app(
            dispatcher, metrics, lambda: state.ready and reach.reachable,
            ConsoleSources(engine.events, engine.workflows, engine.hitl), guard,
            runtime=controls, tenancy=tenancy,
        )  # fmt: skip
        if swarm is not None:
            add_swarm_routes(app, swarm.node)
        state.tenancy = tenancy
        await claim.describe(f"grpc {state.grpc_address} http {state.http_address}")
        runner = await _serve_http(app, http_socket, config)
        await server.start()
        await set_serving(health, True)
        state.cluster = replica
        tasks = [
            *start_engine_tasks(
                store, engine, runtime, message_deadlines=replica is None,
                leader=replica is None,
            ),
            asyncio.create_task(reach.run(), name="apiary-store-health"),
            asyncio.create_task(
                _stop_serving_once_taken(claim, state, health), name="apiary-claim"
            ),
            *_lead(replica, state, health),
        ]  # fmt: skip
        if replica is None:  # (in cluster mode the leader starts them with its term)
            engine.tools.start()
        await engine.events.record(
            "coordinator.started", "coordinator",
            grpc=str(state.grpc_address), http=str(state.http_address), store=store.backend,
            recovered_messages=recovered,
        )  # fmt: skip
        tasks += await _open_tenants(config, tenancy, store, replica, runtime)
        tasks += await _start_control_planes(state, controls, replica)
        state.ready = True
        try:
            yield state
        finally:
            state.ready = False
            await _shut_down(engine, server, health, runner, tasks, tenancy, controls)


async def _open_tenants(
    config: ServerConfig, tenancy: Tenancy, store: Store, replica: ClusterNode | None,
    runtime: Runtime,
) -> list[asyncio.Task[None]]:  # fmt: skip
    """Open the engines of the tenants the configuration and the credentials name; in
    cluster mode, the loop that opens those other replicas opened (`follow_tenants`)."""
    if not serves_tenants(config):
        return []
    for tenant in sorted(_known_tenants(config, key_ring(config))() - {DEFAULT_TENANT}):
        await tenancy.engine(tenant)
    if replica is None:
        return []
    follow = partial(follow_tenants, store, tenancy.opened, tenancy.engine, runtime.sleep)
    return [
        asyncio.create_task(
            supervised("apiary-cluster-tenants", follow), name="apiary-cluster-tenants"
        )
    ]


def _runtime(config: ServerConfig, runtime: Runtime | None, clock: Clock | None) -> Runtime:
    """The engine's runtime: the one given (tests) or the system's, with the [presence]
    table's settings when the configuration has one."""
    runtime = runtime or Runtime(clock=clock or SystemClock())
    if config.presence is None:
        return runtime
    return replace(runtime, presence=config.presence)


async def _stop_serving_once_taken(
    claim: Claim, state: Coordinator, health: grpc_health.aio.HealthServicer
) -> None:
    """Another coordinator took the store's claim: stop answering as a serving coordinator
    at once (its owner, `apiary serve`, then shuts it down)."""
    await claim.taken.wait()
    state.ready = False
    await set_serving(health, False)
    state.claim_taken.set()


def _forwarder(
    replica: ClusterNode | None, engine: Engine, config: ServerConfig, stack: AsyncExitStack
) -> Forwarder | None:
    """In cluster mode, what forwards the leader's services' calls to the leader
    (`server.cluster_forward`), and the HITL invocations of the default tenant's own
    components (`server.cluster_hitl`; another tenant's: `server.cluster.tenant_replicas`),
    its channels closed with `stack`; None otherwise."""
    if replica is None or replica.leader is None:
        return None
    forwarder = Forwarder(replica.leader, replica_tls(config))
    stack.push_async_callback(forwarder.close)
    engine.hitl.leader = ForwardedHitl(forwarder, replica.leader.part.relay, engine.hitl.get)
    return forwarder


def _leader_routed(handlers: dict[str, object], forwarder: Forwarder | None) -> dict[str, object]:
    """`handlers` (the default tenant's or another's), in cluster mode: the leader's
    services served here while this replica leads, else forwarded to the leader, in the
    same tenant; and the agents' states of DiscoveryService read from the leader
    (`server.cluster_reads`)."""
    if forwarder is None:
        return handlers
    for service in LEADER_SERVICES:
        handlers[service] = LeaderRouted(service, handlers[service], forwarder)
    discovery = handlers[DISCOVERY]
    assert isinstance(discovery, DiscoveryHandler)
    handlers[DISCOVERY] = DiscoveryThroughLeader(discovery, forwarder)
    return handlers


def _control_planes(
    config: ServerConfig, runtime: Runtime, tenancy: Tenancy, guard: AccessGuard,
    forwarder: Forwarder | None, checks: RequestChecks,
) -> tuple[ControlPlanes, RuntimeControlHandler]:  # fmt: skip
    """Every tenant's runtime control plane, and their gRPC service (RuntimeControlService,
    serving each call in its tenant)."""
    controls = ControlPlanes(
        tenancy, runtime, config.runtime, secure=config.auth.secure, forwarder=forwarder
    )
    return controls, RuntimeControlHandler(controls, guard, tenancy, checks)


async def _start_control_planes(
    state: Coordinator, controls: ControlPlanes, replica: ClusterNode | None
) -> list[asyncio.Task[None]]:
    """The control planes started; in cluster mode, the task that has the default tenant's
    take up its work once this replica leads."""
    state.control_planes = controls
    await controls.start()
    return _control_plane_once_leading(replica, controls)


def _control_plane_once_leading(
    replica: ClusterNode | None, controls: ControlPlanes
) -> list[asyncio.Task[None]]:
    """In cluster mode: the default tenant's control plane takes up its work once this
    replica leads (`ControlPlanes.lead`)."""
    if replica is None or replica.leader is None:
        return []
    loaded = replica.leader.loaded

    async def lead() -> None:
        await loaded.wait()
        await controls.lead()

    return [asyncio.create_task(lead(), name="apiary-runtime-lead")]


def _lead(
    replica: ClusterNode | None, state: Coordinator, health: grpc_health.aio.HealthServicer
) -> list[asyncio.Task[None]]:
    """In cluster mode, once this replica serves: seek the leader's lease, recording where it
    serves; and stop serving should a term of this replica's end unrenewed."""
    if replica is None or replica.leader is None:
        return []
    replica.leader.start(_advertised(state.grpc_address))
    stop = _stop_serving_once_lost(replica, state, health)
    return [asyncio.create_task(stop, name="apiary-leader")]


def _advertised(address: Address) -> str:
    """Where the other replicas reach this one's gRPC port: its host, or this machine's
    name when it listens on every interface."""
    host = socket.gethostname() if address.host in ("", "0.0.0.0", "::") else address.host
    return str(Address(host, address.port))


async def _stop_serving_once_lost(
    replica: ClusterNode, state: Coordinator, health: grpc_health.aio.HealthServicer
) -> None:
    """This replica's term as leader ran out unrenewed: stop answering at once (its owner,
    `apiary serve`, then shuts it down, and a supervisor starts it again as a follower)."""
    assert replica.leader is not None
    await replica.leader.lost.wait()
    state.ready = False
    await set_serving(health, False)
    state.leadership_lost.set()


async def _open_tracing(config: ServerConfig, stack: AsyncExitStack) -> ServerTracing | None:
    """The tracing of the [tracing] table for the stack's lifetime; None when it is off."""
    if not config.tracing.enabled:
        return None
    # Imported only now: with tracing off, OpenTelemetry is never loaded.
    from apiary.server.tracing.otel import open_tracing  # noqa: PLC0415

    return await stack.enter_async_context(open_tracing(config.tracing))


async def _start_swarm(
    config: ServerConfig,
    store: Store,
    engine: Engine,
    runtime: Runtime,
    client_tls: ssl.SSLContext | None,
    stack: AsyncExitStack,
    replica: ClusterNode | None,
) -> SwarmPeer | None:
    """The swarm peer of the [swarm] table, bridged to the router, for the stack's lifetime;
    in cluster mode its outbox retried by the leader only (docs/cluster.md, "The swarm
    peer")."""
    if config.swarm is None:
        return None
    leader = None if replica is None else replica.leader
    return await stack.enter_async_context(
        open_swarm_peer(
            config.swarm,
            store.swarm,
            engine.router,
            clock=runtime.clock,
            ids=runtime.ids,
            ssl_context=client_tls,
            retries_when=None if leader is None else leader.leads,
        )
    )


def _bind_grpc(server: grpc.aio.Server, config: ServerConfig) -> Address:
    credentials = grpc_credentials(config)
    port = (
        server.add_insecure_port(str(config.grpc))
        if credentials is None
        else server.add_secure_port(str(config.grpc), credentials)
    )
    if port == 0:
        raise OSError(f"cannot bind the gRPC port {config.grpc}")
    return Address(config.grpc.host, port)


async def _serve_http(
    app: web.Application, sock: socket.socket, config: ServerConfig
) -> web.AppRunner:
    runner = JsonRefusingAppRunner(app, shutdown_timeout=SHUTDOWN_GRACE_S)
    await runner.setup()
    await web.SockSite(runner, sock, ssl_context=http_context(config)).start()
    return runner


async def _shut_down(
    engine: Engine,
    server: grpc.aio.Server,
    health: grpc_health.aio.HealthServicer,
    runner: web.AppRunner,
    tasks: list[asyncio.Task[None]],
    tenancy: Tenancy,
    controls: ControlPlanes,
) -> None:
    # Each step bounded (apiary.stopping): one that does not finish is logged with where it
    # waits and left behind, so that the stop always finishes and the store is closed.
    await stop_step(set_serving(health, False), "the health service")
    # Tool calls in progress are cancelled and their processes stopped first, so that their
    # streams end with a final frame within the server's grace period.
    await stop_step(engine.tools.close(), "the tool service")
    await stop_step(server.stop(SHUTDOWN_GRACE_S), "the gRPC server")
    await stop_step(runner.cleanup(), "the HTTP server")
    # The control planes' followers read the tenants' schedulers: closed before those.
    await stop_step(controls.close(), "the runtime control planes")
    await stop_step(tenancy.close(), "the tenants' engines")
    await stop_tasks(tasks, "the coordinator's tasks")
    await stop_step(close_engine(engine), "the engine")
    await engine.events.record("coordinator.stopped", "coordinator")
    await stop_step(engine.events.close(), "the event log")
