"""Message lifecycle through the engine on a fake clock (RFC 11, 11.1, Appendix C)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from apiary.core.envelope import AckStage
from apiary.engine.settings import RouterSettings
from apiary.testing.engine import EngineHarness, open_test_engine


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine() as harness:
        await harness.register("alice")
        await harness.register("bob")
        yield harness


@pytest.mark.conformance("router.lifecycle.sequence", "router.lifecycle.ack-semantics")
async def test_sent_received_read_fulfilled(h: EngineHarness) -> None:
    outcome = await h.send("alice", "bob", {"n": 1})
    assert outcome.accepted and outcome.stored is not None
    message_id = outcome.message_id
    assert (await h.message(message_id)).state == "RECEIVED"
    (handout,) = await h.take("bob")
    assert handout.message.message_id == message_id and handout.attempt == 1
    await h.ack("bob", message_id, AckStage.RECEIVED)
    assert (await h.message(message_id)).state == "RECEIVED"
    await h.ack("bob", message_id, AckStage.READ)
    assert (await h.message(message_id)).state == "READ"
    await h.ack("bob", message_id, AckStage.FULFILLED)
    assert (await h.message(message_id)).state == "FULFILLED"
    forwarded = [p for p in await h.inbox_payloads("alice") if p["type"] == "ACKNOWLEDGEMENT"]
    assert [p["ack_stage"] for p in forwarded] == ["RECEIVED", "READ", "FULFILLED"]


@pytest.mark.conformance(
    "router.ack.timeout-10s", "router.ack.timeout-state", "router.ack.timeout-nack",
    "errors.nack.fields", "errors.terminal.state-and-code",
)  # fmt: skip
async def test_no_ack_within_10s_times_out_and_nacks(h: EngineHarness) -> None:
    outcome = await h.send("alice", "bob", {"n": 1})
    h.clock.advance(30)  # waiting for bob's stream: no ACK is due yet
    await h.fire()
    await h.take("bob")  # handed out: the 10 s start now
    h.clock.advance(9.9)
    await h.fire()
    assert (await h.message(outcome.message_id)).state == "RECEIVED"
    h.clock.advance(0.2)
    await h.fire()
    message = await h.message(outcome.message_id)
    assert (message.state, message.error_code) == ("TIMED_OUT", "ack_timeout")
    (nack,) = [p for p in await h.inbox_payloads("alice") if p.get("error_code") == "ACK_TIMEOUT"]
    assert nack["ack_for_message_id"] == outcome.message_id
    assert nack["ack_stage"] == "TIMED_OUT"
    assert nack["failed_stage"] == "RECEIVED"


async def test_an_ack_before_the_deadline_stops_the_timer(h: EngineHarness) -> None:
    outcome = await h.send("alice", "bob")
    await h.take("bob")
    h.clock.advance(5)
    await h.ack("bob", outcome.message_id, AckStage.RECEIVED)
    h.clock.advance(60)
    await h.fire()
    assert (await h.message(outcome.message_id)).state == "RECEIVED"


@pytest.mark.conformance(
    "router.late-ack.timed-out-recorded", "router.late-ack.timed-out-terminal-unchanged",
    "router.late-ack.timed-out-logged", "errors.late-ack.truthful",
)  # fmt: skip
async def test_late_ack_after_timeout_is_logged_and_keeps_state(h: EngineHarness) -> None:
    outcome = await h.send("alice", "bob")
    await h.take("bob")
    h.clock.advance(10.5)
    await h.fire()
    timed_out_at = (await h.message(outcome.message_id)).updated_at
    h.clock.advance(3)
    await h.ack("bob", outcome.message_id, AckStage.FULFILLED)
    assert (await h.message(outcome.message_id)).state == "TIMED_OUT"
    (late,) = await h.events("message.late_ack")
    assert late.details["message_id"] == outcome.message_id
    assert late.details["decided_at"] == timed_out_at
    assert late.details["ack_at"] == h.clock.now()


@pytest.mark.conformance("router.late-ack.terminal-ignored", "router.late-ack.terminal-logged")
async def test_ack_after_fulfilled_is_ignored_and_logged(h: EngineHarness) -> None:
    outcome = await h.send("alice", "bob")
    await h.ack("bob", outcome.message_id, AckStage.FULFILLED)
    await h.ack("bob", outcome.message_id, AckStage.FAILED, "internal_error")
    message = await h.message(outcome.message_id)
    assert (message.state, message.error_code) == ("FULFILLED", "")
    assert len(await h.events("message.late_ack")) == 1


@pytest.mark.conformance("router.late-ack.retrying-recorded")
async def test_redelivered_message_is_retrying_until_acked(h: EngineHarness) -> None:
    outcome = await h.send("alice", "bob")
    (_first,) = await h.take("bob")
    (again,) = await h.take("bob")  # a new stream: the unacknowledged message comes again
    assert again.attempt == 2
    assert (await h.message(outcome.message_id)).state == "RETRYING"
    await h.ack("bob", outcome.message_id, AckStage.READ)
    assert (await h.message(outcome.message_id)).state == "READ"
    assert await h.take("bob") == []


async def test_only_the_recipient_may_acknowledge(h: EngineHarness) -> None:
    await h.register("mallory")
    outcome = await h.send("alice", "bob")
    with pytest.raises(Exception, match="only its recipient bob") as caught:
        await h.ack("mallory", outcome.message_id, AckStage.FULFILLED)
    assert getattr(caught.value, "code", "") == "permission_denied"
    assert (await h.message(outcome.message_id)).state == "RECEIVED"


@pytest.mark.conformance("dlq.move.policy-violation-ttl")
async def test_ttl_expiry_fails_the_message_into_the_dlq(h: EngineHarness) -> None:
    outcome = await h.send("alice", "bob", {"n": 1}, ttl_ms=3000)
    await h.ack("bob", outcome.message_id, AckStage.RECEIVED)
    h.clock.advance(3.5)
    await h.fire()
    message = await h.message(outcome.message_id)
    assert (message.state, message.error_code) == ("FAILED", "ttl_expired")
    (entry,) = await h.store.dlq.list()
    assert (entry.message_id, entry.error_code) == (outcome.message_id, "ttl_expired")


@pytest.mark.conformance("dlq.move.retry-exhausted")
async def test_retry_budget_exhausted_fails_into_the_dlq() -> None:
    async with open_test_engine(RouterSettings(max_deliveries=2)) as h:
        await h.register("alice")
        await h.register("bob")
        outcome = await h.send("alice", "bob", {"n": 1})
        assert [x.attempt for x in await h.take("bob")] == [1]
        assert [x.attempt for x in await h.take("bob")] == [2]
        assert await h.take("bob") == []  # the third hand-out would exceed the budget
        message = await h.message(outcome.message_id)
        assert (message.state, message.error_code) == ("FAILED", "agent_unavailable")
        (entry,) = await h.store.dlq.list()
        assert entry.message_id == outcome.message_id
        assert "2 deliveries" in entry.reason
        nacks = [
            p for p in await h.inbox_payloads("alice") if p.get("error_code") == "AGENT_UNAVAILABLE"
        ]
        assert [n["ack_for_message_id"] for n in nacks] == [outcome.message_id]


async def test_an_acknowledged_message_is_not_limited_by_the_budget() -> None:
    async with open_test_engine(RouterSettings(max_deliveries=1)) as h:
        await h.register("alice")
        await h.register("bob")
        outcome = await h.send("alice", "bob", {"n": 1})
        await h.take("bob")
        await h.ack("bob", outcome.message_id, AckStage.RECEIVED)
        assert await h.take("bob") == []
        assert (await h.message(outcome.message_id)).state == "RECEIVED"
