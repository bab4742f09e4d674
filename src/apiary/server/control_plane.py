"""Each tenant's runtime control plane (controlplane/runtime.py) over its engine: those of the
tenants open at start-up started with the coordinator (`start`: turns whose tasks were
running are followed again, queued ones start), another tenant's when its first command
arrives; all stopped before the engines close (`close`)."""

from __future__ import annotations

import asyncio

from apiary.controlplane.runtime import RuntimeControl
from apiary.controlplane.settings import RuntimeSettings
from apiary.core.access.principal import DEFAULT_TENANT
from apiary.engine.assembly import Runtime
from apiary.server.tenancy import Tenancy, TenantEngine


def runtime_id(tenant: str) -> str:
    """The `runtimeId` of a tenant's events and snapshots."""
    return f"apiary:{tenant}"


class ControlPlanes:
    """The tenants' control planes (module docstring)."""

    def __init__(
        self,
        tenancy: Tenancy,
        runtime: Runtime,
        settings: RuntimeSettings | None = None,
        *,
        secure: bool = False,
    ) -> None:
        self._tenancy = tenancy
        self._secure = secure
        """Secure mode: evaluate_permission decides as the access guard does."""
        self._runtime = runtime
        self._settings = settings or RuntimeSettings()
        self._controls: dict[str, RuntimeControl] = {}
        self._opening: dict[str, asyncio.Task[RuntimeControl]] = {}

    async def start(self) -> None:
        """The control planes of the tenants open now (the default one, and those the
        configuration names), loaded before the coordinator says it is ready."""
        for tenant in sorted({DEFAULT_TENANT, *self._tenancy.names()}):
            await self.of(tenant)

    async def of(self, tenant: str) -> RuntimeControl:
        """The control plane of `tenant` (its engine must be open or openable)."""
        found = self._controls.get(tenant)
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

    async def _open(self, tenant: str) -> RuntimeControl:
        opened: TenantEngine = await self._tenancy.engine(tenant)
        engine = opened.engine
        control = RuntimeControl(
            opened.store.runtime, engine.scheduler, engine.registry, engine.events,
            self._runtime.clock, self._runtime.ids, runtime_id=runtime_id(tenant),
            settings=self._settings, hitl=engine.hitl, tools=engine.tools,
            acl=engine.router.settings.acl, secure=self._secure, worktrees=engine.worktrees,
        )  # fmt: skip
        await control.load()
        self._controls[tenant] = control
        return control

    def opened(self, tenant: str = DEFAULT_TENANT) -> RuntimeControl | None:
        return self._controls.get(tenant)

    async def close(self) -> None:
        for opening in self._opening.values():
            opening.cancel()
        controls, self._controls = list(self._controls.values()), {}
        for control in controls:
            await control.close()
