"""Outages lose nothing (DESIGN.md section 5): the 10 s ACK deadline runs from a hand-out to
a stream and starts afresh on every redelivery; a message that no stream holds waits for its
recipient, through a recipient's absence or a coordinator's restart, bounded by its TTL and
the maximum age, and then goes to the DLQ saying why, its producer told. All in virtual time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from apiary.core.dedup import iso_utc
from apiary.core.envelope import AckStage
from apiary.engine.deadlines import COMPACT_ABOVE, Deadlines
from apiary.engine.router.admission import is_notice
from apiary.engine.router.inbox import Handout
from apiary.engine.settings import RouterSettings
from apiary.errors import ValidationError
from apiary.server.config.router import router_settings
from apiary.testing.clock import FakeClock
from apiary.testing.engine import EngineHarness, open_test_engine
from apiary.testing.ids import SequentialIds

DAY = 24 * 3600.0


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine(RouterSettings(buffer_capacity=50)) as harness:
        await harness.register("alice")
        await harness.register("bob")
        yield harness


def _messages(batch: list[Handout]) -> list[tuple[str, int]]:
    """(message_id, attempt) of the batch's messages, notices left out."""
    return [(x.message.message_id, x.attempt) for x in batch if not is_notice(x.message)]


Stream = AsyncGenerator[list[Handout], None]


async def _reconnect(h: EngineHarness, agent: str) -> tuple[Stream, list[tuple[str, int]]]:
    """Open `agent`'s stream (closed with the harness) and the messages of its first batch
    (which comes with the directory)."""
    stream = h.engine.delivery.stream(agent)
    h.streams.append(stream)
    return stream, _messages(await anext(stream))


async def _next_messages(stream: Stream) -> list[tuple[str, int]]:
    """The next batch of `stream` that carries messages (skipping notices-only batches);
    bounded, so that a batch that never comes fails the test instead of hanging it."""
    async with asyncio.timeout(10):
        while not (found := _messages(await anext(stream))):
            pass
    return found


async def _send(h: EngineHarness, count: int, **fields: Any) -> list[str]:
    return [(await h.send("alice", "bob", {"n": n}, **fields)).message_id for n in range(count)]


async def _states(h: EngineHarness, ids: list[str]) -> list[str]:
    return [(await h.message(m)).state.value for m in ids]


async def _answers(h: EngineHarness, code: str) -> dict[str, dict[str, Any]]:
    """The ACKs alice was sent with `code`, by the message they answer."""
    payloads = await h.inbox_payloads("alice")
    return {p["ack_for_message_id"]: p for p in payloads if p.get("error_code") == code}


async def _fulfil(h: EngineHarness, ids: list[str]) -> None:
    for message_id in ids:
        await h.ack("bob", message_id, AckStage.FULFILLED)


@pytest.mark.conformance("backpressure.no-silent-drop")
async def test_a_restart_after_a_12_s_outage_delivers_everything_pending(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'apiary.db'}"
    clock, ids = FakeClock(), SequentialIds()
    async with open_test_engine(store_url=url, clock=clock, ids=ids) as h:
        await h.register("alice")
        await h.register("bob")
        stream = await h.connect("bob")
        held = await _send(h, 3)
        assert [m for m, _ in await _next_messages(stream)] == held  # bob holds them, no ACK
        queued = await _send(h, 2)  # admitted; the coordinator stops before they are handed out
    clock.advance(12)  # the coordinator is down for 12 s
    async with open_test_engine(store_url=url, clock=clock, ids=ids) as h:
        await h.fire()
        assert await _states(h, held + queued) == ["RECEIVED"] * 5
        clock.advance(30)  # bob takes his time to come back: nothing is due meanwhile
        await h.fire()
        assert await _states(h, held + queued) == ["RECEIVED"] * 5
        _, handed = await _reconnect(h, "bob")
        assert handed == [(m, 2) for m in held] + [(m, 1) for m in queued]
        clock.advance(9.5)  # a whole ACK deadline from the hand-out after the restart
        await h.fire()
        await _fulfil(h, held + queued)
        assert await _states(h, held + queued) == ["FULFILLED"] * 5
        assert await _answers(h, "ACK_TIMEOUT") == {}
        assert await h.store.dlq.list() == []


@pytest.mark.conformance("backpressure.no-silent-drop", "transport.resume.durable")
async def test_a_recipient_back_after_30_s_gets_everything(h: EngineHarness) -> None:
    stream = await h.connect("bob")
    held = await _send(h, 2)
    assert [m for m, _ in await _next_messages(stream)] == held
    h.clock.advance(1)
    await stream.aclose()  # bob's connection drops with both unacknowledged
    h.clock.advance(1)
    queued = await _send(h, 2)  # sent while bob is away
    for _ in range(3):
        h.clock.advance(10)
        await h.fire()
    assert await _states(h, held + queued) == ["RECEIVED"] * 4
    _, handed = await _reconnect(h, "bob")
    assert handed == [(m, 2) for m in held] + [(m, 1) for m in queued]
    await _fulfil(h, held + queued)
    assert await _states(h, held + queued) == ["FULFILLED"] * 4
    assert await _answers(h, "ACK_TIMEOUT") == {}


