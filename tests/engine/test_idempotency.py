"""Deduplication through the router (RFC 11.2, 11.1 rule 4, 19, 21, Appendix C.2).

With an idempotency token the router deduplicates by token against the persistent cache;
without one, by (producer_id, sequence_number).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from apiary.core.dedup import iso_utc
from apiary.core.envelope import Ack, AckStage, MessageType
from apiary.core.records import MessageState
from apiary.engine.notices import COORDINATOR
from apiary.engine.router.admission import Outbound
from apiary.engine.router.dedup_gate import cache_key
from apiary.engine.settings import RouterSettings
from apiary.store.errors import StoreError
from apiary.testing.clock import FakeClock
from apiary.testing.engine import EngineHarness, open_test_engine
from apiary.testing.ids import SequentialIds
from apiary.wire.convert import ack_to_json

TOKEN = "alice:create-user:9f2c4e"


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine() as harness:
        await harness.register("alice")
        await harness.register("bob")
        yield harness


async def _admitted_for(h: EngineHarness, agent: str) -> list[str]:
    return [
        m.message_id
        for m in await h.store.messages.inbox(agent, 0, 10_000)
        if m.producer_id != COORDINATOR and m.message_type != MessageType.ACKNOWLEDGEMENT
    ]


async def _answer_to(h: EngineHarness, message_id: str) -> dict[str, Any]:
    """The one ACK/NACK about `message_id` in alice's inbox."""
    (found,) = [
        p for p in await h.inbox_payloads("alice") if p.get("ack_for_message_id") == message_id
    ]
    return found


@pytest.mark.conformance("idempotency.arrival.new-token", "idempotency.dedup.by-token")
async def test_a_new_token_records_received_and_proceeds(h: EngineHarness) -> None:
    outcome = await h.send("alice", "bob", {"user": "alice"}, idempotency_token=TOKEN)
    assert outcome.accepted
    record = await h.store.idempotency.get(cache_key("alice", TOKEN))
    assert record is not None
    assert (record.status, record.original_message_id, record.attempts) == (
        "RECEIVED",
        outcome.message_id,
        (outcome.message_id,),
    )
    assert record.producer_id == "alice"
    assert await _admitted_for(h, "bob") == [outcome.message_id]
    (handout,) = await h.take("bob")
    assert handout.message.message_id == outcome.message_id


@pytest.mark.conformance("idempotency.arrival.in-progress", "idempotency.dedup.by-token")
@pytest.mark.parametrize("progress", [None, AckStage.RECEIVED, AckStage.READ])
async def test_a_token_in_progress_is_not_executed_again(
    h: EngineHarness, progress: AckStage | None
) -> None:
    first = await h.send("alice", "bob", {"user": "alice"}, idempotency_token=TOKEN)
    if progress is not None:
        await h.ack("bob", first.message_id, progress)
    again = await h.send("alice", "bob", {"user": "alice"}, idempotency_token=TOKEN, retry_count=1)
    assert (again.accepted, again.error_code) == (False, "already_in_progress")
    assert first.message_id in again.reason
    assert await h.store.messages.get(again.message_id) is None
    assert await _admitted_for(h, "bob") == [first.message_id]
    nack = await _answer_to(h, again.message_id)
    assert (nack["ack_stage"], nack["error_code"]) == ("REJECTED", "ALREADY_IN_PROGRESS")
    record = await h.store.idempotency.get(cache_key("alice", TOKEN))
    assert record is not None and record.attempts == (first.message_id,)


