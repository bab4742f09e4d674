"""Inbound buffers and back-pressure (RFC 13), credit-based flow control (RFC 13.1) and
communication-class lanes at delivery (RFC 7.3, as the router applies them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from apiary.core.envelope import AckStage, MessageType
from apiary.engine.notices import COORDINATOR
from apiary.engine.settings import RouterSettings
from apiary.errors import ValidationError
from apiary.server.metrics import Metrics
from apiary.testing.engine import EngineHarness, open_test_engine


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine() as harness:
        await harness.register("alice")
        await harness.register("bob")
        yield harness


async def _fill(h: EngineHarness, producer: str, to: str, count: int) -> list[str]:
    ids = []
    for n in range(count):
        outcome = await h.send(producer, to, {"n": n})
        assert outcome.accepted, outcome.reason
        ids.append(outcome.message_id)
    return ids


async def _answers(h: EngineHarness, agent: str, message_id: str) -> list[dict[str, Any]]:
    return [p for p in await h.inbox_payloads(agent) if p.get("ack_for_message_id") == message_id]


# --- buffers (RFC 13) -----------------------------------------------------------------------------


@pytest.mark.conformance(
    "backpressure.buffer.default-10", "backpressure.overflow.reject-buffer-full",
    "backpressure.overflow.nack-sender", "backpressure.no-silent-drop",
)  # fmt: skip
async def test_the_default_buffer_holds_10_and_the_11th_is_refused_with_a_nack(
    h: EngineHarness,
) -> None:
    assert h.engine.router.settings.buffer_capacity == 10
    assert h.engine.router.inbox("bob").capacity == 10
    admitted = await _fill(h, "alice", "bob", 10)
    overflow = await h.send("alice", "bob", {"n": 10}, correlation_id="wf-overflow")
    assert (overflow.accepted, overflow.error_code) == (False, "buffer_full")
    assert "Inbound buffer capacity exceeded for agent=bob" in overflow.reason
    assert await h.store.messages.get(overflow.message_id) is None
    # The sender is told, in its inbox, with the fields of the RFC's example.
    (nack,) = await _answers(h, "alice", overflow.message_id)
    assert nack["ack_stage"] == "REJECTED"
    assert nack["error_code"] == "BUFFER_FULL"
    assert nack["note"].startswith("Inbound buffer capacity exceeded for agent=bob")
    (stored,) = [
        m
        for m in await h.store.messages.inbox("alice", 0, 100)
        if m.message_id == nack["message_id"]
    ]
    env = h.engine.router.codec.decode(stored.envelope)
    assert (env.message_type, env.content_type, env.correlation_id) == (
        MessageType.ACKNOWLEDGEMENT,
        "application/json",
        "wf-overflow",
    )
    # Logged, not dead-lettered (it may well succeed later), and nothing admitted is lost.
    (rejected,) = await h.events("message.rejected")
    assert (rejected.details["message_id"], rejected.details["error_code"]) == (
        overflow.message_id,
        "buffer_full",
    )
    assert await h.store.dlq.list() == []
    assert [x.message.message_id for x in await h.take("bob")] == admitted


async def test_a_read_acknowledgement_frees_a_slot(h: EngineHarness) -> None:
    admitted = await _fill(h, "alice", "bob", 10)
    await h.take("bob")
    await h.ack("bob", admitted[0], AckStage.RECEIVED)
    refused = await h.send("alice", "bob", {"n": 10})
    assert refused.error_code == "buffer_full"  # RECEIVED is still in the buffer
    await h.ack("bob", admitted[0], AckStage.READ)
    assert h.engine.router.inbox("bob").depth == 9
    assert (await h.send("alice", "bob", {"n": 11})).accepted
    await h.ack("bob", admitted[1], AckStage.FULFILLED)
    assert (await h.send("alice", "bob", {"n": 12})).accepted
    assert h.engine.router.inbox("bob").depth == 10


async def test_a_timed_out_message_frees_its_slot(h: EngineHarness) -> None:
    await _fill(h, "alice", "bob", 10)
    await h.take("bob")  # handed out and never acknowledged
    h.clock.advance(10.5)
    await h.fire()
    assert h.engine.router.inbox("bob").depth == 0
    assert (await h.send("alice", "bob")).accepted


@pytest.mark.conformance(
    "backpressure.buffer.configurable-per-agent", "backpressure.buffer.operators-tune"
)
async def test_capacity_is_configurable_per_agent_and_by_default() -> None:
    async with open_test_engine(RouterSettings(buffer_capacity=2)) as h:
        await h.register("alice")
        await h.register("bob")
        await h.register("carol", capacity=4)
        await _fill(h, "alice", "bob", 2)
        assert (await h.send("alice", "bob")).error_code == "buffer_full"
        await _fill(h, "alice", "carol", 4)
        assert (await h.send("alice", "carol")).error_code == "buffer_full"
        # An operator raises bob's capacity at run time.
        assert h.engine.router.set_capacity("bob", 3) == 3
        assert (await h.send("alice", "bob")).accepted
        assert (await h.send("alice", "bob")).error_code == "buffer_full"
        with pytest.raises(ValidationError) as caught:
            h.engine.router.set_capacity("bob", 0)
        assert caught.value.details["field"] == "capacity"


@pytest.mark.conformance("backpressure.no-silent-drop")
async def test_lowering_capacity_keeps_what_is_buffered(h: EngineHarness) -> None:
    admitted = await _fill(h, "alice", "bob", 6)
    h.engine.router.set_capacity("bob", 2)
    assert (await h.send("alice", "bob")).error_code == "buffer_full"
    assert [x.message.message_id for x in await h.take("bob")] == admitted


@pytest.mark.conformance("backpressure.no-silent-drop", "backpressure.overflow.nack-sender")
async def test_notices_reach_an_agent_whose_buffer_is_full(h: EngineHarness) -> None:
    await h.connect("alice")
    await h.register("carol")
    await _fill(h, "carol", "alice", 10)  # alice's own buffer is full
    overflow = await h.send("alice", "bob", {"n": 1})
    assert overflow.accepted  # bob has room
    await _fill(h, "carol", "bob", 9)
    refused = await h.send("alice", "bob", {"n": 2})
    assert refused.error_code == "buffer_full"
    # NACKs, joins and heartbeats take no buffer space: alice still gets them.
    assert len(await _answers(h, "alice", refused.message_id)) == 1
    await h.engine.presence.tick()
    kinds = [x.message.message_type for x in await h.take("alice", notices=True)]
    assert MessageType.HEARTBEAT in kinds and MessageType.ACKNOWLEDGEMENT in kinds
    assert kinds.count(MessageType.DATA) == 10


# --- credits (RFC 13.1) ---------------------------------------------------------------------------


def _credit_settings(window: int, cap: int = 0) -> RouterSettings:
    return RouterSettings(credit_window=window, per_producer_cap=cap, buffer_capacity=100)


@pytest.mark.conformance("backpressure.credit.respect", "backpressure.credit.no-exceed")
async def test_credits_bound_deliveries_in_flight_until_a_terminal_ack() -> None:
    async with open_test_engine(_credit_settings(3)) as h:
        await h.register("alice")
        await h.register("bob")
        first, second, third = await _fill(h, "alice", "bob", 3)
        over = await h.send("alice", "bob", {"n": 3})
        assert (over.accepted, over.error_code) == (False, "buffer_full")
        assert "window_exhausted" in over.reason
        assert len(await _answers(h, "alice", over.message_id)) == 1  # NACKed, not dropped
        await h.ack("bob", first, AckStage.READ)  # not terminal: no credit back
        assert (await h.send("alice", "bob")).error_code == "buffer_full"
        await h.ack("bob", first, AckStage.FULFILLED)
        assert (await h.send("alice", "bob")).accepted
        assert (await h.send("alice", "bob")).error_code == "buffer_full"
        await h.ack("bob", second, AckStage.FAILED, "internal_error")  # terminal error
        assert (await h.send("alice", "bob")).accepted
        await h.take("bob")
        h.clock.advance(10.5)  # third and the two new ones time out: terminal too
        await h.fire()
        assert (await h.message(third)).state == "TIMED_OUT"
        await _fill(h, "alice", "bob", 3)


@pytest.mark.conformance("backpressure.credit.per-producer-caps")
async def test_a_per_producer_cap_leaves_credit_for_others() -> None:
    async with open_test_engine(_credit_settings(4, cap=2)) as h:
        for agent in ("alice", "bob", "carol"):
            await h.register(agent)
        await _fill(h, "alice", "bob", 2)
        capped = await h.send("alice", "bob")
        assert capped.error_code == "buffer_full" and "producer_cap" in capped.reason
        await _fill(h, "carol", "bob", 2)


@pytest.mark.conformance("backpressure.credit.fair-share")
async def test_a_freed_credit_goes_to_the_producer_below_its_fair_share() -> None:
    async with open_test_engine(_credit_settings(4)) as h:
        for agent in ("alice", "bob", "carol"):
            await h.register(agent)
        alices = await _fill(h, "alice", "bob", 4)  # alone, alice may use the whole window
        waiting = await h.send("carol", "bob")
        assert "window_exhausted" in waiting.reason
        await h.ack("bob", alices[0], AckStage.FULFILLED)
        greedy = await h.send("alice", "bob")
        assert greedy.error_code == "buffer_full" and "fair_share" in greedy.reason
        assert (await h.send("carol", "bob")).accepted


@pytest.mark.conformance(
    "backpressure.credit.no-oscillation", "backpressure.credit.preserve-safety"
)
async def test_an_adaptive_window_shrinks_for_a_slow_receiver_and_revokes_nothing() -> None:
    settings = replace(
        _credit_settings(8), credit_adaptive=True, credit_target_latency_s=1.0,
        credit_min_window=2,
    )  # fmt: skip
    async with open_test_engine(settings) as h:
        await h.register("alice")
        await h.register("bob")
        assert h.engine.router.credit_window("bob") is None  # no ledger before any send
        sent = await _fill(h, "alice", "bob", 8)
        assert h.engine.router.credit_window("bob") == 8
        await h.take("bob")
        h.clock.advance(3.0)  # bob takes 3 s per message: three times the target
        for message_id in sent[:4]:
            await h.ack("bob", message_id, AckStage.FULFILLED)
        # Four slow deliveries judged: the window halves once (then settles before judging
        # again); the four credits still in flight stay valid above the new window of 4.
        assert h.engine.router.credit_window("bob") == 4
        over = await h.send("alice", "bob")
        assert over.error_code == "buffer_full" and "window_exhausted" in over.reason
        (changed,) = await h.events("credit.window_changed")
        assert (changed.agent_id, changed.details["before"], changed.details["after"]) == (
            "bob", 8, 4,
        )  # fmt: skip
        assert changed.details["reason"] == "latency_high"
        for message_id in sent[4:]:
            await h.ack("bob", message_id, AckStage.FULFILLED)
        # Still three times too slow: halved again, down to the floor of 2 and no lower.
        assert h.engine.router.credit_window("bob") == 2
        await _fill(h, "alice", "bob", 2)  # the whole new window, no more
        assert (await h.send("alice", "bob")).error_code == "buffer_full"


# --- lanes at delivery (RFC 7.3) ------------------------------------------------------------------


async def _lanes_engine() -> AsyncIterator[EngineHarness]:
    async with open_test_engine() as harness:
        await harness.register("vip", communication_class="PRIVILEGED")
        await harness.register("std", communication_class="STANDARD")
        await harness.register("bulk", communication_class="BULK")
        await harness.register("bob", capacity=200)
        yield harness


@pytest.fixture
async def lanes() -> AsyncIterator[EngineHarness]:
    async for harness in _lanes_engine():
        yield harness


def _producers(batch: list[Any]) -> list[str]:
    return [x.message.producer_id for x in batch]


@pytest.mark.conformance(
    "scheduler.lanes.privileged-urgent-lane", "scheduler.lanes.class-differentiation",
    "scheduler.lanes.separate-lanes", "observability.urgent.flag-dispatches",
)  # fmt: skip
async def test_privileged_messages_are_handed_out_first_and_flagged(
    lanes: EngineHarness,
) -> None:
    h = lanes
    await _fill(h, "std", "bob", 3)
    await _fill(h, "bulk", "bob", 3)
    vip = await _fill(h, "vip", "bob", 3)
    stored = {m.message_id: m.lane for m in await h.store.messages.inbox("bob", 0, 100)}
    assert {stored[i] for i in vip} == {"PRIVILEGED"}
    batch = await h.take("bob")
    assert [x.message.message_id for x in batch[:3]] == vip
    assert [x.urgent for x in batch] == [True] * 3 + [False] * 6
    assert set(_producers(batch[3:])) == {"std", "bulk"}
    flagged = await h.events("message.urgent_dispatch")
    assert [e.details["message_id"] for e in flagged] == vip
    assert {(e.details["lane"], e.agent_id, e.actor) for e in flagged} == {
        ("PRIVILEGED", "bob", COORDINATOR)
    }
    assert h.engine.router.stats.urgent_dispatches["bob"] == 3


@pytest.mark.conformance("scheduler.lanes.no-monopoly", "scheduler.lanes.fair-queuing")
async def test_a_privileged_flood_does_not_starve_standard_or_bulk(lanes: EngineHarness) -> None:
    h = lanes
    await _fill(h, "vip", "bob", 60)
    await _fill(h, "std", "bob", 10)
    await _fill(h, "bulk", "bob", 10)
    order = _producers(await h.take("bob"))
    assert len(order) == 80
    policy = h.engine.router.settings.lanes
    window = policy.cycle + policy.privileged_burst  # the lane scheduler's guarantee
    for start in range(0, 40 - window):
        seen = set(order[start : start + window])
        assert {"std", "bulk"} <= seen, (start, order[start : start + window])
    # Weighted, not strict: PRIVILEGED leads, yet STANDARD outpaces BULK in the shared part.
    head = order[:40]
    assert head.count("vip") > head.count("std") > head.count("bulk") > 0


@pytest.mark.conformance(
    "observability.urgent.burst-usage", "observability.urgent.starvation-warning",
    "security.privileged-lane.rate-limit-monitor",
)  # fmt: skip
async def test_urgent_burst_usage_is_tracked_and_overflow_warns_of_starvation(
    lanes: EngineHarness,
) -> None:
    h = lanes
    await _fill(h, "vip", "bob", 30)  # more than the burst (10) at once: the rest overflows
    await _fill(h, "std", "bob", 5)
    batch = await h.take("bob")
    stats = h.engine.router.stats
    urgent = sum(1 for x in batch if x.urgent)
    overflowed = sum(1 for x in batch if x.overflowed)
    assert urgent == stats.urgent_dispatches["bob"] >= 10
    assert overflowed == stats.urgent_overflows["bob"] > 0
    assert urgent + overflowed == 30
    inbox = h.engine.router.inbox("bob")
    assert inbox.lanes.tokens < 1  # the burst is used up
    (warning,) = await h.events("lane.starvation_risk")  # once, not per message
    assert warning.agent_id == "bob" and warning.details["overflowed"] >= 1
    scrape = Metrics(h.engine.router).render().decode()
    assert f'apiary_router_urgent_dispatches_total{{agent_id="bob"}} {float(urgent)}' in scrape
    assert f'apiary_router_urgent_overflows_total{{agent_id="bob"}} {float(overflowed)}' in scrape
    assert 'apiary_router_urgent_burst_tokens{agent_id="bob"}' in scrape
