"""Delivery over agents' streams (RFC 5.5; DESIGN.md section 5): at-least-once redelivery,
offset and token resumption, bounded batches, one stream per agent, expired positions."""

from __future__ import annotations

import asyncio
import string
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.envelope import AckStage
from apiary.engine.router.delivery import parse_resume_token, resume_token
from apiary.engine.settings import RouterSettings
from apiary.errors import ApiaryError
from apiary.testing.engine import EngineHarness, open_test_engine

URL_SAFE = set(string.ascii_letters + string.digits + "-_")


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine(RouterSettings(buffer_capacity=100)) as harness:
        await harness.register("alice")
        await harness.register("bob")
        yield harness


async def _send(h: EngineHarness, count: int) -> list[str]:
    return [(await h.send("alice", "bob", {"n": n})).message_id for n in range(count)]


@pytest.mark.conformance("transport.resume.durable")
async def test_unacknowledged_messages_are_delivered_again_on_a_new_stream(
    h: EngineHarness,
) -> None:
    sent = await _send(h, 3)
    first = await h.take("bob")
    assert [(x.message.message_id, x.attempt) for x in first] == [(m, 1) for m in sent]
    await h.ack("bob", sent[0], AckStage.READ)
    again = await h.take("bob")  # the stream broke before the other two were acknowledged
    assert [(x.message.message_id, x.attempt) for x in again] == [(m, 2) for m in sent[1:]]
    assert [(await h.message(m)).state for m in sent] == ["READ", "RETRYING", "RETRYING"]
    assert (await h.message(sent[1])).deliveries == 2


@pytest.mark.conformance("transport.resume.durable")
async def test_resuming_after_an_offset_skips_what_the_consumer_holds(h: EngineHarness) -> None:
    sent = await _send(h, 5)
    offsets = [x.message.offset for x in await h.take("bob")]
    resumed = await h.take("bob", resume_after=offsets[2])
    assert [x.message.message_id for x in resumed] == sent[3:]
    assert all(x.message.offset > offsets[2] for x in resumed)
    # The skipped ones are not lost: a stream from the start brings them again.
    everything = await h.take("bob", resume_after=0)
    assert [x.message.message_id for x in everything] == sent


@pytest.mark.conformance("transport.resume.durable")
async def test_a_resume_token_encodes_the_agent_and_position(h: EngineHarness) -> None:
    token = resume_token("bob", 42)
    assert parse_resume_token(token, "bob") == 42
    assert "42" not in token  # opaque to the consumer
    for bad, agent in ((token, "alice"), ("not-a-token", "bob")):
        with pytest.raises(ApiaryError) as caught:
            parse_resume_token(bad, agent)
        assert (caught.value.code, caught.value.details["field"]) == (
            "validation_error",
            "resume_token",
        )


@given(st.text(max_size=40), st.integers(min_value=0, max_value=2**63 - 1))
def test_every_agent_and_offset_make_a_url_safe_token_that_reads_back(
    agent: str, offset: int
) -> None:
    token = resume_token(agent, offset)
    assert set(token) <= URL_SAFE
    assert parse_resume_token(token, agent) == offset


@pytest.mark.conformance("transport.resume.bound-backlog")
async def test_backlog_is_handed_out_in_bounded_batches() -> None:
    async with open_test_engine(RouterSettings(max_batch=4, buffer_capacity=100)) as h:
        await h.register("alice")
        await h.register("bob")
        await _send(h, 10)
        delivery = h.engine.delivery
        session = await delivery.open("bob")
        sizes = []
        while batch := await delivery.poll("bob", session):
            sizes.append(len(batch))
        assert sizes == [4, 4, 2]
        # A consumer may ask for smaller batches, never for larger ones.
        again = await delivery.open("bob")
        assert len(await delivery.poll("bob", again, max_batch=2)) == 2
        assert len(await delivery.poll("bob", again, max_batch=1000)) == 4


async def test_a_new_stream_supersedes_the_old_one(h: EngineHarness) -> None:
    await _send(h, 1)
    delivery = h.engine.delivery
    old = await delivery.open("bob")
    new = await delivery.open("bob")
    with pytest.raises(ApiaryError) as caught:
        await delivery.poll("bob", old)
    assert caught.value.code == "agent_unavailable"
    assert "superseded" in caught.value.message
    assert len(await delivery.poll("bob", new)) == 1


async def test_of_the_streams_waiting_for_a_live_one_to_end_one_opens(h: EngineHarness) -> None:
    """Streams that cannot take over wait for the live stream to end; when it does, the
    first to wake opens and the others are refused, never superseding each other."""
    await _send(h, 1)
    delivery = h.engine.delivery
    live = delivery.stream("bob")
    first = await anext(live)
    assert [h.message.producer_id for h in first].count("alice") == 1
    waiting = [asyncio.ensure_future(delivery.open("bob", take_over=False)) for _ in range(3)]
    await asyncio.sleep(0)  # each is waiting now
    assert not any(task.done() for task in waiting)
    await live.aclose()
    results = await asyncio.gather(*waiting, return_exceptions=True)
    opened = [r for r in results if isinstance(r, int)]
    refused = [r for r in results if isinstance(r, ApiaryError)]
    assert len(opened) == 1 and len(refused) == 2
    assert {r.details["reason"] for r in refused} == {"stream_live"}
    handed = await delivery.poll("bob", opened[0])
    assert [h.message.producer_id for h in handed].count("alice") == 1