@pytest.mark.conformance(
    "idempotency.arrival.terminal-cached", "errors.duplicate.detected",
    "idempotency.dedup.by-token",
)  # fmt: skip
async def test_a_completed_token_answers_the_cached_outcome(h: EngineHarness) -> None:
    first = await h.send("alice", "bob", {"user": "alice"}, idempotency_token=TOKEN)
    h.clock.advance(2.25)
    done_at = h.clock.now()
    await h.ack("bob", first.message_id, AckStage.FULFILLED, note='{"user_id": 42}')
    h.clock.advance(30)
    again = await h.send("alice", "bob", {"user": "alice"}, idempotency_token=TOKEN, retry_count=1)
    assert (again.accepted, again.error_code) == (False, "duplicate_detected")
    expected = {
        "status": "DUPLICATE_DETECTED",
        "original_message_id": first.message_id,
        "original_status": "FULFILLED",
        "cached_at": iso_utc(done_at),
        "result": '{"user_id": 42}',
        "error_code": "",
    }
    assert again.details == expected
    # Not executed again: nothing new reached bob.
    assert await h.store.messages.get(again.message_id) is None
    assert await _admitted_for(h, "bob") == [first.message_id]
    # The producer is told in its inbox, with the same fields.
    notice = await _answer_to(h, again.message_id)
    assert (notice["ack_stage"], notice["error_code"]) == ("FULFILLED", "DUPLICATE_DETECTED")
    expected["original_error_code"] = expected.pop("error_code")
    assert {k: notice[k] for k in expected} == expected


@pytest.mark.conformance("idempotency.arrival.terminal-cached", "errors.duplicate.detected")
async def test_a_cached_error_is_answered_too(h: EngineHarness) -> None:
    first = await h.send("alice", "bob", {"user": "alice"}, idempotency_token=TOKEN)
    await h.ack("bob", first.message_id, AckStage.FAILED, "permission_denied", "no such realm")
    again = await h.send("alice", "bob", {"user": "alice"}, idempotency_token=TOKEN, retry_count=1)
    assert again.error_code == "duplicate_detected"
    assert {k: again.details[k] for k in ("original_status", "error_code", "result")} == {
        "original_status": "FAILED",
        "error_code": "permission_denied",
        "result": "no such realm",
    }
    notice = await _answer_to(h, again.message_id)
    assert (notice["ack_stage"], notice["error_code"]) == ("FAILED", "DUPLICATE_DETECTED")
    assert (notice["original_error_code"], notice["result"]) == (
        "permission_denied",
        "no such realm",
    )


# --- Appendix C.2: timeout, retry, late ACK, reconcile ------------------------------------------


@pytest.mark.conformance(
    "router.late-ack.retrying-both-tracked", "idempotency.late-ack.earliest-completion",
    "idempotency.dedup.by-token",
)  # fmt: skip
@pytest.mark.parametrize("late_first", [True, False])
async def test_timeout_retry_and_late_ack_reconcile_to_the_earliest_success(
    h: EngineHarness, late_first: bool
) -> None:
    m1 = await h.send("alice", "bob", {"user": "alice"}, idempotency_token=TOKEN)
    await h.take("bob")
    h.clock.advance(10.5)
    await h.fire()
    timeout = await _answer_to(h, m1.message_id)
    assert (timeout["ack_stage"], timeout["error_code"]) == ("TIMED_OUT", "ACK_TIMEOUT")
    # The producer retries: new message_id, same token, retry_count 1; it is admitted.
    m2 = await h.send("alice", "bob", {"user": "alice"}, idempotency_token=TOKEN, retry_count=1)
    assert m2.accepted
    (retry,) = await h.take("bob")
    assert retry.message.message_id == m2.message_id
    record = await h.store.idempotency.get(cache_key("alice", TOKEN))
    assert record is not None
    assert (record.attempts, record.current_message_id) == (
        (m1.message_id, m2.message_id),
        m2.message_id,
    )
    acks = [(m1.message_id, "from m1"), (m2.message_id, "from m2")]
    for message_id, note in acks if late_first else acks[::-1]:
        h.clock.advance(1)
        await h.ack("bob", message_id, AckStage.FULFILLED, note=note)
    # m1 keeps its truthful terminal state; the cache holds m1, the earliest success.
    assert (await h.message(m1.message_id)).state == "TIMED_OUT"
    assert (await h.message(m2.message_id)).state == "FULFILLED"
    record = await h.store.idempotency.get(cache_key("alice", TOKEN))
    assert record is not None
    assert (record.original_message_id, record.status, record.result) == (
        m1.message_id,
        "FULFILLED",
        "from m1",
    )
    m3 = await h.send("alice", "bob", {"user": "alice"}, idempotency_token=TOKEN, retry_count=2)
    assert m3.details["original_message_id"] == m1.message_id
    assert m3.details["original_status"] == "FULFILLED"


