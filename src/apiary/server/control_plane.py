"""Each tenant's runtime control plane (controlplane/runtime.py) over its engine: those of the
tenants open at start-up started with the coordinator (`start`: turns whose tasks were
running are followed again, queued ones start), another tenant's when its first command
arrives; all stopped before the engines close (`close`).

In cluster mode (docs/cluster.md, "The leader") each tenant's control plane is the leader's,
as the tenant's Scheduler is: on a replica that does not lead its commands, from HTTP and
gRPC alike, are decided here (`admit_command`) and then forwarded to the leader as
RuntimeControlService.Call, signed with the cluster's key (`server.cluster_forward`), which
runs them (`run`); its turns and runs are followed, and the queued ones started, by the
leader only (`lead`, once this replica's term begins). The event channels are read here from
the store."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Final

from apiary.controlplane.commands import lookup
from apiary.controlplane.runtime import RuntimeControl
from apiary.controlplane.settings import RuntimeSettings
from apiary.core.access.principal import DEFAULT_TENANT
from apiary.core.access.table import RUNTIME_RULES
from apiary.core.json_reader import JsonError, read_document
from apiary.engine.assembly import Runtime
from apiary.errors import UnavailableError, ValidationError
from apiary.server.auth.guard import AccessGuard
from apiary.server.cluster_forward import Forwarder
from apiary.server.context import CallContext
from apiary.server.dispatch import TenantHandlers
from apiary.server.errormap import clip
from apiary.server.quotas import SUBMIT
from apiary.server.tenancy import Tenancy, TenantEngine
from apiary.stopping import stop_tasks
from apiary.wire import pb
from apiary.wire.services import SERVICES

PREFIX: Final = "/runtime/v1"
SUBMITTING: Final = frozenset(
    {"submit_turn", "create_task", "start_task", "resume_task", "retry_task"}
)
"""Commands that may submit a Scheduler task: the tenant's task quota decides them too."""
MAX_BODY: Final = 2 * 1024 * 1024
"""A command's parameters at most (a turn's input is at most 1 MiB of JSON)."""
MAX_DEPTH: Final = 100
_CALL: Final = next(m for m in SERVICES["apiary.v1.RuntimeControlService"] if m.name == "Call")


def runtime_id(tenant: str) -> str:
    """The `runtimeId` of a tenant's events and snapshots."""
    return f"apiary:{tenant}"


def command_params(raw: bytes | str, field: str) -> object:
    """A command's parameters as a transport carries them: a JSON object (empty: none)."""
    if not raw.strip():
        return None
    try:
        doc = read_document(raw, max_bytes=MAX_BODY, max_depth=MAX_DEPTH, kept=False)
    except JsonError as exc:
        raise ValidationError.for_field(field, clip(str(exc))) from None
    if not isinstance(doc, dict):
        raise ValidationError.for_field(field, "must be a JSON object of the command's parameters")
    return doc


async def admit_command(
    guard: AccessGuard | None, tenancy: TenantHandlers | None, command: str, ctx: CallContext,
    tenant: str,
) -> None:  # fmt: skip
    """Decide the call of `command` by its rule (RUNTIME_RULES), in `tenant`, for the
    authenticated `ctx`; a command that may submit a task is counted by the tenant's quota."""
    if guard is not None:
        await guard.check(f"{PREFIX}/{command}", RUNTIME_RULES[command], None, ctx, tenant)
    if tenancy is not None and command in SUBMITTING:
        await tenancy.route(ctx, SUBMIT, None)  # a turn or run is a task: its quota


class ControlPlanes:
    """The tenants' control planes (module docstring)."""

    def __init__(
        self,
        tenancy: Tenancy,
        runtime: Runtime,
        settings: RuntimeSettings | None = None,
        *,
        secure: bool = False,
        forwarder: Forwarder | None = None,
    ) -> None:
        self._tenancy = tenancy
        self._secure = secure
        """Secure mode: evaluate_permission decides as the access guard does."""
        self._runtime = runtime
        self._settings = settings or RuntimeSettings()
        self._forwarder = forwarder
        """In cluster mode: the tenants' commands go to the leader through it."""
        self._leading = forwarder is None
        """Whether the tenants' control planes run their work here (the replica leads, or is
        no replica)."""
        self._controls: dict[str, RuntimeControl] = {}
        self._loaded: set[str] = set()
        self._opening: dict[str, asyncio.Task[RuntimeControl]] = {}
        self._closed = False

    async def start(self) -> None:
        """The control planes of the tenants open now (the default one, and those the
        configuration names), loaded before the coordinator says it is ready."""
        for tenant in sorted({DEFAULT_TENANT, *self._tenancy.names()}):
            await self.of(tenant)

    async def lead(self) -> None:
        """This replica leads the cluster: the tenants' control planes take up their work
        (as after a restart: the started turns followed, the queued ones started), each once
        its tenant's components lead here."""
        self._leading = True
        for tenant in sorted({DEFAULT_TENANT, *self._controls}):
            if self._closed:  # (the coordinator stops: no work to take up)
                return
            control = await self.of(tenant)
            if self._forwarder is None or await self._forwarder.local(tenant):
                await self._load(tenant, control)

    async def run(self, name: str, params: object, ctx: CallContext, tenant: str) -> dict[str, Any]:
        """The command `name` of the call `ctx` (decided already), run by the control plane
        of `tenant`: the leader's, in cluster mode."""
        command = lookup(name)
        control = await self.of(tenant)
        forwarder = self._forwarder
        if forwarder is not None and not await forwarder.local(tenant):
            request = pb.apiary_pb2.RuntimeCommandRequest(
                command=name, params_json=json.dumps(params or {}).encode()
            )
            answer = await forwarder.unary(_CALL, request, ctx)
            result: dict[str, Any] = json.loads(answer.result_json)  # type: ignore[attr-defined]
            return result
        return await command(control, ctx.principal, params)

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
        if self._closed:
            raise UnavailableError(
                f"tenant {tenant[:64]!r}'s runtime control plane cannot open: the coordinator "
                "is stopping", {"tenant": tenant[:64], "reason": "stopping"},
            )  # fmt: skip
        engine = opened.engine
        control = RuntimeControl(
            opened.store.runtime, engine.scheduler, engine.registry, engine.events,
            self._runtime.clock, self._runtime.ids, runtime_id=runtime_id(tenant),
            settings=self._settings, hitl=engine.hitl, tools=engine.tools,
            acl=engine.router.settings.acl, secure=self._secure, worktrees=engine.worktrees,
        )  # fmt: skip
        try:
            if self._leading and (self._forwarder is None or await self._forwarder.local(tenant)):
                await self._load(tenant, control)
        except BaseException:
            await control.close()  # (what its load started: nobody else will stop it)
            raise
        self._controls[tenant] = control
        return control

    async def _load(self, tenant: str, control: RuntimeControl) -> None:
        if self._closed:  # (what it would start would outlive the stop)
            return
        if tenant not in self._loaded:
            self._loaded.add(tenant)
            await control.load()

    def wakes(self, tenant: str) -> bool:
        """Whether the events of `tenant`'s control plane are committed here, waking its
        channels; else (a replica of a cluster that does not lead) they read the store."""
        return tenant in self._loaded

    def opened(self, tenant: str = DEFAULT_TENANT) -> RuntimeControl | None:
        return self._controls.get(tenant)

    async def close(self) -> None:
        """Stop every control plane's work, before the tenants' engines close; none opens
        after this."""
        self._closed = True
        await stop_tasks(list(self._opening.values()), "runtime control planes opening")
        controls, self._controls = list(self._controls.values()), {}
        for control in controls:
            await control.close()
