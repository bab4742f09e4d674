"""Assembles a coordinator: store, engine, gRPC server and HTTP server, with one lifetime."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from aiohttp import web

from apiary.core.clock import Clock
from apiary.core.handoff_request import HandoffPolicy
from apiary.core.ids import IdGenerator
from apiary.engine.activity import Activity
from apiary.engine.deadlines import Sleep, run_deadlines
from apiary.engine.delivery import Delivery
from apiary.engine.eventlog import EventRecorder
from apiary.engine.handoffs import Handoffs
from apiary.engine.hitl import Hitl, HitlBroadcast, HitlSettings, build_hitl
from apiary.engine.inference_http import build_inference
from apiary.engine.negotiation_policies import NegotiationSettings
from apiary.engine.negotiation_rooms import NegotiationRooms, RoomSettings
from apiary.engine.negotiations import Negotiations
from apiary.engine.notices import NoticeFactory
from apiary.engine.presence import Presence, PresenceSettings
from apiary.engine.registry import Registry
from apiary.engine.resources import ResourceTracker
from apiary.engine.retention import run_retention
from apiary.engine.router import Router
from apiary.engine.scheduler import Scheduler
from apiary.engine.settings import RouterSettings, SchedulerSettings
from apiary.engine.tool_launch import Launcher
from apiary.engine.tool_providers import WorktreeBindings
from apiary.engine.tool_settings import ToolSettings
from apiary.engine.tools import ToolService
from apiary.engine.workflows import Workflows
from apiary.engine.worktree_control import WorktreeControl
from apiary.engine.worktree_settings import WorktreeSettings
from apiary.engine.worktrees import Worktrees, build_worktrees
from apiary.server.config import Address, ServerConfig
from apiary.server.dispatch import Dispatcher
from apiary.server.grpc.server import build_grpc_server, set_serving
from apiary.server.http.app import build_http_app
from apiary.server.http.console import ConsoleSources
from apiary.server.metrics import Metrics
from apiary.server.services.activity import ActivityBufferHandler, ActivityHandler
from apiary.server.services.artifacts import ArtifactsHandler
from apiary.server.services.discovery import DiscoveryHandler
from apiary.server.services.dlq import DlqHandler
from apiary.server.services.handoff import HandoffHandler, HandoffQueryHandler
from apiary.server.services.hitl import HitlHandler, HitlOperatorHandler
from apiary.server.services.inference import InferenceHandler
from apiary.server.services.logging import EventLogHandler, LoggingHandler
from apiary.server.services.negotiation import NegotiationHandler, NegotiationOperatorHandler
from apiary.server.services.negotiation_room import (
    NegotiationRoomHandler,
    NegotiationRoomQueryHandler,
)
from apiary.server.services.registry import RegistryHandler
from apiary.server.services.router import RouterHandler, RouterStreamHandler
from apiary.server.services.scheduler import (
    AgentControlHandler,
    SchedulerHandler,
    TaskQueryHandler,
)
from apiary.server.services.scheduler_policy import SchedulerPolicyHandler
from apiary.server.services.tools import ConnectorHandler, ToolHandler, ToolProviderHandler
from apiary.server.services.workflow import WorkflowHandler
from apiary.server.services.worktree import WorktreeBindingHandler, WorktreeHandler
from apiary.server.tls import grpc_credentials, http_context
from apiary.store.open import open_store
from apiary.store.protocols import Store
from apiary.store.sqlite import SqliteStore
from apiary.swarm.peer import SwarmPeer, open_swarm_peer
from apiary.swarm.transport import add_swarm_routes
from apiary.system import SystemClock, UuidIds
from apiary.wire.codec import ProtobufEnvelopeCodec

log = logging.getLogger("apiary.server")

SHUTDOWN_GRACE_S = 5.0


@dataclass(frozen=True, slots=True)
class Runtime:
    """Injected time, ids and waiting: real by default, fakes in tests."""

    clock: Clock = field(default_factory=SystemClock)
    ids: IdGenerator = field(default_factory=UuidIds)
    sleep: Sleep = asyncio.sleep
    presence: PresenceSettings = field(default_factory=PresenceSettings)
    hitl: HitlSettings | None = None
    """Overrides the configuration's [hitl] settings (tests)."""
    handoff: HandoffPolicy | None = None
    """Overrides the configuration's [handoff] policy (tests)."""
    rooms: RoomSettings | None = None
    """Overrides the configuration's [rooms] settings (tests)."""
    tools: ToolSettings | None = None
    """Overrides the configuration's [tools] settings (tests)."""
    worktrees: WorktreeBindings | None = None
    """Where agents' bound worktrees are, for needs_worktree tools (tests; the engine's
    worktree manager once it is wired)."""
    launcher: Launcher | None = None
    """Starts tool processes (default: the sandbox, apiary.sandbox)."""
    negotiation: NegotiationSettings | None = None
    """Overrides the configuration's [negotiation] settings (tests)."""
    swarm_client_tls: ssl.SSLContext | None = None
    """How the swarm peer verifies its peers' certificates (tests: a private CA); None: the
    swarm home's ca_file, else the system's CAs."""


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
    ready: bool = False