async def test_a_stream_that_ends_before_taking_a_message_leaves_it_waiting() -> None:
    async with open_test_engine(RouterSettings(max_age_s=60)) as h:
        await h.register("alice")
        await h.register("bob")
        stream = await h.connect("bob")
        (queued,) = await _send(h, 1)  # admitted while bob's stream is open, not taken yet
        await stream.aclose()
        h.clock.advance(59)
        await h.fire()
        assert await _states(h, [queued]) == ["RECEIVED"]
        h.clock.advance(2)
        await h.fire()  # bob has been away for its whole maximum age
        message = await h.message(queued)
        assert (message.state, message.error_code) == ("FAILED", "agent_unavailable")
        (entry,) = await h.store.dlq.list()
        assert entry.message_id == queued and "never handed out" in entry.reason


@pytest.mark.conformance("router.ack.timeout-10s", "router.ack.timeout-state")
async def test_a_redelivered_message_gets_a_fresh_10_s(h: EngineHarness) -> None:
    (message_id,) = await _send(h, 1)
    assert _messages(await h.take("bob")) == [(message_id, 1)]
    h.clock.advance(8)
    assert _messages(await h.take("bob")) == [(message_id, 2)]  # a new stream: redelivered
    h.clock.advance(9.5)  # 17.5 s after the first hand-out, 9.5 s after the second
    await h.fire()
    assert await _states(h, [message_id]) == ["RETRYING"]
    h.clock.advance(1)
    await h.fire()
    message = await h.message(message_id)
    assert (message.state, message.error_code) == ("TIMED_OUT", "ack_timeout")
    assert list(await _answers(h, "ACK_TIMEOUT")) == [message_id]


@pytest.mark.conformance("router.ack.timeout-10s", "router.ack.timeout-nack")
async def test_a_connected_recipient_that_does_not_acknowledge_times_out_after_10_s(
    h: EngineHarness,
) -> None:
    h.clock.advance(100)  # bob is away at first: the wait before the hand-out does not count
    stream = await h.connect("bob")
    (message_id,) = await _send(h, 1)
    assert await _next_messages(stream) == [(message_id, 1)]
    h.clock.advance(9.9)
    await h.fire()
    assert await _states(h, [message_id]) == ["RECEIVED"]
    h.clock.advance(0.2)
    await h.fire()
    assert await _states(h, [message_id]) == ["TIMED_OUT"]
    nack = (await _answers(h, "ACK_TIMEOUT"))[message_id]
    assert (nack["ack_stage"], nack["failed_stage"]) == ("TIMED_OUT", "RECEIVED")


async def test_a_lost_stream_stops_the_deadline_and_the_next_one_starts_it_again(
    h: EngineHarness,
) -> None:
    stream = await h.connect("bob")
    (message_id,) = await _send(h, 1)
    await _next_messages(stream)
    h.clock.advance(8)
    await stream.aclose()  # 2 s of the deadline were left: they are not kept
    h.clock.advance(5)
    await h.fire()
    _, handed = await _reconnect(h, "bob")
    assert handed == [(message_id, 2)]
    h.clock.advance(9.5)
    await h.fire()
    assert await _states(h, [message_id]) == ["RETRYING"]
    h.clock.advance(1)
    await h.fire()
    assert await _states(h, [message_id]) == ["TIMED_OUT"]


