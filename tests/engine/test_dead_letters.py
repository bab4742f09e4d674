"""The dead letter queue (RFC 21.1): what goes in (admitted messages that failed; never a
refusal at admission), the diagnostics each entry carries, and the operator's filters, requeue
and export."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator

import pytest

from apiary.core.envelope import AckStage, Envelope, MessageType
from apiary.core.records import DlqEntry, DlqFilter
from apiary.engine.dead_letters import EXCERPT_BYTES
from apiary.engine.router.admission import Outbound
from apiary.errors import ApiaryError
from apiary.testing.clock import DEFAULT_START
from apiary.testing.engine import EngineHarness, open_test_engine


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine() as harness:
        for agent in ("alice", "bob", "carol"):
            await harness.register(agent)
        yield harness


async def _requeue(h: EngineHarness, entry_id: int) -> str:
    """What an operator's requeue does (apiary.v1.DlqService.Requeue)."""

    async def send(
        env: Envelope, recipient: str, signature: bytes, origin: bytes, entry_id: int
    ) -> str:
        item = Outbound(
            env, recipient, requeue=True, signature=signature, origin=origin, dead_letter=entry_id
        )
        outcome = await h.engine.router.send(item)
        if outcome.error is not None:
            raise outcome.error
        return outcome.message_id

    return await h.engine.router.dead_letters.requeue(entry_id, h.ids, send)


async def _entry(h: EngineHarness, message_id: str) -> DlqEntry:
    (entry,) = [e for e in await h.store.dlq.list() if e.message_id == message_id]
    return entry


@pytest.mark.conformance("dlq.facility", "dlq.move.terminal-error", "dlq.entry.diagnostics")
async def test_a_failed_message_is_dead_lettered_with_its_diagnostics(h: EngineHarness) -> None:
    body = ("x" * 1000).encode()
    sent = await h.send("alice", "bob", body, content_type="text/plain", correlation_id="wf-7")
    h.clock.advance(1)
    await h.take("bob")
    await h.ack("bob", sent.message_id, AckStage.RECEIVED)
    h.clock.advance(2)
    await h.ack("bob", sent.message_id, AckStage.FAILED, "internal_error", "database down")
    entry = await _entry(h, sent.message_id)
    assert (entry.error_code, entry.reason) == ("internal_error", "database down")
    assert (entry.producer_id, entry.recipient, entry.correlation_id) == ("alice", "bob", "wf-7")
    assert entry.route == "alice -> coordinator -> bob"
    assert (entry.created_at, entry.failed_at) == (DEFAULT_START, DEFAULT_START + 3)
    assert (entry.content_type, entry.payload_size) == ("text/plain", 1000)
    assert entry.message_type == MessageType.DATA
    # Attempt history: when and what happened to this message, oldest first, with reasons.
    history = [(a["at"], a["what"], a["reason"]) for a in entry.attempts]
    assert history[0] == (DEFAULT_START, "message.received", "")
    assert history[-1] == (DEFAULT_START + 3, "message.state", "internal_error")
    assert [a["at"] for a in entry.attempts] == sorted(a["at"] for a in entry.attempts)
    # A bounded excerpt for triage, and the whole envelope kept as the secure reference.
    doc = h.engine.router.dead_letters.describe(entry)
    assert base64.b64decode(doc["payload_excerpt_base64"]) == body[:EXCERPT_BYTES]
    assert "payload_base64" not in doc
    assert h.engine.router.codec.decode(entry.envelope).payload == body


@pytest.mark.conformance("dlq.move.terminal-error")
@pytest.mark.parametrize(("stage", "code"), [(AckStage.REJECTED, "validation_error"),
                                             (AckStage.FAILED, "permission_denied")])  # fmt: skip
async def test_terminal_errors_reported_by_the_agent_are_dead_lettered(
    h: EngineHarness, stage: AckStage, code: str
) -> None:
    sent = await h.send("alice", "bob", {"n": 1})
    await h.ack("bob", sent.message_id, stage, code, "cannot succeed")
    assert (await _entry(h, sent.message_id)).error_code == code


async def test_an_acknowledgement_from_the_wrong_agent_is_refused_not_dead_lettered(
    h: EngineHarness,
) -> None:
    sent = await h.send("alice", "bob", {"n": 1})
    with pytest.raises(ApiaryError) as caught:
        await h.ack("carol", sent.message_id, AckStage.FULFILLED)
    assert caught.value.code == "permission_denied"
    # Refused at admission: carol has the error, the log and the count have the refusal, and
    # bob's message goes on as it was.
    (refused,) = await h.events("message.rejected")
    assert (refused.actor, refused.details["error_code"]) == ("carol", "permission_denied")
    assert h.engine.router.stats.admission_refused["permission_denied"] == 1
    assert (await h.message(sent.message_id)).state == "RECEIVED"
    assert await h.store.dlq.list() == []