@dataclass(slots=True)
class Engine:
    events: EventRecorder
    registry: Registry
    router: Router
    delivery: Delivery
    presence: Presence
    hitl: Hitl
    activity: Activity
    scheduler: Scheduler
    workflows: Workflows
    handoffs: Handoffs
    worktrees: Worktrees
    rooms: NegotiationRooms
    tools: ToolService
    negotiations: Negotiations


def build_engine(
    store: Store,
    settings: RouterSettings,
    runtime: Runtime,
    hitl_settings: HitlSettings | None = None,
    scheduler_settings: SchedulerSettings | None = None,
    data_dir: Path | None = None,
    handoff_policy: HandoffPolicy | None = None,
    worktree_settings: WorktreeSettings | None = None,
    room_settings: RoomSettings | None = None,
    tool_settings: ToolSettings | None = None,
    negotiation_settings: NegotiationSettings | None = None,
) -> Engine:
    """The engine over `store`, without any transport."""
    clock = runtime.clock
    events = EventRecorder(store.events, clock)
    registry = Registry(store.agents, events, clock, signing_required=settings.signing_required)
    notices = NoticeFactory(clock, runtime.ids)
    codec = ProtobufEnvelopeCodec()
    router = Router(store, registry, events, codec, clock, notices, settings)
    delivery = Delivery(router, registry, store.messages, events)
    presence = Presence(registry, router, notices, events, clock, runtime.presence)
    hitl = build_hitl(
        runtime.hitl or hitl_settings or HitlSettings(), store.hitl, events, clock, runtime.ids
    )
    hitl.notify = HitlBroadcast(registry, router, notices)
    hitl.check_flow_id = router.check_flow_id
    activity = Activity(events, clock)
    resources = ResourceTracker(events, data_dir / "agents" if data_dir else None)
    scheduler = Scheduler(
        store.tasks, router, registry, events, clock, runtime.ids, hitl, activity,
        scheduler_settings, resources=resources,
        inference=build_inference((scheduler_settings or SchedulerSettings()).inference),
    )  # fmt: skip
    delivery.opened = scheduler.agent_ready
    delivery.connected = presence.connected
    workflows = Workflows(store.workflows, scheduler, router, events, clock, runtime.ids)
    handoffs = Handoffs(
        store.handoffs, registry, router, notices, events, clock, runtime.ids,
        runtime.handoff or handoff_policy,
    )  # fmt: skip
    worktrees = build_worktrees(
        worktree_settings or WorktreeSettings(), store.worktrees, events, clock, hitl, data_dir
    )
    WorktreeControl(worktrees, router, registry, notices)
    scheduler.worktree_bound = lambda agent_id: worktrees.bound_root(agent_id) is not None
    worktrees.listeners.append(scheduler.wake)
    rooms = NegotiationRooms(
        store.rooms, router, events, clock, runtime.ids, hitl,
        runtime.rooms or room_settings, sleep=runtime.sleep,
    )  # fmt: skip
    tools_config = runtime.tools or tool_settings or ToolSettings()
    if tools_config.log_dir is None and data_dir is not None:
        tools_config = replace(tools_config, log_dir=data_dir / "logs")
    tools = ToolService(
        store.tools, router, registry, hitl, events, clock, runtime.ids, tools_config,
        launcher=runtime.launcher, worktrees=runtime.worktrees or worktrees,
    )  # fmt: skip
    negotiations = Negotiations(
        store, router, registry, notices, events, clock, hitl,
        runtime.negotiation or negotiation_settings,
    )  # fmt: skip
    scheduler.on_negotiation = negotiations.on_envelope
    return Engine(
        events, registry, router, delivery, presence, hitl, activity, scheduler, workflows,
        handoffs, worktrees, rooms, tools, negotiations,
    )  # fmt: skip


