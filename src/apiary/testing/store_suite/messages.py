"""Checks of the message inboxes (`MessageStore`)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable
from dataclasses import replace
from typing import Any

from apiary.core.records import (
    AdmissionBound,
    AdmissionWrites,
    IdempotencyRecord,
    MessageState,
    StateChange,
    StoredMessage,
    TaskState,
    TokenProgress,
    changed,
)
from apiary.store.errors import (
    AdmissionRefusal,
    BoundExceededError,
    DuplicateMessageError,
    RequeuedError,
    StaleStateError,
    StoreError,
    TaskExistsError,
    TokenTakenError,
)
from apiary.testing.store_suite.base import (
    T0,
    TERMINAL_STATES,
    UINT64_MAX,
    Check,
    StoreFactory,
    dlq_entry,
    draft,
    message,
    message_ids,
    registry,
)
from apiary.testing.store_suite.tasks import task_record

CHECKS: list[Check] = []
_check = registry(CHECKS)


@_check
async def admit_numbers_each_inbox_from_one(factory: StoreFactory) -> None:
    async with factory.open() as store:
        offsets = []
        for i, recipient in enumerate(["b", "c", "b", "b", "c"]):
            admitted = await store.messages.admit(message(f"m-{i}", recipient))
            offsets.append((recipient, admitted.offset))
        assert offsets == [("b", 1), ("c", 1), ("b", 2), ("b", 3), ("c", 2)]
        original = message("m-0", "b")
        assert await store.messages.get("m-0") == replace(original, offset=1)
        assert await store.messages.get("unknown") is None


@_check
async def admit_ignores_the_offset_it_is_given(factory: StoreFactory) -> None:
    async with factory.open() as store:
        admitted = await store.messages.admit(message("m-1", offset=99))
        assert admitted.offset == 1
        assert admitted == replace(message("m-1"), offset=1)


@_check
async def a_duplicate_message_id_is_refused_and_changes_nothing(factory: StoreFactory) -> None:
    async with factory.open() as store:
        first = await store.messages.admit(message("m-1", "b"))
        for duplicate in (message("m-1", "b", envelope=b"other"), message("m-1", "c")):
            try:
                await store.messages.admit(duplicate)
            except DuplicateMessageError:
                pass
            else:
                raise AssertionError(f"duplicate {duplicate.message_id} was admitted")
        assert await store.messages.get("m-1") == first
        assert await store.messages.inbox("c") == []
        # The refused admissions consumed no offset.
        assert (await store.messages.admit(message("m-2", "b"))).offset == 2
        assert (await store.messages.admit(message("m-3", "c"))).offset == 1
        assert await store.messages.count("b", frozenset(MessageState)) == 2


@_check
async def set_state_records_the_change(factory: StoreFactory) -> None:
    async with factory.open() as store:
        admitted = await store.messages.admit(message("m-1"))
        failed = await store.messages.set_state("m-1", MessageState.FAILED, T0 + 10, "ttl_expired")
        assert failed == replace(
            admitted, state=MessageState.FAILED, updated_at=T0 + 10, error_code="ttl_expired"
        )
        assert await store.messages.get("m-1") == failed
        retried = await store.messages.set_state("m-1", MessageState.RETRYING, T0 + 11)
        assert retried.error_code == ""
        assert retried.offset == 1
        assert retried.created_at == T0
        assert await store.messages.get("m-1") == retried


@_check
async def set_state_of_an_unknown_message_raises_lookup_error(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await store.messages.admit(message("m-1"))
        try:
            await store.messages.set_state("nope", MessageState.READ, T0)
        except LookupError:
            pass
        else:
            raise AssertionError("set_state of an unknown message did not raise LookupError")
        stored = await store.messages.get("m-1")
        assert stored is not None
        assert stored.state is MessageState.RECEIVED


@_check
async def inbox_reads_in_offset_order_with_filters(factory: StoreFactory) -> None:
    async with factory.open() as store:
        for i in range(1, 8):
            await store.messages.admit(message(f"m-{i}", "b"))
            await store.messages.admit(message(f"other-{i}", "c"))
        await store.messages.set_state("m-2", MessageState.FULFILLED, T0 + 1)
        await store.messages.set_state("m-5", MessageState.READ, T0 + 1)

        def ids(found: list[StoredMessage]) -> list[str]:
            return [m.message_id for m in found]

        assert ids(await store.messages.inbox("b")) == [f"m-{i}" for i in range(1, 8)]
        assert [m.offset for m in await store.messages.inbox("b")] == list(range(1, 8))
        assert ids(await store.messages.inbox("b", after_offset=4)) == ["m-5", "m-6", "m-7"]
        assert ids(await store.messages.inbox("b", after_offset=2, limit=2)) == ["m-3", "m-4"]
        assert await store.messages.inbox("b", limit=0) == []
        assert await store.messages.inbox("b", after_offset=7) == []
        assert await store.messages.inbox("nobody") == []
        received = frozenset({MessageState.RECEIVED})
        assert ids(await store.messages.inbox("b", states=received, limit=3)) == [
            "m-1",
            "m-3",
            "m-4",
        ]
        open_states = frozenset({MessageState.RECEIVED, MessageState.READ})
        assert ids(await store.messages.inbox("b", after_offset=3, states=open_states)) == [
            "m-4",
            "m-5",
            "m-6",
            "m-7",
        ]
        assert await store.messages.inbox("b", states=frozenset()) == []


@_check
async def count_counts_a_recipients_messages_by_state(factory: StoreFactory) -> None:
    async with factory.open() as store:
        for i in range(5):
            await store.messages.admit(message(f"m-{i}", "b"))
        await store.messages.admit(message("other", "c"))
        await store.messages.set_state("m-0", MessageState.FULFILLED, T0 + 1)
        await store.messages.set_state("m-1", MessageState.TIMED_OUT, T0 + 1)
        terminal = frozenset(s for s in MessageState if s.terminal)
        assert await store.messages.count("b", frozenset({MessageState.RECEIVED})) == 3
        assert await store.messages.count("b", terminal) == 2
        assert await store.messages.count("b", frozenset(MessageState)) == 5
        assert await store.messages.count("b", frozenset()) == 0
        assert await store.messages.count("nobody", frozenset(MessageState)) == 0


@_check
async def concurrent_admissions_get_gap_free_offsets(factory: StoreFactory) -> None:
    async with factory.open() as store:
        admitted = await asyncio.gather(
            *(store.messages.admit(message(f"m-{i}", "b" if i % 4 else "c")) for i in range(60))
        )
        offsets_b = sorted(m.offset for m in admitted if m.recipient == "b")
        offsets_c = sorted(m.offset for m in admitted if m.recipient == "c")
        assert offsets_b == list(range(1, 46))
        assert offsets_c == list(range(1, 16))
        inbox = await store.messages.inbox("b", limit=100)
        assert [(m.offset, m.message_id) for m in inbox] == sorted(
            (m.offset, m.message_id) for m in admitted if m.recipient == "b"
        )


@_check
async def envelopes_are_kept_byte_for_byte(factory: StoreFactory) -> None:
    envelopes = [b"", bytes(range(256)), b"\x00" * 1000, b"\xff\xfe" + "é".encode() + b"\x00"]
    async with factory.open() as store:
        for i, envelope in enumerate(envelopes):
            await store.messages.admit(message(f"m-{i}", envelope=envelope))
        assert [m.envelope for m in await store.messages.inbox("agent-b")] == envelopes


async def _expect_value_error(what: str, attempt: Awaitable[object]) -> None:
    try:
        await attempt
    except ValueError:
        return
    raise AssertionError(f"{what} did not raise ValueError")


# --- the fields the router keeps per message ------------------------------------------


@_check
async def delivery_fields_round_trip(factory: StoreFactory) -> None:
    full = message(
        "m-1",
        idempotency_token="tok-1",
        sequence_number=42,
        lane="PRIVILEGED",
        ack_deadline=T0 + 10,
        expires_at=T0 + 60.5,
        deliveries=3,
        last_delivered_at=T0 + 2.25,
        acked_stage="READ",
        signature=bytes(range(64)),
    )
    async with factory.open() as store:
        admitted = await store.messages.admit(full)
        assert admitted == replace(full, offset=1)
        assert await store.messages.get("m-1") == admitted
        assert await store.messages.inbox("agent-b") == [admitted]
        plain = await store.messages.admit(message("m-2"))
        stored = await store.messages.get("m-2")
        assert stored == plain
        assert stored is not None
        assert (stored.idempotency_token, stored.sequence_number, stored.lane) == (
            "",
            0,
            "STANDARD",
        )
        assert (stored.ack_deadline, stored.expires_at, stored.deliveries) == (0.0, 0.0, 0)
        assert (stored.last_delivered_at, stored.acked_stage, stored.signature) == (0.0, "", b"")


@_check
async def sequence_numbers_cover_the_whole_uint64_range(factory: StoreFactory) -> None:
    numbers = [0, 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, UINT64_MAX]
    async with factory.open() as store:
        for i, number in enumerate(numbers):
            await store.messages.admit(message(f"m-{i}", sequence_number=number))
        for i, number in enumerate(numbers):
            stored = await store.messages.get(f"m-{i}")
            assert stored is not None
            assert stored.sequence_number == number
            found = await store.messages.by_sequence("agent-a", number)
            assert found is not None
            assert found.message_id == f"m-{i}"
        for bad in (-1, 2**64):
            await _expect_value_error(
                f"admit of sequence_number {bad}",
                store.messages.admit(message("bad", sequence_number=bad)),
            )
            batch = [message("fine"), message("bad", sequence_number=bad)]
            await _expect_value_error(
                f"admit_many with sequence_number {bad}", store.messages.admit_many(batch)
            )
            assert await store.messages.by_sequence("agent-a", bad) is None
        assert await store.messages.get("bad") is None
        assert await store.messages.get("fine") is None
        assert await store.messages.count("agent-b", frozenset(MessageState)) == len(numbers)


# --- admit_many -----------------------------------------------------------------------


@_check
async def admit_many_numbers_members_in_input_order(factory: StoreFactory) -> None:
    recipients = ["b", "c", "b", "d", "b", "c"]
    batch = [message(f"m-{i}", r, sequence_number=i) for i, r in enumerate(recipients)]
    async with factory.open() as store:
        await store.messages.admit(message("before", "b"))
        assert await store.messages.admit_many([]) == []
        outcomes = await store.messages.admit_many(batch)
        assert outcomes == [
            replace(batch[0], offset=2),
            replace(batch[1], offset=1),
            replace(batch[2], offset=3),
            replace(batch[3], offset=1),
            replace(batch[4], offset=4),
            replace(batch[5], offset=2),
        ]
        for outcome in outcomes:
            assert isinstance(outcome, StoredMessage)
            assert await store.messages.get(outcome.message_id) == outcome
        assert message_ids(await store.messages.inbox("b")) == ["before", "m-0", "m-2", "m-4"]
        assert (await store.messages.admit(message("after", "c"))).offset == 3


@_check
async def admit_many_fails_only_the_duplicate_members(factory: StoreFactory) -> None:
    async with factory.open() as store:
        stored = await store.messages.admit(message("old", "b"))
        batch = [
            message("new-1", "b"),
            message("old", "c", envelope=b"impostor"),
            message("new-2", "c"),
            message("new-1", "c", envelope=b"twin in the same batch"),
            message("new-3", "b"),
        ]
        outcomes = await store.messages.admit_many(batch)
        assert len(outcomes) == len(batch)
        for index in (1, 3):
            duplicate = outcomes[index]
            assert isinstance(duplicate, DuplicateMessageError), duplicate
            assert str(duplicate) == batch[index].message_id
        assert outcomes[0] == replace(batch[0], offset=2)
        assert outcomes[2] == replace(batch[2], offset=1)
        assert outcomes[4] == replace(batch[4], offset=3)
        # The first of the twins was admitted, the stored message is untouched, and the
        # refused members consumed no offset.
        assert await store.messages.get("new-1") == outcomes[0]
        assert await store.messages.get("old") == stored
        assert message_ids(await store.messages.inbox("c")) == ["new-2"]
        assert (await store.messages.admit(message("next", "c"))).offset == 2
        only_duplicates = await store.messages.admit_many([message("old"), message("new-2")])
        assert all(isinstance(o, DuplicateMessageError) for o in only_duplicates)
        assert await store.messages.count("b", frozenset(MessageState)) == 3


@_check
async def admit_many_takes_a_thousand_messages(factory: StoreFactory) -> None:
    batch = [
        message(f"m-{i:04}", f"r-{i % 7}", envelope=bytes([i % 256]) * 64) for i in range(1000)
    ]
    async with factory.open() as store:
        outcomes = await store.messages.admit_many(batch)
        assert all(isinstance(o, StoredMessage) for o in outcomes)
        for r in range(7):
            inbox = await store.messages.inbox(f"r-{r}", limit=1000)
            assert message_ids(inbox) == [m.message_id for m in batch if m.recipient == f"r-{r}"]
            assert [m.offset for m in inbox] == list(range(1, len(inbox) + 1))
        last = batch[-1]
        expected_offset = sum(1 for m in batch if m.recipient == last.recipient)
        assert await store.messages.get(last.message_id) == replace(last, offset=expected_offset)


@_check
async def concurrent_batches_get_gap_free_offsets(factory: StoreFactory) -> None:
    async with factory.open() as store:
        batches = [
            [message(f"m-{b}-{i}", "b" if i % 3 else "c") for i in range(10)] for b in range(12)
        ]
        # Every batch also repeats an id of the batch before it: exactly one admission wins.
        for b in range(1, len(batches)):
            batches[b].append(message(f"m-{b - 1}-0", "c"))
        results = await asyncio.gather(*(store.messages.admit_many(b) for b in batches))
        admitted = [o for outcomes in results for o in outcomes if isinstance(o, StoredMessage)]
        assert len(admitted) == 120
        assert len({m.message_id for m in admitted}) == 120
        for recipient in ("b", "c"):
            offsets = sorted(m.offset for m in admitted if m.recipient == recipient)
            assert offsets == list(range(1, len(offsets) + 1))


# --- apply and record_deliveries -----------------------------------------------------


@_check
async def apply_changes_messages_in_order(factory: StoreFactory) -> None:
    async with factory.open() as store:
        one = await store.messages.admit(message("m-1", ack_deadline=T0 + 10, expires_at=T0 + 99))
        two = await store.messages.admit(message("m-2", ack_deadline=T0 + 10))
        assert await store.messages.apply([]) == []
        applied = await store.messages.apply(
            [
                StateChange("m-1", MessageState.RECEIVED, T0 + 1, acked_stage="RECEIVED"),
                StateChange("m-2", MessageState.RETRYING, T0 + 2, error_code="ack_timeout"),
                StateChange(
                    "m-1", MessageState.READ, T0 + 3, acked_stage="READ", clear_ack_deadline=True
                ),
                StateChange("m-1", MessageState.READ, T0 + 4),
            ]
        )
        step1 = replace(one, updated_at=T0 + 1, acked_stage="RECEIVED")
        step2 = replace(
            two, state=MessageState.RETRYING, updated_at=T0 + 2, error_code="ack_timeout"
        )
        step3 = replace(
            step1, state=MessageState.READ, updated_at=T0 + 3, acked_stage="READ", ack_deadline=0
        )
        # An empty acked_stage keeps the stage reached; an unset error_code clears it.
        step4 = replace(step3, updated_at=T0 + 4)
        assert applied == [step1, step2, step3, step4]
        assert await store.messages.get("m-1") == step4
        assert await store.messages.get("m-2") == step2
        assert step4.expires_at == T0 + 99


@_check
async def apply_answers_in_the_order_of_the_changes(factory: StoreFactory) -> None:
    ids = ["m-5", "m-1", "m-9", "m-3", "m-7"]
    async with factory.open() as store:
        await store.messages.admit_many([message(f"m-{i}", f"r-{i % 2}") for i in range(10)])
        changes = [
            StateChange(m, MessageState.READ, T0 + n, error_code=f"e-{n}", acked_stage="READ")
            for n, m in enumerate(ids)
        ]
        applied = await store.messages.apply(changes)
        assert [(m.message_id, m.updated_at, m.error_code) for m in applied] == [
            (m, T0 + n, f"e-{n}") for n, m in enumerate(ids)
        ]
        for changed in applied:
            assert await store.messages.get(changed.message_id) == changed
        untouched = await store.messages.get("m-0")
        assert untouched is not None
        assert untouched.state is MessageState.RECEIVED


@_check
async def apply_with_an_unknown_id_applies_nothing(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await store.messages.admit_many([message("m-1"), message("m-2"), message("m-3")])
        before = [await store.messages.get(m) for m in ("m-1", "m-2", "m-3")]
        # Distinct messages, and a message changed twice (backends may batch them apart).
        for position, twice in itertools.product(range(4), (False, True)):
            changes = [
                StateChange("m-1", MessageState.READ, T0 + 5, acked_stage="READ"),
                StateChange("m-2", MessageState.FAILED, T0 + 5, "internal_error"),
                StateChange("m-1" if twice else "m-3", MessageState.FULFILLED, T0 + 6),
            ]
            changes.insert(position, StateChange("nope", MessageState.READ, T0 + 5))
            try:
                await store.messages.apply(changes)
            except LookupError:
                pass
            else:
                raise AssertionError("apply with an unknown message_id did not raise")
            assert [await store.messages.get(m) for m in ("m-1", "m-2", "m-3")] == before
        assert await store.messages.count("agent-b", TERMINAL_STATES) == 0


@_check
async def a_task_record_commits_with_the_admission_of_its_member(factory: StoreFactory) -> None:
    """`AdmissionWrites.task` is stored with its member's admission, and with its events;
    a member refused as a duplicate stores neither."""
    async with factory.open() as store:
        await store.messages.admit(message("m-1"))
        one = task_record("t-1", 1, state="DISPATCHED", message_id="m-1")
        two = task_record("t-2", 2, state="DISPATCHED", message_id="m-2")
        writes = [
            AdmissionWrites((draft(1),), task=one),
            AdmissionWrites((draft(2),), task=two),
        ]
        outcomes = await store.messages.admit_many([message("m-1"), message("m-2")], writes)
        assert isinstance(outcomes[0], DuplicateMessageError)
        assert await store.tasks.get("t-1") is None
        assert await store.tasks.get("t-2") == two
        assert [e.details for e in await store.events.read()] == [{"n": 2}]


@_check
async def a_new_task_is_admitted_with_its_member_only_when_its_id_is_free(
    factory: StoreFactory,
) -> None:
    """`AdmissionWrites.task_new`: a member whose new task's id is stored already (an ended
    task, or an earlier member of the batch) is refused (`TaskExistsError`), takes no offset
    and writes nothing (the stored task stays as it was); the others are admitted."""
    async with factory.open() as store:
        ended = task_record("t-1", 1, state="COMPLETED")
        await store.tasks.put(ended)
        one = task_record("t-1", 2, state="DISPATCHED", message_id="m-1")
        two = task_record("t-2", 3, state="DISPATCHED", message_id="m-22")
        also = task_record("t-2", 4, state="DISPATCHED", message_id="m-333")
        writes = [
            AdmissionWrites((draft(n),), task=t, task_new=True)
            for n, t in ((1, one), (2, two), (3, also))
        ]
        taken, first, again = await store.messages.admit_many(
            [message("m-1"), message("m-22"), message("m-333")], writes
        )
        assert isinstance(taken, TaskExistsError) and taken.task_id == "t-1"
        assert isinstance(first, StoredMessage) and first.offset == 1
        assert isinstance(again, TaskExistsError) and again.task_id == "t-2"
        assert await store.tasks.get("t-1") == ended
        assert await store.tasks.get("t-2") == two
        assert [await store.messages.get(m) for m in ("m-1", "m-333")] == [None, None]
        assert [e.details["n"] for e in await store.events.read()] == [2]


@_check
async def a_token_is_written_with_an_admission_only_over_the_record_it_found(
    factory: StoreFactory,
) -> None:
    """A member's token record is written only if the stored one is still the record its
    deduplication found (`AdmissionWrites.idempotency_found`), or none is stored: else the
    member is refused (`TokenTakenError`, with the stored record), consumes no offset and
    writes nothing; a forced write (a requeue) goes over anything; a duplicate message id
    writes no token; of two admissions of one new token at once, one is admitted."""

    def claim(
        message_id: str, token: str = "k", found: IdempotencyRecord | None = None,
        forced: bool = False, **fields: Any,
    ) -> tuple[StoredMessage, AdmissionWrites, IdempotencyRecord]:  # fmt: skip
        record = IdempotencyRecord(token, "agent-a", message_id, message_id, "RECEIVED",
                                   T0, T0, attempts=(message_id,))  # fmt: skip
        record = replace(record, **fields)
        writes = AdmissionWrites((draft(len(message_id)),), record, None, found, forced)
        return message(message_id), writes, record

    async with factory.open() as store:

        async def admit(*claims: tuple[StoredMessage, AdmissionWrites, IdempotencyRecord]) -> list[
            StoredMessage | AdmissionRefusal
        ]:  # fmt: skip
            return await store.messages.admit_many([c[0] for c in claims], [c[1] for c in claims])

        first = claim("m-1")
        (one,) = await admit(first)
        assert isinstance(one, StoredMessage) and one.offset == 1
        assert await store.idempotency.get("k") == first[2]
        (refused,) = await admit(claim("m-22"))
        assert isinstance(refused, TokenTakenError) and refused.record == first[2]
        assert await store.messages.get("m-22") is None
        timed_out = replace(first[2], status="TIMED_OUT", updated_at=T0 + 1)
        await store.idempotency.put(timed_out)
        retry = claim("m-3", found=timed_out, attempts=("m-1", "m-3"), updated_at=T0 + 2)
        (three,) = await admit(retry)
        assert isinstance(three, StoredMessage) and three.offset == 2  # m-22 took none
        assert await store.idempotency.get("k") == retry[2]
        (late,) = await admit(claim("m-44", found=timed_out))
        assert isinstance(late, TokenTakenError) and late.record == retry[2]
        (forced,) = await admit(claim("m-5", found=timed_out, forced=True))
        assert isinstance(forced, StoredMessage)
        assert (await store.idempotency.get("k")) == claim("m-5")[2]
        pair = await admit(claim("m-6", "j"), claim("m-77", "j"), claim("m-1", "z"))
        assert isinstance(pair[0], StoredMessage)
        assert isinstance(pair[1], TokenTakenError)
        assert pair[1].record.current_message_id == "m-6"
        assert isinstance(pair[2], DuplicateMessageError)
        assert await store.idempotency.get("z") is None
        gone = claim("m-8", "purged", found=timed_out)
        assert isinstance((await admit(gone))[0], StoredMessage)
        assert await store.idempotency.get("purged") == gone[2]
        assert [e.details["n"] for e in await store.events.read()] == [3, 3, 3, 3, 3]
        racing = await asyncio.gather(*(admit(claim(f"m-race-{i}", "r")) for i in range(4)))
        admitted = [o for (o,) in racing if isinstance(o, StoredMessage)]
        assert len(admitted) == 1, racing
        record = await store.idempotency.get("r")
        assert record is not None and record.current_message_id == admitted[0].message_id
        assert all(o.record == record for (o,) in racing if isinstance(o, TokenTakenError))


@_check
async def a_requeue_marks_its_dead_letter_with_its_admission_once(factory: StoreFactory) -> None:
    """`AdmissionWrites.requeues`: the entry is marked requeued as the member (at its
    created_at) in the admission, unless a requeue marked it first or it is gone: that
    member is refused (`RequeuedError`), takes no offset and writes nothing."""
    async with factory.open() as store:
        entry = await store.dlq.add(dlq_entry("m-0"))

        def copy(message_id: str, entry_id: int) -> AdmissionWrites:
            return AdmissionWrites((draft(len(message_id)),), requeues=entry_id)

        first, second, gone = await store.messages.admit_many(
            [message("m-1", created_at=T0 + 5), message("m-22"), message("m-33")],
            [copy("m-1", entry.entry_id), copy("m-22", entry.entry_id), copy("m-33", 99)],
        )
        assert isinstance(first, StoredMessage) and first.offset == 1
        assert isinstance(second, RequeuedError) and second.entry_id == entry.entry_id
        assert isinstance(gone, RequeuedError) and gone.entry_id == 99
        marked = await store.dlq.get(entry.entry_id)
        assert marked is not None and (marked.requeued_as, marked.requeued_at) == ("m-1", T0 + 5)
        (late,) = await store.messages.admit_many([message("m-44")], [copy("m-44", entry.entry_id)])
        assert isinstance(late, RequeuedError)
        assert [await store.messages.get(m) for m in ("m-22", "m-33", "m-44")] == [None] * 3
        assert [e.details["n"] for e in await store.events.read()] == [3]


@_check
async def an_admission_is_held_to_its_bound_counting_what_is_stored(
    factory: StoreFactory,
) -> None:
    """`AdmissionWrites.bound`: the store counts the recipient's stored messages (buffered:
    RECEIVED or RETRYING; in flight: unfinished; notices neither) and the members before, and
    refuses a member past the capacity, the window or the per-producer cap, or past the
    tenant's queued_messages quota (every recipient's buffered messages) (`BoundExceededError`
    naming it); it takes no offset and writes nothing."""
    async with factory.open() as store:
        messages = store.messages
        await messages.admit_many([
            message("m-read", state=MessageState.READ),
            message("m-done", state=MessageState.FULFILLED),
            message("m-ack", message_type=5),
            message("m-note", producer_id="coordinator"),
            message("m-other", "agent-c"),
        ])  # fmt: skip

        def held(n: int, bound: AdmissionBound) -> AdmissionWrites:
            return AdmissionWrites((draft(n),), bound=bound)

        capacity = AdmissionBound(capacity=2)
        outcomes = await messages.admit_many(
            [message("m-1"), message("m-2"), message("m-3")],
            [held(1, capacity), held(2, capacity), held(3, capacity)],
        )
        assert [type(o) for o in outcomes[:2]] == [StoredMessage, StoredMessage]
        full = outcomes[2]
        assert isinstance(full, BoundExceededError)
        assert (full.limit, full.count, full.bound) == ("capacity", 2, 2)
        assert await messages.get("m-3") is None
        assert [e.details["n"] for e in await store.events.read()] == [1, 2]
        # In flight: m-read, m-1 and m-2 from agent-a (m-done finished; notices aside).
        window, cap = AdmissionBound(window=3), AdmissionBound(cap=3)
        by_d = message("m-d", producer_id="agent-d")
        (no_window,) = await messages.admit_many([by_d], [held(4, window)])
        assert isinstance(no_window, BoundExceededError)
        assert (no_window.limit, no_window.count) == ("window_exhausted", 3)
        mine, theirs = await messages.admit_many(
            [message("m-4"), message("m-e", producer_id="agent-e")], [held(5, cap), held(6, cap)]
        )
        assert isinstance(mine, BoundExceededError) and mine.limit == "producer_cap"
        assert isinstance(theirs, StoredMessage) and theirs.offset == 7
        # The tenant's queued_messages quota: buffered messages to every recipient (m-other,
        # m-1, m-2, m-e), checked before the recipient's own limits.
        quota = AdmissionBound(capacity=1, queued=5)
        to_f, to_g = await messages.admit_many(
            [message("m-f", "agent-f"), message("m-g", "agent-g")], [held(7, quota), held(8, quota)]
        )
        assert isinstance(to_f, StoredMessage)
        assert isinstance(to_g, BoundExceededError)
        assert (to_g.limit, to_g.count, to_g.bound) == ("queued_messages", 5, 5)


@_check
async def a_change_that_expects_a_state_applies_only_from_it(factory: StoreFactory) -> None:
    """`StateChange.expected`: a change applies only while its message is in the state it
    expects (a change before it in the same call counts); otherwise nothing of the call is
    applied, its events neither, and `StaleStateError` names the message (among others the
    store could not tell from it). An unknown id is still a LookupError."""
    async with factory.open() as store:
        messages = store.messages
        await messages.admit_many([message("m-1"), message("m-2")])
        read = StateChange("m-1", MessageState.READ, T0 + 1, expected="RECEIVED")
        failed = StateChange("m-1", MessageState.FAILED, T0 + 2, "x", expected="READ")
        (after_read, after_failed) = await messages.apply([read, failed], [draft(1)])
        assert (after_read.state, after_failed.state) == (MessageState.READ, MessageState.FAILED)
        other = StateChange("m-2", MessageState.READ, T0 + 3, expected="RECEIVED")
        for call in (messages.apply, messages.record):
            try:
                await call([other, replace(failed, at=T0 + 4)], [draft(2)])
            except StaleStateError as stale:
                assert "m-1" in stale.message_ids
            else:
                raise AssertionError("a change from a state its message left was applied")
        first, second = await messages.get("m-1"), await messages.get("m-2")
        assert first is not None and (first.state, first.updated_at) == (
            MessageState.FAILED,
            T0 + 2,
        )
        assert second is not None and second.state is MessageState.RECEIVED
        assert [e.details["n"] for e in await store.events.read()] == [1]
        (unconditional,) = await messages.apply([StateChange("m-1", MessageState.READ, T0 + 5)])
        assert unconditional.state is MessageState.READ
        try:
            await messages.apply([StateChange("m-9", MessageState.READ, T0, expected="READ")])
        except LookupError:
            pass
        else:
            raise AssertionError("a change of an unknown message was applied")


@_check
async def a_token_progresses_in_the_transaction_of_its_state_change(
    factory: StoreFactory,
) -> None:
    """`tokens` update their records as the transaction reads them, in order, with the
    event of each step that changes the cached outcome; a step of an attempt the record does
    not list, or of a token without a record, writes nothing; a change that fails (an
    unknown message) leaves the records as they were."""
    token = IdempotencyRecord("k", "agent-a", "m-1", "m-1", "RECEIVED", T0, T0,
                              attempts=("m-1", "m-2"))  # fmt: skip
    async with factory.open() as store:
        await store.messages.admit_many(
            [message("m-1"), message("m-2")], [AdmissionWrites((), token), AdmissionWrites()]
        )
        done = draft(7, event_type="idempotency.cached")
        steps = [
            TokenProgress("k", "m-1", MessageState.READ, T0 + 1),
            TokenProgress("k", "m-1", MessageState.FULFILLED, T0 + 2, "", "ok", done),
            TokenProgress("k", "m-2", MessageState.FAILED, T0 + 3, "e", "no", done),
            TokenProgress("k", "m-9", MessageState.FULFILLED, T0 + 4, "", "", done),
            TokenProgress("none", "m-1", MessageState.FULFILLED, T0 + 4, "", "", done),
        ]
        failing = [
            StateChange("m-1", MessageState.READ, T0 + 1),
            StateChange("x", MessageState.READ, T0),
        ]
        try:
            await store.messages.record(failing, [draft(1)], steps)
        except LookupError:
            pass
        else:
            raise AssertionError("record with an unknown message_id did not raise")
        assert await store.idempotency.get("k") == token
        assert await store.events.read() == []
        change = StateChange("m-1", MessageState.FULFILLED, T0 + 2, acked_stage="FULFILLED")
        await store.messages.record([change], [draft(1)], steps)
        expected = replace(
            token, status="FULFILLED", outcome_at=T0 + 2, updated_at=T0 + 2, result="ok"
        )
        assert await store.idempotency.get("k") == expected
        assert await store.idempotency.get("none") is None
        assert [(e.event_type, e.details) for e in await store.events.read()] == [
            ("test.event", {"n": 1}), ("idempotency.cached", {"n": 7})
        ]  # fmt: skip
        # A token's progress alone (no state change) commits too: the later failure of an
        # attempt leaves the cached success.
        (applied,) = await store.messages.apply(
            [StateChange("m-2", MessageState.FAILED, T0 + 5, "e")], (),
            [TokenProgress("k", "m-2", MessageState.FAILED, T0 + 5, "e", "no", done)],
        )  # fmt: skip
        assert applied.state is MessageState.FAILED
        assert await store.idempotency.get("k") == expected
        await store.messages.record([], (), [TokenProgress("k", "m-2", MessageState.READ, T0 + 6)])
        assert await store.idempotency.get("k") == expected
        assert len(await store.events.read()) == 2


@_check
async def an_outcome_starts_the_record_of_a_token_kept_by_its_producer(
    factory: StoreFactory,
) -> None:
    """A step that names its token's producer (a token its producer keeps unique, admitted
    without a record) starts the record when the token has none, with its outcome cached
    and its event; a progress that is no outcome starts none; a record that exists is
    progressed as any."""
    async with factory.open() as store:
        await store.messages.admit_many(
            [message("m-1"), message("m-2")], [AdmissionWrites(), AdmissionWrites()]
        )
        done = draft(7, event_type="idempotency.cached")
        read = TokenProgress("s", "m-1", MessageState.READ, T0 + 1, producer="scheduler")
        await store.messages.record(
            [StateChange("m-1", MessageState.READ, T0 + 1, acked_stage="READ")], (), [read]
        )
        assert await store.idempotency.get("s") is None
        assert await store.events.read() == []
        end = TokenProgress(
            "s", "m-1", MessageState.FULFILLED, T0 + 2, "", "ok", done, producer="scheduler"
        )
        change = StateChange("m-1", MessageState.FULFILLED, T0 + 2, acked_stage="FULFILLED")
        await store.messages.record([change], (), [end])
        started = await store.idempotency.get("s")
        assert started is not None
        assert (started.producer_id, started.original_message_id, started.attempts) == (
            "scheduler", "m-1", ("m-1",),
        )  # fmt: skip
        assert (started.status, started.result, started.outcome_at) == ("FULFILLED", "ok", T0 + 2)
        assert [e.event_type for e in await store.events.read()] == ["idempotency.cached"]
        # A second attempt's outcome of that token leaves the record as it is (not one of
        # its attempts), without an event.
        other = replace(end, message_id="m-2", state=MessageState.FAILED, at=T0 + 3)
        await store.messages.record([StateChange("m-2", MessageState.FAILED, T0 + 3)], (), [other])
        assert await store.idempotency.get("s") == started
        assert len(await store.events.read()) == 1


@_check
async def task_records_commit_with_the_state_changes_they_follow(factory: StoreFactory) -> None:
    """`tasks` are stored in the transaction of `record`'s (and `apply`'s) state changes,
    with its events; a change that fails (an unknown message) stores none of them."""
    async with factory.open() as store:
        await store.messages.admit(message("m-1"))
        running = task_record("t-1", 1, state="RUNNING", message_id="m-1")
        failing = [
            StateChange("m-1", MessageState.READ, T0 + 1),
            StateChange("x", MessageState.READ, T0),
        ]
        try:
            await store.messages.record(failing, [draft(1)], tasks=[running])
        except LookupError:
            pass
        else:
            raise AssertionError("record with an unknown message_id did not raise")
        assert await store.tasks.get("t-1") is None
        assert await store.events.read() == []
        await store.messages.record(
            [StateChange("m-1", MessageState.READ, T0 + 1)], [draft(1)], tasks=[running]
        )
        assert await store.tasks.get("t-1") == running
        assert (await store.messages.get("m-1")).state is MessageState.READ  # type: ignore[union-attr]
        done = replace(running, state=TaskState.COMPLETED, result='{"ok": true}')
        (applied,) = await store.messages.apply(
            [StateChange("m-1", MessageState.FULFILLED, T0 + 2)], [draft(2)], tasks=[done]
        )
        assert applied.state is MessageState.FULFILLED
        assert await store.tasks.get("t-1") == done
        assert [e.details for e in await store.events.read()] == [{"n": 1}, {"n": 2}]


@_check
async def the_task_records_of_one_write_are_stored_as_the_last_of_each(
    factory: StoreFactory,
) -> None:
    """Of the `tasks` one state change carries, the last record of each task is stored,
    whole: new tasks, tasks whose agent or seq changes (a shared queue's task handed out,
    say) and tasks whose other fields change, in one write; a record whose seq another task
    holds fails the write, which then stores none of it."""
    async with factory.open() as store:
        await store.messages.admit_many([message("m-1"), message("m-2"), message("m-3")])
        await store.tasks.put(task_record("t-1", 1, state="DISPATCHED", message_id="m-1"))
        await store.tasks.put(task_record("t-2", 2, state="DISPATCHED", agent_id=""))
        one = task_record("t-1", 1, state="RUNNING", message_id="m-1", updated_at=T0 + 5)
        handed = task_record("t-2", 2, state="RUNNING", agent_id="agent-z")
        new = task_record("t-3", 3, state="DISPATCHED", message_id="m-3")
        done = replace(one, state=TaskState.COMPLETED, result='{"n": 1}', seq=7)
        await store.messages.apply(
            [StateChange("m-1", MessageState.READ, T0 + 1)], tasks=[one, handed, new, done]
        )
        assert [await store.tasks.get(t) for t in ("t-1", "t-2", "t-3")] == [done, handed, new]
        assert [t.task_id for t in await store.tasks.list(agent_id="agent-z")] == ["t-2"]
        assert [t.task_id for t in await store.tasks.list()] == ["t-2", "t-3", "t-1"]
        assert await store.tasks.max_seq() == 7
        before = await store.messages.get("m-2")
        clash = replace(handed, state=TaskState.COMPLETED, seq=3)
        try:
            await store.messages.apply(
                [StateChange("m-2", MessageState.READ, T0 + 2)],
                tasks=[replace(new, state=TaskState.RUNNING), clash],
            )
        except StoreError:
            pass
        else:
            raise AssertionError("a task record with another task's seq was stored")
        assert await store.messages.get("m-2") == before
        assert [await store.tasks.get(t) for t in ("t-1", "t-2", "t-3")] == [done, handed, new]


@_check
async def task_records_and_events_of_one_write_commit_together(factory: StoreFactory) -> None:
    """As above with events: the last record of each task and the events are stored by
    the one write (on PostgreSQL by one statement), and a record whose seq another task
    holds fails the write, which then stores neither."""
    async with factory.open() as store:
        await store.messages.admit_many([message("m-1"), message("m-2")])
        await store.tasks.put(task_record("t-2", 2, state="DISPATCHED", agent_id=""))
        one = task_record("t-1", 1, state="RUNNING", message_id="m-1", updated_at=T0 + 5)
        handed = task_record("t-2", 2, state="RUNNING", agent_id="agent-z")
        done = replace(one, state=TaskState.COMPLETED, result='{"n": 1}', seq=7)
        await store.messages.apply(
            [StateChange("m-1", MessageState.READ, T0 + 1)], [draft(1), draft(2)],
            tasks=[one, handed, done],
        )  # fmt: skip
        assert [await store.tasks.get(t) for t in ("t-1", "t-2")] == [done, handed]
        assert [e.details["n"] for e in await store.events.read()] == [1, 2]
        before = await store.messages.get("m-2")
        clash = replace(handed, state=TaskState.COMPLETED, seq=7)
        try:
            await store.messages.record(
                [StateChange("m-2", MessageState.READ, T0 + 2)], [draft(3)], tasks=[clash]
            )
        except StoreError:
            pass
        else:
            raise AssertionError("a task record with another task's seq was stored")
        assert await store.messages.get("m-2") == before
        assert await store.tasks.get("t-2") == handed
        assert [e.details["n"] for e in await store.events.read()] == [1, 2]


@_check
async def record_applies_as_apply_does(factory: StoreFactory) -> None:
    async with factory.open() as store:
        one = await store.messages.admit(message("m-1", ack_deadline=T0 + 10, expires_at=T0 + 99))
        two = await store.messages.admit(message("m-2", ack_deadline=T0 + 10, deliveries=1))
        await store.messages.record([])
        changes = [
            StateChange("m-2", MessageState.READ, T0 + 1, acked_stage="READ"),
            StateChange("m-1", MessageState.FAILED, T0 + 2, "internal_error", "",
                        clear_ack_deadline=True),
        ]  # fmt: skip
        await store.messages.record(changes)
        assert await store.messages.get("m-2") == changed(two, changes[0])
        assert await store.messages.get("m-1") == changed(one, changes[1])
        twice = [
            StateChange("m-2", MessageState.FULFILLED, T0 + 3, acked_stage="FULFILLED"),
            StateChange("m-2", MessageState.FULFILLED, T0 + 4),
        ]
        await store.messages.record(twice)
        after = changed(changed(changed(two, changes[0]), twice[0]), twice[1])
        assert await store.messages.get("m-2") == after
        assert after.acked_stage == "FULFILLED"
        before = [await store.messages.get(m) for m in ("m-1", "m-2")]
        try:
            await store.messages.record(
                [StateChange("m-1", MessageState.READ, T0 + 5), *changes[:1],
                 StateChange("nope", MessageState.READ, T0 + 5)]
            )  # fmt: skip
        except LookupError:
            pass
        else:
            raise AssertionError("record with an unknown message_id did not raise")
        assert [await store.messages.get(m) for m in ("m-1", "m-2")] == before


@_check
async def finish_delivered_counts_a_delivery_and_fulfils(factory: StoreFactory) -> None:
    async with factory.open() as store:
        one = await store.messages.admit(message("m-1", acked_stage="RECEIVED", deliveries=1))
        two = await store.messages.admit(message("m-2", error_code="x"))
        untouched = await store.messages.admit(message("m-3"))
        await store.messages.finish_delivered([], T0)
        await store.messages.finish_delivered(["m-1", "m-2", "m-1", "nope"], T0 + 7)
        for before in (one, two):
            after = replace(
                before, deliveries=before.deliveries + 1, last_delivered_at=T0 + 7,
                state=MessageState.FULFILLED, updated_at=T0 + 7, error_code="",
            )  # fmt: skip
            assert await store.messages.get(before.message_id) == after
        assert await store.messages.get("m-3") == untouched


@_check
async def set_state_leaves_the_delivery_fields_alone(factory: StoreFactory) -> None:
    async with factory.open() as store:
        admitted = await store.messages.admit(
            message("m-1", ack_deadline=T0 + 10, acked_stage="RECEIVED", deliveries=2)
        )
        changed = await store.messages.set_state("m-1", MessageState.READ, T0 + 1)
        assert changed == replace(admitted, state=MessageState.READ, updated_at=T0 + 1)


@_check
async def record_deliveries_keeps_the_larger_count_and_time(factory: StoreFactory) -> None:
    async with factory.open() as store:
        one = await store.messages.admit(message("m-1"))
        two = await store.messages.admit(message("m-2", "c"))
        untouched = await store.messages.admit(message("m-3"))
        await store.messages.record_deliveries([])
        await store.messages.record_deliveries([("m-1", 2, T0 + 2.5), ("m-2", 1, T0 + 1)])
        # Counts written behind may arrive late: an older count never lowers a newer one, and
        # an id twice in one call keeps the larger of its values.
        await store.messages.record_deliveries(
            [("m-1", 1, T0 + 1), ("nope", 4, T0 + 4), ("m-2", 3, T0 + 3), ("m-2", 2, T0 + 2)]
        )
        assert await store.messages.get("m-1") == replace(
            one, deliveries=2, last_delivered_at=T0 + 2.5
        )
        assert await store.messages.get("m-2") == replace(
            two, deliveries=3, last_delivered_at=T0 + 3
        )
        assert await store.messages.get("m-3") == untouched
        assert await store.messages.get("nope") is None


@_check
async def state_changes_carry_the_larger_delivery_count(factory: StoreFactory) -> None:
    async with factory.open() as store:
        one = await store.messages.admit(message("m-1", deliveries=2, last_delivered_at=T0 + 2))
        two = await store.messages.admit(message("m-2", "c"))
        changes = [
            StateChange("m-1", MessageState.READ, T0 + 3, deliveries=1, last_delivered_at=T0),
            StateChange("m-2", MessageState.FULFILLED, T0 + 4, deliveries=1,
                        last_delivered_at=T0 + 3.5),
        ]  # fmt: skip
        await store.messages.record(changes)
        assert await store.messages.get("m-1") == replace(
            one, state=MessageState.READ, updated_at=T0 + 3
        )
        assert await store.messages.get("m-2") == replace(
            two, state=MessageState.FULFILLED, updated_at=T0 + 4, deliveries=1,
            last_delivered_at=T0 + 3.5,
        )  # fmt: skip
        # The one-at-a-time path (a message changed twice) keeps them the same way.
        (_, last) = await store.messages.apply(
            [
                StateChange("m-1", MessageState.FULFILLED, T0 + 5, deliveries=3,
                            last_delivered_at=T0 + 4.5),
                StateChange("m-1", MessageState.FULFILLED, T0 + 6),
            ]
        )  # fmt: skip
        assert (last.deliveries, last.last_delivered_at, last.updated_at) == (3, T0 + 4.5, T0 + 6)


# --- deduplication by producer sequence -----------------------------------------------


@_check
async def by_sequence_finds_the_newest_message_of_a_producer(factory: StoreFactory) -> None:
    async with factory.open() as store:
        assert await store.messages.by_sequence("agent-a", 7) is None
        await store.messages.admit_many(
            [
                message("old", sequence_number=7, created_at=T0),
                message("newest", "c", sequence_number=7, created_at=T0 + 9),
                message("middle", sequence_number=7, created_at=T0 + 5),
                message("other-seq", sequence_number=8, created_at=T0 + 20),
                message("other-producer", producer_id="agent-z", sequence_number=7),
                message("same-time-1", producer_id="p", sequence_number=1, created_at=T0),
                message("same-time-2", producer_id="p", sequence_number=1, created_at=T0),
            ]
        )
        found = await store.messages.by_sequence("agent-a", 7)
        assert found is not None
        assert found == await store.messages.get("newest")
        other = await store.messages.by_sequence("agent-z", 7)
        assert other is not None
        assert other.message_id == "other-producer"
        # Same created_at: the later admission (higher offset) is the newer one.
        tie = await store.messages.by_sequence("p", 1)
        assert tie is not None
        assert tie.message_id == "same-time-2"
        assert await store.messages.by_sequence("agent-a", 9) is None
        assert await store.messages.by_sequence("nobody", 7) is None


@_check
async def max_sequence_is_the_producers_highest_number(factory: StoreFactory) -> None:
    async with factory.open() as store:
        assert await store.messages.max_sequence("agent-a") == 0
        await store.messages.admit_many(
            [
                message("a1", sequence_number=5),
                message("a2", sequence_number=3),
                message("z1", producer_id="agent-z", sequence_number=99),
            ]
        )
        assert await store.messages.max_sequence("agent-a") == 5
        assert await store.messages.max_sequence("agent-z") == 99
        # Numbers at and above 2**63 are stored specially; they still compare as unsigned.
        await store.messages.admit(message("big", sequence_number=2**63 + 7))
        await store.messages.admit(message("bigger", sequence_number=UINT64_MAX))
        assert await store.messages.max_sequence("agent-a") == UINT64_MAX
        assert await store.messages.max_sequence("nobody") == 0