async def test_success_timeouts_and_back_pressure_are_not_dead_letters(h: EngineHarness) -> None:
    ok = await h.send("alice", "bob", {"n": 1})
    await h.ack("bob", ok.message_id, AckStage.FULFILLED)
    await h.send("alice", "carol", {"n": 2})
    h.clock.advance(11)
    await h.fire()  # carol's message TIMED_OUT: the producer retries, it is not dead
    h.engine.router.set_capacity("bob", 1)
    await h.send("alice", "bob", {"n": 3})
    assert (await h.send("alice", "bob", {"n": 4})).error_code == "buffer_full"
    assert await h.store.dlq.list() == []


async def test_expired_coordinator_notices_are_not_dead_letters(h: EngineHarness) -> None:
    # Heartbeats and announcements to an agent that never reads them expire quietly.
    await h.connect("alice")  # connected, but its stream reads no further
    await h.register("carol")
    for _ in range(3):
        await h.engine.presence.tick()
    h.clock.advance(h.engine.router.settings.notice_ttl_s + 1)
    assert await h.fire() > 0
    assert await h.store.dlq.list() == []
    assert h.engine.router.stats.dead_lettered == {}


# --- operator tools ---------------------------------------------------------------------------


async def _three_failures(h: EngineHarness) -> tuple[str, str, str]:
    """alice->bob REJECTED validation_error at t0, carol->bob internal_error at t0+100,
    alice->carol ttl_expired at t0+200."""
    bad = (await h.send("alice", "bob", {"n": 1})).message_id
    await h.ack("bob", bad, AckStage.REJECTED, "validation_error", "n must be a word")
    h.clock.advance(100)
    failed = await h.send("carol", "bob", {"n": 2})
    await h.ack("bob", failed.message_id, AckStage.FAILED, "internal_error", "crash")
    h.clock.advance(100)
    expiring = await h.send("alice", "carol", {"n": 3}, ttl_ms=500)
    await h.ack("carol", expiring.message_id, AckStage.RECEIVED)
    h.clock.advance(1)
    await h.fire()
    return bad, failed.message_id, expiring.message_id


@pytest.mark.conformance("dlq.ops.filter", "dlq.tools.inspection")
async def test_entries_filter_by_time_error_class_route_and_producer(h: EngineHarness) -> None:
    bad, failed, expired = await _three_failures(h)
    letters = h.engine.router.dead_letters

    async def ids(**where: object) -> list[str]:
        return [e.message_id for e in await letters.list(DlqFilter(**where), 0, 100)]  # type: ignore[arg-type]

    assert await ids() == [bad, failed, expired]
    assert await ids(since=DEFAULT_START + 50) == [failed, expired]
    assert await ids(until=DEFAULT_START + 150) == [bad, failed]
    assert await ids(since=DEFAULT_START + 50, until=DEFAULT_START + 150) == [failed]
    assert await ids(error_code="ttl_expired") == [expired]
    assert await ids(recipient="bob") == [bad, failed]
    assert await ids(producer_id="alice") == [bad, expired]
    assert await ids(producer_id="alice", recipient="bob", error_code="validation_error") == [bad]
    assert await ids(error_code="buffer_full") == []
    # Paging by entry id.
    (first,) = await letters.list(None, 0, 1)
    assert [e.message_id for e in await letters.list(None, first.entry_id, 10)] == [
        failed,
        expired,
    ]


@pytest.mark.conformance("dlq.ops.requeue", "router.fields.retry-count", "dlq.tools.inspection")
async def test_a_selected_entry_is_requeued_as_a_new_attempt(h: EngineHarness) -> None:
    _, failed, _ = await _three_failures(h)
    entry = await _entry(h, failed)
    original = h.engine.router.codec.decode(entry.envelope)
    new_id = await _requeue(h, entry.entry_id)
    assert new_id != failed
    again = await h.message(new_id)
    assert (again.state, again.recipient, again.producer_id) == ("RECEIVED", "bob", "carol")
    retry = h.engine.router.codec.decode(again.envelope)
    assert retry.retry_count == original.retry_count + 1
    assert (retry.payload, retry.correlation_id) == (original.payload, original.correlation_id)
    marked = await h.engine.router.dead_letters.get(entry.entry_id)
    assert (marked.requeued_as, marked.requeued_at) == (new_id, h.clock.now())
    assert [x.message.message_id for x in await h.take("bob")] == [new_id]
    (event,) = await h.events("dlq.requeued")
    assert (event.details["entry_id"], event.details["new_message_id"]) == (entry.entry_id, new_id)
    # Requeuing the same entry twice is refused; the others are untouched.
    with pytest.raises(ApiaryError) as caught:
        await _requeue(h, entry.entry_id)
    assert caught.value.code == "ALREADY_COMPLETED"
    assert new_id in caught.value.message
    unselected = [e for e in await h.store.dlq.list() if e.entry_id != entry.entry_id]
    assert [e.requeued_as for e in unselected] == ["", ""]
    only_pending = DlqFilter(include_requeued=False)
    assert entry.entry_id not in [
        e.entry_id for e in await h.engine.router.dead_letters.list(only_pending, 0, 10)
    ]


