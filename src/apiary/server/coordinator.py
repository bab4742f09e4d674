"""Assembles a coordinator: store, engine, gRPC server and HTTP server, with one lifetime."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from apiary.core.clock import Clock
from apiary.core.ids import IdGenerator
from apiary.engine.activity import Activity
from apiary.engine.deadlines import Sleep, run_deadlines
from apiary.engine.delivery import Delivery
from apiary.engine.eventlog import EventRecorder
from apiary.engine.hitl import Hitl, HitlBroadcast, HitlSettings, build_hitl
from apiary.engine.inference_http import build_inference
from apiary.engine.notices import NoticeFactory
from apiary.engine.presence import Presence, PresenceSettings
from apiary.engine.registry import Registry
from apiary.engine.resources import ResourceTracker
from apiary.engine.retention import run_retention
from apiary.engine.router import Router
from apiary.engine.scheduler import Scheduler
from apiary.engine.settings import RouterSettings, SchedulerSettings
from apiary.server.config import Address, ServerConfig
from apiary.server.dispatch import Dispatcher
from apiary.server.grpc.server import build_grpc_server, set_serving
from apiary.server.http.app import build_http_app
from apiary.server.metrics import Metrics
from apiary.server.services.activity import ActivityBufferHandler, ActivityHandler
from apiary.server.services.discovery import DiscoveryHandler
from apiary.server.services.dlq import DlqHandler
from apiary.server.services.hitl import HitlActionHandler, HitlHandler, HitlOperatorHandler
from apiary.server.services.inference import InferenceHandler
from apiary.server.services.logging import EventLogHandler, LoggingHandler
from apiary.server.services.registry import RegistryHandler
from apiary.server.services.router import RouterHandler, RouterStreamHandler
from apiary.server.services.scheduler import SchedulerHandler
from apiary.store.open import open_store
from apiary.store.protocols import Store
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


def build_engine(
    store: Store,
    settings: RouterSettings,
    runtime: Runtime,
    hitl_settings: HitlSettings | None = None,
    scheduler_settings: SchedulerSettings | None = None,
    data_dir: Path | None = None,
) -> Engine:
    """The engine over `store`, without any transport."""
    clock = runtime.clock
    events = EventRecorder(store.events, clock)
    registry = Registry(store.agents, events, clock)
    notices = NoticeFactory(clock, runtime.ids)
    codec = ProtobufEnvelopeCodec()
    router = Router(store, registry, events, codec, clock, notices, settings)
    delivery = Delivery(router, registry, store.messages, events)
    presence = Presence(registry, router, notices, events, clock, runtime.presence)
    hitl = build_hitl(
        runtime.hitl or hitl_settings or HitlSettings(), store.hitl, events, clock, runtime.ids
    )
    hitl.notify = HitlBroadcast(registry, router, notices)
    activity = Activity(events, clock)
    resources = ResourceTracker(events, data_dir / "agents" if data_dir else None)
    scheduler = Scheduler(
        store.tasks, router, registry, events, clock, runtime.ids, hitl, activity,
        scheduler_settings, resources=resources,
        inference=build_inference((scheduler_settings or SchedulerSettings()).inference),
    )  # fmt: skip
    delivery.opened = scheduler.agent_ready
    return Engine(events, registry, router, delivery, presence, hitl, activity, scheduler)


def _handlers(engine: Engine, runtime: Runtime) -> dict[str, object]:
    return {
        "sw4rm.registry.RegistryService": RegistryHandler(
            engine.registry, engine.presence, engine.scheduler
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
        "sw4rm.reasoning.InferenceProxy": InferenceHandler(),
        "sw4rm.reasoning.ReasoningProxy": InferenceHandler(),
        "sw4rm.hitl.HitlService": HitlHandler(engine.hitl),
        "sw4rm.scheduler.SchedulerPolicyService": HitlActionHandler(engine.hitl),
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
        asyncio.create_task(
            run_retention(store, runtime.clock, router.settings, engine.events, runtime.sleep),
            name="apiary-retention",
        ),
    ]


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
            store, settings, runtime, config.hitl, config.scheduler, config.data_dir
        )
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
        await engine.registry.load()
        await engine.hitl.load()
        await engine.scheduler.load()
        recovered = await engine.router.recover()
        metrics = Metrics(engine.router, engine.activity, engine.scheduler)
        dispatcher = Dispatcher(_handlers(engine, runtime))
        server, health = build_grpc_server(dispatcher, metrics)
        grpc_port = server.add_insecure_port(str(config.grpc))
        if grpc_port == 0:
            raise OSError(f"cannot bind the gRPC port {config.grpc}")
        state = Coordinator(
            config, store, engine.events, engine.registry, engine.router, engine.delivery,
            engine.presence, Address(config.grpc.host, grpc_port), config.http,
        )  # fmt: skip
        state.hitl = engine.hitl
        state.activity = engine.activity
        state.scheduler = engine.scheduler
        state.swarm = swarm
        http_socket = _bind_http(config.http)
        state.http_address = Address(config.http.host, http_socket.getsockname()[1])
        app = build_http_app(dispatcher, metrics, lambda: state.ready)
        if swarm is not None:
            add_swarm_routes(app, swarm.node)
        runner = web.AppRunner(app, shutdown_timeout=SHUTDOWN_GRACE_S)
        await runner.setup()
        await web.SockSite(runner, http_socket).start()
        await server.start()
        await set_serving(health, True)
        tasks = await _background(store, engine, runtime)
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
            await server.stop(SHUTDOWN_GRACE_S)
            await runner.cleanup()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await engine.scheduler.close()
            await engine.events.record("coordinator.stopped", "coordinator")
            await engine.events.flush()
