"""Tenants (RFC 6.5, DESIGN.md section 9): each tenant has an engine and a store of its own.

The default tenant is the coordinator's engine, over the configured store, so that existing
data is the `default` tenant's. Another tenant's engine is opened over a store of its own
(a SQLite file under DATA_DIR/tenants/, a PostgreSQL schema, a memory store: see
store/open.py) when the coordinator starts, for the tenants the configuration or the API
keys name, or at its first call. Nothing is shared between tenants' engines, so a principal
can never address, read, list or infer another tenant's objects: a lookup in another tenant
answers exactly as for an object that does not exist, because in its engine it does not."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

from apiary.core.access.principal import DEFAULT_TENANT, TENANT_KEY, PrincipalKind
from apiary.engine.assembly import (
    Engine,
    Runtime,
    build_engine,
    close_engine,
    load_engine,
    start_engine_tasks,
)
from apiary.engine.cluster.node import EngineReplica
from apiary.engine.eventlog import EventRecorder
from apiary.engine.hitl import HitlSettings
from apiary.errors import NotFoundError, UnavailableError
from apiary.server.auth.keys import KeyRing, credentials_path
from apiary.server.auth.settings import Quota
from apiary.server.cluster import TenantReplicas
from apiary.server.config.server import ServerConfig
from apiary.server.context import CallContext
from apiary.server.quotas import TenantQuota
from apiary.stopping import stop_tasks
from apiary.store.open import open_store, tenant_data_dir
from apiary.store.protocols import Store

log = logging.getLogger("apiary.tenancy")

HandlersOf = Callable[[Engine], Mapping[str, object]]


@dataclass
class TenantEngine:
    tenant: str
    store: Store
    engine: Engine
    handlers: Mapping[str, object]
    quota: TenantQuota
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    replica: EngineReplica | None = None
    """Cluster mode: the tenant's engine's parts of this replica (`server.cluster`)."""


def tenant_engine(
    tenant: str, store: Store, engine: Engine, handlers: Mapping[str, object], quota: Quota
) -> TenantEngine:
    return TenantEngine(tenant, store, engine, handlers, TenantQuota(tenant, quota, engine, store))


def key_ring(config: ServerConfig) -> KeyRing:
    """The API key ring of the configuration ([auth] keys_file, else the data directory's)."""
    auth = config.auth
    return KeyRing(Path(auth.keys_file) if auth.keys_file else credentials_path(config.data_dir))


def hitl_settings(config: ServerConfig) -> HitlSettings:
    """The [hitl] settings of every tenant's engine: operators authenticate otherwise too
    (a HITL component exists) in secure mode or when the key ring holds operator keys."""
    elsewhere = config.auth.secure or any(
        entry.kind is PrincipalKind.OPERATOR for entry in key_ring(config).entries()
    )
    return replace(config.hitl, operators_elsewhere=elsewhere)


def serves_tenants(config: ServerConfig) -> bool:
    """Whether tenants besides the default may be served: with message signing on (RFC 6.2),
    which `apiary serve --secure` turns on with authentication; an embedded coordinator in
    secure mode (tests) may serve them unsigned."""
    return config.router.signing_required or config.auth.secure


class Tenancy:
    """The tenants' engines, for the coordinator's lifetime (`close` ends them)."""

    def __init__(
        self,
        config: ServerConfig,
        runtime: Runtime,
        default: TenantEngine,
        handlers_of: HandlersOf,
        known: Callable[[], set[str]],
        replicate: TenantReplicas | None = None,
    ) -> None:
        self._config = config
        self._replicate = replicate
        """Cluster mode: how a tenant's engine joins this replica (`server.cluster`)."""
        self._runtime = runtime
        self._handlers_of = handlers_of
        self._known = known
        """The tenants a global operator may name: configured, or named by a credential."""
        self._tenants: dict[str, TenantEngine] = {DEFAULT_TENANT: default}
        self._opening: dict[str, asyncio.Task[TenantEngine]] = {}
        self._stack = AsyncExitStack()
        self._closed = False

    def names(self) -> list[str]:
        return sorted(self._tenants)

    async def open(self, ctx: CallContext, tenant: str) -> None:
        """Open the engine of `tenant`, the one `ctx` acts in: its principal's own (its
        credential names it), or one a global operator named, which must be known."""
        if tenant in self._tenants:
            return
        if ctx.principal.tenant != tenant and tenant not in self._known():
            raise NotFoundError(f"no tenant {tenant[:64]!r}", {"field": TENANT_KEY})
        await self.engine(tenant)

    async def route(
        self, ctx: CallContext, method: str, request: object | None
    ) -> Mapping[str, object] | None:
        """The handlers of the tenant `ctx` acts in (None for the default tenant's), once the
        call is within the tenant's quota."""
        tenant = ctx.tenant()
        await self.open(ctx, tenant)
        found = self._tenants[tenant]
        await found.quota.check(method, request)
        return None if tenant == DEFAULT_TENANT else found.handlers

    def opened(self, tenant: str) -> TenantEngine | None:
        """The tenant's engine when it is open (None: not yet, or no such tenant)."""
        return self._tenants.get(tenant)

    async def engine(self, tenant: str) -> TenantEngine:
        """The tenant's engine, opened at its first use."""
        found = self._tenants.get(tenant)
        if found is not None:
            return found
        opening = self._opening.get(tenant)
        if opening is None:
            opening = self._opening[tenant] = asyncio.ensure_future(self._open(tenant))
        try:
            return await asyncio.shield(opening)
        finally:
            if opening.done():
                self._opening.pop(tenant, None)

    def events(self, tenant: str) -> EventRecorder:
        """The event log access decisions of `tenant` are recorded in (the default tenant's
        while the tenant's engine is not open)."""
        found = self._tenants.get(tenant) or self._tenants[DEFAULT_TENANT]
        return found.engine.events

    def public_key(self, tenant: str, agent_id: str) -> bytes:
        found = self._tenants.get(tenant)
        return found.engine.registry.public_key(agent_id) if found is not None else b""

    async def tool_call_owner(self, tenant: str, call_id: str) -> str | None:
        found = self._tenants.get(tenant)
        return found.engine.tools.owner_of(call_id) if found is not None else None

    async def task_owner(self, tenant: str, task_id: str) -> str | None:
        found = self._tenants.get(tenant)
        return await found.engine.scheduler.owner(task_id) if found is not None else None

    async def _open(self, tenant: str) -> TenantEngine:
        config = self._config
        if self._closed:
            raise UnavailableError(
                f"tenant {tenant[:64]!r} cannot be served: the coordinator is stopping",
                {"tenant": tenant[:64], "reason": "stopping"},
            )
        if not serves_tenants(config):
            raise UnavailableError(
                f"tenant {tenant[:64]!r} cannot be served: a coordinator serves tenants besides "
                f"{DEFAULT_TENANT} only in secure mode or with message signing on (RFC 6.2; "
                "`apiary serve --secure` or [router] signing_required = true)",
                {"tenant": tenant[:64], "reason": "tenants_need_signing"},
            )
        data_dir = tenant_data_dir(config.data_dir, tenant)
        store = await self._stack.enter_async_context(
            open_store(config.store or None, config.data_dir, tenant)
        )
        worktrees = config.worktrees
        if worktrees.root is not None:  # (a tenant's worktrees apart, as its other files are)
            worktrees = replace(worktrees, root=tenant_data_dir(worktrees.root, tenant))
        engine = build_engine(
            store, config.router, self._runtime, hitl_settings(config), config.scheduler, data_dir,
            config.handoff, worktrees, config.rooms, config.tools, config.negotiation,
        )  # fmt: skip
        replica = None
        if self._replicate is not None:
            # A replica of the cluster for this tenant too: its messages followed from the
            # store and its deadlines fired by their partitions' owners, its Scheduler and
            # the other leader's components run by the cluster's leader only, never
            # recovered, timed and run on every replica (a split brain).
            replica = await self._stack.enter_async_context(self._replicate(tenant, store, engine))
        clustered = replica is not None
        recovered = await load_engine(engine, recover_messages=not clustered, leader=not clustered)
        opened = tenant_engine(
            tenant, store, engine, self._handlers_of(engine), config.auth.quota(tenant)
        )
        opened.replica = replica
        opened.tasks = start_engine_tasks(
            store, engine, self._runtime, message_deadlines=not clustered, leader=not clustered
        )
        if replica is not None and replica.leader is not None:
            await replica.leader.join()  # (loaded now, if this replica leads)
        if not clustered:  # (in cluster mode the leader starts them with its term)
            engine.tools.start()
        await engine.events.record(
            "tenant.opened", "coordinator", tenant=tenant, store=store.backend,
            recovered_messages=recovered,
        )  # fmt: skip
        self._tenants[tenant] = opened
        log.info("tenant %s opened (%s store)", tenant, store.backend)
        return opened

    async def close(self) -> None:
        """Stop every tenant's engine but the default's (the coordinator stops that one)."""
        self._closed = True
        for name, opened in list(self._tenants.items()):
            if name == DEFAULT_TENANT:
                continue
            await opened.engine.tools.close()
            if opened.replica is not None and opened.replica.leader is not None:
                await opened.replica.leader.leave()
            await stop_tasks(opened.tasks, f"tenant {name}'s tasks")
            await close_engine(opened.engine)
        await self._stack.aclose()