async def test_a_late_failure_does_not_replace_a_cached_success(h: EngineHarness) -> None:
    m1 = await h.send("alice", "bob", {"n": 1}, idempotency_token=TOKEN)
    await h.take("bob")
    h.clock.advance(10.5)
    await h.fire()
    m2 = await h.send("alice", "bob", {"n": 1}, idempotency_token=TOKEN, retry_count=1)
    await h.ack("bob", m2.message_id, AckStage.FULFILLED, note="ok")
    await h.ack("bob", m1.message_id, AckStage.FAILED, "internal_error", "late crash")
    record = await h.store.idempotency.get(cache_key("alice", TOKEN))
    assert record is not None
    assert (record.original_message_id, record.status) == (m2.message_id, "FULFILLED")


# --- the deduplication window -------------------------------------------------------------------


@pytest.mark.conformance("idempotency.cache.dedup-window")
async def test_outcomes_are_kept_for_the_default_window_of_3600_seconds(h: EngineHarness) -> None:
    assert h.engine.router.settings.dedup_window_s == 3600.0
    first = await h.send("alice", "bob", {"n": 1}, idempotency_token=TOKEN)
    await h.ack("bob", first.message_id, AckStage.FULFILLED)
    h.clock.advance(3599)
    inside = await h.send("alice", "bob", {"n": 1}, idempotency_token=TOKEN)
    assert inside.error_code == "duplicate_detected"
    h.clock.advance(2)
    after = await h.send("alice", "bob", {"n": 1}, idempotency_token=TOKEN)
    assert after.accepted
    record = await h.store.idempotency.get(cache_key("alice", TOKEN))
    assert record is not None
    assert (record.original_message_id, record.status) == (after.message_id, "RECEIVED")


@pytest.mark.conformance("patterns.ids.dedup-window", "idempotency.cache.dedup-window")
async def test_the_window_is_configurable() -> None:
    async with open_test_engine(RouterSettings(dedup_window_s=60)) as h:
        await h.register("alice")
        await h.register("bob")
        first = await h.send("alice", "bob", {"n": 1}, idempotency_token=TOKEN)
        await h.ack("bob", first.message_id, AckStage.FULFILLED)
        h.clock.advance(59)
        assert (await h.send("alice", "bob", idempotency_token=TOKEN)).error_code == (
            "duplicate_detected"
        )
        h.clock.advance(2)
        assert (await h.send("alice", "bob", idempotency_token=TOKEN)).accepted


# --- without a token: (producer_id, sequence_number) ---------------------------------------


@pytest.mark.conformance("idempotency.dedup.by-producer-sequence")
async def test_without_a_token_producer_and_sequence_number_deduplicate(h: EngineHarness) -> None:
    await h.register("carol")
    first = await h.send("alice", "bob", {"n": 1}, sequence_number=5)
    running = await h.send("alice", "bob", {"n": 1}, sequence_number=5, retry_count=1)
    assert (running.accepted, running.error_code) == (False, "already_in_progress")
    # Another producer's sequence is its own.
    assert (await h.send("carol", "bob", {"n": 1}, sequence_number=5)).accepted
    assert (await h.send("alice", "bob", {"n": 2}, sequence_number=6)).accepted
    await h.ack("bob", first.message_id, AckStage.FULFILLED)
    done = await h.send("alice", "bob", {"n": 1}, sequence_number=5, retry_count=1)
    assert done.error_code == "duplicate_detected"
    assert done.details["original_message_id"] == first.message_id
    assert done.details["original_status"] == "FULFILLED"
    assert len(await _admitted_for(h, "bob")) == 3
    notice = await _answer_to(h, done.message_id)
    assert notice["status"] == "DUPLICATE_DETECTED"


