"""Checks of retention (`MessageStore.purge_finished, oldest_offset`)."""

from __future__ import annotations

from apiary.core.records import MessageState, StateChange, StoredMessage
from apiary.testing.store_suite.base import (
    OPEN_STATES,
    T0,
    TERMINAL_STATES,
    Check,
    StoreFactory,
    message,
    message_ids,
    registry,
)

CHECKS: list[Check] = []
_check = registry(CHECKS)


@_check
async def purge_finished_deletes_old_terminal_messages_only(factory: StoreFactory) -> None:
    async with factory.open() as store:
        for i, state in enumerate(sorted(MessageState, key=lambda s: s.value)):
            await store.messages.admit(message(f"old-{state.value}", state=state))
            await store.messages.admit(
                message(f"new-{state.value}", "c", state=state, updated_at=T0 + 100 + i)
            )
        await store.messages.admit(message("boundary", "d", state=MessageState.FAILED))
        await store.messages.set_state("boundary", MessageState.FAILED, T0 + 50)
        assert await store.messages.purge_finished(T0) == 0
        assert await store.messages.purge_finished(T0 + 50) == len(TERMINAL_STATES)
        remaining = await store.messages.inbox("agent-b")
        assert {m.state for m in remaining} == OPEN_STATES
        assert len(await store.messages.inbox("c")) == len(MessageState)
        # updated_at == before is kept: only "before" is purged.
        assert message_ids(await store.messages.inbox("d")) == ["boundary"]
        assert await store.messages.purge_finished(T0 + 50) == 0
        assert await store.messages.purge_finished(T0 + 1000) == len(TERMINAL_STATES) + 1
        assert await store.messages.count("c", frozenset(MessageState)) == len(OPEN_STATES)


@_check
async def offsets_never_change_or_repeat_after_a_purge(factory: StoreFactory) -> None:
    async with factory.open() as store:
        assert await store.messages.oldest_offset("b") == 0
        for i in range(1, 7):
            await store.messages.admit(message(f"m-{i}", "b"))
        await store.messages.admit(message("c-1", "c"))
        assert await store.messages.oldest_offset("b") == 1
        finished = [StateChange(f"m-{i}", MessageState.FULFILLED, T0 + 1) for i in (1, 2, 4)]
        await store.messages.apply(finished)
        assert await store.messages.purge_finished(T0 + 2) == 3
        remaining = await store.messages.inbox("b")
        assert [(m.message_id, m.offset) for m in remaining] == [("m-3", 3), ("m-5", 5), ("m-6", 6)]
        assert message_ids(await store.messages.inbox("b", after_offset=3)) == ["m-5", "m-6"]
        assert message_ids(await store.messages.inbox("b", after_offset=1, limit=1)) == ["m-3"]
        assert await store.messages.oldest_offset("b") == 3
        assert await store.messages.oldest_offset("c") == 1
        # Emptied completely, the inbox still continues after its last offset.
        rest = [StateChange(f"m-{i}", MessageState.REJECTED, T0 + 1) for i in (3, 5, 6)]
        await store.messages.apply(rest)
        assert await store.messages.purge_finished(T0 + 2) == 3
        assert await store.messages.oldest_offset("b") == 0
        assert await store.messages.inbox("b") == []
        assert (await store.messages.admit(message("m-7", "b"))).offset == 7
        (batched,) = await store.messages.admit_many([message("m-8", "b")])
        assert isinstance(batched, StoredMessage)
        assert batched.offset == 8
        assert await store.messages.oldest_offset("b") == 7