@pytest.mark.conformance("transport.resume.expired-clear-error")
async def test_an_expired_position_fails_with_recovery_guidance(h: EngineHarness) -> None:
    sent = await _send(h, 6)
    handed = {x.message.message_id: x.message.offset for x in await h.take("bob")}
    for message_id in sent[:4]:
        await h.ack("bob", message_id, AckStage.FULFILLED)
    h.clock.advance(60)
    # Retention (the store's purge) removes what is finished; those positions are gone.
    assert await h.store.messages.purge_finished(h.clock.now()) >= 4
    expired_at = handed[sent[1]]
    with pytest.raises(ApiaryError) as caught:
        await h.take("bob", resume_after=expired_at)
    error = caught.value
    assert error.code == "resume_expired"
    assert "has expired" in error.message
    assert "Reconnect with resume_after=0" in error.message
    assert error.details["oldest_offset"] == str(handed[sent[4]])
    # The guidance works: from 0, every unacknowledged message comes again.
    assert [x.message.message_id for x in await h.take("bob")] == sent[4:]
    # Right before the oldest retained offset is still a valid position.
    assert [x.message.message_id for x in await h.take("bob", handed[sent[3]])] == sent[4:]


@pytest.mark.conformance("transport.resume.expired-clear-error")
async def test_a_position_in_an_empty_inbox_is_unknown(h: EngineHarness) -> None:
    await h.register("carol")
    await h.take("carol", notices=True)
    for stored in await h.store.messages.inbox("carol"):
        assert stored.state == "FULFILLED"
    h.clock.advance(1)
    await h.store.messages.purge_finished(h.clock.now())
    with pytest.raises(ApiaryError) as caught:
        await h.take("carol", resume_after=1)
    assert caught.value.code == "resume_expired"
    assert "Reconnect with resume_after=0" in caught.value.message
    assert await h.take("carol") == []


async def test_only_registered_agents_have_a_stream(h: EngineHarness) -> None:
    with pytest.raises(ApiaryError) as caught:
        await h.take("ghost")
    assert caught.value.code == "NOT_FOUND"


async def test_hand_out_counts_are_written_with_the_next_state_change(h: EngineHarness) -> None:
    (sent,) = await _send(h, 1)
    assert [x.attempt for x in await h.take("bob")] == [1]
    # Written behind: not a row update of its own per hand-out...
    assert (await h.store.messages.get(sent)).deliveries == 0  # type: ignore[union-attr]
    await h.ack("bob", sent, AckStage.FULFILLED)
    # ...but with the ACK's state change, which leaves nothing to write later.
    stored = await h.store.messages.get(sent)
    assert stored is not None
    assert (stored.state, stored.deliveries, stored.last_delivered_at) == (
        "FULFILLED", 1, h.clock.now(),
    )  # fmt: skip


async def test_hand_out_counts_without_a_state_change_are_written_within_a_second(
    h: EngineHarness,
) -> None:
    sent = await _send(h, 3)
    delivery = h.engine.delivery
    session = await delivery.open("bob")

    async def stored_counts() -> list[int]:
        return [(await h.store.messages.get(m)).deliveries for m in sent]  # type: ignore[union-attr]

    await delivery.poll("bob", session, max_batch=1)
    h.clock.advance(0.5)
    await delivery.poll("bob", session, max_batch=1)
    assert await stored_counts() == [0, 0, 0]
    h.clock.advance(1.0)
    # A later hand-out writes the counts that have waited a second or more.
    await delivery.poll("bob", session, max_batch=1)
    assert await stored_counts() == [1, 1, 0]
    # Closing the engine writes whatever is left (the restart tests in test_recovery.py
    # rely on it: a message handed out before a clean restart comes back as attempt 2).
    again = await delivery.open("bob")
    await delivery.poll("bob", again)
    await h.engine.router.flush_deliveries()
    assert await stored_counts() == [2, 2, 2]


async def test_a_redelivered_message_is_acknowledged_from_retrying(h: EngineHarness) -> None:
    (sent,) = await _send(h, 1)
    await h.take("bob")
    (again,) = await h.take("bob")  # the first stream was lost before any ACK
    assert (again.attempt, again.message.state) == (2, "RETRYING")
    await h.ack("bob", sent, AckStage.FULFILLED)
    moves = [
        (e.details["from"], e.details["to"])
        for e in await h.events("message.state")
        if e.details["message_id"] == sent
    ]
    assert moves == [("RECEIVED", "RETRYING"), ("RETRYING", "FULFILLED")]
