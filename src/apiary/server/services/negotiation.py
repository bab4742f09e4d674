"""sw4rm.negotiation.NegotiationService and apiary.v1.NegotiationOperatorService: thin
adapters over engine/negotiation/negotiations.py (RFC 17).

Who is calling: the `sw4rm-agent-id` call metadata names the agent; a field naming another
agent (from_agent) is refused with permission_denied. An operator authenticates with
`authorization: Bearer <token>` (as for HITL); Decide and Abort are theirs as well as the
opener's.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.duration_pb2 import Duration

from apiary.core.envelope_rules import is_json_type
from apiary.core.ids import IdGenerator
from apiary.core.json_reader import check_nesting, read_json_object
from apiary.core.limits import Limits
from apiary.core.negotiation.vocabulary import NegotiationState
from apiary.engine.hitl import Hitl
from apiary.engine.negotiation.negotiations import Negotiations
from apiary.errors import PermissionDeniedError, ValidationError
from apiary.server.context import CallContext
from apiary.server.services.request_checks import DEFAULT_CHECKS, RequestChecks, checked
from apiary.wire import pb
from apiary.wire.negotiation import check_unit, preferences_from_proto, view

n = pb.negotiation_pb2
a = pb.apiary_pb2
EMPTY = pb.common_pb2.Empty


def speaker(ctx: CallContext, claimed: str, field: str) -> str:
    """The agent a call speaks for: the field, which must match the caller when known."""
    caller = ctx.agent_id()
    if caller and claimed and caller != claimed:
        raise PermissionDeniedError(
            f"{field}: the call comes from {caller}, which may not speak for {claimed}",
            {"field": field},
        )
    if not (claimed or caller):
        raise ValidationError.for_field(field, "is required")
    return claimed or caller


def caller_name(ctx: CallContext) -> tuple[str, bool]:
    """(who calls, whether an authenticated operator)."""
    found = ctx.operator_or_none()
    if found is not None:
        return found.name, True
    return ctx.caller(), False


def _seconds(duration: Duration) -> float:
    return duration.seconds + duration.nanos / 1e9


@checked
class NegotiationHandler:
    """The canonical service: every method answers Empty or raises the protocol error."""

    def __init__(
        self, negotiations: Negotiations, hitl: Hitl, checks: RequestChecks = DEFAULT_CHECKS
    ) -> None:
        self._n = negotiations
        self._hitl = hitl
        self._checks = checks

    async def open(self, req: n.NegotiationOpen, ctx: CallContext) -> pb.common_pb2.Empty:
        if not req.negotiation_id:
            raise ValidationError.for_field("negotiation_id", "is required")
        who, _ = caller_name(ctx)
        await self._n.open(
            negotiation_id=req.negotiation_id, topic=req.topic,
            participants=list(req.participants), intensity=int(req.intensity),
            debate_timeout=_seconds(req.debate_timeout), correlation_id=req.correlation_id,
            opened_by=who,
        )  # fmt: skip
        return EMPTY()

    async def propose(self, req: n.Proposal, ctx: CallContext) -> pb.common_pb2.Empty:
        self._nesting(req.content_type, req.payload, "payload")
        sender = speaker(ctx, req.from_agent, "from_agent")
        await self._n.propose(req.negotiation_id, sender, req.content_type, req.payload)
        return EMPTY()

    async def counter(self, req: n.CounterProposal, ctx: CallContext) -> pb.common_pb2.Empty:
        self._nesting(req.content_type, req.payload, "payload")
        sender = speaker(ctx, req.from_agent, "from_agent")
        await self._n.propose(
            req.negotiation_id, sender, req.content_type, req.payload, counter=True
        )
        return EMPTY()

    async def evaluate(self, req: n.Evaluation, ctx: CallContext) -> pb.common_pb2.Empty:
        sender = speaker(ctx, req.from_agent, "from_agent")
        score = check_unit(req.confidence_score, "confidence_score")
        await self._n.evaluate(req.negotiation_id, sender, score, req.notes)
        return EMPTY()

    async def decide(self, req: n.Decision, ctx: CallContext) -> pb.common_pb2.Empty:
        self._nesting(req.content_type, req.result, "result")
        who, authorized = caller_name(ctx)
        await self._n.decide(
            req.negotiation_id, by=who, decided_by=req.decided_by,
            content_type=req.content_type, result=req.result, authorized=authorized,
        )  # fmt: skip
        return EMPTY()

    async def abort(self, req: n.AbortRequest, ctx: CallContext) -> pb.common_pb2.Empty:
        who, authorized = caller_name(ctx)
        await self._n.abort(req.negotiation_id, by=who, reason=req.reason, authorized=authorized)
        return EMPTY()

    def _nesting(self, content_type: str, data: bytes, field: str) -> None:
        """JSON drafts (the default type) within the depth the engine's readers survive."""
        if data and is_json_type(content_type or "application/json"):
            check_nesting(data, field, self._checks.limits.json_depth)


@checked
class NegotiationOperatorHandler:
    """apiary.v1: Open with a profile, preferences and validation rules; List; Get."""

    def __init__(
        self,
        negotiations: Negotiations,
        hitl: Hitl,
        ids: IdGenerator,
        checks: RequestChecks = DEFAULT_CHECKS,
    ) -> None:
        self._n = negotiations
        self._hitl = hitl
        self._ids = ids
        self._checks = checks

    async def open(self, req: a.OpenNegotiationRequest, ctx: CallContext) -> a.NegotiationView:
        spec = req.open
        prefs = {
            agent: preferences_from_proto(p, f"preferences.{agent}")
            for agent, p in req.preferences.items()
        }
        who, _ = caller_name(ctx)
        record = await self._n.open(
            negotiation_id=spec.negotiation_id or self._ids.new_id(), topic=spec.topic,
            participants=list(spec.participants), intensity=int(spec.intensity),
            debate_timeout=_seconds(spec.debate_timeout), correlation_id=spec.correlation_id,
            opened_by=who, profile=req.profile, preferences=prefs,
            validation=_json_object(req.validation_json, "validation_json", self._checks.limits),
        )  # fmt: skip
        return view(record)

    async def list(
        self, req: a.ListNegotiationsRequest, ctx: CallContext
    ) -> a.ListNegotiationsResponse:
        states = None
        if req.states:
            known = {s.value for s in NegotiationState}
            for state in req.states:
                if state.upper() not in known:
                    raise ValidationError.for_field(
                        "states", f"{state!r} is not one of {', '.join(sorted(known))}"
                    )
            states = frozenset(s.upper() for s in req.states)
        records = await self._n.list(states, limit=req.limit or 100)
        return a.ListNegotiationsResponse(negotiations=[view(r) for r in records])

    async def get(self, req: a.GetNegotiationRequest, ctx: CallContext) -> a.NegotiationView:
        record = await self._n.get(req.negotiation_id)
        return view(record, await self._n.rounds(req.negotiation_id))


def _json_object(text: str, field: str, limits: Limits) -> dict[str, Any] | None:
    if not text:
        return None
    return read_json_object(
        text, field, max_bytes=limits.document_bytes, max_depth=limits.json_depth
    )