@pytest.mark.conformance("backpressure.no-silent-drop", "dlq.move.policy-violation-ttl")
async def test_a_recipient_gone_for_good_ends_in_the_dlq_with_why_and_the_producer_is_told(
    h: EngineHarness,
) -> None:
    assert h.engine.router.settings.max_age_s == DAY  # the default maximum age: a day
    start = h.clock.now()
    stream = await h.connect("bob")
    (held,) = await _send(h, 1)
    await _next_messages(stream)
    h.clock.advance(1)
    await stream.aclose()  # bob is gone, for good
    (never,) = await _send(h, 1)
    (short,) = await _send(h, 1, ttl_ms=120_000)
    h.clock.advance(119)
    await h.fire()
    assert await _states(h, [held, never, short]) == ["RECEIVED"] * 3
    h.clock.advance(2)
    await h.fire()  # the TTL, shorter than the maximum age, ends that one first
    expired = await h.message(short)
    assert (expired.state, expired.error_code) == ("FAILED", "ttl_expired")
    h.clock.advance(start + DAY - 1 - h.clock.now())
    await h.fire()
    assert await _states(h, [held, never]) == ["RECEIVED"] * 2
    h.clock.advance(2)  # a day after each was admitted
    await h.fire()
    for message_id in (held, never):
        message = await h.message(message_id)
        assert (message.state, message.error_code) == ("FAILED", "agent_unavailable")
    entries = {e.message_id: e for e in await h.store.dlq.list()}
    assert set(entries) == {held, never, short}
    away = f"bob has had no live stream since {iso_utc(start + 1)}"
    assert "handed out 1 time, last at " + iso_utc(start) in entries[held].reason
    assert away in entries[held].reason and "max_age_s (86400 s)" in entries[held].reason
    assert "never handed out" in entries[never].reason and away in entries[never].reason
    nacks = await _answers(h, "AGENT_UNAVAILABLE")
    assert set(nacks) == {held, never}
    assert nacks[never]["ack_stage"] == "FAILED"
    assert "never handed out" in nacks[never]["note"]
    assert list(await _answers(h, "TTL_EXPIRED")) == [short]
    assert await _answers(h, "ACK_TIMEOUT") == {}


async def test_after_a_restart_an_absent_recipient_waits_from_the_coordinators_start(
    tmp_path: Path,
) -> None:
    url = f"sqlite://{tmp_path / 'apiary.db'}"
    clock, ids, settings = FakeClock(), SequentialIds(), RouterSettings(max_age_s=600)
    async with open_test_engine(settings, store_url=url, clock=clock, ids=ids) as h:
        await h.register("alice")
        await h.register("bob")
        (message_id,) = await _send(h, 1)
    clock.advance(300)
    async with open_test_engine(settings, store_url=url, clock=clock, ids=ids) as h:
        restarted = clock.now()
        clock.advance(299)
        await h.fire()
        assert await _states(h, [message_id]) == ["RECEIVED"]
        clock.advance(2)  # 600 s after admission, the restart's 300 s included
        await h.fire()
        (entry,) = await h.store.dlq.list()
        assert f"no live stream since {iso_utc(restarted)}" in entry.reason


async def test_notices_are_not_dead_lettered_for_their_age() -> None:
    async with open_test_engine(RouterSettings(max_age_s=60)) as h:
        await h.register("alice")
        await h.register("bob")
        (message_id,) = await _send(h, 1)
        await h.take("bob")
        await h.ack("bob", message_id, AckStage.FULFILLED)  # alice, away, is sent the ACK
        h.clock.advance(61)
        await h.fire()
        assert await h.store.dlq.list() == []
        assert [p["ack_stage"] for p in await h.inbox_payloads("alice")] == ["FULFILLED"]


async def test_an_acknowledged_message_has_no_maximum_age() -> None:
    async with open_test_engine(RouterSettings(max_age_s=60)) as h:
        await h.register("alice")
        await h.register("bob")
        (message_id,) = await _send(h, 1)
        await h.take("bob")
        await h.ack("bob", message_id, AckStage.READ)  # bob works on it, for long
        h.clock.advance(3600)
        await h.fire()
        assert await _states(h, [message_id]) == ["READ"]


async def test_without_a_maximum_age_only_the_ttl_bounds_the_wait() -> None:
    async with open_test_engine(RouterSettings(max_age_s=0)) as h:
        await h.register("alice")
        await h.register("bob")
        (message_id,) = await _send(h, 1)
        h.clock.advance(30 * DAY)
        await h.fire()
        assert await _states(h, [message_id]) == ["RECEIVED"]
        assert [x.attempt for x in await h.take("bob")] == [1]


def test_the_maximum_age_is_configured_in_the_router_table() -> None:
    assert RouterSettings().max_age_s == DAY
    assert router_settings({"max_age_s": 7200}, "apiary.toml").max_age_s == 7200.0
    with pytest.raises(ValidationError, match="max_age_s must not be below its minimum"):
        router_settings({"max_age_s": -1}, "apiary.toml")
    with pytest.raises(ValidationError, match="max_age_s must be float"):
        router_settings({"max_age_s": "a day"}, "apiary.toml")


def test_timers_re_armed_a_day_ahead_leave_a_bounded_heap() -> None:
    deadlines = Deadlines(ack_timeout_s=10, max_age_s=DAY)
    for n in range(5 * COMPACT_ABOVE):
        key = f"m-{n}"
        deadlines.arm(key, n + DAY)  # admitted while its recipient is away
        deadlines.arm(key, n + 10.0)  # handed out
        deadlines.cancel(key)  # acknowledged
    deadlines.arm("last", 7.0)
    assert deadlines.held <= COMPACT_ABOVE + 2
    assert (deadlines.next(), deadlines.due(7.0), len(deadlines)) == (7.0, ["last"], 0)
