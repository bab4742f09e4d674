"""sw4rm.reasoning.InferenceProxy, also served as ReasoningProxy (INTEROP.md): one handler.

CheckParallelism is answered by the built-in rule-based engine (core/scope_overlap.py),
EvaluateDebate by the negotiation engine's rule-based debate inference (structural agreement of
the two proposals, engine/negotiation/inference.py); Summarize answers UNIMPLEMENTED.
"""

from __future__ import annotations

from apiary.core.json_reader import check_nesting
from apiary.core.scope_overlap import check_parallelism
from apiary.engine.negotiation.inference import RuleDebateInference
from apiary.errors import ValidationError
from apiary.server.context import CallContext
from apiary.server.services.request_checks import DEFAULT_CHECKS, RequestChecks, checked
from apiary.wire import pb

r = pb.reasoning_pb2


@checked
class InferenceHandler:
    def __init__(self, checks: RequestChecks = DEFAULT_CHECKS) -> None:
        self._checks = checks

    async def check_parallelism(
        self, req: r.ParallelismCheckRequest, ctx: CallContext
    ) -> r.ParallelismCheckResponse:
        for field, value in (("scope_a", req.scope_a), ("scope_b", req.scope_b)):
            if not value.strip():
                raise ValidationError.for_field(field, "is required")
            check_nesting(value, field, self._checks.limits.json_depth)
        verdict = check_parallelism(req.scope_a, req.scope_b)
        return r.ParallelismCheckResponse(
            confidence_score=verdict.confidence_score, notes=verdict.notes
        )

    async def evaluate_debate(
        self, req: r.DebateEvaluateRequest, ctx: CallContext
    ) -> r.DebateEvaluateResponse:
        for field, value in (("proposal_a", req.proposal_a), ("proposal_b", req.proposal_b)):
            if not value:
                raise ValidationError.for_field(field, "is required")
        verdict = await RuleDebateInference().evaluate_debate(
            req.negotiation_id, req.proposal_a, req.proposal_b, req.intensity
        )
        return r.DebateEvaluateResponse(
            confidence_score=verdict.confidence_score, notes=verdict.notes
        )
