"""sw4rm.scheduler.SchedulerPolicyService (RFC 17.2, Appendix E stubs): the Scheduler's
negotiation policy, profiles, effective policies, evaluation reports and HITL actions.

Refusals of well-formed requests answer ok/accepted = false with the reason (a policy
outside the guardrails, an evaluation the negotiation cannot take now); malformed requests
raise a validation error naming the field. When HITL operators are configured, changing the
policy or the profiles takes an authenticated operator (`authorization: Bearer <token>`).
"""

from __future__ import annotations

from apiary.engine.hitl import Hitl
from apiary.engine.negotiation.negotiations import Negotiations
from apiary.errors import (
    AlreadyCompletedError,
    AlreadyExistsError,
    ApiaryError,
    NotFoundError,
    ValidationError,
)
from apiary.server.context import CallContext
from apiary.server.services.negotiation import speaker
from apiary.server.services.request_checks import DEFAULT_CHECKS, RequestChecks, checked
from apiary.wire import pb
from apiary.wire.negotiation import (
    check_unit,
    effective_to_proto,
    policy_from_proto,
    policy_to_proto,
)

s = pb.scheduler_policy_pb2
_SOFT = frozenset({AlreadyExistsError.code, AlreadyCompletedError.code, ValidationError.code})


@checked
class SchedulerPolicyHandler:
    def __init__(
        self, negotiations: Negotiations, hitl: Hitl, checks: RequestChecks = DEFAULT_CHECKS
    ) -> None:
        self._n = negotiations
        self._hitl = hitl
        self._checks = checks

    def _editor(self, ctx: CallContext) -> str:
        """Who changes the policy (the access guard decided that they may)."""
        found = ctx.operator_or_none()
        return found.name if found is not None else ctx.caller()

    async def set_negotiation_policy(
        self, req: s.SetNegotiationPolicyRequest, ctx: CallContext
    ) -> s.SetNegotiationPolicyResponse:
        if not req.HasField("policy"):
            raise ValidationError.for_field("policy", "is required")
        by = self._editor(ctx)
        why = await self._n.policies.set_base(policy_from_proto(req.policy), by)
        return s.SetNegotiationPolicyResponse(ok=not why, reason=why)

    async def get_negotiation_policy(
        self, req: s.GetNegotiationPolicyRequest, ctx: CallContext
    ) -> s.GetNegotiationPolicyResponse:
        return s.GetNegotiationPolicyResponse(policy=policy_to_proto(self._n.policies.base))

    async def set_policy_profiles(
        self, req: s.SetPolicyProfilesRequest, ctx: CallContext
    ) -> s.SetPolicyProfilesResponse:
        by = self._editor(ctx)
        profiles = [
            (p.name, policy_from_proto(p.policy, f"profiles[{i}].policy"))
            for i, p in enumerate(req.profiles)
        ]
        why = await self._n.policies.set_profiles(profiles, by)
        return s.SetPolicyProfilesResponse(ok=not why, reason=why)

    async def list_policy_profiles(
        self, req: s.ListPolicyProfilesRequest, ctx: CallContext
    ) -> s.ListPolicyProfilesResponse:
        return s.ListPolicyProfilesResponse(
            profiles=[
                pb.policy_pb2.PolicyProfile(name=name, policy=policy_to_proto(policy))
                for name, policy in self._n.policies.profiles()
            ]
        )

    async def get_effective_policy(
        self, req: s.GetEffectivePolicyRequest, ctx: CallContext
    ) -> s.GetEffectivePolicyResponse:
        if not req.negotiation_id:
            raise ValidationError.for_field("negotiation_id", "is required")
        effective = await self._n.effective(req.negotiation_id)
        return s.GetEffectivePolicyResponse(effective=effective_to_proto(effective))

    async def submit_evaluation(
        self, req: s.SubmitEvaluationRequest, ctx: CallContext
    ) -> s.SubmitEvaluationResponse:
        """An EvaluationReport: deterministic_score is the evaluator's score; a non-zero
        llm_confidence is blended per the policy's llm_weight (0 means absent)."""
        if not req.HasField("report"):
            raise ValidationError.for_field("report", "is required")
        report = req.report
        sender = speaker(ctx, report.from_agent, "report.from_agent")
        score = check_unit(report.deterministic_score, "report.deterministic_score")
        llm = check_unit(report.llm_confidence, "report.llm_confidence")
        await self._n.get(req.negotiation_id)  # unknown negotiations raise not found
        try:
            round_ = await self._n.evaluate(
                req.negotiation_id, sender, score, report.notes, llm_confidence=llm or None,
                score_field="report.deterministic_score",
            )  # fmt: skip
        except ApiaryError as exc:
            if exc.code not in _SOFT or ("field" in exc.details and not _state_refusal(exc)):
                raise
            return s.SubmitEvaluationResponse(accepted=False, reason=f"{exc.code}: {exc.message}")
        return s.SubmitEvaluationResponse(accepted=True, reason=f"evaluated v{round_.round}")

    async def hitl_action(self, req: s.HitlActionRequest, ctx: CallContext) -> s.HitlActionResponse:
        """An operator decides the pending HITL invocation of a negotiation, named by its
        negotiation id (or by the invocation id itself). Besides approve, deny and defer,
        "decide=<version or agent>" accepts that draft (Appendix D C.9: decide=B)."""
        who = ctx.operator()
        try:
            invocation_id, action, patch = await self._n.hitl_action(req.negotiation_id, req.action)
        except NotFoundError:
            invocation_id, action, patch = await self._pending(req.negotiation_id), req.action, None
        record = await self._hitl.decide(invocation_id, action, who, req.rationale, patch)
        return s.HitlActionResponse(ok=True, reason=f"{invocation_id} {record.state}")

    async def _pending(self, name: str) -> str:
        """A pending invocation named by id or by its subject's negotiation_id."""
        for record in await self._hitl.list(limit=10_000):
            if name in (record.invocation_id, record.subject.get("negotiation_id")):
                return record.invocation_id
        raise NotFoundError(f"no pending HITL invocation for {name!r}", {"negotiation_id": name})


def _state_refusal(exc: ApiaryError) -> bool:
    """A validation error about the negotiation's state rather than the request's fields."""
    return exc.details.get("field") == "negotiation_id" or "state" in exc.details
