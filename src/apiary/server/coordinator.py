"""Assembles a coordinator: store, engine, gRPC server and HTTP server, with one lifetime."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web

from apiary.core.clock import Clock
from apiary.engine.eventlog import EventRecorder
from apiary.engine.registry import Registry
from apiary.engine.router import Router
from apiary.server.config import Address, ServerConfig
from apiary.server.dispatch import Dispatcher
from apiary.server.grpc.server import build_grpc_server, set_serving
from apiary.server.http.app import build_http_app
from apiary.server.metrics import Metrics
from apiary.server.services.logging import EventLogHandler, LoggingHandler
from apiary.server.services.registry import RegistryHandler
from apiary.server.services.router import RouterHandler
from apiary.store.open import open_store
from apiary.store.protocols import Store
from apiary.system import SystemClock
from apiary.wire.codec import ProtobufEnvelopeCodec

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
    grpc_address: Address
    http_address: Address
    ready: bool = False


def _handlers(events: EventRecorder, registry: Registry, router: Router) -> dict[str, object]:
    return {
        "sw4rm.registry.RegistryService": RegistryHandler(registry),
        "sw4rm.router.RouterService": RouterHandler(router),
        "sw4rm.logging.LoggingService": LoggingHandler(events),
        "apiary.v1.EventLogService": EventLogHandler(events),
    }


def _bind_http(address: Address) -> socket.socket:
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address.host, address.port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


@asynccontextmanager
async def open_coordinator(
    config: ServerConfig, clock: Clock | None = None
) -> AsyncIterator[Coordinator]:
    """Run a coordinator for the duration of the block; shuts down gracefully on exit."""
    clock = clock or SystemClock()
    async with open_store(config.store or None, config.data_dir) as store:
        events = EventRecorder(store.events, clock)
        registry = Registry(store.agents, events, clock)
        router = Router(store.messages, registry, events, ProtobufEnvelopeCodec(), clock)
        metrics = Metrics()
        dispatcher = Dispatcher(_handlers(events, registry, router))
        server, health = build_grpc_server(dispatcher, metrics)
        grpc_port = server.add_insecure_port(str(config.grpc))
        if grpc_port == 0:
            raise OSError(f"cannot bind the gRPC port {config.grpc}")
        state = Coordinator(
            config, store, events, registry, router,
            Address(config.grpc.host, grpc_port), config.http,
        )  # fmt: skip
        http_socket = _bind_http(config.http)
        state.http_address = Address(config.http.host, http_socket.getsockname()[1])
        runner = web.AppRunner(
            build_http_app(dispatcher, metrics, lambda: state.ready),
            shutdown_timeout=SHUTDOWN_GRACE_S,
        )
        await runner.setup()
        await web.SockSite(runner, http_socket).start()
        await server.start()
        await set_serving(health, True)
        await events.record(
            "coordinator.started", "coordinator",
            grpc=str(state.grpc_address), http=str(state.http_address), store=store.backend,
        )  # fmt: skip
        state.ready = True
        try:
            yield state
        finally:
            state.ready = False
            await set_serving(health, False)
            await server.stop(SHUTDOWN_GRACE_S)
            await runner.cleanup()
            await events.record("coordinator.stopped", "coordinator")


__all__ = ["Coordinator", "open_coordinator"]
