"""Checks of the message inboxes (`MessageStore`)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from apiary.core.records import MessageState, StoredMessage
from apiary.store.errors import DuplicateMessageError
from apiary.testing.store_suite.base import T0, Check, StoreFactory, message, registry

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
