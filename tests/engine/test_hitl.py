"""Human in the loop through the engine, on a fake clock (RFC 15, 15.1-15.4)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from apiary.core.hitl.policy import HitlPolicy
from apiary.core.hitl.vocabulary import TimeoutAction, UnavailablePolicy
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import Operator, OperatorEntry, token_digest
from apiary.errors import PermissionDeniedError, UnauthenticatedError, ValidationError
from apiary.testing.engine import EngineHarness, open_test_engine

ALICE = OperatorEntry("alice", token_digest("alice-token"), ("security_admin",))
BOB = OperatorEntry("bob", token_digest("bob-token"), ("developer",))


def _settings(**policy: object) -> HitlSettings:
    return HitlSettings(policy=HitlPolicy(**policy), operators=(ALICE, BOB))  # type: ignore[arg-type]


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine(hitl=_settings()) as harness:
        yield harness


async def _open(h: EngineHarness, **options: object) -> str:
    record = await h.engine.hitl.open(
        "SECURITY_APPROVAL", {"operation": "delete_sensitive_files", "risk_level": "HIGH"},
        requested_by="file-processor", approver_roles=("security_admin",),
        suggested_action="approve", **options,  # type: ignore[arg-type]
    )  # fmt: skip
    return record.invocation_id


@pytest.mark.conformance(
    "hitl.architecture.scheduler-interfaces", "hitl.escalation.supported",
    "hitl.decision.apply-immediately", "hitl.audit.log-all", "hitl.integration.audit-who-when-why",
    "hitl.invocation.context", "concurrency.monitoring.decision-tracking",
)  # fmt: skip
async def test_an_operator_decision_wakes_the_waiting_party(h: EngineHarness) -> None:
    invocation = await _open(h)
    waiter = asyncio.create_task(h.engine.hitl.wait(invocation))
    await asyncio.sleep(0)
    assert not waiter.done()
    operator = h.engine.hitl.operators.authenticate("Bearer alice-token")
    await h.engine.hitl.decide(invocation, "approve", operator, "low risk, reviewed the diff")
    decided = await asyncio.wait_for(waiter, 5)
    assert decided.state == "DECIDED"
    assert decided.decision["action"] == "approve"
    assert decided.decision["decided_by"] == "alice"
    (event,) = await h.events("hitl.decided")
    assert event.actor == "alice" and "reviewed the diff" in str(event.details)
    assert (event.details["from_state"], event.details["to_state"]) == ("PENDING", "DECIDED")
    assert event.details["changes"]["decision"]["to"]["action"] == "approve"
    (opened,) = await h.events("hitl.opened")
    assert opened.details["reason_type"] == "SECURITY_APPROVAL"
    assert decided.context["risk_level"] == "HIGH"
    # The decision and its outcome stay on record (RFC 9.3), not only in the log.
    stored = await h.store.hitl.get(invocation)
    assert stored is not None and stored.decision["decided_by"] == "alice"
    listed = await h.engine.hitl.list(include_decided=True)
    assert [(r.invocation_id, r.state) for r in listed] == [(invocation, "DECIDED")]


@pytest.mark.conformance("hitl.integration.authenticate-authorize")
async def test_decisions_are_authorized_against_approver_roles(h: EngineHarness) -> None:
    invocation = await _open(h)
    bob = h.engine.hitl.operators.authenticate("Bearer bob-token")
    with pytest.raises(PermissionDeniedError, match="security_admin"):
        await h.engine.hitl.decide(invocation, "approve", bob, "looks fine")
    assert (await h.engine.hitl.get(invocation)).state == "PENDING"


@pytest.mark.conformance(
    "hitl.integration.authenticate-authorize", "security.hitl.authenticated-decisions"
)
async def test_operators_must_authenticate(h: EngineHarness) -> None:
    with pytest.raises(UnauthenticatedError):
        h.engine.hitl.operators.authenticate("Bearer wrong")
    with pytest.raises(UnauthenticatedError):
        h.engine.hitl.operators.authenticate("alice-token")


@pytest.mark.conformance("hitl.integration.decision-actions")
async def test_modify_needs_a_patch_and_every_decision_a_rationale(h: EngineHarness) -> None:
    invocation = await _open(h)
    alice = Operator("alice", frozenset({"security_admin"}))
    with pytest.raises(ValidationError, match="rationale"):
        await h.engine.hitl.decide(invocation, "approve", alice, "")
    with pytest.raises(ValidationError, match="patch"):
        await h.engine.hitl.decide(invocation, "modify", alice, "narrower scope")
    record = await h.engine.hitl.decide(
        invocation, "modify", alice, "narrower scope", {"affected_files": ["/data/a.csv"]}
    )
    assert record.decision["patch"] == {"affected_files": ["/data/a.csv"]}


@pytest.mark.conformance("hitl.integration.decision-actions")
async def test_defer_moves_the_deadline_and_keeps_it_pending(h: EngineHarness) -> None:
    invocation = await _open(h)
    before = (await h.engine.hitl.get(invocation)).deadline
    alice = Operator("alice", frozenset({"security_admin"}))
    record = await h.engine.hitl.decide(invocation, "defer", alice, "need the owner's input")
    assert record.state == "PENDING" and record.deadline > before


@pytest.mark.conformance("hitl.integration.deadline", "hitl.integration.deadline-fallback")
@pytest.mark.parametrize(
    ("action", "expected"), [(TimeoutAction.DENY, "deny"), (TimeoutAction.AUTO_RESOLVE, "approve")]
)
async def test_the_deadline_applies_the_configured_fallback(
    action: TimeoutAction, expected: str
) -> None:
    async with open_test_engine(hitl=_settings(default_timeout_s=60.0, timeout_action=action)) as h:
        invocation = await _open(h)
        waiter = asyncio.create_task(h.engine.hitl.wait(invocation))
        h.clock.advance(59)
        await h.engine.hitl.tick()
        assert not waiter.done()
        h.clock.advance(2)
        await h.engine.hitl.tick()
        record = await asyncio.wait_for(waiter, 5)
        assert record.state == "TIMED_OUT"
        assert (record.decision["action"], record.decision["via"]) == (expected, "deadline")


@pytest.mark.conformance(
    "hitl.absent.policy-defined", "hitl.absent.fallback-logged", "hitl.absent.no-indefinite-block"
)
async def test_no_hitl_component_decides_at_once_by_policy() -> None:
    async with open_test_engine(hitl=HitlSettings()) as h:  # no operators configured
        record = await h.engine.hitl.escalate(
            "CONFLICT", {"resource": "db"}, requested_by="scheduler"
        )
        assert record.state == "FALLBACK_APPLIED"
        assert record.decision["action"] == "deny"
        assert record.decision["via"] == "absent"
        (event,) = await h.events("hitl.fallback")
        assert event.details["invocation_id"] == record.invocation_id


@pytest.mark.conformance(
    "hitl.unavailable.detect-bounded", "hitl.unavailable.detect-5s",
    "hitl.unavailable.apply-policy", "hitl.unavailable.auto-decide-threshold",
    "hitl.unavailable.deny-aborts", "hitl.unavailable.log", "hitl.unavailable.audit-fallback",
)  # fmt: skip
@pytest.mark.parametrize(
    ("policy", "score", "state", "action"),
    [
        (UnavailablePolicy.DENY_BY_DEFAULT, None, "FALLBACK_APPLIED", "deny"),
        (UnavailablePolicy.AUTO_DECIDE_THRESHOLD, 0.9, "FALLBACK_APPLIED", "approve"),
        (UnavailablePolicy.AUTO_DECIDE_THRESHOLD, 0.5, "FALLBACK_APPLIED", "deny"),
    ],
)
async def test_unavailable_hitl_is_detected_within_5s_and_the_policy_applied(
    policy: UnavailablePolicy, score: float | None, state: str, action: str
) -> None:
    settings = HitlSettings(
        policy=HitlPolicy(unavailable_policy=policy), operators=(ALICE,), presence_required=True,
        presence_window_s=10.0,
    )  # fmt: skip
    async with open_test_engine(hitl=settings) as h:
        context = {"score": score} if score is not None else {}
        record = await h.engine.hitl.open(
            "DEBATE_DEADLOCK", context, requested_by="negotiation", suggested_action="approve"
        )
        h.clock.advance(4)
        await h.engine.hitl.tick()
        assert (await h.engine.hitl.get(record.invocation_id)).state == "PENDING"
        h.clock.advance(1.5)
        await h.engine.hitl.tick()
        decided = await h.engine.hitl.get(record.invocation_id)
        assert (decided.state, decided.decision["action"]) == (state, action)
        assert decided.decision["via"] == "unavailable"
        assert decided.decision["policy"] == policy.value
        assert decided.decision["decided_at"] == h.clock.now()
        if action == "deny":
            assert decided.decision["error_code"] == "hitl_unavailable"
        assert await h.events("hitl.fallback")


@pytest.mark.conformance(
    "hitl.unavailable.extend-timeout", "hitl.unavailable.extend-1x",
    "hitl.unavailable.extend-max-retries", "hitl.unavailable.extend-max-retries-3",
)  # fmt: skip
async def test_extend_timeout_retries_at_most_three_times() -> None:
    settings = HitlSettings(
        policy=HitlPolicy(unavailable_policy=UnavailablePolicy.EXTEND_TIMEOUT, max_extensions=3),
        operators=(ALICE,), presence_required=True, presence_window_s=1.0,
    )  # fmt: skip
    async with open_test_engine(hitl=settings) as h:
        record = await h.engine.hitl.open(
            "DEBATE_DEADLOCK", {}, requested_by="negotiation", timeout_s=60
        )
        h.clock.advance(6)  # unavailability detected: the first extension
        await h.engine.hitl.tick()
        assert HitlPolicy().max_extensions == 3
        for expected in (1, 2, 3):
            current = await h.engine.hitl.get(record.invocation_id)
            assert (current.state, current.extensions) == ("PENDING", expected)
            assert current.deadline == record.deadline + 60 * expected  # 1x the window
            # Retried at the extended deadline, HITL still unavailable: extend again.
            h.clock.advance(current.deadline - h.clock.now() + 0.5)
            await h.engine.hitl.tick()
        final = await h.engine.hitl.get(record.invocation_id)
        assert final.state == "FALLBACK_APPLIED" and final.decision["action"] == "deny"
        assert final.decision["policy"] == "EXTEND_TIMEOUT"


@pytest.mark.conformance("hitl.unavailable.deny-recommended-secure")
def test_deny_by_default_is_the_default_policy() -> None:
    assert HitlPolicy().unavailable_policy is UnavailablePolicy.DENY_BY_DEFAULT
    assert HitlPolicy().timeout_action is TimeoutAction.DENY


async def test_pending_invocations_survive_a_restart_with_their_deadlines(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    settings = _settings(default_timeout_s=120.0)
    async with open_test_engine(hitl=settings, store_url=url, data_dir=tmp_path) as first:
        invocation = await _open(first)
        deadline = (await first.engine.hitl.get(invocation)).deadline
        clock = first.clock
    async with open_test_engine(
        hitl=settings, store_url=url, data_dir=tmp_path, clock=clock
    ) as again:
        (pending,) = await again.engine.hitl.list()
        assert (pending.invocation_id, pending.deadline) == (invocation, deadline)
        again.clock.advance(121)
        await again.engine.hitl.tick()
        assert (await again.engine.hitl.get(invocation)).state == "TIMED_OUT"


@pytest.mark.conformance("hitl.invocation.reason-types", "hitl.unavailable.alert")
async def test_hitl_components_receive_invocations_and_fallback_alerts() -> None:
    settings = HitlSettings(
        policy=HitlPolicy(), operators=(ALICE,), presence_required=True, presence_window_s=1.0
    )
    async with open_test_engine(hitl=settings) as h:
        await h.register("console", capabilities=["hitl"])
        await h.register("bystander")
        record = await h.engine.hitl.open(
            "TOOL_PRIVILEGE_ESCALATION", {"tool": "shell", "privilege_level": "ELEVATED"},
            requested_by="coder", suggested_action="deny",
        )  # fmt: skip
        h.clock.advance(6)  # nobody present: the unavailability policy denies
        await h.engine.hitl.tick()
        seen = [
            p
            for p in await h.inbox_payloads("console")
            if p["type"] in ("HITL_INVOCATION", "NOTIFICATION")
        ]
        invocation = next(p for p in seen if p["type"] == "HITL_INVOCATION")
        assert invocation["invocation_id"] == record.invocation_id
        assert invocation["reason_type"] == "TOOL_PRIVILEGE_ESCALATION"
        assert invocation["deadline_ts"].endswith("Z")
        alert = next(p for p in seen if p.get("event") == "hitl.fallback")
        assert alert["decision"]["error_code"] == "hitl_unavailable"
        bystander = await h.inbox_payloads("bystander")
        assert not [p for p in bystander if p["type"] == "HITL_INVOCATION"]
