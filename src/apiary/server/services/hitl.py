"""sw4rm.hitl.HitlService and apiary.v1.HitlOperatorService: thin adapters over
engine/hitl.py (SchedulerPolicyService.HitlAction is in scheduler_policy.py).

Every JSON text an invocation or a decision carries (context, subject, patch, a decision
envelope's payload) is read by `core.json_reader` within the limits, so that what is stored
can be shown again; views render stored JSON with `details_json`, which cannot fail."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from apiary.core.envelope import Envelope, MessageType
from apiary.core.hitl.vocabulary import HitlState
from apiary.core.json_reader import read_json, read_json_object
from apiary.core.limits import DEFAULT_LIMITS, Limits, check_id, check_text
from apiary.core.records import HitlRecord
from apiary.engine.hitl import Hitl
from apiary.errors import ValidationError
from apiary.server.context import CallContext
from apiary.server.services.request_checks import DEFAULT_CHECKS, RequestChecks, checked
from apiary.wire import pb
from apiary.wire.convert import details_json, float_to_timestamp

apiary_pb2 = pb.apiary_pb2


def view(record: HitlRecord) -> apiary_pb2.HitlInvocationView:
    """An invocation as operators see it; only a pending one has a deadline (a decided,
    timed-out or cancelled one waits for nothing)."""
    shown = apiary_pb2.HitlInvocationView(
        invocation_id=record.invocation_id, reason_type=record.reason_type, state=record.state,
        created_at=float_to_timestamp(record.created_at), requested_by=record.requested_by,
        correlation_id=record.correlation_id, subject_json=_shown(record.subject),
        context_json=_shown(record.context),
        suggested_action=record.suggested_action, proposed_actions=list(record.proposed_actions),
        approver_roles=list(record.approver_roles), priority=record.priority,
        extensions=record.extensions,
        decision_json=_shown(record.decision) if record.decision else "",
    )  # fmt: skip
    if record.state == HitlState.PENDING.value:
        shown.deadline.CopyFrom(float_to_timestamp(record.deadline))
    return shown


def _shown(document: Mapping[str, Any]) -> str:
    """A stored JSON object as JSON text, in its own key order (`details_json`)."""
    return details_json(dict(document), sort_keys=False)


def _json_object(text: str | bytes, field: str, limits: Limits) -> dict[str, Any]:
    """The JSON object `text` holds ({} when empty), read within the limits."""
    if not text:
        return {}
    return read_json_object(
        text, field, max_bytes=limits.document_bytes, max_depth=limits.json_depth
    )


@checked
class HitlOperatorHandler:
    def __init__(self, hitl: Hitl, checks: RequestChecks = DEFAULT_CHECKS) -> None:
        self._hitl = hitl
        self._checks = checks

    async def list(
        self, req: apiary_pb2.ListInvocationsRequest, ctx: CallContext
    ) -> apiary_pb2.ListInvocationsResponse:
        operator = ctx.operator()
        self._hitl.operators.seen(operator, self._hitl_now())
        records = await self._hitl.list(include_decided=req.include_decided, limit=req.limit or 100)
        return apiary_pb2.ListInvocationsResponse(invocations=[view(r) for r in records])

    async def get(
        self, req: apiary_pb2.GetInvocationRequest, ctx: CallContext
    ) -> apiary_pb2.HitlInvocationView:
        ctx.operator()
        return view(await self._hitl.get(req.invocation_id))

    async def decide(
        self, req: apiary_pb2.DecideInvocationRequest, ctx: CallContext
    ) -> apiary_pb2.HitlInvocationView:
        operator = ctx.operator()
        limits = self._checks.limits
        patch = _json_object(req.patch_json, "patch_json", limits) if req.patch_json else None
        record = await self._hitl.decide(
            req.invocation_id, req.action, operator, req.rationale, patch
        )
        return view(record)

    async def watch(
        self, req: apiary_pb2.WatchInvocationsRequest, ctx: CallContext
    ) -> AsyncIterator[apiary_pb2.HitlInvocationView]:
        """New invocations (and, with include_pending, the ones already waiting) as they come."""
        operator = ctx.operator()
        sent: set[str] = set()
        if not req.include_pending:
            sent = {r.invocation_id for r in await self._hitl.list()}
        while True:
            self._hitl.operators.seen(operator, self._hitl_now())
            version = self._hitl.version
            for record in await self._hitl.list():
                if record.invocation_id not in sent:
                    sent.add(record.invocation_id)
                    yield view(record)
            async with self._hitl.changed:
                while self._hitl.version == version:
                    await self._hitl.changed.wait()

    async def escalate(
        self, req: apiary_pb2.EscalateRequest, ctx: CallContext
    ) -> apiary_pb2.HitlInvocationView:
        return view(await _escalate(self._hitl, req, ctx, self._checks.limits))

    def _hitl_now(self) -> float:
        return self._hitl.now()


async def _escalate(
    hitl: Hitl, req: apiary_pb2.EscalateRequest, ctx: CallContext, limits: Limits
) -> HitlRecord:
    requested_by = req.requested_by or ctx.agent_id() or ctx.peer
    record = await hitl.open(
        req.reason_type, _json_object(req.context_json, "context_json", limits),
        requested_by=requested_by,
        subject=_json_object(req.subject_json, "subject_json", limits),
        suggested_action=req.suggested_action, proposed_actions=list(req.proposed_actions),
        approver_roles=list(req.approver_roles), timeout_s=float(req.timeout_s),
        correlation_id=req.correlation_id, priority=req.priority,
    )  # fmt: skip
    return await hitl.wait(record.invocation_id) if req.wait else record


@checked
class HitlHandler:
    """sw4rm.hitl.HitlService.Decide: the invocation goes in, the decision comes out (the
    call waits for an operator, the deadline's fallback, or the unavailability policy)."""

    def __init__(self, hitl: Hitl, checks: RequestChecks = DEFAULT_CHECKS) -> None:
        self._hitl = hitl
        self._checks = checks

    async def decide(
        self, req: pb.hitl_pb2.HitlInvocation, ctx: CallContext
    ) -> pb.hitl_pb2.HitlDecision:
        if not req.reason_type:
            raise ValidationError.for_field("reason_type", "is required")
        limits = self._checks.limits
        context = _json_object(bytes(req.context), "context", limits)
        suggested = context.get("suggested_action")
        suggested_action = "" if suggested is None else str(suggested)
        record = await self._hitl.escalate(
            pb.common_pb2.HitlReasonType.Name(req.reason_type), context,
            requested_by=ctx.agent_id() or ctx.peer,
            proposed_actions=list(req.proposed_actions), priority=req.priority,
            suggested_action=check_id(
                suggested_action, "context.suggested_action", limits.name_bytes
            ),
        )  # fmt: skip
        decision = dict(record.decision)
        return pb.hitl_pb2.HitlDecision(
            action=str(decision.get("action", "")),
            decision_payload=_shown(decision).encode(),
            rationale=str(decision.get("rationale", "")),
        )


Decide = Callable[
    [apiary_pb2.DecideInvocationRequest, CallContext], Awaitable[apiary_pb2.HitlInvocationView]
]
"""HitlOperatorService.Decide as the coordinator serves it (forwarded to the cluster's
leader on a replica that does not lead: `server.cluster_forward`)."""


def served_decision(handlers: Mapping[str, object]) -> Decide:
    """HitlOperatorService.Decide as `handlers` serve it at the time of the call (in
    cluster mode the handler is wrapped after `handlers` is built)."""

    def decide(
        req: apiary_pb2.DecideInvocationRequest, ctx: CallContext
    ) -> Awaitable[apiary_pb2.HitlInvocationView]:
        served: Any = handlers["apiary.v1.HitlOperatorService"]
        decided: Awaitable[apiary_pb2.HitlInvocationView] = served.decide(req, ctx)
        return decided

    return decide


class HitlDecisions:
    """RFC 15.2 HITL_DECISION envelopes sent with RouterService.SendMessage: applied as the
    decision of the operator the call authenticates, instead of being routed (the router
    service's interceptor, `server.services.router.Interceptor`), through
    HitlOperatorService.Decide as served here: so in cluster mode a decision sent to any
    replica is the leader's, authorized there as it would be sent to the leader."""

    def __init__(self, decide: Decide, limits: Limits = DEFAULT_LIMITS) -> None:
        self._decide = decide
        self._limits = limits

    def __call__(self, env: Envelope, ctx: CallContext) -> Awaitable[str] | None:
        """None unless `env` is a decision; else its application, to await."""
        doc = decision_in(env, self._limits)
        if doc is None:
            return None
        return apply_decision_envelope(self._decide, doc, ctx, self._limits)


def decision_in(env: Envelope, limits: Limits = DEFAULT_LIMITS) -> dict[str, Any] | None:
    """The RFC 15.2 HITL_DECISION payload an envelope carries, or None.

    The canonical MessageType has no HITL_DECISION value, so a decision travels as a
    HITL_INVOCATION envelope whose JSON payload has `invocation_id` and `decision`. A
    payload that is not JSON within the limits is no decision: the router refuses it as the
    invocation it then is.
    """
    if env.message_type is not MessageType.HITL_INVOCATION:
        return None
    try:
        doc = read_json(
            env.payload, "payload", max_bytes=limits.document_bytes, max_depth=limits.json_depth
        )
    except ValidationError:
        return None
    if isinstance(doc, dict) and "decision" in doc and "invocation_id" in doc:
        return doc
    return None


async def apply_decision_envelope(
    decide: Decide, doc: dict[str, Any], ctx: CallContext, limits: Limits = DEFAULT_LIMITS
) -> str:
    """Apply a HITL_DECISION envelope's decision as the authenticated operator."""
    ctx.operator()
    patch: dict[str, Any] | None = None
    if doc.get("patch_b64"):
        patch = _json_object(_base64(doc["patch_b64"], "patch_b64"), "patch_b64", limits)
    elif isinstance(doc.get("patch"), dict):
        patch = doc["patch"]
    request = apiary_pb2.DecideInvocationRequest(
        invocation_id=_string(doc["invocation_id"], "invocation_id", limits.id_bytes, check_id),
        action=_string(doc["decision"], "decision", limits.name_bytes, check_id),
        rationale=_string(doc.get("rationale", ""), "rationale", limits.text_bytes, check_text),
        patch_json=json.dumps(patch) if patch is not None else "",
    )  # fmt: skip
    record = await decide(request, ctx)
    return f"{record.invocation_id} {record.state}"


def _base64(value: object, field: str) -> bytes:
    """Strict standard base64 (no characters outside the alphabet, correct padding)."""
    if not isinstance(value, str):
        raise ValidationError.for_field(field, "must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (ValueError, binascii.Error):
        raise ValidationError.for_field(field, "is not base64 of a JSON object") from None


def _string(value: object, field: str, limit: int, check: Callable[[str, str, int], str]) -> str:
    """A decision document's string member, within its limit."""
    if not isinstance(value, str):
        raise ValidationError.for_field(field, f"must be a string, got {type(value).__name__}")
    return check(value, field, limit)