async def test_two_requeues_of_one_entry_at_once_admit_one_copy(h: EngineHarness) -> None:
    """The entry is marked requeued in the transaction that admits its copy, only if no
    requeue marked it first: of two requeues racing (past the check that the entry is not
    requeued yet), one is admitted and the other refused ALREADY_COMPLETED."""
    _, failed, _ = await _three_failures(h)
    entry = await _entry(h, failed)
    results = await asyncio.gather(
        _requeue(h, entry.entry_id), _requeue(h, entry.entry_id), return_exceptions=True
    )
    copies = [r for r in results if isinstance(r, str)]
    (refused,) = [r for r in results if isinstance(r, ApiaryError)]
    assert len(copies) == 1 and refused.code == "ALREADY_COMPLETED"
    assert (await h.engine.router.dead_letters.get(entry.entry_id)).requeued_as == copies[0]
    assert [x.message.message_id for x in await h.take("bob")] == copies


@pytest.mark.conformance("dlq.ops.requeue")
async def test_expired_deduplicated_entries_can_be_requeued(h: EngineHarness) -> None:
    token = "alice:op:requeue"
    sent = await h.send("alice", "bob", {"n": 1}, idempotency_token=token, sequence_number=4,
                        ttl_ms=1000)  # fmt: skip
    await h.ack("bob", sent.message_id, AckStage.RECEIVED)
    h.clock.advance(2)
    await h.fire()
    entry = await _entry(h, sent.message_id)
    assert entry.error_code == "ttl_expired"
    # A producer's retry gets the cached failure; an operator's requeue runs it again, with a
    # TTL that counts from the requeue.
    retry = await h.send("alice", "bob", {"n": 1}, idempotency_token=token, sequence_number=4)
    assert retry.error_code == "duplicate_detected"
    new_id = await _requeue(h, entry.entry_id)
    requeued = await h.message(new_id)
    assert requeued.expires_at == h.clock.now() + 1.0
    await h.ack("bob", new_id, AckStage.FULFILLED, note="done at last")
    later = await h.send("alice", "bob", {"n": 1}, idempotency_token=token)
    assert (later.details["original_message_id"], later.details["original_status"]) == (
        new_id,
        "FULFILLED",
    )
    assert len(await h.store.dlq.list()) == 1


async def test_a_requeue_that_cannot_be_admitted_says_why(h: EngineHarness) -> None:
    bad, _, _ = await _three_failures(h)
    entry = await _entry(h, bad)
    await h.engine.registry.deregister("bob", "gone")
    with pytest.raises(ApiaryError) as caught:
        await _requeue(h, entry.entry_id)
    assert caught.value.code == "no_route"
    assert (await h.engine.router.dead_letters.get(entry.entry_id)).requeued_as == ""
    with pytest.raises(ApiaryError) as missing:
        await _requeue(h, 999)
    assert missing.value.code == "NOT_FOUND"


@pytest.mark.conformance("dlq.ops.export", "dlq.entry.diagnostics")
async def test_a_diagnostic_bundle_is_exported(h: EngineHarness) -> None:
    bad, failed, expired = await _three_failures(h)
    letters = h.engine.router.dead_letters
    page = await letters.export(None, include_payloads=False)
    doc = json.loads(page.bundle)
    assert page.entries == 3 == len(doc["entries"]) and not page.more
    assert doc["exported_at"] == "2023-11-14T22:16:41Z"
    first = doc["entries"][0]
    assert first["message_id"] == bad
    assert {
        "entry_id", "producer_id", "recipient", "correlation_id", "error_code", "reason",
        "created_at", "failed_at", "content_type", "payload_size", "route", "attempts",
        "requeued_as", "payload_excerpt_base64",
    } <= set(first)  # fmt: skip
    assert first["attempts"][0]["what"] == "message.received"
    assert first["attempts"][0]["at"] == "2023-11-14T22:13:20Z"
    # Filtered, and with whole payloads when asked for.
    page = await letters.export(DlqFilter(error_code="internal_error"), True)
    (only,) = json.loads(page.bundle)["entries"]
    assert (page.entries, only["message_id"]) == (1, failed)
    assert json.loads(base64.b64decode(only["payload_base64"])) == {"n": 2}
    assert expired not in page.bundle.decode()
    # Page by page: at most `limit` entries, fewer when the next would pass `max_bytes`
    # (one entry always goes: a page is never empty while entries remain).
    first = await letters.export(None, False, limit=2)
    assert (first.entries, first.more) == (2, True)
    rest = await letters.export(None, False, after_id=first.last_id, limit=2)
    assert (rest.entries, rest.more) == (1, False)
    ids = [e["message_id"] for p in (first, rest) for e in json.loads(p.bundle)["entries"]]
    assert ids == [bad, failed, expired]
    small = await letters.export(None, False, max_bytes=1)
    assert (small.entries, small.more) == (1, True)
    assert json.loads(small.bundle)["entries"][0]["message_id"] == bad
