"""An in-process coordinator on free loopback ports, for tests and embedding."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from apiary.core.clock import Clock
from apiary.core.limits import Limits
from apiary.engine.assembly import Runtime
from apiary.engine.cluster.settings import ClusterSettings
from apiary.engine.settings import RouterSettings, SchedulerSettings
from apiary.engine.worktrees.settings import WorktreeSettings
from apiary.server.auth.settings import AuthSettings
from apiary.server.config.address import Address
from apiary.server.config.server import ServerConfig
from apiary.server.coordinator import Coordinator, open_coordinator
from apiary.server.tracing.server_tracing import ServerTracing


@asynccontextmanager
async def open_test_coordinator(
    data_dir: Path,
    store: str = "memory://",
    clock: Clock | None = None,
    *,
    runtime: Runtime | None = None,
    router_settings: RouterSettings | None = None,
    scheduler_settings: SchedulerSettings | None = None,
    worktrees: WorktreeSettings | None = None,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    tls_client_ca: Path | None = None,
    auth: AuthSettings | None = None,
    limits: Limits | None = None,
    tracing: ServerTracing | None = None,
    cluster: ClusterSettings | None = None,
) -> AsyncIterator[Coordinator]:
    """A real coordinator (real gRPC and HTTP sockets) bound to 127.0.0.1 free ports; with
    `tls_cert` and `tls_key` both ports serve TLS (mTLS with `tls_client_ca`); `auth` sets
    authentication (AuthSettings(secure=True): default deny, every call a principal);
    `limits` the `[limits]` table; `tracing` the coordinator's tracing (docs/tracing.md);
    `cluster` the `[cluster]` table (a replica of a cluster on a PostgreSQL `store`)."""
    config = ServerConfig(
        data_dir=data_dir,
        grpc=Address("127.0.0.1", 0),
        http=Address("127.0.0.1", 0),
        store=store,
        scheduler=scheduler_settings or SchedulerSettings(),
        worktrees=worktrees or WorktreeSettings(),
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_client_ca=tls_client_ca,
        auth=auth or AuthSettings(),
        limits=limits or Limits(),
        cluster=cluster or ClusterSettings(),
    )
    async with open_coordinator(
        config, clock=clock, runtime=runtime, router_settings=router_settings, tracing=tracing
    ) as coordinator:
        yield coordinator


async def register_agent(coordinator: Coordinator, agent_id: str) -> None:
    """Register `agent_id` with a plain descriptor (JSON in, the built-in rules connector),
    without connecting it: tasks for it wait QUEUED until an agent of that id runs."""
    await coordinator.registry.register({
        "agent_id": agent_id, "name": agent_id, "reasoning_connectors": ["builtin://rules"],
        "modalities_supported": ["application/json"],
    })  # fmt: skip
