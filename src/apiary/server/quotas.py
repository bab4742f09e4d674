"""Per-tenant quotas (RFC 6.5, DESIGN.md section 9): before a call adds an agent, a message
or a task to its tenant, or writes while the tenant's store is over its size, the call is
refused with quota_exceeded naming the limit, what is used and how to get room (`core.quota`).
In cluster mode the `queued_messages` quota is the store's to count, in each admitting
transaction (`Router.hold_queued`), not this replica's memory."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from apiary.core.quota import QUEUED_MESSAGES, quota_exceeded
from apiary.engine.assembly import Engine
from apiary.server.auth.settings import Quota
from apiary.store.protocols import Store
from apiary.store.size import stored_bytes

REGISTER = "/sw4rm.registry.RegistryService/RegisterAgent"
SEND = "/sw4rm.router.RouterService/SendMessage"
SEND_STREAM = "/apiary.v1.RouterStreamService/SendStream"
SUBMIT = "/sw4rm.scheduler.SchedulerService/SubmitTask"
SUBMIT_V1 = "/apiary.v1.TaskQueryService/SubmitTask"
SUBMIT_MANY = "/apiary.v1.TaskQueryService/SubmitTasks"
GATED = frozenset({REGISTER, SEND, SEND_STREAM, SUBMIT, SUBMIT_V1, SUBMIT_MANY})
"""The methods that add to a tenant's agents, messages or tasks."""
SIZE_EVERY_S = 5.0
"""How long a measure of the store's size is reused (measuring PostgreSQL costs a query)."""


@dataclass
class _Measured:
    at: float = float("-inf")
    size: int | None = None


class TenantQuota:
    """One tenant's quota over its engine and store."""

    def __init__(
        self,
        tenant: str,
        quota: Quota,
        engine: Engine,
        store: Store,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tenant = tenant
        self._quota = quota
        self._engine = engine
        self._store = store
        self._monotonic = monotonic
        self._size = _Measured()
        # In cluster mode the router holds each admission to the queued_messages quota in
        # its transaction, over every replica's messages (docs/cluster.md, "Tenants").
        engine.router.hold_queued(tenant, quota.queued_messages)
        self.limited = any(
            v is not None
            for v in (quota.agents, quota.queued_messages, quota.tasks, quota.stored_bytes)
        )

    async def check(self, method: str, request: object) -> None:
        """Refuse `request` to `method` when it would go past a limit."""
        if not self.limited or method not in GATED:
            return
        quota = self._quota
        if method == REGISTER:
            agent_id = getattr(getattr(request, "agent", None), "agent_id", "")
            registry = self._engine.registry
            if registry.known(agent_id) is None:
                self._within("agents", registry.count(), quota.agents)
        elif method in (SEND, SEND_STREAM):
            router = self._engine.router
            if not router.counts_in_store:  # (in cluster mode the admission counts: below)
                self._within(QUEUED_MESSAGES, router.queued(), quota.queued_messages)
        elif method in (SUBMIT, SUBMIT_V1):
            self._within("tasks", self._engine.scheduler.open_tasks(), quota.tasks)
        elif method == SUBMIT_MANY:  # refused whole unless every item fits
            adding = len(getattr(request, "items", ()))
            open_tasks, allowed = self._engine.scheduler.open_tasks(), quota.tasks
            if adding and allowed is not None and open_tasks + adding > allowed:
                raise quota_exceeded(self._tenant, "tasks", open_tasks, allowed, adding=adding)
        if quota.stored_bytes is not None:
            used = await self._stored()
            if used is not None:
                self._within("stored_bytes", used, quota.stored_bytes)

    def _within(self, limit: str, used: int, allowed: int | None) -> None:
        if allowed is not None and used >= allowed:
            raise quota_exceeded(self._tenant, limit, used, allowed)

    async def _stored(self) -> int | None:
        now = self._monotonic()
        if now - self._size.at >= SIZE_EVERY_S:
            self._size = _Measured(now, await stored_bytes(self._store))
        return self._size.size
