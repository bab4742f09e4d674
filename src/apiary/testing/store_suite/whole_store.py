"""Checks of the store as a whole: its backend name, text in every aggregate, large
envelopes, persistence."""

from __future__ import annotations

from dataclasses import replace

from apiary.core.events import EventFilter
from apiary.core.records import DlqFilter, MessageState, StateChange
from apiary.testing.store_suite.base import (
    T0,
    UNICODE,
    Check,
    CheckNotApplicable,
    StoreFactory,
    agent,
    dlq_entry,
    draft,
    idempotency_record,
    message,
    registry,
)

CHECKS: list[Check] = []
_check = registry(CHECKS)


@_check
async def store_reports_its_backend(factory: StoreFactory) -> None:
    async with factory.open() as store:
        assert store.backend == factory.backend


@_check
async def unicode_round_trips_everywhere(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await store.events.append(
            [
                draft(
                    1,
                    event_type=f"type {UNICODE}",
                    actor=f"actor {UNICODE}",
                    correlation_id=f"corr {UNICODE}",
                    agent_id=f"agent {UNICODE}",
                    hlc=UNICODE,
                    details={UNICODE: UNICODE, "list": [UNICODE]},
                )
            ]
        )
        where = EventFilter(correlation_id=f"corr {UNICODE}", agent_id=f"agent {UNICODE}")
        (event,) = await store.events.read(where=where)
        assert event.event_type == f"type {UNICODE}"
        assert event.actor == f"actor {UNICODE}"
        assert event.hlc == UNICODE
        assert dict(event.details) == {UNICODE: UNICODE, "list": [UNICODE]}

        await store.agents.put(agent(f"id {UNICODE}", name=UNICODE, descriptor={"d": UNICODE}))
        stored_agent = await store.agents.get(f"id {UNICODE}")
        assert stored_agent is not None
        assert stored_agent.name == UNICODE
        assert dict(stored_agent.descriptor) == {"d": UNICODE}


@_check
async def unicode_round_trips_in_the_router_records(factory: StoreFactory) -> None:
    async with factory.open() as store:
        envelope = UNICODE.encode()
        unicode_message = message(
            f"m {UNICODE}",
            f"to {UNICODE}",
            producer_id=f"from {UNICODE}",
            envelope=envelope,
            idempotency_token=f"tok {UNICODE}",
            sequence_number=9,
            lane=UNICODE,
            acked_stage=UNICODE,
        )
        await store.messages.admit(unicode_message)
        (stored,) = await store.messages.inbox(f"to {UNICODE}")
        assert stored == replace(unicode_message, offset=1)
        assert await store.messages.by_sequence(f"from {UNICODE}", 9) == stored
        (batched,) = await store.messages.admit_many([replace(unicode_message, message_id=UNICODE)])
        assert batched == replace(unicode_message, message_id=UNICODE, offset=2)
        await store.messages.record_deliveries([(UNICODE, 1, T0 + 1)])
        (applied,) = await store.messages.apply(
            [StateChange(UNICODE, MessageState.READ, T0 + 2, UNICODE, UNICODE)]
        )
        assert (applied.error_code, applied.acked_stage, applied.deliveries) == (
            UNICODE,
            UNICODE,
            1,
        )

        record = idempotency_record(UNICODE, producer_id=UNICODE, result=UNICODE)
        await store.idempotency.put(record)
        assert await store.idempotency.get(UNICODE) == record

        entry = await store.dlq.add(dlq_entry(UNICODE, error_code=UNICODE, reason=UNICODE))
        assert await store.dlq.list(DlqFilter(error_code=UNICODE)) == [entry]
        marked = await store.dlq.mark_requeued(entry.entry_id, T0 + 3, UNICODE)
        assert await store.dlq.get(entry.entry_id) == marked


@_check
async def large_envelopes_round_trip(factory: StoreFactory) -> None:
    # The largest payload a DATA envelope may carry (DESIGN.md section 3), plus framing.
    envelope = bytes(range(256)) * (64 * 1024) + b"framing"
    async with factory.open() as store:
        single = await store.messages.admit(message("single", envelope=envelope))
        outcomes = await store.messages.admit_many(
            [message("batched", envelope=envelope[::-1]), message("small")]
        )
        assert single.envelope == envelope
        stored = await store.messages.get("single")
        assert stored is not None
        assert stored.envelope == envelope
        batched = await store.messages.get("batched")
        assert batched is not None
        assert batched.envelope == envelope[::-1]
        assert outcomes[0] == batched
        (applied,) = await store.messages.apply([StateChange("single", MessageState.READ, T0)])
        assert applied.envelope == envelope


@_check
async def everything_survives_closing_and_reopening(factory: StoreFactory) -> None:
    if not factory.durable:
        raise CheckNotApplicable(f"the {factory.backend} backend is not durable")
    timed = message("m-3", "b", sequence_number=5, ack_deadline=T0 + 10, expires_at=T0 + 20)
    async with factory.open() as store:
        appended = await store.events.append([draft(1, correlation_id="c"), draft(2)])
        await store.agents.put(agent("a-1"))
        await store.messages.admit(message("m-1", "b"))
        await store.messages.set_state("m-1", MessageState.READ, T0 + 3)
        await store.messages.admit_many([message("m-2", "b"), timed])
        await store.messages.record_deliveries([("m-3", 1, T0 + 4)])
        await store.messages.set_state("m-2", MessageState.FULFILLED, T0 + 5)
        await store.messages.purge_finished(T0 + 6)
        await store.idempotency.put(idempotency_record("tok-1"))
        entry = await store.dlq.add(dlq_entry("dead"))
    async with factory.open() as store:
        assert await store.events.read() == appended
        assert await store.events.last_sequence() == 2
        assert await store.agents.get("a-1") == agent("a-1")
        stored = await store.messages.get("m-1")
        assert stored == replace(
            message("m-1", "b"), offset=1, state=MessageState.READ, updated_at=T0 + 3
        )
        assert await store.messages.get("m-3") == replace(
            timed, offset=3, deliveries=1, last_delivered_at=T0 + 4
        )
        assert await store.messages.get("m-2") is None
        assert await store.messages.next_deadline() == T0 + 10
        assert [m.message_id for m in await store.messages.due(T0 + 10)] == ["m-3"]
        assert await store.messages.by_sequence("agent-a", 5) == await store.messages.get("m-3")
        assert await store.messages.oldest_offset("b") == 1
        assert await store.idempotency.get("tok-1") == idempotency_record("tok-1")
        assert await store.dlq.get(entry.entry_id) == entry
        # Numbering continues where it stopped, past purged messages too.
        assert [e.sequence for e in await store.events.append([draft(3)])] == [3]
        assert (await store.messages.admit(message("m-4", "b"))).offset == 4
        assert (await store.dlq.add(dlq_entry("dead-2"))).entry_id > entry.entry_id
    async with factory.open() as store:
        assert await store.events.last_sequence() == 3
        assert [m.message_id for m in await store.messages.inbox("b")] == ["m-1", "m-3", "m-4"]