def _handlers(engine: Engine, runtime: Runtime) -> dict[str, object]:
    return {
        "sw4rm.registry.RegistryService": RegistryHandler(
            engine.registry, engine.presence, engine.scheduler, engine.hitl.operators
        ),
        "sw4rm.router.RouterService": RouterHandler(engine.router, engine.delivery, engine.hitl),
        "sw4rm.logging.LoggingService": LoggingHandler(engine.events),
        "apiary.v1.EventLogService": EventLogHandler(engine.events),
        "apiary.v1.RouterStreamService": RouterStreamHandler(engine.router, engine.delivery),
        "apiary.v1.DiscoveryService": DiscoveryHandler(engine.registry, engine.router),
        "apiary.v1.DlqService": DlqHandler(engine.router, runtime.ids),
        "apiary.v1.HitlOperatorService": HitlOperatorHandler(engine.hitl),
        "apiary.v1.ActivityBufferService": ActivityBufferHandler(engine.activity),
        "sw4rm.scheduler.SchedulerService": SchedulerHandler(
            engine.scheduler, ActivityHandler(engine.activity)
        ),
        "apiary.v1.AgentControlService": AgentControlHandler(engine.scheduler),
        "apiary.v1.TaskQueryService": TaskQueryHandler(engine.scheduler, engine.hitl),
        "sw4rm.reasoning.InferenceProxy": InferenceHandler(),
        "sw4rm.reasoning.ReasoningProxy": InferenceHandler(),
        "sw4rm.hitl.HitlService": HitlHandler(engine.hitl),
        "sw4rm.workflow.WorkflowService": WorkflowHandler(engine.workflows),
        "sw4rm.handoff.HandoffService": HandoffHandler(engine.handoffs),
        "apiary.v1.HandoffQueryService": HandoffQueryHandler(engine.handoffs),
        "sw4rm.worktree.WorktreeService": WorktreeHandler(engine.worktrees, engine.hitl.operators),
        "apiary.v1.WorktreeBindingService": WorktreeBindingHandler(engine.worktrees),
        "sw4rm.negotiation_room.NegotiationRoomService": NegotiationRoomHandler(engine.rooms),
        "apiary.v1.NegotiationRoomQueryService": NegotiationRoomQueryHandler(engine.rooms),
        "sw4rm.tool.ToolService": ToolHandler(engine.tools),
        "sw4rm.connector.ConnectorService": ConnectorHandler(engine.tools),
        "apiary.v1.ToolProviderService": ToolProviderHandler(engine.tools, engine.hitl.operators),
        "sw4rm.scheduler.SchedulerPolicyService": SchedulerPolicyHandler(
            engine.negotiations, engine.hitl
        ),
        "sw4rm.negotiation.NegotiationService": NegotiationHandler(
            engine.negotiations, engine.hitl
        ),
        "apiary.v1.NegotiationOperatorService": NegotiationOperatorHandler(
            engine.negotiations, engine.hitl, runtime.ids
        ),
        "sw4rm.activity.ActivityService": ArtifactsHandler(engine.negotiations.artifacts),
    }


def _bind_http(address: Address) -> socket.socket:
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address.host, address.port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def _background(store: Store, engine: Engine, runtime: Runtime) -> list[asyncio.Task[None]]:
    router = engine.router
    return [
        asyncio.create_task(
            run_deadlines(router.deadlines, runtime.clock, router.fire_due, runtime.sleep),
            name="apiary-deadlines",
        ),
        asyncio.create_task(engine.presence.run(runtime.sleep), name="apiary-heartbeats"),
        asyncio.create_task(engine.hitl.run(runtime.sleep), name="apiary-hitl"),
        asyncio.create_task(engine.scheduler.run(runtime.sleep), name="apiary-scheduler"),
        asyncio.create_task(engine.workflows.run(runtime.sleep), name="apiary-workflows"),
        asyncio.create_task(engine.handoffs.run(runtime.sleep), name="apiary-handoffs"),
        asyncio.create_task(engine.worktrees.run(runtime.sleep), name="apiary-worktrees"),
        asyncio.create_task(
            run_deadlines(engine.rooms.timers, runtime.clock, engine.rooms.fire_due, runtime.sleep),
            name="apiary-rooms",
        ),
        asyncio.create_task(engine.negotiations.run(runtime.sleep), name="apiary-negotiations"),
        asyncio.create_task(
            run_retention(store, runtime.clock, router.settings, engine.events, runtime.sleep),
            name="apiary-retention",
        ),
    ]


