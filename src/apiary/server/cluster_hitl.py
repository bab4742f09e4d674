"""HITL on a replica of the cluster that does not lead (docs/cluster.md, "The leader"): the
invocations its own components open (a tool call or a worktree binding asking for an
approval) and the decisions they apply are the leader's, forwarded to it as the
HitlOperatorService calls that do the same (`server.cluster_forward`: signed with the
cluster's key; refused `unavailable` only when the cluster has no leader). Opened as the
replica (an application named after it, which `requested_by` does not change), decided as
the operator deciding. A withdrawal (a tool call cancelled while its approval is pending)
is relayed to the leader through the store, which cancels the invocation if it is still
pending (HitlOperatorService has no cancel: a component's withdrawal is no operator's).
The requester here waits for the decision in the store, which the leader writes before it
answers anyone: read again every `WAIT_POLL_S`, so a decision made by any replica, or a
deadline's fallback applied by the next leader, reaches it."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from apiary.core.access.principal import DEFAULT_TENANT, Principal, PrincipalKind
from apiary.core.hitl.vocabulary import HitlState
from apiary.core.records import HitlRecord
from apiary.engine.cluster.leader import Relay
from apiary.engine.hitl import HitlOpening
from apiary.engine.operators import Operator
from apiary.server.cluster_forward import Forwarder
from apiary.server.context import CallContext
from apiary.wire import pb
from apiary.wire.services import SERVICES, RpcMethod

apiary_pb2 = pb.apiary_pb2

WAIT_POLL_S: Final = 0.25
"""How often a requester here reads its invocation again while it is pending."""
_SERVICE: Final = "apiary.v1.HitlOperatorService"


def _method(name: str) -> RpcMethod:
    return next(m for m in SERVICES[_SERVICE] if m.name == name)


class ForwardedHitl:
    """`engine.hitl.HitlLeader` over the forwarder (module docstring)."""

    def __init__(
        self, forwarder: Forwarder, relay: Relay, get: Callable[[str], Awaitable[HitlRecord]],
        tenant: str = DEFAULT_TENANT,
    ) -> None:  # fmt: skip
        self._forwarder = forwarder
        self._relay = relay
        self._get = get
        self._tenant = tenant
        """The tenant whose components open and decide (the call acts in it, forwarded)."""

    async def open(self, opening: HitlOpening) -> str:
        request = apiary_pb2.EscalateRequest(
            reason_type=opening.reason_type, requested_by=opening.requested_by,
            correlation_id=opening.correlation_id, subject_json=_json(opening.subject),
            context_json=_json(opening.context), suggested_action=opening.suggested_action,
            proposed_actions=list(opening.proposed_actions),
            approver_roles=list(opening.approver_roles),
            timeout_s=math.ceil(opening.timeout_s), priority=opening.priority,
        )  # fmt: skip
        me = Principal(PrincipalKind.APPLICATION, self._forwarder.replica_id, self._tenant)
        view = await self._forwarder.unary(_method("Escalate"), request, _as(me))
        return str(view.invocation_id)  # type: ignore[attr-defined]

    async def decide(
        self, invocation_id: str, action: str, operator: Operator, rationale: str,
        patch: Mapping[str, Any] | None,
    ) -> None:  # fmt: skip
        request = apiary_pb2.DecideInvocationRequest(
            invocation_id=invocation_id, action=action, rationale=rationale,
            patch_json=_json(patch) if patch is not None else "",
        )  # fmt: skip
        who = Principal(
            PrincipalKind.OPERATOR, operator.name, self._tenant, frozenset(operator.roles)
        )
        await self._forwarder.unary(_method("Decide"), request, _as(who))

    async def cancel(self, invocation_id: str, by: str, reason: str) -> None:
        await self._relay.hitl_cancel(invocation_id, by, reason)

    async def wait(self, invocation_id: str) -> HitlRecord:
        while True:
            record = await self._get(invocation_id)
            if record.state != HitlState.PENDING.value:
                return record
            await asyncio.sleep(WAIT_POLL_S)


def _as(principal: Principal) -> CallContext:
    """A call of this replica's own, acting as `principal`."""
    return CallContext(transport="grpc", principal=principal)


def _json(document: Mapping[str, Any]) -> str:
    return json.dumps(dict(document), separators=(",", ":")) if document else ""
