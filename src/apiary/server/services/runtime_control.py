"""apiary.v1.RuntimeControlService: the runtime control plane's commands over gRPC, a thin
adapter over the one command table (controlplane/commands.py), as POST
/runtime/v1/{command} is over HTTP: each command decided by its rule (RUNTIME_RULES) in the
tenant the call acts in, then run by that tenant's control plane, or by the cluster's
leader's (server/control_plane.py)."""

from __future__ import annotations

import json

from apiary.controlplane.commands import lookup
from apiary.server.auth.guard import AccessGuard
from apiary.server.context import CallContext
from apiary.server.control_plane import ControlPlanes, admit_command, command_params
from apiary.server.dispatch import TenantHandlers
from apiary.server.services.request_checks import DEFAULT_CHECKS, RequestChecks, checked
from apiary.wire import pb

apiary_pb2 = pb.apiary_pb2


@checked
class RuntimeControlHandler:
    def __init__(
        self, controls: ControlPlanes, guard: AccessGuard | None, tenancy: TenantHandlers | None,
        checks: RequestChecks = DEFAULT_CHECKS,
    ) -> None:  # fmt: skip
        self._checks = checks
        self._controls = controls
        self._guard = guard
        self._tenancy = tenancy

    async def call(
        self, req: apiary_pb2.RuntimeCommandRequest, ctx: CallContext
    ) -> apiary_pb2.RuntimeCommandResponse:
        lookup(req.command)
        params = command_params(req.params_json, "params_json")
        tenant = ctx.tenant()
        await admit_command(self._guard, self._tenancy, req.command, ctx, tenant)
        result = await self._controls.run(req.command, params, ctx, tenant)
        return apiary_pb2.RuntimeCommandResponse(result_json=json.dumps(result))