async def test_a_timed_out_sequence_may_be_retried(h: EngineHarness) -> None:
    first = await h.send("alice", "bob", {"n": 1}, sequence_number=9)
    await h.take("bob")
    h.clock.advance(11)
    await h.fire()
    assert (await h.message(first.message_id)).state == "TIMED_OUT"
    retry = await h.send("alice", "bob", {"n": 1}, sequence_number=9, retry_count=1)
    assert retry.accepted


# --- persistence and logging --------------------------------------------------------------------


@pytest.mark.conformance("idempotency.cache.persistent")
async def test_the_cache_survives_a_restart(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'apiary.db'}"
    clock, ids = FakeClock(), SequentialIds()
    async with open_test_engine(store_url=url, clock=clock, ids=ids) as h:
        await h.register("alice")
        await h.register("bob")
        done = await h.send("alice", "bob", {"n": 1}, idempotency_token=TOKEN)
        await h.ack("bob", done.message_id, AckStage.FULFILLED, note="created")
        running = await h.send("alice", "bob", {"n": 2}, idempotency_token="alice:op:2")
    clock.advance(60)
    async with open_test_engine(store_url=url, clock=clock, ids=ids) as h:
        duplicate = await h.send("alice", "bob", {"n": 1}, idempotency_token=TOKEN)
        assert duplicate.details["original_message_id"] == done.message_id
        assert duplicate.details["result"] == "created"
        busy = await h.send("alice", "bob", {"n": 2}, idempotency_token="alice:op:2")
        assert busy.error_code == "already_in_progress"
        assert running.message_id in busy.reason


@pytest.mark.conformance("observability.idempotency.log-cache-decisions")
async def test_cache_decisions_are_logged_with_the_original_attempt(h: EngineHarness) -> None:
    m1 = await h.send("alice", "bob", {"n": 1}, idempotency_token=TOKEN)
    busy = await h.send("alice", "bob", {"n": 1}, idempotency_token=TOKEN)
    await h.take("bob")
    h.clock.advance(10.5)
    await h.fire()
    m2 = await h.send("alice", "bob", {"n": 1}, idempotency_token=TOKEN)
    await h.ack("bob", m2.message_id, AckStage.FULFILLED)
    dup = await h.send("alice", "bob", {"n": 1}, idempotency_token=TOKEN)
    decisions = [
        (e.details["message_id"], e.details["decision"], e.details["original_message_id"])
        for e in await h.events("idempotency.decision")
    ]
    assert decisions == [
        (m1.message_id, "NEW", m1.message_id),
        (busy.message_id, "IN_PROGRESS", m1.message_id),
        (m2.message_id, "RETRY", m1.message_id),
        (dup.message_id, "DUPLICATE", m2.message_id),
    ]
    for event in await h.events("idempotency.decision"):
        assert event.details["token"] == TOKEN and event.actor == "alice"
    (cached,) = await h.events("idempotency.cached")
    assert (cached.details["message_id"], cached.details["status"]) == (m2.message_id, "FULFILLED")
    # Rejections carry the original attempt too.
    rejected = {e.details["message_id"]: e for e in await h.events("message.rejected")}
    assert m2.message_id in rejected[dup.message_id].details["reason"]


async def test_the_duplicate_notice_is_json_with_the_rfc_fields(h: EngineHarness) -> None:
    first = await h.send("alice", "bob", {"n": 1}, idempotency_token=TOKEN)
    await h.ack("bob", first.message_id, AckStage.FULFILLED)
    dup = await h.send("alice", "bob", {"n": 1}, idempotency_token=TOKEN)
    stored = [
        m for m in await h.store.messages.inbox("alice", 0, 10_000) if m.producer_id == COORDINATOR
    ]
    envelopes = [h.engine.router.codec.decode(m.envelope) for m in stored]
    (notice,) = [e for e in envelopes if dup.message_id.encode() in e.payload]
    assert notice.message_type is MessageType.ACKNOWLEDGEMENT
    body = json.loads(notice.payload)
    assert {"status", "original_message_id", "original_status", "cached_at"} <= set(body)


