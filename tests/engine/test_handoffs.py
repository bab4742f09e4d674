"""The handoff engine on a fake clock (RFC 17.6): requests checked against the registry,
capability routing, answers, completion and the origin's lost access, expiry, rerouting,
notifications, the event log, and a restart from a SQLite file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from apiary.core.handoff import HandoffState
from apiary.core.handoff_request import HandoffDraft, HandoffPolicy
from apiary.engine.handoffs import Handoffs
from apiary.errors import (
    AlreadyCompletedError,
    AlreadyExistsError,
    ApiaryError,
    DeadlineExceededError,
    NoRouteError,
    NotFoundError,
    PermissionDeniedError,
    UnsupportedMessageTypeError,
    ValidationError,
)
from apiary.testing.clock import FakeClock
from apiary.testing.engine import EngineHarness, open_test_engine
from apiary.testing.ids import SequentialIds

S = HandoffState
REVIEW = ("security-review",)
DRAFT = HandoffDraft(
    request_id="h-1",
    from_agent="alice",
    to_agent="bob",
    reason="needs a security review",
    context_snapshot=b'{"files": ["auth.py"], "done": ["lint"]}',
    snapshot_content_type="application/json",
    capabilities_required=REVIEW,
    timeout_s=30.0,
)


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine() as harness:
        await harness.register("alice")
        await harness.register("bob", capabilities=list(REVIEW))
        await harness.register("carol", capabilities=[*REVIEW, "python"])
        await harness.register("dave", capabilities=["python"])
        yield harness


def handoffs(h: EngineHarness) -> Handoffs:
    return h.engine.handoffs


async def notices(h: EngineHarness, agent: str) -> list[dict[str, Any]]:
    """The handoff NOTIFICATIONs stored for `agent`, oldest first."""
    return [
        p
        for p in await h.inbox_payloads(agent)
        if p["type"] == "NOTIFICATION" and str(p.get("event", "")).startswith("handoff.")
    ]


async def kinds(h: EngineHarness, request_id: str = "h-1") -> list[str]:
    return [
        e.event_type
        for e in await h.events()
        if e.event_type.startswith("handoff.") and e.correlation_id == request_id
    ]


def refused(error: pytest.ExceptionInfo[ApiaryError], kind: type[ApiaryError], field: str) -> None:
    assert type(error.value) is kind, error.value
    assert error.value.details["field"] == field, error.value.details


# --- requests ----------------------------------------------------------------------------------


async def test_a_request_is_offered_to_its_target_and_confirmed_to_the_origin(
    h: EngineHarness,
) -> None:
    record = await handoffs(h).request(DRAFT, caller="alice")
    assert record.state == S.PENDING
    assert (record.to_agent, record.deadline) == ("bob", h.clock.now() + 30)
    assert handoffs(h).timers.armed("h-1") == record.deadline
    assert await h.store.handoffs.get("h-1") == record
    (offer,) = await notices(h, "bob")
    assert offer["event"] == "handoff.requested"
    assert offer["state"] == "PENDING" and offer["from_agent"] == "alice"
    assert offer["snapshot_content_type"] == "application/json"
    assert offer["snapshot_size"] == len(DRAFT.context_snapshot)
    assert "context_snapshot" not in offer
    (confirmed,) = await notices(h, "alice")
    assert (confirmed["event"], confirmed["request_id"]) == ("handoff.requested", "h-1")
    (event,) = await h.events("handoff.requested")
    assert event.correlation_id == "h-1" and event.actor == "alice"
    assert event.details["capabilities_required"] == list(REVIEW)


@pytest.mark.conformance("handoff.capabilities.target-must-possess")
async def test_an_unknown_or_incapable_target_is_refused_naming_the_field(
    h: EngineHarness,
) -> None:
    with pytest.raises(ApiaryError) as caught:
        await handoffs(h).request(replace(DRAFT, to_agent="zoe"))
    refused(caught, NoRouteError, "to_agent")
    with pytest.raises(ApiaryError) as caught:
        await handoffs(h).request(replace(DRAFT, to_agent="dave"))
    refused(caught, ValidationError, "to_agent")
    assert caught.value.details["missing_capabilities"] == "security-review"
    with pytest.raises(ApiaryError) as caught:
        await handoffs(h).request(replace(DRAFT, from_agent="mallory"))
    refused(caught, NotFoundError, "from_agent")
    with pytest.raises(ApiaryError) as caught:
        await handoffs(h).request(DRAFT, caller="bob")
    refused(caught, PermissionDeniedError, "from_agent")
    assert await h.store.handoffs.list() == []
    assert await kinds(h) == []
    assert len(handoffs(h).timers) == 0


@pytest.mark.conformance("handoff.context.content-types")
async def test_the_snapshot_type_must_suit_the_receiving_agent(h: EngineHarness) -> None:
    await h.register("erin", modalities=["text/plain"], capabilities=list(REVIEW))
    with pytest.raises(ApiaryError) as caught:
        await handoffs(h).request(replace(DRAFT, to_agent="erin"))
    refused(caught, UnsupportedMessageTypeError, "snapshot_content_type")
    with pytest.raises(ApiaryError) as caught:
        await handoffs(h).request(replace(DRAFT, context_snapshot=b"{broken"))
    refused(caught, ValidationError, "context_snapshot")
    text = replace(
        DRAFT, to_agent="erin", context_snapshot=b"notes", snapshot_content_type="text/plain"
    )
    assert (await handoffs(h).request(text)).snapshot_content_type == "text/plain"


async def test_without_a_target_the_least_loaded_capable_agent_is_chosen(
    h: EngineHarness,
) -> None:
    first = await handoffs(h).request(replace(DRAFT, to_agent=""))
    assert (first.to_agent, first.requested_to) == ("bob", "")
    second = await handoffs(h).request(replace(DRAFT, request_id="h-2", to_agent=""))
    assert second.to_agent == "carol"  # bob has one open handoff already
    python = replace(DRAFT, request_id="h-3", to_agent="", capabilities_required=("python",))
    assert (await handoffs(h).request(python)).to_agent == "dave"  # carol is busier
    nobody = replace(DRAFT, request_id="h-4", to_agent="", capabilities_required=("rust",))
    with pytest.raises(ApiaryError) as caught:
        await handoffs(h).request(nobody)
    refused(caught, NoRouteError, "capabilities_required")


async def test_a_repeated_request_is_answered_and_a_clashing_one_refused(
    h: EngineHarness,
) -> None:
    first = await handoffs(h).request(DRAFT)
    assert await handoffs(h).request(DRAFT) == first
    assert await kinds(h) == ["handoff.requested"]
    with pytest.raises(ApiaryError) as caught:
        await handoffs(h).request(replace(DRAFT, reason="something else"))
    refused(caught, AlreadyExistsError, "request_id")


async def test_the_coordinator_names_a_request_that_has_no_id(h: EngineHarness) -> None:
    record = await handoffs(h).request(replace(DRAFT, request_id=""))
    assert record.request_id
    (confirmed,) = await notices(h, "alice")
    assert confirmed["request_id"] == record.request_id


# --- answers and completion (Appendix D, C.11) --------------------------------------------------


@pytest.mark.conformance("handoff.context.no-continue-after", "patterns.handoff.no-continue-after")
async def test_accept_then_complete_transfers_the_context_and_bars_the_origin(
    h: EngineHarness,
) -> None:
    await handoffs(h).request(DRAFT, caller="alice")
    accepted = await handoffs(h).accept("h-1", caller="bob")
    assert accepted.state == S.ACCEPTED and accepted.accepting_agent == "bob"
    assert handoffs(h).timers.armed("h-1") is None
    assert [n["event"] for n in await notices(h, "alice")][-1] == "handoff.accepted"
    # Before completion the origin may still read what it handed over.
    assert (await handoffs(h).get("h-1", caller="alice", include_snapshot=True)).context_snapshot
    done = await handoffs(h).complete("h-1", S.COMPLETED, caller="alice")
    assert done.state == S.COMPLETED and done.context_holders == ("bob",)
    with pytest.raises(PermissionDeniedError, match="transferred to bob"):
        await handoffs(h).get("h-1", caller="alice", include_snapshot=True)
    with pytest.raises(PermissionDeniedError):
        await handoffs(h).pending("bob", caller="alice")
    mine = await handoffs(h).get("h-1", caller="bob", include_snapshot=True)
    assert mine.context_snapshot == DRAFT.context_snapshot
    # The receiver hears of the acceptance of nothing it did itself, then of the completion.
    assert [n["event"] for n in await notices(h, "bob")] == [
        "handoff.requested",
        "handoff.completed",
    ]
    assert await kinds(h) == [
        "handoff.requested",
        "handoff.accepted",
        "handoff.completed",
        "handoff.context_revoked",
    ]
    (revoked,) = await h.events("handoff.context_revoked")
    assert revoked.agent_id == "alice" and revoked.details["holders"] == ["bob"]


async def test_the_receiving_agent_may_complete_and_the_origin_is_told(h: EngineHarness) -> None:
    await handoffs(h).request(DRAFT)
    await handoffs(h).accept("h-1", accepting_agent="bob")
    await handoffs(h).complete("h-1", S.COMPLETED, caller="bob")
    assert [n["event"] for n in await notices(h, "alice")][-1] == "handoff.completed"


async def test_answers_out_of_turn_get_specific_refusals(h: EngineHarness) -> None:
    await handoffs(h).request(DRAFT)
    with pytest.raises(ValidationError) as completing:
        await handoffs(h).complete("h-1", S.COMPLETED)
    assert completing.value.details["field"] == "request_id"
    with pytest.raises(ValidationError) as status:
        await handoffs(h).complete("h-1", S.REJECTED)
    assert status.value.details["field"] == "status"
    with pytest.raises(PermissionDeniedError) as impostor:
        await handoffs(h).accept("h-1", caller="carol")
    assert impostor.value.details["field"] == "accepting_agent"
    with pytest.raises(PermissionDeniedError):
        await handoffs(h).accept("h-1", accepting_agent="bob", caller="carol")
    with pytest.raises(NotFoundError) as unknown:
        await handoffs(h).accept("h-9")
    assert unknown.value.details["field"] == "request_id"
    await handoffs(h).accept("h-1")  # an unidentified caller acts for the target
    with pytest.raises(AlreadyCompletedError):
        await handoffs(h).accept("h-1")
    with pytest.raises(AlreadyCompletedError):
        await handoffs(h).reject("h-1", "changed my mind")
    assert (await h.store.handoffs.get("h-1")).state == S.ACCEPTED  # type: ignore[union-attr]


async def test_an_answer_at_the_deadline_is_refused_before_the_timer_runs(
    h: EngineHarness,
) -> None:
    await handoffs(h).request(replace(DRAFT, capabilities_required=()))  # no rerouting
    h.clock.advance(30.0)
    with pytest.raises(DeadlineExceededError):
        await handoffs(h).accept("h-1")
    assert await handoffs(h).pending("bob") == []  # not offered any more, timer or not
    await handoffs(h).fire_due()
    with pytest.raises(DeadlineExceededError, match="expired"):
        await handoffs(h).accept("h-1")


# --- expiry and rerouting ------------------------------------------------------------------------


async def test_an_unanswered_offer_expires_at_its_deadline_in_virtual_time(
    h: EngineHarness,
) -> None:
    draft = replace(DRAFT, capabilities_required=())
    await handoffs(h).request(draft)
    h.clock.advance(29.999)
    assert await handoffs(h).fire_due() == 0
    assert (await h.store.handoffs.get("h-1")).state == S.PENDING  # type: ignore[union-attr]
    h.clock.advance(0.001)
    assert await handoffs(h).fire_due() == 1
    record = await h.store.handoffs.get("h-1")
    assert record is not None and record.state == S.EXPIRED
    assert record.context_holders == ("alice",)
    assert [n["event"] for n in await notices(h, "bob")][-1] == "handoff.expired"
    told = await notices(h, "alice")
    assert [n["event"] for n in told] == [
        "handoff.requested",
        "handoff.expired",
        "handoff.not_rerouted",
    ]
    assert told[-1]["state"] == "EXPIRED" and "no capabilities_required" in told[-1]["why"]
    (final,) = await h.events("handoff.not_rerouted")
    assert "no capabilities_required" in final.details["why"]
    assert await kinds(h) == [
        "handoff.requested",
        "handoff.expired",
        "handoff.context_revoked",
        "handoff.not_rerouted",
    ]


async def test_a_rejected_handoff_is_rerouted_to_an_alternative_capable_agent(
    h: EngineHarness,
) -> None:
    await handoffs(h).request(DRAFT)
    record = await handoffs(h).reject("h-1", "no capacity this week", caller="bob")
    # The caller sees the handoff as it stands after the whole step: offered to carol.
    current = await h.store.handoffs.get("h-1")
    assert current is not None
    assert (current.state, current.to_agent, current.attempt) == (S.PENDING, "carol", 2)
    assert current.tried == ("bob", "carol")
    assert current.context_holders == ("alice", "carol")
    assert record.state == S.REJECTED and record.rejection_reason == "no capacity this week"
    assert handoffs(h).timers.armed("h-1") == current.deadline
    assert [n["event"] for n in await notices(h, "carol")] == ["handoff.rerouted"]
    origin = await notices(h, "alice")
    assert [n["event"] for n in origin] == [
        "handoff.requested",
        "handoff.rejected",
        "handoff.rerouted",
    ]
    assert origin[1]["rejection_reason"] == "no capacity this week"
    with pytest.raises(PermissionDeniedError):
        await handoffs(h).get("h-1", caller="bob", include_snapshot=True)
    await handoffs(h).accept("h-1", caller="carol")
    done = await handoffs(h).complete("h-1", S.COMPLETED, caller="alice")
    assert done.context_holders == ("carol",)
    assert await kinds(h) == [
        "handoff.requested",
        "handoff.rejected",
        "handoff.context_revoked",
        "handoff.rerouted",
        "handoff.accepted",
        "handoff.completed",
        "handoff.context_revoked",
    ]


async def test_timeouts_reroute_until_the_attempts_are_used() -> None:
    async with open_test_engine(handoff=HandoffPolicy(max_attempts=2)) as h:
        await h.register("alice")
        await h.register("bob", capabilities=list(REVIEW))
        await h.register("carol", capabilities=list(REVIEW))
        await handoffs(h).request(DRAFT)
        h.clock.advance(30.0)
        await handoffs(h).fire_due()
        record = await h.store.handoffs.get("h-1")
        assert record is not None
        assert (record.state, record.to_agent, record.attempt) == (S.PENDING, "carol", 2)
        assert record.deadline == h.clock.now() + 30
        h.clock.advance(30.0)
        await handoffs(h).fire_due()
        record = await h.store.handoffs.get("h-1")
        assert record is not None and record.state == S.EXPIRED
        (final,) = await h.events("handoff.not_rerouted")
        assert final.details["why"] == "all 2 attempts used"


async def test_rerouting_can_be_switched_off() -> None:
    async with open_test_engine(handoff=HandoffPolicy(reroute=False)) as h:
        await h.register("alice")
        await h.register("bob", capabilities=list(REVIEW))
        await h.register("carol", capabilities=list(REVIEW))
        await handoffs(h).request(DRAFT)
        await handoffs(h).reject("h-1", "busy")
        assert (await h.store.handoffs.get("h-1")).state == S.REJECTED  # type: ignore[union-attr]
        (final,) = await h.events("handoff.not_rerouted")
        assert final.details["why"] == "rerouting is off"


# --- discovery ------------------------------------------------------------------------------------


async def test_pending_handoffs_are_the_agents_own_most_urgent_first(h: EngineHarness) -> None:
    await handoffs(h).request(replace(DRAFT, request_id="h-late", priority=5))
    h.clock.advance(1)
    await handoffs(h).request(replace(DRAFT, request_id="h-urgent", priority=-10))
    await handoffs(h).request(replace(DRAFT, request_id="h-carol", to_agent="carol"))
    found = await handoffs(h).pending("bob", caller="bob")
    assert [r.request_id for r in found] == ["h-urgent", "h-late"]
    assert all(r.context_snapshot == DRAFT.context_snapshot for r in found)
    assert [r.request_id for r in await handoffs(h).pending("carol")] == ["h-carol"]
    with pytest.raises(PermissionDeniedError) as caught:
        await handoffs(h).pending("bob", caller="alice")
    assert caught.value.details["field"] == "agent_id"
    with pytest.raises(ValidationError):
        await handoffs(h).pending("")


# --- restarts -------------------------------------------------------------------------------------


async def test_a_pending_offer_survives_a_restart_and_still_expires(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'apiary.db'}"
    clock, ids = FakeClock(), SequentialIds()
    async with open_test_engine(store_url=url, data_dir=tmp_path, clock=clock, ids=ids) as h:
        await h.register("alice")
        await h.register("bob", capabilities=list(REVIEW))
        record = await handoffs(h).request(replace(DRAFT, capabilities_required=()))
    clock.advance(10.0)
    async with open_test_engine(store_url=url, data_dir=tmp_path, clock=clock, ids=ids) as h:
        assert handoffs(h).timers.armed("h-1") == record.deadline
        assert [r.request_id for r in await handoffs(h).pending("bob")] == ["h-1"]
        clock.advance(20.0)
        assert await handoffs(h).fire_due() == 1
        expired = await h.store.handoffs.get("h-1")
        assert expired is not None and expired.state == S.EXPIRED
        assert [e.event_type for e in await h.events("handoff.expired")] == ["handoff.expired"]