async def load_engine(engine: Engine) -> int:
    """Every component's durable state, in dependency order; returns recovered messages."""
    await engine.registry.load()
    await engine.hitl.load()
    await engine.scheduler.load()
    await engine.handoffs.load()
    await engine.worktrees.load()
    await engine.tools.load()
    recovered = await engine.router.recover()
    await engine.workflows.load()  # may submit tasks: after the router's inboxes are back
    await engine.rooms.load()
    # After the router's recovery: resuming may escalate, which delivers notices.
    await engine.negotiations.load()
    return recovered


async def close_engine(engine: Engine) -> None:
    await engine.scheduler.close()
    await engine.worktrees.close()
    await engine.rooms.close()
    await engine.negotiations.close()
    await engine.router.flush_deliveries()  # after the others: they may still hand out
    await engine.events.flush()  # last: every step above may have logged


def _coordinator(config: ServerConfig, store: Store, engine: Engine, grpc: Address) -> Coordinator:
    return Coordinator(
        config, store, engine.events, engine.registry, engine.router, engine.delivery,
        engine.presence, grpc, config.http, hitl=engine.hitl, activity=engine.activity,
        scheduler=engine.scheduler, workflows=engine.workflows, handoffs=engine.handoffs,
        worktrees=engine.worktrees, rooms=engine.rooms, tools=engine.tools,
        negotiations=engine.negotiations,
    )  # fmt: skip


@asynccontextmanager
async def open_coordinator(
    config: ServerConfig,
    clock: Clock | None = None,
    *,
    runtime: Runtime | None = None,
    router_settings: RouterSettings | None = None,
) -> AsyncIterator[Coordinator]:
    """Run a coordinator for the duration of the block; shuts down gracefully on exit."""
    runtime = runtime or Runtime(clock=clock or SystemClock())
    settings = router_settings or config.router
    async with (
        open_store(config.store or None, config.data_dir) as store,
        AsyncExitStack() as optional,
    ):
        engine = build_engine(
            store, settings, runtime, config.hitl, config.scheduler, config.data_dir,
            config.handoff, config.worktrees, config.rooms, config.tools, config.negotiation,
        )  # fmt: skip
        swarm = None
        if config.swarm is not None:
            swarm = await optional.enter_async_context(
                open_swarm_peer(
                    config.swarm,
                    store.swarm,
                    engine.router,
                    clock=runtime.clock,
                    ids=runtime.ids,
                    ssl_context=runtime.swarm_client_tls,
                )
            )
        recovered = await load_engine(engine)
        metrics = Metrics(
            engine.router, engine.activity, engine.scheduler, engine.events,
            store_stats=(lambda: store.stats) if isinstance(store, SqliteStore) else None,
        )  # fmt: skip
        dispatcher = Dispatcher(_handlers(engine, runtime))
        server, health = build_grpc_server(dispatcher, metrics)
        credentials = grpc_credentials(config)
        grpc_port = (
            server.add_insecure_port(str(config.grpc))
            if credentials is None
            else server.add_secure_port(str(config.grpc), credentials)
        )
        if grpc_port == 0:
            raise OSError(f"cannot bind the gRPC port {config.grpc}")
        state = _coordinator(config, store, engine, Address(config.grpc.host, grpc_port))
        state.swarm = swarm
        http_socket = _bind_http(config.http)
        state.http_address = Address(config.http.host, http_socket.getsockname()[1])
        app = build_http_app(
            dispatcher, metrics, lambda: state.ready,
            ConsoleSources(engine.events, engine.workflows),
        )  # fmt: skip
        if swarm is not None:
            add_swarm_routes(app, swarm.node)
        runner = web.AppRunner(app, shutdown_timeout=SHUTDOWN_GRACE_S)
        await runner.setup()
        await web.SockSite(runner, http_socket, ssl_context=http_context(config)).start()
        await server.start()
        await set_serving(health, True)
        tasks = await _background(store, engine, runtime)
        engine.tools.start()
        await engine.events.record(
            "coordinator.started", "coordinator",
            grpc=str(state.grpc_address), http=str(state.http_address), store=store.backend,
            recovered_messages=recovered,
        )  # fmt: skip
        state.ready = True
        try:
            yield state
        finally:
            state.ready = False
            await set_serving(health, False)
            # Tool calls in progress are cancelled and their processes stopped first, so
            # that their streams end with a final frame within the server's grace period.
            await engine.tools.close()
            await server.stop(SHUTDOWN_GRACE_S)
            await runner.cleanup()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await close_engine(engine)
            await engine.events.record("coordinator.stopped", "coordinator")
            await engine.events.flush()
