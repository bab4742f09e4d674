"""Checks of the timer loop's queries (`MessageStore.due, next_deadline`)."""

from __future__ import annotations

from apiary.core.records import MessageState, StateChange
from apiary.testing.store_suite.base import (
    OPEN_STATES,
    T0,
    Check,
    StoreFactory,
    message,
    message_ids,
    registry,
)

CHECKS: list[Check] = []
_check = registry(CHECKS)


@_check
async def due_orders_unfinished_messages_by_their_earlier_deadline(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await store.messages.admit_many(
            [
                message("ack-only", ack_deadline=T0 + 10),
                message("ttl-only", expires_at=T0 + 5),
                message("ttl-first", ack_deadline=T0 + 30, expires_at=T0 + 7),
                message("ack-first", ack_deadline=T0 + 8, expires_at=T0 + 90),
                message("no-deadline"),
                message("later", ack_deadline=T0 + 1000),
                message("tie-b", "c", ack_deadline=T0 + 20),
                message("tie-a", "d", ack_deadline=T0 + 20),
            ]
        )
        assert await store.messages.due(T0) == []
        assert message_ids(await store.messages.due(T0 + 5)) == ["ttl-only"]  # <= now is due
        assert message_ids(await store.messages.due(T0 + 100)) == [
            "ttl-only",
            "ttl-first",
            "ack-first",
            "ack-only",
            "tie-a",
            "tie-b",
        ]
        assert message_ids(await store.messages.due(T0 + 100, limit=2)) == ["ttl-only", "ttl-first"]
        assert await store.messages.due(T0 + 100, limit=0) == []
        assert len(await store.messages.due(T0 + 10_000)) == 7
        assert await store.messages.next_deadline() == T0 + 5
        try:
            await store.messages.due(T0, limit=-1)
        except ValueError:
            pass
        else:
            raise AssertionError("due(limit=-1) did not raise ValueError")


@_check
async def finished_messages_are_never_due(factory: StoreFactory) -> None:
    states = sorted(MessageState, key=lambda s: s.value)
    async with factory.open() as store:
        for i, state in enumerate(states):
            await store.messages.admit(
                message(f"m-{state.value}", state=state, ack_deadline=T0 + i + 1)
            )
        due = await store.messages.due(T0 + 1000)
        assert {m.state for m in due} == OPEN_STATES
        assert [m.message_id for m in due] == [f"m-{s.value}" for s in states if not s.terminal]
        first_open = next(i for i, s in enumerate(states) if not s.terminal)
        assert await store.messages.next_deadline() == T0 + first_open + 1
        # Finishing every open one leaves nothing due and no deadline.
        await store.messages.apply(
            [StateChange(m.message_id, MessageState.FULFILLED, T0 + 2) for m in due]
        )
        assert await store.messages.due(T0 + 1000) == []
        assert await store.messages.next_deadline() is None


@_check
async def deadlines_follow_state_changes(factory: StoreFactory) -> None:
    async with factory.open() as store:
        assert await store.messages.next_deadline() is None
        await store.messages.admit(message("plain"))
        assert await store.messages.next_deadline() is None
        await store.messages.admit(message("m-1", ack_deadline=T0 + 10, expires_at=T0 + 50))
        await store.messages.admit(message("m-2", ack_deadline=T0 + 20))
        assert await store.messages.next_deadline() == T0 + 10
        # Acknowledged: the ack deadline is cleared and the TTL remains.
        await store.messages.apply(
            [StateChange("m-1", MessageState.RECEIVED, T0 + 1, "", "RECEIVED", True)]
        )
        assert await store.messages.next_deadline() == T0 + 20
        assert message_ids(await store.messages.due(T0 + 100)) == ["m-2", "m-1"]
        stored = await store.messages.get("m-1")
        assert stored is not None
        assert stored.ack_deadline == 0
        # Timed out: no longer due. Retried (not finished): due again.
        await store.messages.set_state("m-2", MessageState.TIMED_OUT, T0 + 21)
        assert await store.messages.next_deadline() == T0 + 50
        await store.messages.set_state("m-2", MessageState.RETRYING, T0 + 22)
        assert await store.messages.next_deadline() == T0 + 20
        await store.messages.apply(
            [StateChange("m-2", MessageState.RETRYING, T0 + 23, clear_ack_deadline=True)]
        )
        assert message_ids(await store.messages.due(T0 + 100)) == ["m-1"]