async def test_a_token_record_commits_with_the_state_it_records(tmp_path: Path) -> None:
    """A write fault between the message's state change and its token's record (a trigger
    that fails the record's write, in the same transaction) leaves neither: the message
    stays READ, the record READ, nothing is logged as cached; the ACK sent again applies
    both, with one `idempotency.cached` event."""
    path = tmp_path / "apiary.db"
    async with open_test_engine(store_url=f"sqlite://{path}") as h:
        await h.register("alice")
        await h.register("bob")
        sent = await h.send("alice", "bob", {"n": 1}, idempotency_token=TOKEN)
        await h.take("bob")
        await h.ack("bob", sent.message_id, AckStage.READ)
        key = cache_key("alice", TOKEN)
        with sqlite3.connect(path) as db:
            db.execute(
                "CREATE TRIGGER token_fault BEFORE INSERT ON idempotency"
                " BEGIN SELECT RAISE(ABORT, 'injected fault'); END"
            )
        with pytest.raises(StoreError):
            await h.ack("bob", sent.message_id, AckStage.FULFILLED, note="created")
        assert (await h.message(sent.message_id)).state is MessageState.READ
        record = await h.store.idempotency.get(key)
        assert record is not None and (record.status, record.outcome_at) == ("READ", 0.0)
        assert await h.events("idempotency.cached") == []
        with sqlite3.connect(path) as db:
            db.execute("DROP TRIGGER token_fault")
        await h.ack("bob", sent.message_id, AckStage.FULFILLED, note="created")
        assert (await h.message(sent.message_id)).state is MessageState.FULFILLED
        record = await h.store.idempotency.get(key)
        assert record is not None and (record.status, record.result) == ("FULFILLED", "created")
        (cached,) = await h.events("idempotency.cached")
        assert cached.details["message_id"] == sent.message_id


async def test_a_late_success_and_the_next_attempts_progress_both_reach_the_record(
    h: EngineHarness,
) -> None:
    """A timed-out attempt's late FULFILLED and the retry's READ, applied together (one
    frame), each update the token's record as the other left it: the late success is
    cached, and stays cached."""
    first = await h.send("alice", "bob", {"n": 1}, idempotency_token=TOKEN)
    await h.take("bob")
    h.clock.advance(10.5)
    await h.fire()
    retry = await h.send("alice", "bob", {"n": 1}, idempotency_token=TOKEN, retry_count=1)
    assert retry.accepted
    await h.take("bob")
    acks = [
        h.envelope(
            "bob",
            ack_to_json(Ack(message_id, stage, "", note)),
            message_type=MessageType.ACKNOWLEDGEMENT,
        )
        for message_id, stage, note in (
            (first.message_id, AckStage.FULFILLED, "late"),
            (retry.message_id, AckStage.READ, ""),
        )
    ]
    outcomes = await h.engine.router.send_many([Outbound(env) for env in acks])
    assert all(o.accepted for o in outcomes)
    record = await h.store.idempotency.get(cache_key("alice", TOKEN))
    assert record is not None
    assert (record.status, record.original_message_id, record.result) == (
        "FULFILLED",
        first.message_id,
        "late",
    )
    assert record.attempts == (first.message_id, retry.message_id)


async def test_a_token_vouched_new_is_honoured_for_coordinator_endpoints_only(
    h: EngineHarness,
) -> None:
    """`Outbound.new_token` from a participant (not one of the coordinator's endpoints)
    is deduplicated as any other envelope: a token in progress is refused."""
    first = await h.send("alice", "bob", {"n": 1}, idempotency_token=TOKEN)
    env = h.envelope("alice", {"n": 1}, idempotency_token=TOKEN, retry_count=1)
    again = await h.engine.router.send(Outbound(env, "bob", new_token=True))
    assert (again.accepted, again.error_code) == (False, "already_in_progress")
    record = await h.store.idempotency.get(cache_key("alice", TOKEN))
    assert record is not None and record.attempts == (first.message_id,)
